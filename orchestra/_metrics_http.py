"""``orchestra run --metrics-port N``: Prometheus text exposition over a tiny asyncio HTTP
server (no dependency).

``GET /metrics`` answers ``text/plain; version=0.0.4`` built by a callable given to
:class:`MetricsServer`; any other path is a 404, any other method a 405. One request per
connection (``Connection: close``). The callable runs on the event loop, so it is called at
most once per ``min_interval_s`` (default 1 s): scrapes in between get the same text, and
however many clients scrape however often, rendering costs the run's frames nothing more.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidArgumentError

__all__ = ["CONTENT_TYPE", "DEFAULT_MIN_INTERVAL_S", "MetricsServer", "Registry"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_MIN_INTERVAL_S = 1.0
_MAX_REQUEST = 16 * 1024


def _escape(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(v: float) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


@dataclass
class _Family:
    name: str
    kind: str
    help: str
    samples: list[tuple[Mapping[str, Any], float]] = field(default_factory=list)


class Registry:
    """Collects metric families for one scrape; :meth:`text` renders them."""

    def __init__(self) -> None:
        self._families: dict[str, _Family] = {}

    def add(self, name: str, kind: str, help: str, value: float, /, **labels: Any) -> None:
        fam = self._families.get(name)
        if fam is None:
            fam = self._families[name] = _Family(name, kind, help)
        fam.samples.append((labels, value))

    def declare(self, name: str, kind: str, help: str, /) -> None:
        """A family with no samples yet still gets its HELP and TYPE lines."""
        if name not in self._families:
            self._families[name] = _Family(name, kind, help)

    def text(self) -> str:
        out = []
        for fam in self._families.values():
            out.append(f"# HELP {fam.name} {_escape(fam.help)}")
            out.append(f"# TYPE {fam.name} {fam.kind}")
            for labels, value in fam.samples:
                lab = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
                out.append(f"{fam.name}{{{lab}}} {_number(value)}" if lab else f"{fam.name} {_number(value)}")
        return "\n".join(out) + "\n"


def render(*, cameras: Sequence[Any], instances: Sequence[Any], executions_by_options: Mapping[str, Mapping[str, int]],
           options: Mapping[str, Iterable[tuple[str, str, Any]]], decisions: int, engine: Any | None,
           signals: Mapping[str, Any], uptime_s: float) -> str:
    """The exposition text for one scrape.

    ``cameras``: :class:`~orchestra._dashboard.CameraRow` objects; ``instances``:
    :class:`~orchestra.orchestrator.InstanceStatistics`; ``executions_by_options``:
    instance -> option set label -> executes; ``options``: instance -> (backend, option,
    value) in force; ``engine``: :class:`~orchestra.orchestrator.OrchestratorStatistics`.
    """
    r = Registry()
    r.add("orchestra_run_uptime_seconds", "gauge", "Seconds since the pipelines started.", uptime_s)
    for c in cameras:
        cam = c.name
        r.add("orchestra_frames_produced_total", "counter", "Frames taken from the camera's source.", c.produced, camera=cam)
        r.add("orchestra_frames_processed_total", "counter", "Frames that reached the sink.", c.processed, camera=cam)
        r.declare("orchestra_frames_dropped_total", "counter", "Frames dropped, by reason.")
        for reason, n in c.dropped.items():
            r.add("orchestra_frames_dropped_total", "counter", "", n, camera=cam, reason=reason)
        r.add("orchestra_frames_failed_total", "counter", "Frames whose pre-process, execute, post-process or sink raised.",
              c.failed, camera=cam)
        for q, v in (("0.5", c.p50), ("0.95", c.p95), ("0.99", c.p99)):
            r.add("orchestra_frame_latency_seconds", "gauge",
                  "Capture-to-sink latency quantiles over the camera's recent frames.", v, camera=cam, quantile=q)
        r.add("orchestra_queue_depth", "gauge", "Frames waiting in the camera's queue.", c.queue_depth, camera=cam)
        r.add("orchestra_queue_capacity", "gauge", "The camera's queue capacity.", c.queue_capacity, camera=cam)
        r.add("orchestra_input_fps", "gauge", "Frames per second from the source (last few seconds).", c.input_fps, camera=cam)
        r.add("orchestra_output_fps", "gauge", "Frames per second to the sink (last few seconds).", c.output_fps, camera=cam)
    for s in instances:
        lab = {"instance": s.name, "pool": s.pool}
        r.add("orchestra_instance_executions_total", "counter", "Executes that returned, per instance.", s.executes, **lab)
        r.add("orchestra_instance_failures_total", "counter", "Executes that raised, per instance.", s.failures, **lab)
        r.add("orchestra_instance_restarts_total", "counter", "Fresh Methods loaded after a failure.", s.restarts, **lab)
        r.add("orchestra_instance_replacements_total", "counter", "Quarantines after a deadline.", s.replacements, **lab)
        r.add("orchestra_instance_in_flight", "gauge", "Executes queued or running on the instance.", s.in_flight, **lab)
        r.add("orchestra_instance_up", "gauge", "1 while the instance can execute (running or paused).",
              1 if s.state in ("running", "paused", "restarting", "replacing") else 0, **lab, state=s.state)
        lat = s.latency
        for q, v in (("0.5", lat.p50), ("0.95", lat.p95), ("0.99", lat.p99)):
            r.add("orchestra_instance_execute_latency_seconds", "gauge",
                  "Method.execute time on the worker, quantiles over recent executes.", v, **lab, quantile=q)
    r.declare("orchestra_instance_executions_by_options_total", "counter",
              "Executes per instance and per set of options in force.")
    for inst, counts in executions_by_options.items():
        for label, n in counts.items():
            r.add("orchestra_instance_executions_by_options_total", "counter", "", n, instance=inst, options=label)
    r.declare("orchestra_backend_option_info", "gauge", "Backend options in force (the value is a label).")
    for inst, opts in options.items():
        for b, k, v in opts:
            val = ("true" if v else "false") if isinstance(v, bool) else v
            r.add("orchestra_backend_option_info", "gauge", "", 1, instance=inst, backend=b, option=k, value=val)
            if isinstance(v, (int, float)):
                r.add("orchestra_backend_option_value", "gauge", "Numeric backend options in force.", float(v),
                      instance=inst, backend=b, option=k)
    r.add("orchestra_policy_decisions_total", "counter", "Option changes and actions made by the policy engine (seen).",
          decisions)
    if engine is not None:
        r.add("orchestra_engine_runs_total", "counter", "Policy engine runs.", engine.engine_runs)
        r.add("orchestra_engine_changes_total", "counter", "Option values changed by the engine.", engine.changes_applied)
        r.add("orchestra_engine_actions_total", "counter", "Actions applied by the engine.", engine.actions_applied)
        r.add("orchestra_engine_rejected_total", "counter", "Proposal entries rejected.", engine.proposals_rejected)
        r.add("orchestra_engine_policy_errors_total", "counter", "Policy runs that raised.", engine.policy_errors)
    for k, v in sorted(signals.items()):
        if isinstance(v, (int, float)):
            r.add("orchestra_signal", "gauge", "Numeric signal values of the engine's last poll.", float(v), signal=k)
    return r.text()


class MetricsServer:
    """Serves ``render()`` at ``/metrics`` on ``host:port`` (port 0: any free port; see
    :attr:`port` once started). ``render`` is called at most once per ``min_interval_s``
    seconds (the first scrape after that renders; the others get the cached text):
    :attr:`scrapes` counts answered scrapes, :attr:`renders` the calls.

    ::

        async with MetricsServer(lambda: text, "127.0.0.1", 9100) as server:
            print(server.url)
    """

    def __init__(self, render: Callable[[], str], host: str = "127.0.0.1", port: int = 0, *,
                 min_interval_s: float = DEFAULT_MIN_INTERVAL_S) -> None:
        if isinstance(min_interval_s, bool) or not isinstance(min_interval_s, (int, float)) \
                or not 0 <= min_interval_s < math.inf:
            raise InvalidArgumentError(f"MetricsServer: min_interval_s must be a number of seconds >= 0, got {min_interval_s!r}")
        self._render = render
        self.host = host
        self.port = port
        self.min_interval_s = float(min_interval_s)
        self._server: asyncio.AbstractServer | None = None
        self._cached: str | None = None
        self._cached_at = 0.0
        self.scrapes = 0
        self.renders = 0

    def _body(self) -> str:
        now = time.monotonic()
        if self._cached is None or now - self._cached_at >= self.min_interval_s:
            text = self._render()
            self._cached, self._cached_at = text, now
            self.renders += 1
        return self._cached

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            try:
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - closing anyway
                pass
            self._server = None

    async def __aenter__(self) -> MetricsServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError):
                return
            if len(head) > _MAX_REQUEST:
                await self._reply(writer, 431, "Request Header Fields Too Large", "too large\n")
                return
            line = head.split(b"\r\n", 1)[0].decode("latin-1")
            parts = line.split()
            if len(parts) != 3 or not parts[2].startswith("HTTP/"):
                await self._reply(writer, 400, "Bad Request", "bad request\n")
                return
            method, target = parts[0], parts[1]
            path = target.split("?", 1)[0]
            if path != "/metrics":
                await self._reply(writer, 404, "Not Found", "not found: try /metrics\n")
                return
            if method not in ("GET", "HEAD"):
                await self._reply(writer, 405, "Method Not Allowed", "method not allowed\n", extra="Allow: GET, HEAD\r\n")
                return
            try:
                body = self._body()
            except Exception as exc:  # noqa: BLE001 - a scrape must not take the run down
                await self._reply(writer, 500, "Internal Server Error", f"{type(exc).__name__}: {exc}\n")
                return
            self.scrapes += 1
            await self._reply(writer, 200, "OK", body, content_type=CONTENT_TYPE, head_only=method == "HEAD")
        finally:
            try:
                writer.close()
                await asyncio.wait_for(writer.wait_closed(), 1.0)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001
                pass

    @staticmethod
    async def _reply(writer: asyncio.StreamWriter, status: int, reason: str, body: str, *,
                     content_type: str = "text/plain; charset=utf-8", head_only: bool = False, extra: str = "") -> None:
        data = body.encode("utf-8")
        head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {len(data)}\r\n"
                f"Connection: close\r\n{extra}\r\n").encode("latin-1")
        try:
            writer.write(head if head_only else head + data)
            await writer.drain()
        except ConnectionError:
            pass
