"""``orchestra run --metrics-port N``: Prometheus metrics through ``prometheus_client``, plus
health, readiness and status endpoints, served from a thread of their own.

The run publishes a :class:`MetricsSnapshot` (plain frozen data, histograms included) from
its event loop about twice a second, by one attribute assignment. The HTTP server runs in
its own thread; a scrape renders that snapshot with ``prometheus_client``'s exposition
(``generate_latest`` over a :class:`~prometheus_client.CollectorRegistry` of the run's own,
never the process-global one). So however often and however many clients scrape, the
event loop does no more work and takes no lock: scrapes never cost frames.

Endpoints (``GET`` or ``HEAD``; anything else 405, unknown paths 404):

- ``/metrics``: the exposition (counters, gauges, and histograms with ``_bucket``,
  ``_count`` and ``_sum``);
- ``/healthz``: ``200 ok`` while the process serves requests;
- ``/readyz``: ``200 ready`` once every instance is loaded and running and the cameras run;
  ``503`` with the reason otherwise (loading, an instance not running, draining, done);
- ``/status``: JSON with what the summary shows (cameras, executions per option set,
  energy, decisions, signals), as of the last snapshot.
"""

from __future__ import annotations

import http.server
import json
import math
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from .telemetry import HistogramSnapshot

__all__ = ["CONTENT_TYPE", "EnergyUse", "MetricsServer", "MetricsSnapshot", "RunCollector", "new_registry"]

CONTENT_TYPE = CONTENT_TYPE_LATEST


@dataclass(frozen=True, slots=True)
class EnergyUse:
    """Modelled device time and energy one camera spent in one power mode (npu_sim)."""

    camera: str
    power_mode: str  # "*" when the core was shared and only the camera's total is known
    jobs: int
    device_seconds: float
    energy_joules: float


@dataclass(frozen=True)
class MetricsSnapshot:
    """Everything one scrape shows, copied on the event loop (no live objects).

    ``cameras``: :class:`~orchestra._dashboard.CameraRow`; ``instances``:
    :class:`~orchestra.orchestrator.InstanceStatistics`; ``executions_by_options``:
    instance -> option set label -> executes; ``options``: instance -> (backend, option,
    value) in force; ``engine``: :class:`~orchestra.orchestrator.OrchestratorStatistics`;
    ``status``: the JSON document ``/status`` answers; ``nodes`` (a run on a Ray cluster):
    per camera its node id, address, state and restarts.
    """

    uptime_s: float
    ready: bool
    not_ready_reason: str
    cameras: Sequence[Any] = ()
    frame_latency: Mapping[str, HistogramSnapshot] = field(default_factory=dict)
    execute_latency: Mapping[str, HistogramSnapshot] = field(default_factory=dict)
    instances: Sequence[Any] = ()
    executions_by_options: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    options: Mapping[str, Sequence[tuple[str, str, Any]]] = field(default_factory=dict)
    energy: Sequence[EnergyUse] = ()
    decisions: int = 0
    engine: Any = None
    signals: Mapping[str, Any] = field(default_factory=dict)
    status: Mapping[str, Any] = field(default_factory=dict)
    nodes: Sequence[tuple[str, str, str, str, int]] = ()  # cluster run: (camera, node, address, state, restarts)


def _hist(name: str, doc: str, label: str, hists: Mapping[str, HistogramSnapshot]) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=[label])
    for key, h in hists.items():
        fam.add_metric([key], h.cumulative(), h.sum)
    return fam


def _value_label(v: Any) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


class RunCollector(Collector):
    """A ``prometheus_client`` collector over the last published :class:`MetricsSnapshot`.

    :meth:`publish` (any thread; the run calls it on its loop) swaps the snapshot in;
    :meth:`collect` (the HTTP thread) reads whichever one is current.
    """

    def __init__(self) -> None:
        self.snapshot: MetricsSnapshot | None = None
        self.published = 0

    def publish(self, snapshot: MetricsSnapshot) -> None:
        self.snapshot = snapshot
        self.published += 1

    def collect(self) -> Iterator[Metric]:  # noqa: C901 - one family after the other
        s = self.snapshot
        if s is None:
            return
        up = GaugeMetricFamily("orchestra_run_uptime_seconds", "Seconds since the pipelines started.")
        up.add_metric([], s.uptime_s)
        yield up
        ready = GaugeMetricFamily("orchestra_ready", "1 while every instance is loaded and running (see /readyz).")
        ready.add_metric([], 1.0 if s.ready else 0.0)
        yield ready
        cam = ["camera"]
        fams = {
            "produced": CounterMetricFamily("orchestra_frames_produced", "Frames taken from the camera's source.", labels=cam),
            "processed": CounterMetricFamily("orchestra_frames_processed", "Frames that reached the sink.", labels=cam),
            "failed": CounterMetricFamily("orchestra_frames_failed",
                                          "Frames whose pre-process, execute, post-process or sink raised.", labels=cam),
        }
        dropped = CounterMetricFamily("orchestra_frames_dropped", "Frames dropped, by reason.", labels=["camera", "reason"])
        depth = GaugeMetricFamily("orchestra_queue_depth", "Frames waiting in the camera's queue.", labels=cam)
        cap = GaugeMetricFamily("orchestra_queue_capacity", "The camera's queue capacity.", labels=cam)
        fps_in = GaugeMetricFamily("orchestra_input_fps", "Frames per second from the source (last few seconds).", labels=cam)
        fps_out = GaugeMetricFamily("orchestra_output_fps", "Frames per second to the sink (last few seconds).", labels=cam)
        for c in s.cameras:
            fams["produced"].add_metric([c.name], c.produced)
            fams["processed"].add_metric([c.name], c.processed)
            fams["failed"].add_metric([c.name], c.failed)
            for reason, n in c.dropped.items():
                dropped.add_metric([c.name, reason], n)
            depth.add_metric([c.name], c.queue_depth)
            cap.add_metric([c.name], c.queue_capacity)
            fps_in.add_metric([c.name], c.input_fps)
            fps_out.add_metric([c.name], c.output_fps)
        yield from fams.values()
        yield from (dropped, depth, cap, fps_in, fps_out)
        if s.nodes:
            where = GaugeMetricFamily("orchestra_camera_node_info", "The Ray node a camera's current (or last) try "
                                      "runs on, and its state (cluster runs).", labels=["camera", "node", "address", "state"])
            restarts = CounterMetricFamily("orchestra_camera_restarts", "Times a camera was restarted after its "
                                           "node was lost (cluster runs).", labels=cam)
            for camera, node, address, state, n in s.nodes:
                where.add_metric([camera, node, address, state], 1.0)
                restarts.add_metric([camera], n)
            yield from (where, restarts)
        yield _hist("orchestra_frame_latency_seconds", "Capture-to-sink latency of processed frames.", "camera",
                    s.frame_latency)
        yield _hist("orchestra_execute_latency_seconds",
                    "Execute round trip as the camera's pipeline saw it (submit to result), per instance.", "instance",
                    s.execute_latency)

        lab = ["instance", "pool"]
        inst = {
            "executions": CounterMetricFamily("orchestra_instance_executions", "Executes that returned, per instance.",
                                              labels=lab),
            "failures": CounterMetricFamily("orchestra_instance_failures", "Executes that raised, per instance.", labels=lab),
            "rejected": CounterMetricFamily("orchestra_instance_rejected",
                                            "Requests refused for the caller's mistake (bad inputs; not failures).",
                                            labels=lab),
            "restarts": CounterMetricFamily("orchestra_instance_restarts", "Fresh Methods loaded after a failure.",
                                            labels=lab),
            "replacements": CounterMetricFamily("orchestra_instance_replacements", "Quarantines after a deadline.",
                                                labels=lab),
        }
        inflight = GaugeMetricFamily("orchestra_instance_in_flight", "Executes queued or running on the instance.",
                                     labels=lab)
        up_i = GaugeMetricFamily("orchestra_instance_up", "1 while the instance can execute (running or paused).",
                                 labels=[*lab, "state"])
        for i in s.instances:
            key = [i.name, i.pool]
            inst["executions"].add_metric(key, i.executes)
            inst["failures"].add_metric(key, i.failures)
            inst["rejected"].add_metric(key, getattr(i, "rejected", 0))
            inst["restarts"].add_metric(key, i.restarts)
            inst["replacements"].add_metric(key, i.replacements)
            inflight.add_metric(key, i.in_flight)
            up_i.add_metric([*key, i.state], 1.0 if i.state in ("running", "paused", "restarting", "replacing") else 0.0)
        yield from inst.values()
        yield from (inflight, up_i)

        by_opts = CounterMetricFamily("orchestra_instance_executions_by_options",
                                      "Executes per instance and per set of options in force.", labels=["instance", "options"])
        for name, counts in s.executions_by_options.items():
            for label, n in counts.items():
                by_opts.add_metric([name, label], n)
        yield by_opts
        info = GaugeMetricFamily("orchestra_backend_option_info", "Backend options in force (the value is a label).",
                                 labels=["instance", "backend", "option", "value"])
        num = GaugeMetricFamily("orchestra_backend_option_value", "Numeric backend options in force.",
                                labels=["instance", "backend", "option"])
        for name, opts in s.options.items():
            for b, k, v in opts:
                info.add_metric([name, b, k, _value_label(v)], 1.0)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    num.add_metric([name, b, k], float(v))
        yield info
        yield num

        energy = CounterMetricFamily("orchestra_energy_joules", "Modelled device energy (npu_sim), per camera and "
                                     "power mode (\"*\": a shared core, camera total only).", labels=["camera", "power_mode"])
        dev = CounterMetricFamily("orchestra_device_seconds", "Modelled device time (npu_sim), per camera and power mode.",
                                  labels=["camera", "power_mode"])
        jobs = CounterMetricFamily("orchestra_device_jobs", "Device jobs (npu_sim), per camera and power mode.",
                                   labels=["camera", "power_mode"])
        for e in s.energy:
            energy.add_metric([e.camera, e.power_mode], e.energy_joules)
            dev.add_metric([e.camera, e.power_mode], e.device_seconds)
            jobs.add_metric([e.camera, e.power_mode], e.jobs)
        yield from (energy, dev, jobs)

        dec = CounterMetricFamily("orchestra_policy_decisions", "Option changes and actions made by the policy engine.")
        dec.add_metric([], s.decisions)
        yield dec
        if s.engine is not None:
            e = s.engine
            for name, doc, v in (("orchestra_engine_runs", "Policy engine runs.", e.engine_runs),
                                 ("orchestra_engine_changes", "Option values changed by the engine.", e.changes_applied),
                                 ("orchestra_engine_actions", "Actions applied by the engine.", e.actions_applied),
                                 ("orchestra_engine_rejected", "Proposal entries rejected.", e.proposals_rejected),
                                 ("orchestra_engine_policy_errors", "Policy runs that raised.", e.policy_errors)):
                c = CounterMetricFamily(name, doc)
                c.add_metric([], v)
                yield c
        sig = GaugeMetricFamily("orchestra_signal", "Numeric signal values of the engine's last poll.", labels=["signal"])
        for k, v in sorted(s.signals.items()):
            if isinstance(v, (int, float)) and math.isfinite(float(v)):
                sig.add_metric([k], float(v))
        yield sig


def new_registry() -> tuple[CollectorRegistry, RunCollector]:
    """A registry of the run's own (not ``prometheus_client.REGISTRY``) holding a fresh
    :class:`RunCollector`."""
    registry = CollectorRegistry(auto_describe=False)
    collector = RunCollector()
    registry.register(collector)
    return registry, collector


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # no access log on stderr (the dashboard owns the terminal)

    def _reply(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
               extra: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.close_connection = True

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        owner = self.server.owner
        path = self.path.split("?", 1)[0]
        try:
            if path == "/metrics":
                body = generate_latest(owner.registry)
                owner.scrapes += 1
                self._reply(200, body, CONTENT_TYPE)
            elif path == "/healthz":
                self._reply(200, b"ok\n")
            elif path == "/readyz":
                snap = owner.collector.snapshot
                if snap is not None and snap.ready:
                    self._reply(200, b"ready\n")
                else:
                    why = "loading" if snap is None else snap.not_ready_reason
                    self._reply(503, f"not ready: {why}\n".encode())
            elif path == "/status":
                snap = owner.collector.snapshot
                doc = {"ready": False, "state": "loading"} if snap is None else dict(snap.status)
                self._reply(200, (json.dumps(doc, default=str, indent=1) + "\n").encode(), "application/json")
            else:
                self._reply(404, b"not found: try /metrics, /healthz, /readyz or /status\n")
        except (ConnectionError, TimeoutError):
            pass
        except Exception as exc:  # noqa: BLE001 - a scrape must not take the run down
            try:
                self._reply(500, f"{type(exc).__name__}: {exc}\n".encode())
            except OSError:
                pass

    do_HEAD = do_GET

    def _not_allowed(self) -> None:
        self._reply(405, b"method not allowed\n", extra={"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    owner: MetricsServer


class _Server6(_Server):
    address_family = socket.AF_INET6


class MetricsServer:
    """Serves a :class:`RunCollector`'s snapshots on ``host:port`` (port 0: any free port;
    see :attr:`port` once started) from a daemon thread of its own.

    ::

        registry, collector = new_registry()
        server = MetricsServer(registry, collector, "127.0.0.1", 9100)
        server.start()          # raises OSError when it can't listen
        collector.publish(snapshot)
        ...
        server.close()

    :attr:`scrapes` counts answered ``/metrics`` requests.
    """

    def __init__(self, registry: CollectorRegistry, collector: RunCollector, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.registry = registry
        self.collector = collector
        self.host = host
        self.port = port
        self.scrapes = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def start(self) -> None:
        """Listens and starts serving (raises ``OSError`` when the address is taken)."""
        cls = _Server6 if ":" in self.host else _Server
        server = cls((self.host, self.port), _Handler)
        server.owner = self
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="orchestra-metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stops serving (waits for the serving thread, not for open requests)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None

    def __enter__(self) -> MetricsServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

