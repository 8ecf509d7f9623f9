"""Quantization kernels: ``quantized_decomposed::`` quantize / dequantize / choose_qparams.

Portable int8 programs (PT2E-quantized, exported without a partitioner) keep these ops around
float kernels. The numbers follow ExecuTorch's portable quantized kernels
(``kernels/quantized/cpu/op_quantize.cpp``, ``op_dequantize.cpp``, ``op_choose_qparams.cpp``)
as built for x86, bit for bit:

- quantize: ``q = clamp(nearbyint(x * (1.0f / (float)scale)) + zero_point, quant_min,
  quant_max)`` computed in float32 (a float64 input is multiplied in float64 and then rounded to
  float32); ``nearbyint`` rounds halves to even. A product that is NaN or does not fit an
  int64 (NaN, +-inf, a zero scale) gives ``quant_min``, as ExecuTorch's float -> int64 cast does
  on x86.
- dequantize: ``x = (float)((int32)q - (int32)zero_point) * (float)scale``, then cast to
  ``out``'s float dtype.
- choose_qparams: min/max of the input widened to include 0, ``scale = (max - min) /
  (quant_max - quant_min)`` in double with ExecuTorch's fallbacks (0.1 for a zero scale, the
  6.1e-5 floor) and its nudged zero point.

Argument checks that ExecuTorch does with ``ET_CHECK`` (an abort there) raise
:class:`~orchestra.errors.InvalidArgumentError` here, naming the operator.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._registry import kernel
from ._util import bad, scalar_dtype, wrap_dim

__all__: list[str] = []

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_I64 = np.dtype(np.int64)
_FLOATS = ("float16", "float32", "float64")
# Quantized element types ExecuTorch's kernels accept (Bits16 and UInt16 are both uint16).
_QUANT = ("uint8", "int8", "int16", "uint16", "int32")
_BITS16 = 22
_SMALL_SCALE = float(np.float32(6.1e-5))


def _qdtype(code: Any, op: str) -> np.dtype:
    """The numpy dtype of a quantized ScalarType argument."""
    if code is not None and int(code) == _BITS16:
        return np.dtype(np.uint16)
    dt = scalar_dtype(code, op)
    if dt is None or dt.name not in _QUANT:
        raise bad(op, f"dtype {code} is not a quantized integer type (uint8, int8, int16, uint16, int32)")
    return dt


def _check_quant_range(op: str, dt: np.dtype, quant_min: int, quant_max: int) -> None:
    info = np.iinfo(dt)
    if quant_min < info.min:
        raise bad(op, f"quant_min {quant_min} is below {dt.name}'s minimum {info.min}")
    if quant_max > info.max:
        raise bad(op, f"quant_max {quant_max} is above {dt.name}'s maximum {info.max}")


def _check_float_input(op: str, x: Any) -> None:
    if not isinstance(x, np.ndarray) or x.dtype.name not in _FLOATS:
        got = x.dtype.name if isinstance(x, np.ndarray) else type(x).__name__
        raise bad(op, f"input must be a float16/float32/float64 tensor, got {got}")


def _check_out(op: str, out: Any, dt: np.dtype, what: str = "dtype") -> None:
    if isinstance(out, np.ndarray) and out.dtype != dt:
        raise bad(op, f"out has dtype {out.dtype.name} but the {what} argument says {dt.name}")


def _write(res: np.ndarray, out: Any) -> np.ndarray:
    """``res`` written into ``out`` when the shapes agree, else ``res`` (the interpreter resizes)."""
    if isinstance(out, np.ndarray) and out.shape == res.shape and out.flags.writeable:
        np.copyto(out, res, casting="unsafe")
        return out
    return res


def _channel_shape(x: np.ndarray, axis: int) -> tuple[int, ...]:
    """Shape that broadcasts one value per index of ``axis`` against ``x``."""
    return (x.shape[axis],) + (1,) * (x.ndim - axis - 1)


def _quantize(
    x: np.ndarray, inv_scale: np.ndarray, zero_point: np.ndarray, qmin: int, qmax: int, dt: np.dtype
) -> np.ndarray:
    """ExecuTorch's ``quantize_val`` elementwise; ``inv_scale`` (float32) and ``zero_point``
    (int64) broadcast against ``x``."""
    with np.errstate(over="ignore", invalid="ignore"):
        if x.dtype == _F64:
            v = (x * inv_scale.astype(_F64)).astype(_F32)
        else:
            v = np.multiply(x, inv_scale, dtype=_F32)
        # int32(zero_point) + nearbyint(float): a float32 sum in C.
        s = np.rint(v, out=v) + zero_point.astype(np.int32).astype(_F32)
        ok = np.abs(s) < np.float32(2.0**63)  # False for NaN and out-of-range (-> INT64_MIN)
    q = np.where(ok, s, np.float32(0)).astype(_I64)
    q = np.where(ok, np.clip(q, qmin, qmax), qmin)
    return q.astype(dt)


def _inv_scale(op: str, scale: Any) -> np.ndarray:
    s = np.asarray(scale, dtype=_F64).astype(_F32)
    with np.errstate(divide="ignore", over="ignore"):
        return np.float32(1.0) / s


def _dequantize(
    q: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, out_dt: np.dtype
) -> np.ndarray:
    """``(float)((int32)q - (int32)zp) * (float)scale`` elementwise, cast to ``out_dt``."""
    with np.errstate(over="ignore"):
        d = np.subtract(q, zero_point.astype(np.int32), dtype=np.int32)
    r = np.multiply(d.astype(_F32), scale.astype(_F32), dtype=_F32)
    return r if out_dt == _F32 else r.astype(out_dt)


def _scalar_tensor(op: str, t: Any, name: str, dt: np.dtype) -> Any:
    if not isinstance(t, np.ndarray) or t.dtype != dt:
        got = t.dtype.name if isinstance(t, np.ndarray) else type(t).__name__
        raise bad(op, f"{name} must be a {dt.name} tensor, got {got}")
    if t.size != 1:
        raise bad(op, f"{name} must have exactly one element, got {t.size}")
    return t.reshape(-1)[0].item()


def _per_channel_params(
    op: str, x: np.ndarray, scales: Any, zero_points: Any, axis: int,
    scale_dtypes: tuple[str, ...], zp_dtypes: tuple[str, ...], zp_optional: bool,
) -> tuple[int, np.ndarray, np.ndarray]:
    if x.ndim == 0:
        raise bad(op, "input must have at least one dimension")
    ax = wrap_dim(int(axis), x.ndim, op)
    n = x.shape[ax]
    if not isinstance(scales, np.ndarray) or scales.dtype.name not in scale_dtypes:
        got = scales.dtype.name if isinstance(scales, np.ndarray) else type(scales).__name__
        raise bad(op, f"scales must be a {'/'.join(scale_dtypes)} tensor, got {got}")
    if scales.size != n:
        raise bad(op, f"scales has {scales.size} elements but input.size({ax}) is {n}")
    if zero_points is None:
        if not zp_optional:
            raise bad(op, "zero_points must be given")
        zp = np.zeros(n, _I64)
    else:
        if not isinstance(zero_points, np.ndarray) or zero_points.dtype.name not in zp_dtypes:
            got = (zero_points.dtype.name if isinstance(zero_points, np.ndarray)
                   else type(zero_points).__name__)
            raise bad(op, f"zero_points must be a {'/'.join(zp_dtypes)} tensor, got {got}")
        if zero_points.size != n:
            raise bad(op, f"zero_points has {zero_points.size} elements but input.size({ax}) is {n}")
        zp = zero_points.reshape(-1).astype(_I64)
    shape = _channel_shape(x, ax)
    return ax, scales.reshape(shape), zp.reshape(shape)


# --------------------------------------------------------------------------- quantize


def _quantize_per_tensor(
    op: str, x: Any, scale: float, zero_point: int, quant_min: int, quant_max: int, dtype: Any,
    out: Any,
) -> np.ndarray:
    _check_float_input(op, x)
    dt = _qdtype(dtype, op)
    _check_out(op, out, dt)
    _check_quant_range(op, dt, quant_min, quant_max)
    res = _quantize(x, _inv_scale(op, scale), np.asarray(zero_point, _I64), quant_min, quant_max, dt)
    return _write(res, out)


@kernel("quantized_decomposed::quantize_per_tensor.out", dtypes=_FLOATS)
def quantize_per_tensor_out(
    input: np.ndarray, scale: float, zero_point: int, quant_min: int, quant_max: int,
    dtype: int, out: np.ndarray,
) -> np.ndarray:
    op = "quantized_decomposed::quantize_per_tensor.out"
    return _quantize_per_tensor(op, input, scale, zero_point, quant_min, quant_max, dtype, out)


@kernel("quantized_decomposed::quantize_per_tensor.Tensor_out", dtypes=_FLOATS)
def quantize_per_tensor_tensor_out(
    input: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, quant_min: int,
    quant_max: int, dtype: int, out: np.ndarray,
) -> np.ndarray:
    op = "quantized_decomposed::quantize_per_tensor.Tensor_out"
    s = _scalar_tensor(op, scale, "scale", _F64)
    zp = _scalar_tensor(op, zero_point, "zero_point", _I64)
    return _quantize_per_tensor(op, input, s, zp, quant_min, quant_max, dtype, out)


def _quantize_per_channel(
    op: str, x: Any, scales: Any, zero_points: Any, axis: int, quant_min: int, quant_max: int,
    dtype: Any, out: Any,
) -> np.ndarray:
    _check_float_input(op, x)
    _, s, zp = _per_channel_params(op, x, scales, zero_points, axis, ("float64",), ("int64",), False)
    dt = _qdtype(dtype, op)
    _check_out(op, out, dt)
    _check_quant_range(op, dt, quant_min, quant_max)
    return _write(_quantize(x, _inv_scale(op, s), zp, quant_min, quant_max, dt), out)


@kernel("quantized_decomposed::quantize_per_channel.out", dtypes=_FLOATS)
def quantize_per_channel_out(
    input: np.ndarray, scales: np.ndarray, zero_points: np.ndarray, axis: int, quant_min: int,
    quant_max: int, dtype: int, out: np.ndarray,
) -> np.ndarray:
    op = "quantized_decomposed::quantize_per_channel.out"
    return _quantize_per_channel(op, input, scales, zero_points, axis, quant_min, quant_max, dtype, out)


def _rows(op: str, x: Any) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.ndim == 0:
        raise bad(op, "input must be a tensor with at least one dimension")
    return x.reshape(int(np.prod(x.shape[:-1])), x.shape[-1])


@kernel("quantized_decomposed::quantize_per_token.out", dtypes=_FLOATS)
def quantize_per_token_out(
    input: np.ndarray, scales: np.ndarray, zero_points: np.ndarray, quant_min: int,
    quant_max: int, dtype: int, out: np.ndarray,
) -> np.ndarray:
    op = "quantized_decomposed::quantize_per_token.out"
    _check_float_input(op, input)
    res = _quantize_per_channel(op, _rows(op, input), scales, zero_points, 0, quant_min, quant_max, dtype, None)
    return _write(res.reshape(input.shape), out)


# --------------------------------------------------------------------------- dequantize


def _check_quant_input(op: str, q: Any, dtype: Any, quant_min: int, quant_max: int) -> None:
    if not isinstance(q, np.ndarray) or q.dtype.name not in _QUANT:
        got = q.dtype.name if isinstance(q, np.ndarray) else type(q).__name__
        raise bad(op, f"input must be a uint8/int8/int16/uint16/int32 tensor, got {got}")
    dt = _qdtype(dtype, op)
    if q.dtype != dt:
        raise bad(op, f"input has dtype {q.dtype.name} but the dtype argument says {dt.name}")
    if quant_min > quant_max:
        raise bad(op, f"quant_min {quant_min} is greater than quant_max {quant_max}")


def _out_float_dtype(op: str, out: Any, out_dtype: Any) -> np.dtype:
    want = scalar_dtype(out_dtype, op) if out_dtype is not None else None
    have = out.dtype if isinstance(out, np.ndarray) else None
    if want is not None and have is not None and want != have:
        raise bad(op, f"out has dtype {have.name} but out_dtype says {want.name}")
    dt = have if have is not None else (want if want is not None else _F32)
    if dt.name not in _FLOATS:
        raise bad(op, f"the output dtype must be float16/float32/float64, got {dt.name}")
    return dt


def _dequantize_per_tensor(
    op: str, q: Any, scale: float, zero_point: int, quant_min: int, quant_max: int, dtype: Any,
    out_dtype: Any, out: Any,
) -> np.ndarray:
    _check_quant_input(op, q, dtype, quant_min, quant_max)
    dt = _out_float_dtype(op, out, out_dtype)
    res = _dequantize(q, np.asarray(scale, _F64), np.asarray(zero_point, _I64), dt)
    return _write(res, out)


@kernel("quantized_decomposed::dequantize_per_tensor.out", dtypes=_QUANT)
def dequantize_per_tensor_out(
    input: np.ndarray, scale: float, zero_point: int, quant_min: int, quant_max: int,
    dtype: int, out_dtype: int | None, out: np.ndarray,
) -> np.ndarray:
    op = "quantized_decomposed::dequantize_per_tensor.out"
    return _dequantize_per_tensor(op, input, scale, zero_point, quant_min, quant_max, dtype, out_dtype, out)


@kernel("quantized_decomposed::dequantize_per_tensor.Tensor_out", dtypes=_QUANT)
def dequantize_per_tensor_tensor_out(
    input: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, quant_min: int,
    quant_max: int, dtype: int, out_dtype: int | None, out: np.ndarray,
) -> np.ndarray:
    op = "quantized_decomposed::dequantize_per_tensor.Tensor_out"
    s = _scalar_tensor(op, scale, "scale", _F64)
    zp = _scalar_tensor(op, zero_point, "zero_point", _I64)
    return _dequantize_per_tensor(op, input, s, zp, quant_min, quant_max, dtype, out_dtype, out)


def _dequantize_per_channel(
    op: str, q: Any, scales: Any, zero_points: Any, axis: int, quant_min: int, quant_max: int,
    dtype: Any, out_dtype: Any, out: Any,
) -> np.ndarray:
    _check_quant_input(op, q, dtype, quant_min, quant_max)
    _, s, zp = _per_channel_params(
        op, q, scales, zero_points, axis, ("float32", "float64"), ("int32", "int64"), True
    )
    dt = _out_float_dtype(op, out, out_dtype)
    return _write(_dequantize(q, s, zp, dt), out)


@kernel("quantized_decomposed::dequantize_per_channel.out", dtypes=_QUANT)
def dequantize_per_channel_out(
    input: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, axis: int,
    quant_min: int, quant_max: int, dtype: int, out_dtype: int | None, out: np.ndarray,
) -> np.ndarray:
    op = "quantized_decomposed::dequantize_per_channel.out"
    return _dequantize_per_channel(
        op, input, scales, zero_points, axis, quant_min, quant_max, dtype, out_dtype, out
    )


@kernel("quantized_decomposed::dequantize_per_token.out", dtypes=_QUANT)
def dequantize_per_token_out(
    input: np.ndarray, scales: np.ndarray, zero_points: np.ndarray, quant_min: int,
    quant_max: int, dtype: int, output_dtype: int, out: np.ndarray,
) -> np.ndarray:
    op = "quantized_decomposed::dequantize_per_token.out"
    if not isinstance(input, np.ndarray) or input.ndim == 0:
        raise bad(op, "input must be a tensor with at least one dimension")
    rows = _rows(op, input)
    res = _dequantize_per_channel(
        op, rows, scales, zero_points, 0, quant_min, quant_max, dtype, output_dtype,
        np.empty(0, out.dtype) if isinstance(out, np.ndarray) else None,
    )
    return _write(res.reshape(input.shape), out)


# --------------------------------------------------------------------------- choose_qparams


def qparams_from_min_max(
    min_val: np.ndarray, max_val: np.ndarray, quant_min: int, quant_max: int
) -> tuple[np.ndarray, np.ndarray]:
    """ExecuTorch's ``calculate_scale_and_zero_point`` on float32 arrays of minima/maxima.

    Returns (scale as float64, zero_point as int64), elementwise.
    """
    mn = np.minimum(np.asarray(min_val, _F32), np.float32(0))
    mx = np.maximum(np.asarray(max_val, _F32), np.float32(0))
    span = quant_max - quant_min
    scale = (mx.astype(_F64) - mn.astype(_F64)) / span
    with np.errstate(divide="ignore", over="ignore"):
        s32 = scale.astype(_F32)
        zero_like = (s32 == 0) | np.isinf(np.float32(1) / s32)
    scale = np.where(zero_like, 0.1, scale)
    small = scale < _SMALL_SCALE
    if np.any(small):
        org = scale.astype(_F32)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            amp = np.float32(_SMALL_SCALE) / org
            lim = np.float32(np.float32(_SMALL_SCALE) * np.float32(span))
            new_mx = np.where(mn == 0, lim, np.where(mx == 0, mx, (mx * amp).astype(_F32)))
            new_mn = np.where(mn == 0, mn, np.where(mx == 0, -lim, (mn * amp).astype(_F32)))
        mn = np.where(small, new_mn, mn).astype(_F32)
        mx = np.where(small, new_mx, mx).astype(_F32)
        scale = np.where(small, _SMALL_SCALE, scale)
    with np.errstate(invalid="ignore"):
        from_min = quant_min - mn.astype(_F64) / scale
        from_max = quant_max - mx.astype(_F64) / scale
        err_min = abs(quant_min) - np.abs(mn.astype(_F64) / scale)
        err_max = abs(quant_max) - np.abs(mx.astype(_F64) / scale)
        initial = np.where(err_min < err_max, from_min, from_max)
        nudged = np.rint(np.nan_to_num(initial).astype(_F32))
    zp = np.where(initial < quant_min, quant_min, np.where(initial > quant_max, quant_max, nudged))
    return scale.astype(_F64), zp.astype(_I64)


def _choose_check(op: str, x: Any, quant_min: int, quant_max: int, scale_out: Any, zp_out: Any) -> None:
    if quant_min >= quant_max:
        raise bad(op, f"quant_min {quant_min} must be less than quant_max {quant_max}")
    if not isinstance(x, np.ndarray) or x.dtype != _F32:
        got = x.dtype.name if isinstance(x, np.ndarray) else type(x).__name__
        raise bad(op, f"input must be a float32 tensor, got {got}")
    if x.size == 0:
        raise bad(op, "input is empty: there is no min/max to choose parameters from")
    if isinstance(scale_out, np.ndarray) and scale_out.dtype != _F64:
        raise bad(op, f"scale_out must be float64, got {scale_out.dtype.name}")
    if isinstance(zp_out, np.ndarray) and zp_out.dtype != _I64:
        raise bad(op, f"zero_point_out must be int64, got {zp_out.dtype.name}")


@kernel("quantized_decomposed::choose_qparams.Tensor_out", dtypes=("float32",))
def choose_qparams_tensor_out(
    input: np.ndarray, quant_min: int, quant_max: int, eps: float, dtype: int,
    scale_out: np.ndarray, zero_point_out: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    op = "quantized_decomposed::choose_qparams.Tensor_out"
    _choose_check(op, input, quant_min, quant_max, scale_out, zero_point_out)
    for name, t in (("scale_out", scale_out), ("zero_point_out", zero_point_out)):
        if isinstance(t, np.ndarray) and t.size != 1:
            raise bad(op, f"{name} must have exactly one element, got {t.size}")
    s, zp = qparams_from_min_max(input.min(), input.max(), quant_min, quant_max)
    return _write(s.reshape(np.shape(scale_out)), scale_out), _write(
        zp.reshape(np.shape(zero_point_out)), zero_point_out
    )


@kernel("quantized_decomposed::choose_qparams_per_token_asymmetric.out", dtypes=("float32",))
def choose_qparams_per_token_asymmetric_out(
    input: np.ndarray, dtype: int, scale_out: np.ndarray, zero_point_out: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    op = "quantized_decomposed::choose_qparams_per_token_asymmetric.out"
    _choose_check(op, input, -128, 127, scale_out, zero_point_out)
    if input.ndim == 0:
        raise bad(op, "input must have at least one dimension")
    rows = input.reshape(-1, input.shape[-1])
    shape = input.shape[:-1] + (1,)
    s, zp = qparams_from_min_max(rows.min(axis=1), rows.max(axis=1), -128, 127)
    return _write(s.reshape(shape), scale_out), _write(zp.reshape(shape), zero_point_out)
