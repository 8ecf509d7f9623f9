"""Elementwise kernels: arithmetic, comparisons, unary math, activations, where/masked_fill."""

from __future__ import annotations

import math
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import numpy as np

try:  # the clip ufunc itself: np.clip's Python wrapper costs several µs per call
    from numpy._core.umath import clip as clip_ufunc
except ImportError:  # numpy < 2
    from numpy.core.umath import clip as clip_ufunc  # type: ignore[no-redef]

from ._registry import kernel
from ._util import (
    ALL,
    FLOAT_MATH,
    INTS,
    REAL_MATH,
    bad,
    check_fits,
    check_scratch,
    dest,
    finish,
    float_dtype,
    load_native,
    numel,
    result_dtype,
    shape_of,
    unsupported,
    wrap_dim,
)

_native = load_native()  # orchestra's compiled kernels, or None (numpy paths only)

__all__: list[str] = []

_SQRT1_2 = math.sqrt(0.5)


def _const(value: float) -> MappingProxyType:
    """Read-only 0-d arrays of ``value`` per dtype. A ufunc given a 0-d array of the other
    operand's dtype skips the Python-scalar conversion it does for ``x + 1`` (~1 µs)."""
    arrays = {}
    for t in (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8):
        a = np.array(value).astype(t)
        a.flags.writeable = False
        arrays[np.dtype(t)] = a
    return MappingProxyType(arrays)


_ZERO = _const(0)
_ONE = _const(1)
_FLOAT_TYPES = (np.float16, np.float32, np.float64)
# +-inf per float dtype: open ends of the clip ufunc, which numpy runs as one vectorised pass (about
# 3.5x faster than np.maximum / np.minimum with a scalar on float32; NaN propagates and
# relu(-0.0) stays -0.0, as in torch).
_POS_INF = MappingProxyType({np.dtype(t): np.array(np.inf, t) for t in _FLOAT_TYPES})
_NEG_INF = MappingProxyType({np.dtype(t): np.array(-np.inf, t) for t in _FLOAT_TYPES})
for _a in (*_POS_INF.values(), *_NEG_INF.values()):
    _a.flags.writeable = False
del _a


def _clip_bound(v: Any, dt: np.dtype, default: MappingProxyType) -> np.ndarray | None:
    """A clamp bound as a 0-d array of float dtype ``dt`` (None -> +-inf), or None when it is
    not a plain non-NaN Python number (tensors and NaN bounds take the general path)."""
    if v is None:
        return default[dt]
    tv = type(v)
    if (tv is float and v == v) or tv is int:
        return np.array(v, dt)
    return None
_F32 = np.dtype(np.float32)
_BOOL = np.dtype(np.bool_)


def _fast_out(out: Any, x: np.ndarray) -> bool:
    """Whether an elementwise result of ``x``'s shape and dtype may go straight into ``out``."""
    return type(out) is np.ndarray and out.shape == x.shape and out.dtype == x.dtype


def _binary_fast(ufunc: np.ufunc, a: Any, b: Any, out: Any) -> np.ndarray | None:
    """``ufunc(a, b, out=out)`` when torch's type promotion is trivially out's dtype (equal
    tensor dtypes, or a float tensor and a Python int/float) and the broadcast shape is out's;
    None when the general path must decide. Numpy's ufuncs handle inputs overlapping out."""
    if type(out) is not np.ndarray or type(a) is not np.ndarray:
        return None
    dt = out.dtype
    if a.dtype != dt:
        return None
    shape = out.shape
    tb = type(b)
    if tb is np.ndarray:
        if b.dtype != dt or (a.shape != shape and b.shape != shape):
            return None
    elif tb is float or tb is int:
        if dt.kind != "f" or a.shape != shape:
            return None
    else:
        return None
    try:
        # With a or b of out's shape, the broadcast shape is out's or numpy refuses it.
        return ufunc(a, b, out=out)
    except (ValueError, TypeError, OverflowError):
        return None


def _work(out: Any, shape: tuple[int, ...], dt: np.dtype, *inputs: Any) -> np.ndarray:
    """A buffer of ``shape``/``dt`` to compute in: ``out`` itself when it fits and does not
    overlap an input (multi-pass kernels read their inputs after the first write)."""
    o = dest(out, shape, dt)
    if o is not None:
        for x in inputs:
            if isinstance(x, np.ndarray) and np.may_share_memory(o, x):
                o = None
                break
    if o is None:
        check_fits("elementwise", shape, out)
        return np.empty(shape, dt)
    return o


def _native_unary(fn_name: str, x: np.ndarray, out: Any) -> np.ndarray | None:
    """The compiled float32 loop ``fn_name`` of x into ``out`` (or a new array) when both are
    C-contiguous float32 and ``out`` is ``x`` or apart from it; None otherwise (numpy path)."""
    if _native is None or type(x) is not np.ndarray or x.dtype != np.float32 or not x.flags.c_contiguous:
        return None
    o = dest(out, x.shape, x.dtype)
    if o is None or not o.flags.c_contiguous:
        check_fits("elementwise", x.shape, out)
        o = np.empty(x.shape, x.dtype)
    elif o.ctypes.data != x.ctypes.data and np.may_share_memory(o, x):
        return None
    getattr(_native, fn_name)(x, o, x.size)
    return o


def _bshape(*vals: Any) -> tuple[int, ...]:
    shape = np.broadcast_shapes(*(shape_of(v) for v in vals))
    if len(vals) > 1 and shape and numel(shape) > 1 << 20:  # [N, 1] op [1, N]: N*N, before allocating
        check_scratch("elementwise", shape, 4, "broadcast result")
    return shape


def _check_int_divisor(op: str, dt: np.dtype, other: Any) -> None:
    if dt.kind in "iub" and np.any(np.asarray(other) == 0):
        raise bad(op, "integer division by zero")


# --------------------------------------------------------------------------- arithmetic


def _add_sub(op: str, ufunc: np.ufunc, self: Any, other: Any, alpha: Any, out: Any) -> Any:
    dt = result_dtype(self, other)
    if alpha is not None and alpha != 1:
        if dt.kind == "b":
            raise bad(op, "alpha must be 1 for boolean tensors")
        if dt.kind in "iu" and isinstance(alpha, float) and not alpha.is_integer():
            raise bad(op, f"alpha {alpha} must be an integer for integer tensors")
        other = np.multiply(other, alpha, dtype=dt, casting="unsafe")
    o = dest(out, _bshape(self, other))
    res = ufunc(self, other, out=o, dtype=dt, casting="unsafe")
    return finish(res, out)


# float32 sums of at least this many elements run compiled, split over the kernels' threads,
# when there are several (one thread: numpy's add is as fast)
_NATIVE_ADD_MIN = 1 << 15


def add_f32_into(a: Any, b: Any, out: Any, relu: bool = False) -> bool:
    """``out = a + b`` (then relu, as :func:`relu_out`: NaN and -0.0 kept), compiled and split
    over the kernels' threads, for float32 C-contiguous arrays of out's shape (out may be a or
    b) of at least ``_NATIVE_ADD_MIN`` elements when the kernels have several threads. The
    same bits as numpy's add. False, nothing written, where it doesn't apply."""
    if (_native is None or type(out) is not np.ndarray or type(a) is not np.ndarray or type(b) is not np.ndarray
            or out.dtype != _F32 or a.dtype != _F32 or b.dtype != _F32 or out.size < _NATIVE_ADD_MIN
            or a.shape != out.shape or b.shape != out.shape or not out.flags.writeable):
        return False
    if not (a.flags.c_contiguous and b.flags.c_contiguous and out.flags.c_contiguous) or _native.get_threads() < 2:
        return False
    try:
        _native.add_f32(a, b, out, out.size, relu)
    except ValueError:  # out overlaps an operand without being it
        return False
    return True


@kernel("aten::add.out", dtypes=ALL)
def add_out(self: np.ndarray, other: np.ndarray, alpha: Any, out: np.ndarray) -> np.ndarray:
    if alpha == 1 and add_f32_into(self, other, out):
        return out
    if alpha == 1 and (r := _binary_fast(np.add, self, other, out)) is not None:
        return r
    return _add_sub("aten::add.out", np.add, self, other, alpha, out)


@kernel("aten::add.Scalar_out", dtypes=ALL)
def add_scalar_out(self: np.ndarray, other: Any, alpha: Any, out: np.ndarray) -> np.ndarray:
    if alpha == 1 and (r := _binary_fast(np.add, self, other, out)) is not None:
        return r
    return _add_sub("aten::add.Scalar_out", np.add, self, other, alpha, out)


@kernel("aten::sub.out", dtypes=REAL_MATH)
def sub_out(self: np.ndarray, other: np.ndarray, alpha: Any, out: np.ndarray) -> np.ndarray:
    if alpha == 1 and (r := _binary_fast(np.subtract, self, other, out)) is not None:
        return r
    return _add_sub("aten::sub.out", np.subtract, self, other, alpha, out)


@kernel("aten::sub.Scalar_out", dtypes=REAL_MATH)
def sub_scalar_out(self: np.ndarray, other: Any, alpha: Any, out: np.ndarray) -> np.ndarray:
    if alpha == 1 and (r := _binary_fast(np.subtract, self, other, out)) is not None:
        return r
    return _add_sub("aten::sub.Scalar_out", np.subtract, self, other, alpha, out)


@kernel("aten::rsub.Scalar_out", dtypes=REAL_MATH)
def rsub_scalar_out(self: np.ndarray, other: Any, alpha: Any, out: np.ndarray) -> np.ndarray:
    # other - alpha * self
    dt = result_dtype(self, other)
    if alpha is not None and alpha != 1:
        self = np.multiply(self, alpha, dtype=dt, casting="unsafe")
    o = dest(out, shape_of(self))
    return finish(np.subtract(other, self, out=o, dtype=dt, casting="unsafe"), out)


# A (N, C, H, W) x (N, C, 1, 1) float32 product of at least this many elements (a
# squeeze-and-excite block's excitation) is one compiled pass over the planes, split over
# the kernels' threads; the same float32 products as numpy's, bit for bit.
_SCALE_PLANES_MIN = 1 << 14


def scale_rows_into(w: np.ndarray, s: np.ndarray, out: np.ndarray) -> bool | None:
    """``out[i, ...] = w[i, ...] * s[i]`` (float32, C-contiguous, out of w's shape: w itself
    or memory of its own) by the compiled kernel, split over its threads: whether every
    product is finite; None (nothing written) where it does not apply. The same products as
    numpy's."""
    if (_native is None or w.dtype != _F32 or s.dtype != _F32 or out.dtype != _F32 or not w.ndim
            or s.shape != (w.shape[0],) or out.shape != w.shape or not w.shape[0]
            or not (w.flags.c_contiguous and s.flags.c_contiguous and out.flags.c_contiguous)):
        return None
    try:
        return bool(_native.scale_planes_f32(w, s, out, w.shape[0], w.size // w.shape[0]))
    except ValueError:  # out overlaps w or s (the kernel checks before it writes)
        return None


def bn_fold_f32(var: np.ndarray, mean: np.ndarray, gamma: np.ndarray | None, beta: np.ndarray | None,
                bias: np.ndarray | None, eps: float) -> tuple[np.ndarray, np.ndarray, bool] | None:
    """An inference batch norm's float32 (scale, shift, every scale and shift finite) for folding into a
    convolution by the compiled kernel: ``gamma * (1 / sqrt(var + eps))`` and ``(bias - mean)
    * scale + beta`` in float64, an operation at a time as numpy computes them, rounded to
    float32. None (the caller computes them with numpy) where the kernel does not apply:
    vectors that are not float32, C-contiguous and of one length (the kernel checks them: a
    load makes one call per folded batch norm)."""
    if _native is None or var.ndim != 1:
        return None
    n = var.shape[0]
    scale, shift = np.empty(n, _F32), np.empty(n, _F32)
    finite = _native.bn_fold_f32(var, mean, gamma, beta, bias, float(eps), scale, shift)
    return None if finite is None else (scale, shift, finite)


def _scale_planes(x: Any, s: Any, out: Any) -> np.ndarray | None:
    """x * s into out by the compiled kernel when s scales x's (n, c) planes; else None."""
    if (type(x) is not np.ndarray or type(s) is not np.ndarray or x.ndim != 4 or s.ndim != 4
            or x.dtype != _F32 or s.dtype != _F32 or x.size < _SCALE_PLANES_MIN
            or s.shape != x.shape[:2] + (1, 1) or type(out) is not np.ndarray or out.shape != x.shape
            or out.dtype != _F32 or not (x.flags.c_contiguous and s.flags.c_contiguous and out.flags.c_contiguous)
            or not out.flags.writeable):
        return None
    if (out.ctypes.data != x.ctypes.data and np.may_share_memory(out, x)) or np.may_share_memory(out, s):
        return None
    planes = x.shape[0] * x.shape[1]
    _native.scale_planes_f32(x, s, out, planes, x.size // planes)
    return out


def _mul(self: Any, other: Any, out: Any) -> Any:
    if _native is not None:
        r = _scale_planes(self, other, out)
        if r is None:
            r = _scale_planes(other, self, out)
        if r is not None:
            return r
    if (r := _binary_fast(np.multiply, self, other, out)) is not None:
        return r
    dt = result_dtype(self, other)
    o = dest(out, _bshape(self, other))
    return finish(np.multiply(self, other, out=o, dtype=dt, casting="unsafe"), out)


@kernel("aten::mul.out", dtypes=ALL)
def mul_out(self: np.ndarray, other: np.ndarray, out: np.ndarray) -> np.ndarray:
    return _mul(self, other, out)


@kernel("aten::mul.Scalar_out", dtypes=ALL)
def mul_scalar_out(self: np.ndarray, other: Any, out: np.ndarray) -> np.ndarray:
    return _mul(self, other, out)


def _div(op: str, self: Any, other: Any, rounding_mode: str | None, out: Any) -> Any:
    shape = _bshape(self, other)
    if rounding_mode is None:
        dt = float_dtype(result_dtype(self, other))
        with np.errstate(divide="ignore", invalid="ignore"):
            res = np.true_divide(self, other, out=dest(out, shape), dtype=dt, casting="unsafe")
        return finish(res, out)
    dt = result_dtype(self, other)
    if rounding_mode not in ("trunc", "floor"):
        raise bad(op, f"rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
    if dt.kind in "iub":
        _check_int_divisor(op, dt, other)
        if dt.kind == "b":
            dt = np.dtype(np.int64)
        q = np.floor_divide(self, other, dtype=dt, casting="unsafe")
        if rounding_mode == "trunc":
            # floor -> trunc: +1 where the quotient is negative and inexact.
            r = np.remainder(self, other, dtype=dt, casting="unsafe")
            fix = (r != 0) & (np.less(self, 0) ^ np.less(other, 0))
            np.add(q, fix, out=q, casting="unsafe")
        return finish(q, out)
    with np.errstate(divide="ignore", invalid="ignore"):
        if rounding_mode == "floor":
            # numpy's float floor_divide is Python's (and torch's) fmod-based algorithm.
            res = np.floor_divide(self, other, out=dest(out, shape), dtype=dt, casting="unsafe")
        else:
            res = np.true_divide(self, other, out=dest(out, shape), dtype=dt, casting="unsafe")
            res = np.trunc(res, out=res)
    return finish(res, out)


@kernel("aten::div.out", dtypes=REAL_MATH)
def div_out(self: np.ndarray, other: np.ndarray, out: np.ndarray) -> np.ndarray:
    return _div("aten::div.out", self, other, None, out)


@kernel("aten::div.out_mode", dtypes=REAL_MATH)
def div_out_mode(
    self: np.ndarray, other: np.ndarray, rounding_mode: str | None, out: np.ndarray
) -> np.ndarray:
    return _div("aten::div.out_mode", self, other, rounding_mode, out)


@kernel("aten::div.Scalar_out", dtypes=REAL_MATH)
def div_scalar_out(self: np.ndarray, other: Any, out: np.ndarray) -> np.ndarray:
    return _div("aten::div.Scalar_out", self, other, None, out)


@kernel("aten::div.Scalar_mode_out", dtypes=REAL_MATH)
def div_scalar_mode_out(
    self: np.ndarray, other: Any, rounding_mode: str | None, out: np.ndarray
) -> np.ndarray:
    return _div("aten::div.Scalar_mode_out", self, other, rounding_mode, out)


@kernel("aten::floor_divide.out", dtypes=REAL_MATH)
def floor_divide_out(self: np.ndarray, other: np.ndarray, out: np.ndarray) -> np.ndarray:
    return _div("aten::floor_divide.out", self, other, "floor", out)


def _remainder(op: str, ufunc: np.ufunc, self: Any, other: Any, out: Any) -> Any:
    dt = result_dtype(self, other)
    _check_int_divisor(op, dt, other)
    with np.errstate(divide="ignore", invalid="ignore"):
        res = ufunc(self, other, out=dest(out, _bshape(self, other)), dtype=dt, casting="unsafe")
    return finish(res, out)


@kernel("aten::remainder.Tensor_out", dtypes=REAL_MATH)
def remainder_tensor_out(self: np.ndarray, other: np.ndarray, out: np.ndarray) -> np.ndarray:
    return _remainder("aten::remainder.Tensor_out", np.remainder, self, other, out)


@kernel("aten::remainder.Scalar_out", dtypes=REAL_MATH)
def remainder_scalar_out(self: np.ndarray, other: Any, out: np.ndarray) -> np.ndarray:
    return _remainder("aten::remainder.Scalar_out", np.remainder, self, other, out)


@kernel("aten::fmod.Tensor_out", dtypes=REAL_MATH)
def fmod_tensor_out(self: np.ndarray, other: np.ndarray, out: np.ndarray) -> np.ndarray:
    return _remainder("aten::fmod.Tensor_out", np.fmod, self, other, out)


@kernel("aten::fmod.Scalar_out", dtypes=REAL_MATH)
def fmod_scalar_out(self: np.ndarray, other: Any, out: np.ndarray) -> np.ndarray:
    return _remainder("aten::fmod.Scalar_out", np.fmod, self, other, out)


def _pow(op: str, base: Any, exponent: Any, out: Any) -> Any:
    dt = result_dtype(base, exponent)
    shape = _bshape(base, exponent)
    o = dest(out, shape)
    if dt.kind in "iu" and np.any(np.asarray(exponent) < 0):
        raise bad(op, "integers to negative integer powers are not allowed")
    if not isinstance(exponent, np.ndarray) and isinstance(base, np.ndarray):
        if exponent == 2:
            return finish(np.square(base, out=o, dtype=dt, casting="unsafe"), out)
        if exponent == 1:
            return finish(base, out)
        if exponent == 0.5 and dt.kind == "f":
            with np.errstate(invalid="ignore"):
                return finish(np.sqrt(base, out=o, dtype=dt, casting="unsafe"), out)
    with np.errstate(all="ignore"):
        res = np.power(base, exponent, out=o, dtype=dt, casting="unsafe")
    return finish(res, out)


@kernel("aten::pow.Tensor_Scalar_out", dtypes=REAL_MATH)
def pow_tensor_scalar_out(self: np.ndarray, exponent: Any, out: np.ndarray) -> np.ndarray:
    return _pow("aten::pow.Tensor_Scalar_out", self, exponent, out)


@kernel("aten::pow.Tensor_Tensor_out", dtypes=REAL_MATH)
def pow_tensor_tensor_out(self: np.ndarray, exponent: np.ndarray, out: np.ndarray) -> np.ndarray:
    return _pow("aten::pow.Tensor_Tensor_out", self, exponent, out)


@kernel("aten::pow.Scalar_out", dtypes=REAL_MATH)
def pow_scalar_out(self: Any, exponent: np.ndarray, out: np.ndarray) -> np.ndarray:
    return _pow("aten::pow.Scalar_out", self, exponent, out)


def _binary_same(ufunc: np.ufunc) -> Callable[..., Any]:
    def fn(self: np.ndarray, other: np.ndarray, out: np.ndarray) -> np.ndarray:
        if (r := _binary_fast(ufunc, self, other, out)) is not None:
            return r
        dt = result_dtype(self, other)
        o = dest(out, _bshape(self, other))
        return finish(ufunc(self, other, out=o, dtype=dt, casting="unsafe"), out)

    return fn


kernel("aten::maximum.out", dtypes=ALL)(_binary_same(np.maximum))
kernel("aten::minimum.out", dtypes=ALL)(_binary_same(np.minimum))
kernel("aten::bitwise_and.Tensor_out", dtypes=INTS + ("bool",))(_binary_same(np.bitwise_and))
kernel("aten::bitwise_or.Tensor_out", dtypes=INTS + ("bool",))(_binary_same(np.bitwise_or))
kernel("aten::bitwise_xor.Tensor_out", dtypes=INTS + ("bool",))(_binary_same(np.bitwise_xor))


# --------------------------------------------------------------------------- comparisons


def _compare(ufunc: np.ufunc) -> Callable[..., Any]:
    def fn(self: np.ndarray, other: Any, out: np.ndarray) -> np.ndarray:
        if (
            type(out) is np.ndarray
            and out.dtype == _BOOL
            and (self.shape == out.shape or (type(other) is np.ndarray and other.shape == out.shape))
        ):
            try:  # one operand has out's shape: the broadcast shape is out's or numpy refuses
                return ufunc(self, other, out=out)
            except (ValueError, TypeError):
                pass
        o = dest(out, _bshape(self, other), np.dtype(np.bool_))
        return finish(ufunc(self, other, out=o), out)

    return fn


for _name, _uf in (
    ("eq", np.equal),
    ("ne", np.not_equal),
    ("lt", np.less),
    ("le", np.less_equal),
    ("gt", np.greater),
    ("ge", np.greater_equal),
):
    kernel(f"aten::{_name}.Tensor_out", dtypes=ALL)(_compare(_uf))
    kernel(f"aten::{_name}.Scalar_out", dtypes=ALL)(_compare(_uf))

kernel("aten::logical_and.out", dtypes=ALL)(_compare(np.logical_and))
kernel("aten::logical_or.out", dtypes=ALL)(_compare(np.logical_or))
kernel("aten::logical_xor.out", dtypes=ALL)(_compare(np.logical_xor))


def _predicate(ufunc: np.ufunc) -> Callable[..., Any]:
    def fn(self: np.ndarray, out: np.ndarray) -> np.ndarray:
        o = dest(out, self.shape, np.dtype(np.bool_))
        return finish(ufunc(self, out=o), out)

    return fn


kernel("aten::logical_not.out", dtypes=ALL)(_predicate(np.logical_not))
kernel("aten::isnan.out", dtypes=ALL)(_predicate(np.isnan))
kernel("aten::isinf.out", dtypes=ALL)(_predicate(np.isinf))


# --------------------------------------------------------------------------- unary


def _unary_float(ufunc: np.ufunc, quiet: bool) -> Callable[..., Any]:
    """exp-like ops: integer inputs give float32 results."""

    def fn(self: np.ndarray, out: np.ndarray) -> np.ndarray:
        if _fast_out(out, self) and self.dtype.kind == "f":
            try:
                if quiet:
                    with np.errstate(all="ignore"):
                        return ufunc(self, out=out)
                return ufunc(self, out=out)
            except ValueError:  # a read-only out
                pass
        dt = float_dtype(self.dtype)
        o = dest(out, self.shape)
        if quiet:
            with np.errstate(all="ignore"):
                res = ufunc(self, out=o, dtype=dt, casting="unsafe")
        else:
            res = ufunc(self, out=o, dtype=dt, casting="unsafe")
        return finish(res, out)

    return fn


for _name, _uf, _quiet in (
    ("exp", np.exp, True),
    ("expm1", np.expm1, True),
    ("log", np.log, True),
    ("log1p", np.log1p, True),
    ("log2", np.log2, True),
    ("log10", np.log10, True),
    ("sqrt", np.sqrt, True),
    ("tanh", np.tanh, False),
    ("sin", np.sin, False),
    ("cos", np.cos, False),
    ("tan", np.tan, False),
    ("asin", np.arcsin, True),
    ("acos", np.arccos, True),
    ("atan", np.arctan, False),
    ("sinh", np.sinh, True),
    ("cosh", np.cosh, True),
    ("reciprocal", np.reciprocal, True),
):
    kernel(f"aten::{_name}.out", dtypes=REAL_MATH + ("bool",))(_unary_float(_uf, _quiet))


def _unary_same(ufunc: np.ufunc, int_identity: bool = False) -> Callable[..., Any]:
    """abs-like ops: the result keeps the input's dtype."""

    def fn(self: np.ndarray, out: np.ndarray) -> np.ndarray:
        if int_identity and self.dtype.kind in "iub":
            return finish(self, out)
        if _fast_out(out, self):
            try:
                return ufunc(self, out=out)
            except (ValueError, TypeError):
                pass
        o = dest(out, self.shape)
        return finish(ufunc(self, out=o, dtype=self.dtype, casting="unsafe"), out)

    return fn


kernel("aten::abs.out", dtypes=REAL_MATH)(_unary_same(np.abs))
kernel("aten::neg.out", dtypes=REAL_MATH)(_unary_same(np.negative))
kernel("aten::sign.out", dtypes=REAL_MATH)(_unary_same(np.sign))
kernel("aten::floor.out", dtypes=REAL_MATH)(_unary_same(np.floor, int_identity=True))
kernel("aten::ceil.out", dtypes=REAL_MATH)(_unary_same(np.ceil, int_identity=True))
kernel("aten::trunc.out", dtypes=REAL_MATH)(_unary_same(np.trunc, int_identity=True))
# torch.round rounds half to even, like np.rint.
kernel("aten::round.out", dtypes=REAL_MATH)(_unary_same(np.rint, int_identity=True))
kernel("aten::bitwise_not.out", dtypes=INTS + ("bool",))(_unary_same(np.invert))


@kernel("aten::rsqrt.out", dtypes=REAL_MATH + ("bool",))
def rsqrt_out(self: np.ndarray, out: np.ndarray) -> np.ndarray:
    w = _work(out, self.shape, float_dtype(self.dtype))
    with np.errstate(all="ignore"):
        np.sqrt(self, out=w, dtype=w.dtype, casting="unsafe")
        np.reciprocal(w, out=w)
    return finish(w, out)


def _sigmoid_into(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        np.negative(x, out=w, dtype=w.dtype, casting="unsafe")
        np.exp(w, out=w)
    np.add(w, 1, out=w)
    np.divide(1, w, out=w)  # np.reciprocal is ~2x slower for float32, same results
    return w


@kernel("aten::sigmoid.out", dtypes=REAL_MATH + ("bool",))
def sigmoid_out(self: np.ndarray, out: np.ndarray) -> np.ndarray:
    if _fast_out(out, self) and self.dtype.kind == "f" and out.flags.writeable:
        # 1 / (1 + exp(-x)); exp overflows (to inf, giving 0) for very negative x. For a few
        # elements, checking through Python floats that none is that negative (NaN fails the
        # test too) is cheaper than np.errstate (~3 µs).
        dt = self.dtype
        if self.size <= 64 and dt.itemsize >= 4:
            low = -80.0 if dt.itemsize == 4 else -700.0
            quiet = all(v > low for v in self.ravel().tolist())
        else:
            quiet = False
        if quiet:
            np.negative(self, out=out)
            np.exp(out, out=out)
        else:
            with np.errstate(over="ignore"):
                np.negative(self, out=out)
                np.exp(out, out=out)
        np.add(out, _ONE[dt], out=out)
        return np.divide(_ONE[dt], out, out=out)  # np.reciprocal is ~2x slower, same results
    return finish(_sigmoid_into(self, _work(out, self.shape, float_dtype(self.dtype))), out)


@kernel("aten::silu.out", dtypes=FLOAT_MATH)
def silu_out(self: np.ndarray, out: np.ndarray) -> np.ndarray:
    if (res := _native_unary("silu_f32", self, out)) is not None:
        return finish(res, out)
    w = _work(out, self.shape, float_dtype(self.dtype), self)
    # x / (1 + exp(-x)): one pass fewer than x * sigmoid(x).
    with np.errstate(over="ignore", invalid="ignore"):  # silu(-inf) is -inf / inf = NaN, as in torch
        np.negative(self, out=w, dtype=w.dtype, casting="unsafe")
        np.exp(w, out=w)
        np.add(w, 1, out=w)
        np.divide(self, w, out=w, dtype=w.dtype, casting="unsafe")
    return finish(w, out)


_ERFC_COEFFS = (-0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418,
                0.37409196, 1.00002368)


def _erfc_pos(z: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """erfc(z) for z >= 0 with fractional error < 1.2e-7 (the Chebyshev fit ``erfcc`` of
    Numerical Recipes), in z's dtype. ``z`` is overwritten; the result goes to ``out``."""
    t = np.multiply(z, 0.5)
    t += 1
    np.reciprocal(t, out=t)
    p = np.multiply(t, 0.17087277, out=out)
    for c in _ERFC_COEFFS:
        p += c
        p *= t
    p -= 1.26551223
    np.square(z, out=z)
    p -= z
    np.exp(p, out=p)
    p *= t
    return p


def _erf(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    x = np.asarray(x, dtype=dt)
    ax = np.abs(x)
    small = ax < 0.5
    # erf = sign(x) * (1 - erfc(|x|)); near 0 a Taylor series keeps the relative error small.
    res = _erfc_pos(ax)
    np.subtract(1, res, out=res)
    np.copysign(res, x, out=res)
    if small.any():
        xs = x[small]
        x2 = xs * xs
        s = np.full_like(xs, -1.0 / 1320.0)
        for c in (1.0 / 216.0, -1.0 / 42.0, 1.0 / 10.0, -1.0 / 3.0, 1.0):
            s *= x2
            s += c
        s *= xs
        s *= 2.0 / math.sqrt(math.pi)
        res[small] = s
    return res


@kernel("aten::erf.out", dtypes=REAL_MATH + ("bool",))
def erf_out(self: np.ndarray, out: np.ndarray) -> np.ndarray:
    with np.errstate(under="ignore"):
        return finish(_erf(self, float_dtype(self.dtype)), out)


# gelu(x) = x * Phi(x) for (small) float32 tensors by table: log Phi (the standard normal
# CDF) sampled every 2**-10 on [-14, 6], interpolated linearly (error <= h**2 / 8 *
# |(log Phi)''| ~ 1.2e-7, so ~2e-7 relative in Phi all the way into the negative tail, where
# torch's 1 + erf cancels), then exponentiated. Below -14, Phi is 0 (x * Phi(x) is under
# 1e-43 there); above 6, Phi is 1 to float32's precision. Index and interpolation are
# computed in float64: ~10 numpy calls in all (the fewest: the fastest for small tensors).
_GELU_X0 = -14.0
_GELU_SCALE = 1024.0
_GELU_N = int((6.0 - _GELU_X0) * _GELU_SCALE) + 1
# Above this many elements the float32 fit below is faster (the table's float64 passes and
# gather cost more than its fewer calls save; measured crossover ~3000).
GELU_TABLE_MAX_SIZE = 2048


def _gelu_table() -> np.ndarray:
    """(N, 2) float64, read-only: log Phi at each grid point and the step to the next one.
    The first row is (-inf, 0), so Phi is 0 on the first cell and below (-inf * 0 is NaN,
    as torch gives for gelu(-inf))."""
    x = np.arange(_GELU_N, dtype=np.float64) / _GELU_SCALE + _GELU_X0
    u = x * -_SQRT1_2  # Phi(x) = erfc(u) / 2
    e = _erfc_pos(np.abs(u))  # erfc(|u|), relative error < 1.2e-7
    e = np.where(u < 0, 2.0 - e, e)
    g = np.log(0.5 * e)
    table = np.zeros((_GELU_N, 2))
    table[:, 0] = g
    table[:-1, 1] = np.diff(g)
    table[0] = (-np.inf, 0.0)
    table.flags.writeable = False
    return table


def _f64(value: float) -> np.ndarray:
    a = np.array(value, np.float64)
    a.flags.writeable = False
    return a


_GELU_TABLE = _gelu_table()
_GELU_K = (_f64(_GELU_SCALE), _f64(-_GELU_X0 * _GELU_SCALE), _f64(0.0), _f64(_GELU_N - 1.0))


def _gelu_f32_into(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """gelu(x) by the table into ``out`` (x's shape, float32; may overlap x)."""
    scale, offset, zero, top = _GELU_K
    s = np.multiply(x, scale, dtype=np.float64)  # exact: x has 24 mantissa bits
    s += offset  # the table position, exact
    np.fmax(s, zero, out=s)  # fmax / fmin send NaN to a bound (the final x * ... stays NaN)
    np.fmin(s, top, out=s)
    whole = np.floor(s)
    s -= whole
    rows = _GELU_TABLE.take(whole.astype(np.intp), axis=0)
    np.multiply(rows[..., 1], s, out=s)
    s += rows[..., 0]
    np.exp(s, out=s)
    return np.multiply(s, x, out=out)


# gelu(x) = x * Phi(x) for larger float32 tensors, in float32 throughout, ~25 in-place passes:
#   gelu(x) = x/2 + |x|/2 - v * exp(G(v) - x**2 / 2),  v = h / (1 + 2K h),  h = |x| / 2,
# since x * Phi(x) = relu(x) - |x| * erfc(|x| / sqrt 2) / 2 and |x| erfc(|x| / sqrt 2) / 2 =
# v * erfcx(|x| / sqrt 2) * (1 + K |x|) * exp(-x**2 / 2). G(v) = ln(erfcx(a / sqrt 2) (1 + K a)),
# a = |x|, is smooth on v in [0, 1 / (2K)); G(0) = 0. Its degree-8 minimax fit without
# constant term (linear programming over |x| in [0, 14.5], past which the result underflows;
# the polynomial stays below -1.3 beyond) is within 5.8e-8 of G: the relative error of the
# result comes from float32 rounding, mostly of x**2 / 2 in the exponent: <= 4e-7 for |x| <= 2,
# 1.1e-6 for |x| <= 5, 4e-6 for |x| <= 10, 8e-6 down to float32's smallest normal result
# (tests/test_kernels.py checks a dense grid against math.erfc). No cancellation in the
# negative tail (x/2 + |x|/2 is exactly 0 there); x/2 + |x|/2 is exact and never overflows;
# gelu(inf) = inf, gelu(-inf) = gelu(NaN) = NaN, as 0.5 x (1 + erf(x / sqrt 2)) gives.
_GELU_K2 = np.float32(2 * 0.27)
_GELU_G = tuple(np.float32(c) for c in (
    -1.0557681357219344, 0.010790471420860023, 0.08201428691474494, 0.008187478222535955,
    -0.0026227422978653014, -0.0171442958970123, 0.010069450530973684, -0.0017205046768785824))
_F32_HALF, _F32_M2, _F32_ONE = np.float32(0.5), np.float32(-2), np.float32(1)


def gelu_fit_f32_into(x: np.ndarray, out: np.ndarray, scratch: np.ndarray | None = None) -> np.ndarray:
    """gelu(x) (approximate "none") by the float32 fit above into ``out`` (x's shape,
    float32, writeable; may be x itself or overlap it). ``scratch``: a flat float32 array of
    at least ``3 * x.size`` elements to compute in (else three temporaries are allocated), for
    a step that owns one (see orchestra/runtime/_optimize.py). The compiled kernel computes
    the same fit where built (the same operations; its exp within an ulp or two of numpy's),
    then no scratch is used (and an ``out`` it can't write straight into gets a copy: the same
    bits whatever ``out`` is)."""
    if _native is not None and type(x) is np.ndarray and x.dtype == _F32 and x.flags.c_contiguous:
        if (type(out) is np.ndarray and out.dtype == _F32 and out.shape == x.shape and out.flags.c_contiguous
                and out.flags.writeable and (out.ctypes.data == x.ctypes.data or not np.may_share_memory(out, x))):
            _native.gelu_f32(x, out, x.size)
            return out
        tmp = np.empty(x.shape, _F32)
        _native.gelu_f32(x, tmp, x.size)
        np.copyto(out, tmp)
        return out
    n = x.size
    if scratch is not None and scratch.size >= 3 * n:
        h, v, g = (scratch[k * n:(k + 1) * n].reshape(x.shape) for k in range(3))
        np.multiply(x, _F32_HALF, out=h)
    else:
        h = np.multiply(x, _F32_HALF)
        v = g = None
    with np.errstate(all="ignore"):  # 1/0, inf/inf, exp underflow: all give the right limit
        np.abs(h, out=h)
        v = np.divide(_F32_ONE, h, out=v)
        v += _GELU_K2
        np.divide(_F32_ONE, v, out=v)  # h / (1 + 2K h), 0 at h = 0
        g = np.multiply(v, _GELU_G[-1], out=g)
        for c in _GELU_G[-2::-1]:
            g += c
            g *= v
        # -x**2 / 2 into out, unless x is read from there at the end.
        sq = np.multiply(h, _F32_M2, out=None if np.may_share_memory(out, x) else out)
        sq *= h
        g += sq
        np.exp(g, out=g)
        g *= v
        np.multiply(x, _F32_HALF, out=out)
        out += h
        out -= g
    return out


@kernel("aten::gelu.out", dtypes=FLOAT_MATH)
def gelu_out(self: np.ndarray, approximate: str, out: np.ndarray) -> np.ndarray:
    if approximate == "none" and self.dtype == _F32:
        into = _gelu_f32_into if self.size <= GELU_TABLE_MAX_SIZE else gelu_fit_f32_into
        if _fast_out(out, self) and out.flags.writeable:
            return into(self, out)
        return finish(into(self, np.empty(self.shape, _F32)), out)
    dt = float_dtype(self.dtype)
    w = _work(out, self.shape, dt, self)
    if approximate == "tanh":
        # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
        np.multiply(self, self, out=w, casting="unsafe")
        w *= 0.044715
        w += 1
        w *= self
        w *= math.sqrt(2.0 / math.pi)
        np.tanh(w, out=w)
        w += 1
    elif approximate == "none" or approximate is None:
        # 0.5 * x * (1 + erf(x / sqrt 2)) == 0.5 * x * erfc(-x / sqrt 2), with
        # erfc(-u) = 2 - erfc(u): accurate in the negative tail, where 1 + erf cancels.
        with np.errstate(under="ignore", over="ignore"):
            z = np.multiply(self, _SQRT1_2, dtype=dt, casting="unsafe")
            np.abs(z, out=z)
            e = _erfc_pos(z, out=w)  # erfc(|x| / sqrt 2); z is scratch now
            # For x > 0 use 2 - e, branch-free: e + (x > 0) * (2 - 2e).
            np.multiply(e, -2, out=z)
            z += 2
            np.multiply(z, self > 0, out=z)
            e += z
    else:
        raise bad("aten::gelu.out", f"approximate must be 'none' or 'tanh', got {approximate!r}")
    w *= self
    w *= 0.5
    return finish(w, out)


@kernel("aten::relu.out", dtypes=REAL_MATH)
def relu_out(self: np.ndarray, out: np.ndarray) -> np.ndarray:
    if _fast_out(out, self):
        dt = self.dtype
        zero = _ZERO.get(dt)
        if zero is not None:
            try:
                if dt.kind == "f":
                    return clip_ufunc(self, zero, _POS_INF[dt], out=out)  # NaN stays NaN, as in torch
                return np.maximum(self, zero, out=out)
            except ValueError:  # a read-only out
                pass
    o = dest(out, self.shape)
    zero = self.dtype.type(0)
    return finish(np.maximum(self, zero, out=o, dtype=self.dtype, casting="unsafe"), out)


def _clamp(self: np.ndarray, lo: Any, hi: Any, out: Any) -> np.ndarray:
    if (type(self) is np.ndarray and self.dtype.kind == "f" and _fast_out(out, self)
            and out.flags.writeable and (lo is not None or hi is not None)):
        dt = self.dtype
        a, b = _clip_bound(lo, dt, _NEG_INF), _clip_bound(hi, dt, _POS_INF)
        if a is not None and b is not None:
            # min(max(x, lo), hi) in one pass: hi wins when lo > hi, NaN propagates.
            return clip_ufunc(self, a, b, out=out)
    dt = result_dtype(self, lo, hi)
    shape = _bshape(self, lo, hi)
    o = dest(out, shape)
    if lo is None and hi is None:
        return finish(self, out)
    if lo is None:
        res = np.minimum(self, hi, out=o, dtype=dt, casting="unsafe")
    elif hi is None:
        res = np.maximum(self, lo, out=o, dtype=dt, casting="unsafe")
    else:
        # min(max(x, lo), hi): hi wins when lo > hi, as in torch.
        w = _work(out, shape, dt, hi)
        np.maximum(self, lo, out=w, dtype=dt, casting="unsafe")
        res = np.minimum(w, hi, out=w, dtype=dt, casting="unsafe")
    return finish(res, out)


@kernel("aten::clamp.out", dtypes=REAL_MATH)
def clamp_out(self: np.ndarray, min: Any, max: Any, out: np.ndarray) -> np.ndarray:  # noqa: A002
    return _clamp(self, min, max, out)


@kernel("aten::clamp.Tensor_out", dtypes=REAL_MATH)
def clamp_tensor_out(
    self: np.ndarray, min: np.ndarray | None, max: np.ndarray | None, out: np.ndarray  # noqa: A002
) -> np.ndarray:
    return _clamp(self, min, max, out)


@kernel("aten::clamp_min.out", dtypes=REAL_MATH)
def clamp_min_out(self: np.ndarray, min: Any, out: np.ndarray) -> np.ndarray:  # noqa: A002
    return _clamp(self, min, None, out)


@kernel("aten::clamp_max.out", dtypes=REAL_MATH)
def clamp_max_out(self: np.ndarray, max: Any, out: np.ndarray) -> np.ndarray:  # noqa: A002
    return _clamp(self, None, max, out)


@kernel("aten::hardtanh.out", dtypes=REAL_MATH)
def hardtanh_out(self: np.ndarray, min_val: Any, max_val: Any, out: np.ndarray) -> np.ndarray:
    if _fast_out(out, self) and self.dtype.kind == "f" and out.flags.writeable:
        dt = self.dtype
        a, b = _clip_bound(min_val, dt, _NEG_INF), _clip_bound(max_val, dt, _POS_INF)
        if a is not None and b is not None:
            return clip_ufunc(self, a, b, out=out)
        np.maximum(self, np.array(min_val, dt), out=out)
        return np.minimum(out, np.array(max_val, dt), out=out)
    w = _work(out, self.shape, self.dtype)
    np.maximum(self, min_val, out=w, dtype=self.dtype, casting="unsafe")
    np.minimum(w, max_val, out=w, dtype=self.dtype, casting="unsafe")
    return finish(w, out)


@kernel("aten::leaky_relu.out", dtypes=FLOAT_MATH)
def leaky_relu_out(self: np.ndarray, negative_slope: Any, out: np.ndarray) -> np.ndarray:
    w = _work(out, self.shape, self.dtype, self)
    np.multiply(self, negative_slope, out=w, dtype=self.dtype, casting="unsafe")
    np.copyto(w, self, where=self > 0)
    return finish(w, out)


@kernel("aten::elu.out", dtypes=FLOAT_MATH)
def elu_out(
    self: np.ndarray, alpha: Any, scale: Any, input_scale: Any, out: np.ndarray
) -> np.ndarray:
    w = _work(out, self.shape, self.dtype, self)
    with np.errstate(over="ignore"):
        np.multiply(self, input_scale, out=w, dtype=self.dtype, casting="unsafe")
        np.expm1(w, out=w)
    w *= alpha * scale
    np.multiply(self, scale, out=w, where=self > 0, dtype=self.dtype, casting="unsafe")
    return finish(w, out)


def _clip_0_6(w: np.ndarray) -> None:
    if w.dtype in _POS_INF:
        clip_ufunc(w, _ZERO[w.dtype], np.array(6, w.dtype), out=w)
    else:
        np.maximum(w, 0, out=w)
        np.minimum(w, 6, out=w)


def _hardsigmoid_into(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    # min(max(x + 3, 0), 6) / 6
    np.add(x, 3, out=w, casting="unsafe")
    _clip_0_6(w)
    w /= 6
    return w


@kernel("aten::hardsigmoid.out", dtypes=FLOAT_MATH)
def hardsigmoid_out(self: np.ndarray, out: np.ndarray) -> np.ndarray:
    return finish(_hardsigmoid_into(self, _work(out, self.shape, self.dtype)), out)


@kernel("aten::hardswish.out", dtypes=FLOAT_MATH)
def hardswish_out(self: np.ndarray, out: np.ndarray) -> np.ndarray:
    if (res := _native_unary("hardswish_f32", self, out)) is not None:
        return finish(res, out)
    w = _work(out, self.shape, self.dtype, self)
    # x * min(max(x + 3, 0), 6) / 6
    np.add(self, 3, out=w, casting="unsafe")
    _clip_0_6(w)
    w *= self
    w /= 6
    return finish(w, out)


@kernel("aten::glu.out", dtypes=FLOAT_MATH)
def glu_out(self: np.ndarray, dim: int, out: np.ndarray) -> np.ndarray:
    d = wrap_dim(dim, self.ndim, "aten::glu.out")
    n = self.shape[d]
    if n % 2:
        raise bad("aten::glu.out", f"dim {dim} has odd size {n}")
    a, b = np.split(self, 2, axis=d)
    w = _work(out, a.shape, self.dtype)
    _sigmoid_into(b, w)
    w *= a
    return finish(w, out)


# --------------------------------------------------------------------------- selection


@kernel("aten::where.self_out", dtypes=ALL)
def where_self_out(
    condition: np.ndarray, self: np.ndarray, other: np.ndarray, out: np.ndarray
) -> np.ndarray:
    dt = result_dtype(self, other)
    shape = _bshape(condition, self, other)
    w = _work(out, shape, dt, condition, self, other)
    cond = condition if condition.dtype == np.bool_ else condition.astype(np.bool_)
    np.copyto(w, other, casting="unsafe")
    np.copyto(w, self, where=cond, casting="unsafe")
    return finish(w, out)


@kernel("aten::masked_fill.Scalar_out", dtypes=ALL)
def masked_fill_scalar_out(
    self: np.ndarray, mask: np.ndarray, value: Any, out: np.ndarray
) -> np.ndarray:
    shape = _bshape(self, mask)
    w = _work(out, shape, self.dtype, mask)
    np.copyto(w, self)
    m = mask if mask.dtype == np.bool_ else mask.astype(np.bool_)
    np.copyto(w, np.asarray(value).astype(self.dtype), where=m)
    return finish(w, out)


@kernel("aten::native_dropout.out", dtypes=FLOAT_MATH)
def native_dropout_out(
    input: np.ndarray, p: float, train: bool | None, out0: np.ndarray, out1: np.ndarray  # noqa: A002
) -> tuple[np.ndarray, np.ndarray]:
    """Inference only: returns (input, all-true mask); training-mode dropout is not supported."""
    if train and p > 0:
        raise unsupported("aten::native_dropout.out", "training-mode (random) dropout is not supported")
    mask = dest(out1, input.shape, np.dtype(np.bool_))
    if mask is None:
        mask = np.ones(input.shape, np.bool_)
    else:
        mask.fill(True)
    return finish(input, out0), finish(mask, out1)
