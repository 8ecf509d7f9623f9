"""ExecuTorch's ahead-of-time backend seed, without torch: ``BackendDetails.preprocess``.

A backend's AOT half turns the program it is given (a :class:`~orchestra.program.ProgramDef`
with one ``forward`` method when :class:`~orchestra.aot.ProgramBuilder` lowers a subgraph; an
ExecuTorch ``ExportedProgram`` when a bridge does) into the processed blob that its runtime
half's ``init`` receives. Backends are registered by name, explicitly with
:func:`register_aot_backend` or through the entry-point group ``orchestra.aot_backends``
(each entry point names a :class:`BackendDetails` subclass), discovered once, on first lookup.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from ..errors import BackendError, Error, InvalidArgumentError
from ..program import CompileSpec

__all__ = [
    "BackendDetails",
    "CompileSpec",
    "PreprocessResult",
    "aot_backends",
    "get_aot_backend",
    "register_aot_backend",
]

ENTRY_POINT_GROUP = "orchestra.aot_backends"


@dataclass(frozen=True, slots=True)
class PreprocessResult:
    """What ``preprocess`` returns (ExecuTorch's ``PreprocessResult``).

    Attributes:
        processed_bytes: the blob stored in the program and handed to the runtime backend's
            ``init``.
        debug_handle_map: optional map from a debug handle to the node debug handles it came
            from (for profiling tools); orchestra stores nothing from it.
    """

    processed_bytes: bytes
    debug_handle_map: dict[int, tuple[int, ...]] | None = None


class BackendDetails(abc.ABC):
    """The ahead-of-time half of a backend: one static ``preprocess``.

    Subclass it, implement :meth:`preprocess`, and register the class with
    :func:`register_aot_backend` (or an ``orchestra.aot_backends`` entry point) under the
    name its runtime half is registered as.
    """

    @staticmethod
    @abc.abstractmethod
    def preprocess(program: Any, compile_specs: Sequence[CompileSpec]) -> PreprocessResult:
        """Lowers ``program`` to the blob the runtime backend loads.

        Args:
            program: what is being lowered: a :class:`~orchestra.program.ProgramDef` whose
                ``forward`` method computes the delegated subgraph (from
                :meth:`~orchestra.aot.MethodBuilder.delegate`), or an ExecuTorch
                ``ExportedProgram`` passed by a bridge.
            compile_specs: the ahead-of-time options of this lowering; they are also stored
                next to the blob and given to the runtime backend's ``init``.
        """


# Registry: filled by register_aot_backend and by entry-point discovery (DESIGN: the only
# module-level mutable state allowed).
_REGISTRY: dict[str, type[BackendDetails]] = {}
_DISCOVERED: list[bool] = []


def _check_details(name: str, details: Any) -> None:
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"an AOT backend name must be a non-empty string, got {name!r}")
    if not (isinstance(details, type) and issubclass(details, BackendDetails)):
        raise InvalidArgumentError(
            f"AOT backend {name!r}: {details!r} is not a BackendDetails subclass"
        )
    if inspect.isabstract(details):
        missing = ", ".join(sorted(getattr(details, "__abstractmethods__", ()))) or "preprocess"
        raise InvalidArgumentError(
            f"AOT backend {name!r}: {details.__module__}.{details.__qualname__} is abstract "
            f"(it does not implement {missing})"
        )


def register_aot_backend(name: str, details: type[BackendDetails]) -> None:
    """Registers the :class:`BackendDetails` subclass ``details`` as AOT backend ``name``.

    Raises:
        InvalidArgumentError: ``details`` is not a BackendDetails subclass, is still abstract
            (does not implement ``preprocess``), or ``name`` is already registered.
    """
    _check_details(name, details)
    if name in _REGISTRY:
        have = _REGISTRY[name]
        raise InvalidArgumentError(
            f"AOT backend {name!r} is already registered ({have.__module__}.{have.__qualname__})"
        )
    _REGISTRY[name] = details


def _discover() -> None:
    if _DISCOVERED:
        return
    _DISCOVERED.append(True)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _REGISTRY:
            continue
        try:
            obj = ep.load()
            _check_details(ep.name, obj)
        except Exception as exc:  # a broken plugin must say which one it is
            raise BackendError(
                f"entry point {ep.name!r} in group {ENTRY_POINT_GROUP!r} ({ep.value}) failed to load: {exc}",
                Error.NotFound,
            ) from exc
        _REGISTRY.setdefault(ep.name, obj)


def aot_backends() -> tuple[str, ...]:
    """Names of every registered AOT backend, sorted."""
    _discover()
    return tuple(sorted(_REGISTRY))


def get_aot_backend(name: str) -> type[BackendDetails]:
    """The :class:`BackendDetails` subclass registered as ``name``.

    Raises:
        BackendError: code NotFound when no AOT backend has that name (the message lists
            those that exist).
    """
    _discover()
    try:
        return _REGISTRY[name]
    except KeyError:
        have = ", ".join(sorted(_REGISTRY)) or "none"
        raise BackendError(
            f"AOT backend {name!r} is not registered (registered: {have})", Error.NotFound
        ) from None
