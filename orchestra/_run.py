"""``orchestra run FILE``: a config's cameras as parallel pipelines, one orchestrator
instance per camera, the policy engine retuning them, a live view, a summary at the end.

:func:`run` takes a loaded :class:`~orchestra.config.Config`; the CLI validates the file,
calls :func:`configure_logging` and maps the result to an exit status:

- 0: every frame was processed or dropped by policy, and the accounting identity held;
- 1: a frame failed, an instance failed permanently, a source raised, or frames were lost;
- 130: interrupted (SIGINT; 143 for SIGTERM) — sources stopped, queues drained, summary
  printed. A second Ctrl-C drops what is still queued; a third abandons the drain.

Executions are counted per set of options in force: each camera's executor wraps its
instance and, after every execute, files it under the options the instance's Method had in
force then (``Instance.options_in_force()``), so a policy's change mid-run shows up as two
counts. Policy decisions come from diffing ``orch.explain()`` a few times a second (the
time of each is the engine's own timestamp, not the poll's).
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
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
    fmt_ms,
    fmt_options,
    fmt_unit,
    fmt_value,
    printable,
)
from ._metrics_http import MetricsServer
from ._metrics_http import render as render_metrics
from .config import Config
from .errors import InvalidArgumentError, OrchestraError
from .telemetry import get_logger

__all__ = ["RunOptions", "RunResult", "configure_logging", "deferred_signals", "render_summary", "run"]

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
    (human-readable key=value) or ``json`` (one JSON object per line, ISO timestamps).
    ``timefmt``: the console timestamp (``"iso"`` or a strftime format)."""
    import json

    stream = sys.stderr if stream is None else stream
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso" if fmt == "json" else timefmt, utc=False),
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


# ---------------------------------------------------------------------------------------
# Options and result


@dataclass(frozen=True)
class RunOptions:
    """How to run: ``duration_s`` None runs until interrupted; ``dashboard`` draws the live
    view on ``out`` (only sensible on a terminal), else a status line every
    ``status_interval_s``; ``logs`` is the buffer log lines go to while the dashboard is
    up (the dashboard shows the latest; the CLI writes them all to stderr after it).
    ``latency_window``: how many of the latest frames (all cameras) ``RunResult.latency``
    is computed over."""

    duration_s: float | None = None
    dashboard: bool = False
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    use_uvloop: bool = True
    refresh_s: float = 0.25
    status_interval_s: float = 2.0
    logs: LogBuffer | None = None
    latency_window: int = 8192


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
    accounting: dict[str, str] = field(default_factory=dict)  # camera -> "ok" or the error
    interrupted_by: int | None = None  # the signal number
    drained: bool = True  # False: a second signal dropped the queued frames
    metrics_url: str | None = None
    metrics_scrapes: int = 0
    metrics_renders: int = 0  # scrapes share a rendering made at most once per MetricsServer interval
    latency: Any = None  # LatencySummary of every camera's frames together (capture to sink), None before the run

    @property
    def exit_code(self) -> int:
        if self.interrupted_by is not None:
            return 128 + self.interrupted_by
        return EXIT_FAILED if self.problems else EXIT_OK


# ---------------------------------------------------------------------------------------
# Per camera: the executor that counts executes per option set


class _Counted:
    """An instance as a pipeline executor that counts its executes per option snapshot."""

    __slots__ = ("counts", "instance")

    def __init__(self, instance: Any) -> None:
        self.instance = instance
        self.counts: dict[_Snapshot, int] = {}

    async def execute(self, inputs: list[Any]) -> list[Any]:
        out = await self.instance.execute(inputs)
        # the options this execute ran with: the worker swaps snapshots only at execute
        # boundaries, and the camera's next frame is not submitted yet (inflight 1)
        snap = tuple((b, k, v) for b, vals in self.instance.options_in_force().items() for k, v in vals.items())
        counts = self.counts
        counts[snap] = counts.get(snap, 0) + 1
        return out

    def describe(self) -> Mapping[str, Any]:
        return self.instance.describe()


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
        self.qualify: dict[str, bool] = {}
        self.orch: Any = None
        self.group: Any = None
        self.metrics: MetricsServer | None = None
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
    def rows(self) -> list[CameraRow]:
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
                instance_state=inst.state))
        return rows

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
        return Screen(title=f"orchestra run {os.path.basename(self.config.path)}", elapsed=self.elapsed(),
                      duration=self.opts.duration_s, state=state, cameras=self.rows(),
                      decisions=list(self.tracker.decisions),
                      signals=dict(orch.signals) if orch is not None else {}, info="  ".join(info))

    def metrics_text(self) -> str:
        orch = self.orch
        instances = [ex.instance.statistics() for ex in self.executors.values()]
        options = {}
        for s in instances:
            options[s.name] = [(b, k, v) for b, vals in s.options.items() for k, v in vals.items()]
        by_options = {self.executors[c].instance.name: dict(v) for c, v in self.executions(stable=True).items()}
        return render_metrics(cameras=self.rows(), instances=instances, executions_by_options=by_options,
                              options=options, decisions=len(self.tracker.decisions),
                              engine=orch.statistics() if orch is not None else None,
                              signals=dict(orch.signals) if orch is not None else {}, uptime_s=self.elapsed())

    # -- tasks ----------------------------------------------------------------------------
    async def _track(self) -> None:
        while True:
            await anyio.sleep(0.1)
            self.tracker.poll(self.orch.explain())

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
        npus = []
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
                for cam in cfg.cameras:
                    pool = pools[cam.program]
                    ex = self.executors[cam.name] = _Counted(pool[cam.name])
                    self.qualify[cam.name] = len(pool.backends) > 1
                    group.add(Pipeline(cam.name, cam.build_source(), ex, queue=cam.queue, drop=cam.drop,
                                       deadline_s=cam.deadline_s, inflight=cam.inflight))
                self.group = group
                self.tracker.poll(orch.explain(), record=False)
                for s in sources:  # scripted signals: time 0 is when the cameras start
                    start = getattr(s, "start", None)
                    if callable(start):
                        start()
                self.t0 = self.tracker.t0 = time.monotonic()
                await orch.refresh()  # the policies see the first signals before the first frame
                self.tracker.poll(orch.explain())
                if self.opts.metrics_port is not None:
                    self.metrics = MetricsServer(self.metrics_text, self.opts.metrics_host, self.opts.metrics_port)
                    try:
                        await self.metrics.start()
                    except OSError as exc:
                        self.metrics = None
                        raise InvalidArgumentError(f"metrics server: can't listen on {self.opts.metrics_host} port "
                                                   f"{self.opts.metrics_port}: {exc.strerror or exc}") from None
                    self.result.metrics_url = self.metrics.url
                    _log.info("metrics server listening", url=self.metrics.url)
                if self.stop_requested:  # interrupted while loading
                    group.stop(drain=self.stop_requested < 2)
                if self.opts.dashboard:
                    self.dashboard = Dashboard(self.out, self.opts.logs)
                    self.dashboard.__enter__()
                _log.info("cameras running", cameras=[c.name for c in cfg.cameras], duration_s=self.opts.duration_s)
                try:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._track)
                        tg.start_soon(self._ui)
                        try:
                            await group.run(self.opts.duration_s)
                        except* OrchestraError as eg:  # sources that raised; the others ran on
                            for exc in eg.exceptions:
                                self.result.problems.append(f"{exc}")
                        finally:
                            tg.cancel_scope.cancel()
                finally:
                    self.result.elapsed_s = self.elapsed()
                    self.tracker.poll(orch.explain())
                    if self.dashboard is not None:
                        self.dashboard.refresh(self.screen("done"))
                        self.dashboard.__exit__(None, None, None)
                    if self.metrics is not None:
                        self.result.metrics_scrapes = self.metrics.scrapes
                        self.result.metrics_renders = self.metrics.renders
                        await self.metrics.aclose()
                self._collect()
                _log.info("cameras done", elapsed_s=round(self.result.elapsed_s, 3))
        finally:
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
        r.latency = self.group.statistics().latency
        if r.interrupted_by is not None:
            r.ended_by = "interrupted" if r.interrupted_by == signal.SIGINT else "terminated"
            r.drained = self.stop_requested < 2
        elif self.opts.duration_s is None or r.elapsed_s < self.opts.duration_s - 0.05:
            r.ended_by = "sources ended"
        for cam in self.config.cameras:
            acc = self.group[cam.name].accounting()
            try:
                acc.check()
                r.accounting[cam.name] = "ok"
            except OrchestraError as exc:
                r.accounting[cam.name] = "LOST"
                r.problems.append(f"{cam.name}: accounting: {exc}")
            if acc.failed:
                r.problems.append(f"{cam.name}: {acc.failed} frame{'s' if acc.failed != 1 else ''} failed"
                                  + (f" (last: {self.group[cam.name].statistics().last_error})"))
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
    lines += ["", "executions per option set"]
    lines += _table([[printable(cam), ", ".join(f"{label}: {k}" for label, k in sets) or "none"]
                     for cam, sets in r.executions.items()], indent="  ")
    lines += ["", "instances"]
    irows = [["instance", "pool", "state", "executes", "failures", "restarts", "replacements", "exec p50 ms",
              "exec p99 ms", "threads", "last error"]]
    for s in r.instances:
        threads = s.threads.format() if s.threads is not None else "-"
        irows.append([printable(s.name), s.pool, s.state, str(s.executes), str(s.failures), str(s.restarts),
                      str(s.replacements), fmt_ms(s.latency.p50), fmt_ms(s.latency.p99), threads,
                      _short(s.last_error or "-", 100)])
    lines += _table(irows, right={3, 4, 5, 6, 7, 8}, indent="  ")
    lines += ["", f"policy decisions ({len(r.decisions)})"]
    lines += decision_table(r.decisions) or ["  none"]
    if r.engine is not None:
        e = r.engine
        lines.append(f"  engine: {e.engine_runs} runs, {e.changes_applied} option changes, {e.actions_applied} actions, "
                     f"{e.proposals_rejected} rejected, {e.policy_errors} policy errors")
    if r.signals:
        lines += ["", "signals at the end: " + " ".join(f"{k}={fmt_value(v)}" for k, v in sorted(r.signals.items()))]
    if r.metrics_url:
        lines.append(f"metrics: {r.metrics_url} ({r.metrics_scrapes} scrape{'s' if r.metrics_scrapes != 1 else ''}, "
                     f"{r.metrics_renders} render{'s' if r.metrics_renders != 1 else ''})")
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
    return "\n".join(lines) + "\n"

