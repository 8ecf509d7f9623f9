"""``Program``: an immutable, thread-safe loaded ``.pte`` shared by all its Methods."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..errors import Error, InvalidArgumentError, NotFoundError, OrchestraError, ProgramError
from ..program import Limits, ProgramDef, load, loads
from ._method import CompiledPlan, Method, MethodMeta, MethodStatistics, StateLayout, _gc_paused, method_meta

__all__ = ["Program", "ProgramInstance", "ProgramInstanceStatistics", "load_program"]


class Program:
    """A verified program. Immutable and safe to share between threads; its constants are
    read-only views into the file's bytes (or its memory map), shared by every Method."""

    __slots__ = ("_def", "_source", "_metas", "_compiled", "_state_layout")

    def __init__(self, program: ProgramDef, *, source: str = "program") -> None:
        self._def = program
        self._source = source
        self._metas = {p.name: method_meta(program, p) for p in program.execution_plan}
        # Compiled plans, built on first load_method and shared by every Method after it.
        # A race builds one twice; both are equivalent and the dict assignment is atomic.
        self._compiled: dict[str, CompiledPlan] = {}
        self._state_layout = StateLayout.of(program, source)

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
        return Method(self._compiled_plan(name), backend_options)

    def _compiled_plan(self, name: str) -> CompiledPlan:
        self.method_meta(name)
        cp = self._compiled.get(name)
        if cp is None:
            with _gc_paused():
                cp = CompiledPlan(self._def, self._def.plan(name), f"{self._source}: method {name!r}",
                                  state_layout=self._state_layout)
            self._compiled[name] = cp
        return cp

    def load_methods(
        self,
        names: Iterable[str] | None = None,
        *,
        backend_options: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> ProgramInstance:
        """A NEW program instance: the methods ``names`` (default: all) loaded together so
        that they share the program's mutable state, as one ExecuTorch ``Module`` with shared
        memory arenas does. Each instance has its own state; two instances never see each
        other's. Use it for programs whose methods share mutable buffers (exported with
        ``MemoryPlanningPass(share_mutable_buffers=True)``: a KV cache written by ``prefill``
        and read by ``decode``; ``forward`` / ``get_state`` / ``set_state``).

        ``backend_options`` gives each method the options of the backends it delegates to
        (see :meth:`load_method`); a backend no loaded method uses is an error.

        Raises:
            NotFoundError: no such method.
            OperatorMissingError, BackendError: as :meth:`load_method`.
        """
        inst = ProgramInstance(self, backend_options)
        try:
            for n in (self.method_names if names is None else tuple(names)):
                inst._add(n)
            used = {b for n in inst.method_names for b in self.method_meta(n).backends}
            unused = sorted(set(backend_options or {}) - used)
            if unused:
                raise InvalidArgumentError(
                    f"{self._source}: backend_options for {', '.join(map(repr, unused))}, which no loaded method "
                    f"delegates to (they use: {', '.join(sorted(used)) or 'no backend'})")
        except BaseException:
            inst.close()
            raise
        return inst

    def __repr__(self) -> str:
        return f"<Program {self._source} methods={list(self.method_names)}>"


@dataclass(frozen=True, slots=True)
class ProgramInstanceStatistics:
    """Counters of one ProgramInstance (``methods``: per loaded method, by name)."""

    executions: int
    failures: int
    total_seconds: float
    shared_bytes: int  # the arenas its methods share (their mutable state)
    methods: tuple[tuple[str, MethodStatistics], ...]


class ProgramInstance:
    """The methods of one program, loaded together and sharing that program's mutable state.

    Create with :meth:`Program.load_methods`. Memory the program planned for state shared
    between methods (memory ids 2 and up, where ExecuTorch's ``share_mutable_buffers``
    places it) and its unplanned named mutable buffers are one allocation per instance,
    seen by every method; each method keeps its own activation arena (memory id 1), so
    state a method keeps there stays its own. Initial values of shared state are loaded once,
    when the first method using them is loaded. Like a :class:`Method`, one thread uses an
    instance at a time: a second concurrent execute of any of its methods raises.
    """

    __slots__ = ("_program", "_options", "_methods", "_busy", "_shared", "_initialized", "_closed")

    def __init__(self, program: Program, backend_options: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self._program = program
        self._options = backend_options
        self._methods: dict[str, Method] = {}
        self._busy = [False]
        self._shared: dict[Any, np.ndarray] = {}  # ("planned", memory id) | "state" -> arena
        self._initialized: set[tuple[Any, int]] = set()
        self._closed = False
        sizes: dict[int, int] = {}
        for meta in program._metas.values():
            for mid, size in enumerate(meta.planned_buffer_sizes[1:], 2):
                sizes[mid] = max(sizes.get(mid, 0), size)
        for mid, size in sizes.items():
            self._shared["planned", mid] = np.zeros(size, np.uint8)
        if program._state_layout.size:
            self._shared["state"] = np.zeros(program._state_layout.size, np.uint8)

    @property
    def program(self) -> Program:
        return self._program

    @property
    def method_names(self) -> tuple[str, ...]:
        """The methods loaded in this instance, in load order."""
        return tuple(self._methods)

    def _add(self, name: str) -> Method:
        if self._closed:
            raise OrchestraError(f"{self._program.source}: program instance is closed", Error.InvalidState)
        m = self._methods.get(name)
        if m is not None:
            return m
        cp = self._program._compiled_plan(name)
        keys = {mid: ("planned", mid) for mid in range(2, len(cp.plan.non_const_buffer_sizes))}
        if cp.state_arena:
            keys[cp.state_arena] = "state"
        shared = {mid: self._shared[k] for mid, k in keys.items()}
        opts = {b: v for b, v in (self._options or {}).items() if b in cp.meta.backends}
        m = Method(cp, opts, shared_arenas=shared, busy=self._busy)
        for mid, off, data in cp.initial:
            k = keys.get(mid)
            if k is not None and (k, off) not in self._initialized:
                self._initialized.add((k, off))
                shared[mid][off : off + len(data)] = np.frombuffer(data, np.uint8)
        self._methods[name] = m
        return m

    def method(self, name: str = "forward") -> Method:
        """The loaded Method ``name`` of this instance (it shares this instance's state).

        Raises:
            NotFoundError: ``name`` was not loaded into this instance.
        """
        try:
            return self._methods[name]
        except KeyError:
            raise NotFoundError(
                f"{self._program.source}: method {name!r} is not loaded in this program instance "
                f"(loaded: {', '.join(self._methods) or 'none'})") from None

    def execute(self, name: str, inputs: Sequence[Any],
                backend_options: Mapping[str, Mapping[str, Any]] | None = None) -> list[Any]:
        """``method(name).execute(inputs, backend_options)``."""
        return self.method(name).execute(inputs, backend_options)

    def set_options(self, options: Mapping[str, Mapping[str, Any]]) -> None:
        """Changes options (``{backend: {option: value}}``) in every loaded method that uses
        each backend (see :meth:`Method.set_options`); everything is checked first.

        Raises:
            InvalidArgumentError: no loaded method uses a backend, or a bad key / value.
        """
        if not isinstance(options, Mapping):
            raise InvalidArgumentError(f"{self._program.source}: options must be a mapping backend -> "
                                       f"{{option: value}}, got {type(options).__name__}")
        for backend_id in options:
            if not any(backend_id in m.meta.backends for m in self._methods.values()):
                raise InvalidArgumentError(
                    f"{self._program.source}: backend {backend_id!r} is used by no method of this program instance")
        for m in self._methods.values():
            mine = {b: v for b, v in options.items() if b in m.meta.backends}
            if mine:
                m.set_options(mine)

    def options(self) -> Mapping[str, Mapping[str, Any]]:
        """The options in force: backend -> option -> value (from the first loaded method
        using each backend; they all get the same changes)."""
        out: dict[str, Mapping[str, Any]] = {}
        for m in self._methods.values():
            for b, v in m.options().items():
                out.setdefault(b, v)
        return out

    def set_backend_options(self, backend_id: str, values: Mapping[str, Any]) -> None:
        """Deprecated: ``set_options({backend_id: values})``."""
        warnings.warn("ProgramInstance.set_backend_options(backend, values) is deprecated; use "
                      "set_options({backend: values})", DeprecationWarning, stacklevel=2)
        self.set_options({backend_id: values})

    def statistics(self) -> ProgramInstanceStatistics:
        per = tuple((n, m.statistics()) for n, m in self._methods.items())
        return ProgramInstanceStatistics(
            executions=sum(s.executions for _, s in per),
            failures=sum(s.failures for _, s in per),
            total_seconds=sum(s.total_seconds for _, s in per),
            shared_bytes=sum(a.nbytes for a in self._shared.values()),
            methods=per,
        )

    def close(self) -> None:
        """Closes every method and frees the shared state. Idempotent."""
        if self._closed:
            return
        self._closed = True
        methods, self._methods = self._methods, {}
        for m in methods.values():
            m.close()
        self._shared.clear()

    def __enter__(self) -> ProgramInstance:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<ProgramInstance {self._program.source} methods={list(self._methods)}"
                f"{' closed' if self._closed else ''}>")


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
    with _gc_paused():
        if isinstance(source, ProgramDef):
            return Program(source, source="<ProgramDef>")
        if isinstance(source, (bytes, bytearray, memoryview)):
            return Program(loads(source, limits=limits), source="<bytes>")
        if isinstance(source, (str, os.PathLike)):
            return Program(load(source, limits=limits), source=os.fspath(source))
    raise ProgramError(f"cannot load a program from a {type(source).__name__}")


