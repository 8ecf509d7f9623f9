"""``[program]`` / ``[[program]]``: the programs, loaded and checked (the method exists, its
delegated backends are registered and available, its NpuSim working set)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import OrchestraError
from ._base import _BAD, _MISSING, NPU_BACKEND, Checker, _hint, _join, _kind_of, _names

_PROGRAM_KEYS = ("name", "path", "method")


@dataclass(frozen=True)
class ProgramConfig:
    """A program: ``path`` is absolute (resolved against the config's folder)."""

    name: str
    path: Path
    method: str = "forward"



@dataclass
class _Input:
    dtype: np.dtype | None
    sizes: tuple[int, ...]
    dynamism: int


def _tensor_info(plan: Any, vi: int) -> _Input:
    """dtype, sizes and dynamism of value ``vi`` of ``plan`` (no dtype: not a tensor)."""
    from ..program import Tensor as TensorDef
    from ..program import TensorShapeDynamism, numpy_dtype

    t = plan.values[vi].val if 0 <= vi < len(plan.values) else None
    if isinstance(t, TensorDef):
        return _Input(numpy_dtype(t.scalar_type), tuple(t.sizes), t.shape_dynamism)
    return _Input(None, (), TensorShapeDynamism.STATIC)


@dataclass
class _ProgramInfo:
    name: str
    written: str  # the path as the file gives it
    path: Path
    method: str
    inputs: list[_Input] | None = None  # None: the program couldn't be read
    outputs: list[_Input] | None = None
    backends: tuple[str, ...] = ()
    npu_working_set: int = 0  # bytes one instance reserves on its NPU core

    @property
    def where(self) -> str:
        return f"method {self.method!r} of {self.written}"



class ProgramChecks(Checker):
    """Checks ``[program]``; fills ``programs`` (what the other tables check against)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.programs: dict[str, _ProgramInfo] = {}
        self.programs_broken = False  # a [program] entry without a usable name (reported)
        self.program_configs: list[ProgramConfig] = []

    def check_programs(self, value: Any) -> None:
        if value is _MISSING:
            self.err("program", 'missing (required): add [program] with path = "model.pte"')
            return
        if isinstance(value, dict):
            entries = [("program", value)]
        elif isinstance(value, list):
            if not value:
                self.err("program", "no programs: add [[program]] entries or one [program] table")
                return
            entries = [(f"program[{i}]", v) for i, v in enumerate(value)]
        else:
            self.err("program", f"must be a table ([program]) or an array of tables ([[program]]), got {_kind_of(value)}")
            return
        many = len(entries) > 1
        seen: dict[str, str] = {}
        for path, raw in entries:
            t = self.table(raw, path)
            if t is None:
                continue
            self.known(t, path, _PROGRAM_KEYS)
            written = self.get(t, "path", path, "string")
            method = self.get(t, "method", path, "string", "forward")
            name = self.get(t, "name", path, "string", None if not many else _MISSING)
            if name is None and written is not _BAD:
                name = Path(written).stem or "main"
            if name is _BAD or name is None:
                self.programs_broken = True
                continue
            if name in seen:
                self.err(_join(path, "name"), f"duplicate program name {name!r} (also {seen[name]})")
                continue
            seen[name] = path
            if written is _BAD or method is _BAD:
                self.programs[name] = _ProgramInfo(name, "?", Path(), "forward", None)
                continue
            resolved = (self.base / written).resolve() if not Path(written).is_absolute() else Path(written)
            info = _ProgramInfo(name, written, resolved, method)
            self.programs[name] = info
            self.load_program(info, path)
            self.program_configs.append(ProgramConfig(name, resolved, method))

    def load_program(self, info: _ProgramInfo, path: str) -> None:
        from ..program import load, loads

        p = _join(path, "path")
        if not info.path.exists():
            self.err(p, f"{info.written}: no such file")
            return
        if info.path.is_dir():
            self.err(p, f"{info.written}: is a directory, not a .pte file")
            return
        if not info.path.is_file():  # a FIFO or a device would block or never end
            self.err(p, f"{info.written}: not a regular file")
            return
        try:
            prog = load(str(info.path))
        except OrchestraError as exc:
            self.err(p, exc.message.replace(str(info.path), info.written))  # the path as the file wrote it
            return
        except (OSError, MemoryError, ValueError) as exc:
            self.err(p, f"{info.written}: can't read: {type(exc).__name__}: {exc}")
            return
        methods = prog.method_names
        if info.method not in methods:
            self.err(_join(path, "method"), f"no method {info.method!r} in {info.written} (methods: {_names(methods)})"
                     f"{_hint(info.method, methods)}")
            return
        plan = prog.plan(info.method)
        inputs = [_tensor_info(plan, vi) for vi in plan.inputs]
        info.inputs = inputs
        info.outputs = [_tensor_info(plan, vi) for vi in plan.outputs]
        backends: list[str] = []
        for d in plan.delegates:
            if d.id not in backends:
                backends.append(d.id)
        info.backends = tuple(backends)
        for b in backends:
            if b not in self.backend_names():
                self.err(p, f"{info.where} delegates to backend {b!r}, which is not registered "
                            f"(registered: {_names(self.backend_names())})")
                continue
            from ..runtime import get_backend_class

            try:
                available = get_backend_class(b).is_available()
            except Exception:  # noqa: BLE001 - a plugin's is_available must not break validation
                available = False
            if not available:
                self.err(p, f"{info.where} delegates to backend {b!r}, which is not available on this machine")
        if NPU_BACKEND in backends and NPU_BACKEND in self.backend_names():
            try:
                from ..backends.npu_sim import analyze_subgraph

                total = 0
                for d in plan.delegates:
                    if d.id == NPU_BACKEND:
                        total += analyze_subgraph(loads(bytes(prog.delegate_data(d.processed)))).working_set_bytes
                info.npu_working_set = total
            except OrchestraError as exc:
                self.err(p, f"{info.where}: {NPU_BACKEND} delegate: {exc.message}")
            except (IndexError, ImportError) as exc:
                self.err(p, f"{info.where}: {NPU_BACKEND} delegate can't be read: {exc}")
