"""Reductions along dims, arg-reductions, variance, softmax/log_softmax, cumsum."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._registry import kernel
from ._util import (
    ALL,
    FLOAT_MATH,
    REAL_MATH,
    bad,
    dest,
    finish,
    load_native,
    scalar_dtype,
    wrap_dim,
    wrap_dims,
)

__all__: list[str] = []

_native = load_native()  # orchestra's compiled kernels, or None (numpy paths only)

# A float32 global average pool of at least this many elements sums its planes in the
# compiled kernel (split over its threads); smaller ones by one BLAS product with ones.
_NATIVE_SUMS_MIN = 1 << 14

_I64 = np.dtype(np.int64)
_BOOL = np.dtype(np.bool_)


def _reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return tuple(1 if i in axes else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in axes)


def _sum_dtype(x: np.ndarray, dtype: int | None, op: str) -> np.dtype:
    acc = scalar_dtype(dtype, op)
    if acc is not None:
        return acc
    return _I64 if x.dtype.kind in "biu" else x.dtype


def _reduce(
    op: str, fn: Any, x: np.ndarray, dim: Any, keepdim: bool, acc: np.dtype | None, out: Any
) -> Any:
    axes = wrap_dims(dim, x.ndim, op)
    shape = _reduced_shape(x.shape, axes, keepdim)
    if acc is not None and acc != x.dtype:
        x = x.astype(acc)
    o = dest(out, shape, x.dtype)
    if x.ndim == 0:
        return finish(x, out)
    if fn in (np.amax, np.amin) and x.size == 0 and any(x.shape[a] == 0 for a in axes):
        raise bad(op, "cannot reduce over an empty dimension")
    return finish(fn(x, axis=axes, keepdims=bool(keepdim), out=o), out)


def _fast_axes(dim: Any, ndim: int) -> tuple[int, ...] | None:
    """``dim`` (a non-empty int list) as distinct non-negative axes, or None when the general
    path must decide (None, empty, out of range, repeated)."""
    if not dim or type(dim) not in (list, tuple):
        return None
    axes = tuple(d + ndim if d < 0 else d for d in dim)
    for a in axes:
        if not 0 <= a < ndim:
            return None
    if len(axes) > 1 and len(set(axes)) != len(axes):
        return None
    return axes


def _mean(op: str, x: np.ndarray, dim: Any, keepdim: bool, dtype: int | None, out: Any) -> Any:
    if (
        dtype is None
        and type(out) is np.ndarray
        and x.dtype.kind == "f"
        and x.dtype.itemsize >= 4  # np.mean sums float16 in float32
        and out.dtype == x.dtype
    ):
        # Fast path: np.mean's own arithmetic (sum in x's dtype, then true division by the
        # count) without its Python-level wrapper.
        axes = _fast_axes(dim, x.ndim)
        if axes is not None:
            n = 1
            for a in axes:
                n *= x.shape[a]
            lead = x.ndim - len(axes)
            if (n > 1 and lead and sorted(axes) == list(range(lead, x.ndim)) and x.flags.c_contiguous
                    and out.flags.c_contiguous and out.flags.writeable
                    and out.shape == x.shape[:lead] + ((1,) * len(axes) if keepdim else ())):
                # The trailing dims of a C-contiguous x (a global average pool): each row's
                # sum as one product with a vector of ones, straight into out (3-6x faster
                # than np.add.reduce over them), then the division by the count.
                rows = x.size // n
                if (_native is not None and x.dtype == np.float32 and x.size >= _NATIVE_SUMS_MIN
                        and (n >= 256 or _native.get_threads() > 1)):
                    # the compiled per-plane sums, split over the kernels' threads (on one
                    # thread, planes under 256 elements sum faster in BLAS: 7x7, 14x14)
                    _native.plane_sums_f32(x, out, rows, n)
                    return np.true_divide(out, n, out=out)
                try:
                    np.dot(x.reshape(rows, n), np.ones(n, x.dtype), out=out.reshape(rows))
                except ValueError:
                    pass
                else:
                    return np.true_divide(out, n, out=out)
            try:
                res = np.add.reduce(x, axis=axes, keepdims=bool(keepdim), out=out)
            except ValueError:  # out has another shape, or is read-only
                res = None
            if res is not None and n:
                return np.true_divide(res, n, out=res)
    acc = scalar_dtype(dtype, op)
    if acc is None:
        if x.dtype.kind not in "f":
            raise bad(op, f"mean of a {x.dtype} tensor needs a floating dtype argument")
        acc = x.dtype
    return _reduce(op, np.mean, x, dim, keepdim, acc, out)


@kernel("aten::mean.out", dtypes=REAL_MATH)
def mean_out(
    self: np.ndarray, dim: list[int] | None, keepdim: bool, dtype: int | None, out: np.ndarray
) -> np.ndarray:
    return _mean("aten::mean.out", self, dim, keepdim, dtype, out)


@kernel("aten::mean.dtype_out", dtypes=REAL_MATH)
def mean_dtype_out(self: np.ndarray, dtype: int | None, out: np.ndarray) -> np.ndarray:
    return _mean("aten::mean.dtype_out", self, None, False, dtype, out)


@kernel("aten::sum.IntList_out", dtypes=ALL)
def sum_intlist_out(
    self: np.ndarray, dim: list[int] | None, keepdim: bool, dtype: int | None, out: np.ndarray
) -> np.ndarray:
    op = "aten::sum.IntList_out"
    return _reduce(op, np.sum, self, dim, keepdim, _sum_dtype(self, dtype, op), out)


@kernel("aten::sum.out", dtypes=ALL)
def sum_out(self: np.ndarray, dtype: int | None, out: np.ndarray) -> np.ndarray:
    op = "aten::sum.out"
    return _reduce(op, np.sum, self, None, False, _sum_dtype(self, dtype, op), out)


@kernel("aten::prod.int_out", dtypes=ALL)
def prod_int_out(
    self: np.ndarray, dim: int, keepdim: bool, dtype: int | None, out: np.ndarray
) -> np.ndarray:
    op = "aten::prod.int_out"
    return _reduce(op, np.prod, self, [dim], keepdim, _sum_dtype(self, dtype, op), out)


@kernel("aten::prod.out", dtypes=ALL)
def prod_out(self: np.ndarray, dtype: int | None, out: np.ndarray) -> np.ndarray:
    op = "aten::prod.out"
    return _reduce(op, np.prod, self, None, False, _sum_dtype(self, dtype, op), out)


@kernel("aten::amax.out", dtypes=ALL)
def amax_out(self: np.ndarray, dim: list[int], keepdim: bool, out: np.ndarray) -> np.ndarray:
    return _reduce("aten::amax.out", np.amax, self, dim, keepdim, None, out)


@kernel("aten::amin.out", dtypes=ALL)
def amin_out(self: np.ndarray, dim: list[int], keepdim: bool, out: np.ndarray) -> np.ndarray:
    return _reduce("aten::amin.out", np.amin, self, dim, keepdim, None, out)


@kernel("aten::max.unary_out", dtypes=ALL)
def max_unary_out(self: np.ndarray, out: np.ndarray) -> np.ndarray:
    return _reduce("aten::max.unary_out", np.amax, self, None, False, None, out)


@kernel("aten::min.unary_out", dtypes=ALL)
def min_unary_out(self: np.ndarray, out: np.ndarray) -> np.ndarray:
    return _reduce("aten::min.unary_out", np.amin, self, None, False, None, out)


def _bool_reduce(op: str, fn: Any, x: np.ndarray, dim: Any, keepdim: bool, out: Any) -> Any:
    axes = wrap_dims(dim, x.ndim, op)
    shape = _reduced_shape(x.shape, axes, keepdim)
    o = dest(out, shape, _BOOL)
    if x.ndim == 0:
        return finish(x.astype(_BOOL), out)
    return finish(fn(x, axis=axes, keepdims=bool(keepdim), out=o), out)


@kernel("aten::any.dims_out", dtypes=ALL)
def any_dims_out(self: np.ndarray, dim: list[int] | None, keepdim: bool, out: np.ndarray) -> np.ndarray:
    return _bool_reduce("aten::any.dims_out", np.any, self, dim, keepdim, out)


@kernel("aten::all.dims_out", dtypes=ALL)
def all_dims_out(self: np.ndarray, dim: list[int] | None, keepdim: bool, out: np.ndarray) -> np.ndarray:
    return _bool_reduce("aten::all.dims_out", np.all, self, dim, keepdim, out)


@kernel("aten::any.out", dtypes=ALL)
def any_out(self: np.ndarray, dim: int, keepdim: bool, out: np.ndarray) -> np.ndarray:
    return _bool_reduce("aten::any.out", np.any, self, [dim], keepdim, out)


@kernel("aten::all.out", dtypes=ALL)
def all_out(self: np.ndarray, dim: int, keepdim: bool, out: np.ndarray) -> np.ndarray:
    return _bool_reduce("aten::all.out", np.all, self, [dim], keepdim, out)


@kernel("aten::any.all_out", dtypes=ALL)
def any_all_out(self: np.ndarray, out: np.ndarray) -> np.ndarray:
    return _bool_reduce("aten::any.all_out", np.any, self, None, False, out)


@kernel("aten::all.all_out", dtypes=ALL)
def all_all_out(self: np.ndarray, out: np.ndarray) -> np.ndarray:
    return _bool_reduce("aten::all.all_out", np.all, self, None, False, out)


# --------------------------------------------------------------------------- arg reductions


def _arg_dim(op: str, argfn: Any, x: np.ndarray, dim: int, keepdim: bool) -> tuple[np.ndarray, np.ndarray]:
    if x.ndim == 0:
        return x.copy(), np.zeros((), _I64)
    d = wrap_dim(dim, x.ndim, op)
    if x.shape[d] == 0:
        raise bad(op, f"cannot reduce over the empty dim {dim}")
    idx = argfn(x, axis=d, keepdims=True)
    vals = np.take_along_axis(x, idx, axis=d)
    if not keepdim:
        idx = idx.squeeze(d)
        vals = vals.squeeze(d)
    return vals, idx.astype(_I64, copy=False)


@kernel("aten::max.dim_max", dtypes=ALL)
def max_dim_max(
    self: np.ndarray, dim: int, keepdim: bool, max: np.ndarray, max_values: np.ndarray  # noqa: A002
) -> tuple[np.ndarray, np.ndarray]:
    """Returns (values, indices); the schema names the outputs ``max`` and ``max_values``."""
    vals, idx = _arg_dim("aten::max.dim_max", np.argmax, self, dim, keepdim)
    return finish(vals, max), finish(idx, max_values)


@kernel("aten::min.dim_min", dtypes=ALL)
def min_dim_min(
    self: np.ndarray, dim: int, keepdim: bool, min: np.ndarray, min_indices: np.ndarray  # noqa: A002
) -> tuple[np.ndarray, np.ndarray]:
    vals, idx = _arg_dim("aten::min.dim_min", np.argmin, self, dim, keepdim)
    return finish(vals, min), finish(idx, min_indices)


def _arg(op: str, argfn: Any, x: np.ndarray, dim: int | None, keepdim: bool, out: Any) -> Any:
    if dim is None:
        if x.size == 0:
            raise bad(op, "cannot reduce an empty tensor")
        idx = argfn(x.reshape(-1))
        shape = (1,) * x.ndim if keepdim else ()
        return finish(np.full(shape, idx, _I64), out)
    _, idx = _arg_dim(op, argfn, x, dim, keepdim)
    return finish(idx, out)


@kernel("aten::argmax.out", dtypes=ALL)
def argmax_out(self: np.ndarray, dim: int | None, keepdim: bool, out: np.ndarray) -> np.ndarray:
    return _arg("aten::argmax.out", np.argmax, self, dim, keepdim, out)


@kernel("aten::argmin.out", dtypes=ALL)
def argmin_out(self: np.ndarray, dim: int | None, keepdim: bool, out: np.ndarray) -> np.ndarray:
    return _arg("aten::argmin.out", np.argmin, self, dim, keepdim, out)


# --------------------------------------------------------------------------- variance


def _var(op: str, x: np.ndarray, dim: Any, correction: Any, keepdim: bool, std: bool) -> tuple[np.ndarray, np.ndarray]:
    if x.dtype.kind != "f":
        raise bad(op, f"expected a floating tensor, got {x.dtype}")
    axes = wrap_dims(dim, x.ndim, op)
    ddof = 1 if correction is None else correction
    mean = np.mean(x, axis=axes, keepdims=True)
    n = 1
    for a in axes:
        n *= x.shape[a]
    dev = x - mean
    np.multiply(dev, dev, out=dev)
    with np.errstate(divide="ignore", invalid="ignore"):
        var = np.sum(dev, axis=axes, keepdims=bool(keepdim))
        var = np.true_divide(var, max(n - ddof, 0), out=var if isinstance(var, np.ndarray) else None)
    if std:
        var = np.sqrt(var)
    if not keepdim:
        mean = mean.reshape(var.shape)
    return np.asarray(var, x.dtype), mean


@kernel("aten::var.correction_out", dtypes=FLOAT_MATH)
def var_correction_out(
    self: np.ndarray, dim: list[int] | None, correction: Any, keepdim: bool, out: np.ndarray
) -> np.ndarray:
    return finish(_var("aten::var.correction_out", self, dim, correction, keepdim, False)[0], out)


@kernel("aten::var.out", dtypes=FLOAT_MATH)
def var_out(
    self: np.ndarray, dim: list[int] | None, unbiased: bool, keepdim: bool, out: np.ndarray
) -> np.ndarray:
    return finish(_var("aten::var.out", self, dim, 1 if unbiased else 0, keepdim, False)[0], out)


@kernel("aten::std.correction_out", dtypes=FLOAT_MATH)
def std_correction_out(
    self: np.ndarray, dim: list[int] | None, correction: Any, keepdim: bool, out: np.ndarray
) -> np.ndarray:
    return finish(_var("aten::std.correction_out", self, dim, correction, keepdim, True)[0], out)


@kernel("aten::std.out", dtypes=FLOAT_MATH)
def std_out(
    self: np.ndarray, dim: list[int] | None, unbiased: bool, keepdim: bool, out: np.ndarray
) -> np.ndarray:
    return finish(_var("aten::std.out", self, dim, 1 if unbiased else 0, keepdim, True)[0], out)


@kernel("aten::var_mean.correction_out", dtypes=FLOAT_MATH)
def var_mean_correction_out(
    self: np.ndarray,
    dim: list[int] | None,
    correction: Any,
    keepdim: bool,
    out0: np.ndarray,
    out1: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    var, mean = _var("aten::var_mean.correction_out", self, dim, correction, keepdim, False)
    return finish(var, out0), finish(mean, out1)


# --------------------------------------------------------------------------- softmax


def _softmax_into(
    x: np.ndarray, d: int, log: bool, w: np.ndarray, m: np.ndarray | None = None
) -> np.ndarray:
    """(log_)softmax of float ``x`` along axis ``d`` into ``w`` (x's shape and dtype; may
    overlap x: x is read only by the first write). ``m``: x's maxima along d, if known."""
    if m is None:
        m = np.maximum.reduce(x, axis=d, keepdims=True)
    np.subtract(x, m, out=w)
    if log:
        s = np.add.reduce(np.exp(w), axis=d, keepdims=True)
        np.log(s, out=s)
        w -= s
    else:
        np.exp(w, out=w)
        w /= np.add.reduce(w, axis=d, keepdims=True)
    return w


def _in_exp_range(x: np.ndarray) -> bool:
    """Whether softmax along the last dim of float32/64 ``x`` may skip the shift by the row
    maxima: every element within +-60 (+-600 for float64), so exp and the row sums are normal
    and finite, and max - min + ln(row length) under 85 (700), so no result underflows.
    NaN and inf fail."""
    lim, span = (60.0, 85.0) if x.dtype.itemsize == 4 else (600.0, 700.0)
    lo = float(np.minimum.reduce(x, axis=None))
    hi = float(np.maximum.reduce(x, axis=None))
    return -lim < lo and hi < lim and hi - lo + math.log(x.shape[-1]) < span


def _softmax(op: str, x: np.ndarray, dim: int, log: bool, out: Any) -> Any:
    nd = x.ndim
    if x.dtype.kind == "f" and x.size and -nd <= dim < nd:
        d = dim + nd if dim < 0 else dim
        fits = type(out) is np.ndarray and out.shape == x.shape and out.dtype == x.dtype and out.flags.writeable
        if not log and d == nd - 1 and _native is not None and x.dtype == np.float32 and x.flags.c_contiguous:
            # The compiled softmax over the last dim (rows split over the kernels' threads), as
            # torch computes it: shifted by each row's max, exp within an ulp or two of numpy's.
            # Chosen by x alone, like the paths below: an out it can't write goes through a
            # buffer.
            w = out if fits and out.flags.c_contiguous else np.empty(x.shape, x.dtype)
            try:
                _native.softmax_f32(x, w, x.size // x.shape[-1], x.shape[-1])
            except ValueError:  # out overlaps x without being it
                w = np.empty(x.shape, x.dtype)
                _native.softmax_f32(x, w, x.size // x.shape[-1], x.shape[-1])
            return w if w is out else finish(w, out)
        w = out if fits else np.empty(x.shape, x.dtype)  # the algorithms below allow w to overlap x
        # The cheapest safe algorithm, chosen by x alone (so out's shape never changes the
        # result); the checks go through Python floats or np.vdot, cheaper than np.errstate.
        if x.size <= 4096 and x.dtype.itemsize >= 4 and np.vdot(x, x) < 4096.0:
            # A sum of squares under 64**2 means every |x| < 64: exp(x) neither overflows nor
            # underflows (nor do the row sums), so the max subtraction that keeps exp in range
            # is not needed. NaN and inf fail the test; np.vdot raises no FP warnings.
            if log:
                s = np.add.reduce(np.exp(x), axis=d, keepdims=True)
                np.subtract(x, np.log(s, out=s), out=w)
            else:
                np.exp(x, out=w)
                np.true_divide(w, np.add.reduce(w, axis=d, keepdims=True), out=w)
        elif not log and d == nd - 1 and x.dtype.itemsize >= 4 and _in_exp_range(x):
            # x in a range where exp(x), the row sums and the results are normal and finite
            # (_in_exp_range): the shift by the row maxima (a slow row-wise reduction plus a
            # pass) is not needed; the two whole-array reductions that show it are fast. Row
            # sums by one product with a column of ones (faster than np.add.reduce over
            # short rows), then one multiply by their reciprocals: float rounding only.
            c = w if w.flags.c_contiguous else np.empty(x.shape, x.dtype)
            np.exp(x, out=c)
            rows = c.reshape(-1, x.shape[-1])
            s = np.dot(rows, np.ones((x.shape[-1], 1), x.dtype))
            np.reciprocal(s, out=s)
            np.multiply(rows, s, out=rows)
            if c is not w:
                np.copyto(w, c)
        else:
            m = np.maximum.reduce(x, axis=d, keepdims=True) if x.size <= 64 * x.shape[d] else None
            if m is not None and math.isfinite(sum(m.ravel().tolist())):
                # Finite row maxima (at most 64 rows): x - max <= 0 and the row sums are >= 1,
                # so no floating-point warning is possible.
                _softmax_into(x, d, log, w, m)
            else:
                with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
                    _softmax_into(x, d, log, w, m)
        return w if fits else finish(w, out)
    if x.dtype.kind != "f":
        raise bad(op, f"expected a floating tensor, got {x.dtype}")
    if x.ndim == 0:
        return finish(np.zeros((), x.dtype) if log else np.ones((), x.dtype), out)
    wrap_dim(dim, x.ndim, op)  # raises for a dim out of range
    return finish(np.empty(x.shape, x.dtype), out)  # an empty tensor


@kernel("aten::_softmax.out", dtypes=FLOAT_MATH)
def softmax_out(self: np.ndarray, dim: int, half_to_float: bool, out: np.ndarray) -> np.ndarray:
    return _softmax("aten::_softmax.out", self, dim, False, out)


@kernel("aten::_log_softmax.out", dtypes=FLOAT_MATH)
def log_softmax_out(self: np.ndarray, dim: int, half_to_float: bool, out: np.ndarray) -> np.ndarray:
    return _softmax("aten::_log_softmax.out", self, dim, True, out)


@kernel("aten::softmax.int_out", dtypes=FLOAT_MATH)
def softmax_int_out(self: np.ndarray, dim: int, dtype: int | None, out: np.ndarray) -> np.ndarray:
    dt = scalar_dtype(dtype, "aten::softmax.int_out")
    x = self if dt is None else self.astype(dt, copy=False)
    return _softmax("aten::softmax.int_out", x, dim, False, out)


@kernel("aten::log_softmax.int_out", dtypes=FLOAT_MATH)
def log_softmax_int_out(self: np.ndarray, dim: int, dtype: int | None, out: np.ndarray) -> np.ndarray:
    dt = scalar_dtype(dtype, "aten::log_softmax.int_out")
    x = self if dt is None else self.astype(dt, copy=False)
    return _softmax("aten::log_softmax.int_out", x, dim, True, out)


@kernel("aten::logsumexp.out", dtypes=FLOAT_MATH)
def logsumexp_out(self: np.ndarray, dim: list[int], keepdim: bool, out: np.ndarray) -> np.ndarray:
    op = "aten::logsumexp.out"
    x = self if self.dtype.kind == "f" else self.astype(np.float32)
    axes = wrap_dims(dim, x.ndim, op)
    if x.ndim == 0:
        return finish(x, out)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = np.amax(x, axis=axes, keepdims=True)
        m = np.where(np.isinf(m), 0, m).astype(x.dtype)
        s = np.sum(np.exp(x - m), axis=axes, keepdims=True)
        res = np.log(s) + m
    if not keepdim:
        res = res.reshape(_reduced_shape(x.shape, axes, False))
    return finish(res, out)


@kernel("aten::cumsum.out", dtypes=REAL_MATH + ("bool",))
def cumsum_out(self: np.ndarray, dim: int, dtype: int | None, out: np.ndarray) -> np.ndarray:
    op = "aten::cumsum.out"
    acc = _sum_dtype(self, dtype, op)
    if self.ndim == 0:
        return finish(self.astype(acc), out)
    d = wrap_dim(dim, self.ndim, op)
    o = dest(out, self.shape, acc)
    if o is not None and np.may_share_memory(o, self):
        o = None
    return finish(np.cumsum(self, axis=d, dtype=acc, out=o), out)
