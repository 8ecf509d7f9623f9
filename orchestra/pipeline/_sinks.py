"""Where results go: the :class:`Sink` protocol, two in-memory sinks, and sinks that write
off the event loop (:class:`JsonlSink`, :class:`NpySink`; ``MqttSink`` lives in ``_mqtt``).

The writing sinks share one shape (:class:`ThreadedSink`): ``send`` hands the result to the
sink's own writer thread and awaits that frame's outcome, so a frame is ``processed`` only
once it was written (and a write error fails exactly that frame). The writer takes every
result waiting at once, writes them, flushes, and answers them with one loop wake-up.
"""

from __future__ import annotations

import asyncio
import collections
import datetime
import inspect
import json
import math
import os
import queue
import re
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import Error, InvalidArgumentError, OrchestraError
from ..telemetry import get_logger
from ._frame import Result

__all__ = [
    "CallbackSink",
    "CollectSink",
    "JsonlSink",
    "NpySink",
    "Sink",
    "SinkError",
    "ThreadedSink",
    "jsonable",
    "load_sink",
    "result_record",
    "sink_names",
]

_log = get_logger(__name__)


class SinkError(OrchestraError):
    """A sink could not take a frame (write failed, timed out, closed, backlog full): that
    frame is counted failed (stage ``sink``)."""

    default_code = Error.AccessFailed


@runtime_checkable
class Sink(Protocol):
    """Receives each processed frame's :class:`Result`, in frame order.

    A slow ``send`` holds its pipeline's worker, so frames queue up (and the drop policy
    decides) before the executor: a sink never needs its own buffer. A ``send`` that
    raises fails that frame (counted, stage ``sink``); the pipeline goes on. Optionally
    ``async aclose()``: called once when the run ends, after the last ``send``.
    """

    async def send(self, result: Result) -> None: ...


class CollectSink:
    """Keeps the last ``maxlen`` results (all of them with ``maxlen=None``) in ``results``."""

    def __init__(self, maxlen: int | None = None) -> None:
        self.results: collections.deque[Result] = collections.deque(maxlen=maxlen)

    async def send(self, result: Result) -> None:
        self.results.append(result)

    def __len__(self) -> int:
        return len(self.results)


class CallbackSink:
    """Calls ``fn(result)`` for each result; ``fn`` may be a plain or an ``async`` function."""

    def __init__(self, fn: Callable[[Result], Any] | Callable[[Result], Awaitable[Any]]) -> None:
        if not callable(fn):
            raise TypeError(f"CallbackSink needs a callable, got {fn!r}")
        self.fn = fn
        self._async = _is_async(fn)

    async def send(self, result: Result) -> None:
        if self._async:
            await self.fn(result)
        else:
            self.fn(result)


def _is_async(fn: Any) -> bool:
    """Whether calling ``fn`` returns a coroutine (decided once, not per frame)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


# --- JSON records --------------------------------------------------------------------------

def jsonable(value: Any, *, max_elements: int = 1024) -> Any:
    """``value`` as plain JSON data (strict JSON: no NaN or Infinity).

    numpy arrays of at most ``max_elements`` elements become (nested) lists; larger ones a
    summary ``{"shape": [...], "dtype": "float32"}``. numpy scalars become numbers, mappings
    objects with string keys, tuples/lists/sets lists, bytes a summary ``{"bytes": n}``.
    Non-finite floats become null. Anything else becomes its ``repr``.
    """
    t = type(value)  # exact-type fast paths first: a record is mostly these
    if t is str or t is bool or t is int or value is None:
        return value
    if t is float:
        return value if math.isfinite(value) else None
    if t is dict:
        return {k if type(k) is str else str(k): jsonable(v, max_elements=max_elements) for k, v in value.items()}
    if t is list or t is tuple:
        return [jsonable(v, max_elements=max_elements) for v in value]
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, np.ndarray):
        if value.size > max_elements or value.dtype.kind not in "biufcU":
            return {"shape": list(value.shape), "dtype": str(value.dtype)}
        if value.dtype.kind in "fc" and not np.isfinite(value).all():
            return _finite(value.tolist())
        if value.dtype.kind == "c":
            return _finite(value.tolist())
        return value.tolist()
    if isinstance(value, np.generic):
        return jsonable(value.item(), max_elements=max_elements)
    if isinstance(value, complex):
        return [_finite(value.real), _finite(value.imag)]
    if isinstance(value, Mapping):
        return {str(k): jsonable(v, max_elements=max_elements) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v, max_elements=max_elements) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"bytes": len(value)}
    return repr(value)


def _finite(x: Any) -> Any:
    if isinstance(x, list):
        return [_finite(v) for v in x]
    if isinstance(x, complex):
        return [_finite(x.real), _finite(x.imag)]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def result_record(result: Result, wall: float, *, max_elements: int = 1024) -> dict[str, Any]:
    """The record :class:`JsonlSink` writes and ``MqttSink`` publishes for one result:
    ``camera``, ``index``, ``pts`` (the source's timestamp, or null), ``time`` (``wall``,
    seconds since the epoch, as ISO-8601 UTC with its offset), ``latency_s`` (capture → sink),
    ``options`` (in force for its execute, or null) and ``value`` (see :func:`jsonable`)."""
    frame = result.frame
    return {
        "camera": frame.camera,
        "index": frame.index,
        "pts": frame.pts,
        "time": datetime.datetime.fromtimestamp(wall, datetime.timezone.utc).isoformat(),
        "latency_s": round(result.t_done - frame.t_capture, 9),
        "options": None if result.options is None else jsonable(result.options, max_elements=max_elements),
        "value": jsonable(result.value, max_elements=max_elements),
    }


def _dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


# --- the writer-thread base ----------------------------------------------------------------

def _positive(value: Any, what: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < float("inf")):
        raise InvalidArgumentError(f"{where}: {what} must be a positive number, got {value!r}")
    return float(value)


def _count(value: Any, what: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"{where}: {what} must be an int >= 1, got {value!r}")
    return value


_STOP: Any = object()


class ThreadedSink:
    """Base of the sinks that do their I/O on their own writer thread.

    ``send`` never blocks the event loop: it queues the result for the writer thread and
    awaits that frame's outcome (at most ``timeout_s``; a frame not written by then fails
    with :class:`SinkError`, and is skipped by the writer if it hasn't reached it yet).
    More than ``backlog`` frames waiting at once (a stuck writer shared by many cameras)
    fail at once instead of queueing. Subclasses implement :meth:`write_batch` (on the
    writer thread) and may override :meth:`open` / :meth:`close_io`.

    ``aclose()`` (or ``close()`` from a thread) writes what is queued, closes the files or
    connection and ends the thread (waiting at most ``close_timeout_s``); a closed sink
    fails every later frame.
    """

    def __init__(self, *, timeout_s: float = 5.0, backlog: int = 1024, close_timeout_s: float = 10.0) -> None:
        where = type(self).__name__
        self.timeout_s = _positive(timeout_s, "timeout_s", where)
        self.close_timeout_s = _positive(close_timeout_s, "close_timeout_s", where)
        self.backlog = _count(backlog, "backlog", where)
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._pending = 0
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._thread_lock = threading.Lock()
        self.written = 0  # frames written (writer thread)
        self.failures = 0  # frames that failed in write_batch (writer thread)

    # subclass hooks (writer thread) ------------------------------------------------------
    def write_batch(self, items: list[tuple[Result, float]]) -> list[BaseException | None]:
        """Writes ``(result, wall_time)`` items; returns one outcome per item (None = written)."""
        raise NotImplementedError

    def close_io(self) -> None:
        """Flushes and closes what the sink writes to (writer thread, after the last batch)."""

    # the loop side ------------------------------------------------------------------------
    async def send(self, result: Result) -> None:
        if self._closed:
            raise SinkError(f"{self!r} is closed")
        if self._pending >= self.backlog:
            raise SinkError(f"{self!r}: {self._pending} frames already wait to be written (backlog {self.backlog}); "
                            f"the writer is stuck or too slow")
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
            self._start()
        fut = loop.create_future()
        self._pending += 1
        self._queue.put((result, time.time(), fut))
        timer = loop.call_later(self.timeout_s, _expire, fut, self)
        try:
            await fut
        finally:
            self._pending -= 1
            timer.cancel()

    def _start(self) -> None:
        with self._thread_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._writer, name=f"orchestra-sink {self!r}", daemon=True)
                self._thread.start()

    def _writer(self) -> None:
        q = self._queue
        stop = False
        while not stop:
            items = [q.get()]
            while True:
                try:
                    items.append(q.get_nowait())
                except queue.Empty:
                    break
            batch = []
            futs = []
            for item in items:
                if item is _STOP:
                    stop = True
                    continue
                result, wall, fut = item
                if fut.done():  # timed out or cancelled before its turn: not written
                    continue
                batch.append((result, wall))
                futs.append(fut)
            if not batch:
                continue
            try:
                outcomes = self.write_batch(batch)
            except BaseException as exc:  # noqa: BLE001 - a writer must answer every frame
                outcomes = [exc] * len(batch)
            n_failed = sum(1 for o in outcomes if o is not None)
            self.failures += n_failed
            self.written += len(batch) - n_failed
            loop = self._loop
            if loop is not None and not loop.is_closed():
                try:
                    loop.call_soon_threadsafe(_answer, futs, outcomes)
                except RuntimeError:  # the loop closed meanwhile
                    pass
        try:
            self.close_io()
        except BaseException as exc:  # noqa: BLE001
            self._close_error = exc

    _close_error: BaseException | None = None

    def close(self, timeout_s: float | None = None) -> None:
        """Writes what is queued, closes the output and ends the writer thread (blocking).

        Raises:
            SinkError: closing the output failed, or the writer didn't finish in time.
        """
        self._closed = True
        with self._thread_lock:
            thread = self._thread
            if thread is None:
                self._thread = threading.current_thread()  # never start one now
        if thread is None:
            try:
                self.close_io()
            except Exception as exc:
                raise SinkError(f"{self!r}: closing failed: {type(exc).__name__}: {exc}") from exc
            return
        if thread is threading.current_thread():
            return
        self._queue.put(_STOP)
        thread.join(timeout_s)
        if thread.is_alive():
            raise SinkError(f"{self!r}: the writer did not finish within {timeout_s:g}s")
        if self._close_error is not None:
            exc = self._close_error
            raise SinkError(f"{self!r}: closing failed: {type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        """:meth:`close` on a thread, so the event loop goes on meanwhile."""
        import anyio.to_thread

        await anyio.to_thread.run_sync(self.close, self.close_timeout_s, abandon_on_cancel=True)


def _expire(fut: asyncio.Future[None], sink: ThreadedSink) -> None:
    if not fut.done():
        fut.set_exception(SinkError(f"{sink!r}: not written within timeout_s={sink.timeout_s:g}"))


def _answer(futs: list[asyncio.Future[None]], outcomes: list[BaseException | None]) -> None:
    for fut, outcome in zip(futs, outcomes):
        if fut.done():
            continue
        if outcome is None:
            fut.set_result(None)
        elif isinstance(outcome, SinkError):
            fut.set_exception(outcome)
        else:
            err = SinkError(f"{type(outcome).__name__}: {outcome}")
            err.__cause__ = outcome
            fut.set_exception(err)


# --- JSONL -----------------------------------------------------------------------------------

class JsonlSink(ThreadedSink):
    """One JSON object per line per processed frame (see :func:`result_record`), UTF-8.

    Args:
        path: the file; its folder must exist. Truncated when opened unless ``append``.
        append: add to an existing file instead.
        max_elements: arrays larger than this are written as ``{"shape", "dtype"}``.
        timeout_s, backlog, close_timeout_s: see :class:`ThreadedSink`.

    Several cameras may share one JsonlSink (lines never interleave). Each batch of lines is
    flushed to the OS before its frames count as processed.

    Raises:
        SinkError: the file can't be opened (the message names it).
    """

    def __init__(self, path: str | os.PathLike[str], *, append: bool = False, max_elements: int = 1024,
                 timeout_s: float = 5.0, backlog: int = 1024, close_timeout_s: float = 10.0) -> None:
        super().__init__(timeout_s=timeout_s, backlog=backlog, close_timeout_s=close_timeout_s)
        self.path = Path(path)
        self.max_elements = _count(max_elements, "max_elements", f"JsonlSink({str(self.path)!r})")
        try:
            self._file = open(self.path, "a" if append else "w", encoding="utf-8")  # noqa: SIM115
        except OSError as exc:
            raise SinkError(f"jsonl sink: can't open {str(self.path)!r}: {exc.strerror or exc}") from exc

    def write_batch(self, items: list[tuple[Result, float]]) -> list[BaseException | None]:
        outcomes: list[BaseException | None] = []
        lines = []
        for result, wall in items:
            try:
                lines.append(_dumps(result_record(result, wall, max_elements=self.max_elements)) + "\n")
                outcomes.append(None)
            except Exception as exc:  # a value json can't hold
                outcomes.append(SinkError(f"jsonl sink {str(self.path)!r}: camera {result.frame.camera!r} frame "
                                          f"{result.frame.index}: can't encode the result: {type(exc).__name__}: {exc}"))
        try:
            self._file.write("".join(lines))
            self._file.flush()
        except OSError as exc:
            err = SinkError(f"jsonl sink: writing {str(self.path)!r} failed: {exc.strerror or exc}")
            return [err if o is None else o for o in outcomes]
        return outcomes

    def close_io(self) -> None:
        self._file.close()

    def __repr__(self) -> str:
        return f"JsonlSink({str(self.path)!r})"


# --- NPY stacks ------------------------------------------------------------------------------

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")
_FRAMES_DTYPE = np.dtype([("index", "<i8"), ("pts", "<f8"), ("time", "<f8"), ("latency_s", "<f8")])
# a stack's header is written with room for this many rows, then rewritten in place
_MAX_ROWS = 10**15


class _NpyStack:
    """One growing ``.npy`` file: ``[rows, *shape]`` of one dtype, its header rewritten in
    place (same length) after every batch, so the file is always a valid .npy."""

    def __init__(self, path: Path, dtype: np.dtype[Any], shape: tuple[int, ...]) -> None:
        self.path = path
        self.dtype = dtype
        self.shape = shape
        self.rows = 0
        self._header_len = len(self._header(_MAX_ROWS, None))
        self._file = open(path, "wb")  # noqa: SIM115
        self._file.write(self._header(0, self._header_len))

    def _header(self, rows: int, length: int | None) -> bytes:
        d = repr({"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
                  "shape": (rows, *self.shape)})
        body = d.encode("latin1")
        # magic (6) + version (2) + header length (2) + dict + spaces + "\n", total % 64 == 0
        total = length if length is not None else -(-(10 + len(body) + 1) // 64) * 64
        pad = total - 10 - len(body) - 1
        return b"\x93NUMPY\x01\x00" + (total - 10).to_bytes(2, "little") + body + b" " * pad + b"\n"

    def append(self, array: np.ndarray) -> None:
        if array.shape != self.shape or array.dtype != self.dtype:
            raise SinkError(f"npy sink {str(self.path)!r}: row {self.rows} is {array.dtype} {list(array.shape)}, "
                            f"the file holds {self.dtype} {list(self.shape)}")
        self._file.write(np.ascontiguousarray(array).tobytes())
        self.rows += 1

    def commit(self) -> None:
        self._file.flush()
        os.pwrite(self._file.fileno(), self._header(self.rows, self._header_len), 0)

    def close(self) -> None:
        try:
            self.commit()
        finally:
            self._file.close()


class NpySink(ThreadedSink):
    """Arrays into growing ``.npy`` stacks, one set of files per camera in ``directory``.

    For camera ``C`` (its name with characters other than letters, digits, ``_.-`` made
    ``_``): ``C.out0.npy``, ``C.out1.npy``, ... hold the executor's outputs (``what =
    "outputs"``, the default) or ``C.value.npy`` the post-process value as an array
    (``what = "value"``), one row per processed frame; ``C.frames.npy`` (a structured array
    ``index, pts, time, latency_s``; ``pts`` NaN when the source has none, ``time`` seconds
    since the epoch) says which frame each row is. Load them with
    ``np.load(path, mmap_mode="r")``.

    Why stacks and not a file per frame: at 30 fps a camera makes 108,000 frames an hour,
    and one ``open``/``close`` per frame costs more than the write. A stack is one open file
    per output; its header is rewritten in place after each batch, so the file is a valid
    ``.npy`` at any moment (a crash loses at most the batch being written). Every row of a
    stack has the shape and dtype of the camera's first frame; a frame that differs fails
    (``SinkError``, stage ``sink``). Existing files of a camera are replaced.

    Raises:
        SinkError: ``directory`` can't be created.
    """

    def __init__(self, directory: str | os.PathLike[str], *, what: str = "outputs", timeout_s: float = 5.0,
                 backlog: int = 1024, close_timeout_s: float = 10.0) -> None:
        super().__init__(timeout_s=timeout_s, backlog=backlog, close_timeout_s=close_timeout_s)
        self.directory = Path(directory)
        if what not in ("outputs", "value"):
            raise InvalidArgumentError(f"NpySink({str(self.directory)!r}): what must be 'outputs' or 'value', got {what!r}")
        self.what = what
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SinkError(f"npy sink: can't create the folder {str(self.directory)!r}: {exc.strerror or exc}") from exc
        self._stacks: dict[str, list[_NpyStack]] = {}  # camera -> [frames, out0, out1, ...]
        self._stems: dict[str, str] = {}  # file stem -> camera

    def files(self) -> dict[str, list[Path]]:
        """camera -> the files written for it so far (frames first)."""
        return {cam: [s.path for s in stacks] for cam, stacks in self._stacks.items()}

    def _arrays(self, result: Result) -> list[np.ndarray]:
        if self.what == "value":
            arrays = [np.asarray(result.value)]
        else:
            arrays = [np.asarray(o) for o in result.outputs]
        for i, a in enumerate(arrays):
            if a.dtype.hasobject:
                name = "value" if self.what == "value" else f"output {i}"
                raise SinkError(f"npy sink {str(self.directory)!r}: camera {result.frame.camera!r}: {name} is not a "
                                f"numeric array ({type(result.value if self.what == 'value' else result.outputs[i]).__name__})")
        return arrays

    def _open(self, camera: str, arrays: list[np.ndarray]) -> list[_NpyStack]:
        stem = _SAFE.sub("_", camera) or "_"
        if self._stems.get(stem, camera) != camera:
            stem = f"{stem}-{len(self._stems)}"
        self._stems[stem] = camera
        d = self.directory
        names = ["value"] if self.what == "value" else [f"out{i}" for i in range(len(arrays))]
        stacks = [_NpyStack(d / f"{stem}.frames.npy", _FRAMES_DTYPE, ())]
        stacks += [_NpyStack(d / f"{stem}.{n}.npy", a.dtype, a.shape) for n, a in zip(names, arrays)]
        return stacks

    def write_batch(self, items: list[tuple[Result, float]]) -> list[BaseException | None]:
        outcomes: list[BaseException | None] = []
        touched: dict[int, _NpyStack] = {}
        for result, wall in items:
            frame = result.frame
            try:
                arrays = self._arrays(result)
                stacks = self._stacks.get(frame.camera)
                if stacks is None:
                    stacks = self._stacks[frame.camera] = self._open(frame.camera, arrays)
                if len(arrays) != len(stacks) - 1:
                    raise SinkError(f"npy sink {str(self.directory)!r}: camera {frame.camera!r} frame {frame.index} has "
                                    f"{len(arrays)} outputs, its first frame had {len(stacks) - 1}")
                for stack, a in zip(stacks[1:], arrays):  # check every shape before writing any row
                    if a.shape != stack.shape or a.dtype != stack.dtype:
                        raise SinkError(f"npy sink {str(stack.path)!r}: camera {frame.camera!r} frame {frame.index} is "
                                        f"{a.dtype} {list(a.shape)}, the file holds {stack.dtype} {list(stack.shape)}")
                row = np.array((frame.index, np.nan if frame.pts is None else frame.pts, wall,
                                result.t_done - frame.t_capture), _FRAMES_DTYPE)
                for stack, a in zip(stacks, [row, *arrays]):
                    stack.append(a)
                    touched[id(stack)] = stack
                outcomes.append(None)
            except SinkError as exc:
                outcomes.append(exc)
            except OSError as exc:
                outcomes.append(SinkError(f"npy sink {str(self.directory)!r}: camera {frame.camera!r} frame "
                                          f"{frame.index}: {exc.strerror or exc}"))
        try:
            for stack in touched.values():
                stack.commit()
        except OSError as exc:
            err = SinkError(f"npy sink {str(self.directory)!r}: writing failed: {exc.strerror or exc}")
            return [err if o is None else o for o in outcomes]
        return outcomes

    def close_io(self) -> None:
        errors = []
        for stacks in self._stacks.values():
            for stack in stacks:
                try:
                    stack.close()
                except OSError as exc:
                    errors.append(f"{stack.path}: {exc.strerror or exc}")
        if errors:
            raise SinkError(f"npy sink {str(self.directory)!r}: closing failed: {'; '.join(errors)}")

    def __repr__(self) -> str:
        return f"NpySink({str(self.directory)!r})"


# --- by name -------------------------------------------------------------------------------

def sink_names() -> tuple[str, ...]:
    """The built-in sink kinds (besides ``"module:attr"``)."""
    return ("jsonl", "mqtt", "npy")


def sink_class_problem(obj: Any) -> str | None:
    """Why ``obj`` (what a ``"module:attr"`` sink names) may not be used, or None: it must
    be a class with ``send``; other callables are never called."""
    if not isinstance(obj, type):
        return "not a class: 'module:attr' must name a sink class (one with send(result))"
    if not callable(getattr(obj, "send", None)):
        return "which is not a sink class (it has no send(result))"
    return None


def load_sink(spec: str, **params: Any) -> Any:
    """A sink by kind: ``load_sink("jsonl", path="out.jsonl")``, ``load_sink("npy",
    directory="out")``, ``load_sink("mqtt", host="127.0.0.1", topic="cams/{camera}")``, or
    ``"module:attr"`` naming a sink class (with ``send``), built with ``params`` (importing
    ``module`` runs its code).

    Raises:
        NotFoundError: an unknown kind, module or attribute (or paho-mqtt missing).
        ConfigError: the class is not a sink class, or its module failed to import.
        InvalidArgumentError: ``params`` don't fit (the message names them), or a value is bad.
        SinkError: the output can't be opened.
    """
    from ._plugin import construct, import_attr

    if not isinstance(spec, str) or not spec:
        raise InvalidArgumentError(f"sink kind must be one of {', '.join(sink_names())} or 'module:attr', got {spec!r}")
    cls: Any
    if spec == "jsonl":
        cls = JsonlSink
    elif spec == "npy":
        cls = NpySink
    elif spec == "mqtt":
        from ._mqtt import MqttSink

        cls = MqttSink
    elif ":" in spec:
        from ..errors import ConfigError

        cls = import_attr(spec, "sink")
        problem = sink_class_problem(cls)
        if problem is not None:
            raise ConfigError(f"sink {spec!r} is {cls!r}, {problem}")
    else:
        from ..errors import NotFoundError

        raise NotFoundError(f"no sink kind {spec!r} (kinds: {', '.join(sink_names())}; or 'module:attr')")
    return construct(cls, spec, "sink", params)
