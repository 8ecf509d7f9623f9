"""The handle's executor: the subgraph's compiled steps, heavy operators cut into tiles.

At ``init`` the subgraph is loaded as an ordinary orchestra :class:`~orchestra.runtime.Method`
(its own arenas, its compiled steps). The executor then walks the steps and replaces those of
heavy operators whose arguments are all static (constants, or planned tensors of static
shape, so their arrays never move) with a *tiled* step: the operator's work cut into a fixed
number of independent tiles, each writing a disjoint part of the output, run by the handle's
:class:`~._pool.WorkerPool`. Every other step runs exactly as orchestra's interpreter runs it
(its optimised steps included, see ``CompiledPlan``); a step the interpreter fused from
several instructions (a convolution with its batch norm folded in) runs as those
instructions, as written, when one of them is tiled.

The tiling is decided once, from the static shapes, and does not depend on ``num_threads``:
a tile computes the same thing on any thread, so results are bit-identical for every
thread count (BLAS results depend on the shapes of the products it is given, so the shapes
must not change with the thread count). ``num_threads`` only says how many threads share
the tiles at the next execute.

How each operator is cut:

- ``aten::convolution.out``, 2-d, ``groups == 1``: im2col + one matrix product per tile of
  output rows (spatial). The padded input is filled once per execute (tiles of channels);
  each row tile then gathers its own im2col columns and multiplies. Cutting by output
  channels would rebuild the whole im2col in every tile (each kernel call on a slice of the
  weight gathers all columns again) and made no gain when measured.
- ``aten::convolution.out`` with ``groups > 1`` (depthwise included): orchestra's kernel on
  whole groups: input channels, weight, bias and output channels of groups ``g0..g1``.
- ``aten::mm.out`` / ``aten::addmm.out`` / ``aten::linear.out``: rows of the output (columns
  when there are too few rows, e.g. a batch of one); ``aten::bmm.out``: batch entries.
- max/avg pooling, inference batch norm, and large elementwise operators: orchestra's kernel
  on slices along the leading non-trivial dimension (channels for a batch of one).

This module reads the Method's compiled plan and value list (``Method._cp``, ``_vals``,
``_set_inputs``): it is an executor over orchestra's own steps, not a second interpreter.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from orchestra.errors import BackendError, Error, OrchestraError
from orchestra.program import DelegateCall, Int, JumpFalseCall, KernelCall, MoveCall, Tensor
from orchestra.runtime import Method
from orchestra.runtime.kernels import get_kernel

from ._pool import WorkerPool

__all__ = ["MIN_TILE_ELEMENTS", "MIN_TILE_MACS", "Executor", "TiledOp", "plan_tiled_op"]

# A tile gets at least this much work: multiply-accumulates for products and convolutions,
# elements for the rest (a hand-off to a worker costs ~10-40 µs).
MIN_TILE_MACS = 1 << 20
MIN_TILE_ELEMENTS = 1 << 17
# Row tiles of a matrix product hold a multiple of this many rows (whole BLAS micro-tiles).
ROW_ALIGN = 8

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

_UNARY = frozenset({
    "aten::relu.out", "aten::sigmoid.out", "aten::tanh.out", "aten::silu.out", "aten::gelu.out",
    "aten::hardtanh.out", "aten::clamp.out", "aten::leaky_relu.out", "aten::elu.out",
    "aten::hardswish.out", "aten::hardsigmoid.out", "aten::exp.out", "aten::neg.out",
    "aten::abs.out", "aten::sqrt.out", "aten::rsqrt.out",
})
_BINARY = frozenset({
    "aten::add.out", "aten::sub.out", "aten::mul.out", "aten::div.out",
    "aten::maximum.out", "aten::minimum.out",
})


# ---------------------------------------------------------------------------------------
# Tiles


def _bounds(size: int, tiles: int, align: int = 1) -> list[int]:
    """``tiles + 1`` increasing boundaries splitting ``range(size)`` evenly, each inner
    boundary a multiple of ``align`` (fewer tiles when ``size`` is too small for that)."""
    units = -(-size // align)
    tiles = max(1, min(tiles, units))
    bounds = [min(size, (units * k // tiles) * align) for k in range(tiles + 1)]
    bounds[-1] = size
    return sorted(set(bounds))


def _count(work: int, per_tile: int, limit: int, max_tiles: int) -> int:
    return max(1, min(max_tiles, work // per_tile, limit))


class TiledOp:
    """One operator cut into tiles: ``phases`` run one after the other, each a (tile
    function, tile count) pair run on the pool."""

    __slots__ = ("name", "tiles", "phases")

    def __init__(self, name: str, phases: Sequence[tuple[Callable[[int], None], int]]) -> None:
        self.name = name
        self.phases = tuple(phases)
        self.tiles = max(n for _, n in self.phases)

    def __repr__(self) -> str:
        return f"<TiledOp {self.name} tiles={[n for _, n in self.phases]}>"


class _Sliced:
    """An orchestra kernel called once per tile on fixed slices of its arguments."""

    __slots__ = ("fn", "calls", "outs")

    def __init__(self, fn: Callable[..., Any], calls: list[tuple[Any, ...]], outs: tuple[int, ...]) -> None:
        self.fn = fn
        self.calls = calls
        self.outs = outs

    def tile(self, k: int) -> None:
        args = self.calls[k]
        res = self.fn(*args)
        outs = self.outs
        if len(outs) == 1:
            o = args[outs[0]]
            if res is not o:
                np.copyto(o, res, casting="unsafe")
            return
        for p, r in zip(outs, res):
            o = args[p]
            if r is not o:
                np.copyto(o, r, casting="unsafe")


def _cut(a: Any, axis: int | None, lo: int, hi: int) -> Any:
    if axis is None or not isinstance(a, np.ndarray):
        return a
    idx = [slice(None)] * a.ndim
    idx[axis] = slice(lo, hi)
    return a[tuple(idx)]


def _sliced(name: str, fn: Callable[..., Any], args: list[Any], cuts: dict[int, tuple[int, int]],
            bounds: list[int], outs: tuple[int, ...],
            override: dict[int, Callable[[int, int], Any]] | None = None) -> TiledOp:
    """``cuts[p] = (axis, unit)``: argument ``p`` is sliced along ``axis`` to
    ``[lo * unit, hi * unit)`` for the tile ``[lo, hi)`` of ``bounds``."""
    calls = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        call = list(args)
        for p, (axis, unit) in cuts.items():
            call[p] = _cut(args[p], axis, lo * unit, hi * unit)
        for p, f in (override or {}).items():
            call[p] = f(lo, hi)
        calls.append(tuple(call))
    s = _Sliced(fn, calls, outs)
    return TiledOp(name, [(s.tile, len(calls))])


# ---------------------------------------------------------------------------------------
# Convolution, groups == 1: im2col per tile of output rows


class _Conv2d:
    """``out = conv2d(x, w) + bias`` for one group, cut into tiles of output rows.

    Phase 1 copies x into a zero-bordered padded buffer owned by this op (tiles of
    channels; the border is zeroed once, at init). Phase 2: each tile of output rows gathers
    its im2col columns from the padded buffer into its own scratch and multiplies. Stride-1
    convolutions gather whole padded rows (each im2col row a contiguous run; the extra
    columns are cropped when the bias is added), as orchestra's kernel does.
    """

    def __init__(self, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, out: np.ndarray,
                 stride: tuple[int, int], padding: tuple[int, int], dilation: tuple[int, int],
                 tiles: int) -> None:
        n, c, h, wd = x.shape
        o, _, kh, kw = w.shape
        sh, sw = stride
        ph, pw = padding
        dh, dw = dilation
        ho, wo = out.shape[2:]
        dt = x.dtype
        self.x, self.out = x, out
        self.w2 = np.ascontiguousarray(w.reshape(o, c * kh * kw))
        k = c * kh * kw
        self.pointwise = kh == kw == 1 and sh == sw == 1 and ph == pw == 0
        self.bias2 = None if bias is None else bias.reshape(o, 1)
        self.bias3 = None if bias is None else bias.reshape(o, 1, 1)
        hp, wp = h + 2 * ph, wd + 2 * pw
        # Row tiles over the batch's rows laid end to end: each tile is one or more segments
        # (batch entry, first row, end row).
        bounds = _bounds(n * ho, tiles)
        self.segments = []
        for g0, g1 in zip(bounds[:-1], bounds[1:]):
            seg = []
            g = g0
            while g < g1:
                b, r0 = divmod(g, ho)
                r1 = min(ho, r0 + g1 - g)
                seg.append((b, r0, r1))
                g += r1 - r0
            self.segments.append(tuple(seg))
        self.jobs: list[list[tuple[Any, ...]]] = []
        if self.pointwise:
            # No gathering: out[b][:, cols] = W @ x[b][:, cols] on column ranges of the planes.
            x3, o3 = x.reshape(n, c, h * wd), out.reshape(n, o, ho * wo)
            for seg in self.segments:
                self.jobs.append([(x3[b][:, r0 * wo:r1 * wo], o3[b][:, r0 * wo:r1 * wo]) for b, r0, r1 in seg])
            self.phases = [(self._pointwise, len(self.jobs))]
            return
        self.wide = sh == 1 and sw == 1
        if self.wide:
            tail = max((kw - 1) * dw, 1)
            self.flat = np.zeros((n, c, hp * wp + tail), dt)
            self.interior = self.flat[:, :, : hp * wp].reshape(n, c, hp, wp)[:, :, ph:ph + h, pw:pw + wd]
        else:
            self.flat = np.zeros((n, c, hp, wp), dt)
            self.interior = self.flat[:, :, ph:ph + h, pw:pw + wd]
        for seg in self.segments:
            job = []
            for b, r0, r1 in seg:
                rows = r1 - r0
                if self.wide:
                    lt = rows * wp
                    s_c, s_l = self.flat.strides[1], self.flat.strides[2]
                    src = np.lib.stride_tricks.as_strided(
                        self.flat[b, :, r0 * wp:], shape=(c, kh, kw, lt),
                        strides=(s_c, dh * wp * s_l, dw * s_l, s_l), writeable=False)
                    cols = np.empty((k, lt), dt)
                    tmp = np.empty((o, lt), dt)
                    crop = tmp.reshape(o, rows, wp)[:, :, :wo]
                    job.append((src, cols, cols.reshape(c, kh, kw, lt), tmp, crop, out[b][:, r0:r1, :]))
                else:
                    lt = rows * wo
                    s_c, s_h, s_w = self.flat.strides[1:]
                    src = np.lib.stride_tricks.as_strided(
                        self.flat[b, :, r0 * sh:], shape=(c, kh, kw, rows, wo),
                        strides=(s_c, dh * s_h, dw * s_w, sh * s_h, sw * s_w), writeable=False)
                    cols = np.empty((k, lt), dt)
                    dst = out[b].reshape(o, ho * wo)[:, r0 * wo:r1 * wo]
                    job.append((src, cols, cols.reshape(c, kh, kw, rows, wo), None, None, dst))
            self.jobs.append(job)
        self.fill_bounds = _bounds(c, tiles)
        self.phases = [(self._fill, len(self.fill_bounds) - 1), (self._rows, len(self.jobs))]

    def _fill(self, k: int) -> None:
        lo, hi = self.fill_bounds[k], self.fill_bounds[k + 1]
        np.copyto(self.interior[:, lo:hi], self.x[:, lo:hi])

    def _rows(self, k: int) -> None:
        w2 = self.w2
        for src, cols, cols_view, tmp, crop, dst in self.jobs[k]:
            np.copyto(cols_view, src)
            if tmp is not None:  # wide: product over padded rows, cropped into out
                np.matmul(w2, cols, out=tmp)
                if self.bias3 is not None:
                    np.add(crop, self.bias3, out=dst)
                else:
                    np.copyto(dst, crop)
            else:
                np.matmul(w2, cols, out=dst)
                if self.bias2 is not None:
                    np.add(dst, self.bias2, out=dst)

    def _pointwise(self, k: int) -> None:
        w2 = self.w2
        for src, dst in self.jobs[k]:
            np.matmul(w2, src, out=dst)
            if self.bias2 is not None:
                np.add(dst, self.bias2, out=dst)


# ---------------------------------------------------------------------------------------
# Planning: which steps become tiled, and how


def _plan_conv(name: str, fn: Callable[..., Any], a: list[Any], max_tiles: int) -> TiledOp | None:
    x, w, bias, stride, padding, dilation, transposed, _, groups, out = a
    if transposed or x.ndim != 4 or w.ndim != 4 or out.ndim != 4:
        return None
    if not (len(stride) == len(padding) == len(dilation) == 2):
        return None
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    groups = int(groups)
    ho, wo = out.shape[2:]
    macs = out.size * cg * kh * kw
    if groups < 1 or c != cg * groups or o % groups or out.shape[:2] != (n, o):
        return None
    if groups > 1:
        # Whole groups per tile: input channels, weight rows, bias and output channels.
        t = _count(macs, MIN_TILE_MACS, groups, max_tiles)
        if t < 2:
            return None
        og = o // groups
        cuts = {0: (1, cg), 1: (0, og), 9: (1, og)}
        if bias is not None:
            cuts[2] = (0, og)
        return _sliced(name, fn, a, cuts, _bounds(groups, t), (9,), override={8: lambda lo, hi: hi - lo})
    dt = x.dtype
    if (dt not in _FLOATS or w.dtype != dt or out.dtype != dt or (bias is not None and (bias.dtype != dt or bias.shape != (o,)))
            or not out.flags.c_contiguous or not out.flags.writeable):
        return None
    sh, sw = (int(s) for s in stride)
    ph, pw = (int(p) for p in padding)
    dh, dw = (int(d) for d in dilation)
    if min(sh, sw, dh, dw) < 1 or min(ph, pw) < 0:
        return None
    if (ho, wo) != ((h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1):
        return None
    t = _count(macs, MIN_TILE_MACS, n * ho, max_tiles)
    if t < 2:
        return None
    conv = _Conv2d(x, w, bias, out, (sh, sw), (ph, pw), (dh, dw), t)
    if conv.pointwise and np.may_share_memory(x, out):
        return None
    return TiledOp(name, conv.phases)


def _plan_matmul(name: str, fn: Callable[..., Any], a: list[Any], max_tiles: int) -> TiledOp | None:
    if name == "aten::bmm.out":
        s, m2, out = a
        if s.ndim != 3 or m2.ndim != 3 or out.ndim != 3 or out.shape != (s.shape[0], s.shape[1], m2.shape[2]):
            return None
        t = _count(out.size * s.shape[2], MIN_TILE_MACS, s.shape[0], max_tiles)
        if t < 2:
            return None
        return _sliced(name, fn, a, {0: (0, 1), 1: (0, 1), 2: (0, 1)}, _bounds(s.shape[0], t), (2,))
    if name == "aten::mm.out":
        lhs, rhs, out, lhs_p, rhs_p, out_p, bias_p = a[0], a[1], a[2], 0, 1, 2, None
    elif name == "aten::addmm.out":
        lhs, rhs, out, lhs_p, rhs_p, out_p, bias_p = a[1], a[2], a[5], 1, 2, 5, 0
    else:  # aten::linear.out: weight is [N, K]
        lhs, rhs, out, lhs_p, rhs_p, out_p, bias_p = a[0], a[1], a[3], 0, 1, 3, 2
    if lhs.ndim != 2 or rhs.ndim != 2 or out.ndim != 2:
        return None
    m, kk = lhs.shape
    nn = rhs.shape[0] if name == "aten::linear.out" else rhs.shape[1]
    if out.shape != (m, nn):
        return None
    macs = m * nn * kk
    bias = a[bias_p] if bias_p is not None else None
    if m >= 2 * ROW_ALIGN:
        t = _count(macs, MIN_TILE_MACS, m // ROW_ALIGN, max_tiles)
        if t < 2:
            return None
        cuts = {lhs_p: (0, 1), out_p: (0, 1)}
        if name == "aten::addmm.out" and isinstance(bias, np.ndarray) and bias.ndim == 2 and bias.shape[0] == m:
            cuts[bias_p] = (0, 1)
        return _sliced(name, fn, a, cuts, _bounds(m, t, ROW_ALIGN), (out_p,))
    # Too few rows (a batch of one): columns of the output.
    t = _count(macs, MIN_TILE_MACS, nn // 64, max_tiles)
    if t < 2:
        return None
    cuts = {rhs_p: (0 if name == "aten::linear.out" else 1, 1), out_p: (1, 1)}
    if isinstance(bias, np.ndarray) and bias.ndim >= 1 and bias.shape[-1] == nn:
        cuts[bias_p] = (bias.ndim - 1, 1)
    return _sliced(name, fn, a, cuts, _bounds(nn, t, 64), (out_p,))


def _lead_axis(shape: tuple[int, ...]) -> int | None:
    """The first dimension that isn't 1 (slices along it are contiguous in a contiguous array)."""
    for d, s in enumerate(shape):
        if s > 1:
            return d
    return None


def _plan_elementwise(name: str, fn: Callable[..., Any], a: list[Any], names: list[str], max_tiles: int) -> TiledOp | None:
    try:
        out_p = names.index("out")
    except ValueError:
        return None
    out = a[out_p]
    if not isinstance(out, np.ndarray) or out.ndim == 0:
        return None
    axis = _lead_axis(out.shape)
    if axis is None:
        return None
    size = out.shape[axis]
    t = _count(out.size, MIN_TILE_ELEMENTS, size, max_tiles)
    if t < 2:
        return None
    cuts: dict[int, tuple[int, int]] = {out_p: (axis, 1)}
    tensors = ("self", "other") if name in _BINARY else ("self",)
    for p, (pn, v) in enumerate(zip(names, a)):
        if p == out_p:
            continue
        if pn in tensors:
            if not isinstance(v, np.ndarray):
                continue  # a Python scalar operand
            d = axis - (out.ndim - v.ndim)  # broadcasting aligns dimensions from the right
            if d >= 0 and v.shape[d] == size:
                cuts[p] = (d, 1)
            elif d >= 0 and v.shape[d] != 1:
                return None
        elif isinstance(v, np.ndarray):
            return None  # an unexpected tensor argument: leave the op alone
    return _sliced(name, fn, a, cuts, _bounds(size, t), (out_p,))


def _plan_channels(name: str, fn: Callable[..., Any], a: list[Any], max_tiles: int) -> TiledOp | None:
    """Pooling and inference batch norm: slices along batch or channels, never the planes."""
    if name == "aten::_native_batch_norm_legit_no_training.out":
        x, out, o1, o2 = a[0], a[7], a[8], a[9]
        if x.ndim < 2 or out.shape != x.shape or o1.size or o2.size:
            return None
        c = x.shape[1]
        t = _count(x.size, MIN_TILE_ELEMENTS, c, max_tiles)
        if t < 2:
            return None
        cuts = {0: (1, 1), 7: (1, 1)}
        for p in (1, 2, 3, 4):
            if isinstance(a[p], np.ndarray):
                if a[p].shape != (c,):
                    return None
                cuts[p] = (0, 1)
        return _sliced(name, fn, a, cuts, _bounds(c, t), (7, 8, 9))
    x = a[0]
    outs = (6, 7) if name == "aten::max_pool2d_with_indices.out" else (7,)
    if x.ndim not in (3, 4) or any(a[p].ndim != x.ndim or a[p].shape[:-2] != x.shape[:-2] for p in outs):
        return None
    axis = _lead_axis(x.shape[:-2])
    if axis is None:
        return None
    size = x.shape[axis]
    kernel_size = a[1] if isinstance(a[1], list) else [a[1]]
    t = _count(a[outs[0]].size * math.prod(int(k) for k in kernel_size), MIN_TILE_ELEMENTS, size, max_tiles)
    if t < 2:
        return None
    cuts = {0: (axis, 1), **{p: (axis, 1) for p in outs}}
    return _sliced(name, fn, a, cuts, _bounds(size, t), outs)


def plan_tiled_op(name: str, args: list[Any], max_tiles: int) -> TiledOp | None:
    """How operator ``name`` with these (static) argument values is cut into at most
    ``max_tiles`` tiles, or None to leave it to orchestra's step."""
    if max_tiles < 2:
        return None
    kd = get_kernel(name)
    if kd is None:
        return None
    fn = kd.fn
    if name == "aten::convolution.out":
        return _plan_conv(name, fn, args, max_tiles)
    if name in ("aten::mm.out", "aten::addmm.out", "aten::linear.out", "aten::bmm.out"):
        return _plan_matmul(name, fn, args, max_tiles)
    if name in ("aten::max_pool2d_with_indices.out", "aten::avg_pool2d.out",
                "aten::_native_batch_norm_legit_no_training.out"):
        return _plan_channels(name, fn, args, max_tiles)
    if name in _UNARY or name in _BINARY:
        names = list(inspect.signature(fn).parameters)[: kd.num_params]
        return _plan_elementwise(name, fn, args, names, max_tiles)
    return None


# ---------------------------------------------------------------------------------------
# The executor


class Executor:
    """Runs one loaded subgraph (a Method) with some steps replaced by tiled ones."""

    __slots__ = ("method", "pool", "tiled", "_steps", "_spans", "_jumps", "_out_idx", "_n_in", "_in_views", "threads", "where")

    def __init__(self, method: Method, pool: WorkerPool, where: str, max_tiles: int) -> None:
        self.method = method
        self.pool = pool
        self.where = where
        self.threads = 1
        cp = method._cp
        plan = cp.plan
        vals = method._vals
        instructions = [ins.instr_args for chain in plan.chains for ins in chain.instructions]
        # Values some instruction writes: a scalar or list member among them may change
        # between executes, so an op reading one is not static.
        written: set[int] = set()
        for a in instructions:
            if isinstance(a, KernelCall):
                kd = get_kernel(plan.operators[a.op_index].qualified_name)
                written.update(a.args[kd.num_params:] if kd is not None else a.args)
            elif isinstance(a, DelegateCall):
                written.update(a.args)
            elif isinstance(a, MoveCall):
                written.add(a.move_to)
        tiled_at: dict[int, Callable[[list[Any], Method], None]] = {}  # instruction -> its tiled step
        tiled: list[TiledOp] = []
        for pc, a in enumerate(instructions):
            if not isinstance(a, KernelCall):
                continue
            name = plan.operators[a.op_index].qualified_name
            kd = get_kernel(name)
            if kd is None:
                continue
            params = a.args[: kd.num_params]
            static = self._static_args(params, vals, cp, written)
            if static is None:
                continue
            try:
                op = plan_tiled_op(name, static, max_tiles)
            except (ValueError, TypeError, IndexError, OrchestraError):
                op = None  # arguments the planner doesn't understand: orchestra's step runs it
            if op is None:
                continue
            tiled.append(op)
            tiled_at[pc] = self._tiled_step(op, pc)
        # The Method's optimised steps, except that a step covering a tiled instruction (a
        # convolution with its batch norm folded in, a matmul reading permuted operands as
        # views, say) runs its instructions as written, each in its own place in the plan
        # (a fused step runs at its last instruction's), the tiled ones tiled.
        placed: list[tuple[int, Callable[[list[Any], Method], Any], tuple[int, ...]]] = []
        for step, span in zip(cp.steps, cp.step_spans):
            if any(pc in tiled_at for pc in span):
                placed.extend((pc, tiled_at.get(pc, cp.instruction_steps[pc]), (pc,)) for pc in span)
            else:
                placed.append((span[-1], step, span))
        placed.sort(key=lambda e: e[0])
        steps = [step for _, step, _ in placed]
        spans = [span for _, _, span in placed]
        self.tiled = tuple(tiled)
        self._steps = tuple(steps)
        self._spans = tuple(spans)
        self._jumps = any(isinstance(a, JumpFalseCall) for a in instructions)
        self._out_idx = cp.output_idx
        self._n_in = len(cp.input_idx)
        # Inputs with planned memory of static shape: copied straight into their arrays
        # (anything else goes through the Method's checks, which also name what is wrong).
        views = [vals[i] if cp.slots[i] is not None and not cp.slots[i].dynamic else None for i in cp.input_idx]
        self._in_views = tuple(views) if all(v is not None for v in views) else None

    @staticmethod
    def _static_args(params: Sequence[int], vals: list[Any], cp: Any, written: set[int]) -> list[Any] | None:
        """The values of ``params`` when every one is fixed for the Method's lifetime (a
        constant, a planned tensor of static shape, a literal, a list of literal ints), else None."""
        values = cp.plan.values
        out = []
        for i in params:
            slot = cp.slots[i]
            v = vals[i]
            if slot is not None:
                if slot.dynamic:
                    return None
            elif i in cp.lists:
                _, items = cp.lists[i]
                if any(j >= 0 and (j in written or not isinstance(values[j].val, Int)) for j in items):
                    return None  # computed members, or a tensor list
                v = list(v)
            elif isinstance(values[i].val, Tensor):
                if not isinstance(v, np.ndarray):
                    return None  # an unplanned tensor: its array changes at run time
            elif i in written:
                return None  # a scalar computed at run time
            out.append(v)
        return out

    def _tiled_step(self, op: TiledOp, pc: int) -> Callable[[list[Any], Method], None]:
        pool = self.pool
        phases = op.phases

        def step(vals: list[Any], m: Method) -> None:
            threads = self.threads
            for tile, count in phases:
                pool.run(tile, count, threads)

        step.__qualname__ = f"step[{pc}] {op.name} (tiled)"
        return step

    def execute(self, args: list[Any], threads: int) -> None:
        """Runs the subgraph on ``args`` (inputs then outputs, as a DelegateCall passes
        them), writing the outputs into their arrays."""
        m = self.method
        n = self._n_in
        self.threads = threads
        self.pool.used.clear()
        views = self._in_views
        if views is None:
            m._set_inputs(args[:n])
        else:
            for view, x in zip(views, args):
                if type(x) is not np.ndarray or x.shape != view.shape or x.dtype != view.dtype:
                    m._set_inputs(args[:n])
                    break
                np.copyto(view, x)
        vals = m._vals
        steps = self._steps
        pc = 0
        try:
            if not self._jumps:
                for pc, step in enumerate(steps):  # noqa: B007  (pc names the failing step)
                    step(vals, m)
            else:
                count = len(steps)
                while pc < count:
                    nxt = steps[pc](vals, m)
                    pc = pc + 1 if nxt is None else nxt
        except OrchestraError:
            raise
        except Exception as exc:
            name = getattr(steps[pc], "__qualname__", f"step[{pc}]").split(" ", 1)[-1]
            span = self._spans[pc]
            which = f"instruction {span[0]}" if len(span) == 1 else f"instructions {span[0]}-{span[-1]}"
            raise BackendError(f"{self.where}: {which} ({name}) failed: "
                               f"{type(exc).__name__}: {exc}", Error.Internal) from exc
        for k, i in enumerate(self._out_idx):
            v = vals[i]
            dst = args[n + k]
            if isinstance(dst, np.ndarray) and isinstance(v, np.ndarray) and dst.shape == v.shape:
                np.copyto(dst, v, casting="unsafe")
            else:
                args[n + k] = np.array(v, copy=True) if isinstance(v, np.ndarray) else v
