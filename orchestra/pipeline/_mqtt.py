"""``MqttSink``: each result as a JSON message to an MQTT broker (paho-mqtt, the ``mqtt`` extra)."""

from __future__ import annotations

import threading
from typing import Any

from ..errors import InvalidArgumentError, NotFoundError
from ..telemetry import get_logger
from ._frame import Result
from ._sinks import SinkError, ThreadedSink, _count, _dumps, _positive, result_record

__all__ = ["MqttSink"]

_log = get_logger(__name__)


def _check_template(topic: Any) -> str:
    if not isinstance(topic, str) or not topic:
        raise InvalidArgumentError(f"MqttSink: topic must be a non-empty string, got {topic!r}")
    rest = topic.replace("{camera}", "")
    if "{" in rest or "}" in rest:
        raise InvalidArgumentError(f"MqttSink: topic {topic!r}: the only placeholder is {{camera}}")
    if "+" in rest or "#" in rest or "\0" in rest:
        raise InvalidArgumentError(f"MqttSink: topic {topic!r} has a wildcard (+, #) or NUL; one can't publish to it")
    return topic


class MqttSink(ThreadedSink):
    """Publishes one JSON message per processed frame (the :class:`JsonlSink` record) to
    ``topic`` with ``{camera}`` replaced by the frame's camera.

    Args:
        host, port: the broker.
        topic: a topic template; ``{camera}`` is the only placeholder (default
            ``"orchestra/{camera}"``).
        qos: 0, 1 or 2. retain: the broker keeps the last message per topic.
        client_id, username, password, keepalive: the MQTT session.
        reconnect_min_s, reconnect_max_s: after a lost connection paho's network thread
            reconnects with a backoff doubling from min to max.
        connect_timeout_s: how long the first frames wait for the first connection attempt
            (at most ``timeout_s``; once: later frames fail at once while there is no
            connection).
        max_elements, timeout_s, backlog: see :class:`JsonlSink` / :class:`ThreadedSink`.

    Nothing here blocks the event loop: connecting, reconnecting and sending happen on
    paho's network thread, publishing on the sink's writer thread. A frame is ``processed``
    once its message was handed to paho while connected (with ``qos`` 1 or 2 paho then
    redelivers it after a reconnect until the broker acknowledges it). While the broker is
    unreachable every frame fails at once (``SinkError``, stage ``sink``, counted per
    camera), so a dead broker never stalls a camera; with ``qos = 0`` the messages sent
    between the broker's death and paho noticing it are lost while counted processed
    (MQTT's at-most-once). ``connects`` / ``disconnects`` count the connections.

    Raises:
        NotFoundError: paho-mqtt is not installed (``pip install 'orchestra[mqtt]'``).
        InvalidArgumentError: a bad topic, qos or port.
    """

    def __init__(self, host: str, port: int = 1883, topic: str = "orchestra/{camera}", qos: int = 0, *,
                 retain: bool = False, client_id: str | None = None, username: str | None = None,
                 password: str | None = None, keepalive: int = 60, reconnect_min_s: float = 0.5,
                 reconnect_max_s: float = 30.0, connect_timeout_s: float = 5.0, max_elements: int = 1024,
                 timeout_s: float = 5.0, backlog: int = 1024, close_timeout_s: float = 10.0) -> None:
        super().__init__(timeout_s=timeout_s, backlog=backlog, close_timeout_s=close_timeout_s)
        try:
            import paho.mqtt.client as mqtt
        except ImportError as exc:
            raise NotFoundError("MqttSink needs paho-mqtt >= 2: pip install 'orchestra[mqtt]'") from exc
        if not isinstance(host, str) or not host:
            raise InvalidArgumentError(f"MqttSink: host must be a non-empty string, got {host!r}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise InvalidArgumentError(f"MqttSink: port must be an int in 1..65535, got {port!r}")
        if qos not in (0, 1, 2) or isinstance(qos, bool):
            raise InvalidArgumentError(f"MqttSink: qos must be 0, 1 or 2, got {qos!r}")
        self.host = host
        self.port = port
        self.topic = _check_template(topic)
        self.qos = qos
        self.retain = bool(retain)
        self.max_elements = _count(max_elements, "max_elements", "MqttSink")
        self.connect_timeout_s = _positive(connect_timeout_s, "connect_timeout_s", "MqttSink")
        lo = _positive(reconnect_min_s, "reconnect_min_s", "MqttSink")
        hi = _positive(reconnect_max_s, "reconnect_max_s", "MqttSink")
        self._topics: dict[str, str] = {}
        self._tried = threading.Event()  # the first connection attempt ended (either way)
        self._first_wait_done = False
        self.connects = 0
        self.disconnects = 0
        self._mqtt = mqtt
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id or "", clean_session=True)
        if username is not None:
            client.username_pw_set(username, password)
        # paho's delays are whole seconds; it sleeps at least min
        client.reconnect_delay_set(max(1, round(lo)), max(1, round(hi)))
        client.max_queued_messages_set(backlog)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_connect_fail = self._on_connect_fail
        self._client = client
        try:
            client.connect_async(host, port, keepalive)
        except (OSError, ValueError) as exc:
            raise InvalidArgumentError(f"MqttSink: can't connect to {host}:{port}: {exc}") from exc
        client.loop_start()  # paho's network thread: connects, reconnects, sends

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        if getattr(reason, "is_failure", False):
            self._tried.set()
            _log.warning("mqtt connection refused", broker=f"{self.host}:{self.port}", reason=str(reason))
            return
        self.connects += 1
        self._tried.set()
        if self.connects > 1:
            _log.info("mqtt reconnected", broker=f"{self.host}:{self.port}", connects=self.connects)

    def _on_connect_fail(self, client: Any, userdata: Any) -> None:
        if not self._tried.is_set():
            _log.warning("mqtt broker unreachable; retrying", broker=f"{self.host}:{self.port}")
        self._tried.set()

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason: Any, properties: Any) -> None:
        self.disconnects += 1
        if not self._closed:
            _log.warning("mqtt connection lost; reconnecting", broker=f"{self.host}:{self.port}", reason=str(reason))

    @property
    def connected(self) -> bool:
        """Whether the client is connected to the broker now."""
        return bool(self._client.is_connected())

    def topic_for(self, camera: str) -> str:
        """The topic a camera's results go to."""
        topic = self._topics.get(camera)
        if topic is None:
            topic = self.topic.replace("{camera}", camera)
            if "+" in topic or "#" in topic or "\0" in topic:
                raise SinkError(f"mqtt sink: camera {camera!r} makes topic {topic!r}, which has a wildcard or NUL")
            self._topics[camera] = topic
        return topic

    def write_batch(self, items: list[tuple[Result, float]]) -> list[BaseException | None]:
        if not self._first_wait_done:  # once: the first frames give the first connection a chance
            self._tried.wait(min(self.connect_timeout_s, self.timeout_s))
            self._first_wait_done = True
        mqtt = self._mqtt
        outcomes: list[BaseException | None] = []
        for result, wall in items:
            frame = result.frame
            try:
                topic = self.topic_for(frame.camera)
                payload = _dumps(result_record(result, wall, max_elements=self.max_elements)).encode("utf-8")
                if not self._client.is_connected():
                    raise SinkError(f"mqtt sink: not connected to {self.host}:{self.port} (reconnecting); camera "
                                    f"{frame.camera!r} frame {frame.index} not sent")
                rc = self._client.publish(topic, payload, self.qos, self.retain).rc
                if rc != mqtt.MQTT_ERR_SUCCESS:
                    raise SinkError(f"mqtt sink {self.host}:{self.port}: publishing camera {frame.camera!r} frame "
                                    f"{frame.index} to {topic!r} failed: {mqtt.error_string(rc)}")
                outcomes.append(None)
            except SinkError as exc:
                outcomes.append(exc)
            except (ValueError, TypeError) as exc:  # a value json can't hold, a bad topic
                outcomes.append(SinkError(f"mqtt sink: camera {frame.camera!r} frame {frame.index}: "
                                          f"{type(exc).__name__}: {exc}"))
        return outcomes

    def close_io(self) -> None:
        try:
            self._client.disconnect()  # queued after the publishes: they go out first
        finally:
            self._client.loop_stop()

    def __repr__(self) -> str:
        return f"MqttSink({self.host}:{self.port}, topic={self.topic!r})"
