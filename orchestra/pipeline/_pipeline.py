"""One camera's pipeline (source → stream → pre → executor → post → sink) and a group of them.

Per pipeline, long-lived tasks only: one producer (pulls frames from the source into the
stream) and ``inflight`` workers (each takes a frame, runs it through pre, the executor,
post and the sink). Nothing per frame creates a task, and no anyio stream is on the
per-frame path (see DESIGN "Performance facts"); anyio gives the structure: task groups,
cancel scopes for ``stop()`` and the duration, cancellation of ``run()``.

Accounting: a frame is ``produced`` when the pipeline takes it from the source; from then
on it is in exactly one place: ``queued`` (in the stream), ``active`` (taken by a worker),
or counted once as ``processed``, ``failed`` or ``dropped[reason]``. Every move between
them happens with no ``await`` in between, so the identity holds whenever anyone looks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

import anyio
import anyio.lowlevel

from ..errors import Error, InvalidArgumentError, OrchestraError
from ..telemetry import LatencySummary, LatencyWindow, bound, get_logger
from ._frame import Frame, Result
from ._metrics import FAILURE_STAGES, Accounting, PipelineStatistics, PipelinesStatistics, RateMeter, _reasons
from ._sinks import CallbackSink, SinkError, _is_async
from ._stream import DropPolicy, DropReason, FrameStream, _drop_policy

__all__ = ["Executor", "FrameDropped", "Pipeline", "Pipelines", "SourceError", "keyed"]

_log = get_logger(__name__)

_DEADLINE = DropReason.DEADLINE
_SHUTDOWN = DropReason.SHUTDOWN
_MISSING: Any = object()
# how long closing a sink at the end of a run may take before it is abandoned (logged)
_SINK_CLOSE_TIMEOUT_S = 30.0

PreProcess = Callable[[Frame], list[Any]] | Callable[[Frame], Awaitable[list[Any]]]
PostProcess = Callable[[Frame, list[Any]], Any] | Callable[[Frame, list[Any]], Awaitable[Any]]


@runtime_checkable
class Executor(Protocol):
    """What a pipeline runs each frame on: an orchestrator instance handle or pool, or any
    object with this method. ``inputs`` is what the pre-process made (``[frame.data]`` without
    one); the returned list reaches the post-process and the sink.

    ``execute`` may instead return an object with ``outputs`` (that list) and ``options``
    (backend -> options in force for that execute) attributes, such as the orchestrator's
    ``Execution`` (``execute(..., detail=True)``): the pipeline unwraps it and puts the
    options in :attr:`Result.options`.

    Optionally ``describe() -> Mapping`` (plain function, cheap): the pipeline's statistics
    show its ``"instance"``, ``"unit"`` and ``"options"`` entries.
    """

    async def execute(self, inputs: list[Any]) -> list[Any]: ...


class SourceError(OrchestraError):
    """A pipeline's source raised: the pipeline stopped (its accepted frames drained)."""

    default_code = Error.AccessFailed


class FrameDropped(OrchestraError):
    """Raised by an executor (or a pre/post-process or sink) to drop the frame it was given:
    the pipeline counts it as dropped with ``reason`` (a key of the ``dropped`` counters),
    not as failed. A cross-camera :class:`~orchestra.pipeline.Batcher` raises it with
    ``"shutdown"`` for frames still waiting for a batch when it is closed.
    """

    default_code = Error.InvalidState

    def __init__(self, reason: str, message: str | None = None) -> None:
        if not isinstance(reason, str) or not reason:
            raise InvalidArgumentError(f"FrameDropped: reason must be a non-empty string, got {reason!r}")
        super().__init__(message or f"frame dropped: {reason}")
        self.reason = reason


class _Keyed:
    __slots__ = ("detail", "key", "pool")

    def __init__(self, pool: Any, key: Any) -> None:
        self.pool = pool
        self.key = key
        # An orchestrator Pool (it routes keys): ask for the Execution, so results carry the
        # options their frame ran with, and frame latencies can reach the instance that ran it.
        self.detail = callable(getattr(pool, "routed_to", None))

    async def execute(self, inputs: list[Any]) -> Any:
        if self.detail:
            return await self.pool.execute(inputs, key=self.key, detail=True)
        return await self.pool.execute(inputs, key=self.key)

    def record_frame_latency(self, seconds: float) -> None:
        """Hands a processed frame's latency to the pool's instance this key is routed to
        (its ``latency_target`` policy measures frames); nothing for other executors."""
        if not self.detail:
            return
        name = self.pool.routed_to(self.key)
        inst = getattr(self.pool, "instances", {}).get(name) if name is not None else None
        record = getattr(inst, "record_frame_latency", None)
        if record is not None:
            record(seconds)

    def describe(self) -> Mapping[str, Any]:
        describe = getattr(self.pool, "describe", None)
        info = dict(describe()) if callable(describe) else {}
        info["key"] = self.key
        return info

    def __repr__(self) -> str:
        return f"keyed({self.pool!r}, {self.key!r})"


def keyed(pool: Any, key: Any) -> Executor:
    """An executor that runs each frame on ``pool`` with ``pool.execute(inputs, key=key)``
    (sticky routing: a camera keeps to one instance of the pool)."""
    if not callable(getattr(pool, "execute", None)):
        raise InvalidArgumentError(f"keyed: {pool!r} has no execute()")
    return _Keyed(pool, key)


def _positive(value: Any, what: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < float("inf")):
        raise InvalidArgumentError(f"{where}: {what} must be a positive number of seconds, got {value!r}")
    return float(value)


def _count(value: Any, what: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"{where}: {what} must be an int >= 1, got {value!r}")
    return value


class Pipeline:
    """One camera: ``source`` → bounded stream → ``pre`` → ``executor`` → ``post`` → ``sink``.

    Args:
        name: the pipeline's name (unique within a :class:`Pipelines`; logs carry it as
            ``pipeline``, and the source's name as ``camera``).
        source: a :class:`~orchestra.pipeline.Source`.
        executor: an :class:`Executor` (``async execute(inputs) -> list``).
        pre: ``pre(frame) -> inputs`` (plain or ``async``); default ``[frame.data]``.
        post: ``post(frame, outputs) -> value`` (plain or ``async``); default: the outputs.
        sink: a :class:`~orchestra.pipeline.Sink`, or a plain or ``async`` function of the
            :class:`Result`; default: none (results are counted, then discarded). A frame
            whose sink raises (or times out) is counted ``failed`` (stage ``sink``, see
            ``statistics().sink_failures``). A sink with ``aclose()`` is closed when ``run``
            ends (by the :class:`Pipelines` group once all its pipelines ended, when the
            pipeline is in one; a sink shared by several pipelines is closed once).
        queue: the stream's capacity (frames waiting for the executor).
        drop: ``"drop_oldest"`` (live: the newest frame wins), ``"drop_newest"`` or
            ``"block"`` (capacity mode: the source waits, nothing is dropped).
        deadline_s: a frame older than this (since capture) when it reaches the executor is
            dropped (reason ``"deadline"``) instead of executed.
        inflight: how many frames may be between the stream and the sink at once (more
            than one only helps an executor that runs calls in parallel, like a pool).
            Results still reach the sink in frame order.
        sink_timeout_s: an ``async`` sink's ``send`` that takes longer is abandoned
            (cancelled) and the frame counted failed (stage ``sink``), so a sink that hangs
            costs its camera at most this per frame and can't hang the end of the run.
            None (the default): no bound, and no cost (a bound costs ~10 us per frame). The
            built-in file and MQTT sinks bound their own waits (their ``timeout_s``).

    Plain ``pre``/``post``/sink functions run on the event loop: keep them cheap, or make
    them ``async`` and hand heavy work to a thread. ``stop()`` and ``statistics()`` are for
    the event loop's thread.
    """

    def __init__(self, name: str, source: Any, executor: Executor, *, pre: PreProcess | None = None,
                 post: PostProcess | None = None, sink: Any = None, queue: int = 8,
                 drop: DropPolicy | str = DropPolicy.DROP_OLDEST, deadline_s: float | None = None,
                 inflight: int = 1, sink_timeout_s: float | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"Pipeline: name must be a non-empty string, got {name!r}")
        where = f"pipeline {name!r}"
        if not callable(getattr(source, "frames", None)):
            raise InvalidArgumentError(f"{where}: source {source!r} has no frames() (see orchestra.pipeline.Source)")
        if not callable(getattr(executor, "execute", None)):
            raise InvalidArgumentError(f"{where}: executor {executor!r} has no execute() (see orchestra.pipeline.Executor)")
        for what, fn in (("pre", pre), ("post", post)):
            if fn is not None and not callable(fn):
                raise InvalidArgumentError(f"{where}: {what} must be callable, got {fn!r}")
        if sink is not None and not callable(getattr(sink, "send", None)):
            if not callable(sink):
                raise InvalidArgumentError(f"{where}: sink must have send() or be callable, got {sink!r}")
            sink = CallbackSink(sink)
        clock = getattr(source, "clock", None)
        if clock is not None and not callable(clock):
            raise InvalidArgumentError(f"{where}: source.clock must be a () -> float function, got {clock!r}")

        self.name = name
        self.source = source
        self.executor = executor
        self.camera: str = str(getattr(source, "name", name))
        self._clock: Callable[[], float] = clock if clock is not None else time.monotonic
        self._pre = pre
        self._pre_async = pre is not None and _is_async(pre)
        self._post = post
        self._post_async = post is not None and _is_async(post)
        self._sink = sink
        self._send = None if sink is None else sink.send
        self._send_async = self._send is not None and _is_async(self._send)
        self._deadline_s = None if deadline_s is None else _positive(deadline_s, "deadline_s", where)
        self._sink_timeout_s = None if sink_timeout_s is None else _positive(sink_timeout_s, "sink_timeout_s", where)
        self._inflight = _count(inflight, "inflight", where)
        self._stream: FrameStream[Frame] = FrameStream(_count(queue, "queue", where), _drop_policy(drop, where),
                                                      self._on_drop)

        self._produced = 0
        self._processed = 0
        self._failed = 0
        self._failed_by: dict[str, int] = dict.fromkeys(FAILURE_STAGES, 0)
        self._active = 0
        self._in_group = False  # a Pipelines group closes the sink instead
        self._dropped: dict[str, int] = {r.value: 0 for r in DropReason}
        self._latency = LatencyWindow(1024)
        self._group_latency: LatencyWindow | None = None
        self._in_rate = RateMeter()
        self._out_rate = RateMeter()
        self._started: float | None = None
        self._state = "idle"
        self._stop_mode: str | None = None  # None, "drain" or "now"
        self._producer_scope: anyio.CancelScope | None = None
        self._run_scope: anyio.CancelScope | None = None
        self._source_error: BaseException | None = None
        self._last_error: str | None = None
        self._last_logged: str | None = None
        # in-order delivery with inflight > 1: tickets in take order, delivered in turn
        self._next_ticket = 0
        self._turn = 0
        self._done_early: set[int] = set()
        self._turn_waiters: dict[int, asyncio.Future[None]] = {}

    # --- control -------------------------------------------------------------------------

    @property
    def state(self) -> str:
        """``idle``, ``running``, ``stopping``, ``done`` or ``failed`` (the source raised)."""
        return self._state

    async def run(self, duration_s: float | None = None) -> PipelineStatistics:
        """Runs until the source ends, ``duration_s`` passes, or :meth:`stop`; then drains
        (frames already accepted are processed) and returns the final statistics.

        Cancelling ``run`` stops at once: every frame not finished is counted as dropped
        (``"shutdown"``). A pipeline runs once.

        Raises:
            SourceError: the source raised (after the accepted frames were drained).
            OrchestraError: the pipeline already ran, or not on anyio's asyncio backend.
        """
        where = f"pipeline {self.name!r}"
        if self._state != "idle":
            raise OrchestraError(f"{where}: already ran (state {self._state}); a pipeline runs once", Error.InvalidState)
        if duration_s is not None:
            duration_s = _positive(duration_s, "duration_s", where)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise OrchestraError(f"{where}: needs anyio's asyncio backend (with or without uvloop)",
                                 Error.NotSupported) from None
        self._state = "stopping" if self._stop_mode else "running"
        self._started = self._clock()
        try:
            with bound(pipeline=self.name, camera=self.camera):
                async with anyio.create_task_group() as outer:
                    if duration_s is not None:
                        outer.start_soon(self._stop_after, duration_s)
                    async with anyio.create_task_group() as tg:
                        self._run_scope = tg.cancel_scope
                        if self._stop_mode == "now":
                            tg.cancel_scope.cancel()
                        tg.start_soon(self._produce)
                        for _ in range(self._inflight):
                            tg.start_soon(self._work)
                    outer.cancel_scope.cancel()
        finally:
            self._run_scope = None
            for _ in self._stream.drain():
                self._dropped[_SHUTDOWN] += 1
            self._state = "failed" if self._source_error is not None else "done"
            if not self._in_group and self._sink is not None:
                await _close_sinks([self._sink], {id(self._sink): self})
        if self._source_error is not None:
            exc = self._source_error
            raise SourceError(f"{where}: source {self.camera!r} failed: {type(exc).__name__}: {exc}") from exc
        return self.statistics()

    def stop(self, *, drain: bool = True) -> None:
        """Stops the source. ``drain=True``: the frames already queued are still processed;
        ``drain=False``: they and the ones executing are dropped (``"shutdown"``) at once.
        ``run`` returns when that is done. Before ``run``, makes ``run`` return at once."""
        if self._state in ("done", "failed"):
            return
        self._stop_mode = "now" if (not drain or self._stop_mode == "now") else "drain"
        if self._state == "running":
            self._state = "stopping"
        if self._producer_scope is not None:
            self._producer_scope.cancel()
        if self._stop_mode == "now" and self._run_scope is not None:
            self._run_scope.cancel()

    async def _stop_after(self, seconds: float) -> None:
        await anyio.sleep(seconds)
        self.stop()

    # --- the tasks ----------------------------------------------------------------------

    def _on_drop(self, frame: Frame, reason: DropReason) -> None:
        self._dropped[reason] += 1

    async def _produce(self) -> None:
        stream = self._stream
        clock = self._clock
        in_rate = self._in_rate
        block = stream.policy is DropPolicy.BLOCK
        if self._stop_mode is not None:  # stopped before it started
            stream.close()
            return
        scope = self._producer_scope = anyio.CancelScope()
        frames: Any = None
        capacity = stream.capacity
        held: float | None = None
        pending: Frame | None = None  # produced, not yet queued (block mode)
        checkpoint = anyio.lowlevel.checkpoint
        try:
            frames = self.source.frames()
            anext = getattr(frames, "__anext__", None)
            if not callable(anext):
                raise TypeError(f"frames() returned {frames!r}, not an async iterator")
            # a generator source gets, as the value of its ``yield``, the seconds a block-mode
            # put held it back (None otherwise): its cue to slip its schedule
            asend = getattr(frames, "asend", None)
            with scope:
                while True:
                    try:
                        frame = await (asend(held) if held and asend is not None else anext())
                    except StopAsyncIteration:
                        break
                    held = None
                    self._produced += 1
                    in_rate.record(clock())
                    if not block or len(stream) < capacity:
                        stream.put_nowait(frame)
                        # a source whose frames are always due (an fps the machine can't
                        # reach) never suspends: yield, so timers, signals and the workers run
                        await checkpoint()
                    else:
                        pending = frame
                        t_put = clock()
                        await stream.put(frame)
                        pending = None
                        held = clock() - t_put
            if pending is not None:
                # stop(drain=True) interrupted this put: the frame was accepted, queue it
                # (only cancellation from outside, or stop(drain=False), drops it)
                await stream.put(pending)
                pending = None
        except Exception as exc:
            self._source_error = exc
            self._last_error = f"source: {type(exc).__name__}: {exc}"
            _log.error("source failed; stopping the pipeline", error=f"{type(exc).__name__}: {exc}", exc_info=exc)
        finally:
            if pending is not None:
                self._dropped[_SHUTDOWN] += 1
            self._producer_scope = None
            aclose = getattr(frames, "aclose", None)
            if callable(aclose):
                with anyio.CancelScope(shield=True):
                    try:
                        await aclose()
                    except Exception as exc:
                        _log.warning("closing the source failed", error=f"{type(exc).__name__}: {exc}")
            stream.close()

    async def _work(self) -> None:
        stream = self._stream
        clock = self._clock
        execute = self.executor.execute
        pre, pre_async = self._pre, self._pre_async
        post, post_async = self._post, self._post_async
        send, send_async = self._send, self._send_async
        sink_timeout = self._sink_timeout_s
        deadline = self._deadline_s
        dropped = self._dropped
        latency = self._latency
        out_rate = self._out_rate
        record_frame = getattr(self.executor, "record_frame_latency", None)  # e.g. an orchestrator Instance
        while True:
            try:
                frame = await stream.get()
            except anyio.EndOfStream:
                return
            self._active += 1
            ticket = self._next_ticket
            self._next_ticket = ticket + 1
            stage = "pre"
            in_sink = False
            try:
                if deadline is not None and clock() - frame.t_capture > deadline:
                    self._active -= 1
                    dropped[_DEADLINE] += 1
                    continue
                if pre is None:
                    inputs = [frame.data]
                else:
                    inputs = await pre(frame) if pre_async else pre(frame)  # type: ignore[misc]
                    if deadline is not None and clock() - frame.t_capture > deadline:
                        self._active -= 1
                        dropped[_DEADLINE] += 1
                        continue
                stage = "execute"
                outputs = await execute(inputs)
                options = None
                if outputs.__class__ is not list:
                    # an Execution-like result: outputs + the options in force for it
                    opts = getattr(outputs, "options", _MISSING)
                    if opts is not _MISSING:
                        options = opts
                        outputs = outputs.outputs
                stage = "post"
                if post is None:
                    value = outputs
                else:
                    value = await post(frame, outputs) if post_async else post(frame, outputs)  # type: ignore[misc]
                stage = "sink"
                if ticket != self._turn:
                    await self._wait_turn(ticket)
                t_done = clock()
                if send is not None:
                    result = Result(frame, outputs, value, t_done, options)
                    if send_async:
                        in_sink = True  # the sink has the frame: cancelled now, it is processed
                        if sink_timeout is None:
                            await send(result)
                        else:
                            with anyio.move_on_after(sink_timeout) as scope:
                                await send(result)
                            if scope.cancelled_caught:
                                in_sink = False
                                raise SinkError(f"pipeline {self.name!r}: sink {self._sink!r} took longer than "
                                                f"sink_timeout_s={sink_timeout:g}; the frame was abandoned")
                    else:
                        send(result)
                self._active -= 1
                self._processed += 1
                lat = t_done - frame.t_capture
                latency.record(lat)
                if record_frame is not None:
                    record_frame(lat)
                if self._group_latency is not None:
                    self._group_latency.record(lat)
                out_rate.record(t_done)
            except FrameDropped as exc:
                self._active -= 1
                dropped[exc.reason] = dropped.get(exc.reason, 0) + 1
            except Exception as exc:
                self._active -= 1
                self._failed += 1
                self._failed_by[stage] += 1
                self._failure(stage, frame, exc)
            except BaseException:
                self._active -= 1
                if in_sink:  # cancelled while the sink took it: the sink saw it
                    self._processed += 1
                else:
                    dropped[_SHUTDOWN] += 1
                raise
            finally:
                self._ticket_done(ticket)

    async def _wait_turn(self, ticket: int) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._turn_waiters[ticket] = fut
        try:
            await fut
        finally:
            self._turn_waiters.pop(ticket, None)

    def _ticket_done(self, ticket: int) -> None:
        if ticket != self._turn:
            self._done_early.add(ticket)
            return
        turn = ticket + 1
        done = self._done_early
        while turn in done:
            done.discard(turn)
            turn += 1
        self._turn = turn
        fut = self._turn_waiters.get(turn)
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _failure(self, stage: str, frame: Frame, exc: Exception) -> None:
        error = f"{type(exc).__name__}: {exc}"
        self._last_error = f"{stage}: {error}"
        n = self._failed
        # a new kind of failure (stage + exception type) is logged with its traceback; more
        # of the same at failures 1, 2, 4, 8, ... (no log flood at 30 fps)
        kind = f"{stage}: {type(exc).__name__}"
        new = kind != self._last_logged
        if new or n & (n - 1) == 0:
            self._last_logged = kind
            # a SinkError says all there is (and rendering a traceback can hold the loop for
            # a quarter second with a rich console): no traceback for it
            trace = new and not isinstance(exc, SinkError)
            _log.warning("frame failed", stage=stage, index=frame.index, error=error, failures=n,
                         exc_info=exc if trace else None)

    # --- observing ----------------------------------------------------------------------

    def accounting(self) -> Accounting:
        """Where every produced frame is now (call ``.check()`` on it to verify)."""
        return Accounting(self.name, self._produced, self._processed, self._failed, _reasons(self._dropped),
                          len(self._stream), self._active, self._state in ("running", "stopping"))

    def _executor_info(self) -> Mapping[str, Any] | None:
        describe = getattr(self.executor, "describe", None)
        if not callable(describe):
            return None
        try:
            info = describe()
        except Exception as exc:
            _log.debug("executor describe() failed", pipeline=self.name, error=f"{type(exc).__name__}: {exc}")
            return None
        return MappingProxyType(dict(info)) if isinstance(info, Mapping) else None

    def statistics(self) -> PipelineStatistics:
        """Counters, rates, latency, queue depth and the executor's description, now."""
        now = self._clock()
        since = self._started
        info = self._executor_info()
        stream = self._stream
        options = info.get("options") if info is not None else None
        return PipelineStatistics(
            name=self.name,
            camera=self.camera,
            state=self._state,
            drop=stream.policy.value,
            accounting=self.accounting(),
            input_fps=0.0 if since is None else self._in_rate.rate(now, since),
            output_fps=0.0 if since is None else self._out_rate.rate(now, since),
            latency=self._latency.summary(),
            queue_depth=len(stream),
            queue_max=stream.max_depth,
            queue_capacity=stream.capacity,
            inflight=self._inflight,
            instance=None if info is None else info.get("instance", info.get("name")),
            unit=None if info is None else info.get("unit", info.get("binding")),
            options=MappingProxyType(dict(options)) if isinstance(options, Mapping) else None,
            executor_info=info,
            last_error=self._last_error,
            failed_by=MappingProxyType(dict(self._failed_by)),
        )

    def __repr__(self) -> str:
        return f"Pipeline({self.name!r}, camera={self.camera!r}, {self._stream!r}, state={self._state})"


async def _close_sinks(sinks: list[Any], owners: Mapping[int, Pipeline]) -> None:
    """Closes each sink that has ``aclose()`` (shielded from cancellation, at most
    ``_SINK_CLOSE_TIMEOUT_S`` each); a failure is logged and shown as the owning pipeline's
    ``last_error``. Every frame's fate was settled before: closing changes no count."""
    for sink in sinks:
        aclose = getattr(sink, "aclose", None)
        if not callable(aclose):
            continue
        owner = owners[id(sink)]
        with anyio.CancelScope(shield=True), anyio.move_on_after(_SINK_CLOSE_TIMEOUT_S) as scope:
            try:
                await aclose()
            except Exception as exc:
                owner._last_error = f"sink close: {type(exc).__name__}: {exc}"
                _log.warning("closing the sink failed", pipeline=owner.name, sink=repr(sink),
                             error=f"{type(exc).__name__}: {exc}")
        if scope.cancelled_caught:
            owner._last_error = f"sink close: {sink!r} took longer than {_SINK_CLOSE_TIMEOUT_S:g}s; abandoned"
            _log.warning("closing the sink timed out", pipeline=owner.name, sink=repr(sink))


class Pipelines:
    """Many pipelines run together in one anyio task group.

    ``statistics().latency`` is over the last ``latency_window`` frames of all cameras.

    One pipeline's source failing doesn't stop the others: it is logged and shows in its
    statistics (state ``failed``, ``last_error``), and ``run`` raises an ``ExceptionGroup``
    of the :class:`SourceError`\\ s once all are done.
    """

    def __init__(self, pipelines: Iterable[Pipeline] = (), *, latency_window: int = 8192) -> None:
        self._pipelines: dict[str, Pipeline] = {}
        self._latency = LatencyWindow(_count(latency_window, "latency_window", "Pipelines"))
        self._running = False
        for p in pipelines:
            self.add(p)

    def add(self, pipeline: Pipeline) -> Pipeline:
        """Adds a pipeline (before ``run``); returns it.

        Raises:
            InvalidArgumentError: not a Pipeline, or its name is taken.
            OrchestraError: the group is running.
        """
        if not isinstance(pipeline, Pipeline):
            raise InvalidArgumentError(f"Pipelines.add: expected a Pipeline, got {pipeline!r}")
        if self._running:
            raise OrchestraError(f"Pipelines: can't add {pipeline.name!r} while the group runs", Error.InvalidState)
        if pipeline.name in self._pipelines:
            raise InvalidArgumentError(f"Pipelines: two pipelines named {pipeline.name!r}")
        pipeline._group_latency = self._latency
        pipeline._in_group = True
        self._pipelines[pipeline.name] = pipeline
        return pipeline

    def __len__(self) -> int:
        return len(self._pipelines)

    def __iter__(self) -> Iterator[Pipeline]:
        return iter(self._pipelines.values())

    def __getitem__(self, name: str) -> Pipeline:
        try:
            return self._pipelines[name]
        except KeyError:
            raise KeyError(f"no pipeline named {name!r} (have: {', '.join(self._pipelines)})") from None

    async def run(self, duration_s: float | None = None) -> PipelinesStatistics:
        """Runs every pipeline (each as :meth:`Pipeline.run`) until all are done; returns the
        final statistics.

        Raises:
            ExceptionGroup: one or more pipelines failed (the others ran to their end).
        """
        errors: list[Exception] = []

        async def one(p: Pipeline) -> None:
            try:
                await p.run(duration_s)
            except Exception as exc:
                errors.append(exc)

        self._running = True
        try:
            async with anyio.create_task_group() as tg:
                for p in self._pipelines.values():
                    tg.start_soon(one, p, name=f"pipeline {p.name}")
        finally:
            self._running = False
            owners: dict[int, Pipeline] = {}
            sinks = []
            for p in self._pipelines.values():
                if p._sink is not None and id(p._sink) not in owners:
                    owners[id(p._sink)] = p
                    sinks.append(p._sink)
            await _close_sinks(sinks, owners)
        if errors:
            raise ExceptionGroup(f"{len(errors)} of {len(self)} pipelines failed", errors)
        return self.statistics()

    def stop(self, *, drain: bool = True) -> None:
        """:meth:`Pipeline.stop` on every pipeline."""
        for p in self._pipelines.values():
            p.stop(drain=drain)

    def accounting(self) -> Accounting:
        """The total over all pipelines (``check()`` it; each pipeline's holds on its own too)."""
        return Accounting.total(p.accounting() for p in self._pipelines.values())

    def statistics(self) -> PipelinesStatistics:
        stats = tuple(p.statistics() for p in self._pipelines.values())
        return PipelinesStatistics(
            pipelines=stats,
            accounting=Accounting.total(s.accounting for s in stats),
            input_fps=sum(s.input_fps for s in stats),
            output_fps=sum(s.output_fps for s in stats),
            latency=self._latency.summary() if stats else LatencySummary(0, 0, 0.0, 0.0, 0.0, 0.0, 0.0),
            queue_max=max((s.queue_max for s in stats), default=0),
        )

    def __repr__(self) -> str:
        return f"Pipelines({len(self)} pipelines: {', '.join(self._pipelines)})"
