"""``orchestra run FILE``: a config's cameras as parallel pipelines, one orchestrator
instance per camera, the policy engine retuning them, a live view, a summary at the end.

:func:`run` takes a loaded :class:`~orchestra.config.Config`; the CLI validates the file,
calls :func:`configure_logging` and maps the result to an exit status:

- 0: every frame was processed or dropped by policy, and the accounting identity held
  (frames whose inputs an instance refused — a caller's mistake, ``ExecuteRejectedError`` —
  are listed as notes in the summary, not failures);
- 1: a frame failed, an instance failed permanently, a source raised, or frames were lost;
- 130: interrupted (SIGINT; 143 for SIGTERM) — sources stopped, queues drained, summary
  printed. A second Ctrl-C drops what is still queued; a third abandons the drain.

Executions are counted per set of options in force: each camera's executor wraps its
instance and files every execute under the options it ran with
(``Instance.execute(..., detail=True)`` returns them), so a policy's change mid-run shows up
as two counts. Policy decisions come from diffing ``orch.explain()`` a few times a second (the
time of each is the engine's own timestamp, not the poll's).

Everything the views show is gathered on the event loop: the dashboard's frames, the
metrics snapshots (published for the metrics server's own thread to render), the report's
timeline samples, and energy from the npu_sim devices' statistics. :func:`summary_dict` is
the summary as JSON (``--summary-json``).
"""

from __future__ import annotations

import collections
import contextlib
import gc
import importlib.util
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, TextIO

import anyio
import structlog

from ._dashboard import (
    CameraRow,
    Dashboard,
    Decision,
    LogBuffer,
    Screen,
    StatusLine,
    decision_table,
    fmt_drops,
    fmt_joules,
    fmt_ms,
    fmt_options,
    fmt_unit,
    fmt_value,
    printable,
)
from ._dashboard import _Column, _rich_table, rich_header
from ._metrics_http import EnergyUse, MetricsServer, MetricsSnapshot, RunCollector, new_registry
from .config import Config
from .errors import InvalidArgumentError, OrchestraError
from .telemetry import Histogram, get_logger

__all__ = ["SUMMARY_SCHEMA", "ClusterRow", "ClusterRunResult", "ClusterScreen", "NodeRun", "RunOptions", "RunResult",
           "cluster_decisions", "cluster_rows", "cluster_summary_dict", "configure_logging", "deferred_signals",
           "render_cluster_summary", "render_summary", "run", "run_cluster",
           "summary_dict"]

_log = get_logger("orchestra.run")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130

_Snapshot = tuple[tuple[str, str, Any], ...]  # (backend, option, value) in force


# ---------------------------------------------------------------------------------------
# Logging (the CLI's job: the library never configures it)


def configure_logging(fmt: str = "console", stream: Any = None, *, level: int = logging.INFO,
                      colors: bool | None = None, timefmt: str = "iso") -> None:
    """structlog writes one line per event to ``stream`` (default stderr): ``console``
    (human-readable key=value) or ``json`` (one JSON object per line). ISO timestamps
    are timezone-aware: local time with its UTC offset (``2026-11-23T19:40:01.123456+00:00``).
    ``timefmt``: the console timestamp (``"iso"`` or a strftime format)."""
    import json

    stream = sys.stderr if stream is None else stream
    stamp = _aware_timestamp if fmt == "json" or timefmt == "iso" else \
        structlog.processors.TimeStamper(fmt=timefmt, utc=False)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        stamp,
    ]
    if fmt == "json":
        processors = shared + [structlog.processors.dict_tracebacks,
                               structlog.processors.JSONRenderer(serializer=json.dumps, default=repr)]
    else:
        if colors is None:
            colors = bool(getattr(stream, "isatty", lambda: False)()) and "NO_COLOR" not in os.environ
        processors = shared + [structlog.dev.ConsoleRenderer(colors=colors, pad_event_to=30)]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )


def _aware_timestamp(logger: Any, name: str, event: dict[str, Any]) -> dict[str, Any]:
    import datetime

    event["timestamp"] = datetime.datetime.now().astimezone().isoformat(timespec="microseconds")
    return event


# ---------------------------------------------------------------------------------------
# Options and result


@dataclass(frozen=True)
class RunOptions:
    """How to run: ``duration_s`` None runs until interrupted; ``dashboard`` draws the live
    view on ``out`` (only sensible on a terminal), else a status line every
    ``status_interval_s``; ``logs`` is the buffer log lines go to while the dashboard is
    up (the dashboard prints each once, above its live area). ``metrics_port``: serve
    ``/metrics``, ``/healthz``, ``/readyz`` and ``/status`` (a snapshot published every
    ``publish_s``); ``record_s``: sample a timeline for the HTML report this often
    (``RunResult.timeline``). ``latency_window``: how many of the latest
    frames (all cameras) ``RunResult.latency`` is computed over."""

    duration_s: float | None = None
    dashboard: bool = False
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    use_uvloop: bool = True
    refresh_s: float = 0.25
    status_interval_s: float = 2.0
    logs: LogBuffer | None = None
    record_s: float | None = None  # sample a timeline (for --report) this often; None: don't
    publish_s: float = 0.5  # how often the metrics snapshot is refreshed
    latency_window: int = 8192
    progress: Any = None  # called every publish_s with {camera: progress_snapshot} (clusters; see report_progress)


@dataclass
class RunResult:
    """What happened (the summary is rendered from it)."""

    config: Config
    loop: str = ""
    elapsed_s: float = 0.0
    ended_by: str = "duration"  # duration, sources ended, interrupted, terminated
    cameras: list[CameraRow] = field(default_factory=list)
    executions: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # camera -> [(option set, n)]
    instances: list[Any] = field(default_factory=list)  # InstanceStatistics
    decisions: list[Decision] = field(default_factory=list)
    signals: Mapping[str, Any] = field(default_factory=dict)
    engine: Any = None  # OrchestratorStatistics
    problems: list[str] = field(default_factory=list)  # what makes the exit status 1
    notes: list[str] = field(default_factory=list)  # worth saying, not a failure (rejected inputs)
    accounting: dict[str, str] = field(default_factory=dict)  # camera -> "ok" or the error
    interrupted_by: int | None = None  # the signal number
    drained: bool = True  # False: a second signal dropped the queued frames
    metrics_url: str | None = None
    metrics_scrapes: int = 0
    sources: dict[str, Any] = field(default_factory=dict)  # camera -> its source's statistics() (video sources)
    outputs: dict[str, list[str]] = field(default_factory=dict)  # where results went -> cameras
    sink_failures: dict[str, int] = field(default_factory=dict)  # camera -> frames its sink failed
    batches: list[Any] = field(default_factory=list)  # orchestra.pipeline.BatchStatistics per [[batch]]
    metrics_snapshots: int = 0  # snapshots the run published for the metrics server
    energy: list[EnergyUse] = field(default_factory=list)  # npu_sim model, per camera and power mode
    timeline: Any = None  # orchestra._report.Timeline when RunOptions.record_s was set
    latency: Any = None  # LatencySummary of every camera's frames together (capture to sink), None before the run

    @property
    def exit_code(self) -> int:
        if self.interrupted_by is not None:
            return 128 + self.interrupted_by
        return EXIT_FAILED if self.problems else EXIT_OK


# ---------------------------------------------------------------------------------------
# Per camera: the executor that counts executes per option set


def _with_batch_dim(frame: Any) -> list[Any]:
    """A pipeline pre-process: the frame's data with a leading batch dimension of 1 (a video
    source makes frames without it)."""
    return [frame.data[None]]


class _Counted:
    """An instance as a pipeline executor that counts its executes per option snapshot (the
    options each execute ran with, from ``execute(..., detail=True)``) and the requests the
    instance rejected (the caller's mistake: not a failure of the run; the frame is dropped
    with reason ``"rejected"`` where the pipeline has ``FrameDropped``). ``execute`` returns
    the :class:`~orchestra.orchestrator.Execution` (outputs + options): the pipeline hands
    its options on with the result. ``hist`` and ``frame_hist`` are the metrics' execute and
    frame latency histograms."""

    __slots__ = ("counts", "instance", "rejected", "last_rejected", "_labels", "_dropped", "hist", "frame_hist")

    def __init__(self, instance: Any) -> None:
        from . import pipeline

        self.instance = instance
        self.counts: dict[_Snapshot, int] = {}
        self.rejected = 0
        self.last_rejected = ""
        self._labels: dict[int, tuple[Any, _Snapshot]] = {}  # id(options) -> (options, snapshot)
        self._dropped: Any = getattr(pipeline, "FrameDropped", None)
        self.hist = Histogram()  # submit-to-result seconds (metrics)
        self.frame_hist = Histogram()  # capture-to-sink seconds of each processed frame (metrics)

    async def execute(self, inputs: list[Any]) -> Any:
        t = time.perf_counter()
        try:
            ex = await self.instance.execute(inputs, detail=True)
        except InvalidArgumentError as exc:  # ExecuteRejectedError: the inputs were refused
            self.rejected += 1
            self.last_rejected = exc.message
            if self._dropped is None:
                raise
            raise self._dropped("rejected", f"inputs rejected: {exc.message}") from exc
        self.hist.observe(time.perf_counter() - t)
        opts = ex.options
        hit = self._labels.get(id(opts))  # the worker hands out one snapshot object per option set
        if hit is None or hit[0] is not opts:
            snap = tuple((b, k, v) for b, vals in opts.items() for k, v in vals.items())
            if len(self._labels) > 64:
                self._labels.clear()
            self._labels[id(opts)] = hit = (opts, snap)
        counts = self.counts
        counts[hit[1]] = counts.get(hit[1], 0) + 1
        return ex

    def record_frame_latency(self, seconds: float) -> None:
        """The pipeline's frame latency (queueing included), for the instance's policies and
        the metrics' frame latency histogram."""
        self.frame_hist.observe(seconds)
        self.instance.record_frame_latency(seconds)

    def describe(self) -> Mapping[str, Any]:
        return self.instance.describe()


class _LeastBusy:
    """A [[batch]]'s executor: each batch runs on the member camera's instance with the
    fewest executes in flight, ties taken in turn (every batched camera keeps its own
    instance, binding and options; a batch runs on one of them)."""

    __slots__ = ("executors", "turn")

    def __init__(self, executors: Sequence[_Counted]) -> None:
        self.executors = tuple(executors)
        self.turn = 0

    async def execute(self, inputs: list[Any]) -> list[Any]:
        exs = self.executors
        n = len(exs)
        start = self.turn
        ex = min((exs[(start + k) % n] for k in range(n)), key=lambda e: e.instance.in_flight)
        self.turn = (start + 1) % n
        return await ex.execute(inputs)


class _BatchedCamera:
    """A batched camera's pipeline executor: its frames go through the batcher; it describes
    the camera's own instance (unit, options) like an unbatched camera."""

    __slots__ = ("counted", "member")

    def __init__(self, member: Any, counted: _Counted) -> None:
        self.member = member
        self.counted = counted

    async def execute(self, inputs: list[Any]) -> Any:
        return await self.member.execute(inputs)

    def describe(self) -> Mapping[str, Any]:
        return self.counted.describe()

    def record_frame_latency(self, seconds: float) -> None:
        """Passes the camera's frame latency on to its own instance's adapter when that
        takes them (latency-driven policies)."""
        record = getattr(self.counted, "record_frame_latency", None)
        if callable(record):
            record(seconds)


class _Tracker:
    """Policy decisions, from successive ``orch.explain()`` results."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.decisions: list[Decision] = []
        self.changed: set[tuple[str, str]] = set()  # (backend, option) changed during the run
        self.sources: dict[tuple[str, str, str], str] = {}  # (instance, backend, option) -> source
        self._values: dict[tuple[str, str, str], Any] = {}
        self._actions: dict[tuple[str, str], float] = {}

    def poll(self, explanation: Any, *, record: bool = True) -> None:
        for e in explanation.options:
            key = (e.instance, e.backend, e.option)
            self.sources[key] = e.source
            had = key in self._values
            prev = self._values.get(key)
            self._values[key] = e.value
            if record and had and prev != e.value:
                self.changed.add((e.backend, e.option))
                self.decisions.append(Decision(e.at - self.t0, e.wall, e.instance, f"{e.backend}.{e.option}", e.value,
                                               prev, e.policy, e.reason, e.source))
        for a in explanation.actions:
            key = (a.instance, a.action)
            if self._actions.get(key) != a.at:
                self._actions[key] = a.at
                if record:
                    self.decisions.append(Decision(a.at - self.t0, a.wall, a.instance, a.action, a.value, None,
                                                   a.policy, a.reason))
        self.decisions.sort(key=lambda d: d.t)

    def shown(self, instance: str) -> set[tuple[str, str]]:
        """The options worth showing for ``instance``: set by the config or a policy, or
        changed during the run (not the binding's or untouched defaults)."""
        return {(b, k) for (i, b, k), src in self.sources.items()
                if i == instance and (src in ("spec", "policy") or (b, k) in self.changed)}

    def not_bound(self, instance: str) -> set[tuple[str, str]]:
        """Every option of ``instance`` but those its resource binding sets."""
        return {(b, k) for (i, b, k), src in self.sources.items() if i == instance and src != "binding"}


def _label(snap: _Snapshot, keys: set[tuple[str, str]], qualify: bool) -> str:
    return fmt_options([(b, k, v) for b, k, v in snap if (b, k) in keys], qualify=qualify) or "(defaults)"


# ---------------------------------------------------------------------------------------
# The run


class _Runner:
    def __init__(self, config: Config, options: RunOptions, out: TextIO, err: TextIO) -> None:
        self.config = config
        self.opts = options
        self.out = out
        self.err = err
        self.result = RunResult(config)
        self.tracker = _Tracker()
        self.executors: dict[str, _Counted] = {}
        self.batchers: list[Any] = []
        self.qualify: dict[str, bool] = {}
        self.orch: Any = None
        self.group: Any = None
        self.metrics: MetricsServer | None = None
        self.collector: RunCollector | None = None
        self.frame_hist: dict[str, Histogram] = {}
        self.npus: list[Any] = []
        self.timeline: Any = None
        self._last_seen: tuple[dict[str, Any], int] = ({}, 0)
        self.dashboard: Dashboard | None = None
        self.error: BaseException | None = None
        self.stop_requested = 0
        self.signals: list[int] = []
        self.running = False
        self.t0: float | None = None
        self._scope: anyio.CancelScope | None = None

    # -- signals --------------------------------------------------------------------------
    def _on_signal(self, signum: int) -> None:
        self.signals.append(signum)
        self.stop_requested += 1
        n = self.stop_requested
        if self.result.interrupted_by is None:
            self.result.interrupted_by = signum
        name = signal.Signals(signum).name
        if n == 1:
            _log.warning("interrupted: stopping the sources and draining the queues (again to drop them)", signal=name)
            if self.group is not None:
                self.group.stop(drain=True)
        elif n == 2:
            _log.warning("interrupted again: dropping the queued frames", signal=name)
            if self.group is not None:
                self.group.stop(drain=False)
        elif self._scope is not None:
            _log.warning("interrupted a third time: abandoning the drain", signal=name)
            self._scope.cancel()

    async def _watch_signals(self, signals: Any) -> None:
        async for signum in signals:
            self._on_signal(signum)

    # -- views ----------------------------------------------------------------------------
    def rows(self, energy: Sequence[EnergyUse] | None = None) -> list[CameraRow]:
        if energy is None:
            energy = self.energy()
        by_cam: dict[str, float] = {}
        for e in energy:
            by_cam[e.camera] = by_cam.get(e.camera, 0.0) + e.energy_joules
        rows = []
        for cam in self.config.cameras:
            p = self.group[cam.name]
            s = p.statistics()
            ex = self.executors[cam.name]
            inst = ex.instance
            shown = self.tracker.shown(inst.name)
            opts = [(b, k, v) for b, vals in (s.options or {}).items() for k, v in vals.items() if (b, k) in shown]
            unit = f"{cam.core[0]}.core {cam.core[1]}" if cam.core is not None else fmt_unit(s.unit)
            a = s.accounting
            rows.append(CameraRow(
                name=cam.name, state=s.state, drop=s.drop, input_fps=s.input_fps, output_fps=s.output_fps,
                p50=s.latency.p50, p95=s.latency.p95, p99=s.latency.p99, produced=a.produced, processed=a.processed,
                failed=a.failed, dropped=dict(a.dropped), queue_depth=s.queue_depth, queue_capacity=s.queue_capacity,
                unit=unit, options=fmt_options(opts, qualify=self.qualify.get(cam.name, False)),
                instance_state=inst.state, energy_joules=by_cam.get(cam.name)))
        return rows

    def energy(self) -> list[EnergyUse]:
        """Modelled energy per camera and power mode, from the npu_sim devices' statistics.

        A core's jobs are filed per power mode by the device; when the camera's core served
        only this camera (the usual, exclusive binding) that is the camera's split; on a
        shared core only the camera's total is known (power mode ``"*"``)."""
        if not self.npus:
            return []
        cores = {}
        for dev in self.npus:
            for c in dev.statistics().cores:
                cores[(dev.name, c.core)] = c
        out = []
        for cam in self.config.cameras:
            ex = self.executors.get(cam.name)
            if ex is None:
                continue
            label = ex.instance.name
            served = [(c, s) for c in cores.values() for s in c.served if s.label == label]
            if not served:
                continue
            only = len(served) == 1 and all(s.label == label for s in served[0][0].served)
            if only:
                core = served[0][0]
                out += [EnergyUse(cam.name, m.power_mode, m.jobs, m.device_seconds, m.energy_joules) for m in core.by_mode]
            else:
                out.append(EnergyUse(cam.name, "*", sum(s.jobs for _, s in served),
                                     sum(s.device_seconds for _, s in served), sum(s.energy_joules for _, s in served)))
        return out

    def executions(self, *, stable: bool = False) -> dict[str, list[tuple[str, int]]]:
        """Per camera: (option set, executes) in the order first seen. The option set shows
        the options that changed during the run (when none did: those the config or a
        policy set); ``stable``: every option but the binding's (labels that don't change
        as the run goes on, for metrics)."""
        out = {}
        changed = self.tracker.changed
        for cam in self.config.cameras:
            ex = self.executors[cam.name]
            if stable:
                keys = self.tracker.not_bound(ex.instance.name)
            else:
                keys = changed if changed else self.tracker.shown(ex.instance.name)
            merged: dict[str, int] = {}
            for snap, n in list(ex.counts.items()):
                label = _label(snap, keys, self.qualify.get(cam.name, False))
                merged[label] = merged.get(label, 0) + n
            out[cam.name] = list(merged.items())
        return out

    def elapsed(self) -> float:
        return 0.0 if self.t0 is None else time.monotonic() - self.t0

    def screen(self, state: str) -> Screen:
        orch = self.orch
        info = []
        if orch is not None:
            info.append(f"engine runs {orch.statistics().engine_runs}")
        if self.metrics is not None:
            info.append(f"metrics {self.metrics.url}")
        energy = self.energy()
        return Screen(title=f"orchestra run {os.path.basename(self.config.path)}", elapsed=self.elapsed(),
                      duration=self.opts.duration_s, state=state, cameras=self.rows(energy),
                      decisions=list(self.tracker.decisions),
                      signals=dict(orch.signals) if orch is not None else {}, info="  ".join(info), energy=energy)

    def ready(self) -> tuple[bool, str]:
        """Ready: the cameras run and every instance is loaded and running."""
        if self.group is None or self.t0 is None:
            return False, "loading"
        if self.stop_requested:
            return False, "stopping"
        if not self.running:
            return False, "done"
        bad = [f"{ex.instance.name} {ex.instance.state}" for ex in self.executors.values()
               if ex.instance.state != "running"]
        if bad:
            return False, "instances not running: " + ", ".join(bad)
        return True, ""

    def snapshot(self) -> MetricsSnapshot:
        """What a scrape shows, copied now (on the loop)."""
        orch = self.orch
        energy = self.energy()
        rows = self.rows(energy)
        instances = [ex.instance.statistics() for ex in self.executors.values()]
        options = {s.name: [(b, k, v) for b, vals in s.options.items() for k, v in vals.items()] for s in instances}
        by_options = {self.executors[c].instance.name: dict(v) for c, v in self.executions(stable=True).items()}
        ready, why = self.ready()
        engine = orch.statistics() if orch is not None else None
        signals = dict(orch.signals) if orch is not None else {}
        status = _status_doc(self.config, rows, self.executions(), instances, list(self.tracker.decisions), engine,
                             signals, energy, self.elapsed(), "running" if ready else why)
        status["ready"] = ready
        return MetricsSnapshot(
            uptime_s=self.elapsed(), ready=ready, not_ready_reason=why, cameras=rows,
            frame_latency={c: h.snapshot() for c, h in self.frame_hist.items()},
            execute_latency={ex.instance.name: ex.hist.snapshot() for ex in self.executors.values()},
            instances=instances, executions_by_options=by_options, options=options, energy=energy,
            decisions=len(self.tracker.decisions), engine=engine, signals=signals, status=status)

    def publish(self) -> None:
        if self.collector is not None:
            self.collector.publish(self.snapshot())

    def report_progress(self) -> None:
        """Every camera's frame counts and rates so far (:func:`_progress_snapshot`), to
        ``RunOptions.progress`` (a cluster's driver keeps the latest: its live dashboard, and
        what it knows of a camera whose node dies)."""
        if self.opts.progress is None or self.group is None:
            return
        self.opts.progress({cam.name: _progress_snapshot(self.group[cam.name].statistics(), len(self.tracker.decisions))
                            for cam in self.config.cameras})

    def sample(self) -> None:
        """One point of the --report timeline."""
        if self.timeline is not None:
            energy = self.energy()
            self.timeline.add(self.elapsed(), self.rows(energy), energy,
                              dict(self.orch.signals) if self.orch is not None else {})

    # -- tasks ----------------------------------------------------------------------------
    async def _track(self) -> None:
        while True:
            await anyio.sleep(0.1)
            self.tracker.poll(self.orch.explain())

    async def _publish(self) -> None:
        """Metrics snapshots and timeline samples, each at its own pace."""
        pub = self.opts.publish_s if self.collector is not None or self.opts.progress is not None else None
        rec = self.opts.record_s if self.timeline is not None else None
        next_pub = next_rec = last_rec = time.monotonic()
        while True:
            now = time.monotonic()
            if pub is not None and now >= next_pub:
                self.publish()
                self.report_progress()
                next_pub = now + pub
            if rec is not None and (now >= next_rec or (now >= last_rec + 0.2 and self._moved())):
                self.sample()  # on time, or early when a signal or a decision moved (a step at its time)
                next_rec, last_rec = now + rec, now
            waits = [t for t, on in ((next_pub, pub), (next_rec, rec)) if on is not None]
            if not waits:
                return
            await anyio.sleep(min(max(min(waits) - time.monotonic(), 0.01), 0.1))

    def _moved(self) -> bool:
        orch = self.orch
        now = (dict(orch.signals) if orch is not None else {}, len(self.tracker.decisions))
        if now != self._last_seen:
            self._last_seen = now
            return True
        return False

    async def _ui(self) -> None:
        if self.dashboard is not None:
            while True:
                self.dashboard.refresh(self.screen("draining" if self.stop_requested else "running"))
                await anyio.sleep(self.opts.refresh_s)
        status = StatusLine(self.out)
        while True:
            await anyio.sleep(self.opts.status_interval_s)
            status.show(self.screen("running"))

    # -- main -----------------------------------------------------------------------------
    async def main(self, signals: Any) -> None:
        async with anyio.create_task_group() as tg:
            self._scope = tg.cancel_scope
            tg.start_soon(self._watch_signals, signals)
            try:
                await self._session()
            except Exception as exc:  # noqa: BLE001 - re-raised by run() outside the loop
                self.error = exc
            finally:
                tg.cancel_scope.cancel()

    async def _session(self) -> None:
        from orchestra.backends.npu_sim import register_device
        from orchestra.orchestrator import Orchestrator
        from orchestra.pipeline import Pipeline, Pipelines
        from orchestra.runtime import load_program

        cfg = self.config
        npus = self.npus
        if self.opts.metrics_port is not None:  # up while loading: /healthz answers, /readyz says loading
            self.metrics, self.collector = _start_metrics(self.opts)
            self.result.metrics_url = self.metrics.url
        if self.opts.record_s is not None:
            from ._report import Timeline

            self.timeline = Timeline([c.name for c in cfg.cameras])
        try:
            resources = []
            for d in cfg.devices:
                if d.kind == "npu_sim":
                    dev = d.build_npu_device()
                    npus.append(dev)
                    register_device(dev)
                    resources.append(d.build_resource(dev))
                else:
                    resources.append(d.build_resource())
            policies = [p.build() for p in cfg.policies]
            sources = [s.build() for s in cfg.signals]
            async with Orchestrator(resources=resources, policies=policies, signals=sources,
                                    period=cfg.run.engine_period_s, poll_interval=cfg.run.poll_interval_s) as orch:
                self.orch = orch
                pools = {}
                for prog in cfg.programs:
                    cams = [c for c in cfg.cameras if c.program == prog.name]
                    if not cams:
                        continue
                    program = await anyio.to_thread.run_sync(load_program, prog.path)
                    pools[prog.name] = await orch.load(program, method=prog.method, name=prog.name,
                                                       instances=[c.instance_spec() for c in cams])
                group = Pipelines(latency_window=self.opts.latency_window)
                sinks: dict[str, Any] = {}  # equal sink tables share one sink
                for cam in cfg.cameras:
                    pool = pools[cam.program]
                    self.executors[cam.name] = _Counted(pool[cam.name])
                    self.qualify[cam.name] = len(pool.backends) > 1
                members: dict[str, Any] = {}
                for b in cfg.batches:  # one Batcher per [[batch]], over its cameras' instances
                    batcher = b.build(_LeastBusy([self.executors[c] for c in b.cameras]))
                    self.batchers.append(batcher)
                    for c in b.cameras:
                        members[c] = _BatchedCamera(batcher.member(c), self.executors[c])
                for cam in cfg.cameras:
                    ex = members.get(cam.name, self.executors[cam.name])
                    self.frame_hist[cam.name] = self.executors[cam.name].frame_hist
                    sink = None
                    if cam.sink is not None:
                        sink = sinks.get(cam.sink.key())
                        if sink is None:  # opens its file or connection: off the loop
                            sink = sinks[cam.sink.key()] = await anyio.to_thread.run_sync(cam.sink.build)
                        self.result.outputs.setdefault(cam.sink.where(), []).append(cam.name)
                    group.add(Pipeline(cam.name, cam.build_source(), ex, queue=cam.queue, drop=cam.drop,
                                       deadline_s=cam.deadline_s, inflight=cam.inflight,
                                       pre=_with_batch_dim if cam.add_batch else None,
                                       post=None if cam.post is None else cam.post.build(), sink=sink,
                                       sink_timeout_s=None if cam.sink is None else cam.sink.pipeline_timeout_s))
                self.group = group
                self.tracker.poll(orch.explain(), record=False)
                _collect_before_frames()
                for s in sources:  # scripted signals: time 0 is when the cameras start
                    start = getattr(s, "start", None)
                    if callable(start):
                        start()
                self.t0 = self.tracker.t0 = time.monotonic()
                await orch.refresh()  # the policies see the first signals before the first frame
                self.tracker.poll(orch.explain())
                if self.stop_requested:  # interrupted while loading
                    group.stop(drain=self.stop_requested < 2)
                if self.opts.dashboard:
                    self.dashboard = Dashboard(self.out, self.opts.logs)
                    self.dashboard.__enter__()
                    self.dashboard.refresh(self.screen("running"))  # from the first moment
                _log.info("cameras running", cameras=[c.name for c in cfg.cameras], duration_s=self.opts.duration_s)
                self.running = True
                try:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._track)
                        tg.start_soon(self._ui)
                        tg.start_soon(self._publish)
                        try:
                            await group.run(self.opts.duration_s)
                        except* OrchestraError as eg:  # sources that raised; the others ran on
                            for exc in eg.exceptions:
                                self.result.problems.append(f"{exc}")
                        finally:
                            tg.cancel_scope.cancel()
                finally:
                    self.running = False
                    self.result.elapsed_s = self.elapsed()
                    self.tracker.poll(orch.explain())
                    self.sample()
                    self.publish()
                    if self.dashboard is not None:
                        self.dashboard.refresh(self.screen("done"))
                        self.dashboard.__exit__(None, None, None)
                self._collect()
                _log.info("cameras done", elapsed_s=round(self.result.elapsed_s, 3))
        finally:
            if self.metrics is not None:
                self.result.metrics_scrapes = self.metrics.scrapes
                self.result.metrics_snapshots = self.collector.published if self.collector is not None else 0
                self.metrics.close()
            for dev in npus:
                dev.close()

    def _collect(self) -> None:
        r = self.result
        r.cameras = self.rows()
        r.executions = self.executions()
        r.instances = [ex.instance.statistics() for ex in self.executors.values()]
        r.decisions = list(self.tracker.decisions)
        r.signals = dict(self.orch.signals)
        r.engine = self.orch.statistics()
        r.batches = [b.statistics() for b in self.batchers]
        r.energy = self.energy()
        r.timeline = self.timeline
        if self.timeline is not None:
            self.timeline.decisions = list(r.decisions)
        r.latency = self.group.statistics().latency
        if r.interrupted_by is not None:
            r.ended_by = "interrupted" if r.interrupted_by == signal.SIGINT else "terminated"
            r.drained = self.stop_requested < 2
        elif self.opts.duration_s is None or r.elapsed_s < self.opts.duration_s - 0.05:
            r.ended_by = "sources ended"
        for cam in self.config.cameras:
            source_stats = getattr(self.group[cam.name].source, "statistics", None)
            if callable(source_stats):
                r.sources[cam.name] = source_stats()
            acc = self.group[cam.name].accounting()
            try:
                acc.check()
                r.accounting[cam.name] = "ok"
            except OrchestraError as exc:
                r.accounting[cam.name] = "LOST"
                r.problems.append(f"{cam.name}: accounting: {exc}")
            if cam.sink is not None:
                r.sink_failures[cam.name] = self.group[cam.name].statistics().sink_failures
            ex = self.executors[cam.name]
            rejected = ex.rejected
            failed = acc.failed - (min(acc.failed, rejected) if ex._dropped is None else 0)
            last = self.group[cam.name].statistics().last_error
            if rejected:
                r.notes.append(f"{cam.name}: {rejected} frame{'s' if rejected != 1 else ''} rejected by the instance, "
                               f"not a failure (last: {ex.last_rejected})")
            if failed:
                r.problems.append(f"{cam.name}: {failed} frame{'s' if failed != 1 else ''} failed (last: {last})")
        for s in r.instances:
            if s.state == "failed":
                r.problems.append(f"instance {s.name} failed permanently: {s.last_error}")


def _has_uvloop() -> bool:
    return importlib.util.find_spec("uvloop") is not None


@contextlib.contextmanager
def deferred_signals() -> Iterator[list[int]]:
    """Until the run's event loop takes SIGINT/SIGTERM over, they are only remembered (in
    the list this yields): :func:`run` acts on them once it can drain. Restores the previous
    handlers on exit. (Outside the main thread: nothing is installed.)"""
    early: list[int] = []
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, lambda signum, frame: early.append(signum))
        except ValueError:  # not the main thread
            pass
    try:
        yield early
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run(config: Config, options: RunOptions, *, out: TextIO | None = None, err: TextIO | None = None,
        early_signals: list[int] | None = None) -> RunResult:
    """Runs ``config``'s cameras (see the module docstring); returns what happened.

    ``early_signals``: the list :func:`deferred_signals` yields, when the caller took the
    signals over before (while it loaded the config); else ``run`` does it.

    Raises:
        OrchestraError: setting up failed (a device, a program, a binding).
    """
    if early_signals is None:
        with deferred_signals() as early:
            return run(config, options, out=out, err=err, early_signals=early)
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    runner = _Runner(config, options, out, err)
    uv = options.use_uvloop and _has_uvloop()
    runner.result.loop = "asyncio+uvloop" if uv else "asyncio"
    early = early_signals

    async def main() -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            # from here the loop receives them; those that came before are acted on now
            for signum in early:
                runner._on_signal(signum)
            early.clear()
            await runner.main(signals)

    anyio.run(main, backend="asyncio", backend_options={"use_uvloop": uv})
    if runner.error is not None:
        # task groups (the orchestrator's among them) wrap what is raised inside them
        user_error = _user_error(runner.error)
        if user_error is not None:
            raise user_error from None
        raise runner.error
    return runner.result


def _user_error(exc: BaseException) -> OrchestraError | None:
    """The OrchestraError in ``exc`` (however deep in exception groups), if that is all."""
    if isinstance(exc, OrchestraError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        leaves = [_user_error(e) for e in exc.exceptions]
        if leaves and all(leaf is not None for leaf in leaves):
            return leaves[0]
    return None


# ---------------------------------------------------------------------------------------
# The summary


def _table(rows: Sequence[Sequence[str]], right: set[int] | frozenset[int] = frozenset(), indent: str = "") -> list[str]:
    if not rows:
        return []
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return [(indent + "  ".join(c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(r))).rstrip()
            for r in rows]


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def render_summary(r: RunResult) -> str:
    """The end-of-run report (plain text)."""
    cfg = r.config
    n = len(cfg.cameras)
    lines = [f"orchestra run {cfg.path.name}: {r.elapsed_s:.1f} s ({r.ended_by}), {n} camera{'s' if n != 1 else ''}, "
             f"{r.loop}", ""]
    rows = [["camera", "drop", "produced", "processed", "dropped", "failed", "p50 ms", "p95 ms", "p99 ms", "unit",
             "accounting"]]
    tot = collections.Counter()
    dropped: collections.Counter[str] = collections.Counter()
    for c in r.cameras:
        rows.append([printable(c.name), c.drop, str(c.produced), str(c.processed), fmt_drops(c.dropped), str(c.failed),
                     fmt_ms(c.p50), fmt_ms(c.p95), fmt_ms(c.p99), c.unit, r.accounting.get(c.name, "?")])
        tot.update(produced=c.produced, processed=c.processed, failed=c.failed)
        dropped.update(c.dropped)
    if len(r.cameras) > 1:
        ok = "ok" if all(v == "ok" for v in r.accounting.values()) else "LOST"
        rows.append(["total", "", str(tot["produced"]), str(tot["processed"]), fmt_drops(dropped), str(tot["failed"]),
                     "", "", "", "", ok])
    lines += _table(rows, right={2, 3, 5, 6, 7, 8})
    lines += ["", "accounting: produced = processed + dropped + failed for every camera" if
              all(v == "ok" for v in r.accounting.values()) else "accounting: FRAMES LOST (see below)"]
    if r.sources:
        lines += ["", "video sources (frames are not produced while disconnected: nothing is dropped for a gap)"]
        srows = [["camera", "uri", "state", "frames", "connects", "reconnects", "disconnects", "gap s", "last error"]]
        for cam, st in r.sources.items():
            srows.append([printable(cam), _short(printable(str(getattr(st, "uri", "?"))), 60), str(getattr(st, "state", "?")),
                          str(getattr(st, "frames", "?")), str(getattr(st, "connects", "?")),
                          str(getattr(st, "reconnects", "?")), str(getattr(st, "disconnects", "?")),
                          f"{getattr(st, 'gap_s', 0.0):.1f}", _short(printable(getattr(st, "last_error", None) or "-"), 80)])
        lines += _table(srows, right={3, 4, 5, 6, 7}, indent="  ")
    if r.batches:
        lines += ["", "batches (frames per execute: size x batches)"]
        brows = [["batch", "cameras", "batches", "frames", "mean size", "mean wait ms", "failed", "sizes"]]
        for b in r.batches:
            brows.append([printable(b.name), str(b.members), str(b.batches), str(b.frames), f"{b.mean_size:.2f}",
                          fmt_ms(b.mean_wait_s), str(b.failed_batches), b.format_sizes()])
        lines += _table(brows, right={1, 2, 3, 4, 5, 6}, indent="  ")
    lines += ["", "executions per option set"]
    lines += _table([[printable(cam), ", ".join(f"{label}: {k}" for label, k in sets) or "none"]
                     for cam, sets in r.executions.items()], indent="  ")
    lines += ["", "instances"]
    irows = [["instance", "pool", "state", "placement", "executes", "failures", "restarts", "replacements",
              "exec p50 ms", "exec p99 ms", "threads", "last error"]]
    auto = {c.name for c in cfg.cameras if c.auto_placement}  # placement chosen by "auto", not written
    for s in r.instances:
        threads = s.threads.format() if s.threads is not None else "-"
        placement = s.threads.placement if s.threads is not None else "-"
        if s.name in auto and s.threads is not None:
            placement += " (auto)"
        irows.append([printable(s.name), s.pool, s.state, placement, str(s.executes), str(s.failures),
                      str(s.restarts), str(s.replacements), fmt_ms(s.latency.p50), fmt_ms(s.latency.p99), threads,
                      _short(s.last_error or "-", 100)])
    lines += _table(irows, right={4, 5, 6, 7, 8, 9}, indent="  ")
    lines += ["", f"policy decisions ({len(r.decisions)})"]
    lines += decision_table(r.decisions) or ["  none"]
    if r.engine is not None:
        e = r.engine
        lines.append(f"  engine: {e.engine_runs} runs, {e.changes_applied} option changes, {e.actions_applied} actions, "
                     f"{e.proposals_rejected} rejected, {e.policy_errors} policy errors")
    if r.signals:
        lines += ["", "signals at the end: " + " ".join(f"{k}={fmt_value(v)}" for k, v in sorted(r.signals.items()))]
    if r.outputs:
        lines += ["", "results"]
        for where, cams in r.outputs.items():
            failed = sum(r.sink_failures.get(c, 0) for c in cams)
            lines.append(f"  {printable(where)}: {', '.join(printable(c) for c in cams)}"
                         + (f" ({failed} frame{'s' if failed != 1 else ''} failed at the sink)" if failed else ""))
    lines += _energy_lines(r.energy)
    if r.metrics_url:
        lines.append(f"metrics: {r.metrics_url} ({r.metrics_scrapes} scrape{'s' if r.metrics_scrapes != 1 else ''}, "
                     f"{r.metrics_snapshots} snapshot{'s' if r.metrics_snapshots != 1 else ''})")
    lines.append("")
    if r.interrupted_by is not None:
        how = "queues drained" if r.drained else "queued frames dropped (shutdown)"
        lines.append(f"result: interrupted ({signal.Signals(r.interrupted_by).name}); {how}"
                     + (f"; {len(r.problems)} problem(s)" if r.problems else ""))
    elif r.problems:
        lines.append("result: FAILED")
    else:
        lines.append("result: ok")
    lines += [f"  {p}" for p in r.problems]
    lines += [f"  note: {n}" for n in r.notes]
    return "\n".join(lines) + "\n"



def _energy_lines(energy: Sequence[EnergyUse]) -> list[str]:
    if not energy:
        return []
    rows = [["camera", "power mode", "jobs", "device ms", "energy", "per job"]]
    for e in energy:
        per = fmt_joules(e.energy_joules / e.jobs) if e.jobs else "-"
        rows.append([printable(e.camera), e.power_mode if e.power_mode != "*" else "(shared core)", str(e.jobs),
                     f"{e.device_seconds * 1000:.2f}", fmt_joules(e.energy_joules), per])
    total = sum(e.energy_joules for e in energy)
    return ["", f"energy per camera and power mode (npu_sim model; total {fmt_joules(total)})"] + \
        _table(rows, right={2, 3, 4, 5}, indent="  ")


# ---------------------------------------------------------------------------------------
# The summary as JSON (--summary-json) and the /status document

SUMMARY_SCHEMA = "orchestra.run.summary/1"


def _iso(wall: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(wall).astimezone().isoformat(timespec="milliseconds")


def _num(v: Any) -> Any:
    """JSON has no NaN/Infinity: those become null."""
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return None
    return v


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return _num(v)
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return str(v)


def _status_doc(config: Config, rows: Sequence[CameraRow], executions: Mapping[str, Sequence[tuple[str, int]]],
                instances: Sequence[Any], decisions: Sequence[Decision], engine: Any, signals: Mapping[str, Any],
                energy: Sequence[EnergyUse], elapsed: float, state: str) -> dict[str, Any]:
    by_cam: dict[str, list[EnergyUse]] = {}
    for e in energy:
        by_cam.setdefault(e.camera, []).append(e)
    cams = []
    for c in rows:
        es = by_cam.get(c.name, [])
        cams.append({
            "name": c.name, "state": c.state, "drop": c.drop, "unit": c.unit, "options": c.options,
            "produced": c.produced, "processed": c.processed, "failed": c.failed, "dropped": dict(c.dropped),
            "queue_depth": c.queue_depth, "queue_capacity": c.queue_capacity,
            "input_fps": _num(c.input_fps), "output_fps": _num(c.output_fps),
            "latency_s": {"p50": _num(c.p50), "p95": _num(c.p95), "p99": _num(c.p99)},
            "energy_joules": sum(e.energy_joules for e in es) if es else None,
            "energy_by_power_mode": {e.power_mode: {"jobs": e.jobs, "device_seconds": e.device_seconds,
                                                    "energy_joules": e.energy_joules} for e in es},
        })
    insts = []
    for s in instances:
        insts.append({"name": s.name, "pool": s.pool, "state": s.state, "executes": s.executes, "failures": s.failures,
                      "rejected": getattr(s, "rejected", 0), "restarts": s.restarts, "replacements": s.replacements,
                      "execute_latency_s": {"p50": _num(s.latency.p50), "p99": _num(s.latency.p99)},
                      "placement": s.threads.placement if s.threads is not None else None,
                      "threads": s.threads.format() if s.threads is not None else None,
                      "options": _jsonable(s.options), "last_error": s.last_error})
    decs = [{"t_s": round(d.t, 4), "time": _iso(d.wall), "instance": d.instance, "what": d.what,
             "value": _jsonable(d.value), "previous": _jsonable(d.previous), "policy": d.policy, "reason": d.reason,
             "source": d.source} for d in decisions]
    eng = None
    if engine is not None:
        eng = {"runs": engine.engine_runs, "option_changes": engine.changes_applied, "actions": engine.actions_applied,
               "rejected": engine.proposals_rejected, "policy_errors": engine.policy_errors}
    return {
        "config": str(config.path), "state": state, "elapsed_s": round(elapsed, 3), "cameras": cams,
        "executions": {cam: dict(sets) for cam, sets in executions.items()}, "instances": insts,
        "decisions": decs, "engine": eng, "signals": _jsonable(dict(signals)),
        "energy_joules": sum(e.energy_joules for e in energy) if energy else None,
    }


def summary_dict(r: RunResult) -> dict[str, Any]:
    """The summary as one JSON-able dict (``orchestra run --summary-json``); its schema is
    :data:`SUMMARY_SCHEMA` and README.md documents it."""
    doc = {"schema": SUMMARY_SCHEMA}
    doc.update(_status_doc(r.config, r.cameras, r.executions, r.instances, r.decisions, r.engine, r.signals, r.energy,
                           r.elapsed_s, "done"))
    for c in doc["cameras"]:
        c["accounting"] = r.accounting.get(c["name"], "?")
    interrupted = None if r.interrupted_by is None else signal.Signals(r.interrupted_by).name
    doc.update({
        "loop": r.loop, "ended_by": r.ended_by, "interrupted_by": interrupted,
        "drained": r.drained if interrupted else None,
        "result": "interrupted" if interrupted else ("failed" if r.problems else "ok"),
        "exit_code": r.exit_code, "problems": list(r.problems),
        "metrics": None if not r.metrics_url else {"url": r.metrics_url, "scrapes": r.metrics_scrapes},
    })
    return doc


# ---------------------------------------------------------------------------------------
# Across a Ray cluster ([cluster]): one camera per actor, on the node wired to it


@dataclass(frozen=True)
class NodeRun:
    """One camera's run on its node: where it ran (Ray node id and address), the resources
    its actor requested, and that node's summary (:func:`summary_dict` of a one-camera run)
    or why there is none (``error``: the run raised, its node or actor died, or no node with
    its resources joined: then ``node_id`` is None).

    A camera whose node died and that was started again (when a live node had its resources
    again, while the run lasted) has its lost tries in ``earlier`` (oldest first, each with the
    counts its node last reported in ``lost``); the fields here are its last try's.
    ``started_s``/``ended_s``: when this try started on its node and ended, in seconds since
    the cluster run began."""

    camera: str
    node_id: str | None
    address: str | None
    resources: Mapping[str, float]
    summary: Mapping[str, Any] | None
    error: str | None = None
    lost: tuple[int, int, int, int, int] | None = None  # node died: produced, processed, failed, dropped, in flight
    earlier: tuple[NodeRun, ...] = ()
    started_s: float | None = None
    ended_s: float | None = None

    @property
    def restarts(self) -> int:
        """How many times the camera was started again after its node (or actor) died."""
        return len(self.earlier)

    @property
    def never_started(self) -> bool:
        """No node with the camera's resources joined while it waited (``[cluster] wait_for_nodes``)."""
        return self.node_id is None and self.summary is None and (self.error or "").startswith("waiting for a node")

    @property
    def counts(self) -> tuple[int, int, int, int] | None:
        """Frames over every try: produced, processed, failed, dropped; a lost try's frames in
        flight count as failed. None when a try's node died before it reported any counts."""
        total = [0, 0, 0, 0]
        for r in (*self.earlier, self):
            if r.summary is not None and r.summary.get("cameras"):
                cam = r.summary["cameras"][0]
                got = (cam["produced"], cam["processed"], cam["failed"], sum(cam["dropped"].values()))
            elif r.lost is not None:
                p, done, failed, dropped, flight = r.lost
                got = (p, done, failed + flight, dropped)
            elif r.never_started:
                got = (0, 0, 0, 0)
            else:
                return None
            total = [x + y for x, y in zip(total, got)]
        return total[0], total[1], total[2], total[3]

    @property
    def _own_accounting(self) -> str:
        if self.summary is not None:
            return str(self.summary["cameras"][0].get("accounting", "?")) if self.summary.get("cameras") else "?"
        if self.never_started:
            return "none (never started)"
        return "closed (node lost)" if self.lost is not None else "unknown (node lost before it reported)"

    @property
    def accounting(self) -> str:
        """"ok" (the node's own check), "closed (node lost)" when the node died after it reported
        counts (its in-flight frames counted as failed), else what is known; a restarted camera
        adds "after N restart(s)" (each lost try closed the same way)."""
        if not self.earlier:
            return self._own_accounting
        n = len(self.earlier)
        if any(r.lost is None for r in self.earlier):
            return f"unknown (a node was lost before it reported) after {n} restart{'s' if n != 1 else ''}"
        return f"{self._own_accounting} after {n} restart{'s' if n != 1 else ''}"


@dataclass(frozen=True)
class ClusterRunResult:
    """Every camera's :class:`NodeRun`; exit status 0 when each ran and its own run was ok
    (a restarted camera: and none of its frames were lost with its node)."""

    config: Config
    address: str
    runs: tuple[NodeRun, ...]
    metrics_url: str | None = None  # where the driver served the cluster's metrics (--metrics-port)
    timeline: Any = None  # orchestra._report.Timeline of the nodes' reports (RunOptions.record_s), else None
    elapsed_s: float = 0.0  # since the cameras started running, at the last status

    @property
    def problems(self) -> list[str]:
        out = []
        for r in self.runs:
            for e in r.earlier:
                where = f"node {(e.node_id or '?')[:8]} was lost at {e.ended_s or 0:.1f} s (restarted)"
                if e.lost is None:
                    out.append(f"{r.camera}: {where} before it reported its frame counts")
                elif e.lost[4]:
                    out.append(f"{r.camera}: {e.lost[4]} frame{'s' if e.lost[4] != 1 else ''} in flight counted as "
                               f"failed when {where}; {e.lost[1]} processed before")
            if r.error is not None:
                lost = "" if r.lost is None else (f" ({r.lost[4]} frame{'s' if r.lost[4] != 1 else ''} in flight "
                                                  f"counted as failed; {r.lost[1]} processed before)")
                out.append(f"{r.camera}: {r.error}{lost}")
            elif r.summary is not None and r.summary.get("result") != "ok":
                out += [f"{r.camera}: {p}" for p in r.summary.get("problems", [])] or [f"{r.camera}: {r.summary.get('result')}"]
        return out

    @property
    def exit_code(self) -> int:
        return EXIT_FAILED if self.problems else EXIT_OK


def _cpu_set(cam: Any) -> tuple[int, ...]:
    """The CPUs a camera's ``bind = { cpu = ... }`` pins it to (none: ())."""
    v = cam.bind.get("cpu")
    if v is None:
        return ()
    return (int(v),) if isinstance(v, int) else tuple(int(c) for c in v)


def _collect_before_frames() -> None:
    """One full pass of Python's cyclic garbage collector, now: when the programs are loaded and
    the instances made, before the first frame.

    The collector's first automatic full pass in a process weighs its whole heap: some 400,000
    objects, 200-450 ms on a 2-core machine, in one that imported torch for its own pre- or
    post-processing. Left to itself, it comes soon after start-up (the objects loading made
    count as new), in the middle of the first seconds of frames: one stall of every camera of
    the process (thread placement), or of the parent that feeds the workers (process placement).
    A pass made here pays that once, before the cameras start, and sets the collector's count of
    long-lived objects to the whole heap, so the next automatic full pass waits until a quarter
    as many again have survived (in a steady pipeline, a long time). Nothing about the
    collector's settings is changed."""
    t = time.perf_counter()
    found = gc.collect()
    _log.debug("collector pass before the cameras start", ms=round((time.perf_counter() - t) * 1e3, 1),
               unreachable=found)


def _start_metrics(opts: RunOptions) -> tuple[MetricsServer, RunCollector]:
    """The run's metrics server on ``opts.metrics_host``:``opts.metrics_port``, listening.

    Raises:
        InvalidArgumentError: it can't listen there (the port taken, say).
    """
    registry, collector = new_registry()
    server = MetricsServer(registry, collector, opts.metrics_host, opts.metrics_port)  # type: ignore[arg-type]
    try:
        server.start()
    except OSError as exc:
        raise InvalidArgumentError(f"metrics server: can't listen on {opts.metrics_host} port "
                                   f"{opts.metrics_port}: {exc.strerror or exc}") from None
    _log.info("metrics server listening", url=server.url)
    return server, collector


def _camera_config(config: Config, cam: Any) -> Config:
    """``config`` cut down to one camera (what its node runs): its program, every device, the
    policies and signals without ``node`` and those with the camera's ``node`` (a node's own
    signals drive its own policies), no [[batch]], no [cluster]."""
    import dataclasses

    def here(x: Any) -> bool:
        return x.node is None or x.node == cam.node

    return dataclasses.replace(config, cameras=(cam,), programs=tuple(p for p in config.programs if p.name == cam.program),
                               policies=tuple(p for p in config.policies if here(p)),
                               signals=tuple(s for s in config.signals if here(s)),
                               batches=(), cluster=None, warnings=())


def _progress_snapshot(s: Any, decisions: int = 0) -> dict[str, Any]:
    """A camera's progress as its node sends it to the driver (small, JSON-able): frame counts
    (``dropped`` per reason), input and output fps, p50/p95 frame latency in seconds, queue
    depth and capacity, its pipeline's state and how many policy decisions its node took.
    ``s``: its pipeline's ``statistics()``."""
    a = s.accounting
    return {"produced": a.produced, "processed": a.processed, "failed": a.failed,
            "dropped": {k: v for k, v in a.dropped.items() if v}, "in_fps": round(s.input_fps, 2),
            "out_fps": round(s.output_fps, 2), "p50_s": s.latency.p50, "p95_s": s.latency.p95,
            "queue": [s.queue_depth, s.queue_capacity], "state": s.state, "decisions": decisions}


def _final_snapshot(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The progress snapshot a finished one-camera run sends last: its summary's counts."""
    out = {}
    for cam in doc.get("cameras", []):
        out[cam["name"]] = {"produced": cam["produced"], "processed": cam["processed"], "failed": cam["failed"],
                            "dropped": {k: v for k, v in cam["dropped"].items() if v}, "in_fps": 0.0,
                            "out_fps": 0.0, "p50_s": None, "p95_s": None, "queue": [0, 0], "state": "done",
                            "decisions": len(doc.get("decisions", []))}
    return out


def _camera_on_node(payload: tuple[Config, RunOptions], report: Any) -> dict[str, Any]:
    """Runs on the camera's node, in its Ray actor: the ordinary one-camera run, its progress
    reported to the driver as it goes (the last report: the summary's counts); returns its
    summary (JSON-able) with the process id it ran in."""
    import dataclasses
    import io

    config, options = payload
    options = dataclasses.replace(options, progress=report)
    result = run(config, options, out=io.StringIO(), err=io.StringIO())
    doc = summary_dict(result)
    doc["pid"] = os.getpid()
    report(_final_snapshot(doc))
    return doc


def _resume_on_node(payload: tuple[Config, RunOptions], seconds_left: float | None) -> tuple[Config, RunOptions]:
    """A restarted camera's payload: the same one-camera run for the time the run has left."""
    import dataclasses

    config, options = payload
    return config, (options if seconds_left is None else dataclasses.replace(options, duration_s=seconds_left))


def _lost_counts(snap: Mapping[str, Any]) -> tuple[int, int, int, int, int]:
    """A lost try's last progress snapshot as (produced, processed, failed, dropped, in flight)."""
    produced, processed, failed = snap["produced"], snap["processed"], snap["failed"]
    dropped = sum(snap["dropped"].values())
    return produced, processed, failed, dropped, produced - processed - failed - dropped


def _node_run(r: Any) -> NodeRun:
    """A :class:`orchestra.cluster.JobResult` (and its earlier tries) as a :class:`NodeRun`."""
    lost = None
    if r.value is None and r.progress is not None:  # the last counts its node sent: in flight = failed
        lost = _lost_counts(r.progress[r.camera])
    return NodeRun(r.camera, r.node_id, r.address, dict(r.resources), r.value, r.error, lost,
                   tuple(_node_run(e) for e in r.earlier), r.started_s, r.ended_s)


@dataclass(frozen=True)
class ClusterRow:
    """One camera of a cluster run, now (a row of the cluster dashboard): its state (see
    :class:`orchestra.cluster.JobStatus`), the node its current or last try runs on, its
    frames over every try (a lost try's frames in flight count as failed), and its current
    try's rates and latency (None when it is not running)."""

    camera: str
    state: str
    node_id: str | None
    address: str | None
    restarts: int
    produced: int
    processed: int
    failed: int
    dropped: Mapping[str, int]
    input_fps: float | None = None
    output_fps: float | None = None
    p50: float | None = None  # seconds
    p95: float | None = None
    decisions: int = 0
    error: str | None = None


def cluster_rows(status: Any) -> list[ClusterRow]:
    """The dashboard's rows from an :class:`orchestra.cluster.ClusterStatus` whose progress
    snapshots are :func:`_progress_snapshot` s (what :func:`run_cluster`'s nodes send)."""
    rows = []
    for j in status.jobs:
        produced = processed = failed = decisions = 0
        dropped: dict[str, int] = {}
        for snap in j.earlier:  # lost tries: in flight counted as failed
            if snap is None or j.camera not in snap:
                continue
            p, done, f, _, flight = _lost_counts(snap[j.camera])
            produced, processed, failed = produced + p, processed + done, failed + f + flight
            for k, v in snap[j.camera]["dropped"].items():
                dropped[k] = dropped.get(k, 0) + v
        now = (j.progress or {}).get(j.camera)
        fps_in = fps_out = p50 = p95 = None
        if now is not None:
            # a try that failed on its node (died, raised): its frames in flight failed with it
            lost = _lost_counts(now)[4] if j.state == "failed" else 0
            produced, processed = produced + now["produced"], processed + now["processed"]
            failed += now["failed"] + lost
            for k, v in now["dropped"].items():
                dropped[k] = dropped.get(k, 0) + v
            decisions = now.get("decisions", 0)
            if j.state == "running":
                fps_in, fps_out, p50, p95 = now["in_fps"], now["out_fps"], now["p50_s"], now["p95_s"]
        rows.append(ClusterRow(j.camera, j.state, j.node_id, j.address, j.restarts, produced, processed, failed,
                               dropped, fps_in, fps_out, p50, p95, decisions, j.error))
    return rows


@dataclass(slots=True)
class ClusterScreen(Screen):
    """One frame of the cluster dashboard: the header of :class:`Screen` and every camera's
    :class:`ClusterRow` (``cameras`` and ``decisions`` stay empty)."""

    rows: Sequence[ClusterRow] = ()


def _cluster_columns(rows: Sequence[ClusterRow]) -> list[_Column]:
    total = len(rows) > 1

    def col(header: str, cells: list[str], keep: int, tot: str = "", **kw: Any) -> _Column:
        return _Column(header, cells + ([tot] if total else []), keep, **kw)

    def opt(v: float | None, fmt: str) -> str:
        return "-" if v is None or v != v else format(v, fmt)

    def ms(v: float | None) -> str:
        return "-" if v is None or v != v else fmt_ms(v)

    dropped: dict[str, int] = collections.Counter()
    for r in rows:
        dropped.update(r.dropped)
    nodes = len({r.node_id for r in rows if r.node_id})
    states = [r.state + (f" ({r.restarts} restart{'s' if r.restarts != 1 else ''})" if r.restarts else "") for r in rows]
    return [
        col("camera", [printable(r.camera) for r in rows], 100, "total"),
        col("node", [(r.node_id or "-")[:8] for r in rows], 95, f"{nodes} node{'s' if nodes != 1 else ''}"),
        col("address", [r.address or "-" for r in rows], 60),
        col("state", states, 90),
        col("in fps", [opt(r.input_fps, ".1f") for r in rows], 30, f"{sum(r.input_fps or 0.0 for r in rows):.1f}",
            right=True),
        col("out fps", [opt(r.output_fps, ".1f") for r in rows], 80, f"{sum(r.output_fps or 0.0 for r in rows):.1f}",
            right=True),
        col("p50 ms", [ms(r.p50) for r in rows], 25, right=True),
        col("p95 ms", [ms(r.p95) for r in rows], 45, right=True),
        col("produced", [str(r.produced) for r in rows], 55, str(sum(r.produced for r in rows)), right=True),
        col("processed", [str(r.processed) for r in rows], 85, str(sum(r.processed for r in rows)), right=True),
        col("failed", [str(r.failed) for r in rows], 75, str(sum(r.failed for r in rows)), right=True),
        col("drops", [fmt_drops(r.dropped) for r in rows], 65, fmt_drops(dropped)),
        col("decisions", [str(r.decisions) for r in rows], 20, str(sum(r.decisions for r in rows)), right=True),
    ]


class _ClusterDashboard(Dashboard):
    """The local run's dashboard (live area, log lines above it) drawing a cluster's cameras."""

    def renderable(self, screen: Screen, width: int, height: int) -> Any:
        if not isinstance(screen, ClusterScreen):
            return super().renderable(screen, width, height)
        from rich.console import Group
        from rich.text import Text

        parts: list[Any] = [rich_header(screen), _rich_table(_cluster_columns(screen.rows), width, bold_last=True)]
        errors = [f"{printable(r.camera)}: {printable(r.error)}" for r in screen.rows if r.error]
        parts += [Text(e, style="red", no_wrap=True, overflow="ellipsis") for e in errors[:max(height - 6, 0)]]
        return Group(*parts)


def _cluster_status_line(screen: ClusterScreen) -> str:
    """When stdout is not a terminal: one compact line for the whole cluster."""
    cams = " | ".join(
        f"{printable(r.camera)}@{(r.node_id or '-')[:8]} {r.state}"
        + (f" {r.input_fps:.0f}->{r.output_fps:.0f}fps" if r.input_fps is not None and r.output_fps is not None else "")
        + f" {r.processed}/{r.produced} drop {sum(r.dropped.values())}" + (f" fail {r.failed}" if r.failed else "")
        + (f" restarts {r.restarts}" if r.restarts else "")
        for r in screen.rows)
    return f"[{screen.elapsed:6.1f}s] {cams}"


class _ClusterView:
    """What a cluster run shows as it goes, fed by :func:`orchestra.cluster.run_jobs`'s
    ``on_status``: the dashboard (``RunOptions.dashboard``) or a status line every
    ``status_interval_s`` on ``out``; ``also`` gets every status too."""

    def __init__(self, config: Config, address: str, options: RunOptions, out: TextIO, also: Any = None) -> None:
        self.title = f"orchestra run {os.path.basename(config.path)} on {address}"
        self.address = address
        self.opts = options
        self.out = out
        self.also = also
        self.dashboard: _ClusterDashboard | None = None
        self.next_line = time.monotonic() + options.status_interval_s
        self.metrics: MetricsServer | None = None
        self.collector: RunCollector | None = None
        self.metrics_url: str | None = None
        self.timeline: Any = None
        self.elapsed_s = 0.0
        if options.record_s is not None:  # --report: every status the driver gets is a sample
            from ._report import Timeline

            self.timeline = Timeline([c.name for c in config.cameras])

    def __enter__(self) -> _ClusterView:
        if self.opts.metrics_port is not None:  # the driver serves every node's cameras
            self.metrics, self.collector = _start_metrics(self.opts)
            self.metrics_url = self.metrics.url
        if self.opts.dashboard:
            self.dashboard = _ClusterDashboard(self.out, self.opts.logs)
            self.dashboard.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.dashboard is not None:
            self.dashboard.__exit__(*exc)
            self.dashboard = None
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None

    def publish(self, status: Any, rows: Sequence[ClusterRow]) -> None:
        """The metrics server's snapshot from one status: every node's cameras."""
        if self.collector is None:
            return
        cams = [SimpleNamespace(name=r.camera, produced=r.produced, processed=r.processed, failed=r.failed,
                                dropped=dict(r.dropped), queue_depth=0, queue_capacity=0,
                                input_fps=r.input_fps or 0.0, output_fps=r.output_fps or 0.0) for r in rows]
        waiting = [r.camera for r in rows if r.state != "running"]
        ready = not waiting and not status.done
        why = "the run ended" if status.done else f"not running: {', '.join(waiting)}"
        doc = {"ready": ready, "state": "done" if status.done else "running", "address": self.address,
               "elapsed_s": status.elapsed_s, "duration_s": status.duration_s,
               "cameras": [{"name": r.camera, "state": r.state, "node": r.node_id, "address": r.address,
                            "restarts": r.restarts, "produced": r.produced, "processed": r.processed,
                            "failed": r.failed, "dropped": dict(r.dropped), "input_fps": r.input_fps,
                            "output_fps": r.output_fps, "p50_s": r.p50, "p95_s": r.p95, "error": r.error}
                           for r in rows]}
        self.collector.publish(MetricsSnapshot(
            uptime_s=status.elapsed_s, ready=ready, not_ready_reason=why, cameras=cams,
            decisions=sum(r.decisions for r in rows), status=doc,
            nodes=[(r.camera, r.node_id or "", r.address or "", r.state, r.restarts) for r in rows]))

    def screen(self, status: Any) -> ClusterScreen:
        rows = cluster_rows(status)
        running = sum(r.state == "running" for r in rows)
        state = "done" if status.done else "running" if running else "starting"
        return ClusterScreen(title=self.title, elapsed=status.elapsed_s, duration=status.duration_s, state=state,
                             cameras=(), decisions=(), info=f"{running}/{len(rows)} cameras running", rows=rows)

    def __call__(self, status: Any) -> None:
        if self.also is not None:
            self.also(status)
        self.elapsed_s = status.elapsed_s
        if self.collector is not None or self.timeline is not None:
            rows = cluster_rows(status)
            if self.collector is not None:
                self.publish(status, rows)
            if self.timeline is not None and status.elapsed_s > 0:
                self.timeline.add(status.elapsed_s, [SimpleNamespace(
                    name=r.camera, input_fps=r.input_fps or 0.0, output_fps=r.output_fps or 0.0, p50=r.p50, p95=r.p95,
                    p99=None, queue_depth=0, energy_joules=None, processed=r.processed if r.p50 is not None else 0)
                    for r in rows], (), {})
        if self.dashboard is not None:
            self.dashboard.refresh(self.screen(status))
        elif not self.opts.dashboard and time.monotonic() >= self.next_line and not status.done:
            self.next_line = time.monotonic() + self.opts.status_interval_s
            try:
                self.out.write(_cluster_status_line(self.screen(status)) + "\n")
                self.out.flush()
            except (OSError, ValueError):
                pass


def run_cluster(config: Config, options: RunOptions | None = None, *, address: str | None = None,
                out: TextIO | None = None, on_status: Any = None) -> ClusterRunResult:
    """Runs ``config``'s cameras across the Ray cluster at ``address`` (default: the config's
    ``[cluster] address``, else ``"auto"``): each camera in its own actor requesting the Ray
    resources of its binding (:func:`orchestra.cluster.camera_resources`), so it runs on the
    node that advertises its camera and core; each node runs the usual one-camera run and
    returns its summary. Needs the ``ray`` extra. With ``options.metrics_port`` this process
    serves every node's cameras (``/metrics``: the local run's frame counters and rates per
    camera, plus ``orchestra_camera_node_info`` and ``orchestra_camera_restarts``; ``/status``,
    ``/readyz``: ready while every camera runs). With ``options.record_s`` the nodes' reports
    are kept as a timeline (``ClusterRunResult.timeline``) for
    :func:`orchestra._report.render_cluster_report` (``--report``).

    While it runs, ``out`` (default stdout) shows every camera across the nodes as the local
    run does: the live dashboard with ``options.dashboard`` (its log lines from
    ``options.logs`` printed above it), else a status line every ``options.status_interval_s``.
    ``on_status`` (optional) gets each :class:`orchestra.cluster.ClusterStatus` too (about once
    a second, the last with ``done``; :func:`cluster_rows` turns one into rows).

    A camera whose node dies is restarted, while the run lasts, on a live node that advertises
    its resources again (the node back, or another), as a one-camera run for the time left;
    its :class:`NodeRun` keeps the lost tries in ``earlier`` and :attr:`NodeRun.counts` adds
    every try up. With ``[cluster] wait_for_nodes = true`` a camera whose resources no live
    node has at the start waits for one to join instead of failing the run.

    Raises:
        orchestra.cluster.PlacementError: a camera's resources are on no live node (unless
            ``wait_for_nodes``).
        orchestra.cluster.ClusterError: the cluster can't be reached, an actor did not start.
    """
    from .cluster import CameraJob, camera_resources, run_jobs

    options = options or RunOptions(duration_s=config.run.duration_s)
    cl = config.cluster
    address = address or (cl.address if cl is not None else "auto")
    node_opts = RunOptions(duration_s=options.duration_s, use_uvloop=options.use_uvloop,
                           latency_window=options.latency_window)
    jobs = [CameraJob(cam.name, camera_resources(cam.name, cam.core, cam.node, cpu_set=_cpu_set(cam)), _camera_on_node,
                      (_camera_config(config, cam), node_opts), resume=_resume_on_node) for cam in config.cameras]
    _log.info("running on a cluster", address=address, cameras=[c.name for c in config.cameras])
    with _ClusterView(config, address, options, sys.stdout if out is None else out, on_status) as view:
        results = run_jobs(jobs, address, start_timeout_s=cl.timeout_s if cl is not None else 60.0,
                           duration_s=options.duration_s, wait_for_nodes=cl is not None and cl.wait_for_nodes,
                           on_status=view)
    return ClusterRunResult(config, address, tuple(_node_run(r) for r in results), metrics_url=view.metrics_url,
                            timeline=view.timeline, elapsed_s=view.elapsed_s)


def render_cluster_summary(r: ClusterRunResult) -> str:
    """The cluster run's summary: one line per camera (its node, frames and accounting), then
    the problems."""
    rows = [["camera", "node", "address", "produced", "processed", "failed", "dropped", "accounting", "ended by"]]
    for run_ in r.runs:
        s = run_.summary
        counts = run_.counts
        shown = [str(x) for x in counts] if counts is not None else ["-"] * 4
        if s is not None and s.get("cameras"):
            ended = str(s.get("ended_by", "?"))
        elif run_.never_started:
            ended = "never started"
        else:
            ended = "node lost" if run_.error else "failed"
        rows.append([run_.camera, (run_.node_id or "-")[:12], run_.address or "-", *shown, run_.accounting, ended])
    nodes = len({x.node_id for x in r.runs if x.node_id})
    lines = [f"orchestra run {os.path.basename(r.config.path)} on the Ray cluster at {r.address}: "
             f"{len(r.runs)} camera{'s' if len(r.runs) != 1 else ''} on {nodes} node{'s' if nodes != 1 else ''}", ""]
    lines += _table(rows, right={3, 4, 5, 6}, indent="  ")
    moves = [run_ for run_ in r.runs if run_.earlier or (run_.started_s or 0) >= 1.0 or run_.never_started]
    if moves:
        lines += ["", "restarts and late starts"]
        for run_ in moves:
            for k, e in enumerate(run_.earlier):
                nxt = run_.earlier[k + 1] if k + 1 < len(run_.earlier) else run_
                lost = ("its counts unknown" if e.lost is None else
                        f"{e.lost[1]} processed, {e.lost[4]} in flight counted as failed")
                then = f"restarted on node {(nxt.node_id or '?')[:12]} at {nxt.started_s or 0:.1f} s"
                lines.append(f"  {run_.camera}: node {(e.node_id or '?')[:12]} lost at {e.ended_s or 0:.1f} s "
                             f"({lost}); {then}")
            if not run_.earlier and run_.never_started:
                lines.append(f"  {run_.camera}: {run_.error}")
            elif not run_.earlier:
                lines.append(f"  {run_.camera}: waited {run_.started_s:.1f} s for a node; started on node "
                             f"{(run_.node_id or '?')[:12]}")
    decs = cluster_decisions(r)
    lines += ["", f"policy decisions ({len(decs)})"]
    if decs:
        drows = [["camera", "node", "at", "instance", "option", "change", "by", "reason"]]
        drows += [[d["camera"], (d["node_id"] or "?")[:12], f"{d['t_s']:.2f}s", d["instance"], d["what"],
                   f"{fmt_value(d['previous']) if d['previous'] is not None else '-'} -> {fmt_value(d['value'])}",
                   d["policy"] or d["source"], d["reason"]] for d in decs]
        lines += _table(drows, right={2}, indent="  ")
    else:
        lines += ["  none"]
    if r.metrics_url:
        lines += ["", f"metrics: {r.metrics_url} (every node's cameras, served by this process)"]
    probs = r.problems
    if probs:
        lines += ["", "problems:"] + [f"  {p}" for p in probs]
    return "\n".join(lines) + "\n"


def _segment(n: NodeRun) -> dict[str, Any]:
    """One try of a camera: where and when it ran, its frames, why it ended early."""
    if n.summary is not None and n.summary.get("cameras"):
        cam = n.summary["cameras"][0]
        counts: dict[str, Any] | None = {"produced": cam["produced"], "processed": cam["processed"],
                                         "failed": cam["failed"], "dropped": sum(cam["dropped"].values()),
                                         "in_flight_failed": 0}
    elif n.lost is not None:
        p, done, failed, dropped, flight = n.lost
        counts = {"produced": p, "processed": done, "failed": failed + flight, "dropped": dropped,
                  "in_flight_failed": flight}
    elif n.never_started:
        counts = {"produced": 0, "processed": 0, "failed": 0, "dropped": 0, "in_flight_failed": 0}
    else:
        counts = None
    return {"node_id": n.node_id, "address": n.address, "started_s": n.started_s, "ended_s": n.ended_s,
            "counts": counts, "error": n.error}


def cluster_summary_dict(r: ClusterRunResult) -> dict[str, Any]:
    """The cluster run's summary as JSON (``--summary-json``): the cluster, exit code,
    problems, every node's decisions, ``metrics_url`` (where ``--metrics-port`` served, else
    None), and per camera its last try (node, resources, error,
    that node's own summary) with ``restarts``, ``waited_s`` (how long it waited for a node
    before its first try started: 0 when it started with the run), ``counts`` over every try
    (None when a node was lost before it reported) and ``segments``: each try, oldest first
    (node, address, ``started_s``/``ended_s`` since the run began, its ``counts``, with the
    frames in flight when its node was lost counted as failed, and its ``error``)."""
    cams = []
    for n in r.runs:
        first = n.earlier[0] if n.earlier else n
        counts = n.counts
        cams.append({"camera": n.camera, "node_id": n.node_id, "address": n.address, "resources": dict(n.resources),
                     "error": n.error, "restarts": n.restarts,
                     "waited_s": None if first.started_s is None else round(first.started_s, 3),
                     "counts": None if counts is None else dict(zip(("produced", "processed", "failed", "dropped"),
                                                                    counts)),
                     "accounting": n.accounting,
                     "segments": [_segment(x) for x in (*n.earlier, n)], "summary": n.summary})
    return {"cluster": r.address, "exit_code": r.exit_code, "problems": r.problems, "decisions": cluster_decisions(r),
            "metrics_url": r.metrics_url, "cameras": cams}


def cluster_decisions(r: ClusterRunResult) -> list[dict[str, Any]]:
    """Every node's policy decisions (its summary's ``decisions``), each with the camera and
    the node (Ray node id, address) it was taken on, in camera order then time."""
    out = []
    for run_ in r.runs:
        for d in (run_.summary or {}).get("decisions", []):
            out.append({"camera": run_.camera, "node_id": run_.node_id, "address": run_.address, **d})
    return out
