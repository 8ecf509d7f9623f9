"""IREE-style runtime instances and sessions.

A :class:`Runtime` is an instance with its own view of the backend registry (which backends
its programs may use) and its devices. A :class:`Session` holds isolated state: programs are
appended to it, functions are looked up by ``"program.method"`` and cached, and ``trim()``
frees every arena and delegate handle until the next call. One task or thread uses a session
at a time; different sessions run concurrently.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import BackendError, Error, InvalidArgumentError, NotFoundError, OrchestraError
from ..program import ProgramDef
from ._backend import registered_backends
from ._method import Method
from ._program import Program, ProgramInstance, load_program

__all__ = ["Function", "Runtime", "Session", "SessionStatistics"]


class Runtime:
    """A runtime instance: the backends its sessions may use, and its devices.

    Args:
        backends: names of registered backends this runtime allows; None allows all.
        devices: named device objects (e.g. a simulated NPU) available to its sessions.
    """

    def __init__(self, *, backends: Iterable[str] | None = None, devices: Mapping[str, Any] | None = None) -> None:
        if backends is not None:
            backends = frozenset(backends)
            unknown = sorted(backends - set(registered_backends()))
            if unknown:
                raise BackendError(
                    f"Runtime: backend(s) {', '.join(map(repr, unknown))} not registered "
                    f"(registered: {', '.join(registered_backends()) or 'none'})", Error.NotFound)
        self._backends: frozenset[str] | None = backends
        self._devices = dict(devices or {})

    @property
    def backends(self) -> tuple[str, ...]:
        """The backends this runtime's sessions may use."""
        return tuple(sorted(self._backends)) if self._backends is not None else registered_backends()

    @property
    def devices(self) -> Mapping[str, Any]:
        return dict(self._devices)

    def allows(self, backend: str) -> bool:
        return self._backends is None or backend in self._backends

    def session(self) -> Session:
        """A new, empty session."""
        return Session(self)


@dataclass(frozen=True, slots=True)
class SessionStatistics:
    programs: int
    functions: int  # functions looked up (cached handles)
    live_methods: int  # functions whose Method is currently loaded
    calls: int
    trims: int


class Function:
    """A cached handle to ``program.method`` in one session. Its Method is loaded on the first
    call and again after ``Session.trim()``."""

    __slots__ = ("session", "program_name", "method_name", "_program", "_method")

    def __init__(self, session: Session, program_name: str, method_name: str, program: Program) -> None:
        self.session = session
        self.program_name = program_name
        self.method_name = method_name
        self._program = program
        self._method: Method | None = None

    @property
    def name(self) -> str:
        return f"{self.program_name}.{self.method_name}"

    @property
    def meta(self):  # -> MethodMeta
        return self._program.method_meta(self.method_name)

    def _loaded(self) -> Method:
        m = self._method
        if m is None:
            m = self._method = self.session._instance(self.program_name)._add(self.method_name)
        return m

    def _trim(self) -> bool:
        m, self._method = self._method, None
        return m is not None  # closed with its ProgramInstance by Session.trim

    def __repr__(self) -> str:
        return f"<Function {self.name} ({'loaded' if self._method else 'trimmed'})>"


class Session:
    """Isolated state: its own programs, functions and Methods. Create with
    ``Runtime.session()`` (or ``Session(runtime)``); close when done (or use ``with``).

    The functions of one program in a session are methods of one
    :class:`~orchestra.runtime.ProgramInstance`: state the program shares between methods
    (``set_state`` then ``get_state``; a KV cache written by ``prefill``, read by ``decode``)
    is shared by its functions here, and by no other session. ``trim()`` frees that state too.
    """

    def __init__(self, runtime: Runtime | None = None) -> None:
        self.runtime = runtime or Runtime()
        self._programs: dict[str, Program] = {}
        self._functions: dict[str, Function] = {}
        self._instances: dict[str, ProgramInstance] = {}
        self._calls = 0
        self._trims = 0
        self._closed = False

    # -- programs -----------------------------------------------------------------------
    def append_program(
        self,
        program: Program | ProgramDef | str | os.PathLike[str] | bytes | bytearray | memoryview,
        *,
        name: str | None = None,
    ) -> str:
        """Adds a program and returns the name its functions are looked up under: ``name``,
        else the file's stem, else ``"program"``. Checks every delegate's backend is allowed
        by this session's runtime."""
        self._check_open()
        if name is None:
            name = pathlib.Path(os.fspath(program)).stem if isinstance(program, (str, os.PathLike)) else "program"
        if not name or "." in name:
            raise InvalidArgumentError(f"program name {name!r} must be non-empty and contain no '.'")
        if name in self._programs:
            raise InvalidArgumentError(f"a program named {name!r} is already in this session (programs: {', '.join(self._programs)})")
        prog = program if isinstance(program, Program) else load_program(program)
        for m in prog.method_names:
            for b in prog.method_meta(m).backends:
                if not self.runtime.allows(b):
                    raise BackendError(
                        f"program {name!r} method {m!r} delegates to backend {b!r}, which this runtime does not allow "
                        f"(allowed: {', '.join(self.runtime.backends) or 'none'})", Error.NotFound)
        self._programs[name] = prog
        return name

    @property
    def program_names(self) -> tuple[str, ...]:
        return tuple(self._programs)

    # -- functions ----------------------------------------------------------------------
    def lookup_function(self, name: str) -> Function:
        """The cached handle for ``"program.method"``.

        Raises:
            NotFoundError: no such program or method (the message lists what exists).
        """
        self._check_open()
        fn = self._functions.get(name)
        if fn is not None:
            return fn
        prog_name, dot, method = name.rpartition(".")
        if not dot or not prog_name:
            raise InvalidArgumentError(f"function name {name!r} must be 'program.method'")
        prog = self._programs.get(prog_name)
        if prog is None:
            raise NotFoundError(f"no program {prog_name!r} in this session (programs: {', '.join(self._programs) or 'none'})")
        if method not in prog.method_names:
            raise NotFoundError(f"program {prog_name!r} has no method {method!r} (methods: {', '.join(prog.method_names)})")
        fn = self._functions[name] = Function(self, prog_name, method, prog)
        return fn

    def call(self, fn: Function, inputs: Sequence[Any]) -> list[Any]:
        """Executes ``fn`` (loading its Method if needed) and returns its outputs."""
        self._check_open()
        if fn.session is not self:
            raise InvalidArgumentError(f"function {fn.name} belongs to another session")
        self._calls += 1
        return fn._loaded().execute(inputs)

    def call_by_name(self, name: str, inputs: Sequence[Any]) -> list[Any]:
        """``call(lookup_function(name), inputs)``."""
        return self.call(self.lookup_function(name), inputs)

    def _instance(self, program_name: str) -> ProgramInstance:
        inst = self._instances.get(program_name)
        if inst is None:
            inst = self._instances[program_name] = ProgramInstance(self._programs[program_name])
        return inst

    def trim(self) -> int:
        """Frees every loaded Method's arenas and delegate handles, and the programs' mutable
        state (all rebuilt, state from its initial values, on the next call). Returns how
        many Methods were freed."""
        freed = sum(fn._trim() for fn in self._functions.values())
        instances, self._instances = self._instances, {}
        for inst in instances.values():
            inst.close()
        self._trims += 1
        return freed

    def statistics(self) -> SessionStatistics:
        return SessionStatistics(
            programs=len(self._programs),
            functions=len(self._functions),
            live_methods=sum(fn._method is not None for fn in self._functions.values()),
            calls=self._calls,
            trims=self._trims,
        )

    def close(self) -> None:
        """Frees everything; the session can't be used afterwards. Idempotent."""
        if not self._closed:
            self.trim()
            self._closed = True
            self._functions.clear()
            self._programs.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise OrchestraError("session is closed", Error.InvalidState)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
