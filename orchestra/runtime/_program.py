"""``Program``: an immutable, thread-safe loaded ``.pte`` shared by all its Methods."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from ..errors import InvalidArgumentError, NotFoundError, ProgramError
from ..program import Limits, ProgramDef, load, loads
from ._method import CompiledPlan, Method, MethodMeta, method_meta

__all__ = ["Program", "load_program"]


class Program:
    """A verified program. Immutable and safe to share between threads; its constants are
    read-only views into the file's bytes (or its memory map), shared by every Method."""

    __slots__ = ("_def", "_source", "_metas", "_compiled")

    def __init__(self, program: ProgramDef, *, source: str = "program") -> None:
        self._def = program
        self._source = source
        self._metas = {p.name: method_meta(program, p) for p in program.execution_plan}
        # Compiled plans, built on first load_method and shared by every Method after it.
        # A race builds one twice; both are equivalent and the dict assignment is atomic.
        self._compiled: dict[str, CompiledPlan] = {}

    @property
    def definition(self) -> ProgramDef:
        """The parsed program (format-layer dataclasses)."""
        return self._def

    @property
    def source(self) -> str:
        """Where the program came from (a path, or ``"<bytes>"``)."""
        return self._source

    @property
    def method_names(self) -> tuple[str, ...]:
        return self._def.method_names

    def method_meta(self, name: str) -> MethodMeta:
        """Inputs, outputs (dtype, shape, dynamic bounds) and planned memory of ``name``."""
        try:
            return self._metas[name]
        except KeyError:
            raise NotFoundError(
                f"{self._source}: method {name!r} not found (methods: {', '.join(self.method_names) or 'none'})"
            ) from None

    def load_method(self, name: str = "forward", *, backend_options: Mapping[str, Mapping[str, Any]] | None = None) -> Method:
        """A NEW independent Method (own arenas and delegate handles) on every call.

        ``backend_options`` gives this instance's options per backend id
        (``{"A": {"threads": 2}}``); every delegate of backend A in this Method sees them in
        ``BackendInitContext.runtime_specs`` (declared defaults fill the rest).

        Raises:
            NotFoundError: no such method.
            OperatorMissingError: an operator has no kernel (named, with the nearest names).
            BackendError: a delegate's backend is not registered or not available.
        """
        self.method_meta(name)
        cp = self._compiled.get(name)
        if cp is None:
            cp = CompiledPlan(self._def, self._def.plan(name), f"{self._source}: method {name!r}")
            self._compiled[name] = cp
        return Method(cp, backend_options)

    def __repr__(self) -> str:
        return f"<Program {self._source} methods={list(self.method_names)}>"


def load_program(
    source: str | os.PathLike[str] | bytes | bytearray | memoryview | ProgramDef,
    *,
    verification: Literal["full"] = "full",
    limits: Limits | None = None,
) -> Program:
    """Loads and verifies a program from a path (memory-mapped), bytes, or a ProgramDef.

    ``verification="full"`` (the only mode) bounds-checks every access and checks every
    cross reference; ``.pte`` files are treated as untrusted input.
    """
    if verification != "full":
        raise InvalidArgumentError(f"verification must be 'full', got {verification!r}")
    if isinstance(source, ProgramDef):
        return Program(source, source="<ProgramDef>")
    if isinstance(source, (bytes, bytearray, memoryview)):
        return Program(loads(source, limits=limits), source="<bytes>")
    if isinstance(source, (str, os.PathLike)):
        return Program(load(source, limits=limits), source=os.fspath(source))
    raise ProgramError(f"cannot load a program from a {type(source).__name__}")
