"""``orchestra bench CONFIG``: how many copies of one camera this machine sustains.

The question camera deployments ask first: *how many streams at 30 fps does this box hold,
within what p99?* :func:`bench` answers it for a config's camera (its first, or the one
named): it runs N copies of that camera — distinct names, the same program, backend
options, queue, drop policy and placement, each source paced at the target fps — through
:func:`orchestra._run.run` (the same run loop as ``orchestra run``, policies and signals
included) for a fixed time, and judges the step:

- held: no frame failed, the sources produced their frames on schedule (>= ``min_rate`` of
  N x fps x the time they ran, less two frames per camera), at least ``min_rate`` of the frames
  produced were processed (not dropped), the accounting identity held, and the p99 latency
  (capture to result, every camera's frames together) is within ``p99_ms``;
- else not held, with the first reason found.

N doubles from 1 until a step is not held (or ``max_streams``), then bisects between the
largest N held and the smallest not held. Each step is printed as it ends; the result is the
largest N held. The criterion (:func:`judge`) and the search (:func:`search`) take plain
numbers and a ``trial(n)`` function, so a benchmark can hold a baseline of its own to the
very same rules (``benchmarks/bench_capacity.py`` does).

Bindings: a copy binds what its camera binds, spread over the device's units when a unit
can't take them all: an NPU core (``"npu0.core"``, ``"npu0.camera"``, ``camera_link``) goes
round-robin over the device's cores, a CPU binding (``cpu = 1``, ``cpu = [0, 1]``) over
groups of as many of the CPU device's CPUs; an exclusive unit takes one copy, a shared one
``capacity`` copies (any number when unset). Where that caps N below ``max_streams``, the
search stops there and says why (:attr:`BenchResult.limit`).

Sources: ``synthetic`` (the seed differs per copy; ``count`` is dropped) and ``file``
(looped) sources are paced at the target fps; any other kind needs an ``fps`` parameter.

Batching: when the benched camera is in a ``[[batch]]``, ``BenchOptions.batch`` puts all N
copies in one batch group with that table's settings (``max_size``, ``max_wait_ms``,
``static_batch``); without it each copy runs its own executes (alone in a group of its own,
padded, where the program has a fixed batch). ``orchestra bench --batch`` runs both searches
and prints both largest N and their ratio. Sinks are left out of the copies: the bench does not
write into the config's result files.

SIGINT/SIGTERM: the step running drains (as ``orchestra run`` does) and the search ends with
what was found so far (:attr:`BenchResult.interrupted_by`).
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from ._run import RunOptions, deferred_signals, run
from .config import BatchConfig, CameraConfig, Config, SourceConfig
from .errors import InvalidArgumentError, OrchestraError

__all__ = [
    "BenchOptions",
    "BenchResult",
    "Step",
    "Trial",
    "bench",
    "binding_plan",
    "camera_of",
    "copies_config",
    "judge",
    "render_result",
    "render_step",
    "search",
]

_MAX_WINDOW = 1 << 22


@dataclass(frozen=True)
class BenchOptions:
    """What to hold and how to search.

    ``camera``: the config camera copied (None: the first). ``placement``: ``"thread"`` or
    ``"process"`` for every copy (None: the camera's own). ``min_rate``: the share of frames
    that must be produced on schedule and processed. ``batch``: the copies share one
    ``[[batch]]`` with the settings of the camera's own (it must be in one; see the module
    docstring)
    """

    fps: float = 30.0
    p99_ms: float = 100.0
    duration_s: float = 10.0
    max_streams: int = 64
    min_rate: float = 0.99
    camera: str | None = None
    placement: str | None = None
    batch: bool = False

    def __post_init__(self) -> None:
        def bad(what: str, v: Any) -> InvalidArgumentError:
            return InvalidArgumentError(f"bench: {what}, got {v!r}")

        for name in ("fps", "p99_ms", "duration_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
                raise bad(f"{name} must be a number > 0", v)
        if isinstance(self.max_streams, bool) or not isinstance(self.max_streams, int) or self.max_streams < 1:
            raise bad("max_streams must be an integer >= 1", self.max_streams)
        if isinstance(self.min_rate, bool) or not isinstance(self.min_rate, (int, float)) or not 0 < self.min_rate <= 1:
            raise bad("min_rate must be a fraction in (0, 1]", self.min_rate)
        if self.placement not in (None, "thread", "process"):
            raise bad('placement must be "thread" or "process"', self.placement)


@dataclass(frozen=True)
class Trial:
    """What one step measured: N streams for ``elapsed_s`` at ``fps`` each. ``p50_s`` /
    ``p99_s``: latency over every stream's processed frames (None: none processed).
    ``problem``: something that fails the step whatever the numbers (lost frames, a failed
    instance, a setup error), or None. ``interrupted``: the step was cut short by a signal
    (it is then neither held nor failed)."""

    streams: int
    fps: float
    elapsed_s: float
    produced: int
    processed: int
    dropped: int
    failed: int
    p50_s: float | None
    p99_s: float | None
    problem: str | None = None
    interrupted: bool = False


@dataclass(frozen=True)
class Step:
    """A judged :class:`Trial`: ``held`` and, when not, ``reason``."""

    trial: Trial
    held: bool
    reason: str = ""

    @property
    def streams(self) -> int:
        return self.trial.streams


@dataclass(frozen=True)
class BenchResult:
    """The search: every step in the order run, the largest N held (0: not even one), why the
    search could not go past its last N (``limit``: ``max_streams`` or the binding's cap), and
    the signal that ended it early, if one did."""

    steps: tuple[Step, ...]
    largest: int
    limit: str | None = None
    interrupted_by: int | None = None

    @property
    def exit_code(self) -> int:
        return 0 if self.interrupted_by is None else 128 + self.interrupted_by


# ---------------------------------------------------------------------------------------
# The criterion and the search (plain numbers: usable for any runner)


def judge(trial: Trial, *, p99_ms: float, min_rate: float) -> Step:
    """Whether ``trial`` held the target (see the module docstring for the rules)."""
    t = trial
    if t.interrupted:
        return Step(t, False, "interrupted")
    if t.problem:
        return Step(t, False, t.problem)
    if t.failed:
        return Step(t, False, f"{t.failed} frame{'s' if t.failed != 1 else ''} failed")
    expected = t.streams * t.fps * t.elapsed_s
    if t.produced < min_rate * expected - 2 * t.streams:  # slack: each source starts a little late
        return Step(t, False, f"sources produced {t.produced} of the {expected:.0f} frames due "
                              f"(the host fell behind the {t.fps:g} fps schedule)")
    if t.produced == 0 or t.processed < min_rate * t.produced:
        share = 100.0 * t.processed / t.produced if t.produced else 0.0
        return Step(t, False, f"processed {share:.1f} % of the frames (< {100 * min_rate:g} %)")
    if t.p99_s is None or t.p99_s * 1e3 > p99_ms:
        return Step(t, False, f"p99 {t.p99_s * 1e3 if t.p99_s is not None else math.nan:.1f} ms > {p99_ms:g} ms")
    return Step(t, True)


def search(trial: Callable[[int], Trial], *, max_streams: int, p99_ms: float, min_rate: float,
           on_step: Callable[[Step], None] | None = None, cap: int | None = None,
           cap_reason: str | None = None) -> BenchResult:
    """The largest N for which ``trial(n)`` holds: doubling from 1, then bisecting.

    ``cap``: a hard limit below ``max_streams`` (the binding's), explained by ``cap_reason``.
    A trial that comes back ``interrupted`` ends the search with what was found so far.
    """
    top = max_streams if cap is None else min(max_streams, cap)
    steps: list[Step] = []
    held, failed = 0, None  # largest held, smallest not held
    n = 1 if top >= 1 else 0
    while n:
        step = judge(trial(n), p99_ms=p99_ms, min_rate=min_rate)
        steps.append(step)
        if on_step is not None:
            on_step(step)
        if step.trial.interrupted:
            break
        if step.held:
            held = max(held, n)
        else:
            failed = n if failed is None else min(failed, n)
        if failed is None:
            n = 0 if held >= top else min(2 * n, top)
        else:
            n = (held + failed) // 2 if failed - held > 1 else 0
    limit = None
    if held >= top:
        limit = cap_reason if cap is not None and cap <= max_streams else f"the most streams asked for ({max_streams})"
    return BenchResult(tuple(steps), held, limit)


# ---------------------------------------------------------------------------------------
# N copies of a camera


def camera_of(config: Config, name: str | None) -> CameraConfig:
    if not config.cameras:
        raise InvalidArgumentError(f"{config.path}: has no camera to copy")
    if name is None:
        return config.cameras[0]
    for c in config.cameras:
        if c.name == name:
            return c
    raise InvalidArgumentError(f"{config.path}: no camera named {name!r} "
                               f"(cameras: {', '.join(c.name for c in config.cameras)})")


def _slot_capacity(exclusive: bool, capacity: int | None) -> int | None:
    return 1 if exclusive else capacity


def binding_plan(config: Config, camera: CameraConfig, n: int) -> tuple[list[dict[str, Any]], int | None, str | None]:
    """The bindings of ``n`` copies of ``camera`` (spread over the device's units where the
    camera binds one), the most copies the binding allows (None: no limit) and why."""
    bind = dict(camera.bind)
    cap: int | None = None
    why: list[str] = []
    npu: list[dict[str, Any]] | None = None
    cpu: list[Any] | None = None
    if camera.core is not None:
        dev_name, core = camera.core
        dev = config.device(dev_name)
        cores = int(dev.params.get("cores", 1))
        per = _slot_capacity(dev.exclusive, dev.capacity)
        for k in [k for k in bind if k == f"{dev_name}.core" or k == f"{dev_name}.camera"]:
            del bind[k]
        order = [(core + i) % cores for i in range(cores)]
        npu = [{f"{dev_name}.core": order[i % cores]} for i in range(n)]
        if per is not None:
            cap = cores * per
            why.append(f"device {dev_name} has {cores} core{'s' if cores != 1 else ''}, "
                       + ("exclusive (one copy per core)" if dev.exclusive else f"each shared by at most {per}"))
    if "cpu" in bind:
        v = bind.pop("cpu")
        one = isinstance(v, int) and not isinstance(v, bool)
        want = (v,) if one else tuple(v)
        dev = next((d for d in config.devices if d.kind == "cpu"), None)
        if dev is None:  # the config check refuses this; keep the copies on the same CPUs
            cpu = [v] * n
        else:
            ids = dev.params.get("cpus")
            if ids is None:
                ids = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
            ids = sorted(set(ids))
            k = len(want)
            groups = [tuple(ids[i:i + k]) for i in range(0, len(ids) - k + 1, k)]
            if want in groups:  # the camera's own CPUs first
                i = groups.index(want)
                groups = groups[i:] + groups[:i]
            else:
                groups = [want] + [g for g in groups if not set(g) & set(want)]
            cpu = [(g[0] if one else g) for g in (groups[i % len(groups)] for i in range(n))]
            per = _slot_capacity(dev.exclusive, dev.capacity)
            if per is not None:
                c = len(groups) * per
                cap = c if cap is None else min(cap, c)
                what = f"cpu {v}" if one else f"{k} cpus"
                why.append(f"device {dev.name} has {len(ids)} cpus, {len(groups)} slot{'s' if len(groups) != 1 else ''} "
                           f"of {what}, " + ("exclusive" if dev.exclusive else f"each shared by at most {per}"))
    plans = []
    for i in range(n):
        b = dict(bind)
        if npu is not None:
            b.update(npu[i])
        if cpu is not None:
            b["cpu"] = cpu[i]
        plans.append(b)
    return plans, cap, ("; ".join(why) or None)


def _where(config: Config, cam: CameraConfig) -> str:
    return f"{config.path}: camera {cam.name!r}"


def _source(src: SourceConfig, where: str, fps: float, index: int) -> SourceConfig:
    params = dict(src.params)
    if src.kind == "synthetic":
        params.pop("count", None)
        params["seed"] = int(params.get("seed", 0)) + index
    elif src.kind == "file":
        params["loop"] = True
    elif "fps" not in params:
        raise InvalidArgumentError(f"{where}: bench paces sources at the target fps; source kind "
                                   f"{src.kind!r} has no fps parameter (use a synthetic or file source, or give it fps)")
    params["fps"] = float(fps)
    return SourceConfig(src.kind, params)


def copies_config(config: Config, n: int, options: BenchOptions) -> Config:
    """``config`` with its cameras replaced by ``n`` copies of the benched camera, named
    ``NAME-1`` ... ``NAME-n`` (see the module docstring for sources and bindings)."""
    cam = camera_of(config, options.camera)
    binds, _, _ = binding_plan(config, cam, n)
    cams = []
    for i in range(n):
        b = binds[i]
        core = None
        for k, v in b.items():
            if k.endswith(".core"):
                core = (k.rsplit(".", 1)[0], v)
        cams.append(dataclasses.replace(
            cam, name=f"{cam.name}-{i + 1}", source=_source(cam.source, _where(config, cam), options.fps, i), bind=b,
            core=core, placement=options.placement or cam.placement, sink=None))
    return dataclasses.replace(config, cameras=tuple(cams), batches=_batches(config, cam, [c.name for c in cams],
                                                                            options.batch))


def batch_of(config: Config, cam: CameraConfig) -> BatchConfig | None:
    """The ``[[batch]]`` ``cam`` is in, or None."""
    return next((b for b in config.batches if cam.name in b.cameras), None)


def _batches(config: Config, cam: CameraConfig, names: Sequence[str], batched: bool) -> tuple[BatchConfig, ...]:
    """The copies' batch groups: one for all of them (``batched``, with the settings of the
    camera's own ``[[batch]]``), else one of its own per copy where the program has a fixed
    batch to pad to (a frame is one row of it), else none."""
    own = batch_of(config, cam)
    if batched:
        if own is None:
            raise InvalidArgumentError(f"{_where(config, cam)} is in no [[batch]]: batching copies it with the "
                                       "settings of the camera's own [[batch]] table (add one)")
        return (dataclasses.replace(own, name=f"{own.name}-bench", cameras=tuple(names)),)
    if own is not None and own.static_batch is not None:
        return tuple(dataclasses.replace(own, name=n, cameras=(n,), max_size=1) for n in names)
    return ()


# ---------------------------------------------------------------------------------------
# One step through orchestra's run loop


def _orchestra_trial(config: Config, options: BenchOptions, n: int, pending: list[int]) -> tuple[Trial, int | None]:
    """N copies through ``run``; the trial and the signal that interrupted it (or None).
    ``pending``: signals received before (run acts on them at once)."""
    cfg = copies_config(config, n, options)
    quiet = io.StringIO()  # run's periodic status lines: the bench prints its own
    with deferred_signals() as early:  # run() takes the signals over; between runs they wait here
        early.extend(pending)
        pending.clear()
        # the p99 is over every frame of the step (8 bytes a frame; 4 Mi frames at most)
        window = min(max(int(n * options.fps * options.duration_s * 1.1) + 64, 1024), _MAX_WINDOW)
        result = run(cfg, RunOptions(duration_s=options.duration_s, dashboard=False, status_interval_s=3600.0,
                                     latency_window=window), out=quiet, err=quiet, early_signals=early)
    produced = sum(c.produced for c in result.cameras)
    processed = sum(c.processed for c in result.cameras)
    dropped = sum(sum(c.dropped.values()) for c in result.cameras)
    failed = sum(c.failed for c in result.cameras)
    lat = result.latency
    has = lat is not None and lat.window > 0
    problem = None
    if result.interrupted_by is None and result.problems:
        problem = result.problems[0]
    # the sources ran until the duration was up (or a signal came); the drain after it isn't
    # source time
    elapsed = min(result.elapsed_s, options.duration_s)
    return Trial(n, options.fps, elapsed, produced, processed, dropped, failed,
                 lat.p50 if has else None, lat.p99 if has else None, problem,
                 interrupted=result.interrupted_by is not None), result.interrupted_by


def bench(config: Config, options: BenchOptions, *, out: TextIO | None = None,
          on_step: Callable[[Step], None] | None = None) -> BenchResult:
    """Searches the largest number of copies of ``options.camera`` that ``config``'s setup
    holds at ``options.fps`` within ``options.p99_ms`` (see the module docstring).

    ``out``: where each step's line is printed as it ends (None: nowhere); ``on_step`` is
    called with each :class:`Step` too.

    Raises:
        OrchestraError: the camera can't be copied (no such camera, a source the bench can't
            pace), or one copy can't be set up (the step with N = 1).
    """
    cam = camera_of(config, options.camera)
    _source(cam.source, _where(config, cam), options.fps, 0)  # refuse an unpaceable source before running anything
    _, cap, cap_reason = binding_plan(config, cam, 1)
    if cap is not None and cap_reason:
        cap_reason = f"the binding allows {cap} cop{'y' if cap == 1 else 'ies'}: {cap_reason}"
    signum: list[int] = []
    steps: list[Step] = []
    live = out is not None and bool(getattr(out, "isatty", lambda: False)())  # "running" until the step ends

    def step_done(step: Step) -> None:
        steps.append(step)
        if out is not None:
            out.write(("\r\x1b[K" if live else "") + render_step(step) + "\n")
            out.flush()
        if on_step is not None:
            on_step(step)

    with deferred_signals() as early:  # a signal between two steps ends the search too
        def trial(n: int) -> Trial:
            signum.extend(early)
            early.clear()
            if signum:
                return Trial(n, options.fps, 0.0, 0, 0, 0, 0, None, None, interrupted=True)
            if live:
                out.write(f"N={n:<4d} running ({options.duration_s:g} s) ...")  # type: ignore[union-attr]
                out.flush()  # type: ignore[union-attr]
            t0 = time.monotonic()
            try:
                t, sig = _orchestra_trial(config, options, n, early)
            except OrchestraError as exc:
                if n == 1:
                    if live:
                        out.write("\n")  # type: ignore[union-attr]
                    raise
                return Trial(n, options.fps, time.monotonic() - t0, 0, 0, 0, 0, None, None,
                             problem=f"can't set up {n} copies: {exc}")
            if sig is not None:
                signum.append(sig)
            return t

        try:
            result = search(trial, max_streams=options.max_streams, p99_ms=options.p99_ms,
                            min_rate=options.min_rate, on_step=step_done, cap=cap, cap_reason=cap_reason)
        except KeyboardInterrupt:  # SIGINT in the instant between a run's handlers and ours
            signum.append(int(signal.SIGINT))
            result = BenchResult(tuple(steps), max((st.streams for st in steps if st.held), default=0))
    if signum:
        result = dataclasses.replace(result, limit=None, interrupted_by=signum[0])
    return result


# ---------------------------------------------------------------------------------------
# Text


def _ms(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.1f}"


def render_step(step: Step) -> str:
    """One line per step: N, held or not, the counts, p50/p99 and the reason."""
    t = step.trial
    if t.interrupted:
        return f"N={t.streams:<4d} interrupted" + (f" after {t.elapsed_s:.1f} s" if t.elapsed_s >= 0.05 else "")
    share = f"{100.0 * t.processed / t.produced:5.1f} %" if t.produced else "    - "
    line = (f"N={t.streams:<4d} {'held' if step.held else 'NOT held':<9s}"
            f"produced {t.produced:6d}  processed {t.processed:6d} ({share})  dropped {t.dropped:5d}  "
            f"failed {t.failed:3d}  p50 {_ms(t.p50_s):>7s} ms  p99 {_ms(t.p99_s):>7s} ms  ({t.elapsed_s:.1f} s)")
    if not step.held:
        line += f"  {step.reason}"
    return line


def render_result(result: BenchResult, what: str = "streams") -> str:
    """The closing line(s): the largest N held, and why the search stopped where it did."""
    lines = [f"largest N held: {result.largest} {what}" + ("" if result.limit is None else
                                                           f" (the search stopped at its limit: {result.limit})")]
    if result.interrupted_by is not None and result.interrupted_by > 0:
        lines.append(f"interrupted ({signal.Signals(result.interrupted_by).name}): the search ended early; "
                     f"{result.largest} is what was held so far")
    return "\n".join(lines) + "\n"
