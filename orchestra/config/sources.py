"""A camera's ``source`` table: ``synthetic``, ``file`` (frames checked against the
method's input 0), or a registered/``module:attr`` frame source with its parameters."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import OrchestraError
from ._base import _BAD, Checker, _any_bad, _freeze, _hint, _is_int, _join, _kind_of, _names, _show, _thaw
from .programs import _Input, _ProgramInfo

_SYNTHETIC_KEYS = ("kind", "fps", "shape", "dtype", "seed", "count")
_FILE_KEYS = ("kind", "path", "fps", "loop", "shape", "dtype")


@dataclass(frozen=True)
class SourceConfig:
    """A camera's frame source: ``kind`` (``synthetic``, ``file``, a registered source name
    or ``module:attr``) and the factory's parameters (without ``name``). ``synthetic``
    params are complete (``fps``, ``shape``, ``dtype``, ``seed``, and ``count`` if given);
    a ``file`` path is absolute."""

    kind: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", _freeze(self.params))

    def build(self, name: str, **extra: Any) -> Any:
        """The source object (``orchestra.pipeline.load_source(kind, name=name, **params, **extra)``)."""
        from orchestra.pipeline import load_source

        return load_source(self.kind, name=name, **_thaw(self.params), **extra)


class SourceChecks(Checker):
    """Checks a camera's ``source`` (:meth:`check_source`)."""

    def check_source(self, path: str, t: dict[str, Any], prog: _ProgramInfo | None, camera: str) -> Any:
        sp = _join(path, "source")
        if "source" not in t:
            self.err(sp, 'missing (required), e.g. source = { kind = "synthetic", fps = 30 }')
            return _BAD
        s = self.table(t["source"], sp)
        if s is None:
            return _BAD
        kind = self.get(s, "kind", sp, "string")
        if kind is _BAD:
            return _BAD
        inp = prog.inputs[0] if prog is not None and prog.inputs else None
        if prog is not None and prog.inputs is not None and len(prog.inputs) != 1:
            self.err(sp, f"a camera feeds one frame per execute, but {prog.where} takes {len(prog.inputs)} inputs")
            inp = None
        frame_input = getattr(self, "frame_input", None)  # batching.BatchChecks: one row per frame
        if callable(frame_input):
            inp = frame_input(camera, inp)
        if kind == "synthetic":
            return self.check_synthetic(sp, s, prog, inp)
        if kind == "file":
            return self.check_file_source(sp, s, prog, inp, camera)
        if kind == "video":
            return self.check_video_source(sp, s)  # type: ignore[attr-defined]  # VideoChecks (video.py)
        return self.check_other_source(sp, s, kind)

    def check_dtype(self, s: Mapping[str, Any], sp: str) -> Any:
        if "dtype" not in s:
            return None
        v = s["dtype"]
        dp = _join(sp, "dtype")
        if not isinstance(v, str) or not v:
            self.err(dp, f'must be a numpy dtype name like "float32", got {_kind_of(v)}')
            return _BAD
        try:
            dt = np.dtype(v)
        except (TypeError, ValueError):
            self.err(dp, f'{v!r} is not a numpy dtype (e.g. "float32", "uint8")')
            return _BAD
        if dt.kind not in "iuf":
            self.err(dp, f"frames must be integers or floats, got {dt}")
            return _BAD
        return dt

    def check_shape(self, s: Mapping[str, Any], sp: str) -> Any:
        if "shape" not in s:
            return None
        v = s["shape"]
        if not isinstance(v, list) or not v or not all(_is_int(d) and d > 0 for d in v):
            self.err(_join(sp, "shape"), f"must be a non-empty array of positive integers, got {_kind_of(v)}")
            return _BAD
        return tuple(v)

    def match_input(self, path: str, prog: _ProgramInfo, inp: _Input, shape: tuple[int, ...] | None,
                    dtype: np.dtype | None, what: str = "") -> None:
        from ..program import TensorShapeDynamism

        target = f"input 0 of {prog.method}"
        if shape is not None:
            want = inp.sizes
            if inp.dynamism == TensorShapeDynamism.STATIC:
                ok = tuple(shape) == tuple(want)
            elif inp.dynamism == TensorShapeDynamism.DYNAMIC_BOUND:
                ok = len(shape) == len(want) and all(a <= b for a, b in zip(shape, want))
            else:
                ok = len(shape) == len(want)
            if not ok:
                bound = "" if inp.dynamism == TensorShapeDynamism.STATIC else ", dynamic; sizes are upper bounds"
                self.err(_join(path, "shape") if not what else path,
                         f"{what}{_show(list(shape))} does not match {target} ({_show(list(want))}{bound})")
        if dtype is not None and inp.dtype is not None and dtype != inp.dtype:
            self.err(_join(path, "dtype") if not what else path, f"{what}{dtype} does not match {target} ({inp.dtype})")

    def check_synthetic(self, sp: str, s: dict[str, Any], prog: _ProgramInfo | None, inp: _Input | None) -> Any:
        self.known(s, sp, _SYNTHETIC_KEYS)
        fps = self.at_most(self.get(s, "fps", sp, "positive_number"), sp, "fps", "max_fps")
        seed = self.get(s, "seed", sp, "int", 0)
        count = self.get(s, "count", sp, "nonneg_int", None)
        shape = self.check_shape(s, sp)
        dtype = self.check_dtype(s, sp)
        if inp is not None and prog is not None and shape is not _BAD and dtype is not _BAD:
            self.match_input(sp, prog, inp, shape, dtype)
        if shape is None:  # the method's input shape (unknown when the program has problems: reported)
            shape = _BAD if inp is None else inp.sizes
        if dtype is None:
            dtype = inp.dtype if inp is not None and inp.dtype is not None and inp.dtype.kind in "iuf" else np.dtype(np.float32)
        if _any_bad(fps, seed, count, shape, dtype):
            return _BAD
        params: dict[str, Any] = {"fps": fps, "shape": tuple(shape), "dtype": str(dtype), "seed": seed}
        if count is not None:
            params["count"] = count
        return SourceConfig("synthetic", params)

    def check_file_source(self, sp: str, s: dict[str, Any], prog: _ProgramInfo | None, inp: _Input | None,
                          camera: str) -> Any:
        self.known(s, sp, _FILE_KEYS)
        written = self.get(s, "path", sp, "string")
        fps = self.at_most(self.get(s, "fps", sp, "positive_number", None), sp, "fps", "max_fps")
        loop = self.get(s, "loop", sp, "bool", False)
        shape = self.check_shape(s, sp)
        dtype = self.check_dtype(s, sp)
        if _any_bad(written, fps, loop, shape, dtype):
            return _BAD
        resolved = Path(written) if Path(written).is_absolute() else (self.base / written).resolve()
        pp = _join(sp, "path")
        if not resolved.exists():
            self.err(pp, f"{written}: no such file")
            return _BAD
        params: dict[str, Any] = {"path": str(resolved), "fps": fps, "loop": loop}
        if shape is not None:
            params["shape"] = shape
        if dtype is not None:
            params["dtype"] = str(dtype)
        try:
            from ..pipeline import FramesFile
        except ImportError:  # the pipeline layer is unavailable: the checks above are all we can do
            return SourceConfig("file", params)
        try:
            frames = FramesFile(resolved, fps=fps, loop=loop, shape=shape, dtype=dtype, name=camera)
        except OrchestraError as exc:
            self.err(pp, exc.message.replace(str(resolved), written))
            return _BAD
        except Exception as exc:  # noqa: BLE001 - untrusted file contents: never a traceback
            self.err(pp, f"{written}: can't read frames: {type(exc).__name__}: {exc}")
            return _BAD
        if inp is not None and prog is not None:
            self.match_input(pp, prog, inp, tuple(frames.frame_shape), frames.dtype,
                             what=f"{written} holds frames of ")
        del frames
        return SourceConfig("file", params)

    def check_other_source(self, sp: str, s: dict[str, Any], kind: str) -> Any:
        kp = _join(sp, "kind")
        try:
            from ..pipeline import source_names
        except ImportError:
            self.err(kp, f"{kind!r} is not one of synthetic, file (the pipeline package is unavailable)")
            return _BAD
        if ":" in kind:
            module_name, _, attr = kind.partition(":")
            try:
                obj: Any = importlib.import_module(module_name)
                for part in attr.split("."):
                    obj = getattr(obj, part)
            except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001 - user code: never a traceback, never an exit
                self.err(kp, f"source {kind!r} can't be imported: {type(exc).__name__}: {exc}")
                return _BAD
            from ..pipeline._sources import module_attr_problem

            problem = module_attr_problem(obj)
            if problem is not None:
                self.err(kp, f"source {kind!r} is {_show(obj)}, {problem}")
                return _BAD
        else:
            try:
                names = source_names()
            except Exception as exc:  # noqa: BLE001 - a broken source plugin
                self.err(kp, f"can't list the sources: {type(exc).__name__}: {exc}")
                return _BAD
            if kind not in names:
                self.err(kp, f"no source kind {kind!r} (kinds: {_names(names)}; or 'module:attr'){_hint(kind, names)}")
                return _BAD
        if "name" in s:
            self.err(_join(sp, "name"), "is the camera's name: set it with the camera's name key")
            return _BAD
        return SourceConfig(kind, {k: v for k, v in s.items() if k != "kind"})

