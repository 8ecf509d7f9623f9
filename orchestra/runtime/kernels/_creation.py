"""Tensor creation: full/zeros/ones(-like), empty, scalar_tensor, fill, arange."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._registry import kernel
from ._util import ALL, REALS, bad, check_fits, dest

__all__: list[str] = []


def _filled(op: str, size: Sequence[int], value: Any, out: np.ndarray) -> np.ndarray:
    shape = tuple(int(s) for s in size)
    if any(s < 0 for s in shape):
        raise bad(op, f"negative size {list(shape)}")
    o = dest(out, shape)
    if o is not None:
        o.fill(value)
        return o
    check_fits(op, shape, out)
    return np.full(shape, value, dtype=out.dtype)


@kernel("aten::full.out", dtypes=ALL)
def full_out(size: list[int], fill_value: Any, out: np.ndarray) -> np.ndarray:
    return _filled("aten::full.out", size, fill_value, out)


@kernel("aten::full_like.out", dtypes=ALL)
def full_like_out(
    self: np.ndarray, fill_value: Any, memory_format: int | None, out: np.ndarray
) -> np.ndarray:
    return _filled("aten::full_like.out", self.shape, fill_value, out)


@kernel("aten::zeros.out", dtypes=ALL)
def zeros_out(size: list[int], out: np.ndarray) -> np.ndarray:
    return _filled("aten::zeros.out", size, 0, out)


@kernel("aten::ones.out", dtypes=ALL)
def ones_out(size: list[int], out: np.ndarray) -> np.ndarray:
    return _filled("aten::ones.out", size, 1, out)


@kernel("aten::zeros_like.out", dtypes=ALL)
def zeros_like_out(self: np.ndarray, memory_format: int | None, out: np.ndarray) -> np.ndarray:
    return _filled("aten::zeros_like.out", self.shape, 0, out)


@kernel("aten::ones_like.out", dtypes=ALL)
def ones_like_out(self: np.ndarray, memory_format: int | None, out: np.ndarray) -> np.ndarray:
    return _filled("aten::ones_like.out", self.shape, 1, out)


@kernel("aten::fill.Scalar_out", dtypes=ALL)
def fill_scalar_out(self: np.ndarray, value: Any, out: np.ndarray) -> np.ndarray:
    return _filled("aten::fill.Scalar_out", self.shape, value, out)


@kernel("aten::fill.Tensor_out", dtypes=ALL)
def fill_tensor_out(self: np.ndarray, value: np.ndarray, out: np.ndarray) -> np.ndarray:
    if value.ndim != 0:
        raise bad("aten::fill.Tensor_out", f"value must be a 0-d tensor, got shape {tuple(value.shape)}")
    return _filled("aten::fill.Tensor_out", self.shape, value[()], out)


@kernel("aten::scalar_tensor.out", dtypes=ALL)
def scalar_tensor_out(s: Any, out: np.ndarray) -> np.ndarray:
    return _filled("aten::scalar_tensor.out", (), s, out)


def _empty(op: str, size: Sequence[int], out: np.ndarray) -> np.ndarray:
    shape = tuple(int(s) for s in size)
    if any(s < 0 for s in shape):
        raise bad(op, f"negative size {list(shape)}")
    o = dest(out, shape)
    if o is None:
        check_fits(op, shape, out)
    return o if o is not None else np.zeros(shape, out.dtype)


@kernel("aten::empty.out", dtypes=ALL)
def empty_out(size: list[int], memory_format: int | None, out: np.ndarray) -> np.ndarray:
    return _empty("aten::empty.out", size, out)


@kernel("dim_order_ops::_empty_dim_order.out", dtypes=ALL)
def empty_dim_order_out(size: list[int], dim_order: list[int] | None, out: np.ndarray) -> np.ndarray:
    return _empty("dim_order_ops::_empty_dim_order.out", size, out)


def _arange(op: str, start: Any, end: Any, step: Any, out: np.ndarray) -> np.ndarray:
    if step == 0:
        raise bad(op, "step must be nonzero")
    if (step > 0 and end < start) or (step < 0 and end > start):
        raise bad(op, f"upper bound {end} and lower bound {start} inconsistent with step {step}")
    dt = out.dtype
    ints = all(isinstance(v, (int, np.integer)) for v in (start, end, step))
    if ints:
        n = max(0, -((int(start) - int(end)) // int(step)))  # ceil((end - start) / step)
    else:
        # torch computes the size and values in double, then casts.
        span = (float(end) - float(start)) / float(step)
        if not math.isfinite(span):
            raise bad(op, f"the size of arange({start}, {end}, {step}) is not finite")
        n = max(0, math.ceil(span))
    check_fits(op, (n,), out)
    if ints:
        res = int(start) + np.arange(n, dtype=np.int64) * int(step)
    else:
        res = float(start) + np.arange(n, dtype=np.float64) * float(step)
    o = dest(out, (n,))
    if o is not None:
        np.copyto(o, res, casting="unsafe")
        return o
    return res.astype(dt)


@kernel("aten::arange.start_out", dtypes=REALS)
def arange_start_out(start: Any, end: Any, step: Any, out: np.ndarray) -> np.ndarray:
    return _arange("aten::arange.start_out", start, end, step, out)


@kernel("aten::arange.out", dtypes=REALS)
def arange_out(end: Any, out: np.ndarray) -> np.ndarray:
    return _arange("aten::arange.out", 0, end, 1, out)
