"""Config keys for video sources and pre-processing: ``source = { kind = "video", ... }`` and a
camera's ``pre = { ... }``; exact one-line, path-first errors; and a real run of a video file
written here, decoded and pre-processed, through a real program."""

from __future__ import annotations

import io
import pathlib
import shutil

import numpy as np
import pytest

from orchestra.config import ConfigError, PreConfig, load_config, validate_config

av = pytest.importorskip("av")

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = ROOT / "examples" / "models"
PROGRAM = '[program]\npath = "models/convnet.pte"\n'   # input 0: float32 [1, 3, 16, 16]


@pytest.fixture
def folder(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "models").mkdir()
    shutil.copy(MODELS / "convnet.pte", tmp_path / "models" / "convnet.pte")
    (tmp_path / "clips").mkdir()
    path = tmp_path / "clips" / "door.mp4"
    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=30)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        rng = np.random.default_rng(0)
        for _ in range(30):
            image = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return tmp_path


def camera(source: str, extra: str = "") -> str:
    return f'\n[[camera]]\nname = "door"\nsource = {source}\n{extra}\n'


VIDEO = '{ kind = "video", uri = "clips/door.mp4", realtime = false }'
PRE = 'pre = { resize = [16, 16], mode = "letterbox", mean = [0.5, 0.5, 0.5], std = [0.25, 0.25, 0.25] }'


def check(folder: pathlib.Path, text: str, expected: list[str]) -> None:
    path = folder / "config.toml"
    path.write_text(text, encoding="utf-8")
    assert validate_config(path) == expected
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert list(info.value.errors) == expected


def test_a_valid_video_camera(folder: pathlib.Path) -> None:
    path = folder / "config.toml"
    path.write_text(PROGRAM + camera('{ kind = "video", uri = "clips/door.mp4", loop = true, fps = 15, '
                                     'reconnect = { initial_s = 0.2 }, options = { threads = 1 } }', PRE))
    assert validate_config(path) == []
    cam = load_config(path).cameras[0]
    assert cam.source.kind == "video"
    assert cam.source.params["uri"] == str(folder / "clips" / "door.mp4")       # resolved against the file
    assert cam.source.params["reconnect"] == {"initial_s": 0.2, "max_s": 10.0, "factor": 2.0}
    assert cam.pre == PreConfig({"resize": (16, 16), "mode": "letterbox", "mean": (0.5, 0.5, 0.5),
                                 "std": (0.25, 0.25, 0.25)}, add_batch=True)
    assert cam.add_batch
    src = cam.build_source()
    assert (src.name, src.loop, src.fps, src.pre.resize, src.options) == ("door", True, 15.0, (16, 16), {"threads": "1"})
    # a stream: kept as written, no file check
    path.write_text(PROGRAM + camera('{ kind = "video", uri = "rtsp://127.0.0.1:8554/cam", '
                                     'reconnect = { max_s = 2, max_attempts = 3 } }', PRE))
    cam = load_config(path).cameras[0]
    assert cam.source.params["uri"] == "rtsp://127.0.0.1:8554/cam"
    assert cam.build_source().reconnect.max_attempts == 3


CASES: list[tuple[str, str, list[str]]] = [
    ("uri missing", camera('{ kind = "video" }', PRE), ["camera[0].source.uri: missing (required)"]),
    ("file missing, as written", camera('{ kind = "video", uri = "clips/nope.mp4" }', PRE),
     ["camera[0].source.uri: clips/nope.mp4: no such file"]),
    ("V4L2 device missing", camera('{ kind = "video", uri = "/dev/video987" }', PRE),
     ["camera[0].source.uri: /dev/video987: no such V4L2 device"]),
    ("other FFmpeg protocols refused", camera('{ kind = "video", uri = "concat:a.mp4|b.mp4" }', PRE),
     ["camera[0].source.uri: unsupported scheme 'concat' (streams: rtsp, rtsps, rtmp, rtmps, http, https, udp, "
      "tcp, srt, rtp; or a file path, or /dev/videoN)"]),
    ("loop on a stream", camera('{ kind = "video", uri = "rtsp://127.0.0.1/x", loop = true }', PRE),
     ["camera[0].source.loop: is for files; a live source (a stream or a device) reconnects instead"]),
    ("fps on a stream", camera('{ kind = "video", uri = "rtsp://127.0.0.1/x", fps = 30 }', PRE),
     ["camera[0].source.fps: paces files; a live source (a stream or a device) comes at its own rate"]),
    ("unknown source key with a hint", camera('{ kind = "video", uri = "clips/door.mp4", looop = true }', PRE),
     ["camera[0].source.looop: unknown key (known keys: kind, uri, loop, realtime, fps, reconnect, options, format, "
      "live, timeout_s, decoder_threads, count); did you mean 'loop'?"]),
    ("reconnect checks", camera('{ kind = "video", uri = "rtsp://h/x", reconnect = { initial_s = 5, max_s = 1, '
                                'factor = 0.5, max_attempts = 0, tries = 2 } }', PRE),
     ["camera[0].source.reconnect.tries: unknown key (known keys: initial_s, max_s, factor, max_attempts)",
      "camera[0].source.reconnect.max_attempts: must be a positive integer, got 0",
      "camera[0].source.reconnect.factor: must be >= 1 (each wait is factor times the last), got 0.5"]),
    ("reconnect max_s below initial_s", camera('{ kind = "video", uri = "rtsp://h/x", reconnect = { initial_s = 5, '
                                               'max_s = 1 } }', PRE),
     ["camera[0].source.reconnect.max_s: 1 is less than initial_s (5)"]),
    ("ffmpeg options are scalars", camera('{ kind = "video", uri = "rtsp://h/x", options = { a = [1] } }', PRE),
     ["camera[0].source.options.a: an FFmpeg option is a string, number or boolean, got [1]"]),
    ("pre needs a video source", camera('{ kind = "synthetic", fps = 30 }', PRE),
     ['camera[0].pre: runs in a video source\'s decoder thread: needs source kind "video", not \'synthetic\'']),
    ("pre size against the method", camera(VIDEO, 'pre = { resize = [224, 224] }'),
     ["camera[0].pre: makes [3, 224, 224] (nchw, plus a batch dimension of 1), the input is float32 "
      "[1, 3, 16, 16] (input 0 of forward)"]),
    ("pre layout against the method", camera(VIDEO, 'pre = { resize = [16, 16], layout = "nhwc" }'),
     ["camera[0].pre: makes [16, 16, 3] (nhwc, plus a batch dimension of 1), the input is float32 "
      "[1, 3, 16, 16] (input 0 of forward)"]),
    ("pre dtype against the method", camera(VIDEO, 'pre = { resize = [16, 16], dtype = "uint8" }'),
     ["camera[0].pre: makes uint8, the input is float32 [1, 3, 16, 16] (input 0 of forward)"]),
    ("pre fields", camera(VIDEO, 'pre = { resize = [16], mode = "fit", mean = [1, 2], std = [1, 0, 1], pad = 300, '
                                 'scale = -1, colour = "bgr" }'),
     ["camera[0].pre.colour: unknown key (known keys: resize, mode, color, mean, std, layout, dtype, scale, pad); "
      "did you mean 'color'?",
      "camera[0].pre.resize: must be [height, width], two integers in 1..8192, got [16]",
      "camera[0].pre.mode: 'fit' is not one of letterbox, stretch, center_crop",
      "camera[0].pre.mean: must be three numbers (one per channel, in output order), got [1, 2]",
      "camera[0].pre.std: must be three numbers > 0 (one per channel, in output order), got [1, 0, 1]",
      "camera[0].pre.scale: must be a positive number, got -1",
      "camera[0].pre.pad: must be a pixel value in 0..255, got 300"]),
    ("mean with uint8", camera(VIDEO, 'pre = { resize = [16, 16], dtype = "uint8", mean = [0, 0, 0] }'),
     ['camera[0].pre.mean: only with dtype = "float32" (uint8 output keeps the pixels)']),
    ("a video source without pre", camera(VIDEO),
     ["camera[0].source: a video source without pre makes RGB uint8 [H, W, 3] frames, but input 0 of forward is "
      "float32 [1, 3, 16, 16]: add pre = { resize = [h, w], ... } to the camera"]),
]


@pytest.mark.parametrize(("text", "expected"), [pytest.param(t, e, id=i) for i, t, e in CASES])
def test_invalid(folder: pathlib.Path, text: str, expected: list[str]) -> None:
    check(folder, PROGRAM + text, expected)


def test_run_decodes_preprocesses_and_executes_every_frame(folder: pathlib.Path) -> None:
    from orchestra._run import RunOptions, render_summary, run

    path = folder / "config.toml"
    path.write_text(PROGRAM + camera('{ kind = "video", uri = "clips/door.mp4", realtime = false }',
                                     PRE + '\ndrop = "block"\nqueue = 2'))
    result = run(load_config(path), RunOptions(duration_s=30.0, status_interval_s=5.0), out=io.StringIO())
    assert result.exit_code == 0, result.problems
    assert result.ended_by == "sources ended"
    (cam,) = result.cameras
    assert (cam.produced, cam.processed, cam.failed) == (30, 30, 0)
    assert result.accounting == {"door": "ok"}
    stats = result.sources["door"]
    assert (stats.frames, stats.connects, stats.reconnects, stats.state) == (30, 1, 0, "done")
    summary = render_summary(result)
    assert "video sources" in summary
    section = summary.split("video sources", 1)[1].splitlines()
    assert section[1].split()[:4] == ["camera", "uri", "state", "frames"]
    assert section[2].split()[0] == "door" and section[2].split()[2:8] == ["done", "30", "1", "0", "0", "0.0"]
