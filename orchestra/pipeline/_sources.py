"""Frame sources: the :class:`Source` protocol, a synthetic camera, ``.npy``/raw files, and
the ``orchestra.sources`` registry for real cameras."""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import AsyncIterator, Callable
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import anyio
import anyio.lowlevel
import numpy as np

from ..errors import ConfigError, Error, InvalidArgumentError, NotFoundError
from ._frame import Frame
from ._plugin import import_attr

__all__ = [
    "ENTRY_POINT_GROUP",
    "FramesFile",
    "Source",
    "SyntheticCamera",
    "load_source",
    "register_source",
    "source_names",
]

ENTRY_POINT_GROUP = "orchestra.sources"

Clock = Callable[[], float]


@runtime_checkable
class Source(Protocol):
    """Anything that yields frames: ``name`` and ``frames()``.

    ``frames()`` returns an async iterator of :class:`Frame` (an ``async def`` generator is
    the easy way); it ends when the source has no more frames. A live source must not wait
    for its consumer: the pipeline takes each frame at once unless it runs in ``block``
    mode. A source may have a ``clock`` attribute (a ``() -> float`` of seconds) giving the
    scale of ``Frame.t_capture``; the pipeline measures latency with it (default
    ``time.monotonic``).

    Backpressure: in ``block`` mode, when the pipeline had to wait to queue a frame, it
    resumes an async generator with ``asend(seconds_waited)`` instead of ``__anext__()``, so
    ``held = yield frame`` tells a paced source to slip its schedule (None otherwise).
    """

    name: str

    def frames(self) -> AsyncIterator[Frame]: ...


async def _paced(name: str, fps: float | None, count: int | None, clock: Clock,
                 data: Callable[[int], np.ndarray]) -> AsyncIterator[Frame]:
    """Frames 0, 1, ... (``count`` of them, or forever): frame k due at t0 + k/fps.

    Late wake-ups (a busy event loop, a slow consumer) produce the frames due at once, with
    their scheduled times. Backpressure slips the schedule instead: a ``block`` pipeline
    sends, as the value of ``yield``, the seconds its put waited, and the part of that wait
    past the next due time moves the schedule. ``fps=None``: as fast as the consumer takes
    them, one checkpoint per frame.
    """
    k = 0
    if fps is None:
        while count is None or k < count:
            await anyio.lowlevel.checkpoint()
            yield Frame(name, k, data(k), clock())
            k += 1
        return
    period = 1.0 / fps
    t0 = clock()
    while count is None or k < count:
        due = t0 + k * period
        now = clock()
        if due > now:
            await anyio.sleep(due - now)
            now = clock()
        # stamped with its due time; if the timer fired early (uvloop's timers have
        # millisecond granularity) with the time it was actually made, never a future time
        held = yield Frame(name, k, data(k), due if now >= due else now)
        k += 1
        if held:  # seconds a block-mode pipeline held us back
            t_back = clock()
            nxt = t0 + k * period
            if t_back > nxt:
                t0 += t_back - max(nxt, t_back - held)


def _check_fps(fps: float | None, where: str, optional: bool) -> float | None:
    if fps is None and optional:
        return None
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not (0 < fps < float("inf")):
        raise InvalidArgumentError(f"{where}: fps must be a positive number{' or None' if optional else ''}, got {fps!r}")
    return float(fps)


def _check_count(count: int | None, where: str) -> int | None:
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 0):
        raise InvalidArgumentError(f"{where}: count must be an int >= 0 or None, got {count!r}")
    return count


def _check_dtype(dtype: Any, where: str) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise InvalidArgumentError(f"{where}: dtype {dtype!r} is not a numpy dtype: {exc}") from None
    return dt


def _check_shape(shape: Any, where: str) -> tuple[int, ...]:
    try:
        shp = tuple(int(s) for s in shape) if not isinstance(shape, int) else (int(shape),)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{where}: shape must be a tuple of ints, got {shape!r}") from None
    if any(s < 1 for s in shp):
        raise InvalidArgumentError(f"{where}: every dimension of shape must be >= 1, got {shape!r}")
    return shp


class SyntheticCamera:
    """A deterministic camera: frame k's pixels depend only on ``seed`` and k.

    It runs on its own schedule: frame k is due at ``t0 + k / fps`` (t0: when ``frames()``
    starts), ``t_capture`` is that due time (or the moment it was made, if the loop's timer
    woke up early: never a time in the future). A consumer that is late doesn't slow it down
    (frames are produced on schedule and the pipeline's drop policy decides); only
    backpressure (a ``block`` pipeline holding it) slips the schedule. Frame data is a
    rotation of a seeded base pattern plus an index-dependent offset: one numpy operation and
    a fresh array per frame.

    Args:
        name: the camera's name (``Frame.camera``).
        fps: frames per second.
        shape: one frame's shape.
        dtype: an integer or floating dtype (integers: base values 0..255 plus index % 256,
            wrapping in the dtype).
        seed: the pattern's seed.
        clock: a ``() -> float`` seconds function (default ``time.monotonic``); sleeps are
            ``due - clock()`` seconds of real time.
        count: stop after this many frames (None: never).
    """

    def __init__(self, name: str, fps: float, shape: tuple[int, ...] | int, dtype: Any = np.float32,
                 seed: int = 0, clock: Clock | None = None, *, count: int | None = None) -> None:
        where = f"SyntheticCamera {name!r}"
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"SyntheticCamera: name must be a non-empty string, got {name!r}")
        self.name = name
        self.fps: float = _check_fps(fps, where, optional=False)  # type: ignore[assignment]
        self.shape = _check_shape(shape, where)
        self.dtype = _check_dtype(dtype, where)
        if self.dtype.kind not in "iuf":
            raise InvalidArgumentError(f"{where}: dtype must be an integer or floating type, got {self.dtype}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise InvalidArgumentError(f"{where}: seed must be an int, got {seed!r}")
        self.seed = seed
        self.clock: Clock = clock if clock is not None else time.monotonic
        self.count = _check_count(count, where)
        rng = np.random.default_rng(seed)
        n = int(np.prod(self.shape))
        if self.dtype.kind == "f":
            base = rng.random(n).astype(self.dtype)
        else:
            base = rng.integers(0, 256, n).astype(self.dtype)
        self._n = n
        self._base2 = np.concatenate([base, base])  # frame k: a window of this, plus an offset
        self._base2.flags.writeable = False
        self._offsets = None if self.dtype.kind == "f" else np.arange(256).astype(self.dtype)  # wraps

    def frame_data(self, index: int) -> np.ndarray:
        """Frame ``index``'s pixels (a new array; the same for the same seed and index)."""
        n = self._n
        r = index % n
        if self._offsets is None:
            off: Any = (index * 0.6180339887498949) % 1.0
        else:
            off = self._offsets[index % 256]
        return (self._base2[r:r + n] + off).reshape(self.shape)

    def frames(self) -> AsyncIterator[Frame]:
        """Frames on the camera's schedule (see the class docstring)."""
        return _paced(self.name, self.fps, self.count, self.clock, self.frame_data)

    def __repr__(self) -> str:
        return f"SyntheticCamera({self.name!r}, fps={self.fps:g}, shape={self.shape}, dtype={self.dtype}, seed={self.seed})"


class FramesFile:
    """Frames from a file, memory-mapped: ``.npy`` (a stack ``[N, *frame_shape]``) or raw
    (``.raw``/``.bin``: frames of ``shape``/``dtype`` back to back, no header).

    Frames are read-only views into the mapping (zero copy). ``fps=None`` yields frames as
    fast as the consumer takes them (meant for ``block`` pipelines); with ``fps`` they come
    on a schedule as :class:`SyntheticCamera`'s. ``loop=True`` starts over at the end (the
    frame index keeps counting up).

    Raises:
        NotFoundError: the file doesn't exist.
        InvalidArgumentError: the file can't be read as frames (the message names the file
            and says why), or the parameters are wrong.
    """

    RAW_SUFFIXES = (".raw", ".bin")

    def __init__(self, path: str | os.PathLike[str], fps: float | None = None, loop: bool = False, *,
                 shape: tuple[int, ...] | None = None, dtype: Any = None, name: str | None = None,
                 clock: Clock | None = None) -> None:
        self.path = Path(path)
        where = f"frames file {str(self.path)!r}"
        self.name = name if name is not None else self.path.stem
        if not isinstance(self.name, str) or not self.name:
            raise InvalidArgumentError(f"{where}: name must be a non-empty string, got {name!r}")
        self.fps = _check_fps(fps, where, optional=True)
        self.loop = bool(loop)
        self.clock: Clock = clock if clock is not None else time.monotonic
        if not self.path.exists():
            raise NotFoundError(f"{where}: no such file")
        if not self.path.is_file():
            raise InvalidArgumentError(f"{where}: not a regular file", Error.AccessFailed)
        suffix = self.path.suffix.lower()
        if suffix == ".npy":
            self._frames = self._open_npy(where, shape, dtype)
        elif suffix in self.RAW_SUFFIXES:
            self._frames = self._open_raw(where, shape, dtype)
        else:
            raise InvalidArgumentError(
                f"{where}: unsupported file type {suffix or '(no suffix)'!r} (expected .npy, or "
                f"{' / '.join(self.RAW_SUFFIXES)} with shape= and dtype=)"
            )

    def _open_npy(self, where: str, shape: Any, dtype: Any) -> np.ndarray:
        try:
            arr = np.load(self.path, mmap_mode="r", allow_pickle=False)
        except PermissionError as exc:
            raise InvalidArgumentError(f"{where}: can't read: {exc.strerror}", Error.AccessFailed) from None
        except (ValueError, OSError, EOFError) as exc:
            raise InvalidArgumentError(f"{where}: not a readable .npy array: {exc}") from None
        if not isinstance(arr, np.ndarray):
            raise InvalidArgumentError(f"{where}: not a single .npy array")
        if arr.dtype.hasobject or arr.dtype.kind not in "biufc":
            raise InvalidArgumentError(f"{where}: frames must be numeric, the array holds {arr.dtype}")
        if arr.ndim < 2:
            raise InvalidArgumentError(
                f"{where}: expected a stack of frames [N, *frame_shape] (2 or more dimensions), got shape {arr.shape}"
            )
        if arr.shape[0] == 0:
            raise InvalidArgumentError(f"{where}: holds no frames (shape {arr.shape})")
        if shape is not None and _check_shape(shape, where) != arr.shape[1:]:
            raise InvalidArgumentError(f"{where}: frames have shape {arr.shape[1:]}, expected {tuple(shape)}")
        if dtype is not None and _check_dtype(dtype, where) != arr.dtype:
            raise InvalidArgumentError(f"{where}: frames have dtype {arr.dtype}, expected {np.dtype(dtype)}")
        return arr

    def _open_raw(self, where: str, shape: Any, dtype: Any) -> np.ndarray:
        if shape is None or dtype is None:
            raise InvalidArgumentError(f"{where}: a raw file needs shape= (one frame's) and dtype=")
        shp = _check_shape(shape, where)
        dt = _check_dtype(dtype, where)
        if dt.hasobject or dt.itemsize == 0:
            raise InvalidArgumentError(f"{where}: dtype {dt} can't be read from raw bytes")
        frame_bytes = int(np.prod(shp)) * dt.itemsize
        try:
            size = self.path.stat().st_size
        except OSError as exc:
            raise InvalidArgumentError(f"{where}: can't stat: {exc.strerror}", Error.AccessFailed) from None
        if size == 0:
            raise InvalidArgumentError(f"{where}: empty file, holds no frames")
        if size % frame_bytes:
            raise InvalidArgumentError(
                f"{where}: size {size} bytes is not a multiple of one frame ({shp} {dt} = {frame_bytes} bytes)"
            )
        try:
            return np.memmap(self.path, dtype=dt, mode="r", shape=(size // frame_bytes, *shp))
        except (ValueError, OSError) as exc:
            raise InvalidArgumentError(f"{where}: can't map: {exc}", Error.AccessFailed) from None

    def __len__(self) -> int:
        """Frames in the file."""
        return int(self._frames.shape[0])

    @property
    def frame_shape(self) -> tuple[int, ...]:
        return tuple(self._frames.shape[1:])

    @property
    def dtype(self) -> np.dtype:
        return self._frames.dtype

    def frame_data(self, index: int) -> np.ndarray:
        """Frame ``index`` (modulo the file's length): a read-only view."""
        return np.asarray(self._frames[index % len(self)])

    def frames(self) -> AsyncIterator[Frame]:
        """The file's frames (forever with ``loop=True``)."""
        return _paced(self.name, self.fps, None if self.loop else len(self), self.clock, self.frame_data)

    def __repr__(self) -> str:
        return (f"FramesFile({str(self.path)!r}, frames={len(self)}, shape={self.frame_shape}, dtype={self.dtype}, "
                f"fps={self.fps}, loop={self.loop})")


# --- the registry: built-ins, register_source, and the orchestra.sources entry points ----

_FACTORIES: dict[str, Callable[..., Any]] = {}
_ENTRY_POINTS: dict[str, EntryPoint] = {}
_discovered = False


def register_source(name: str, factory: Callable[..., Any]) -> None:
    """Registers a source factory (a class, or a callable returning a :class:`Source`).

    Raises:
        InvalidArgumentError: a bad name, a factory that isn't callable, or a name taken.
    """
    if not isinstance(name, str) or not name or ":" in name:
        raise InvalidArgumentError(f"source name must be a non-empty string without ':', got {name!r}")
    if not callable(factory):
        raise InvalidArgumentError(f"source {name!r}: the factory must be callable, got {factory!r}")
    if name in _FACTORIES:
        raise InvalidArgumentError(f"source {name!r} is already registered ({_FACTORIES[name]!r})")
    _FACTORIES[name] = factory


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    _discovered = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in _FACTORIES:
            _ENTRY_POINTS.setdefault(ep.name, ep)


def source_names() -> tuple[str, ...]:
    """Every registered source name (built-ins and the ``orchestra.sources`` entry points)."""
    _discover()
    return tuple(sorted(set(_FACTORIES) | set(_ENTRY_POINTS)))


def _factory(spec: str) -> Callable[..., Any]:
    _discover()
    if spec in _FACTORIES:
        return _FACTORIES[spec]
    ep = _ENTRY_POINTS.get(spec)
    if ep is not None:
        try:
            factory = ep.load()
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            raise NotFoundError(f"source {spec!r}: entry point in group {ENTRY_POINT_GROUP!r} ({ep.value}) failed "
                                f"to load: {type(exc).__name__}: {exc}") from exc
        if not callable(factory):
            raise ConfigError(f"source {spec!r}: entry point {ep.value} is {factory!r}, not a factory")
        _FACTORIES.setdefault(spec, factory)
        del _ENTRY_POINTS[spec]
        return _FACTORIES[spec]
    if ":" not in spec:
        raise NotFoundError(f"source {spec!r} is not registered (registered: {', '.join(source_names())}; "
                            f"or give 'module:attr')")
    obj: Any = import_attr(spec, "source")
    problem = module_attr_problem(obj)
    if problem is not None:
        raise ConfigError(f"source {spec!r} is {obj!r}, {problem}")
    return obj


def module_attr_problem(obj: Any) -> str | None:
    """Why ``obj`` (what a config's ``"module:attr"`` names) may not be called as a source
    factory, or None. Only a class with a callable ``frames`` is called: a config file must
    not be able to call ``os:system`` (registered factories may be any callable)."""
    if not isinstance(obj, type):
        return "not a class: 'module:attr' must name a source class (one with frames()); other callables are never called"
    if not callable(getattr(obj, "frames", None)):
        return "which is not a source class (it has no frames())"
    return None


def load_source(spec: str, **params: Any) -> Source:
    """Builds a source from a registered name or ``"module:attr"``, calling its factory with
    ``params``: ``load_source("synthetic", name="cam0", fps=30, shape=(480, 640, 3))``,
    ``load_source("file", path="clip.npy", fps=30)``, or any name a package registers in the
    ``orchestra.sources`` entry-point group (a real camera; see the package README).
    ``module:attr`` imports ``module`` (running its code) and must name a class with
    ``frames()``; any other callable it names is refused without being called.

    Raises:
        NotFoundError: unknown name or module, or an entry point that fails to load.
        ConfigError: what the name leads to isn't a source factory, or doesn't make a source.
        InvalidArgumentError: ``params`` don't fit the factory (the message names them), or
            the source rejected a value.
    """
    if not isinstance(spec, str) or not spec:
        raise InvalidArgumentError(f"source spec must be a registered name or 'module:attr', got {spec!r}")
    factory = _factory(spec)
    try:
        inspect.signature(factory).bind(**params)
    except TypeError as exc:
        raise InvalidArgumentError(f"source {spec!r}: bad parameters {sorted(params)}: {exc}") from None
    except ValueError:  # no signature to check against
        pass
    source = factory(**params)
    if not callable(getattr(source, "frames", None)) or not isinstance(getattr(source, "name", None), str):
        raise ConfigError(f"source {spec!r}: {factory!r} made {source!r}, which has no name and frames()")
    return source


register_source("synthetic", SyntheticCamera)
register_source("file", FramesFile)
