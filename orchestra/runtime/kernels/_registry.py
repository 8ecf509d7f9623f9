"""The kernel registry: operator name -> numpy implementation.

Kernels are registered at import time with the :func:`kernel` decorator under the operator's
full ExecuTorch name, ``namespace::name.overload`` (``aten::convolution.out``,
``executorch_prim::add.Scalar``). An operator whose overload is empty in the program
(ExecuTorch writes ``""`` for torch's ``default`` overload, e.g. ``aten::sym_numel``) is
registered under the bare ``namespace::name``.

Calling convention: the interpreter calls ``fn(*values[:num_params])`` with the KernelCall's
values in schema order (every schema argument including ``out``), and uses what ``fn``
returns (see ``orchestra/runtime/kernels/__init__.py``).
"""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from orchestra.errors import Error, OrchestraError

__all__ = ["KernelDef", "get_kernel", "kernel", "kernel_names", "nearest_kernel_names"]

F = TypeVar("F", bound=Callable[..., Any])

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*::[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)?$")

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@dataclass(frozen=True, slots=True)
class KernelDef:
    """One registered kernel.

    Attributes:
        name: the operator's full name, ``namespace::name.overload``.
        fn: the implementation; called as ``fn(*values[:num_params])``.
        dtypes: numpy dtype names the kernel supports (``"float32"``, ``"int64"``, ...), or
            None when it does not depend on element types (scalar ops).
        num_params: how many positional parameters ``fn`` takes.
        param_names: the names of those parameters, in order.
        numpy_dtypes: ``dtypes`` as numpy dtype objects (native byte order), for checks that
            would otherwise look up each dtype's name; None with ``dtypes``.
    """

    name: str
    fn: Callable[..., Any]
    dtypes: frozenset[str] | None
    num_params: int
    param_names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    numpy_dtypes: frozenset[np.dtype] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        params = list(inspect.signature(self.fn).parameters)[: self.num_params]
        object.__setattr__(self, "param_names", tuple(params))
        object.__setattr__(self, "numpy_dtypes",
                           None if self.dtypes is None else frozenset(np.dtype(d) for d in self.dtypes))


# The only module-level mutable state of the kernel library; filled at import time.
_REGISTRY: dict[str, KernelDef] = {}


def _make_kernel_def(name: str, fn: Callable[..., Any], dtypes: Iterable[str] | None) -> KernelDef:
    if not isinstance(name, str) or not _NAME.match(name):
        raise OrchestraError(
            f"invalid operator name {name!r} for a kernel: expected 'namespace::name.overload'",
            Error.InvalidArgument,
        )
    dtype_set: frozenset[str] | None = None
    if dtypes is not None:
        if isinstance(dtypes, str):
            dtypes = (dtypes,)
        names = []
        for d in dtypes:
            try:
                names.append(np.dtype(d).name)
            except TypeError as exc:
                raise OrchestraError(
                    f"kernel {name}: unknown dtype {d!r}", Error.InvalidArgument
                ) from exc
        dtype_set = frozenset(names)
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        raise OrchestraError(
            f"kernel {name}: the implementation must not take *args", Error.InvalidArgument
        )
    num_params = sum(1 for p in params if p.kind in _POSITIONAL)
    return KernelDef(name=name, fn=fn, dtypes=dtype_set, num_params=num_params)


def kernel(name: str, dtypes: Iterable[str] | None = None) -> Callable[[F], F]:
    """Register the decorated function as the kernel of operator ``name``.

    Args:
        name: full operator name, ``namespace::name.overload``.
        dtypes: numpy dtype names the kernel supports; None for scalar (non-tensor) ops.

    Raises:
        OrchestraError: (``Error.InvalidArgument``) the name is malformed or already has a kernel.
    """

    def register(fn: F) -> F:
        kdef = _make_kernel_def(name, fn, dtypes)
        if name in _REGISTRY:
            raise OrchestraError(
                f"a kernel for operator {name!r} is already registered "
                f"({_REGISTRY[name].fn.__module__}.{_REGISTRY[name].fn.__qualname__})",
                Error.InvalidArgument,
            )
        _REGISTRY[name] = kdef
        return fn

    return register


def get_kernel(name: str) -> KernelDef | None:
    """The kernel registered for operator ``name``, or None."""
    return _REGISTRY.get(name)


def kernel_names() -> tuple[str, ...]:
    """All registered operator names, sorted."""
    return tuple(sorted(_REGISTRY))


def nearest_kernel_names(name: str, n: int = 3) -> list[str]:
    """Up to ``n`` registered names closest to ``name``, best first (for "did you mean").

    Other overloads of the same operator come first (``aten::add.Tensor`` ->
    ``aten::add.out``, ``aten::add.Scalar_out``), then the closest names by spelling.
    """
    if n <= 0:
        return []
    names = list(_REGISTRY)
    base = name.split(".", 1)[0]
    same = [other for other in names if other.split(".", 1)[0] == base]
    ratio = lambda other: difflib.SequenceMatcher(None, name, other).ratio()  # noqa: E731
    found = sorted(same, key=ratio, reverse=True)[:n]
    for other in difflib.get_close_matches(name, names, n=n, cutoff=0.6):
        if len(found) >= n:
            break
        if other not in found:
            found.append(other)
    return found
