"""orchestra.pipeline.VideoSource: real video files written here with PyAV, a real RTSP server
(GStreamer's gst-rtsp-server, from Debian's packages) killed and restarted mid-run, V4L2 paths,
and the errors a user or an untrusted stream can cause."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from orchestra.errors import InvalidArgumentError, NotFoundError, OrchestraError
from orchestra.pipeline import (
    MAX_FRAME_SIDE,
    CollectSink,
    Pipeline,
    Preprocess,
    ReconnectPolicy,
    SourceError,
    VideoSource,
    load_source,
)

av = pytest.importorskip("av")

pytestmark = pytest.mark.anyio

HERE = Path(__file__).parent
SYSTEM_PYTHON = "/usr/bin/python3"
FRAMES = 60
W, H = 320, 240


@pytest.fixture(params=[pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
                        pytest.param("asyncio", id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


def picture(i: int, h: int = H, w: int = W) -> np.ndarray:
    """Frame i: smooth gradients (so that any sane scaler agrees within a level) that move
    with i."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.stack([x * 200 / w + 20, y * 180 / h + 30 + i, (x + y) * 100 / (w + h) + 2 * i], -1)
    return np.rint(img).astype(np.uint8)


def write_video(path: Path, codec: str, frames: int = FRAMES, rate: int = 30, pix_fmt: str = "yuv420p",
                options: dict[str, str] | None = None) -> Path:
    with av.open(str(path), "w") as out:
        stream = out.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = W, H, pix_fmt
        if options:
            stream.options = options
        for i in range(frames):
            for packet in stream.encode(av.VideoFrame.from_ndarray(picture(i), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


@pytest.fixture(scope="session")
def videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("videos")
    made = {
        "mp4": write_video(d / "clip.mp4", "mpeg4"),
        "avi": write_video(d / "clip.avi", "mpeg4"),
        # lossless RGB, so decoded frames are exactly picture(i)
        "mkv": write_video(d / "clip.mkv", "ffv1", frames=12, pix_fmt="bgr0"),
    }
    if "libx264" in av.codecs_available:
        made["h264"] = write_video(d / "clip_h264.mp4", "libx264", options={"preset": "ultrafast"})
    return made


async def collect(source: VideoSource, limit: int | None = None) -> list[Any]:
    frames = []
    async with aclosing(source.frames()) as it:
        async for frame in it:
            frames.append(frame)
            if limit is not None and len(frames) >= limit:
                break
    return frames


# --- files -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["mp4", "avi", "mkv", "h264"])
async def test_file_decodes_every_frame_with_monotone_pts(videos: dict[str, Path], kind: str) -> None:
    if kind not in videos:
        pytest.skip("PyAV has no libx264 encoder here")
    src = VideoSource("cam", videos[kind], realtime=False)
    frames = await collect(src)
    expected = 12 if kind == "mkv" else FRAMES
    assert len(frames) == expected
    assert [f.index for f in frames] == list(range(expected))
    assert all(f.camera == "cam" and f.data.shape == (H, W, 3) and f.data.dtype == np.uint8 for f in frames)
    pts = [f.pts for f in frames]
    assert pts[0] == pytest.approx(0.0)
    assert all(b > a for a, b in zip(pts, pts[1:]))
    assert pts[-1] == pytest.approx((expected - 1) / 30, abs=1e-3)  # mkv: millisecond timestamps
    s = src.statistics()
    assert (s.frames, s.decoded, s.connects, s.loops, s.width, s.height, s.state) == (
        expected, expected, 1, 0, W, H, "done")
    assert not src.thread.is_alive()


async def test_lossless_file_frames_are_the_written_pictures(videos: dict[str, Path]) -> None:
    frames = await collect(VideoSource("cam", videos["mkv"], realtime=False))
    for f in frames:
        np.testing.assert_array_equal(f.data, picture(f.index))


async def test_loop_continues_pts_across_restarts(videos: dict[str, Path]) -> None:
    src = VideoSource("cam", videos["mp4"], loop=True, realtime=False, count=2 * FRAMES + 10)
    frames = await collect(src)
    assert len(frames) == 2 * FRAMES + 10
    pts = np.array([f.pts for f in frames])
    assert np.all(np.diff(pts) > 0)
    # each pass continues one frame after the last one: one uniform 1/30 s step throughout
    np.testing.assert_allclose(np.diff(pts), 1 / 30, atol=1e-6)
    # the same pictures come round again
    np.testing.assert_array_equal(frames[FRAMES + 3].data, frames[3].data)
    s = src.statistics()
    assert s.loops == 2 and s.connects == 3 and s.reconnects == 0


async def test_realtime_file_is_stamped_on_its_schedule(videos: dict[str, Path]) -> None:
    # paced by fps (faster than the file's 30 fps, to keep the test short): t_capture is
    # the frame's due time, t0 + k / fps, whatever moment the thread got to it
    src = VideoSource("cam", videos["mkv"], fps=120.0)
    frames = await collect(src)
    t = np.array([f.t_capture for f in frames])
    np.testing.assert_allclose(t - t[0], np.arange(len(frames)) / 120.0, atol=0.02)
    # and by the file's own pts
    frames = await collect(VideoSource("cam", videos["mkv"]), limit=6)
    t = np.array([f.t_capture for f in frames])
    np.testing.assert_allclose(t - t[0], [f.pts - frames[0].pts for f in frames], atol=0.02)


async def test_pre_runs_on_the_decoder_thread(videos: dict[str, Path]) -> None:
    seen: list[str] = []

    def pre(image: np.ndarray) -> np.ndarray:
        seen.append(threading.current_thread().name)
        return image[::2, ::2].copy()

    frames = await collect(VideoSource("cam", videos["mkv"], realtime=False, pre=pre))
    assert frames[0].data.shape == (H // 2, W // 2, 3)
    assert set(seen) == {"orchestra-video-cam"}
    frames = await collect(VideoSource("cam", videos["mkv"], realtime=False,
                                       pre={"resize": [224, 224], "mode": "letterbox"}))
    assert frames[0].data.shape == (3, 224, 224) and frames[0].data.dtype == np.float32


async def test_stopping_early_stops_the_thread(videos: dict[str, Path]) -> None:
    src = VideoSource("cam", videos["mp4"], loop=True, realtime=True, queue=2)
    frames = await collect(src, limit=3)
    assert len(frames) == 3
    assert not src.thread.is_alive()
    # cancelled while waiting for a frame
    src = VideoSource("cam", videos["mp4"], loop=True, fps=1.0)
    with anyio.move_on_after(0.3):
        await collect(src)
    assert not src.thread.is_alive()
    assert src.statistics().state == "done"


async def test_pipeline_over_a_video_file_accounts_for_every_frame(videos: dict[str, Path]) -> None:
    sink = CollectSink(maxlen=1000)
    src = load_source("video", name="cam", uri=str(videos["mp4"]), realtime=False,
                      pre=Preprocess(resize=(224, 224), mode="center_crop", layout="nhwc"))
    pipeline = Pipeline("cam", src, MeanExecutor(), sink=sink, drop="block", queue=2)
    await pipeline.run()
    acc = pipeline.accounting()
    acc.check()
    assert acc.produced == acc.processed == FRAMES
    results = list(sink.results)
    pts = [r.frame.pts for r in results]
    assert len(pts) == FRAMES and all(b > a for a, b in zip(pts, pts[1:]))
    assert results[0].frame.data.shape == (224, 224, 3)


class MeanExecutor:
    """A real small executor: the mean of the frame."""

    async def execute(self, inputs: list[Any]) -> list[Any]:
        return [float(np.mean(inputs[0]))]


# --- errors --------------------------------------------------------------------------------

def test_missing_file_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.mp4"
    with pytest.raises(NotFoundError, match="nope.mp4"):
        VideoSource("cam", missing)


def test_missing_v4l2_device_names_it() -> None:
    path = "/dev/video987"
    assert not os.path.exists(path)
    with pytest.raises(NotFoundError, match="/dev/video987") as info:
        load_source("video", name="cam", uri=path)
    assert "V4L2" in str(info.value)


async def test_not_a_video_file_fails_with_the_uri(tmp_path: Path) -> None:
    bad = tmp_path / "garbage.mp4"
    bad.write_bytes(b"\x00not a video\xff" * 100)
    src = VideoSource("cam", bad)
    with pytest.raises(SourceError, match="garbage.mp4"):
        await collect(src)
    assert src.statistics().state == "failed"
    assert not src.thread.is_alive()


async def test_oversized_stream_is_refused_before_decoding(tmp_path: Path) -> None:
    # a raw YUV4MPEG2 stream whose header announces a 9000 x 2 picture (27 KB of frame data)
    w = MAX_FRAME_SIDE + 808
    path = tmp_path / "wide.y4m"
    path.write_bytes(f"YUV4MPEG2 W{w} H2 F30:1 Ip A1:1 C420jpeg\nFRAME\n".encode() + bytes(w * 3))
    src = VideoSource("cam", path, realtime=False)
    with pytest.raises(SourceError, match=f"{w}x2 .*{MAX_FRAME_SIDE}"):
        await collect(src)


def test_parameters_are_checked(videos: dict[str, Path]) -> None:
    clip = videos["mp4"]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"fps": 0}, "fps"),
        ({"loop": "yes"}, "loop"),
        ({"queue": 0}, "queue"),
        ({"timeout_s": -1}, "timeout_s"),
        ({"reconnect": {"initial_s": -1}}, "initial_s"),
        ({"reconnect": {"bogus": 1}}, "reconnect"),
        ({"reconnect": {"factor": 0.5}}, "factor"),
        ({"reconnect": {"max_attempts": 0}}, "max_attempts"),
        ({"pre": {"mode": "zoom"}}, "mode"),
        ({"pre": 3}, "pre"),
        ({"options": {"x": [1]}}, "options"),
    ]
    for params, word in cases:
        with pytest.raises(InvalidArgumentError, match=word) as info:
            VideoSource("cam", clip, **params)
        assert str(clip) in str(info.value) or word in ("initial_s", "factor", "max_attempts", "mode")
    with pytest.raises(InvalidArgumentError, match="loop is for files"):
        VideoSource("cam", "rtsp://127.0.0.1:9/cam", loop=True)
    with pytest.raises(InvalidArgumentError, match="fps paces files"):
        VideoSource("cam", "rtsp://127.0.0.1:9/cam", fps=30)


def test_missing_pyav_names_the_extra(monkeypatch: pytest.MonkeyPatch, videos: dict[str, Path]) -> None:
    monkeypatch.setitem(sys.modules, "av", None)  # what `import av` sees when PyAV isn't installed
    with pytest.raises(NotFoundError, match=r"pip install 'orchestra\[video\]'"):
        VideoSource("cam", videos["mp4"])


async def test_one_iteration_at_a_time(videos: dict[str, Path]) -> None:
    src = VideoSource("cam", videos["mp4"], realtime=False)
    it = src.frames()
    await it.__anext__()
    with pytest.raises(OrchestraError, match="already running"):
        await src.frames().__anext__()
    await it.aclose()
    assert not src.thread.is_alive()


def test_reconnect_policy_backoff() -> None:
    p = ReconnectPolicy(initial_s=0.1, max_s=1.0, factor=3.0)
    assert [round(p.delay(k), 6) for k in range(4)] == [0.1, 0.3, 0.9, 1.0]
    with pytest.raises(InvalidArgumentError, match="max_s"):
        ReconnectPolicy(initial_s=2.0, max_s=1.0)


# --- live: a real RTSP server ----------------------------------------------------------------

def _rtsp_server_available() -> bool:
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return False
    probe = ("import gi; gi.require_version('Gst', '1.0'); gi.require_version('GstRtspServer', '1.0'); "
             "from gi.repository import Gst, GstRtspServer; Gst.init(None); "
             "assert Gst.ElementFactory.find('videotestsrc') and Gst.ElementFactory.find('rtph264pay')")
    try:
        return subprocess.run([SYSTEM_PYTHON, "-c", probe], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


requires_rtsp = pytest.mark.skipif(not _rtsp_server_available(),
                                   reason="gst-rtsp-server (python3-gi, gir1.2-gst-rtsp-server-1.0) is not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RtspServer:
    """GStreamer's RTSP server in a process of its own (tests/_rtsp_server.py)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"rtsp://127.0.0.1:{port}/cam"
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([SYSTEM_PYTHON, str(HERE / "_rtsp_server.py"), str(self.port)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "READY":
            self.kill()
            raise RuntimeError(f"RTSP server on port {self.port} didn't start: {line!r}")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.proc = None


@pytest.fixture
def rtsp_server() -> Iterator[RtspServer]:
    server = RtspServer(free_port())
    server.start()
    try:
        yield server
    finally:
        server.kill()


async def wait_until(what: str, condition: Callable[[], bool], limit_s: float = 30.0) -> None:
    """Polls ``condition``; ``limit_s`` only keeps a broken run from hanging."""
    with anyio.move_on_after(limit_s):
        while not condition():
            await anyio.sleep(0.02)
        return
    raise AssertionError(f"timed out waiting for {what}")


@requires_rtsp
@pytest.mark.parametrize("anyio_backend", [pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop")])
async def test_rtsp_camera_reconnects_after_the_server_restarts(rtsp_server: RtspServer) -> None:
    src = VideoSource("door", rtsp_server.url, reconnect=ReconnectPolicy(initial_s=0.1, max_s=0.4), timeout_s=3.0,
                      pre=Preprocess(resize=(120, 160), mode="stretch", dtype="uint8", layout="nhwc"))
    sink = CollectSink(maxlen=10_000)
    pipeline = Pipeline("door", src, MeanExecutor(), sink=sink, queue=4, drop="drop_oldest")
    async with anyio.create_task_group() as tg:
        tg.start_soon(pipeline.run)
        await wait_until("frames from the first connection", lambda: pipeline.accounting().processed >= 10)
        await anyio.to_thread.run_sync(rtsp_server.kill)
        await wait_until("the camera to notice", lambda: src.statistics().disconnects >= 1)
        # while the server is down, connecting is refused (and retried with backoff)
        await wait_until("a refused reconnect", lambda: src.statistics().failed_attempts >= 2)
        before = pipeline.accounting().processed
        await anyio.to_thread.run_sync(rtsp_server.start)
        await wait_until("frames after the restart",
                         lambda: src.statistics().reconnects >= 1 and pipeline.accounting().processed >= before + 10)
        pipeline.stop()
    acc = pipeline.accounting()
    acc.check()
    assert acc.produced == acc.processed + acc.failed + acc.dropped_total
    stats = src.statistics()
    assert stats.reconnects >= 1 and stats.disconnects >= 1 and stats.gap_s > 0
    assert stats.frames == acc.produced
    results = list(sink.results)
    assert len(results) == acc.processed
    assert results[0].frame.data.shape == (120, 160, 3)
    pts = [r.frame.pts for r in results]
    assert all(b > a for a, b in zip(pts, pts[1:]))
    assert not src.thread.is_alive()


@pytest.mark.parametrize("anyio_backend", [pytest.param("asyncio", id="asyncio")])
async def test_unreachable_stream_gives_up_naming_the_uri() -> None:
    url = f"rtsp://127.0.0.1:{free_port()}/cam"
    src = VideoSource("door", url, reconnect=ReconnectPolicy(initial_s=0.01, max_s=0.02, max_attempts=3),
                      timeout_s=2.0)
    with pytest.raises(SourceError, match=f"{url}.*gave up after 3 failed attempts"):
        await collect(src)
    assert src.statistics().failed_attempts == 3
