"""Video sources on PyAV (FFmpeg's libraries): files, RTSP/HTTP streams and V4L2 devices,
decoded and pre-processed on a thread of their own, with reconnection for live sources."""

from __future__ import annotations

import asyncio
import math
import os
import stat
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio


from ..errors import Error, InvalidArgumentError, NotFoundError, OrchestraError
from ..telemetry import get_logger
from ._frame import Frame
from ._pipeline import SourceError
from ._pre import MAX_IMAGE_SIDE, Preprocess
from ._sources import register_source

__all__ = ["MAX_FRAME_SIDE", "ReconnectPolicy", "VideoSource", "VideoSourceStatistics"]

_log = get_logger(__name__)

MAX_FRAME_SIDE = MAX_IMAGE_SIDE
"""The largest frame width or height (pixels) a :class:`VideoSource` accepts from a stream
(8192): a stream announcing or decoding a bigger frame is an error, checked before orchestra
allocates anything for the frame."""

_LIVE_SCHEMES = ("rtsp://", "rtsps://", "rtmp://", "rtmps://", "http://", "https://", "udp://", "tcp://",
                 "srt://", "rtp://")
_EXTRA_HINT = "pip install 'orchestra[video]'"


def _import_av() -> Any:
    try:
        import av
    except ImportError as exc:
        raise NotFoundError(f"video sources need PyAV (the 'video' extra): {_EXTRA_HINT} ({exc})") from None
    return av


@dataclass(frozen=True, slots=True)
class ReconnectPolicy:
    """How a live source reconnects after an error or the end of its stream: wait
    ``initial_s``, then ``factor`` times longer after each failed attempt, at most ``max_s``;
    give up (the source raises :class:`SourceError`) after ``max_attempts`` failed attempts in
    a row (None: never). A connection that delivered a frame resets the backoff."""

    initial_s: float = 0.5
    max_s: float = 10.0
    factor: float = 2.0
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        for name in ("initial_s", "max_s", "factor"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise InvalidArgumentError(f"reconnect: {name} must be a finite number >= 0, got {v!r}")
        if self.factor < 1:
            raise InvalidArgumentError(f"reconnect: factor must be >= 1, got {self.factor!r}")
        if self.max_s < self.initial_s:
            raise InvalidArgumentError(f"reconnect: max_s ({self.max_s}) must be >= initial_s ({self.initial_s})")
        m = self.max_attempts
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise InvalidArgumentError(f"reconnect: max_attempts must be an int >= 1 or None, got {m!r}")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before attempt ``attempt`` (0 = the first retry)."""
        return min(self.max_s, self.initial_s * self.factor ** min(attempt, 64))


@dataclass(frozen=True, slots=True)
class VideoSourceStatistics:
    """A :class:`VideoSource`'s counters.

    Attributes:
        uri: what it reads.
        kind: ``"file"``, ``"stream"`` or ``"device"``.
        state: ``"idle"``, ``"connecting"``, ``"streaming"``, ``"reconnecting"``, ``"done"``
            or ``"failed"``.
        frames: frames handed to the pipeline.
        decoded: frames decoded (more than ``frames`` only when the source stopped with
            frames still in its hand-off queue).
        connects: successful opens (a file's loop restarts count too).
        reconnects: successful opens after a lost connection (live sources).
        disconnects: connections lost (an error or the end of a live stream).
        failed_attempts: opens that failed.
        loops: restarts of a looping file.
        gap_s: seconds without a connection, between losing one and the next open.
        width / height / codec: of the last stream opened (0 / 0 / "" before).
        last_error: the last error seen, as ``"Type: message"``, or None.
    """

    uri: str
    kind: str
    state: str
    frames: int
    decoded: int
    connects: int
    reconnects: int
    disconnects: int
    failed_attempts: int
    loops: int
    gap_s: float
    width: int
    height: int
    codec: str
    last_error: str | None


class _Handoff:
    """Decoder thread → event loop: a bounded deque; the thread waits for a free slot, the
    loop is woken with ``call_soon_threadsafe`` (one per item)."""

    def __init__(self, capacity: int, loop: asyncio.AbstractEventLoop) -> None:
        self._items: deque[Any] = deque()
        self._slots = threading.Semaphore(capacity)
        self._loop = loop
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: Any, stop: threading.Event) -> float | None:
        """Thread side: queues ``item``; returns the seconds spent waiting for room, or None
        when ``stop`` was set first (the item is not queued)."""
        t = time.monotonic()
        while not self._slots.acquire(timeout=0.05):
            if stop.is_set():
                return None
        self._items.append(item)
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            stop.set()
            return None
        return time.monotonic() - t

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def get(self) -> Any:
        while not self._items:
            self._waiter = self._loop.create_future()
            await self._waiter
        self._waiter = None
        item = self._items.popleft()
        self._slots.release()
        return item

    def __len__(self) -> int:
        return len(self._items)


_END = object()


class _Stopped(Exception):
    pass


def _classify(uri: str) -> str:
    if uri.startswith("/dev/video"):
        return "device"
    lower = uri.lower()
    if lower.startswith(_LIVE_SCHEMES):
        return "stream"
    return "file"


class VideoSource:
    """Frames from a video file, an RTSP/HTTP stream or a V4L2 device, decoded by PyAV on a
    thread of its own (one per source, started by :meth:`frames`, stopped when the iteration
    ends or is cancelled); the event loop only receives finished frames.

    ``Frame.data`` is the decoded picture as RGB ``uint8`` ``[H, W, 3]``, or, with ``pre``, what
    the pre-process made (a :class:`Preprocess`: the resize is done by FFmpeg's scaler on the
    decoder thread, the rest in numpy on that thread; the result has no batch dimension; any
    other callable gets the RGB image, on the decoder thread). ``Frame.pts`` is the stream's
    own timestamp in seconds, strictly increasing per source: across the restarts of a looping
    file (each pass continues where the last ended) and across reconnects of a live source
    (continuing after the wall-clock length of the gap). ``Frame.t_capture`` is
    ``time.monotonic()`` when the frame was decoded (a paced file: when it was due).

    What ``uri`` is:

    - ``/dev/videoN``: a V4L2 device (must exist as a character device; ``options`` such as
      ``{"video_size": "640x480", "framerate": "30", "input_format": "mjpeg"}`` go to FFmpeg);
    - ``rtsp://``, ``rtsps://``, ``http(s)://``, ``rtmp://``, ``udp://``, ``tcp://``,
      ``srt://``, ``rtp://``: a live stream (RTSP over TCP unless ``options`` say
      ``rtsp_transport``);
    - anything else: a file path (``file:`` prefix allowed), which must exist.

    Files: ``realtime=True`` paces them by their own pts (or ``fps``: frame k due at k/fps
    after the start); ``realtime=False`` decodes as fast as the consumer takes them (use a
    ``block`` pipeline). ``loop=True`` starts over at the end. Live streams and devices come
    at their own rate and reconnect with ``reconnect``'s backoff after an error or the end of
    the stream; a file that fails to open or decode raises. ``live=`` overrides the guess
    from the uri (e.g. ``live=False`` for an HTTP link to a file).

    Frames are never produced during a gap, so nothing is counted as dropped for it; the gap
    shows in :meth:`statistics` (``disconnects``, ``reconnects``, ``gap_s``) and in the
    ``video.disconnected`` / ``video.connected`` structlog events.

    Args:
        name: the camera's name (``Frame.camera``).
        uri: see above.
        loop: files: start over at the end.
        realtime: files: pace frames by their timestamps (True) or not.
        fps: files: pace at this rate instead of by the timestamps.
        reconnect: live sources' :class:`ReconnectPolicy` (or a mapping of its fields).
        pre: a :class:`Preprocess` (or a mapping of its fields), a callable taking the RGB
            image, or None.
        options: FFmpeg options for opening ``uri`` (strings).
        format: FFmpeg's input format name (``"v4l2"`` is used for ``/dev/video*``).
        live: override the live/file guess.
        queue: frames decoded ahead of the consumer (the hand-off's bound).
        timeout_s: seconds an open or a read may block before it counts as an error.
        decoder_threads: FFmpeg decoder threads per source (1: orchestra owns the CPUs).
        count: stop after this many frames (None: never).

    Raises:
        NotFoundError: PyAV is missing (the message says ``pip install 'orchestra[video]'``),
            the file or the device doesn't exist.
        InvalidArgumentError: a parameter is wrong (the message names it and the uri).
    """

    def __init__(self, name: str, uri: str | os.PathLike[str], *, loop: bool = False, realtime: bool = True,
                 fps: float | None = None, reconnect: ReconnectPolicy | Mapping[str, Any] | None = None,
                 pre: Preprocess | Mapping[str, Any] | Callable[[Any], Any] | None = None,
                 options: Mapping[str, Any] | None = None, format: str | None = None, live: bool | None = None,
                 queue: int = 4, timeout_s: float = 5.0, decoder_threads: int = 1, count: int | None = None) -> None:
        if isinstance(uri, os.PathLike):
            uri = os.fspath(uri)
        if not isinstance(uri, str) or not uri:
            raise InvalidArgumentError(f"video source {name!r}: uri must be a non-empty string or path, got {uri!r}")
        self.uri = uri
        where = f"video source {name!r} ({uri!r})"
        self._where = where
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"{where}: name must be a non-empty string, got {name!r}")
        self.name = name
        self.clock: Callable[[], float] = time.monotonic
        self._av = _import_av()
        kind = _classify(uri)
        path = uri[5:] if kind == "file" and uri.startswith("file:") else uri
        if kind == "device":
            try:
                st = os.stat(path)
            except FileNotFoundError:
                raise NotFoundError(f"{where}: no such V4L2 device {path!r}") from None
            except OSError as exc:
                raise InvalidArgumentError(f"{where}: can't stat V4L2 device {path!r}: {exc.strerror}",
                                           Error.AccessFailed) from None
            if not stat.S_ISCHR(st.st_mode):
                raise InvalidArgumentError(f"{where}: {path!r} is not a V4L2 device (not a character device)")
            format = format or "v4l2"
        elif kind == "file":
            p = Path(path)
            if not p.exists():
                raise NotFoundError(f"{where}: no such video file {path!r}")
            if not p.is_file():
                raise InvalidArgumentError(f"{where}: {path!r} is not a regular file", Error.AccessFailed)
        self.kind = kind
        # a file is opened through FFmpeg's file protocol, so that a name like "concat:..."
        # or "pipe:0" is never read as another protocol
        self._path = "file:" + os.path.abspath(path) if kind == "file" else path
        if live is not None and not isinstance(live, bool):
            raise InvalidArgumentError(f"{where}: live must be a bool or None, got {live!r}")
        self.live = live if live is not None else kind != "file"
        for flag, value in (("loop", loop), ("realtime", realtime)):
            if not isinstance(value, bool):
                raise InvalidArgumentError(f"{where}: {flag} must be a bool, got {value!r}")
        if loop and self.live:
            raise InvalidArgumentError(f"{where}: loop is for files; a live source reconnects instead")
        self.loop = loop
        self.realtime = realtime
        if fps is not None:
            if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not (0 < fps < math.inf):
                raise InvalidArgumentError(f"{where}: fps must be a positive number or None, got {fps!r}")
            if self.live:
                raise InvalidArgumentError(f"{where}: fps paces files; a live source comes at its own rate")
            fps = float(fps)
        self.fps = fps
        if reconnect is None:
            reconnect = ReconnectPolicy()
        elif isinstance(reconnect, Mapping):
            try:
                reconnect = ReconnectPolicy(**reconnect)
            except TypeError as exc:
                raise InvalidArgumentError(f"{where}: reconnect: {exc}") from None
        elif not isinstance(reconnect, ReconnectPolicy):
            raise InvalidArgumentError(f"{where}: reconnect must be a ReconnectPolicy or a mapping, got {reconnect!r}")
        self.reconnect = reconnect
        if isinstance(pre, Mapping):
            try:
                pre = Preprocess(**pre)
            except TypeError as exc:
                raise InvalidArgumentError(f"{where}: pre: {exc}") from None
        elif pre is not None and not callable(pre):
            raise InvalidArgumentError(f"{where}: pre must be a Preprocess, a mapping or a callable, got {pre!r}")
        self.pre = pre
        opts: dict[str, str] = {}
        if options is not None:
            if not isinstance(options, Mapping):
                raise InvalidArgumentError(f"{where}: options must be a mapping of FFmpeg options, got {options!r}")
            for k, v in options.items():
                if not isinstance(k, str) or isinstance(v, (Mapping, list, tuple)):
                    raise InvalidArgumentError(f"{where}: options: {k!r} = {v!r} is not a string option")
                opts[k] = str(v).lower() if isinstance(v, bool) else str(v)
        if uri.lower().startswith(("rtsp://", "rtsps://")):
            opts.setdefault("rtsp_transport", "tcp")
        self.options = opts
        if format is not None and (not isinstance(format, str) or not format):
            raise InvalidArgumentError(f"{where}: format must be an FFmpeg input format name, got {format!r}")
        self.format = format
        for pname, value, lo in (("queue", queue, 1), ("decoder_threads", decoder_threads, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise InvalidArgumentError(f"{where}: {pname} must be an int >= {lo}, got {value!r}")
        self.queue = queue
        self.decoder_threads = decoder_threads
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not (0 < timeout_s < math.inf):
            raise InvalidArgumentError(f"{where}: timeout_s must be a positive number, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
            raise InvalidArgumentError(f"{where}: count must be an int >= 0 or None, got {count!r}")
        self.count = count
        self._state = "idle"
        self._running = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._c = dict(frames=0, decoded=0, connects=0, reconnects=0, disconnects=0, failed_attempts=0, loops=0)
        self._gap_s = 0.0
        self._size = (0, 0)
        self._codec = ""
        self._last_error: str | None = None

    # --- public ---------------------------------------------------------------------------

    def statistics(self) -> VideoSourceStatistics:
        """The source's counters now (see :class:`VideoSourceStatistics`)."""
        with self._lock:
            c = dict(self._c)
            return VideoSourceStatistics(self.uri, self.kind, self._state, c["frames"], c["decoded"], c["connects"],
                                         c["reconnects"], c["disconnects"], c["failed_attempts"], c["loops"],
                                         self._gap_s, self._size[1], self._size[0], self._codec, self._last_error)

    @property
    def thread(self) -> threading.Thread | None:
        """The decoder thread of the running (or last) iteration, or None before."""
        return self._thread

    async def frames(self) -> AsyncIterator[Frame]:
        """Starts the decoder thread and yields its frames; stopping the iteration (or
        cancelling it) stops and joins the thread. One iteration at a time.

        Raises:
            SourceError: a file that can't be opened or decoded, or a live source that gave
                up reconnecting (``max_attempts``); the message names the uri.
        """
        if self._running:
            raise OrchestraError(f"{self._where}: frames() is already running; one iteration at a time",
                                 Error.InvalidState)
        self._running = True
        loop = asyncio.get_running_loop()
        handoff = _Handoff(self.queue, loop)
        stop = threading.Event()
        thread = threading.Thread(target=self._thread_main, args=(handoff, stop), daemon=True,
                                  name=f"orchestra-video-{self.name}")
        self._thread = thread
        thread.start()
        try:
            while True:
                item = await handoff.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                with self._lock:
                    self._c["frames"] += 1
                yield item
        finally:
            stop.set()
            with anyio.CancelScope(shield=True):
                # the thread checks `stop` between frames and at least every 50 ms while it
                # waits; a blocked read ends within timeout_s
                deadline = time.monotonic() + self.timeout_s + 1.0
                while thread.is_alive() and time.monotonic() < deadline:
                    await anyio.sleep(0.005)
            self._running = False

    def __repr__(self) -> str:
        return (f"VideoSource({self.name!r}, {self.uri!r}, kind={self.kind}, live={self.live}, loop={self.loop}, "
                f"realtime={self.realtime}, fps={self.fps}, pre={self.pre!r})")

    # --- the decoder thread ---------------------------------------------------------------

    def _set(self, state: str, error: BaseException | None = None) -> None:
        with self._lock:
            self._state = state
            if error is not None:
                self._last_error = f"{type(error).__name__}: {error}"

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._c[key] += n

    def _thread_main(self, handoff: _Handoff, stop: threading.Event) -> None:
        try:
            self._decode(handoff, stop)
        except _Stopped:
            self._set("done")
            return
        except SourceError as exc:
            self._set("failed", exc)
            handoff.put(exc, stop)
            return
        except BaseException as exc:  # noqa: BLE001 - handed to the loop, raised there
            self._set("failed", exc)
            handoff.put(SourceError(f"{self._where}: {type(exc).__name__}: {exc}"), stop)
            return
        self._set("done")
        handoff.put(_END, stop)

    def _open(self) -> Any:
        av = self._av
        try:
            container = av.open(self._path, mode="r", format=self.format, options=self.options,
                                timeout=(self.timeout_s, self.timeout_s))
        except av.FFmpegError as exc:
            raise _OpenFailed(exc) from None
        try:
            if not container.streams.video:
                raise SourceError(f"{self._where}: has no video stream")
            stream = container.streams.video[0]
            ctx = stream.codec_context
            w, h = int(ctx.width or 0), int(ctx.height or 0)
            if w > MAX_FRAME_SIDE or h > MAX_FRAME_SIDE:
                raise SourceError(f"{self._where}: the stream announces {w}x{h} frames, over the limit of "
                                  f"{MAX_FRAME_SIDE} per side")
            # FFmpeg's own allocation limit for the decoder's pictures, below ours per side
            ctx.options = {**ctx.options, "max_pixels": str(MAX_FRAME_SIDE * MAX_FRAME_SIDE)}
            ctx.thread_count = self.decoder_threads
            if self.decoder_threads != 1:
                ctx.thread_type = "AUTO"
            with self._lock:
                self._size = (h, w)
                self._codec = ctx.name or ""
        except BaseException:
            container.close()
            raise
        return container

    def _convert(self, frame: Any) -> Any:
        w, h = int(frame.width), int(frame.height)
        if not (1 <= w <= MAX_FRAME_SIDE and 1 <= h <= MAX_FRAME_SIDE):
            raise SourceError(f"{self._where}: decoded a {w}x{h} frame, outside 1..{MAX_FRAME_SIDE} per side")
        pre = self.pre
        if isinstance(pre, Preprocess):
            sh, sw = pre.scaled_size(h, w)
            fmt = "bgr24" if pre.color == "bgr" else "rgb24"
            if (sh, sw) != (h, w):
                frame = frame.reformat(width=sw, height=sh, format=fmt, interpolation="BILINEAR")
            return pre.finish(frame.to_ndarray(format=fmt), color_done=True)
        image = frame.to_ndarray(format="rgb24")
        return pre(image) if pre is not None else image

    def _decode(self, handoff: _Handoff, stop: threading.Event) -> None:
        av = self._av
        clock = self.clock
        live = self.live
        policy = self.reconnect
        index = 0
        failures = 0           # failed opens in a row (a frame resets it)
        connected = False      # ever
        lost_at: float | None = None
        last_pts: float | None = None   # the last pts handed out (after offsetting)
        step = 1 / 30.0        # one frame's duration, updated from the stream
        offset = 0.0           # added to the stream's pts in this connection / pass
        pending_gap = 0.0      # wall seconds of the gap before this connection (live)
        t0: float | None = None  # pacing: when the first frame was due
        pts0 = 0.0
        k_paced = 0
        if self.count == 0:
            return
        while True:
            if stop.is_set():
                raise _Stopped
            if not connected or live:
                self._set("reconnecting" if connected else "connecting")
            try:
                container = self._open()
            except _OpenFailed as failed:
                exc = failed.error
                self._count("failed_attempts")
                self._set("reconnecting" if live else "failed", exc)
                if not live:
                    raise SourceError(f"{self._where}: can't open: {exc}") from None
                failures += 1
                if policy.max_attempts is not None and failures >= policy.max_attempts:
                    raise SourceError(f"{self._where}: gave up after {failures} failed attempts in a row to "
                                      f"connect: {exc}") from None
                delay = policy.delay(failures)
                _log.warning("video.connect_failed", source=self.name, uri=self.uri, attempt=failures,
                             retry_in_s=round(delay, 3), error=str(exc))
                if stop.wait(delay):
                    raise _Stopped from None
                continue
            now = clock()
            if lost_at is not None:
                gap = now - lost_at
                with self._lock:
                    self._gap_s += gap
                    self._c["reconnects"] += 1
                pending_gap = gap
                lost_at = None
            self._count("connects")
            first_in_connection = True
            with self._lock:
                size, codec = self._size, self._codec
            if live or not connected:
                _log.info("video.connected", source=self.name, uri=self.uri, width=size[1], height=size[0],
                          codec=codec, reconnects=self._c["reconnects"])
            connected = True
            self._set("streaming")
            error: BaseException | None = None
            in_pass = 0
            try:
                stream = container.streams.video[0]
                rate = stream.average_rate or stream.guessed_rate
                if rate:
                    step = 1.0 / float(rate)
                for frame in container.decode(stream):
                    if stop.is_set():
                        raise _Stopped
                    data = self._convert(frame)
                    raw = frame.time
                    if first_in_connection:
                        first_in_connection = False
                        failures = 0
                        if last_pts is not None:
                            # continue after the last pts: a file's next pass right after
                            # the last frame, a live source after the gap's length
                            base = raw if raw is not None else 0.0
                            offset = last_pts + max(step, pending_gap) - base
                        pending_gap = 0.0
                    pts = (raw + offset) if raw is not None else (last_pts + step if last_pts is not None else 0.0)
                    if last_pts is not None and pts <= last_pts:   # a jump back in a broken stream
                        offset += last_pts + step - pts
                        pts = last_pts + step
                    last_pts = pts
                    self._count("decoded")
                    t_capture = clock()
                    if not live and self.realtime:
                        if t0 is None:
                            t0, pts0 = t_capture, pts
                        due = t0 + (k_paced / self.fps if self.fps else pts - pts0)
                        k_paced += 1
                        if due > t_capture:
                            if stop.wait(due - t_capture):
                                raise _Stopped
                            t_capture = clock()
                        # stamped with its due time (a late frame too), never a future time
                        t_capture = min(t_capture, due)
                    held = handoff.put(Frame(self.name, index, data, t_capture, pts), stop)
                    if held is None:
                        raise _Stopped
                    index += 1
                    in_pass += 1
                    if t0 is not None and held > 0:
                        # backpressure (a block pipeline): slip the schedule by the part of
                        # the wait past the next due time
                        t_back = clock()
                        nxt = t0 + (k_paced / self.fps if self.fps else pts + step - pts0)
                        if t_back > nxt:
                            t0 += t_back - max(nxt, t_back - held)
                    if self.count is not None and index >= self.count:
                        return
            except (av.FFmpegError, OSError) as exc:
                error = exc
            finally:
                container.close()
            if error is not None and not live:
                raise SourceError(f"{self._where}: decoding failed: {type(error).__name__}: {error}") from None
            if not live:
                if not self.loop or in_pass == 0:
                    return  # the end of the file (a looping file without frames would spin)
                self._count("loops")
                continue
            lost_at = clock()
            self._count("disconnects")
            self._set("reconnecting", error)
            if error is None:
                self._set("reconnecting", EOFError("end of stream"))
            if in_pass == 0:   # connected but got nothing: counts as a failed attempt
                failures += 1
                if policy.max_attempts is not None and failures >= policy.max_attempts:
                    raise SourceError(f"{self._where}: gave up after {failures} attempts in a row without a "
                                      f"frame: {self._last_error}") from None
            delay = policy.delay(failures)
            _log.warning("video.disconnected", source=self.name, uri=self.uri, reason=self._last_error,
                         frames=index, retry_in_s=round(delay, 3))
            if stop.wait(delay):
                raise _Stopped


class _OpenFailed(Exception):
    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


register_source("video", VideoSource)
