"""``[[batch]]``: cross-camera batching. Cameras that share a program are grouped; their
frames are stacked into one execute (``orchestra.pipeline.Batcher``), results split back to
each camera.

A batched camera's frames carry the batch dimension with one row (``[1, 3, 224, 224]`` for a
method whose input 0 is ``[8, 3, 224, 224]``): its source is checked against that per-frame
shape, which is why the members are known (:meth:`BatchChecks.scan_batch_members`) before
the cameras are checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._base import _BAD, Checker, _any_bad, _hint, _join, _kind_of, _names, _show
from .programs import _Input

_BATCH_KEYS = ("name", "cameras", "max_size", "max_wait_ms", "static_batch")


@dataclass(frozen=True)
class BatchConfig:
    """One ``[[batch]]``: ``cameras`` (all on one program) share batched executes of at most
    ``max_size`` frames, one per camera, sent at the latest ``max_wait_s`` after the oldest;
    ``static_batch`` pads every batch to that many rows (a program with a fixed batch)."""

    name: str
    cameras: tuple[str, ...]
    program: str
    max_size: int
    max_wait_s: float = 0.01
    static_batch: int | None = None

    def build(self, executor: Any) -> Any:
        """An :class:`orchestra.pipeline.Batcher` over ``executor`` with these settings."""
        from orchestra.pipeline import Batcher

        return Batcher(executor, max_size=self.max_size, max_wait_s=self.max_wait_s,
                       static_batch=self.static_batch, name=self.name)


class BatchChecks(Checker):
    """Checks ``[[batch]]`` (after the cameras: needs CameraChecks and ProgramChecks in the
    composed checker); fills ``batches``. :meth:`scan_batch_members` runs before the cameras
    are checked, so a batched camera's source is checked per frame (:meth:`frame_input`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list[BatchConfig] = []
        self.batch_members: set[str] = set()

    def scan_batch_members(self, value: Any) -> None:
        """Notes the camera names ``[[batch]]`` tables list (reports nothing: the full
        check comes after the cameras)."""
        if not isinstance(value, list):
            return
        for t in value:
            cams = t.get("cameras") if isinstance(t, dict) else None
            if isinstance(cams, list):
                self.batch_members.update(c for c in cams if isinstance(c, str))

    def frame_input(self, camera: str, inp: _Input | None) -> _Input | None:
        """What one frame of ``camera`` must look like: the method's input 0, or for a
        batched camera that input with one row in the batch dimension."""
        if inp is None or camera not in self.batch_members or not inp.sizes:
            return inp
        from ..program import TensorShapeDynamism

        return _Input(inp.dtype, (1, *inp.sizes[1:]), TensorShapeDynamism.STATIC
                      if inp.dynamism != TensorShapeDynamism.DYNAMIC_UNBOUND else inp.dynamism)

    def check_batches(self, value: Any) -> None:
        names: dict[str, str] = {}
        taken: dict[str, str] = {}  # camera -> the batch path that has it
        for i, (path, t) in enumerate(self.entries(value, "batch")):
            self.known(t, path, _BATCH_KEYS)
            name = self.get(t, "name", path, "string", f"batch{i}")
            if name is not _BAD:
                if name in names:
                    self.err(_join(path, "name"), f"duplicate batch name {name!r} (also {names[name]})")
                    name = _BAD
                else:
                    names[name] = path
            cameras = self.check_batch_cameras(path, t, taken)
            max_size = self.get(t, "max_size", path, "positive_int",
                                len(cameras) if cameras is not _BAD else _BAD)
            max_wait_ms = self.get(t, "max_wait_ms", path, "nonneg_number", 10.0)
            if max_wait_ms is not _BAD and max_wait_ms > 60_000:
                self.err(_join(path, "max_wait_ms"), f"{_show(max_wait_ms)} is more than a minute")
                max_wait_ms = _BAD
            static = self.get(t, "static_batch", path, "positive_int", None)
            if _any_bad(name, cameras, max_size, max_wait_ms, static):
                continue
            if static is not None and max_size > static:
                self.err(_join(path, "max_size"), f"{max_size} is more than static_batch ({static}): a batch "
                                                  f"can't hold more frames than rows")
                continue
            program = self.check_batch_program(path, cameras, max_size, static)
            if program is _BAD:
                continue
            if len(cameras) == 1:
                self.warnings.append(f"{_join(path, 'cameras')}: one camera: its frames have nothing to batch with")
            self.batches.append(BatchConfig(name, tuple(cameras), program, max_size, max_wait_ms / 1000.0, static))

    def check_batch_cameras(self, path: str, t: dict[str, Any], taken: dict[str, str]) -> Any:
        cp = _join(path, "cameras")
        if "cameras" not in t:
            self.err(cp, 'missing (required): the cameras to batch, e.g. cameras = ["front", "rear"]')
            return _BAD
        v = t["cameras"]
        if not isinstance(v, list) or not v or not all(isinstance(c, str) and c for c in v):
            self.err(cp, f"must be a non-empty array of camera names, got {_kind_of(v)}")
            return _BAD
        ok = True
        seen: set[str] = set()
        for c in v:
            if c in seen:
                self.err(cp, f"lists camera {c!r} twice")
                ok = False
                continue
            seen.add(c)
            if c not in self.camera_names:
                self.err(cp, f"no camera named {c!r} (cameras: {_names(self.camera_names)}){_hint(c, self.camera_names)}")
                ok = False
            elif c in taken:
                self.err(cp, f"camera {c!r} is already in {taken[c]}: a camera is in at most one batch")
                ok = False
            else:
                taken[c] = path
        return list(v) if ok else _BAD

    def check_batch_program(self, path: str, cameras: list[str], max_size: int, static: int | None) -> Any:
        """The one program the cameras share, after checking that its input 0 has a batch
        dimension that holds ``max_size`` frames (or exactly ``static`` rows)."""
        from ..program import TensorShapeDynamism

        configs = {c.name: c for c in self.cameras}
        if any(c not in configs for c in cameras):
            return _BAD  # a camera with problems of its own (reported)
        programs = {configs[c].program for c in cameras}
        cp = _join(path, "cameras")
        if len(programs) > 1:
            uses = ", ".join(f"{c} -> {configs[c].program}" for c in cameras)
            self.err(cp, f"cameras of one batch must share one program ({uses})")
            return _BAD
        (pname,) = programs
        prog = self.programs.get(pname)
        if prog is None or not prog.inputs or len(prog.inputs) != 1 or not prog.inputs[0].sizes:
            if prog is not None and prog.inputs and len(prog.inputs) == 1:
                self.err(cp, f"{prog.where} takes a scalar input: no batch dimension to stack frames in")
                return _BAD
            return _BAD  # reported with the program or the cameras' sources
        inp = prog.inputs[0]
        rows = inp.sizes[0]
        shape = _show(list(inp.sizes))
        if inp.dynamism == TensorShapeDynamism.STATIC:
            if static is None:
                if rows == 1:
                    self.err(path, f"{prog.where} takes batches of exactly 1 (input 0 is {shape}): export it with "
                                   f"a batch dimension (torch.export.Dim) or a fixed batch >= max_size")
                else:
                    self.err(path, f"{prog.where} takes batches of exactly {rows} (input 0 is {shape}): set "
                                   f"static_batch = {rows} to pad partial batches")
                return _BAD
            if static != rows:
                self.err(_join(path, "static_batch"), f"{static} does not match {prog.where}, whose input 0 is "
                                                      f"{shape} (batch {rows})")
                return _BAD
        elif inp.dynamism == TensorShapeDynamism.DYNAMIC_BOUND:
            need = static if static is not None else max_size
            if need > rows:
                key = "static_batch" if static is not None else "max_size"
                self.err(_join(path, key), f"{need} is more than the batch bound of {prog.where} (input 0 is "
                                           f"{shape}, dynamic; sizes are upper bounds)")
                return _BAD
        return pname
