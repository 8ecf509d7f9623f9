"""Helpers shared by the kernel modules: dims, torch type promotion, writing results."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from orchestra.errors import Error, InvalidArgumentError, OrchestraError
from orchestra.program import numpy_dtype

FLOATS = ("float16", "float32", "float64")
INTS = ("uint8", "int8", "int16", "int32", "int64")
REALS = FLOATS + INTS
ALL = REALS + ("bool",)
F32_64 = ("float32", "float64")
# Kernels that compute in floating point: float16 is left out (numpy has no fast float16 math).
FLOAT_MATH = F32_64
REAL_MATH = F32_64 + INTS

_F32 = np.dtype(np.float32)
_I64 = np.dtype(np.int64)
_BOOL = np.dtype(np.bool_)


def load_native() -> Any:
    """orchestra's compiled kernels (the ``_native`` extension), or None where they were not
    built (no C compiler at install) or ``ORCHESTRA_NATIVE_KERNELS=0`` is set (every kernel then
    runs its numpy path: for comparisons, or to rule the compiled code out)."""
    if os.environ.get("ORCHESTRA_NATIVE_KERNELS", "").strip() == "0":
        return None
    try:
        from . import _native
    except ImportError:  # pragma: no cover - built wherever a C compiler was available at install
        return None
    return _native


def bad(op: str, message: str) -> InvalidArgumentError:
    """An InvalidArgument error naming the operator."""
    return InvalidArgumentError(f"{op}: {message}")


def unsupported(op: str, message: str) -> OrchestraError:
    """A NotSupported error naming the operator."""
    return OrchestraError(f"{op}: {message}", Error.NotSupported)


def wrap_dim(dim: int, ndim: int, op: str) -> int:
    """``dim`` as a non-negative axis of an ``ndim``-d tensor (a 0-d tensor accepts 0 and -1)."""
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise bad(op, f"dim {dim} is out of range for a {ndim}-d tensor")
    return dim + n if dim < 0 else dim


def wrap_dims(dims: Sequence[int] | int | None, ndim: int, op: str) -> tuple[int, ...]:
    """Reduction dims as sorted non-negative axes; None or [] mean all dims (torch's rule)."""
    if dims is None:
        return tuple(range(ndim))
    if isinstance(dims, (int, np.integer)):
        dims = (int(dims),)
    if len(dims) == 0:
        return tuple(range(ndim))
    axes = sorted({wrap_dim(int(d), ndim, op) for d in dims})
    if len(axes) != len(dims):
        raise bad(op, f"dim {list(dims)} names a dimension twice")
    if ndim == 0:
        return ()
    return tuple(axes)


def scalar_dtype(code: int | None, op: str) -> np.dtype | None:
    """The numpy dtype of a ScalarType argument (None stays None)."""
    if code is None:
        return None
    dt = numpy_dtype(int(code))
    if dt is None:
        raise unsupported(op, f"scalar type {code} has no numpy equivalent")
    return dt


def _category(dt: np.dtype) -> int:
    kind = dt.kind
    if kind == "b":
        return 0
    if kind in "iu":
        return 1
    if kind == "f":
        return 2
    return 3


def _promote(a: np.dtype | None, b: np.dtype | None) -> np.dtype | None:
    if a is None:
        return b
    if b is None or a == b:
        return a
    ca, cb = _category(a), _category(b)
    if ca != cb:
        return a if ca > cb else b
    return np.promote_types(a, b)


def _combine(higher: np.dtype | None, lower: np.dtype | None) -> np.dtype | None:
    # c10's combine_categories: a lower-priority operand only matters if it is of a
    # higher category (a float scalar with an int tensor, anything with a bool tensor).
    if higher is None:
        return lower
    if lower is None:
        return higher
    ch, cl = _category(higher), _category(lower)
    if ch >= 2:
        return higher
    if ch == 0 or cl >= 2:
        return _promote(higher, lower)
    return higher


def result_dtype(*operands: Any) -> np.dtype:
    """torch's result type of an elementwise op: tensors with dims > 0-d tensors > Python scalars.

    Python floats count as the default dtype (float32), ints as int64, bools as bool; a
    Python scalar never widens a tensor of its own category (int32 tensor + 2 -> int32).
    """
    dim_t = zero_t = wrapped = None
    for v in operands:
        if v is None:
            continue
        if isinstance(v, np.ndarray):
            if v.ndim:
                dim_t = _promote(dim_t, v.dtype)
            else:
                zero_t = _promote(zero_t, v.dtype)
        elif isinstance(v, np.generic):
            zero_t = _promote(zero_t, v.dtype)
        elif isinstance(v, bool):
            wrapped = _promote(wrapped, _BOOL)
        elif isinstance(v, int):
            wrapped = _promote(wrapped, _I64)
        elif isinstance(v, float):
            wrapped = _promote(wrapped, _F32)
    dt = _combine(dim_t, _combine(zero_t, wrapped))
    return _F32 if dt is None else dt


def float_dtype(dt: np.dtype) -> np.dtype:
    """The dtype a float-valued op (exp, sqrt, mean) computes in for inputs of dtype ``dt``."""
    return dt if dt.kind == "f" else _F32


def shape_of(v: Any) -> tuple[int, ...]:
    return v.shape if isinstance(v, np.ndarray) else ()


# Bounds on what a kernel may allocate, checked before it allocates (a hostile program can
# ask for any size in a size, repeats, pad, output_size or end argument):
# * a result must fit its ``out`` tensor: at most the elements from ``out``'s first element
#   to the end of the planned arena it views (an ``out`` with no planned storage: at most
#   UNPLANNED_RESULT_BYTES);
# * a temporary (a padded copy of an input, say) at most SCRATCH_BYTES.
# Change them by assigning these module attributes before loading programs.
UNPLANNED_RESULT_BYTES = 1 << 30
SCRATCH_BYTES = 1 << 30


def numel(shape: Sequence[int]) -> int:
    """Elements of ``shape`` (exact: Python ints never overflow)."""
    n = 1
    for s in shape:
        n *= int(s)
    return n


def room(out: Any) -> int:
    """How many elements of ``out``'s dtype a result written for ``out`` may have: up to
    the end of the planned arena that ``out`` is a view of."""
    if not isinstance(out, np.ndarray):
        return UNPLANNED_RESULT_BYTES // 8
    item = max(out.itemsize, 1)
    root = out
    while isinstance(root.base, np.ndarray):
        root = root.base
    if root is out or root.ndim != 1 or root.dtype != np.uint8:  # not a view of a planned arena
        return max(out.size, UNPLANNED_RESULT_BYTES // item)
    end = root.__array_interface__["data"][0] + root.nbytes
    start = out.__array_interface__["data"][0]
    return max(end - start, 0) // item


def check_fits(op: str, shape: Sequence[int], out: Any) -> None:
    """Raises (before anything is allocated) when a result of ``shape`` can't fit ``out``."""
    if isinstance(out, np.ndarray) and out.shape == tuple(shape):
        return
    if any(int(s) < 0 for s in shape):
        raise bad(op, f"negative size in result shape {[int(s) for s in shape]}")
    n = numel(shape)
    cap = room(out)
    if n > cap:
        raise OrchestraError(
            f"{op}: a result of shape {[int(s) for s in shape]} ({n} elements) does not fit its output "
            f"(room for {cap} elements); nothing was allocated", Error.InvalidState)


def check_scratch(op: str, shape: Sequence[int], itemsize: int, what: str = "temporary") -> None:
    """Raises (before anything is allocated) when a temporary of ``shape`` would pass SCRATCH_BYTES."""
    if any(int(s) < 0 for s in shape):
        raise bad(op, f"negative size in {what} shape {[int(s) for s in shape]}")
    nbytes = numel(shape) * itemsize
    if nbytes > SCRATCH_BYTES:
        raise OrchestraError(
            f"{op}: a {what} of shape {[int(s) for s in shape]} ({nbytes} bytes) exceeds the kernel scratch limit "
            f"of {SCRATCH_BYTES} bytes (orchestra.runtime.kernels._util.SCRATCH_BYTES); nothing was allocated",
            Error.MemoryAllocationFailed)


def dest(out: Any, shape: tuple[int, ...], dtype: np.dtype | None = None) -> np.ndarray | None:
    """``out`` when a result of ``shape`` (and ``dtype``, if given) can be written straight into it."""
    if (
        isinstance(out, np.ndarray)
        and out.shape == shape
        and (dtype is None or out.dtype == dtype)
        and out.flags.writeable
    ):
        return out
    return None


def dest_contig(out: Any, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
    """Like :func:`dest`, also requiring a C-contiguous ``out`` (so reshapes of it are views)."""
    o = dest(out, shape, dtype)
    return o if o is not None and o.flags.c_contiguous else None


def finish(res: Any, out: Any) -> Any:
    """Return ``res`` in ``out``'s dtype, written into ``out`` when the shapes agree.

    When ``out`` has another shape (an upper-bound dynamic tensor, say) a new array is
    returned and the interpreter resizes ``out`` and copies it.
    """
    if res is out:
        return out
    if type(res) is not np.ndarray:
        res = np.asarray(res)
    if not isinstance(out, np.ndarray):
        return res
    if out.shape == res.shape and out.flags.writeable:
        out[...] = res  # an unsafe-casting copy, like np.copyto(casting="unsafe"), but cheaper
        return out
    if res.dtype != out.dtype:
        check_fits("result", res.shape, out)  # res may be a broadcast view: astype allocates it all
        res = res.astype(out.dtype)
    return res


def int_list(v: Any, n: int, op: str, name: str) -> tuple[int, ...]:
    """An int list argument of ``n`` entries (a single entry is repeated, torch's int[2] rule)."""
    if isinstance(v, (int, np.integer)):
        v = (v,)
    t = tuple(map(int, v))
    if len(t) == n:
        return t
    if len(t) == 1:
        return t * n
    raise bad(op, f"{name} must have {n} entries, got {list(t)}")
