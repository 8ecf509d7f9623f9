"""int8 XNNPACK graphs: quantized value types and the node behaviour for quantized inputs.

PT2E-quantized programs lowered to XNNPACK hold these datatypes:

- ``qint8`` / ``quint8`` (qs8 / qu8): per-tensor ``scale`` and ``zero_point`` activations;
- ``qcint8`` (qc8): per-channel symmetric weights (zero point 0), one scale per index of
  ``channel_dim`` (0 for OHWI conv / [out, in] FC filters, 3 for 1HWO depthwise filters);
- ``qcint32`` / ``qint32``: int32 biases (scale ``input_scale * filter_scale[c]``, used as is);
- ``qdint8`` (qd8): dynamically quantized activations, per row (``num_nonbatch_dims`` = 1:
  every index of the leading dims is a row of the last dim) with parameters computed at run
  time from the row's min/max, as XNNPACK's ``xnn_f32_qd8_asymmetric_quantization_params``.

The math follows XNNPACK (the revision ExecuTorch 1.5 builds):

- float -> qs8 ``Convert``: ``clamp(x * (1 / scale), qmin - zp, qmax - zp)`` in float32,
  rounded half to even, plus the zero point; qs8 -> float: ``(q - zp) * scale``.
- qs8 conv / FC: int32 accumulators ``sum((x - x_zp) * w) + bias``, requantized with the
  float32 scale ``input_scale * filter_scale[c] / output_scale``: ``(float) acc * scale``,
  clamped to the quantized output range (a fused activation's bounds quantized by
  ``xnn_qs8_quantize``), rounded half to even, plus the output zero point ("fp32"
  requantization).
- qd8 FC: ``(float) acc * row_step * filter_scale[c] + bias[c]`` (float32 output).
- qs8 ``Add``: XNNPACK's fixed-point add: 21-bit multipliers ``a_scale / out_scale``,
  ``b_scale / out_scale`` with a shared shift, ``(bias + a * a_mul + b * b_mul) >> shift``
  (arithmetic shift: halves round up), plus the output zero point.
- max pooling, transpose, reshape: on the int8 values (scale and zero point pass through).

The standalone functions below are that math on numpy arrays (tested on their own); the
builders wire them into the graph compiler. Importing this module registers the datatypes
and wraps the float builders of the node types it knows: a node whose values are quantized
gets the int8 path, any other the float one.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from orchestra.errors import Error
from orchestra.program._schema import _fast_init

from . import _nodes
from ._blob import VALUE_FLAG_EXTERNAL_INPUT, VALUE_FLAG_EXTERNAL_OUTPUT, XNode, XValue, constant_bytes
from ._compile import (LOOKUP_NODE, NODE_BUILDERS, Compiler, Plan, Step, TensorInfo, Workspace, register_datatype,
                       register_node)

__all__ = [
    "QParams",
    "add_params",
    "dequantize",
    "exact_dtype",
    "int_matmul",
    "qd8_params",
    "qs8_add",
    "quantize",
    "quantize_bound",
    "quantize_rows",
    "requantize",
    "requantization_scale",
]

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_I8 = np.dtype(np.int8)
_INT_RANGES = MappingProxyType({np.dtype(t): (int(np.iinfo(t).min), int(np.iinfo(t).max))
                                for t in (np.int8, np.uint8, np.int16, np.int32)})

# XNNDatatype codes (schema order).
QINT8, QUINT8, QINT32, QCINT8, QCINT32, QDINT8 = 3, 4, 5, 6, 7, 9
_QUANT_DATATYPES = MappingProxyType({QINT8: _I8, QUINT8: np.dtype(np.uint8), QINT32: np.dtype(np.int32),
                                     QCINT8: _I8, QCINT32: np.dtype(np.int32), QDINT8: _I8})


# ------------------------------------------------------------------------------------------
# The math (standalone)


def quantize(x: np.ndarray, scale: float, zero_point: int, qmin: int = -128, qmax: int = 127,
             dtype: Any = np.int8) -> np.ndarray:
    """XNNPACK's float32 -> qs8/qu8 convert: ``x * (1.0f / scale)`` clamped to
    ``[qmin - zp, qmax - zp]``, rounded half to even, plus ``zero_point``."""
    inv = np.float32(1.0) / np.float32(scale)
    v = np.multiply(x, inv, dtype=_F32)
    np.clip(v, np.float32(qmin - zero_point), np.float32(qmax - zero_point), out=v)
    return (np.rint(v) + np.float32(zero_point)).astype(dtype)


def dequantize(q: np.ndarray, scale: Any, zero_point: Any) -> np.ndarray:
    """``(q - zero_point) * scale`` in float32 (scale / zero point broadcast against q)."""
    d = np.subtract(q, np.asarray(zero_point, np.int32), dtype=np.int32).astype(_F32)
    return np.multiply(d, np.asarray(scale, _F32), dtype=_F32)


def qd8_params(rmin: np.ndarray, rmax: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """XNNPACK's dynamic int8 parameters from each row's min and max (float32 arrays).

    Returns ``(quant_scale, step, zero_point)``: the multiplier that quantizes
    (``255 / range``), the dequantization step (``1 / quant_scale``) and the int32 zero
    point, one per row.
    """
    qmin, qmax = np.float32(-128), np.float32(127)
    lo = np.minimum(np.float32(0), np.asarray(rmin, _F32))
    hi = np.maximum(np.float32(0), np.asarray(rmax, _F32))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scale = np.where(lo == hi, np.float32(1), (qmax - qmin) / (hi - lo)).astype(_F32)
        dmin = (lo * scale).astype(_F32)
        dmax = (hi * scale).astype(_F32)
        from_min = (qmin + dmin).astype(_F32)
        from_max = (qmax + dmax).astype(_F32)
        zp = np.where(from_min + from_max > 0, qmin - dmin, qmax - dmax).astype(_F32)
    zp = np.minimum(np.maximum(zp, qmin), qmax)
    step = (np.float32(1) / scale).astype(_F32)
    return scale, step, np.rint(zp).astype(np.int32)


def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Dynamic (qd8) quantization of each row of the 2-D float32 ``x``: returns
    ``(q int8 [rows, k], step float32 [rows], zero_point int32 [rows])``."""
    if x.shape[1] == 0:
        rows = x.shape[0]
        return np.empty(x.shape, _I8), np.ones(rows, _F32), np.zeros(rows, np.int32)
    scale, step, zp = qd8_params(x.min(axis=1), x.max(axis=1))
    v = np.multiply(x, scale[:, None], dtype=_F32)
    zpf = zp.astype(_F32)[:, None]
    np.clip(v, np.float32(-128) - zpf, np.float32(127) - zpf, out=v)
    return (np.rint(v) + zpf).astype(_I8), step, zp


def int_matmul(xc: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Exact integer product of centred activations ``xc`` [rows, k] (``x - zero_point``,
    any integer or integral-float array) and int8 weights ``w`` [k, n], as float64 (exact:
    every partial sum stays far below 2**53)."""
    return np.matmul(np.asarray(xc, _F64), np.asarray(w, _F64))


def exact_dtype(k: int) -> np.dtype:
    """The float dtype whose matmul of ``k``-long int8 dot products (centred activations
    |x - zp| <= 255, weights |w| <= 128) is exact: float32 while every partial sum stays below
    2**24, else float64."""
    return _F32 if k * 255 * 128 < (1 << 24) else _F64


def requantization_scale(input_scale: float, filter_scales: np.ndarray, output_scale: float) -> np.ndarray:
    """XNNPACK's per-channel float32 ``input_scale * filter_scale[c] / output_scale``."""
    return np.divide(np.multiply(np.asarray(filter_scales, _F32), np.float32(input_scale)), np.float32(output_scale))


def _requant_scale(c: Compiler, input_scale: float, filter_scales: np.ndarray, output_scale: float) -> np.ndarray:
    """:func:`requantization_scale`, prepacked: by the compiled kernels' one pass where they are
    built (the same float32 operations)."""
    if c.native is None or filter_scales.dtype != _F32 or not filter_scales.flags.c_contiguous:
        return c.prepacked(requantization_scale(input_scale, filter_scales, output_scale))
    out = np.empty(filter_scales.shape, _F32)
    c.native.qs8_requant_scale(filter_scales, filter_scales.size, input_scale, output_scale, out)
    return c.prepacked(out)


def _f32(v: float) -> float:
    """``v`` rounded to float32 (to nearest even; beyond float32's range, infinite)."""
    try:
        return _F32_BOX.unpack(_F32_BOX.pack(v))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


_F32_BOX = struct.Struct("f")


def quantize_bound(value: float, scale: float, zero_point: int) -> int:
    """``xnn_qs8_quantize``: a float activation bound as an int8 (``lrintf(clamp(value /
    scale + zero_point, -128, 127))``)."""
    # float32 arithmetic through Python floats: a quotient or sum of two float32 values computed in
    # float64, then rounded to float32, is the float32 result (float64 has more than 2 * 24 + 2 bits)
    v = _f32(_f32(_f32(value) / _f32(scale)) + zero_point)
    return round(min(max(v, -128.0), 127.0))  # round: half to even, as rint


def requantize(acc: np.ndarray, scale: np.ndarray, zero_point: int, qmin: int = -128, qmax: int = 127) -> np.ndarray:
    """XNNPACK's fp32 requantization of integer accumulators (any integral array) to int8:
    ``(float) acc * scale`` clamped to ``[qmin - zp, qmax - zp]``, rounded half to even,
    plus ``zero_point``."""
    v = np.multiply(np.asarray(acc).astype(_F32), np.asarray(scale, _F32), dtype=_F32)
    np.clip(v, np.float32(qmin - zero_point), np.float32(qmax - zero_point), out=v)
    return (np.rint(v) + np.float32(zero_point)).astype(_I8)


@dataclass(frozen=True, slots=True)
class AddParams:
    """XNNPACK's fixed-point qs8 add parameters."""

    a_multiplier: int
    b_multiplier: int
    bias: int
    shift: int


def _f32_bits(v: float) -> int:
    """The bits of ``v`` rounded to float32."""
    return _U32_BOX.unpack(_F32_BOX.pack(v))[0]


def _bits_f32(bits: int) -> float:
    """The float32 of the low 32 bits of ``bits``."""
    return _F32_BOX.unpack(_U32_BOX.pack(bits & 0xFFFFFFFF))[0]


_U32_BOX = struct.Struct("I")


def add_params(a_scale: float, a_zp: int, b_scale: float, b_zp: int, out_scale: float) -> AddParams:
    """``xnn_init_qs8_add_minmax_scalar_params``. Raises ValueError when a scale ratio is
    outside XNNPACK's supported range [2**-10, 2**8)."""
    # float32 arithmetic through Python floats (see quantize_bound), bits through struct
    o = _f32(out_scale)
    if o == 0.0:
        raise ValueError("the output scale is 0: input/output scale ratios are outside XNNPACK's range [2**-10, 2**8)")
    a_os = _f32(_f32(a_scale) / o)
    b_os = _f32(_f32(b_scale) / o)
    abs_a, abs_b = abs(a_os), abs(b_os)
    for r in (abs_a, abs_b):
        if not (2.0**-10 <= r < 2.0**8):
            raise ValueError(f"input/output scale ratio {r} is outside XNNPACK's range [2**-10, 2**8)")
    exponent = (_f32_bits(max(abs_a, abs_b)) >> 23) - 127
    shift = 20 - exponent
    # the ratios times 2**shift (their exponents raised), rounded half to even as rint
    a_mul = round(_bits_f32(_f32_bits(abs_a) + (shift << 23)))
    b_mul = round(_bits_f32(_f32_bits(abs_b) + (shift << 23)))
    if a_os < 0:
        a_mul = -a_mul
    if b_os < 0:
        b_mul = -b_mul
    bias = (1 << (shift - 1)) - a_mul * int(a_zp) - b_mul * int(b_zp)
    return AddParams(a_mul, b_mul, bias, shift)


def qs8_add(a: np.ndarray, b: np.ndarray, p: AddParams, out_zp: int, qmin: int = -128, qmax: int = 127,
            out: np.ndarray | None = None) -> np.ndarray:
    """XNNPACK's qs8 add (broadcasting): ``((bias + a * a_mul + b * b_mul) >> shift) + out_zp``
    clamped to ``[qmin, qmax]``."""
    # |a * a_mul| < 2**28 (multipliers < 2**21): int32 holds every sum, as in XNNPACK.
    acc = np.multiply(a, p.a_multiplier, dtype=np.int32)
    acc += np.multiply(b, p.b_multiplier, dtype=np.int32)
    acc += p.bias
    acc >>= p.shift
    acc += out_zp
    np.clip(acc, qmin, qmax, out=acc)
    if out is None:
        return acc.astype(_I8)
    np.copyto(out, acc, casting="unsafe")
    return out


# ------------------------------------------------------------------------------------------
# Per-value quantization parameters


@dataclass(frozen=True, slots=True)
class QParams:
    """A value's quantization: ``scale`` (float32; one per channel for per-channel values),
    ``zero_point``, and for per-channel values the ``channel_dim``."""

    kind: str
    scale: np.ndarray
    zero_point: int
    channel_dim: int = 0

    @property
    def tensor_scale(self) -> float:
        """The first scale, as a float."""
        return self.scale.item(0)


_fast_init(QParams)  # built per quantized value at load: through its slots, not object.__setattr__


def _qparams(c: Compiler, t: TensorInfo, role: str) -> QParams:
    cache: dict[int, QParams] | None = c.__dict__.get("_qparams")
    if cache is None:
        cache = c.__dict__["_qparams"] = {}
    vid = t.value.id
    found = cache.get(vid)
    if found is not None:
        return found
    q = t.value.quant
    if q is None:
        raise c.fail(f"{role} (value id {vid}, {t.value.datatype_name}) has no quantization parameters")
    if q.kind == "PerTensorQuant":
        if len(q.scale) != 1:
            raise c.fail(f"{role} (value id {vid}): per-tensor quantization with {len(q.scale)} scales")
        scale = np.array(q.scale, _F32)
        zp = int(q.zero_point)
        dt = t.dtype
        if dt.kind in "iu":
            lo, hi = _int_range(dt)
            if not lo <= zp <= hi:
                raise c.fail(f"{role} (value id {vid}): zero point {zp} is outside {dt.name}'s range")
        p = QParams(q.kind, scale, zp)
    elif q.kind == "PerChannelQuant":
        if not t.shape or not 0 <= q.channel_dim < len(t.shape):
            raise c.fail(f"{role} (value id {vid}): channel_dim {q.channel_dim} is not a dim of {list(t.shape)}")
        n = t.shape[q.channel_dim]
        if q.scale:
            scale = np.array(q.scale, _F32)
        else:
            if q.num_scales != n or not q.scale_buffer_idx:
                raise c.fail(f"{role} (value id {vid}): {q.num_scales} scales (buffer {q.scale_buffer_idx}) for "
                             f"{n} channels along dim {q.channel_dim}")
            raw = constant_bytes(c.graph, t.value, c.named_data, c.where, q.scale_buffer_idx)
            if len(raw) < 4 * n:
                raise c.fail(f"{role} (value id {vid}): the scale buffer {q.scale_buffer_idx} holds {len(raw)} bytes, "
                             f"{n} float32 scales need {4 * n}")
            scale = np.frombuffer(raw, _F32, count=n).copy()
        if scale.size != n:
            raise c.fail(f"{role} (value id {vid}): {scale.size} scales for {n} channels")
        p = QParams(q.kind, scale, 0, int(q.channel_dim))
    elif q.kind == "PerTokenDynamicQuant":
        if q.num_nonbatch_dims != 1:
            raise c.fail(f"{role} (value id {vid}): dynamic quantization over {q.num_nonbatch_dims} non-batch dims "
                         "is not supported (only 1: per row)", Error.NotSupported)
        p = QParams(q.kind, np.ones(1, _F32), 0)
    else:
        raise c.fail(f"{role} (value id {vid}): {q.kind} quantization is not supported", Error.NotSupported)
    # (a per-tensor scale: the decoded float, which is the float32's value)
    if p.kind == "PerChannelQuant" and not _finite_positive(p.scale, c.native) or (
            p.kind == "PerTensorQuant" and not 0.0 < q.scale[0] < math.inf):
        raise c.fail(f"{role} (value id {vid}): quantization scales must be finite and positive")
    cache[vid] = p
    return p


def _finite_positive(a: np.ndarray, native: Any = None) -> bool:
    """Whether every scale of ``a`` is positive and finite; ``native``: the compiled kernels,
    which check a C-contiguous float32 array in one pass."""
    if a.size <= 16:  # most: one scale (a loop over a list beats numpy's calls there)
        return all(0.0 < v < math.inf for v in a.tolist())
    if native is not None and a.dtype == _F32 and a.flags.c_contiguous:
        return bool(native.positive_finite_f32(a, a.size))
    return bool(a.min() > 0 and a.max() < math.inf)  # a NaN is the min and the max: False


def _int_range(dt: np.dtype) -> tuple[int, int]:
    """(min, max) of an integer dtype (np.iinfo costs more than the rest of a value's check)."""
    r = _INT_RANGES.get(dt)
    if r is None:
        info = np.iinfo(dt)
        r = (int(info.min), int(info.max))
    return r


def _is_quant(t: TensorInfo) -> bool:
    return t.value.datatype in _QUANT_DATATYPES


def _qd8_slots(c: Compiler, t: TensorInfo) -> tuple[int, int, int]:
    """(rows, step slot, zero-point slot) of a dynamically quantized value's per-row
    parameters (per-Method scratch)."""
    table: dict[int, tuple[int, int, int]] = c.__dict__.setdefault("_qd8", {})
    vid = t.value.id
    if vid not in table:
        if not t.shape:
            raise c.fail(f"dynamically quantized value id {vid} has no dims")
        rows = math.prod(t.shape[:-1])
        # Written by the Convert node, read by later nodes: ``fill`` pins the buffers (never
        # shared with other nodes' buffers by the workspace's lifetime-based placement).
        table[vid] = (rows, c.scratch((rows,), _F32, fill=1.0), c.scratch((rows,), np.int32, fill=0))
    return table[vid]


def _qs8(c: Compiler, t: TensorInfo, role: str) -> QParams:
    if t.value.datatype != QINT8:
        raise c.fail(f"{role} (value id {t.value.id}) is {t.value.datatype_name}; this node's int8 path needs qint8",
                     Error.NotSupported)
    return _qparams(c, t, role)


def _out_bounds(c: Compiler, node: XNode, p: QParams) -> tuple[int, int]:
    if node.output_min_max is None:
        return -128, 127
    lo, hi = node.output_min_max
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        raise c.fail(f"output_min_max ({lo}, {hi}) is not a valid range")
    return quantize_bound(lo, p.tensor_scale, p.zero_point), quantize_bound(hi, p.tensor_scale, p.zero_point)


# ------------------------------------------------------------------------------------------
# Node builders


def _weights(c: Compiler, w: TensorInfo, role: str, channel_dim: int) -> QParams:
    if w.value.datatype != QCINT8 or w.const is None:
        raise c.fail(f"{role} (value id {w.value.id}) is {w.value.datatype_name}"
                     f"{'' if w.const is not None else ' (not constant)'}; int8 nodes need constant qcint8 weights",
                     Error.NotSupported)
    p = _qparams(c, w, role)
    if p.channel_dim != channel_dim:
        raise c.fail(f"{role} (value id {w.value.id}) is quantized along dim {p.channel_dim}, expected {channel_dim}")
    return p


def _int_bias(c: Compiler, node: XNode, n: int) -> np.ndarray | None:
    bias = c.info(node.fields["bias_id"], "bias_id", optional=True)
    if bias is None:
        return None
    if bias.value.datatype not in (QINT32, QCINT32) or bias.const is None:
        raise c.fail(f"bias (value id {bias.value.id}) is {bias.value.datatype_name}; the int8 path needs a constant "
                     "qint32/qcint32 bias", Error.NotSupported)
    if math.prod(bias.shape) != n:
        raise c.fail(f"bias (value id {bias.value.id}) has {math.prod(bias.shape)} elements, expected {n}")
    return c.prepacked(bias.const.reshape(n).astype(_F64))


def _float_bias(c: Compiler, node: XNode, n: int) -> np.ndarray | None:
    bias = c.info(node.fields["bias_id"], "bias_id", optional=True)
    if bias is None:
        return None
    c.check_dtype(bias, "bias_id")
    if bias.const is None or math.prod(bias.shape) != n:
        raise c.fail(f"bias (value id {bias.value.id}) must be a constant of {n} float32 elements")
    return c.prepacked(bias.const.reshape(n).astype(_F64))


def _requant_step(c: Compiler, node: XNode, x: QParams, w: QParams, out: TensorInfo, acc_slot: int,
                  bias: np.ndarray | None, rows: int, n: int, k: int) -> Step:
    """Adds the int32 bias (float64) to the exact accumulators in ``acc_slot`` (``k``-long
    dot products) and requantizes them into ``out`` (qint8)."""
    op = _qs8(c, out, "output_id")
    scale = _requant_scale(c, x.tensor_scale, w.scale, op.tensor_scale)
    lo, hi = _out_bounds(c, node, op)
    zp, o = op.zero_point, out.slot
    lo_f, hi_f = np.float32(lo - zp), np.float32(hi - zp)
    in_place = exact_dtype(k) == _F32  # the accumulators are float32: requantize them in place
    if bias is not None and in_place:
        # float32 sums stay exact while |acc| + |bias| < 2**24; otherwise add in float64.
        in_place = float(np.abs(bias).max(initial=0)) + k * 255 * 128 < (1 << 24)
        if in_place:
            bias = c.prepacked(bias.astype(_F32))

    def step(b: list[Any]) -> None:
        acc = b[acc_slot]
        # (float) of the int32 accumulator plus bias, rounded once to float32.
        if in_place:
            v = acc
            if bias is not None:
                np.add(v, bias, out=v)
        else:
            v = (acc + bias).astype(_F32) if bias is not None else acc.astype(_F32)
        np.multiply(v, scale, out=v)
        np.clip(v, lo_f, hi_f, out=v)
        np.rint(v, out=v)
        v += np.float32(zp)
        np.copyto(b[o].reshape(rows, n), v, casting="unsafe")

    return step


# The compiled kernels' int8 path: the integer products run as float32 products of centred
# values (x - zero point, |x - zp| <= 255, |w| <= 128), exact while every partial sum stays
# below 2**24, i.e. for dot products of at most _EXACT_K terms; longer ones are split into
# parts of at most that many, each summed exactly, and requant_qs8 adds the parts (and the
# int32 bias) exactly before XNNPACK's requantization. Bit-equal to the numpy path above.
_EXACT_K = ((1 << 24) - 1) // (255 * 128)


def _split_k(k: int) -> tuple[int, int]:
    """(parts, part length) for a ``k``-long dot product."""
    parts = -(-k // _EXACT_K)
    return parts, -(-k // parts)


def _requant_args(c: Compiler, node: XNode, x: QParams, w: QParams, out: TensorInfo, bias: np.ndarray | None
                  ) -> tuple[np.ndarray | None, np.ndarray, float, float, int]:
    """The compiled requantization's (int32 bias, per-channel scale, lo - zp, hi - zp, zp)."""
    op = _qs8(c, out, "output_id")
    scale = _requant_scale(c, x.tensor_scale, w.scale, op.tensor_scale)
    lo, hi = _out_bounds(c, node, op)
    zp = op.zero_point
    b32 = None if bias is None else c.prepacked(bias.astype(np.int32))
    return b32, scale, float(lo - zp), float(hi - zp), zp


def _native_requant(c: Compiler, node: XNode, x: QParams, w: QParams, out: TensorInfo, acc: int,
                    bias: np.ndarray | None, parts: int, rows: int, n: int) -> Step:
    """requant_qs8 of the float32 accumulators in ``acc`` ((parts, rows, n)) into ``out``."""
    b32, scale, lo_f, hi_f, zp = _requant_args(c, node, x, w, out, bias)
    rq, o = c.native.requant_qs8, out.slot
    return lambda b: rq(b[acc], b32, scale, b[o], parts, rows, n, lo_f, hi_f, zp)


def _native_rows_product(c: Compiler, gx: Callable[[list[Any]], Any], zx: int, w_nk: np.ndarray, rows: int,
                         k: int, n: int) -> tuple[int, list[Step]]:
    """Steps computing the exact products of the centred rows ``gx(b)`` ((rows, k) int8)
    with the int8 filter ``w_nk`` ((n, k): out-channel rows) into float32 accumulators
    (parts, rows, n); returns (accumulator slot, steps)."""
    parts, kp = _split_k(k)
    xf = c.scratch((parts, rows, kp), _F32, fill=0.0 if parts * kp != k else None)  # a short last part: 0-padded
    wf = np.zeros((parts, n, kp), _F32)
    for p in range(parts):
        wf[p, :, :min(k, (p + 1) * kp) - p * kp] = w_nk[:, p * kp:(p + 1) * kp]
    wf = c.prepacked(wf)
    acc = c.scratch((parts, rows, n), _F32)
    lin = c.native.linear_f32
    spans = tuple((p, p * kp, min(k, (p + 1) * kp)) for p in range(parts))

    def product(b: list[Any]) -> None:
        x2, xb, ab = gx(b).reshape(rows, k), b[xf], b[acc]
        for p, s0, s1 in spans:
            np.subtract(x2[:, s0:s1], zx, out=xb[p, :, :s1 - s0], dtype=_F32)
            lin(xb[p], wf[p], None, ab[p], 1, rows, kp, n, False, 0, True)

    return acc, [product]


# Products of fewer rows than this (classifiers, squeeze-excite's 1x1 convolutions on a 1x1
# map) take qs8_rows_dot: int32 sums over the int8 filter read in place, requantized in the
# same pass (1 x 1024 x 1000: 52 us with the filter out of cache, against ~360 us for the
# float32 path, whose filter copy is 4 MB; even at 8 rows, slower from there on).
_FEW_ROWS = 8
_QDOT_MAX_K = 1 << 16  # qs8_rows_dot's bound: no int32 sum can overflow


def _native_linear(c: Compiler, node: XNode, gx: Callable[[list[Any]], Any], xp: QParams, wp: QParams,
                   w_nk: np.ndarray, out: TensorInfo, bias: np.ndarray | None, rows: int, k: int,
                   n: int) -> list[Step]:
    """out (rows, n) int8 = requantized (x (rows, k) int8 - zero point) @ w_nk (n, k).T + bias."""
    if rows < _FEW_ROWS and k <= _QDOT_MAX_K:
        b32, scale, lo_f, hi_f, zp = _requant_args(c, node, xp, wp, out, bias)
        w8 = np.ascontiguousarray(w_nk)  # as stored for (out, in) filters: no copy
        if w8 is not w_nk:
            w8 = c.prepacked(w8)
        qd, zx, o = c.native.qs8_rows_dot, xp.zero_point, out.slot
        return [lambda b: qd(gx(b), zx, w8, b32, scale, b[o], rows, k, n, lo_f, hi_f, zp)]
    if _gemm_fits(c, k, bias):
        return _native_gemm(c, node, gx, xp, wp, w_nk, out, bias, rows, k, n)
    acc, steps = _native_rows_product(c, gx, xp.zero_point, w_nk, rows, k, n)
    return [*steps, _native_requant(c, node, xp, wp, out, acc, bias, _split_k(k)[0], rows, n)]


# Many-row int8 products on a CPU with AVX-512 VNNI take qs8_gemm: int32 sums of the int8 values
# as they are (x + 128 as uint8 times the filter, the zero point and the 128 subtracted through a
# per-channel correction folded with the bias), so the same exact sums as above with a quarter of
# the bytes and no centring pass; exact where every sum, bias included, fits int32.
_GEMM_SUM_BOUND = 255 * 128  # the largest |(x - zx) * w| of one term


def _sums_fit(k: int, bias: np.ndarray | None) -> bool:
    """Whether every sum of ``k`` terms (x - zx) * w plus the bias stays inside int32."""
    top = 0.0 if bias is None or not bias.size else float(np.abs(bias).max())  # (float64 holds int32 exactly)
    return _GEMM_SUM_BOUND * k + top < 1 << 31


def _gemm_fits(c: Compiler, k: int, bias: np.ndarray | None) -> bool:
    """Whether qs8_gemm / qs8_conv take a product of ``k``-long dot products: AVX-512 VNNI (or
    AVX2's int16 pair products, 20 % faster than the float32 path's three passes on MobileNetV3's
    convolutions), and every sum, the bias included, inside int32."""
    fast = c.native.QS8_GEMM_VNNI or c.native.QS8_GEMM_AVX2
    return bool(fast) and k <= _QDOT_MAX_K and _sums_fit(k, bias)


def _native_gemm(c: Compiler, node: XNode, gx: Callable[[list[Any]], Any], xp: QParams, wp: QParams,
                 w_nk: np.ndarray, out: TensorInfo, bias: np.ndarray | None, rows: int, k: int, n: int,
                 conv: tuple[int, ...] | None = None, groups: tuple[int, int] | None = None) -> list[Step]:
    """out (rows, n) int8 = requantized (x (rows, k) int8 - zero point) @ w_nk (n, k).T + bias, by
    qs8_gemm; with ``conv`` (N, H, W, C, kh, kw, sh, sw, pt, pl, dh, dw, Ho, Wo) x is the NHWC input
    of a convolution of one group whose patches are the rows, by qs8_conv; with ``groups`` too
    ((groups, output channels per group); k then a group's patch) a grouped one, by qs8_gconv."""
    b32, scale, lo_f, hi_f, zp = _requant_args(c, node, xp, wp, out, bias)
    # The filter as the kernel reads it ((ceil(n / 16), ceil(k / 4), 16, 4), 0-padded) and the per-channel
    # correction b32 - (128 + zx) * the row's sum, int32 modulo 2^32 as the kernel's sums are (the whole sum
    # fits int32: checked by the caller), both in one pass over the filter.
    wq, corr32 = np.empty((-(-n // 16), -(-k // 4), 16, 4), _I8), np.empty(n, np.int32)
    c.native.qs8_pack_gemm(np.ascontiguousarray(w_nk), n, k, b32, -(128 + xp.zero_point), wq, corr32)
    corr32, wq = c.prepacked(corr32), c.prepacked(wq)
    row = k if conv is None or groups is None else conv[3] * conv[4] * conv[5]  # a grouped row: every group's patch
    xu = c.scratch((rows * 4 * -(-row // 4) * c.native.QS8_GEMM_XU_BYTES,), np.dtype(np.uint8))
    o = out.slot
    if groups is not None:
        qg, zx = c.native.qs8_gconv, xp.zero_point
        return [lambda b: qg(gx(b), b[xu], wq, corr32, scale, b[o], *conv, *groups, zx, lo_f, hi_f, zp)]
    if conv is not None:
        qconv, zx = c.native.qs8_conv, xp.zero_point
        return [lambda b: qconv(gx(b), b[xu], wq, corr32, scale, b[o], *conv, n, zx, lo_f, hi_f, zp)]
    gemm = c.native.qs8_gemm
    return [lambda b: gemm(gx(b), b[xu], wq, corr32, scale, b[o], rows, k, n, lo_f, hi_f, zp)]


def _build_fully_connected(c: Compiler, node: XNode) -> list[Step]:
    f = node.fields
    x = c.tensor(f["input1_id"], "input1_id")
    w = c.tensor(f["filter_id"], "filter_id")
    out = c.output(f["output_id"])
    if len(w.shape) != 2:
        raise c.fail(f"filter (value id {w.value.id}) has dims {list(w.shape)}, expected 2")
    transposed = bool(f["flags"] & _nodes.FLAG_TRANSPOSE_WEIGHTS)
    k, n = (w.shape[0], w.shape[1]) if transposed else (w.shape[1], w.shape[0])
    wp = _weights(c, w, "filter_id", 1 if transposed else 0)
    if not x.shape or k == 0 or math.prod(x.shape) % k:
        raise c.fail(f"input dims {list(x.shape)} do not hold whole rows of {k} input channels")
    rows = math.prod(x.shape) // k
    if math.prod(out.shape) != rows * n:
        raise c.fail(f"output (value id {out.value.id}) dims {list(out.shape)} do not hold {rows} rows of {n} outputs")
    dt = exact_dtype(k)
    gx = c.getter(x)
    if x.value.datatype != QDINT8 and c.native is not None:
        xp = _qs8(c, x, "input1_id")
        bias = _int_bias(c, node, n)
        return _native_linear(c, node, gx, xp, wp, w.const.T if transposed else w.const, out, bias, rows, k, n)
    wk = c.prepacked(np.ascontiguousarray((w.const if transposed else w.const.T).astype(dt)))
    acc = c.scratch((rows, n), dt)
    if x.value.datatype == QDINT8:
        if out.dtype != _F32:
            raise c.fail(f"output (value id {out.value.id}) of a dynamically quantized FC is {out.value.datatype_name}; "
                         "expected fp32", Error.NotSupported)
        xr, step_slot, zp_slot = _qd8_slots(c, x)
        if xr != rows:
            raise c.fail(f"input (value id {x.value.id}) has {xr} quantization rows, the node computes {rows}")
        fscale = c.prepacked(wp.scale.astype(_F64))
        bias = _float_bias(c, node, n)
        o = out.slot

        def qd8_fc(b: list[Any]) -> None:
            xc = np.subtract(gx(b).reshape(rows, k), b[zp_slot][:, None], dtype=np.int32)
            a = np.matmul(xc.astype(dt), wk, out=b[acc])
            t = np.multiply(a.astype(_F32), b[step_slot][:, None], dtype=_F32)
            # XNNPACK: fma(t, filter_scale, bias) in float32 (float64 then rounded once).
            r = t.astype(_F64) * fscale
            if bias is not None:
                r += bias
            np.copyto(b[o].reshape(rows, n), r, casting="same_kind")

        return [qd8_fc, *_nodes._clamp_steps(c, node, out)]
    xp = _qs8(c, x, "input1_id")
    bias = _int_bias(c, node, n)
    zx = xp.zero_point

    def qs8_fc(b: list[Any]) -> None:
        xc = np.subtract(gx(b).reshape(rows, k), zx, dtype=np.int16)
        np.matmul(xc.astype(dt), wk, out=b[acc])

    return [qs8_fc, _requant_step(c, node, xp, wp, out, acc, bias, rows, n, k)]


def _native_conv(c: Compiler, node: XNode, x: TensorInfo, xp: QParams, w: TensorInfo, wp: QParams,
                 out: TensorInfo, depthwise: bool, geo: tuple[int, ...]) -> list[Step] | None:
    """The int8 (depthwise) convolution on the compiled kernels, or None where they do not
    take it (the numpy path then runs): depthwise with one output per channel, 1x1 and
    im2col convolutions (any dot-product length), direct channels-last convolutions of
    groups (and of the narrow RGB stem) with dot products of at most _EXACT_K terms."""
    n, h, wd, ch, cout, oh, ow, pt, pr, pb, pl, kh, kw, sh, sw, dh, dw, groups, gic, goc = geo
    rows, kk = n * oh * ow, kh * kw * gic
    if (goc != 1 or kh * kw > _EXACT_K) if depthwise else (groups > 1 and kk > _EXACT_K):
        return None
    gx, zx = c.getter(x), xp.zero_point
    bias = _int_bias(c, node, cout)
    inf = math.inf

    def centred() -> tuple[int, Step]:  # x - zero point in float32: the convolution's padding is then 0
        xf = c.scratch((n, h, wd, ch), _F32)
        return xf, (lambda b: np.subtract(gx(b), zx, out=b[xf], dtype=_F32))

    conv = (n, h, wd, ch, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow)  # the int8 kernels' geometry
    one_pass = c.native.DWCONV_QS8_AVX512 or (c.native.DWCONV_QS8_AVX2 and ch % 8 == 0)
    if depthwise and one_pass and _sums_fit(kh * kw, bias):
        # int8 to int8 in one pass (AVX-512, or AVX2 over channels in 8s; the float32 passes below are
        # faster than its plain copy)
        b32, scale, lo_f, hi_f, zp = _requant_args(c, node, xp, wp, out, bias)
        wt = c.prepacked(w.const.reshape(kh, kw, cout).astype(_F32))
        dq, o = c.native.dwconv_qs8, out.slot
        return [lambda b: dq(gx(b), wt, b32, scale, b[o], *conv, zx, lo_f, hi_f, zp)]
    if depthwise:
        xf, centre = centred()
        wt = c.prepacked(w.const.reshape(kh, kw, cout).astype(_F32))
        acc = c.scratch((rows, cout), _F32)
        dwc, dgeo = c.native.dwconv_nhwc_f32, (n, h, wd, ch, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, -inf, inf, 0)
        return [centre, lambda b: dwc(b[xf], wt, None, b[acc], *dgeo),
                _native_requant(c, node, xp, wp, out, acc, bias, 1, rows, cout)]
    if kh == kw == 1 and sh == sw == 1 and not (pt or pr or pb or pl) and groups == 1:
        return _native_linear(c, node, gx, xp, wp, w.const.reshape(cout, ch), out, bias, rows, ch, cout)
    if groups == 1 and rows >= _FEW_ROWS and _gemm_fits(c, kk, bias):  # the patches gathered in the kernel
        return _native_gemm(c, node, gx, xp, wp, w.const.reshape(cout, kk), out, bias, rows, kk, cout, conv=conv)
    if (groups > 1 and gic % 4 == 0 and (goc == 8 or goc % 16 == 0) and rows >= _FEW_ROWS
            and kh * kw * ch <= _QDOT_MAX_K and _gemm_fits(c, kk, bias)):  # each group's patch in the kernel
        return _native_gemm(c, node, gx, xp, wp, w.const.reshape(cout, kk), out, bias, rows, kk, cout, conv=conv,
                            groups=(groups, goc))
    if kk <= _EXACT_K and (groups > 1 or gic <= _nodes._DIRECT_MAX_INPUT_CHANNELS):
        xf, centre = centred()
        wg = c.prepacked(np.ascontiguousarray(
            w.const.reshape(groups, goc, kh, kw, gic).transpose(0, 2, 3, 4, 1).astype(_F32)))
        acc = c.scratch((rows, cout), _F32)
        gconv, ggeo = c.native.gconv_nhwc_f32, (n, h, wd, groups, gic, goc, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow,
                                                 -inf, inf, 0)
        return [centre, lambda b: gconv(b[xf], wg, None, b[acc], *ggeo),
                _native_requant(c, node, xp, wp, out, acc, bias, 1, rows, cout)]
    # im2col on the int8 values (groups == 1 here): padded with the zero point (0 once centred), the patches
    # gathered, then the rows' product as for a 1x1 convolution
    hp, wpd = h + pt + pb, wd + pl + pr
    pad = c.scratch((n, hp, wpd, ch), _I8, fill=float(zx))
    cols = c.scratch((rows, kk), _I8)
    st = (hp * wpd * ch, sh * wpd * ch, sw * ch, dh * wpd * ch, dw * ch, 1)
    inner = (slice(None), slice(pt, pt + h), slice(pl, pl + wd))

    def gather(b: list[Any]) -> None:
        src = b[pad]
        np.copyto(src[inner], gx(b))
        np.copyto(b[cols].reshape(n, oh, ow, kh, kw, ch), _nodes._nd(src, (n, oh, ow, kh, kw, ch), st))

    return [gather, *_native_linear(c, node, lambda b: b[cols], xp, wp, w.const.reshape(cout, kk), out, bias, rows,
                                    kk, cout)]


def _build_conv2d(c: Compiler, node: XNode) -> list[Step]:
    f = node.fields
    pt, pr, pb, pl, kh, kw, sh, sw, dh, dw, groups, gic, goc = _nodes._conv_fields(node)
    _nodes._check_size(c, pt, pr, pb, pl, kh, kw, sh, sw, dh, dw)
    x = c.tensor(f["input1_id"], "input1_id")
    w = c.tensor(f["filter_id"], "filter_id")
    out = c.output(f["output_id"])
    xp = _qs8(c, x, "input1_id")
    n, h, wd, ch = _nodes._conv_geometry(c, node, x)
    depthwise = node.type == "XNNDepthwiseConv2d"
    cout = _nodes._conv_channels(c, w, depthwise, ch, groups, gic, goc, kh, kw)
    wp = _weights(c, w, "filter_id", 3 if depthwise else 0)
    oh = _nodes._out_size(c, h, pt + pb, kh, sh, dh, "height")
    ow = _nodes._out_size(c, wd, pl + pr, kw, sw, dw, "width")
    c.check_shape(out, (n, oh, ow, cout))
    rows = n * oh * ow
    if c.native is not None:
        steps_n = _native_conv(c, node, x, xp, w, wp, out, depthwise,
                               (n, h, wd, ch, cout, oh, ow, pt, pr, pb, pl, kh, kw, sh, sw, dh, dw, groups, gic, goc))
        if steps_n is not None:
            return steps_n
    # Centred input (x - zero point) in float64; the padding is the zero point, i.e. 0 here.
    hp, wp_ = h + pt + pb, wd + pl + pr
    dt = exact_dtype(kh * kw * gic)
    pad = c.scratch((n, hp, wp_, ch), dt, fill=0.0)
    gx, zx = c.getter(x), xp.zero_point
    inner = (slice(None), slice(pt, pt + h), slice(pl, pl + wd))
    steps: list[Step] = [lambda b: np.subtract(gx(b), zx, out=b[pad][inner], dtype=dt)]
    acc = c.scratch((rows, cout), dt)
    taps = _nodes._taps(c, kh, kw, dh, dw, sh, sw, oh, ow)
    if depthwise:
        wts = [c.prepacked(np.ascontiguousarray(w.const[0, i, j].astype(dt))) for i, j, _ in taps]
        tmp = c.scratch((n, oh, ow, cout), dt)

        def dw_step(b: list[Any]) -> None:
            src = b[pad]
            if goc > 1:
                src = np.repeat(src, goc, axis=3)
            r = b[acc].reshape(n, oh, ow, cout)
            t = b[tmp]
            first = True
            for (_, _, sl), wt in zip(taps, wts):
                if first:
                    np.multiply(src[sl], wt, out=r)
                    first = False
                else:
                    np.multiply(src[sl], wt, out=t)
                    r += t

        steps.append(dw_step)
    else:
        kk = kh * kw * gic
        it = dt.itemsize
        st = (hp * wp_ * ch * it, sh * wp_ * ch * it, sw * ch * it, dh * wp_ * ch * it, dw * ch * it, it)
        cols = c.scratch((n, oh, ow, kh, kw, gic), dt)
        wks = tuple(c.prepacked(np.ascontiguousarray(w.const[g * goc:(g + 1) * goc].reshape(goc, kk).T.astype(dt)))
                    for g in range(groups))

        def conv(b: list[Any]) -> None:
            src, cb, ab = b[pad], b[cols], b[acc]
            for g, wk in enumerate(wks):
                np.copyto(cb, _nodes._nd(src, (n, oh, ow, kh, kw, gic), st, g * gic * it))
                if groups == 1:
                    np.matmul(cb.reshape(rows, kk), wk, out=ab)
                else:
                    ab[:, g * goc:(g + 1) * goc] = cb.reshape(rows, kk) @ wk

        steps.append(conv)
    bias = _int_bias(c, node, cout)
    steps.append(_requant_step(c, node, xp, wp, out, acc, bias, rows, cout, kh * kw * gic))
    return steps


def _to_q8_args(c: Compiler, out: TensorInfo) -> tuple[float, float, float, int]:
    """A float32 -> 8-bit Convert's (1 / scale, lo - zp, hi - zp, zp), float32 values as floats."""
    p = _qparams(c, out, "output_id")
    qmin, qmax = _int_range(out.dtype)
    return _f32(1.0 / _f32(p.tensor_scale)), float(qmin - p.zero_point), float(qmax - p.zero_point), p.zero_point


def _build_convert(c: Compiler, node: XNode) -> list[Step]:
    x = c.tensor(node.fields["input_id"], "input_id")
    out = c.output(node.fields["output_id"])
    c.check_shape(out, x.shape)
    gx, o = c.getter(x), out.slot
    if x.dtype == _F32 and out.value.datatype == QDINT8:
        rows, step_slot, zp_slot = _qd8_slots(c, out)
        k = out.shape[-1]

        def to_qd8(b: list[Any]) -> None:
            q, step, zp = quantize_rows(gx(b).reshape(rows, k))
            b[o].reshape(rows, k)[...] = q
            b[step_slot][...] = step
            b[zp_slot][...] = zp

        return [to_qd8]
    if x.dtype == _F32 and out.value.datatype in (QINT8, QUINT8):
        inv_f, lo_f, hi_f, zp_i = _to_q8_args(c, out)
        if c.native is not None and out.value.datatype == QINT8:
            qz, size = c.native.quantize_qs8, math.prod(out.shape)
            return [lambda b: qz(gx(b), b[o], size, inv_f, lo_f, hi_f, zp_i)]
        inv, zp, lo, hi = np.float32(inv_f), np.float32(zp_i), np.float32(lo_f), np.float32(hi_f)
        tmp = c.scratch(out.shape, _F32)

        def to_q(b: list[Any]) -> None:  # quantize(), in place in a float32 scratch
            v = b[tmp]
            np.multiply(gx(b), inv, out=v)
            np.clip(v, lo, hi, out=v)
            np.rint(v, out=v)
            v += zp
            np.copyto(b[o], v, casting="unsafe")

        return [to_q]
    if x.value.datatype in (QINT8, QUINT8) and out.dtype == _F32:
        p = _qparams(c, x, "input_id")
        scale, zp = p.tensor_scale, p.zero_point
        if c.native is not None and x.value.datatype == QINT8:
            dq, size = c.native.dequantize_qs8, math.prod(out.shape)
            return [lambda b: dq(gx(b), b[o], size, zp, scale), *_nodes._clamp_steps(c, node, out)]
        return [lambda b: np.copyto(b[o], dequantize(gx(b), scale, zp)), *_nodes._clamp_steps(c, node, out)]
    raise c.fail(f"converting {x.value.datatype_name} to {out.value.datatype_name} is not supported",
                 Error.NotSupported)


def _build_add(c: Compiler, node: XNode) -> list[Step]:
    f = node.fields
    a, bb = c.tensor(f["input1_id"], "input1_id"), c.tensor(f["input2_id"], "input2_id")
    out = c.output(f["output_id"])
    ap, bp, op = _qs8(c, a, "input1_id"), _qs8(c, bb, "input2_id"), _qs8(c, out, "output_id")
    c.check_shape(out, _nodes._broadcast(c, a, bb))
    try:
        params = add_params(ap.tensor_scale, ap.zero_point, bp.tensor_scale, bp.zero_point, op.tensor_scale)
    except ValueError as exc:
        raise c.fail(str(exc), Error.NotSupported) from None
    lo, hi = _out_bounds(c, node, op)
    ga, gb, o, zp = c.getter(a), c.getter(bb), out.slot, op.zero_point
    if c.native is not None and a.shape == bb.shape:  # a residual connection: one compiled pass
        add, args = c.native.add_qs8, (math.prod(a.shape), params.a_multiplier, params.b_multiplier, params.bias,
                                       params.shift, zp, lo, hi)
        return [lambda b: add(ga(b), gb(b), b[o], *args)]
    return [lambda b: qs8_add(ga(b), gb(b), params, zp, lo, hi, out=b[o])]


def _build_max_pool(c: Compiler, node: XNode) -> list[Step]:
    f = node.fields
    pt, pr, pb, pl = f["padding_top"], f["padding_right"], f["padding_bottom"], f["padding_left"]
    kh, kw, sh, sw = f["pooling_height"], f["pooling_width"], f["stride_height"], f["stride_width"]
    dh, dw = f["dilation_height"] or 1, f["dilation_width"] or 1
    _nodes._check_size(c, pt, pr, pb, pl, kh, kw, sh, sw, dh, dw)
    x = c.tensor(f["input_id"], "input_id")
    out = c.output(f["output_id"])
    xp, op = _qs8(c, x, "input_id"), _qs8(c, out, "output_id")
    if xp.tensor_scale != op.tensor_scale or xp.zero_point != op.zero_point:
        raise c.fail("int8 max pooling needs the same scale and zero point in and out", Error.NotSupported)
    n, h, wd, ch = _nodes._conv_geometry(c, node, x, "input_id")
    oh = _nodes._out_size(c, h, pt + pb, kh, sh, dh, "height")
    ow = _nodes._out_size(c, wd, pl + pr, kw, sw, dw, "width")
    c.check_shape(out, (n, oh, ow, ch))
    ps, steps, _ = _nodes._padder(c, x, pt, pb, pl, pr, -128)
    taps = [sl for _, _, sl in _nodes._taps(c, kh, kw, dh, dw, sh, sw, oh, ow)]
    lo, hi = _out_bounds(c, node, op)
    const_x, o = x.const, out.slot

    def pool(b: list[Any]) -> None:
        src, r = (const_x if ps < 0 else b[ps]), b[o]
        # (the padded copy is float32: exact for int8 values)
        np.copyto(r, src[taps[0]], casting="unsafe")
        for sl in taps[1:]:
            np.maximum(r, src[sl], out=r, casting="unsafe")
        if lo > -128 or hi < 127:
            np.clip(r, lo, hi, out=r)

    steps.append(pool)
    return steps


def _build_clamp(c: Compiler, node: XNode) -> list[Step]:
    x = c.tensor(node.fields["input_id"], "input_id")
    out = c.output(node.fields["output_id"])
    xp, op = _qs8(c, x, "input_id"), _qs8(c, out, "output_id")
    if xp.tensor_scale != op.tensor_scale or xp.zero_point != op.zero_point:
        raise c.fail("int8 clamp needs the same scale and zero point in and out", Error.NotSupported)
    c.check_shape(out, x.shape)
    lo, hi = _out_bounds(c, node, op)
    gx, o = c.getter(x), out.slot
    return [lambda b: np.clip(gx(b), lo, hi, out=b[o])]


def _mul_layout(shape: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]
                ) -> tuple[bool, int, int, int, int] | None:
    """mul_qs8's view of a Multiply to ``shape``: (swap the operands, N, P, C, bP) when both
    operands have ``shape`` or one of them has it and the other one value per image and
    channel (N, 1, ..., 1, C); None for other broadcasts."""
    if len(shape) < 2:
        return (False, 1, 1, shape[0], 1) if shape and a == b == shape else None
    n, ch = shape[0], shape[-1]
    p = math.prod(shape[1:-1])
    if a == b == shape:
        return False, n, p, ch, p
    gate = (n,) + (1,) * (len(shape) - 2) + (ch,)
    for swap, full, other in ((False, a, b), (True, b, a)):
        if full == shape and (1,) * (len(shape) - len(other)) + tuple(other) == gate:
            return swap, n, p, ch, 1
    return None


def _build_multiply(c: Compiler, node: XNode) -> list[Step]:
    f = node.fields
    a, bb = c.tensor(f["input1_id"], "input1_id"), c.tensor(f["input2_id"], "input2_id")
    out = c.output(f["output_id"])
    ap, bp, op = _qs8(c, a, "input1_id"), _qs8(c, bb, "input2_id"), _qs8(c, out, "output_id")
    shape = _nodes._broadcast(c, a, bb)
    c.check_shape(out, shape)
    # xnn_init_qs8_mul_minmax_scalar_params: (a_scale * b_scale) / out_scale in float32.
    scale = (np.float32(ap.tensor_scale) * np.float32(bp.tensor_scale)) / np.float32(op.tensor_scale)
    lo, hi = _out_bounds(c, node, op)
    ga, gb, o = c.getter(a), c.getter(bb), out.slot
    za, zb = ap.zero_point, bp.zero_point
    zp = op.zero_point
    if c.native is not None:
        if math.prod(shape) == 0:
            return []
        fused = _mul_layout(shape, a.shape, bb.shape)
        if fused is not None:  # same shapes, or one value per image and channel: one compiled pass
            swap, n, p, ch, bp = fused
            (g1, z1), (g2, z2) = ((gb, zb), (ga, za)) if swap else ((ga, za), (gb, zb))
            mq, lo_f, hi_f, sc = c.native.mul_qs8, float(lo - zp), float(hi - zp), float(scale)
            return [lambda b: mq(g1(b), z1, g2(b), z2, b[o], n, p, ch, bp, sc, lo_f, hi_f, zp)]
        # centred operands in float32 (|a - za|, |b - zb| <= 255: every product exact), their
        # broadcast product, then requant_qs8 with the one scale
        fa, fb, acc = c.scratch(a.shape, _F32), c.scratch(bb.shape, _F32), c.scratch(shape, _F32)
        last = shape[-1] if shape else 1
        rows, scales = math.prod(shape) // last, c.prepacked(np.full(last, scale, _F32))
        rq, lo_f, hi_f = c.native.requant_qs8, float(lo - zp), float(hi - zp)

        def mul_native(b: list[Any]) -> None:
            x1, x2, ab = b[fa], b[fb], b[acc]
            np.subtract(ga(b), za, out=x1, dtype=_F32)
            np.subtract(gb(b), zb, out=x2, dtype=_F32)
            np.multiply(x1, x2, out=ab)
            rq(ab, None, scales, b[o], 1, rows, last, lo_f, hi_f, zp)

        return [mul_native]

    def mul(b: list[Any]) -> None:
        acc = np.multiply(np.subtract(ga(b), za, dtype=np.int32), np.subtract(gb(b), zb, dtype=np.int32))
        np.copyto(b[o], requantize(acc, scale, zp, lo, hi).reshape(shape))

    return [mul]


def _build_global_avg(c: Compiler, node: XNode) -> list[Step]:
    x = c.tensor(node.fields["input_id"], "input_id")
    out = c.output(node.fields["output_id"])
    xp, op = _qs8(c, x, "input_id"), _qs8(c, out, "output_id")
    if len(x.shape) < 3:
        raise c.fail(f"input (value id {x.value.id}) has dims {list(x.shape)}, expected N..C with a spatial dim")
    n, ch = x.shape[0], x.shape[-1]
    area = math.prod(x.shape[1:-1])
    if math.prod(out.shape) != n * ch:
        raise c.fail(f"output dims {list(out.shape)} are not [{n}, ..., {ch}]")
    if area == 0:
        raise c.fail("the input has no spatial elements")
    # XNNPACK's qs8 mean: an int32 sum of the raw values, then an int32 -> qs8 convert with
    # scale (in/out) * (1/N) and the zero point folded in as a float.
    s = np.float32(np.float32(xp.tensor_scale) / np.float32(op.tensor_scale)) * (np.float32(1) / np.float32(area))
    yzp = np.float32(op.zero_point) - np.float32(np.float32(area * xp.zero_point) * s)
    lo, hi = _out_bounds(c, node, op)
    gx, o = c.getter(x), out.slot
    if c.native is not None and area <= 1 << 24:
        gap, args = c.native.gap_qs8, (n, area, ch, float(s), float(yzp), float(lo), float(hi))
        return [lambda b: gap(gx(b), b[o], *args)]

    def mean(b: list[Any]) -> None:
        total = gx(b).reshape(n, area, ch).sum(axis=1, dtype=np.int32)
        v = np.multiply(total.astype(_F32), s, dtype=_F32) + yzp
        v = np.clip(np.rint(v), lo, hi)
        np.copyto(b[o].reshape(n, ch), v, casting="unsafe")

    return [mean]


def _dispatch(name: str, quant_builder: Callable[[Compiler, XNode], list[Step]]) -> None:
    """Wraps the float builder of ``name``: nodes touching a quantized value take ``quant_builder``."""
    float_builder = NODE_BUILDERS[name]
    ids = ("input_id", "input1_id", "input2_id", "output_id")

    def builder(c: Compiler, node: XNode) -> list[Step]:
        for key in ids:
            vid = node.fields.get(key)
            if vid is not None:
                t = c.infos.get(vid)
                if t is not None and _is_quant(t):
                    return quant_builder(c, node)
        return float_builder(c, node)

    register_node(name, builder)


def _lookup_table(c: Compiler, chain: tuple[int, ...]) -> np.ndarray:
    """The 256-byte table of a float island (Compiler._plan_lookup): entry u is the island's
    output byte for the input byte u. Made, for all the graph's islands at once, by
    :func:`_lookup_tables` at the first island's lookup step."""
    tables: dict[tuple[int, ...], np.ndarray] = c.__dict__.setdefault("_lookup_tables", {})
    if not tables:
        tables.update(_lookup_tables(c, c.lookup_chains()))
    return tables[chain]


def _lookup_tables(c: Compiler, chains: Sequence[tuple[int, ...]]) -> dict[tuple[int, ...], np.ndarray]:
    """The tables of ``chains``: the islands' nodes compiled as graphs of their own over a
    256-element input per island holding every byte value, and run.

    Islands whose float nodes are the same (types, fields, constants: a network's SiLUs, say)
    are one family: their float nodes run once over every member's 256 dequantized values
    (``dequantize_qs8`` with the member's first Convert's parameters, as that Convert's step
    runs it), then each member's results are quantized with its last Convert's (``quantize_qs8``,
    as that step runs it). The other islands (and all where the compiled kernels are absent):
    those that share no value but constants are one graph (the per-graph work of a compile,
    paid once, was most of a table's cost: 65 islands in int8 EfficientNet); each node's steps
    are those of the separate island's graph (the same builders; an island's values are its
    own)."""
    families: dict[Any, list[tuple[int, ...]]] = {}
    rest: list[tuple[int, ...]] = []
    for chain in chains:
        key = _island_key(c, chain)
        if key is None:
            rest.append(chain)
        else:
            families.setdefault(key, []).append(chain)
    tables: dict[tuple[int, ...], np.ndarray] = {}
    for fam in families.values():
        if len(fam) == 1:
            rest.extend(fam)
        else:
            tables.update(_family_tables(c, fam))
    if rest:
        tables.update(_batched_tables(c, rest))
    return tables


def _island_key(c: Compiler, chain: tuple[int, ...]) -> Any:
    """What makes islands one family (see _lookup_tables): their float nodes' types, fused
    bounds and fields, value ids numbered in order of use, constants by dtype, dims and bytes;
    None for an island that runs in a batch: no float nodes, 8-bit values that are not qint8,
    a clamp on the first Convert, or no compiled kernels."""
    g = c.graph
    first, last = g.nodes[chain[0]], g.nodes[chain[-1]]
    if (c.native is None or len(chain) < 3 or first.output_min_max is not None
            or c.values[first.fields["input_id"]].datatype != QINT8
            or c.values[last.fields["output_id"]].datatype != QINT8):
        return None
    canon = {first.fields["output_id"]: 0}
    parts: list[Any] = []
    for p in chain[1:-1]:
        n = g.nodes[p]
        items: list[Any] = []
        for k, v in sorted(n.fields.items()):
            if k.endswith("_id") and type(v) is int:
                info = c.infos[v]
                if info.const is not None:
                    items.append((k, info.dtype.str, tuple(info.shape), info.const.tobytes()))
                else:
                    items.append((k, canon.setdefault(v, len(canon))))
            else:
                items.append((k, v))
        parts.append((n.type, n.output_min_max, tuple(items)))
    key = (tuple(parts), canon.get(last.fields["input_id"]))
    try:
        hash(key)
    except TypeError:  # a field of a kind the key can't hold: a batch
        return None
    return key


def _family_tables(c: Compiler, fam: Sequence[tuple[int, ...]]) -> dict[tuple[int, ...], np.ndarray]:
    """The tables of a family of islands (see _lookup_tables), one compile of its float nodes."""
    g, f = c.graph, len(fam)
    rep = fam[0]
    x_id, y_id = g.nodes[rep[0]].fields["output_id"], g.nodes[rep[-1]].fields["input_id"]
    plan = _island_plan(c, [g.nodes[p] for p in rep[1:-1]], {x_id: (0, True), y_id: (1, False)}, f * 256)
    xs, ys = np.empty((f, 256), _F32), np.empty((f, 256), _F32)
    codes = np.arange(256, dtype=np.uint8).view(_I8)
    for row, chain in zip(xs, fam):
        p = _qparams(c, c.infos[g.nodes[chain[0]].fields["input_id"]], "input_id")
        c.native.dequantize_qs8(codes, row, 256, p.zero_point, p.tensor_scale)
    _run_island(plan, [xs, ys])
    tables: dict[tuple[int, ...], np.ndarray] = {}
    for row, chain in zip(ys, fam):
        table = np.empty(256, np.uint8)
        q8 = _to_q8_args(c, c.infos[g.nodes[chain[-1]].fields["output_id"]])
        c.native.quantize_qs8(row, table.view(_I8), 256, *q8)
        tables[chain] = table
    return tables


def _batched_tables(c: Compiler, chains: Sequence[tuple[int, ...]]) -> dict[tuple[int, ...], np.ndarray]:
    """The tables of islands compiled with their Converts, in graphs of islands sharing no
    value but constants (see _lookup_tables)."""
    g = c.graph
    batches: list[tuple[list[tuple[int, ...]], set[int]]] = []  # (chains, their non-constant value ids)
    for chain in chains:
        ids = {v for p in chain for k, v in g.nodes[p].fields.items() if k.endswith("_id") and type(v) is int}
        own = {vid for vid in ids if c.infos[vid].const is None}
        for batch, used in batches:
            if used.isdisjoint(own):
                batch.append(chain)
                used.update(own)
                break
        else:
            batches.append(([chain], own))
    tables: dict[tuple[int, ...], np.ndarray] = {}
    for batch, _ in batches:
        ends: dict[int, tuple[int, bool]] = {}  # value id -> (external id, is the input)
        for k, chain in enumerate(batch):
            ends[g.nodes[chain[0]].fields["input_id"]] = (2 * k, True)
            ends[g.nodes[chain[-1]].fields["output_id"]] = (2 * k + 1, False)
        plan = _island_plan(c, [g.nodes[p] for chain in batch for p in chain], ends, 256)
        ys = np.empty((len(batch), 256), np.uint8)
        _run_island(plan, [a for y in ys for a in (np.arange(256, dtype=np.uint8), y)])
        tables.update(zip(batch, ys))
    return tables


def _island_plan(c: Compiler, nodes: Sequence[XNode], ends: dict[int, tuple[int, bool]], elements: int) -> Plan:
    """``nodes`` of ``c``'s graph compiled as a graph of their own, every non-constant value of
    ``elements`` elements; ``ends``: value id -> (external id, whether it is an input)."""
    ids = {v for n in nodes for k, v in n.fields.items() if k.endswith("_id") and type(v) is int}
    values = []
    for vid in sorted(ids):
        v = c.values[vid]
        if c.infos[vid].const is None:  # constants stay as they are (scalars here)
            ext, is_input = ends.get(vid, (0, None))
            flags = 0 if is_input is None else VALUE_FLAG_EXTERNAL_INPUT if is_input else VALUE_FLAG_EXTERNAL_OUTPUT
            v = XValue(v.index, v.id, v.datatype, (elements,), v.constant_buffer_idx, ext, flags, v.dq_datatype,
                       v.quant)
        values.append(v)
    by_ext = sorted(ends.items(), key=lambda e: e[1][0])
    island = dataclasses.replace(c.graph, nodes=tuple(nodes), values=tuple(values), num_externs=len(ends),
                                 input_ids=tuple(vid for vid, (_, inp) in by_ext if inp),
                                 output_ids=tuple(vid for vid, (_, inp) in by_ext if not inp))
    return Compiler(island, f"{c.where}: the float islands' lookup tables", c.named_data, lookup=False).compile()


def _run_island(plan: Plan, arrays: Sequence[np.ndarray]) -> None:
    """Runs ``plan`` once with its external value ``e`` in ``arrays[e]`` (seen as its dtype and dims)."""
    ws = Workspace(plan)
    for ext, slot, shape, dtype in (*plan.inputs, *plan.outputs):
        ws.bufs[slot] = arrays[ext].view(dtype).reshape(shape)
    for step in plan.steps:
        step(ws.bufs)


def _build_lookup(c: Compiler, node: XNode) -> list[Step]:
    """A quantized value's float island (Convert, elementwise float32 nodes, Convert) as one
    byte lookup (lut_u8), at the island's last Convert."""
    chain = c.lookup_chain()
    x = c.tensor(c.graph.nodes[chain[0]].fields["input_id"], "input_id (of the float island's first Convert)")
    out = c.output(node.fields["output_id"])
    c.check_shape(out, x.shape)
    table = c.prepacked(_lookup_table(c, chain))
    gx, o, n, lut = c.getter(x), out.slot, math.prod(out.shape), c.native.lut_u8
    return [lambda b: lut(gx(b), b[o], n, table)]


register_node(LOOKUP_NODE, _build_lookup)
for _code, _dtype in _QUANT_DATATYPES.items():
    register_datatype(_code, _dtype)
_dispatch("XNNConvert", _build_convert)
_dispatch("XNNFullyConnected", _build_fully_connected)
_dispatch("XNNConv2d", _build_conv2d)
_dispatch("XNNDepthwiseConv2d", _build_conv2d)
_dispatch("XNNAdd", _build_add)
_dispatch("XNNMaxPooling2d", _build_max_pool)
_dispatch("XNNClamp", _build_clamp)
_dispatch("XNNMultiply", _build_multiply)
_dispatch("XNNGlobalAvgPooling2d", _build_global_avg)
