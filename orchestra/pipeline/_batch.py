"""Cross-camera batching: frames of several cameras stacked into one execute.

A :class:`Batcher` wraps one executor (an orchestrator instance or pool, or anything with
``async execute(inputs)``) and hands out one member executor per camera. Each member's
``execute`` queues its frame's inputs; a batch goes when ``max_size`` cameras have a frame
waiting, when every member has one waiting, or ``max_wait_s`` after its oldest frame
arrived. A batch takes at most one frame per camera, oldest first (FIFO across cameras), so
a camera with several frames in flight never crowds out another.

No task per frame or per batch: batches are formed in plain callbacks (an enqueue, or a
``loop.call_later`` timer) and run by the worker task of one of the frames in it, the
batch's *leader*; the others wait on a loop future each. The leader's execute is shielded
from cancellation, so cancelling one camera never cancels the other cameras' frames. A frame
cancelled while it waits leaves the batch (a leader that had not started hands the batch to
another of its frames).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import anyio
import numpy as np

from ..errors import Error, InvalidArgumentError, OrchestraError
from ..telemetry import get_logger
from ._pipeline import FrameDropped

__all__ = ["BatchError", "BatchMember", "BatchShare", "BatchStatistics", "Batcher"]

_log = get_logger(__name__)

_PENDING, _BATCHED, _RUNNING, _GONE = 0, 1, 2, 3


class BatchError(OrchestraError):
    """The execute of a batch failed: every frame of the batch fails with one of these
    (``__cause__`` is the executor's exception; ``code`` is its code when it had one)."""

    default_code = Error.Internal


@dataclass(frozen=True, slots=True)
class BatchShare:
    """One camera's part of a batch's result, when the executor returned an object with
    ``outputs`` and ``options`` (an orchestrator ``Execution``) that is not a dataclass;
    a dataclass result is copied with ``dataclasses.replace(result, outputs=...)`` instead.
    """

    outputs: list[Any]
    options: Any


@dataclass(frozen=True, slots=True)
class BatchStatistics:
    """What a :class:`Batcher` has done so far.

    ``sizes`` is the batch-size histogram: frames per batch → number of batches (padding
    rows not counted). ``wait`` is per frame, from its arrival at the batcher to the start
    of its batch's execute. ``triggers`` counts why batches went: ``"full"`` (``max_size``
    cameras waiting), ``"members"`` (every member camera waiting) or ``"timeout"``
    (``max_wait_s`` passed since the oldest frame arrived).
    """

    name: str
    members: int
    batches: int  # executes started
    frames: int  # frames in those executes
    failed_batches: int
    failed_frames: int  # frames of failed batches
    padded_rows: int  # padding rows added to reach static_batch
    dropped: int  # frames dropped at close() while waiting
    pending: int  # frames waiting now
    running: int  # batches executing now
    sizes: Mapping[int, int]
    triggers: Mapping[str, int]
    mean_wait_s: float
    max_wait_s: float

    @property
    def mean_size(self) -> float:
        return self.frames / self.batches if self.batches else 0.0

    def format_sizes(self) -> str:
        """The histogram as ``"1x3 2x10 4x120"`` (size x count), or ``"-"`` with no batch."""
        return " ".join(f"{k}x{v}" for k, v in sorted(self.sizes.items())) or "-"


class _Request:
    __slots__ = ("batch", "camera", "fut", "inputs", "kind", "rows", "state", "t_enqueue", "timer")

    def __init__(self, camera: str, inputs: list[Any], rows: int, kind: tuple[Any, ...], fut: asyncio.Future[Any],
                 t: float) -> None:
        self.camera = camera
        self.inputs = inputs
        self.rows = rows
        self.kind = kind  # (shape without the batch dimension, dtype) of every input
        self.fut = fut
        self.t_enqueue = t
        self.timer: asyncio.TimerHandle | None = None
        self.state = _PENDING
        self.batch: _Batch | None = None


class _Batch:
    __slots__ = ("requests", "started", "trigger")

    def __init__(self, requests: list[_Request], trigger: str) -> None:
        self.requests = requests
        self.trigger = trigger
        self.started = False


class BatchMember:
    """One camera's executor on a :class:`Batcher` (give it to that camera's ``Pipeline``).

    ``execute(inputs)`` waits for the frame's batch and returns this camera's part of the
    result; it raises :class:`~orchestra.pipeline.FrameDropped` (``"shutdown"``) when the
    batcher is closed while the frame waits, and :class:`BatchError` when the batch's
    execute fails.
    """

    __slots__ = ("_batcher", "camera")

    def __init__(self, batcher: Batcher, camera: str) -> None:
        self._batcher = batcher
        self.camera = camera

    async def execute(self, inputs: list[Any]) -> Any:
        return await self._batcher._execute(self.camera, inputs)

    def describe(self) -> Mapping[str, Any]:
        """The underlying executor's ``describe()`` (when it has one) plus ``batch`` (the
        batcher's name), ``camera`` and ``max_size``."""
        b = self._batcher
        describe = getattr(b.executor, "describe", None)
        info = dict(describe()) if callable(describe) else {}
        info.update(batch=b.name, camera=self.camera, max_size=b.max_size)
        return info

    def record_frame_latency(self, seconds: float) -> None:
        """Passes a frame's latency on to the underlying executor when it takes them (for
        latency-driven policies); does nothing otherwise."""
        record = getattr(self._batcher.executor, "record_frame_latency", None)
        if callable(record):
            record(seconds)

    def __repr__(self) -> str:
        return f"BatchMember({self._batcher.name!r}, {self.camera!r})"


def _check_int(value: Any, what: str, where: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidArgumentError(f"{where}: {what} must be an int >= {low}, got {value!r}")
    return value


class Batcher:
    """Stacks the frames of several cameras into one execute of ``executor``.

    Args:
        executor: what runs each batch: an orchestrator instance or pool (thread or process
            placement), or any object with ``async execute(inputs)``. It gets the members'
            inputs concatenated along ``batch_dim`` (input by input) and must return a list
            of outputs, or an object with ``outputs`` and ``options`` (an orchestrator
            ``Execution``).
        max_size: the most frames in one batch (one frame per camera at most).
        max_wait_s: a batch goes at the latest this long after its oldest frame arrived.
        batch_dim: the batch dimension of every input and of the outputs that have one.
        static_batch: for a program with a fixed batch size: every batch is padded with
            zero rows to exactly this many rows; padding never reaches a camera.
            ``max_size`` must be ``<= static_batch``. ``None`` (default): the batch has as
            many rows as its frames (a program exported with a dynamic batch dimension).
        name: for statistics, logs and errors.

    Each member's inputs must be arrays with the batch dimension (usually of size 1: a
    pre-process making ``[frame.data[None]]``). A batch only takes frames whose inputs have
    the same shapes (but for the batch dimension) and dtypes as its oldest frame's; a frame
    that differs waits for a batch of its own kind. An output whose ``batch_dim`` has the batch's row count is sliced back to
    each camera; any other output (a scalar, a per-batch value) goes whole to every camera.

    All members are used from one event loop (anyio's asyncio backend). ``close()`` drops
    the frames still waiting (``FrameDropped("shutdown")``) and refuses later ones; batches
    already formed still run. Usable as ``async with Batcher(...) as b:`` (closes at exit).
    """

    def __init__(self, executor: Any, *, max_size: int, max_wait_s: float, batch_dim: int = 0,
                 static_batch: int | None = None, name: str = "batch") -> None:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"Batcher: name must be a non-empty string, got {name!r}")
        where = f"batch {name!r}"
        if not callable(getattr(executor, "execute", None)):
            raise InvalidArgumentError(f"{where}: executor {executor!r} has no execute() (see orchestra.pipeline.Executor)")
        self.max_size = _check_int(max_size, "max_size", where, 1)
        if isinstance(max_wait_s, bool) or not isinstance(max_wait_s, (int, float)) or not (0 <= max_wait_s < float("inf")):
            raise InvalidArgumentError(f"{where}: max_wait_s must be a number of seconds >= 0, got {max_wait_s!r}")
        self.max_wait_s = float(max_wait_s)
        self.batch_dim = _check_int(batch_dim, "batch_dim", where, 0)
        if static_batch is not None:
            static_batch = _check_int(static_batch, "static_batch", where, 1)
            if max_size > static_batch:
                raise InvalidArgumentError(f"{where}: max_size {max_size} is larger than static_batch {static_batch}")
        self.static_batch = static_batch
        self.name = name
        self.executor = executor
        self._where = where
        self._members: dict[str, BatchMember] = {}
        self._pending: deque[_Request] = deque()
        self._waiting: dict[str, int] = {}  # camera -> frames pending
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        # statistics
        self._batches = 0
        self._frames = 0
        self._failed_batches = 0
        self._failed_frames = 0
        self._padded = 0
        self._dropped = 0
        self._running = 0
        self._sizes: dict[int, int] = {}
        self._triggers = {"full": 0, "members": 0, "timeout": 0}
        self._wait_sum = 0.0
        self._wait_n = 0
        self._wait_max = 0.0

    # --- members and control ------------------------------------------------------------

    def member(self, camera: str) -> BatchMember:
        """The executor for ``camera`` (the same object when asked again)."""
        if not isinstance(camera, str) or not camera:
            raise InvalidArgumentError(f"{self._where}: camera must be a non-empty string, got {camera!r}")
        m = self._members.get(camera)
        if m is None:
            m = self._members[camera] = BatchMember(self, camera)
        return m

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(self._members)

    def close(self) -> None:
        """Drops every frame still waiting for a batch (its ``execute`` raises
        ``FrameDropped("shutdown")``) and refuses new ones the same way. Batches already
        formed still run to their end."""
        self._closed = True
        while self._pending:
            req = self._pending.popleft()
            self._unwait(req)
            req.state = _GONE
            if not req.fut.done():
                self._dropped += 1
                req.fut.set_exception(FrameDropped("shutdown", f"{self._where}: closed while the frame of "
                                                               f"camera {req.camera!r} waited for a batch"))

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> Batcher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    # --- queueing and forming batches (plain functions: nothing here awaits) --------------

    def _rows(self, camera: str, inputs: Any) -> tuple[int, tuple[Any, ...]]:
        where = f"{self._where}: camera {camera!r}"
        if not isinstance(inputs, (list, tuple)) or not inputs:
            raise InvalidArgumentError(f"{where}: inputs must be a non-empty list of arrays, got {type(inputs).__name__}")
        bd = self.batch_dim
        rows = -1
        for j, x in enumerate(inputs):
            shape = getattr(x, "shape", None)
            if not isinstance(x, np.ndarray) or shape is None or len(shape) <= bd:
                raise InvalidArgumentError(
                    f"{where}: input {j} must be an array with batch dimension {bd}, got "
                    f"{type(x).__name__}{'' if shape is None else ' of shape ' + str(list(shape))}"
                    " (make the pre-process add it, e.g. frame.data[None])")
            if rows < 0:
                rows = shape[bd]
            elif shape[bd] != rows:
                raise InvalidArgumentError(f"{where}: input {j} has {shape[bd]} rows in batch dimension {bd}, "
                                           f"input 0 has {rows}")
        if rows < 1:
            raise InvalidArgumentError(f"{where}: inputs have no rows in batch dimension {bd}")
        if self.static_batch is not None and rows > self.static_batch:
            raise InvalidArgumentError(f"{where}: a frame of {rows} rows can't fit static_batch {self.static_batch}")
        kind = tuple((x.shape[:bd] + x.shape[bd + 1:], x.dtype) for x in inputs)
        return rows, kind

    def _unwait(self, req: _Request) -> None:
        if req.timer is not None:
            req.timer.cancel()
            req.timer = None
        n = self._waiting[req.camera] - 1
        if n:
            self._waiting[req.camera] = n
        else:
            del self._waiting[req.camera]

    def _ready(self) -> str | None:
        n = len(self._waiting)
        if n >= self.max_size:
            return "full"
        if n and n >= len(self._members):
            return "members"
        return None

    def _overdue(self, req: _Request) -> None:
        req.timer = None
        if req.state == _PENDING and not self._closed:
            self._dispatch("timeout")
            self._dispatch_ready()

    def _dispatch_ready(self) -> None:
        trigger = self._ready()
        while trigger is not None:
            if not self._dispatch(trigger):
                return
            trigger = self._ready()

    def _dispatch(self, trigger: str) -> bool:
        """Takes the next batch off the queue (oldest first, one frame per camera) and
        wakes its leader. False when nothing could be taken."""
        cap = self.static_batch
        taken: list[_Request] = []
        cameras: set[str] = set()
        rows = 0
        kind: Any = None
        keep: deque[_Request] = deque()
        now = self._loop.time() if self._loop is not None else 0.0
        for req in self._pending:
            if req.fut.done():  # its caller was cancelled and has not run yet: forget it here
                self._unwait(req)
                req.state = _GONE
            elif (len(taken) < self.max_size and req.camera not in cameras
                    and (cap is None or rows + req.rows <= cap) and (kind is None or req.kind == kind)):
                kind = req.kind
                taken.append(req)
                cameras.add(req.camera)
                rows += req.rows
            else:
                keep.append(req)
        self._pending = keep
        if not taken:
            return False
        batch = _Batch(taken, trigger)
        for req in taken:
            self._unwait(req)
            req.state = _BATCHED
            req.batch = batch
            wait = now - req.t_enqueue
            self._wait_sum += wait
            self._wait_n += 1
            if wait > self._wait_max:
                self._wait_max = wait
        self._triggers[trigger] += 1
        taken[0].fut.set_result(batch)  # the leader runs it
        return True

    def _abandon(self, req: _Request) -> None:
        """``req``'s caller was cancelled: take it out of wherever it is."""
        if req.state == _PENDING:
            self._pending.remove(req)
            self._unwait(req)
        elif req.state == _BATCHED and req.batch is not None and not req.batch.started:
            batch = req.batch
            batch.requests.remove(req)
            if req.fut.done() and not req.fut.cancelled() and req.fut.result() is batch:
                # the leader was cancelled before it started: another frame of the batch runs it
                for other in batch.requests:
                    if not other.fut.done():
                        other.fut.set_result(batch)
                        return

    # --- running a batch ------------------------------------------------------------------

    async def _execute(self, camera: str, inputs: list[Any]) -> Any:
        if self._closed:
            raise FrameDropped("shutdown", f"{self._where}: closed; frame of camera {camera!r} not batched")
        rows, kind = self._rows(camera, inputs)
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        req = _Request(camera, list(inputs), rows, kind, loop.create_future(), loop.time())
        self._pending.append(req)
        self._waiting[camera] = self._waiting.get(camera, 0) + 1
        req.timer = loop.call_later(self.max_wait_s, self._overdue, req)
        self._dispatch_ready()
        try:
            got = await req.fut
        except BaseException:
            self._abandon(req)
            raise
        if type(got) is _Batch:
            return await self._lead(got, req)
        return got

    async def _lead(self, batch: _Batch, me: _Request) -> Any:
        batch.started = True
        requests = [r for r in batch.requests if r is me or not r.fut.done()]
        for r in requests:
            r.state = _RUNNING
        bd = self.batch_dim
        good = requests
        first = requests[0]
        shapes = [x.shape for x in first.inputs]
        dtypes = [x.dtype for x in first.inputs]
        total = sum(r.rows for r in good)
        padded = total
        if self.static_batch is not None and total < self.static_batch:
            padded = self.static_batch
        batched: list[Any] = []
        for j in range(len(shapes)):
            parts = [r.inputs[j] for r in good]
            if padded > total:
                pad_shape = list(shapes[j])
                pad_shape[bd] = padded - total
                parts.append(np.zeros(pad_shape, dtypes[j]))
            batched.append(parts[0] if len(parts) == 1 else np.concatenate(parts, axis=bd))
        n = len(good)
        self._batches += 1
        self._frames += n
        self._sizes[n] = self._sizes.get(n, 0) + 1
        self._padded += padded - total
        self._running += 1
        try:
            with anyio.CancelScope(shield=True):  # the other cameras' frames are in this execute
                result = await self.executor.execute(batched)
        except Exception as exc:
            self._failed_batches += 1
            self._failed_frames += n
            cams = ", ".join(r.camera for r in good)
            code = exc.code if isinstance(exc, OrchestraError) else None
            _log.debug("batch failed", batch=self.name, size=n, error=f"{type(exc).__name__}: {exc}")
            mine: BaseException | None = None
            for r in good:
                err = BatchError(f"{self._where}: execute of {n} frames (cameras {cams}) failed: "
                                 f"{type(exc).__name__}: {exc}", code)
                err.__cause__ = exc
                if r is me:
                    mine = err
                elif not r.fut.done():
                    r.fut.set_exception(err)
            assert mine is not None
            raise mine from exc
        finally:
            self._running -= 1
        try:
            shares = self._split(result, good, padded)
        except OrchestraError as exc:
            for r in good:
                if r is not me and not r.fut.done():
                    r.fut.set_exception(OrchestraError(exc.message, exc.code))
            raise
        mine_value: Any = None
        for r, share in zip(good, shares):
            if r is me:
                mine_value = share
            elif not r.fut.done():
                r.fut.set_result(share)
        return mine_value

    def _split(self, result: Any, good: list[_Request], padded: int) -> list[Any]:
        detailed = hasattr(result, "outputs") and hasattr(result, "options")
        outputs = result.outputs if detailed else result
        if not isinstance(outputs, (list, tuple)):
            raise OrchestraError(f"{self._where}: the executor returned {type(outputs).__name__}, not a list of outputs",
                                 Error.InvalidType)
        bd = self.batch_dim
        lead = (slice(None),) * bd
        shares: list[Any] = []
        offset = 0
        for r in good:
            cut = lead + (slice(offset, offset + r.rows),)
            offset += r.rows
            part = [out[cut] if isinstance(out, np.ndarray) and out.ndim > bd and out.shape[bd] == padded else out
                    for out in outputs]
            if not detailed:
                shares.append(part)
            elif dataclasses.is_dataclass(result) and not isinstance(result, type):
                shares.append(dataclasses.replace(result, outputs=part))
            else:
                shares.append(BatchShare(part, result.options))
        return shares

    # --- observing ------------------------------------------------------------------------

    def statistics(self) -> BatchStatistics:
        """Batches, the batch-size histogram, waits and triggers so far."""
        return BatchStatistics(
            name=self.name,
            members=len(self._members),
            batches=self._batches,
            frames=self._frames,
            failed_batches=self._failed_batches,
            failed_frames=self._failed_frames,
            padded_rows=self._padded,
            dropped=self._dropped,
            pending=sum(1 for r in self._pending if not r.fut.done()),
            running=self._running,
            sizes=MappingProxyType(dict(sorted(self._sizes.items()))),
            triggers=MappingProxyType(dict(self._triggers)),
            mean_wait_s=self._wait_sum / self._wait_n if self._wait_n else 0.0,
            max_wait_s=self._wait_max,
        )

    def __repr__(self) -> str:
        return (f"Batcher({self.name!r}, max_size={self.max_size}, max_wait_s={self.max_wait_s}, "
                f"members={len(self._members)}, pending={len(self._pending)})")
