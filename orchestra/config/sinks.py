"""A camera's ``sink`` table: where its results go — ``jsonl`` (a file), ``npy`` (a folder of
array stacks), ``mqtt`` (a broker) or a ``"module:attr"`` sink class with its parameters."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import OrchestraError
from ._base import _BAD, Checker, _any_bad, _freeze, _hint, _join, _thaw
from .post import check_params, import_class

SINK_KINDS = ("jsonl", "npy", "mqtt")
_KEYS = {
    "jsonl": ("kind", "path", "append", "max_elements", "timeout_ms"),
    "npy": ("kind", "dir", "what", "timeout_ms"),
    "mqtt": ("kind", "host", "port", "topic", "qos", "retain", "client_id", "username", "password", "keepalive",
             "max_elements", "timeout_ms"),
}
DEFAULT_TIMEOUT_MS = 5000.0


@dataclass(frozen=True)
class SinkConfig:
    """A camera's sink: ``kind`` (``jsonl``, ``npy``, ``mqtt`` or ``module:attr``), the
    sink's parameters (paths absolute) and ``timeout_s``: how long one frame may take to be
    written (the built-in sinks' own ``timeout_s``; for a ``module:attr`` sink the pipeline's
    ``sink_timeout_s``). Cameras whose sink tables are equal share one sink."""

    kind: str
    params: Mapping[str, Any] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_MS / 1000.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", _freeze(self.params))

    @property
    def builtin(self) -> bool:
        return self.kind in SINK_KINDS

    def key(self) -> str:
        """Equal for sink tables that make the same sink (one sink object serves them all)."""
        return json.dumps([self.kind, _thaw(self.params), self.timeout_s], sort_keys=True, default=str)

    def build(self) -> Any:
        """The sink (``orchestra.pipeline.load_sink(kind, **params)``); opens its file, folder
        or connection."""
        from orchestra.pipeline import load_sink

        params = _thaw(self.params)
        if self.builtin:
            params["timeout_s"] = self.timeout_s
        if self.kind == "npy":
            params["directory"] = params.pop("dir")
        return load_sink(self.kind, **params)

    @property
    def pipeline_timeout_s(self) -> float | None:
        """The pipeline's ``sink_timeout_s``: set for ``module:attr`` sinks only (the
        built-ins bound their own waits)."""
        return None if self.builtin else self.timeout_s

    def where(self) -> str:
        """Where the results go, for the run summary."""
        p = self.params
        if self.kind == "jsonl":
            return f"{p['path']} (jsonl)"
        if self.kind == "npy":
            return f"{p['dir']}/ (npy stacks)"
        if self.kind == "mqtt":
            return f"mqtt://{p['host']}:{p.get('port', 1883)} topic {p.get('topic', 'orchestra/{camera}')}"
        return self.kind


class SinkChecks(Checker):
    """Checks a camera's ``sink`` (:meth:`check_sink`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sink_outputs: dict[tuple[str, str], tuple[str, str]] = {}  # (kind, file) -> (camera path, key)

    def check_sink(self, path: str, t: dict[str, Any], camera: str | None) -> Any:
        """The camera's :class:`SinkConfig`, None without a ``sink`` key, or _BAD."""
        if "sink" not in t:
            return None
        sp = _join(path, "sink")
        s = self.table(t["sink"], sp)
        if s is None:
            return _BAD
        kind = self.get(s, "kind", sp, "string")
        if kind is _BAD:
            return _BAD
        timeout_ms = self.get(s, "timeout_ms", sp, "positive_number", DEFAULT_TIMEOUT_MS)
        if kind in SINK_KINDS:
            self.known(s, sp, _KEYS[kind])
            params = getattr(self, f"check_{kind}_sink")(sp, s, camera)
        elif ":" in kind:
            from ..pipeline._sinks import sink_class_problem

            cls = import_class(self, _join(sp, "kind"), kind, "sink", sink_class_problem)
            params = {k: v for k, v in s.items() if k not in ("kind", "timeout_ms")}
            if cls is _BAD or not check_params(self, sp, cls, params, "sink"):
                params = _BAD
        else:
            self.err(_join(sp, "kind"), f"no sink kind {kind!r} (kinds: {', '.join(SINK_KINDS)}; or 'module:attr')"
                                        f"{_hint(kind, SINK_KINDS)}")
            return _BAD
        if _any_bad(params, timeout_ms):
            return _BAD
        sink = SinkConfig(kind, params, timeout_ms / 1000.0)
        out = sink.params.get("path") if kind == "jsonl" else sink.params.get("dir") if kind == "npy" else None
        if out is not None:
            other = self._sink_outputs.setdefault((kind, out), (path, sink.key()))
            if other[1] != sink.key():
                key = "path" if kind == "jsonl" else "dir"
                self.err(_join(sp, key), f"{s[key]} is also written by {other[0]} with another sink table: cameras "
                                         f"writing one {kind} output share one sink, so their sink tables must be equal")
                return _BAD
        return sink

    def _resolve(self, written: str) -> Path:
        return Path(written) if Path(written).is_absolute() else (self.base / written).resolve()

    def check_jsonl_sink(self, sp: str, s: dict[str, Any], camera: str | None) -> Any:
        written = self.get(s, "path", sp, "string")
        append = self.get(s, "append", sp, "bool", False)
        max_elements = self.get(s, "max_elements", sp, "positive_int", 1024)
        if written is not _BAD:
            p = self._resolve(written)
            if p.is_dir():
                self.err(_join(sp, "path"), f"{written} is a folder; a jsonl sink writes a file")
                written = _BAD
            elif not p.parent.is_dir():
                self.err(_join(sp, "path"), f"{written}: the folder {p.parent} does not exist")
                written = _BAD
        if _any_bad(written, append, max_elements):
            return _BAD
        return {"path": str(self._resolve(written)), "append": append, "max_elements": max_elements}

    def check_npy_sink(self, sp: str, s: dict[str, Any], camera: str | None) -> Any:
        written = self.get(s, "dir", sp, "string")
        what = self.choice(s, "what", sp, ("outputs", "value"), "outputs")
        if written is not _BAD:
            p = self._resolve(written)
            if p.exists() and not p.is_dir():
                self.err(_join(sp, "dir"), f"{written} exists and is not a folder")
                written = _BAD
        if _any_bad(written, what):
            return _BAD
        return {"dir": str(self._resolve(written)), "what": what}

    def check_mqtt_sink(self, sp: str, s: dict[str, Any], camera: str | None) -> Any:
        host = self.get(s, "host", sp, "string")
        port = self.get(s, "port", sp, "positive_int", 1883)
        if port is not _BAD and port > 65535:
            self.err(_join(sp, "port"), f"{port} is not a TCP port (1..65535)")
            port = _BAD
        topic = self.get(s, "topic", sp, "string", "orchestra/{camera}")
        qos = self.get(s, "qos", sp, "nonneg_int", 0)
        if qos is not _BAD and qos > 2:
            self.err(_join(sp, "qos"), f"{qos} is not an MQTT QoS (0, 1 or 2)")
            qos = _BAD
        retain = self.get(s, "retain", sp, "bool", False)
        max_elements = self.get(s, "max_elements", sp, "positive_int", 1024)
        keepalive = self.get(s, "keepalive", sp, "positive_int", 60)
        extra = {k: self.get(s, k, sp, "string", None) for k in ("client_id", "username", "password")}
        if topic is not _BAD:
            from ..pipeline._mqtt import _check_template

            try:
                _check_template(topic)
                if camera is not None and ("+" in camera or "#" in camera) and "{camera}" in topic:
                    self.err(_join(sp, "topic"), f"camera {camera!r} has an MQTT wildcard (+, #): it can't be in a topic")
                    topic = _BAD
            except OrchestraError as exc:
                self.err(_join(sp, "topic"), exc.message.removeprefix("MqttSink: "))
                topic = _BAD
        try:
            import paho.mqtt.client  # noqa: F401
        except ImportError:
            self.err(_join(sp, "kind"), "'mqtt' needs paho-mqtt: pip install 'orchestra[mqtt]'")
            return _BAD
        if _any_bad(host, port, topic, qos, retain, max_elements, keepalive, *extra.values()):
            return _BAD
        params = {"host": host, "port": port, "topic": topic, "qos": qos, "retain": retain, "keepalive": keepalive,
                  "max_elements": max_elements}
        params.update({k: v for k, v in extra.items() if v is not None})
        return params
