"""A camera's ``source = { kind = "video", ... }`` (files, RTSP/HTTP streams, V4L2 devices:
``orchestra.pipeline.VideoSource``) and its ``pre = { ... }`` table
(``orchestra.pipeline.Preprocess``), checked against the method's input 0."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ._base import _BAD, Checker, _any_bad, _freeze, _is_int, _is_num, _join, _kind_of, _show, _thaw
from .programs import _Input, _ProgramInfo
from .sources import SourceConfig

_VIDEO_KEYS = ("kind", "uri", "loop", "realtime", "fps", "reconnect", "options", "format", "live", "timeout_s",
               "decoder_threads", "count")
_RECONNECT_KEYS = ("initial_s", "max_s", "factor", "max_attempts")
_PRE_KEYS = ("resize", "mode", "color", "mean", "std", "layout", "dtype", "scale", "pad")
_LIVE_SCHEMES = ("rtsp", "rtsps", "rtmp", "rtmps", "http", "https", "udp", "tcp", "srt", "rtp")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]+):")
_MAX_DECODER_THREADS = 64


@dataclass(frozen=True)
class PreConfig:
    """A camera's ``pre`` table: the :class:`~orchestra.pipeline.Preprocess` fields, run on
    the video source's decoder thread. ``add_batch``: the method's input 0 has a leading
    batch dimension of 1, which the pipeline adds to each frame (``frame.data[None]``)."""

    fields: Mapping[str, Any] = field(default_factory=dict)
    add_batch: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", _freeze(self.fields))

    def build(self) -> Any:
        """The :class:`~orchestra.pipeline.Preprocess`."""
        from orchestra.pipeline import Preprocess

        return Preprocess(**_thaw(self.fields))


class VideoChecks(Checker):
    """Checks ``source = { kind = "video", ... }`` (:meth:`check_video_source`) and a
    camera's ``pre`` (:meth:`check_pre`)."""

    # -- source -------------------------------------------------------------------------------
    def check_video_source(self, sp: str, s: dict[str, Any]) -> Any:
        self.known(s, sp, _VIDEO_KEYS)
        try:
            import av  # noqa: F401
        except ImportError:
            self.err(_join(sp, "kind"), "\"video\" needs PyAV: pip install 'orchestra[video]'")
            return _BAD
        uri = self.check_uri(sp, s)
        live_kind = uri is not _BAD and uri[1] != "file"
        loop = self.get(s, "loop", sp, "bool", False)
        realtime = self.get(s, "realtime", sp, "bool", True)
        fps = self.at_most(self.get(s, "fps", sp, "positive_number", None), sp, "fps", "max_fps")
        live = self.get(s, "live", sp, "bool", None)
        fmt = self.get(s, "format", sp, "string", None)
        timeout_s = self.get(s, "timeout_s", sp, "positive_number", None)
        threads = self.get(s, "decoder_threads", sp, "nonneg_int", None)
        if threads is not _BAD and threads is not None and threads > _MAX_DECODER_THREADS:
            self.err(_join(sp, "decoder_threads"), f"{threads} is more than {_MAX_DECODER_THREADS}")
            threads = _BAD
        count = self.get(s, "count", sp, "nonneg_int", None)
        reconnect = self.check_reconnect(sp, s)
        options = self.check_ffmpeg_options(sp, s)
        if uri is not _BAD and live is not _BAD:
            is_live = live if live is not None else live_kind
            if is_live and loop is True:
                self.err(_join(sp, "loop"), "is for files; a live source (a stream or a device) reconnects instead")
                loop = _BAD
            if is_live and fps not in (None, _BAD):
                self.err(_join(sp, "fps"), "paces files; a live source (a stream or a device) comes at its own rate")
                fps = _BAD
        if _any_bad(uri, loop, realtime, fps, live, fmt, timeout_s, threads, count, reconnect, options):
            return _BAD
        params: dict[str, Any] = {"uri": uri[0], "loop": loop, "realtime": realtime}
        for key, value in (("fps", fps), ("live", live), ("format", fmt), ("timeout_s", timeout_s),
                           ("decoder_threads", threads), ("count", count), ("reconnect", reconnect),
                           ("options", options)):
            if value is not None:
                params[key] = value
        return SourceConfig("video", params)

    def check_uri(self, sp: str, s: Mapping[str, Any]) -> Any:
        """(uri to open, "file" | "stream" | "device"): a file path resolved against the config's
        folder and required to exist, a ``/dev/videoN`` that must be a character device, or a
        stream URL of a known scheme (no other FFmpeg protocol: the file is untrusted)."""
        written = self.get(s, "uri", sp, "string")
        if written is _BAD:
            return _BAD
        up = _join(sp, "uri")
        if "\x00" in written:
            self.err(up, "holds a NUL character")
            return _BAD
        if written.startswith("/dev/video"):
            try:
                st = os.stat(written)
            except FileNotFoundError:
                self.err(up, f"{written}: no such V4L2 device")
                return _BAD
            except OSError as exc:
                self.err(up, f"{written}: can't stat: {exc.strerror or exc}")
                return _BAD
            if not stat.S_ISCHR(st.st_mode):
                self.err(up, f"{written}: not a V4L2 device (not a character device)")
                return _BAD
            return written, "device"
        m = _SCHEME.match(written)
        if m is not None and m.group(1).lower() != "file":
            scheme = m.group(1).lower()
            if scheme not in _LIVE_SCHEMES:
                self.err(up, f"unsupported scheme {scheme!r} (streams: {', '.join(_LIVE_SCHEMES)}; "
                             f"or a file path, or /dev/videoN)")
                return _BAD
            return written, "stream"
        path_text = written[5:] if m is not None else written
        if not path_text:
            self.err(up, "file: needs a path")
            return _BAD
        p = Path(path_text)
        resolved = p if p.is_absolute() else (self.base / p).resolve()
        if not resolved.exists():
            self.err(up, f"{written}: no such file")
            return _BAD
        if not resolved.is_file():
            self.err(up, f"{written}: not a regular file")
            return _BAD
        return str(resolved), "file"

    def check_reconnect(self, sp: str, s: Mapping[str, Any]) -> Any:
        if "reconnect" not in s:
            return None
        rp = _join(sp, "reconnect")
        r = self.table(s["reconnect"], rp)
        if r is None:
            return _BAD
        self.known(r, rp, _RECONNECT_KEYS)
        initial = self.get(r, "initial_s", rp, "nonneg_number", None)
        most = self.get(r, "max_s", rp, "nonneg_number", None)
        factor = self.get(r, "factor", rp, "positive_number", None)
        attempts = self.get(r, "max_attempts", rp, "positive_int", None)
        if factor not in (None, _BAD) and factor < 1:
            self.err(_join(rp, "factor"), f"must be >= 1 (each wait is factor times the last), got {_show(factor)}")
            factor = _BAD
        if _any_bad(initial, most, factor, attempts):
            return _BAD
        from orchestra.pipeline import ReconnectPolicy

        d = ReconnectPolicy()
        initial = d.initial_s if initial is None else initial
        if most is None:
            most = max(d.max_s, initial)
        if most < initial:
            self.err(_join(rp, "max_s"), f"{_show(r['max_s'])} is less than initial_s "
                                         f"({_show(r.get('initial_s', initial))})")
            return _BAD
        out = {"initial_s": initial, "max_s": most, "factor": d.factor if factor is None else factor}
        if attempts is not None:
            out["max_attempts"] = attempts
        return out

    def check_ffmpeg_options(self, sp: str, s: Mapping[str, Any]) -> Any:
        if "options" not in s:
            return None
        op = _join(sp, "options")
        o = self.table(s["options"], op)
        if o is None:
            return _BAD
        out: dict[str, str] = {}
        for k, v in o.items():
            if isinstance(v, bool):
                out[k] = "1" if v else "0"
            elif isinstance(v, str) or _is_int(v) or _is_num(v):
                out[k] = str(v)
            else:
                self.err(_join(op, k), f"an FFmpeg option is a string, number or boolean, got {_kind_of(v)}")
                return _BAD
        return out

    # -- pre ------------------------------------------------------------------------------------
    def check_pre(self, path: str, t: Mapping[str, Any], prog: _ProgramInfo | None, source: Any,
                  camera: str = "camera") -> Any:
        """The camera's ``pre``: None when absent; needs a video source; checked against the
        method's input 0 (shape and dtype; the batch dimension, if any, must be 1)."""
        if "pre" not in t:
            return None
        pp = _join(path, "pre")
        p = self.table(t["pre"], pp)
        if p is None:
            return _BAD
        self.known(p, pp, _PRE_KEYS)
        fields: dict[str, Any] = {}
        ok = True
        if "resize" in p:
            v = p["resize"]
            from orchestra.pipeline import MAX_IMAGE_SIDE

            if not (isinstance(v, list) and len(v) == 2 and all(_is_int(x) and 1 <= x <= MAX_IMAGE_SIDE for x in v)):
                self.err(_join(pp, "resize"), f"must be [height, width], two integers in 1..{MAX_IMAGE_SIDE}, "
                                              f"got {_show(v)}")
                ok = False
            else:
                fields["resize"] = (v[0], v[1])
        for key, choices in (("mode", ("letterbox", "stretch", "center_crop")), ("color", ("rgb", "bgr")),
                             ("layout", ("nchw", "nhwc")), ("dtype", ("float32", "uint8"))):
            v = self.choice(p, key, pp, choices, None)
            if v is _BAD:
                ok = False
            elif v is not None:
                fields[key] = v
        for key in ("mean", "std"):
            if key not in p:
                continue
            v = p[key]
            if not (isinstance(v, list) and len(v) == 3 and all(_is_num(x) for x in v)) or (
                    key == "std" and any(x <= 0 for x in v)):
                want = "three numbers > 0" if key == "std" else "three numbers"
                self.err(_join(pp, key), f"must be {want} (one per channel, in output order), got {_show(v)}")
                ok = False
            else:
                fields[key] = tuple(float(x) for x in v)
        scale = self.get(p, "scale", pp, "positive_number", None)
        pad = self.get(p, "pad", pp, "nonneg_int", None)
        if pad not in (None, _BAD) and pad > 255:
            self.err(_join(pp, "pad"), f"must be a pixel value in 0..255, got {pad}")
            pad = _BAD
        if _any_bad(scale, pad):
            ok = False
        if scale is not None and scale is not _BAD:
            fields["scale"] = scale
        if pad is not None and pad is not _BAD:
            fields["pad"] = pad
        if ok and fields.get("dtype") == "uint8":
            for key in ("mean", "std"):
                if key in fields:
                    self.err(_join(pp, key), 'only with dtype = "float32" (uint8 output keeps the pixels)')
                    ok = False
        if source is not _BAD and source.kind != "video":
            self.err(pp, f'runs in a video source\'s decoder thread: needs source kind "video", not {source.kind!r}')
            return _BAD
        if not ok:
            return _BAD
        from orchestra.errors import OrchestraError

        try:
            pre = PreConfig(fields).build()
        except OrchestraError as exc:  # anything the checks above let through
            self.err(pp, exc.message.removeprefix("pre-process: "))
            return _BAD
        add_batch = False
        inp = prog.inputs[0] if prog is not None and prog.inputs and len(prog.inputs) == 1 else None
        frame_input = getattr(self, "frame_input", None)  # batching.BatchChecks: a batched camera's frame is one row
        if inp is not None and callable(frame_input):
            inp = frame_input(camera, inp)
        if inp is not None:
            add_batch = len(inp.sizes) == 4
            problem = self.pre_mismatch(pre, inp)
            if problem is not None:
                self.err(pp, f"{problem} (input 0 of {prog.method})")  # type: ignore[union-attr]
                return _BAD
        return PreConfig(fields, add_batch)

    @staticmethod
    def pre_mismatch(pre: Any, inp: _Input) -> str | None:
        from ..program import TensorShapeDynamism

        dtype = inp.dtype if inp.dtype is not None else np.dtype(pre.dtype)
        if inp.dynamism == TensorShapeDynamism.STATIC:
            return pre.mismatch(inp.sizes, dtype)
        # dynamic: the sizes are upper bounds (or meaningless); the dtype and the rank
        if dtype != np.dtype(pre.dtype):
            return f"makes {pre.dtype}, the input is {dtype}"
        if len(inp.sizes) not in (3, 4):
            return f"makes a 3-D image ({pre.layout}, plus a batch dimension of 1), the input has {len(inp.sizes)} dimensions"
        return None

    def check_video_without_pre(self, path: str, prog: _ProgramInfo | None, camera: str = "camera") -> None:
        """A video source without ``pre`` makes RGB uint8 [H, W, 3] frames: the method's input
        0 must take that (uint8, [H, W, 3] or [1, H, W, 3]; one row of it for a batched camera)."""
        inp = prog.inputs[0] if prog is not None and prog.inputs and len(prog.inputs) == 1 else None
        frame_input = getattr(self, "frame_input", None)  # batching.BatchChecks
        if inp is not None and callable(frame_input):
            inp = frame_input(camera, inp)
        if inp is None:
            return
        sizes = tuple(inp.sizes)
        image = sizes[1:] if len(sizes) == 4 and sizes[0] == 1 else sizes
        if (inp.dtype is not None and inp.dtype != np.uint8) or len(image) != 3 or image[2] != 3:
            self.err(_join(path, "source"), f"a video source without pre makes RGB uint8 [H, W, 3] frames, but input 0 "
                                            f"of {prog.method} is {inp.dtype} {_show(list(sizes))}: add "  # type: ignore[union-attr]
                                            f"pre = {{ resize = [h, w], ... }} to the camera")
