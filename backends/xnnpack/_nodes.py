"""float32 node implementations: one builder per XNNPACK node type, registered in
:data:`~._compile.NODE_BUILDERS`.

Layouts are XNNPACK's: activations NHWC; convolution filters OHWI ([groups * group_output
channels, kh, kw, group_input_channels]); depthwise filters 1HWO; transposed-convolution
filters [groups * group_output_channels, kh, kw, group_input_channels]; fully-connected
filters [out, in] (``flags & XNN_FLAG_TRANSPOSE_WEIGHTS``: [in, out]).

Each builder checks its node's fields and shapes against the values' dims, re-lays-out
constant weights once (the plan is shared by every Method), and returns steps that run a
few numpy calls on preallocated buffers (``out=``), no allocation per execute where numpy
allows it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np

from orchestra.runtime.kernels import permute_geometry

from ._blob import XNode
from ._compile import SILU_NODE, Compiler, Step, TensorInfo, register_node

__all__: list[str] = []

FLAG_TRANSPOSE_WEIGHTS = 0x1
FLAG_ALIGN_CORNERS = 0x8
FLAG_TENSORFLOW_LEGACY_MODE = 0x4
FLAG_KEEP_DIMS = 0x40

_F32 = np.dtype(np.float32)


def _nd(buf: np.ndarray, shape: tuple[int, ...], strides: tuple[int, ...], offset: int = 0) -> np.ndarray:
    return np.ndarray(shape, buf.dtype, buf, offset, strides)


# Node types whose fused ``output_min_max`` ExecuTorch's runtime hands to XNNPACK
# (XNNCompiler.cpp); on every other node type it is ignored, here too.
MINMAX_NODES = frozenset({
    "XNNConv2d", "XNNDepthwiseConv2d", "XNNConvTranspose2d", "XNNFullyConnected", "XNNAdd", "XNNSubtract",
    "XNNMultiply", "XNNDiv", "XNNClamp", "XNNAvgPooling2d", "XNNMaxPooling2d", "XNNGlobalAvgPooling2d",
})


# -- shared pieces --------------------------------------------------------------------------
def _clamp_steps(c: Compiler, node: XNode, out: TensorInfo) -> list[Step]:
    """Steps for the fused ``output_min_max`` (none when absent, unbounded, or ignored by
    this node type)."""
    lo, hi = _bounds(c, node)
    o = out.slot
    if lo == -math.inf and hi == math.inf:
        return []
    if hi == math.inf:
        return [lambda b: np.maximum(b[o], lo, out=b[o])]
    if lo == -math.inf:
        return [lambda b: np.minimum(b[o], hi, out=b[o])]
    return [lambda b: np.clip(b[o], lo, hi, out=b[o])]


def _f32_in(c: Compiler, vid: int, role: str) -> TensorInfo:
    t = c.tensor(vid, role)
    c.check_dtype(t, role)
    return t


def _f32_out(c: Compiler, vid: int, role: str = "output_id") -> TensorInfo:
    t = c.output(vid, role)
    c.check_dtype(t, role)
    return t


def _bounds(c: Compiler, node: XNode) -> tuple[float, float]:
    """The node's fused output clamp as (lo, hi); (-inf, inf) when it has none."""
    if node.output_min_max is None or node.type not in MINMAX_NODES:
        return -math.inf, math.inf
    lo, hi = node.output_min_max
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        raise c.fail(f"output_min_max ({lo}, {hi}) is not a valid range")
    return float(lo), float(hi)


def _product_act(c: Compiler, node: XNode, out: TensorInfo, act: int) -> tuple[int, list[Step]]:
    """For a compiled product (no clamp of its own): the activation code it ends with and
    the clamp steps still to run after it. A clamp to [0, inf) is relu; a fused activation
    comes only to nodes without a clamp (Compiler._plan_fusion)."""
    lo, hi = _bounds(c, node)
    if act == 0 and lo == 0.0 and hi == math.inf:
        return 1, []
    return act, _clamp_steps(c, node, out)


def _act_steps(c: Compiler, out: TensorInfo, act: int) -> list[Step]:
    """The fused activation ``act`` over ``out`` in place, one compiled pass (for the paths
    that compute a fused node with numpy: its epilogue still has to run)."""
    if not act:
        return []
    fn, o, size = c.native.bias_act_f32, out.slot, math.prod(out.shape)
    return [lambda b: fn(b[o], None, 1, 1, size, act)]


def _bias_getter(c: Compiler, node: XNode, channels: int) -> Callable[[list[Any]], Any]:
    """The node's bias for a compiled kernel, as a getter from the buffers: the constant as
    a contiguous float32 vector, the value's array, or None without a bias."""
    bias = c.info(node.fields["bias_id"], "bias_id", optional=True)
    if bias is None:
        return lambda b: None
    c.check_dtype(bias, "bias_id")
    if math.prod(bias.shape) != channels:
        raise c.fail(f"bias (value id {bias.value.id}) has {math.prod(bias.shape)} elements, expected {channels}")
    if bias.const is not None:
        bv = np.ascontiguousarray(bias.const.reshape(channels))
        return lambda b: bv
    return c.getter(bias)


# Products of fewer multiply-adds than this, or fewer rows (unless the filter is read in
# place: _use_native_product), stay with BLAS (the runtime's own threshold for its linear
# layers: kernels/_linalg.py).
_NATIVE_MIN_WORK = 1 << 16
_NATIVE_MIN_ROWS = 4


def _native_product(c: Compiler, gx: Callable[[list[Any]], Any], wk: np.ndarray, gb: Callable[[list[Any]], Any],
                    o: int, rows: int, k: int, n: int, act: int, trans: bool = False) -> Step:
    """out (rows, n) = act(x (rows, k) @ wk (k, n) + bias) by the compiled product; with
    ``trans`` ``wk`` is given as its transpose, (n, k) rows: a filter as the program stores
    it, read in place (the product transposes each column block as it packs it anyway, as
    fast as it copies one: no transposed copy is made at load)."""
    lin = c.native.linear_f32
    return lambda b: lin(gx(b), wk, gb(b), b[o], 1, rows, k, n, False, act, trans)


def _use_native_product(c: Compiler, rows: int, k: int, n: int, trans: bool = False) -> bool:
    """Whether the compiled product takes a product of this size. A filter read in place
    (``trans``: stored (out, in), as exported by default) goes to it at any row count: one
    row (a classifier, squeeze-excite) is a dot product per output over contiguous memory,
    as fast as BLAS's (1 x 1024 x 1000: 54 vs 56 us), 2-3 rows 2-5x faster, and no
    transposed copy is made at load."""
    return c.native is not None and (rows >= _NATIVE_MIN_ROWS or trans) and rows * k * n >= _NATIVE_MIN_WORK


# -- elementwise ----------------------------------------------------------------------------
def _erf(x: np.ndarray, out: np.ndarray, t: np.ndarray) -> None:
    """erf(x) into ``out`` (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7); ``t`` is scratch."""
    np.abs(x, out=t)
    np.multiply(t, 0.3275911, out=out)
    np.add(out, 1.0, out=out)
    np.reciprocal(out, out=out)  # out = s = 1 / (1 + p|x|)
    np.multiply(t, t, out=t)
    np.negative(t, out=t)
    np.exp(t, out=t)  # t = exp(-x^2)
    s = out.copy()
    np.multiply(s, 1.061405429, out=out)
    for a in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        np.add(out, a, out=out)
        np.multiply(out, s, out=out)
    np.multiply(out, t, out=out)
    np.subtract(1.0, out, out=out)
    np.copysign(out, x, out=out)


def _rsqrt(x: np.ndarray, o: np.ndarray) -> None:
    np.sqrt(x, out=o)
    np.reciprocal(o, out=o)


def _sigmoid(x: np.ndarray, o: np.ndarray) -> None:
    np.negative(x, out=o)
    np.exp(o, out=o)
    np.add(o, 1.0, out=o)
    np.reciprocal(o, out=o)


def _hardswish(x: np.ndarray, o: np.ndarray) -> None:
    np.add(x, 3.0, out=o)
    np.clip(o, 0.0, 6.0, out=o)
    np.multiply(o, x, out=o)
    np.multiply(o, 1.0 / 6.0, out=o)


_UNARY: Mapping[str, Callable[[np.ndarray, np.ndarray], Any]] = MappingProxyType({
    "XNNAbs": lambda x, o: np.abs(x, out=o),
    "XNNNegate": lambda x, o: np.negative(x, out=o),
    "XNNSquare": lambda x, o: np.square(x, out=o),
    "XNNSquareRoot": lambda x, o: np.sqrt(x, out=o),
    "XNNFloor": lambda x, o: np.floor(x, out=o),
    "XNNCeiling": lambda x, o: np.ceil(x, out=o),
    "XNNLog": lambda x, o: np.log(x, out=o),
    "XNNExp": lambda x, o: np.exp(x, out=o),
    "XNNSin": lambda x, o: np.sin(x, out=o),
    "XNNCos": lambda x, o: np.cos(x, out=o),
    "XNNTanh": lambda x, o: np.tanh(x, out=o),
    "XNNClamp": lambda x, o: np.copyto(o, x),
    "XNNCopy": lambda x, o: np.copyto(o, x),
    "XNNReciprocalSquareRoot": _rsqrt,
    "XNNSigmoid": _sigmoid,
    "XNNHardswish": _hardswish,
})




def _unary_shape(c: Compiler, node: XNode) -> tuple[TensorInfo, TensorInfo]:
    x = _f32_in(c, node.fields["input_id"], "input_id")
    out = _f32_out(c, node.fields["output_id"])
    c.check_shape(out, x.shape)
    return x, out


def _build_unary(c: Compiler, node: XNode) -> list[Step]:
    fn = _UNARY[node.type]
    x, out = _unary_shape(c, node)
    get, o = c.getter(x), out.slot
    if node.type == "XNNHardswish" and c.native is not None:
        hs, size = c.native.hardswish_f32, math.prod(x.shape)
        return [lambda b: hs(get(b), b[o], size), *_clamp_steps(c, node, out)]
    return [lambda b: fn(get(b), b[o]), *_clamp_steps(c, node, out)]


def _build_silu(c: Compiler, node: XNode) -> list[Step]:
    """SiLU in one compiled pass: x * sigmoid(x), for a Sigmoid whose only reader is this
    Multiply of x by it (Compiler._plan_fusion; the Sigmoid's output is never written)."""
    x = _f32_in(c, c.silu_input(), "input (the SiLU's x)")
    out = _f32_out(c, node.fields["output_id"])
    c.check_shape(out, x.shape)
    silu, get, o, size = c.native.silu_f32, c.getter(x), out.slot, math.prod(x.shape)
    return [lambda b: silu(get(b), b[o], size)]


def _build_gelu(c: Compiler, node: XNode) -> list[Step]:
    x, out = _unary_shape(c, node)
    get, o = c.getter(x), out.slot
    if c.native is not None:
        gelu, size = c.native.gelu_f32, math.prod(x.shape)
        return [lambda b: gelu(get(b), b[o], size), *_clamp_steps(c, node, out)]
    t1, t2 = c.scratch(x.shape), c.scratch(x.shape)

    def step(b: list[Any]) -> None:
        v, r, s = get(b), b[o], b[t1]
        np.multiply(v, 1.0 / math.sqrt(2.0), out=s)
        _erf(s, r, b[t2])
        np.add(r, 1.0, out=r)
        np.multiply(r, v, out=r)
        np.multiply(r, 0.5, out=r)

    return [step, *_clamp_steps(c, node, out)]


def _build_elu(c: Compiler, node: XNode) -> list[Step]:
    x, out = _unary_shape(c, node)
    alpha = float(node.fields["alpha"])
    get, o, t = c.getter(x), out.slot, c.scratch(x.shape)

    def step(b: list[Any]) -> None:
        v, r, s = get(b), b[o], b[t]
        np.minimum(v, 0.0, out=s)
        np.expm1(s, out=s)
        np.multiply(s, alpha, out=s)
        np.maximum(v, 0.0, out=r)
        np.add(r, s, out=r)

    return [step, *_clamp_steps(c, node, out)]


def _build_leaky_relu(c: Compiler, node: XNode) -> list[Step]:
    x, out = _unary_shape(c, node)
    slope = float(node.fields["negative_slope"])
    get, o = c.getter(x), out.slot
    if 0.0 <= slope <= 1.0:
        def step(b: list[Any]) -> None:
            v, r = get(b), b[o]
            np.multiply(v, slope, out=r)
            np.maximum(r, v, out=r)
    else:
        def step(b: list[Any]) -> None:
            v, r = get(b), b[o]
            np.multiply(v, slope, out=r)
            np.copyto(r, v, where=v >= 0)
    return [step, *_clamp_steps(c, node, out)]


def _build_convert(c: Compiler, node: XNode) -> list[Step]:
    x = c.tensor(node.fields["input_id"], "input_id")
    out = c.output(node.fields["output_id"])
    c.check_dtype(x, "input_id", (np.float32, np.int32))
    c.check_dtype(out, "output_id", (np.float32, np.int32))
    c.check_shape(out, x.shape)
    get, o = c.getter(x), out.slot
    return [lambda b: np.copyto(b[o], get(b), casting="unsafe"), *_clamp_steps(c, node, out)]


def _build_softmax(c: Compiler, node: XNode) -> list[Step]:
    x, out = _unary_shape(c, node)
    if not x.shape or x.shape[-1] == 0:
        raise c.fail(f"softmax needs a non-empty last dimension, got dims {list(x.shape)}")
    get, o = c.getter(x), out.slot
    if c.native is not None:
        sm, d = c.native.softmax_f32, x.shape[-1]
        rows = math.prod(x.shape) // d
        return [lambda b: sm(get(b), b[o], rows, d)]
    m = c.scratch((*x.shape[:-1], 1))

    def step(b: list[Any]) -> None:
        v, r, mx = get(b), b[o], b[m]
        np.max(v, axis=-1, keepdims=True, out=mx)
        np.subtract(v, mx, out=r)
        np.exp(r, out=r)
        np.sum(r, axis=-1, keepdims=True, out=mx)
        np.divide(r, mx, out=r)

    return [step]


_BINARY: Mapping[str, Any] = MappingProxyType({
    "XNNAdd": np.add, "XNNSubtract": np.subtract, "XNNMultiply": np.multiply, "XNNDiv": np.divide,
    "XNNMinimum": np.minimum, "XNNMaximum": np.maximum,
})


def _broadcast_pair(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...] | None:
    """numpy's broadcast of shapes ``a`` and ``b``; None where they do not broadcast.
    (``np.broadcast_shapes`` builds arrays to find it: 2 % of a load of ViT's XNNPACK file.)"""
    n = max(len(a), len(b))
    out = []
    for x, y in zip((1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(out)


def _broadcast(c: Compiler, a: TensorInfo, b: TensorInfo) -> tuple[int, ...]:
    shape = _broadcast_pair(a.shape, b.shape)
    if shape is None:
        raise c.fail(f"input dims {list(a.shape)} and {list(b.shape)} do not broadcast")
    return shape


def _build_binary(c: Compiler, node: XNode) -> list[Step]:
    f = node.fields
    a, bb = _f32_in(c, f["input1_id"], "input1_id"), _f32_in(c, f["input2_id"], "input2_id")
    out = _f32_out(c, f["output_id"])
    c.check_shape(out, _broadcast(c, a, bb))
    ufunc, ga, gb, o = _BINARY[node.type], c.getter(a), c.getter(bb), out.slot
    if node.type == "XNNAdd" and c.native is not None and a.shape == bb.shape == out.shape:
        # a residual connection (then relu): one compiled pass
        lo, hi = _bounds(c, node)
        relu = lo == 0.0 and hi == math.inf
        if relu or (lo == -math.inf and hi == math.inf):
            add, size = c.native.add_f32, math.prod(out.shape)
            return [lambda b: add(ga(b), gb(b), b[o], size, relu)]
    if node.type == "XNNMultiply" and c.native is not None and len(out.shape) >= 2:
        # squeeze-and-excite's excitation: channels-last data times one value per image and
        # channel, in one compiled pass split over the rows
        n, ch = out.shape[0], out.shape[-1]
        scale_shape = (n, *(1,) * (len(out.shape) - 2), ch)
        for x, s in ((a, bb), (bb, a)):
            if x.shape == out.shape and s.shape == scale_shape and n * ch > 0:
                mul, gx, gs, rows = c.native.mul_rows_f32, c.getter(x), c.getter(s), math.prod(out.shape[1:-1])
                if rows:
                    return [lambda b: mul(gx(b), gs(b), b[o], n, rows, ch), *_clamp_steps(c, node, out)]
    return [lambda b: ufunc(ga(b), gb(b), out=b[o]), *_clamp_steps(c, node, out)]


def _build_prelu(c: Compiler, node: XNode) -> list[Step]:
    f = node.fields
    x, w = _f32_in(c, f["input1_id"], "input1_id"), _f32_in(c, f["input2_id"], "input2_id")
    out = _f32_out(c, f["output_id"])
    c.check_shape(out, _broadcast(c, x, w))
    gx, gw, o = c.getter(x), c.getter(w), out.slot

    def step(b: list[Any]) -> None:
        v, r = gx(b), b[o]
        np.multiply(v, gw(b), out=r)
        np.copyto(r, v, where=v >= 0)

    return [step, *_clamp_steps(c, node, out)]


# -- matrix products ------------------------------------------------------------------------
def _build_fully_connected(c: Compiler, node: XNode) -> list[Step]:
    f = node.fields
    x = _f32_in(c, f["input1_id"], "input1_id")
    w = _f32_in(c, f["filter_id"], "filter_id")
    bias = c.info(f["bias_id"], "bias_id", optional=True)
    out, act = c.fused_output()
    c.check_dtype(out, "output_id")
    if len(w.shape) != 2:
        raise c.fail(f"filter (value id {w.value.id}) has dims {list(w.shape)}, expected 2")
    transposed = bool(f["flags"] & FLAG_TRANSPOSE_WEIGHTS)
    k, n = (w.shape[0], w.shape[1]) if transposed else (w.shape[1], w.shape[0])
    if not x.shape or k == 0 or math.prod(x.shape) % k:
        raise c.fail(f"input dims {list(x.shape)} do not hold whole rows of {k} input channels")
    rows = math.prod(x.shape) // k
    if c.dynamic and len(out.shape) == len(x.shape):
        out = c.check_shape(out, (*x.shape[:-1], n))
    if math.prod(out.shape) != rows * n:
        raise c.fail(f"output (value id {out.value.id}) dims {list(out.shape)} do not hold {rows} rows of {n} outputs")
    gx, o = c.getter(x), out.slot
    steps: list[Step] = []
    if w.const is not None and _use_native_product(c, rows, k, n, not transposed):
        code, clamp = _product_act(c, node, out, act)
        return [_native_product(c, gx, w.const, _bias_getter(c, node, n), o, rows, k, n, code, not transposed),
                *clamp]
    if w.const is not None:
        wc = w.const
        # one row: BLAS reads the transposed view as fast as a transposed copy (no copy made)
        wk = wc if transposed else wc.T if rows == 1 else c.pack("filter", lambda: np.ascontiguousarray(wc.T))
        steps.append(lambda b: np.matmul(gx(b).reshape(rows, k), wk, out=b[o].reshape(rows, n)))
    else:
        gw = c.getter(w)
        if transposed:
            steps.append(lambda b: np.matmul(gx(b).reshape(rows, k), gw(b), out=b[o].reshape(rows, n)))
        else:
            steps.append(lambda b: np.matmul(gx(b).reshape(rows, k), gw(b).T, out=b[o].reshape(rows, n)))
    if bias is not None:
        c.check_dtype(bias, "bias_id")
        if math.prod(bias.shape) != n:
            raise c.fail(f"bias (value id {bias.value.id}) has {math.prod(bias.shape)} elements, expected {n}")
        gb = c.getter(bias)
        steps.append(lambda b: np.add(b[o].reshape(rows, n), gb(b).reshape(n), out=b[o].reshape(rows, n)))
    return [*steps, *_clamp_steps(c, node, out), *_act_steps(c, out, act)]


def _build_bmm(c: Compiler, node: XNode) -> list[Step]:
    f = node.fields
    a, w = _f32_in(c, f["input1_id"], "input1_id"), _f32_in(c, f["input2_id"], "input2_id")
    out = _f32_out(c, f["output_id"])
    if len(a.shape) < 2 or len(w.shape) < 2:
        raise c.fail(f"inputs need at least 2 dims, got {list(a.shape)} and {list(w.shape)}")
    tb = bool(f["flags"] & FLAG_TRANSPOSE_WEIGHTS)
    wshape = (*w.shape[:-2], w.shape[-1], w.shape[-2]) if tb else w.shape
    if a.shape[-1] != wshape[-2]:
        raise c.fail(f"inner dims differ: {list(a.shape)} x {list(w.shape)}" + (" (transposed)" if tb else ""))
    batch = _broadcast_pair(a.shape[:-2], wshape[:-2])
    if batch is None:
        raise c.fail(f"batch dims of {list(a.shape)} and {list(w.shape)} do not broadcast")
    c.check_shape(out, (*batch, a.shape[-2], wshape[-1]))
    ga, o = c.getter(a), out.slot
    if w.const is not None:
        wc = w.const
        wk = c.pack("filter", lambda: np.ascontiguousarray(np.swapaxes(wc, -1, -2) if tb else wc))
        return [lambda b: np.matmul(ga(b), wk, out=b[o])]
    gw = c.getter(w)
    if tb:
        return [lambda b: np.matmul(ga(b), np.swapaxes(gw(b), -1, -2), out=b[o])]
    return [lambda b: np.matmul(ga(b), gw(b), out=b[o])]


def _build_sdpa(c: Compiler, node: XNode) -> list[Step]:
    f = node.fields
    q, k, v = (_f32_in(c, f[n], n) for n in ("query_id", "key_id", "value_id"))
    scale = _f32_in(c, f["scale_id"], "scale_id")
    mask = c.info(f["mask_id"], "mask_id", optional=True)
    out = _f32_out(c, f["output_id"])
    if len(q.shape) < 3 or len(k.shape) != len(q.shape) or len(v.shape) != len(q.shape):
        raise c.fail(f"query/key/value dims {list(q.shape)}, {list(k.shape)}, {list(v.shape)} are not [..., T, D]")
    t, d, s = q.shape[-2], q.shape[-1], k.shape[-2]
    if s == 0:
        raise c.fail(f"key dims {list(k.shape)} hold no keys")
    if k.shape[-1] != d or v.shape[-2] != s:
        raise c.fail(f"key dims {list(k.shape)} / value dims {list(v.shape)} do not match query {list(q.shape)}")
    c.check_shape(out, (*q.shape[:-1], v.shape[-1]))
    if math.prod(scale.shape) not in (1, d):
        raise c.fail(f"scale (value id {scale.value.id}) has dims {list(scale.shape)}, expected [{d}]")
    gq, gk, gv, gs, o = c.getter(q), c.getter(k), c.getter(v), c.getter(scale), out.slot
    gm = c.getter(mask) if mask is not None else None
    qs = c.scratch(q.shape)
    logits = c.scratch((*q.shape[:-2], t, s))
    mx = c.scratch((*q.shape[:-2], t, 1))

    def step(b: list[Any]) -> None:
        ql, lg, m = b[qs], b[logits], b[mx]
        np.multiply(gq(b), gs(b).reshape(-1), out=ql)
        np.matmul(ql, np.swapaxes(gk(b), -1, -2), out=lg)
        if gm is not None:
            np.add(lg, gm(b), out=lg)
        np.max(lg, axis=-1, keepdims=True, out=m)
        np.subtract(lg, m, out=lg)
        np.exp(lg, out=lg)
        np.sum(lg, axis=-1, keepdims=True, out=m)
        np.divide(lg, m, out=lg)
        np.matmul(lg, gv(b), out=b[o])

    return [step]


# -- convolution ----------------------------------------------------------------------------
def _conv_geometry(c: Compiler, node: XNode, x: TensorInfo, name: str = "input1_id") -> tuple[int, ...]:
    if len(x.shape) != 4:
        raise c.fail(f"{name} (value id {x.value.id}) has dims {list(x.shape)}, expected NHWC (4 dims)")
    return x.shape


def _out_size(c: Compiler, size: int, pad: int, k: int, stride: int, dil: int, what: str) -> int:
    if stride < 1 or dil < 1 or k < 1:
        raise c.fail(f"{what}: kernel {k}, stride {stride} and dilation {dil} must be >= 1")
    span = dil * (k - 1) + 1
    if size + pad < span:
        raise c.fail(f"{what}: the padded input ({size + pad}) is smaller than the kernel span ({span})")
    return (size + pad - span) // stride + 1


def _padder(c: Compiler, x: TensorInfo, pt: int, pb: int, pl: int, pr: int, fill: float,
            repeat: int = 1) -> tuple[int, list[Step], tuple[int, int, int, int]]:
    """A per-Method padded copy of NHWC ``x`` (border filled once with ``fill``; channels
    repeated ``repeat`` times); returns (slot, steps, padded shape). No padding and no
    repeat: the input itself (a contiguous copy only when it is not contiguous)."""
    n, h, w, ch = x.shape
    shape = (n, h + pt + pb, w + pl + pr, ch * repeat)
    gx = c.getter(x)
    if not (pt or pb or pl or pr) and repeat == 1:
        if x.const is not None:
            return -1, [], shape
        slot = c.rebound()  # rebound each execute to a contiguous view of the input

        def bind(b: list[Any]) -> None:
            v = gx(b)
            b[slot] = v if v.flags.c_contiguous else np.ascontiguousarray(v)

        return slot, [bind], shape
    slot = c.scratch(shape, fill=fill)
    inner = (slice(None), slice(pt, pt + h), slice(pl, pl + w))
    if repeat == 1:
        return slot, [lambda b: np.copyto(b[slot][inner], gx(b))], shape
    return slot, [lambda b: np.copyto(b[slot][inner].reshape(n, h, w, ch, repeat), gx(b)[..., None])], shape


def _conv_fields(node: XNode) -> tuple[int, ...]:
    f = node.fields
    return (f["padding_top"], f["padding_right"], f["padding_bottom"], f["padding_left"], f["kernel_height"],
            f["kernel_width"], f["subsampling_height"], f["subsampling_width"], f["dilation_height"],
            f["dilation_width"], f["groups"], f["group_input_channels"], f["group_output_channels"])


def _bias_steps(c: Compiler, node: XNode, out: TensorInfo, channels: int) -> list[Step]:
    bias = c.info(node.fields["bias_id"], "bias_id", optional=True)
    if bias is None:
        return []
    c.check_dtype(bias, "bias_id")
    if math.prod(bias.shape) != channels:
        raise c.fail(f"bias (value id {bias.value.id}) has {math.prod(bias.shape)} elements, expected {channels}")
    gb, o = c.getter(bias), out.slot
    if bias.const is not None:
        bv = bias.const.reshape(channels)
        return [lambda b: np.add(b[o], bv, out=b[o])]
    return [lambda b: np.add(b[o], gb(b).reshape(channels), out=b[o])]


def _check_size(c: Compiler, *values: int) -> None:
    if max(values, default=0) > 1 << 24:
        raise c.fail(f"a kernel, padding, stride or dilation of {max(values)} is out of range")


def _conv_channels(c: Compiler, w: Any, depthwise: bool, ch: int, groups: int, gic: int, goc: int,
                   kh: int, kw: int) -> int:
    """Checks a convolution's channel fields and filter dims (OHWI, or 1HWO for depthwise)
    against an input of ``ch`` channels; returns the output channels."""
    if depthwise:
        if gic != 1 or groups != ch or goc < 1:
            raise c.fail(f"depthwise convolution needs groups ({groups}) = input channels ({ch}) and "
                         f"group_input_channels ({gic}) = 1")
        cout, want, layout = ch * goc, (1, kh, kw, ch * goc), "1HWO"
    else:
        if groups < 1 or ch != groups * gic:
            raise c.fail(f"input has {ch} channels, groups {groups} x group_input_channels {gic} = {groups * gic}")
        cout = groups * goc
        want, layout = (cout, kh, kw, gic), "OHWI"
    if w.shape != want:
        raise c.fail(f"filter (value id {w.value.id}) has dims {list(w.shape)}, expected {layout} {list(want)}")
    return cout


# A convolution of one group with at most this many input channels runs as the direct
# channels-last kernel rather than im2col + product (a network's stem: 3 channels).
_DIRECT_MAX_INPUT_CHANNELS = 4
# Patch embeddings with at least this many values per patch take the gathered product (as
# the runtime's kernels do for the portable operator: orchestra/runtime/kernels/_conv.py).
_PATCH_MIN_K = 256


def _build_conv2d(c: Compiler, node: XNode) -> list[Step]:
    f = node.fields
    pt, pr, pb, pl, kh, kw, sh, sw, dh, dw, groups, gic, goc = _conv_fields(node)
    _check_size(c, pt, pr, pb, pl, kh, kw, sh, sw, dh, dw)
    x = _f32_in(c, f["input1_id"], "input1_id")
    w = _f32_in(c, f["filter_id"], "filter_id")
    out, act = c.fused_output()
    c.check_dtype(out, "output_id")
    n, h, wd, ch = _conv_geometry(c, node, x)
    cout = _conv_channels(c, w, False, ch, groups, gic, goc, kh, kw)
    if w.const is None:
        raise c.fail("a non-constant filter is not supported")
    oh = _out_size(c, h, pt + pb, kh, sh, dh, "height")
    ow = _out_size(c, wd, pl + pr, kw, sw, dw, "width")
    c.check_shape(out, (n, oh, ow, cout))
    o = out.slot
    rows = n * oh * ow
    kk = kh * kw * gic
    wc = w.const
    if kh == kw == 1 and sh == sw == 1 and not (pt or pr or pb or pl) and groups == 1:
        gx = c.getter(x)
        if _use_native_product(c, rows, ch, cout, True):
            code, clamp = _product_act(c, node, out, act)
            return [_native_product(c, gx, wc.reshape(cout, ch), _bias_getter(c, node, cout), o, rows, ch, cout, code,
                                    True), *clamp]
        wk = c.pack("filter", lambda: np.ascontiguousarray(wc.reshape(cout, ch).T))
        steps: list[Step] = [lambda b: np.matmul(gx(b).reshape(rows, ch), wk, out=b[o].reshape(rows, cout))]
        return [*steps, *_bias_steps(c, node, out, cout), *_clamp_steps(c, node, out), *_act_steps(c, out, act)]
    # a patch embedding (stride = kernel, no padding: ViT's 16x16 patches) gathers its patches
    # (runs of kw * channels floats) for the compiled product below: 2x faster than the
    # direct convolution, whose 14-pixel output rows leave its tiles mostly idle
    patches = (groups == 1 and (kh, kw) == (sh, sw) and kh * kw > 1 and dh == dw == 1
               and not (pt or pr or pb or pl) and kk >= _PATCH_MIN_K)
    if not patches and (groups > 1 or gic <= _DIRECT_MAX_INPUT_CHANNELS) and c.native is not None:
        # channels-last direct convolution, each group's outputs accumulated in registers:
        # RegNet's narrow groups (no im2col per group, no transposes) and a network's RGB
        # stem (no padded copy, no im2col of 3-channel pixels: 2.5x faster on 224x224)
        gx = c.getter(x)
        wg = c.pack("filter.groups", lambda: np.ascontiguousarray(
            wc.reshape(groups, goc, kh, kw, gic).transpose(0, 2, 3, 4, 1)))
        gb = _bias_getter(c, node, cout)
        lo, hi = _bounds(c, node)
        gconv = c.native.gconv_nhwc_f32
        geo = (n, h, wd, groups, gic, goc, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, lo, hi, act)
        return [lambda b: gconv(gx(b), wg, gb(b), b[o], *geo)]
    ps, steps, pshape = _padder(c, x, pt, pb, pl, pr, 0.0)
    _, hp, wp, _ = pshape
    it = _F32.itemsize
    st = (hp * wp * ch * it, sh * wp * ch * it, sw * ch * it, dh * wp * ch * it, dw * ch * it, it)
    const_x = x.const
    if groups == 1:
        cols = c.scratch((n, oh, ow, kh, kw, gic))
        if _use_native_product(c, rows, kk, cout, True):
            def gather(b: list[Any]) -> None:
                np.copyto(b[cols], _nd(const_x if ps < 0 else b[ps], (n, oh, ow, kh, kw, ch), st))

            code, clamp = _product_act(c, node, out, act)
            gb = _bias_getter(c, node, cout)
            # the OHWI filter's rows are in the patches' (kh, kw, ci) order: read in place
            return [*steps, gather, _native_product(c, lambda b: b[cols], wc.reshape(cout, kk), gb, o, rows, kk, cout,
                                                    code, True), *clamp]
        wk = c.pack("filter", lambda: np.ascontiguousarray(wc.reshape(cout, kk).T))

        def conv(b: list[Any]) -> None:
            src = const_x if ps < 0 else b[ps]
            cb = b[cols]
            np.copyto(cb, _nd(src, (n, oh, ow, kh, kw, ch), st))
            np.matmul(cb.reshape(rows, kk), wk, out=b[o].reshape(rows, cout))

        steps.append(conv)
    else:
        # all groups in one batched matmul: cols [groups, rows, kh*kw*gic] x [groups, kk, goc]
        cols = c.scratch((groups, n, oh, ow, kh, kw, gic))
        tmp = c.scratch((groups, rows, goc))
        wks = c.pack("filter", lambda: np.ascontiguousarray(
            wc.reshape(groups, goc, kk).transpose(0, 2, 1)))

        def conv_groups(b: list[Any]) -> None:
            src = const_x if ps < 0 else b[ps]
            cb, tb = b[cols], b[tmp]
            patches = _nd(src, (n, oh, ow, kh, kw, ch), st).reshape(n, oh, ow, kh, kw, groups, gic)
            np.copyto(cb, patches.transpose(5, 0, 1, 2, 3, 4, 6))
            np.matmul(cb.reshape(groups, rows, kk), wks, out=tb)
            np.copyto(b[o].reshape(rows, groups, goc), tb.transpose(1, 0, 2))

        steps.append(conv_groups)
    return [*steps, *_bias_steps(c, node, out, cout), *_clamp_steps(c, node, out), *_act_steps(c, out, act)]


MAX_TAPS = 1 << 16


def _taps(c: Compiler, kh: int, kw: int, dh: int, dw: int, sh: int, sw: int, oh: int,
          ow: int) -> list[tuple[int, int, tuple[slice, ...]]]:
    if kh * kw > MAX_TAPS:
        raise c.fail(f"a {kh}x{kw} window has more than {MAX_TAPS} taps")
    return [(i, j, (slice(None), slice(i * dh, i * dh + sh * (oh - 1) + 1, sh),
                    slice(j * dw, j * dw + sw * (ow - 1) + 1, sw)))
            for i in range(kh) for j in range(kw)]


def _build_depthwise(c: Compiler, node: XNode) -> list[Step]:
    f = node.fields
    pt, pr, pb, pl, kh, kw, sh, sw, dh, dw, groups, gic, goc = _conv_fields(node)
    _check_size(c, pt, pr, pb, pl, kh, kw, sh, sw, dh, dw)
    x = _f32_in(c, f["input1_id"], "input1_id")
    w = _f32_in(c, f["filter_id"], "filter_id")
    out, act = c.fused_output()
    c.check_dtype(out, "output_id")
    n, h, wd, ch = _conv_geometry(c, node, x)
    cout = _conv_channels(c, w, True, ch, groups, gic, goc, kh, kw)
    if w.const is None:
        raise c.fail("a non-constant filter is not supported")
    oh = _out_size(c, h, pt + pb, kh, sh, dh, "height")
    ow = _out_size(c, wd, pl + pr, kw, sw, dw, "width")
    c.check_shape(out, (n, oh, ow, cout))
    wc = w.const
    if goc == 1 and c.native is not None:
        # channels-last direct depthwise convolution, padding, bias, clamp and activation
        # included (no padded copy of the input, no pass per tap)
        gx, o = c.getter(x), out.slot
        wt = c.pack("filter.hwc", lambda: np.ascontiguousarray(wc.reshape(kh, kw, cout)))
        gb = _bias_getter(c, node, cout)
        lo, hi = _bounds(c, node)
        dwc = c.native.dwconv_nhwc_f32
        geo = (n, h, wd, ch, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, lo, hi, act)
        return [lambda b: dwc(gx(b), wt, gb(b), b[o], *geo)]
    ps, steps, pshape = _padder(c, x, pt, pb, pl, pr, 0.0, repeat=goc)
    const_x, o = x.const, out.slot
    tmp = c.scratch((n, oh, ow, cout))
    tap_list = _taps(c, kh, kw, dh, dw, sh, sw, oh, ow)
    weights = [c.pack(f"tap{i},{j}", lambda i=i, j=j: np.ascontiguousarray(wc[0, i, j])) for i, j, _ in tap_list]
    if sh == sw == 1 or ps < 0:
        srcs = [(lambda b, sl=sl: (const_x if ps < 0 else b[ps])[sl]) for _, _, sl in tap_list]
    else:
        # Strided taps would make numpy loop over one pixel's channels at a time; split the
        # padded input once into sh x sw phase planes, so every tap reads whole rows.
        _, hp, wp, _ = pshape
        phases: dict[tuple[int, int], int] = {}
        for a in range(sh):
            for bb in range(sw):
                phases[(a, bb)] = c.scratch((n, -(-(hp - a) // sh), -(-(wp - bb) // sw), cout))
        keys = tuple(phases.items())

        def split(b: list[Any]) -> None:
            src = b[ps]
            for (a, bb), slot in keys:
                np.copyto(b[slot], src[:, a::sh, bb::sw])

        steps.append(split)
        srcs = []
        for i, j, _ in tap_list:
            a, r0 = (i * dh) % sh, (i * dh) // sh
            bb, c0 = (j * dw) % sw, (j * dw) // sw
            slot = phases[(a, bb)]
            srcs.append(lambda b, slot=slot, r0=r0, c0=c0: b[slot][:, r0:r0 + oh, c0:c0 + ow])
    (g0, w0), rest = (srcs[0], weights[0]), tuple(zip(srcs[1:], weights[1:]))

    def dw_step(b: list[Any]) -> None:
        r, t = b[o], b[tmp]
        np.multiply(g0(b), w0, out=r)
        for g, wt in rest:
            np.multiply(g(b), wt, out=t)
            np.add(r, t, out=r)

    steps.append(dw_step)
    return [*steps, *_bias_steps(c, node, out, cout), *_clamp_steps(c, node, out), *_act_steps(c, out, act)]


def _build_deconv(c: Compiler, node: XNode) -> list[Step]:
    f = node.fields
    pt, pr, pb, pl, kh, kw, sh, sw, dh, dw, groups, gic, goc = _conv_fields(node)
    ah, aw = f["adjustment_height"], f["adjustment_width"]
    _check_size(c, pt, pr, pb, pl, kh, kw, sh, sw, dh, dw, ah, aw)
    x = _f32_in(c, f["input1_id"], "input1_id")
    w = _f32_in(c, f["filter_id"], "filter_id")
    out = _f32_out(c, f["output_id"])
    n, h, wd, ch = _conv_geometry(c, node, x)
    if groups < 1 or ch != groups * gic:
        raise c.fail(f"input has {ch} channels, groups {groups} x group_input_channels {gic} = {groups * gic}")
    if min(kh, kw, sh, sw, dh, dw) < 1:
        raise c.fail("kernel, stride and dilation must be >= 1")
    cout = groups * goc
    if w.shape != (cout, kh, kw, gic):
        raise c.fail(f"filter (value id {w.value.id}) has dims {list(w.shape)}, expected {[cout, kh, kw, gic]}")
    if w.const is None:
        raise c.fail("a non-constant filter is not supported")
    hf = (h - 1) * sh + (kh - 1) * dh + 1 + ah
    wf = (wd - 1) * sw + (kw - 1) * dw + 1 + aw
    oh, ow = hf - pt - pb, wf - pl - pr
    if oh < 1 or ow < 1:
        raise c.fail(f"padding ({pt}, {pr}, {pb}, {pl}) leaves no output")
    c.check_shape(out, (n, oh, ow, cout))
    rows = n * h * wd
    gx, o = c.getter(x), out.slot
    wc = w.const
    kgo = kh * kw * goc
    # per group [gic, kh*kw*goc], so that cols = x_g @ W_g holds every tap's contribution;
    # all groups in one batched matmul.
    wks = c.pack("filter", lambda: np.ascontiguousarray(
        wc.reshape(groups, goc, kh, kw, gic).transpose(0, 4, 2, 3, 1).reshape(groups, gic, kgo)))
    cols = c.scratch((groups, rows, kgo))
    full = c.scratch((n, hf, wf, cout))
    xin = c.scratch((groups, rows, gic)) if groups > 1 else -1
    taps = _taps(c, kh, kw, dh, dw, sh, sw, h, wd)
    crop = (slice(None), slice(pt, pt + oh), slice(pl, pl + ow))

    def deconv(b: list[Any]) -> None:
        v = gx(b).reshape(rows, ch)
        cb, fb = b[cols], b[full]
        fb.fill(0.0)
        if groups == 1:
            np.matmul(v, wks[0], out=cb[0])
        else:
            np.copyto(b[xin], v.reshape(rows, groups, gic).transpose(1, 0, 2))
            np.matmul(b[xin], wks, out=cb)
        c7 = cb.reshape(groups, n, h, wd, kh, kw, goc)
        f5 = fb.reshape(n, hf, wf, groups, goc)
        for i, j, sl in taps:
            tgt = f5[sl]
            np.add(tgt, c7[:, :, :, :, i, j, :].transpose(1, 2, 3, 0, 4), out=tgt)
        np.copyto(b[o], fb[crop])

    return [deconv, *_bias_steps(c, node, out, cout), *_clamp_steps(c, node, out)]


# -- pooling --------------------------------------------------------------------------------
def _build_pool(c: Compiler, node: XNode) -> list[Step]:
    f = node.fields
    pt, pr, pb, pl = f["padding_top"], f["padding_right"], f["padding_bottom"], f["padding_left"]
    kh, kw, sh, sw = f["pooling_height"], f["pooling_width"], f["stride_height"], f["stride_width"]
    is_max = node.type == "XNNMaxPooling2d"
    dh, dw = (f["dilation_height"] or 1, f["dilation_width"] or 1) if is_max else (1, 1)
    _check_size(c, pt, pr, pb, pl, kh, kw, sh, sw, dh, dw)
    x = _f32_in(c, f["input_id"], "input_id")
    out = _f32_out(c, f["output_id"])
    n, h, wd, ch = _conv_geometry(c, node, x, "input_id")
    oh = _out_size(c, h, pt + pb, kh, sh, dh, "height")
    ow = _out_size(c, wd, pl + pr, kw, sw, dw, "width")
    c.check_shape(out, (n, oh, ow, ch))
    ps, steps, _ = _padder(c, x, pt, pb, pl, pr, -np.inf if is_max else 0.0)
    taps = [sl for _, _, sl in _taps(c, kh, kw, dh, dw, sh, sw, oh, ow)]
    const_x, o = x.const, out.slot
    sl0, rest = taps[0], taps[1:]
    if is_max:
        def pool(b: list[Any]) -> None:
            src, r = (const_x if ps < 0 else b[ps]), b[o]
            np.copyto(r, src[sl0])
            for sl in rest:
                np.maximum(r, src[sl], out=r)

        steps.append(pool)
    else:
        # XNNPACK's average pooling divides by the taps inside the input (padding excluded).
        ones = np.zeros((h + pt + pb, wd + pl + pr), np.float32)
        ones[pt:pt + h, pl:pl + wd] = 1.0
        count = sum(ones[sl[1:]] for sl in taps)
        if np.any(count == 0):
            raise c.fail("a pooling window lies entirely in the padding")
        inv = c.prepacked(np.ascontiguousarray((1.0 / count).astype(np.float32)[:, :, None]))
        uniform = bool(np.all(inv == inv.flat[0]))
        scale = float(inv.flat[0])

        def pool(b: list[Any]) -> None:
            src, r = (const_x if ps < 0 else b[ps]), b[o]
            np.copyto(r, src[sl0])
            for sl in rest:
                np.add(r, src[sl], out=r)
            np.multiply(r, scale if uniform else inv, out=r)

        steps.append(pool)
    return [*steps, *_clamp_steps(c, node, out)]


def _build_global_avg(c: Compiler, node: XNode) -> list[Step]:
    x = _f32_in(c, node.fields["input_id"], "input_id")
    out = _f32_out(c, node.fields["output_id"])
    if len(x.shape) < 3:
        raise c.fail(f"input (value id {x.value.id}) has dims {list(x.shape)}, expected N..C with a spatial dim")
    n, ch = x.shape[0], x.shape[-1]
    area = math.prod(x.shape[1:-1])
    if c.dynamic and len(out.shape) == len(x.shape):
        out = c.check_shape(out, (n, *([1] * (len(x.shape) - 2)), ch))
    if math.prod(out.shape) != n * ch or out.shape[0] != n or out.shape[-1] != ch:
        raise c.fail(f"output dims {list(out.shape)} are not [{n}, ..., {ch}]")
    if area == 0:
        raise c.fail("the input has no spatial elements")
    gx, o, inv = c.getter(x), out.slot, 1.0 / area
    if c.native is not None:
        # each image's (area x ch) matrix times a row of 1 / area: the compiled matrix-vector
        # product streams the input once (numpy's sum over a middle axis is several times slower)
        lin, avg = c.native.linear_f32, c.prepacked(np.full((n, 1, area), inv, np.float32))
        return [lambda b: lin(avg, gx(b), None, b[o], n, 1, area, ch, True), *_clamp_steps(c, node, out)]

    def step(b: list[Any]) -> None:
        r = b[o].reshape(n, ch)
        np.sum(gx(b).reshape(n, area, ch), axis=1, out=r)
        np.multiply(r, inv, out=r)

    return [step, *_clamp_steps(c, node, out)]


# -- data movement --------------------------------------------------------------------------
def _build_transpose(c: Compiler, node: XNode) -> list[Step]:
    f = node.fields
    x = c.tensor(f["input_id"], "input_id")
    out = c.output(f["output_id"])
    perm = tuple(f["perm"])
    if f["num_dims"] != len(perm) or sorted(perm) != list(range(len(x.shape))):
        raise c.fail(f"perm {list(perm)} (num_dims {f['num_dims']}) is not a permutation of the input's "
                     f"{len(x.shape)} dims")
    out = c.check_shape(out, tuple(x.shape[p] for p in perm))
    gx, o = c.getter(x), out.slot
    geo = permute_geometry(x.shape, perm) if c.native is not None and x.dtype.itemsize == 4 else None
    if geo is not None:
        # the compiled copy writes whole runs of the output (NCHW -> NHWC of an RGB image 4x
        # faster than the copy per channel below, attention's key transposes 2x numpy's);
        # numpy where it does not apply (an input given as a strided view)
        perm4 = c.native.permute_4b

        def compiled(b: list[Any]) -> None:
            src, dst = gx(b), b[o]
            if src.flags.c_contiguous and dst.flags.c_contiguous:
                try:
                    perm4(src, dst, geo)
                    return
                except ValueError:  # dst overlaps src (checked before anything is written)
                    pass
            np.copyto(dst, src.transpose(perm))

        return [compiled]
    last = out.shape[-1] if out.shape else 0
    if 1 < last <= 4 and perm[-1] != len(perm) - 1 and math.prod(out.shape) >= 4096:
        # e.g. NCHW -> NHWC of an RGB image: numpy's copy loops over the 3 channels
        # innermost; one strided copy per channel is ~7x faster.
        chans = range(last)

        def per_channel(b: list[Any]) -> None:
            r, v = b[o], gx(b).transpose(perm)
            for k in chans:
                r[..., k] = v[..., k]

        return [per_channel]
    return [lambda b: np.copyto(b[o], gx(b).transpose(perm))]


def _build_reshape(c: Compiler, node: XNode) -> list[Step]:
    f = node.fields
    x = c.tensor(f["input_id"], "input_id")
    out = c.output(f["output_id"])
    new = tuple(f["new_shape"])
    if f["num_dims"] != len(new) or len(new) != len(out.shape):
        raise c.fail(f"new_shape {list(new)} (num_dims {f['num_dims']}) does not match the output's "
                     f"{len(out.shape)} dims")
    if new.count(0) > 1:
        raise c.fail(f"new_shape {list(new)} has more than one inferred (0) dim")
    if 0 in new:  # the one inferred dim
        known = math.prod(d for d in new if d)
        total = math.prod(x.shape)
        if known == 0 or total % known:
            raise c.fail(f"new_shape {list(new)} can't hold the input's {total} elements")
        new = tuple(d or total // known for d in new)
    out = c.check_shape(out, new)
    if math.prod(out.shape) != math.prod(x.shape):
        raise c.fail(f"input dims {list(x.shape)} and output dims {list(out.shape)} hold different element counts")
    if out.dtype != x.dtype:
        raise c.fail("input and output datatypes differ")
    shape, gx, o = out.shape, c.getter(x), out.slot
    if c.make_view(out, x):
        def view(b: list[Any]) -> None:
            v = gx(b)
            b[o] = v.reshape(shape)
        return [view]
    return [lambda b: np.copyto(b[o], gx(b).reshape(shape))]


def _build_slice(c: Compiler, node: XNode) -> list[Step]:
    f = node.fields
    x = c.tensor(f["input_id"], "input_id")
    out = c.output(f["output_id"])
    offs, sizes = tuple(f["offsets"]), tuple(f["sizes"])
    if not (len(offs) == len(sizes) == len(x.shape) == f["num_dims"]):
        raise c.fail(f"offsets {list(offs)} / sizes {list(sizes)} / num_dims {f['num_dims']} do not match the "
                     f"input's {len(x.shape)} dims")
    sl = []
    for d, (a, s, full) in enumerate(zip(offs, sizes, x.shape)):
        s = s or full - a  # size 0: to the end
        if a + s > full:
            raise c.fail(f"dim {d}: offset {a} + size {s} exceed the input's {full}")
        sl.append(slice(a, a + s))
    c.check_shape(out, tuple(s.stop - s.start for s in sl))
    key, gx, o = tuple(sl), c.getter(x), out.slot
    return [lambda b: np.copyto(b[o], gx(b)[key])]


def _build_pad(c: Compiler, node: XNode) -> list[Step]:
    f = node.fields
    x = c.tensor(f["input_id"], "input_id")
    out = c.output(f["output_id"])
    pre, post = tuple(f["pre_paddings"]), tuple(f["post_paddings"])
    if len(pre) > len(x.shape) or len(post) > len(x.shape):
        raise c.fail(f"paddings {list(pre)} / {list(post)} have more entries than the input's {len(x.shape)} dims")
    pre = pre + (0,) * (len(x.shape) - len(pre))
    post = post + (0,) * (len(x.shape) - len(post))
    _check_size(c, *pre, *post)
    c.check_shape(out, tuple(d + a + z for d, a, z in zip(x.shape, pre, post)))
    inner = tuple(slice(a, a + d) for a, d in zip(pre, x.shape))
    value, gx, o = float(f["padding_value"]), c.getter(x), out.slot

    def step(b: list[Any]) -> None:
        r = b[o]
        r.fill(value)
        np.copyto(r[inner], gx(b))

    return [step]


def _build_concat(c: Compiler, node: XNode) -> list[Step]:
    f = node.fields
    count = int(node.type[-1])
    ins = [c.tensor(f[f"input{i}_id"], f"input{i}_id") for i in range(1, count + 1)]
    out = c.output(f["output_id"])
    axis = f["axis"]
    rank = len(ins[0].shape)
    if axis >= rank or any(len(t.shape) != rank for t in ins):
        raise c.fail(f"axis {axis} / input ranks {[len(t.shape) for t in ins]} do not match")
    for t in ins[1:]:
        if any(a != b for d, (a, b) in enumerate(zip(t.shape, ins[0].shape)) if d != axis):
            raise c.fail(f"input dims {[list(t.shape) for t in ins]} differ outside axis {axis}")
    shape = list(ins[0].shape)
    shape[axis] = sum(t.shape[axis] for t in ins)
    c.check_shape(out, tuple(shape))
    gets, o = [c.getter(t) for t in ins], out.slot
    return [lambda b: np.concatenate([g(b) for g in gets], axis=axis, out=b[o])]


def _build_resize(c: Compiler, node: XNode) -> list[Step]:
    f = node.fields
    x = _f32_in(c, f["input_id"], "input_id")
    out = _f32_out(c, f["output_id"])
    n, h, wd, ch = _conv_geometry(c, node, x, "input_id")
    oh, ow = f["new_height"], f["new_width"]
    _check_size(c, oh, ow)
    c.check_shape(out, (n, oh, ow, ch))
    align = bool(f["flags"] & FLAG_ALIGN_CORNERS)
    legacy = bool(f["flags"] & FLAG_TENSORFLOW_LEGACY_MODE)

    def coords(size_in: int, size_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        d = np.arange(size_out, dtype=np.float64)
        if align and size_out > 1:
            src = d * ((size_in - 1) / (size_out - 1))
        elif legacy or align:
            src = d * (size_in / size_out)
        else:
            src = np.maximum((d + 0.5) * (size_in / size_out) - 0.5, 0.0)
        i0 = np.minimum(np.floor(src).astype(np.intp), size_in - 1)
        i1 = np.minimum(i0 + 1, size_in - 1)
        return i0, i1, (src - i0).astype(np.float32)

    y0, y1, ly = coords(h, oh)
    x0, x1, lx = coords(wd, ow)
    ly4, lx4 = ly.reshape(1, oh, 1, 1), lx.reshape(1, 1, ow, 1)
    gx, o = c.getter(x), out.slot
    a0, a1 = c.scratch((n, oh, wd, ch)), c.scratch((n, oh, wd, ch))
    b1 = c.scratch((n, oh, ow, ch))

    def step(b: list[Any]) -> None:
        v, t0, t1, r, u = gx(b), b[a0], b[a1], b[o], b[b1]
        np.take(v, y0, axis=1, out=t0)
        np.take(v, y1, axis=1, out=t1)
        np.subtract(t1, t0, out=t1)
        np.multiply(t1, ly4, out=t1)
        np.add(t0, t1, out=t0)
        np.take(t0, x0, axis=2, out=r)
        np.take(t0, x1, axis=2, out=u)
        np.subtract(u, r, out=u)
        np.multiply(u, lx4, out=u)
        np.add(r, u, out=r)

    return [step]


for _name in _UNARY:
    register_node(_name, _build_unary)
for _name in _BINARY:
    register_node(_name, _build_binary)
for _name in ("XNNConcatenate2", "XNNConcatenate3", "XNNConcatenate4", "XNNConcatenate5"):
    register_node(_name, _build_concat)
register_node(SILU_NODE, _build_silu)
register_node("XNNGelu", _build_gelu)
register_node("XNNELU", _build_elu)
register_node("XNNLeakyReLU", _build_leaky_relu)
register_node("XNNPReLU", _build_prelu)
register_node("XNNConvert", _build_convert)
register_node("XNNSoftmax", _build_softmax)
register_node("XNNFullyConnected", _build_fully_connected)
register_node("XNNBatchMatrixMultiply", _build_bmm)
register_node("XNNScaledDotProductAttention", _build_sdpa)
register_node("XNNConv2d", _build_conv2d)
register_node("XNNDepthwiseConv2d", _build_depthwise)
register_node("XNNConvTranspose2d", _build_deconv)
register_node("XNNMaxPooling2d", _build_pool)
register_node("XNNAvgPooling2d", _build_pool)
register_node("XNNGlobalAvgPooling2d", _build_global_avg)
register_node("XNNStaticTranspose", _build_transpose)
register_node("XNNStaticReshape", _build_reshape)
register_node("XNNStaticSlice", _build_slice)
register_node("XNNStaticConstantPad", _build_pad)
register_node("XNNStaticResizeBilinear2D", _build_resize)
