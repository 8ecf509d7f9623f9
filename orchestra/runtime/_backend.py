"""The backend interface and registry (ExecuTorch's ``BackendInterface``, in Python).

A backend turns a delegate's processed blob into a handle at ``init`` and runs it at each
``DelegateCall``. Backends are registered by name, explicitly with :func:`register_backend`
or through the entry-point group ``orchestra.backends`` (each entry point names a
:class:`Backend` or a :class:`BackendInterface` subclass), discovered once, on first lookup.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, ClassVar

from ..errors import BackendError, Error, InvalidArgumentError
from ..program import CompileSpec
from ._options import OptionSpec, RuntimeSpecs, validate_option_specs

__all__ = [
    "Backend",
    "BackendExecutionContext",
    "BackendInitContext",
    "BackendInterface",
    "OptionSpec",
    "RuntimeSpecs",
    "get_backend_class",
    "register_backend",
    "registered_backends",
]

ENTRY_POINT_GROUP = "orchestra.backends"


_NO_SPECS = RuntimeSpecs("", ())


@dataclass(frozen=True, slots=True)
class BackendInitContext:
    """What a backend sees at ``init``.

    ``runtime_specs`` holds this Method instance's values for this backend (every declared
    option; defaults fill the rest). ``named_data(key)`` returns the program's named data.

    ``program_cache`` is one dict per (Program, method, delegate), shared by every Method
    instance of that Program: the place for derived, read-only data a backend computes from
    the processed blob once (prepacked or re-laid-out weights), so N instances cost N x
    activations, never N x weights. Two Methods may initialise at once; store with
    ``setdefault`` and treat what is stored as immutable. None when the caller has no Program
    (a backend must then compute what it needs itself).
    """

    method_name: str
    delegate_index: int
    backend_id: str
    named_data: Any = field(default=None, repr=False)  # callable key -> memoryview, or None
    runtime_specs: RuntimeSpecs = _NO_SPECS
    program_cache: dict[str, Any] | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class BackendExecutionContext:
    """What a backend sees at each ``execute``: ``runtime_specs`` is the snapshot in force
    for this execute (hot values, with any per-call overrides applied)."""

    method_name: str
    delegate_index: int
    runtime_specs: RuntimeSpecs = _NO_SPECS


class BackendInterface(abc.ABC):
    """One backend. Instances are shared by every Method that uses the backend, so keep
    per-delegate state in the handle ``init`` returns, never on ``self``.

    ``option_specs`` declares the runtime options the backend accepts (none by default: a
    backend that declares nothing accepts nothing and pays nothing).
    """

    option_specs: ClassVar[tuple[OptionSpec, ...]] = ()
    # What to install when is_available() is False for want of a package, e.g.
    # "pip install 'orchestra[onnx]'": it ends the "not available" error's message.
    install_hint: ClassVar[str] = ""

    def is_available(self) -> bool:
        """False when the backend can't run here (missing hardware or library)."""
        return True

    @abc.abstractmethod
    def init(self, context: BackendInitContext, processed: memoryview, compile_specs: tuple[CompileSpec, ...]) -> Any:
        """Builds a handle from the processed blob. Raise an OrchestraError on failure."""

    @abc.abstractmethod
    def execute(self, context: BackendExecutionContext, handle: Any, args: list[Any]) -> None:
        """Runs the delegate. ``args`` holds the DelegateCall's values in order (numpy
        arrays for tensors); write outputs into their arrays, or replace ``args[i]`` with a
        new array when an output's shape changes."""

    def destroy(self, handle: Any) -> None:
        """Releases a handle. Called exactly once per successful ``init``."""

    def delegate_outputs(self, context: BackendInitContext, processed: memoryview,
                         compile_specs: tuple[CompileSpec, ...]) -> frozenset[int] | None:
        """The positions in the DelegateCall's ``args`` that ``execute`` writes: each one
        whole, at every execute, without reading it first; every other argument it only
        reads (never writes, not even in part). Asked once per Program when its plan is
        compiled (before any ``init``; ``context.runtime_specs`` holds the defaults), so the
        runtime may leave copies out around the call (an argument read in place of the copy
        it was made from). None (the default): unknown, every argument may be read and
        written. Answer only what holds for every blob this method accepts; raise nothing
        (a blob ``init`` would reject: return None)."""
        return None

    def delegate_in_place(self, context: BackendInitContext, processed: memoryview,
                          compile_specs: tuple[CompileSpec, ...]) -> frozenset[tuple[int, int]]:
        """Pairs (input position, output position) of the DelegateCall's ``args`` where
        ``execute`` has read every byte of the input before it writes any byte of the
        output, at every execute: the two may then share memory (the runtime may pass a
        view of memory the output is planned on, see :meth:`delegate_outputs`). Asked like
        ``delegate_outputs``, only when such a pair would help; what a backend computes for
        it belongs in ``context.program_cache`` for ``init``. Empty (the default): no input
        may share memory with an output."""
        return frozenset()


@dataclass(frozen=True, slots=True)
class Backend:
    """A name bound to a backend implementation."""

    name: str
    backend: BackendInterface


# Registry: filled by register_backend and by entry-point discovery (DESIGN: the only
# module-level mutable state allowed).
_REGISTRY: dict[str, Backend] = {}
_DISCOVERED: list[bool] = []


def register_backend(backend: Backend) -> None:
    """Registers ``backend`` under its name. A duplicate name is an error."""
    if not isinstance(backend, Backend) or not isinstance(backend.backend, BackendInterface):
        raise InvalidArgumentError(f"register_backend takes a Backend(name, BackendInterface()), got {backend!r}")
    if backend.name in _REGISTRY:
        raise InvalidArgumentError(f"backend {backend.name!r} is already registered")
    validate_option_specs(backend.name, backend.backend.option_specs)
    _REGISTRY[backend.name] = backend


def _discover(name: str | None = None) -> None:
    """Loads the backends of the entry-point group: all of them once, or (``name``) only the
    entry points of that name, so a program's backend is found without importing every
    installed plugin (what a first load would otherwise pay for)."""
    if _DISCOVERED:
        return
    if name is None:
        _DISCOVERED.append(True)
        found = entry_points(group=ENTRY_POINT_GROUP)
    else:
        found = entry_points(group=ENTRY_POINT_GROUP, name=name)
    for ep in found:
        if ep.name in _REGISTRY:
            continue
        try:
            obj = ep.load()
            if isinstance(obj, type) and issubclass(obj, BackendInterface):
                obj = Backend(ep.name, obj())
            if isinstance(obj, Backend):
                validate_option_specs(obj.name, obj.backend.option_specs)
                _REGISTRY.setdefault(obj.name, obj)
        except Exception as exc:  # a broken plugin must not break every program
            raise BackendError(
                f"entry point {ep.name!r} in group {ENTRY_POINT_GROUP!r} ({ep.value}) failed to load: {exc}",
                Error.NotFound,
            ) from exc


def registered_backends() -> tuple[str, ...]:
    """Names of every registered backend, sorted."""
    _discover()
    return tuple(sorted(_REGISTRY))


def get_backend_class(name: str) -> BackendInterface:
    """The backend registered as ``name``.

    Raises:
        BackendError: code NotFound when no backend has that name (the message lists those
            that exist).
    """
    if name not in _REGISTRY:
        _discover(name)
    if name not in _REGISTRY:
        _discover()
    try:
        return _REGISTRY[name].backend
    except KeyError:
        have = ", ".join(sorted(_REGISTRY)) or "none"
        raise BackendError(f"backend {name!r} is not registered (registered: {have})", Error.NotFound) from None
