"""Scalar (symbolic-shape) ops and ExecuTorch's ``executorch_prim`` ops.

These take and return Python scalars: ExecuTorch serialises ``op(a, b) -> Scalar`` as the
values ``[a, b, result]``, so each kernel takes the inputs only and returns the result.
Arithmetic follows Python's semantics (floor division and modulo round toward -inf), which is
what the exported graph means; ExecuTorch's C++ ``mod`` and ``floordiv.int`` truncate instead,
which only differs for negative operands.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._registry import kernel
from ._shape import resolve_shape
from ._util import ALL, bad, check_fits, wrap_dim

__all__: list[str] = []

Number = int | float | bool


# --------------------------------------------------------------------------- aten sym ops


@kernel("aten::sym_size.int", dtypes=ALL)
def sym_size_int(self: np.ndarray, dim: int) -> int:
    if self.ndim == 0:
        raise bad("aten::sym_size.int", "a 0-d tensor has no dims")
    return int(self.shape[wrap_dim(dim, self.ndim, "aten::sym_size.int")])


@kernel("aten::sym_numel", dtypes=ALL)
def sym_numel(self: np.ndarray) -> int:
    return int(self.size)


@kernel("aten::_local_scalar_dense", dtypes=ALL)
def local_scalar_dense(self: np.ndarray) -> Number:
    """The single element of a one-element tensor, as a Python scalar."""
    if self.size < 1:
        raise bad("aten::_local_scalar_dense", "expected a tensor with at least one element")
    return self.reshape(-1)[0].item()


# --------------------------------------------------------------------------- executorch_prim


def _num(op: str, v: Any) -> Number:
    if isinstance(v, (bool, int, float)):
        return v
    if isinstance(v, np.generic):
        return v.item()
    raise bad(op, f"expected a scalar, got {type(v).__name__}")


@kernel("executorch_prim::add.Scalar")
def prim_add(a: Number, b: Number) -> Number:
    return _num("executorch_prim::add.Scalar", a) + _num("executorch_prim::add.Scalar", b)


@kernel("executorch_prim::sub.Scalar")
def prim_sub(a: Number, b: Number) -> Number:
    return _num("executorch_prim::sub.Scalar", a) - _num("executorch_prim::sub.Scalar", b)


@kernel("executorch_prim::mul.Scalar")
def prim_mul(a: Number, b: Number) -> Number:
    return _num("executorch_prim::mul.Scalar", a) * _num("executorch_prim::mul.Scalar", b)


def _floordiv(op: str, a: Any, b: Any) -> Number:
    a, b = _num(op, a), _num(op, b)
    if b == 0:
        if isinstance(a, float) or isinstance(b, float):
            # ExecuTorch: +-inf by the sign of a.
            return -math.inf if math.copysign(1.0, a) < 0 else math.inf
        raise bad(op, "integer division by zero")
    return a // b


@kernel("executorch_prim::floordiv.Scalar")
def prim_floordiv(a: Number, b: Number) -> Number:
    return _floordiv("executorch_prim::floordiv.Scalar", a, b)


@kernel("executorch_prim::floordiv.int")
def prim_floordiv_int(a: int, b: int) -> int:
    return int(_floordiv("executorch_prim::floordiv.int", int(a), int(b)))


@kernel("executorch_prim::truediv.Scalar")
def prim_truediv(a: Number, b: Number) -> float:
    a, b = _num("executorch_prim::truediv.Scalar", a), _num("executorch_prim::truediv.Scalar", b)
    if b == 0:
        with np.errstate(divide="ignore", invalid="ignore"):
            return float(np.float64(a) / np.float64(b))
    return float(a) / float(b)


def _mod(op: str, a: Any, b: Any) -> int:
    a, b = _num(op, a), _num(op, b)
    if not isinstance(a, int) or not isinstance(b, int):
        raise bad(op, f"expected integers, got {a!r} and {b!r}")
    if b == 0:
        raise bad(op, "integer modulo by zero")
    return a % b


@kernel("executorch_prim::mod.Scalar")
def prim_mod(a: int, b: int) -> int:
    return _mod("executorch_prim::mod.Scalar", a, b)


@kernel("executorch_prim::mod.int")
def prim_mod_int(a: int, b: int) -> int:
    return _mod("executorch_prim::mod.int", a, b)


@kernel("executorch_prim::neg.Scalar")
def prim_neg(a: Number) -> Number:
    return -_num("executorch_prim::neg.Scalar", a)


@kernel("executorch_prim::eq.Scalar")
def prim_eq(a: Number, b: Number) -> bool:
    return bool(a == b)


@kernel("executorch_prim::gt.Scalar")
def prim_gt(a: Number, b: Number) -> bool:
    return bool(a > b)


@kernel("executorch_prim::lt.Scalar")
def prim_lt(a: Number, b: Number) -> bool:
    return bool(a < b)


@kernel("executorch_prim::ge.Scalar")
def prim_ge(a: Number, b: Number) -> bool:
    return bool(a >= b)


@kernel("executorch_prim::le.Scalar")
def prim_le(a: Number, b: Number) -> bool:
    return bool(a <= b)


@kernel("executorch_prim::sym_float.Scalar")
def prim_sym_float(a: Number) -> float:
    return float(a)


@kernel("executorch_prim::sym_int.Scalar")
def prim_sym_int(a: Number) -> int:
    return int(a)


@kernel("executorch_prim::ceil.Scalar")
def prim_ceil(a: Number) -> int:
    return int(math.ceil(a))


@kernel("executorch_prim::round.Scalar")
def prim_round(a: Number) -> int:
    return int(round(a))  # half to even, like Python's round()


@kernel("executorch_prim::trunc.Scalar")
def prim_trunc(a: Number) -> int:
    return int(math.trunc(a))


@kernel("executorch_prim::sym_max.Scalar")
def prim_sym_max(a: Number, b: Number) -> Number:
    return max(a, b)


@kernel("executorch_prim::sym_min.Scalar")
def prim_sym_min(a: Number, b: Number) -> Number:
    return min(a, b)


@kernel("executorch_prim::sym_not.Scalar")
def prim_sym_not(a: Number) -> bool:
    return not a


@kernel("executorch_prim::sym_ite.Scalar")
def prim_sym_ite(b: Number, t: Number, f: Number) -> Number:
    return t if b else f


# --------------------------------------------------------------------------- tensor prims


@kernel("executorch_prim::et_view.default", dtypes=ALL)
def et_view(self: np.ndarray, size: list[int]) -> np.ndarray:
    """A view op: ``self`` reshaped without a copy; the interpreter aliases the result."""
    shape = resolve_shape("executorch_prim::et_view.default", size, self.size)
    return self.reshape(shape)


@kernel("executorch_prim::et_copy_index.tensor", dtypes=ALL)
def et_copy_index(copy_to: np.ndarray, copy_from: np.ndarray, index: int) -> np.ndarray:
    """``copy_to[index] = copy_from`` (the stacking step of ExecuTorch's map/scan loops).

    ``copy_to`` has one more dim than ``copy_from``. When its leading dim already covers
    ``index`` it is written in place and returned (the same object). Otherwise ExecuTorch
    grows ``copy_to`` to ``index + 1`` rows in its (upper-bound) storage: this kernel then
    returns a new ``(index + 1, *copy_from.shape)`` array holding the existing rows and the new
    one, for the interpreter to store into ``copy_to``'s storage with that shape.
    """
    op = "executorch_prim::et_copy_index.tensor"
    index = int(index)
    if copy_to.ndim != copy_from.ndim + 1:
        raise bad(op, f"copy_to {tuple(copy_to.shape)} must have one more dim than copy_from {tuple(copy_from.shape)}")
    if index < 0:
        raise bad(op, f"index must be non-negative, got {index}")
    same_rows = copy_to.shape[1:] == copy_from.shape
    if index > 0 and not same_rows:
        raise bad(op, f"copy_to {tuple(copy_to.shape)} and copy_from {tuple(copy_from.shape)} mismatch")
    if same_rows and copy_to.shape[0] > index:
        copy_to[index] = copy_from
        return copy_to
    check_fits(op, (index + 1,) + copy_from.shape, copy_to)
    res = np.empty((index + 1,) + copy_from.shape, copy_to.dtype)
    if same_rows:
        n = min(copy_to.shape[0], index)
        res[:n] = copy_to[:n]
    res[index] = copy_from
    return res
