"""Pooling and resampling: max/avg pool 2-d, adaptive average pool, nearest/bilinear upsample."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ._registry import kernel
from ._util import ALL, FLOAT_MATH, REAL_MATH, bad, check_fits, check_scratch, dest, finish, int_list

__all__: list[str] = []

_I64 = np.dtype(np.int64)


def _as4d(op: str, x: np.ndarray) -> np.ndarray:
    if x.ndim == 4:
        return x
    if x.ndim == 3:
        return x[None]
    raise bad(op, f"expected a 3-d or 4-d input, got shape {tuple(x.shape)}")


def _restore(x: np.ndarray, like: np.ndarray) -> np.ndarray:
    return x[0] if like.ndim == 3 else x


def _pool_size(op: str, size: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    num = size + 2 * p - d * (k - 1) - 1
    if ceil:
        o = -(-num // s) + 1
        if (o - 1) * s >= size + p:
            o -= 1
    else:
        o = num // s + 1
    if o <= 0:
        raise bad(op, f"output size is {o} for input size {size}, kernel {k}, stride {s}, padding {p}")
    return o


def _pool_args(
    op: str, kernel_size: Any, stride: Any, padding: Any, dilation: Any
) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int], tuple[int, int]]:
    k = int_list(kernel_size, 2, op, "kernel_size")
    s = int_list(stride, 2, op, "stride") if stride is not None and len(stride) else k
    p = int_list(padding, 2, op, "padding")
    d = int_list(dilation, 2, op, "dilation")
    if min(k) < 1 or min(s) < 1 or min(d) < 1 or min(p) < 0:
        raise bad(op, f"invalid kernel_size {k}, stride {s}, padding {p} or dilation {d}")
    for kk, pp, dd in zip(k, p, d):
        if pp > ((kk - 1) * dd + 1) // 2:
            raise bad(op, f"padding {p} must be at most half of the effective kernel size {k}")
    return k, s, p, d


def _padded(x: np.ndarray, ph: int, pw: int, hp: int, wp: int, fill: Any) -> np.ndarray:
    """``x`` (N, C, H, W) placed at (ph, pw) in an (hp, wp) plane filled with ``fill``."""
    n, c, h, w = x.shape
    if ph == 0 and pw == 0 and hp <= h and wp <= w:
        return x
    check_scratch("pool", (n, c, max(hp, ph + h), max(wp, pw + w)), x.itemsize, "padded input")
    xp = np.full((n, c, max(hp, ph + h), max(wp, pw + w)), fill, x.dtype)
    xp[:, :, ph : ph + h, pw : pw + w] = x
    return xp


def _first_valid(starts: np.ndarray, d: int) -> np.ndarray:
    # First window tap inside the input, stepping by the dilation (torch's start index).
    neg = starts < 0
    return np.where(neg, starts + ((-starts + d - 1) // d) * d, starts)


def _buffer(
    out: Any, shape: tuple[int, ...], shape4: tuple[int, ...], dt: np.dtype, x: np.ndarray
) -> tuple[np.ndarray, bool]:
    """A 4-d buffer to compute in (a view of ``out`` when it fits) and whether it is ``out``."""
    o = dest(out, shape, dt)
    if o is None or not o.flags.c_contiguous or np.may_share_memory(o, x):
        check_fits("pool", shape, out if o is None else x)
        return np.empty(shape4, dt), False
    return o.reshape(shape4), True


# Below this many input elements, strided tap views are cheaper than splitting into phases.
_PHASE_MIN_SIZE = 1 << 16


def _tap_views(
    x: np.ndarray,
    fill: Any,
    k: tuple[int, int],
    s: tuple[int, int],
    p: tuple[int, int],
    d: tuple[int, int],
    o: tuple[int, int],
) -> Any:
    """``view(i, j)``: the (N, C, Ho, Wo) values under kernel tap (i, j) for every output,
    reading ``x`` padded with ``fill``.

    For strides > 1 the padded input is built directly as its stride phases (plane
    ``(a, b)`` holds padded rows ``a::sh`` and columns ``b::sw``), so every tap view is
    unit-stride along W instead of reading every sh-th / sw-th element.
    """
    (kh, kw), (sh, sw), (ph, pw), (dh, dw), (ho, wo) = k, s, p, d, o
    n, c, h, w = x.shape
    # Padded extent the windows reach (ceil_mode windows may run past the right padding).
    hp = max(ph + h, (ho - 1) * sh + (kh - 1) * dh + 1)
    wp = max(pw + w, (wo - 1) * sw + (kw - 1) * dw + 1)
    check_scratch("pool", (n, c, hp, wp), x.itemsize, "padded input")
    if (sh == 1 and sw == 1) or x.size < _PHASE_MIN_SIZE:
        # One padded copy (none without padding); taps are strided views of it.
        if ph == 0 and pw == 0 and hp == h and wp == w:
            xp = x
        else:
            xp = np.full((n, c, hp, wp), fill, x.dtype)
            xp[:, :, ph : ph + h, pw : pw + w] = x
        return lambda i, j: xp[
            :, :, i * dh : i * dh + sh * (ho - 1) + 1 : sh, j * dw : j * dw + sw * (wo - 1) + 1 : sw
        ]
    phases: dict[tuple[int, int], np.ndarray] = {}
    for a in sorted({(i * dh) % sh for i in range(kh)}):
        for b in sorted({(j * dw) % sw for j in range(kw)}):
            hq, wq = -(-(hp - a) // sh), -(-(wp - b) // sw)
            m0, m1 = -(-(ph - a) // sh), -(-(ph + h - a) // sh)
            n0, n1 = -(-(pw - b) // sw), -(-(pw + w - b) // sw)
            plane = np.full((n, c, hq, wq), fill, x.dtype)
            if m1 > m0 and n1 > n0:
                r0, c0 = a + sh * m0 - ph, b + sw * n0 - pw
                plane[:, :, m0:m1, n0:n1] = x[:, :, r0::sh, c0::sw][:, :, : m1 - m0, : n1 - n0]
            phases[a, b] = plane

    def view(i: int, j: int) -> np.ndarray:
        r, q = i * dh, j * dw
        plane = phases[r % sh, q % sw]
        return plane[:, :, r // sh : r // sh + ho, q // sw : q // sw + wo]

    return view


# Up to this many input elements, _max_pool_inside (a fixed number of numpy calls, more
# memory traffic) beats the general path (a few numpy calls per kernel tap).
_INSIDE_MAX_SIZE = 1 << 15


def _inside_geometry(
    x: np.ndarray,
    kernel_size: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    ceil_mode: bool,
    out: Any,
) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int], tuple[int, int]] | None:
    """(kernel, stride, dilation, output size) when max pooling may take the fast path: a
    small 3-d or 4-d real input whose windows all lie inside it (no padding, no ceil_mode
    overhang), and ``out`` a writable array of the result's shape and dtype that doesn't
    overlap ``x`` (``x`` is re-read if a window holds NaN). Else None."""
    if not (
        type(out) is np.ndarray
        and 3 <= x.ndim <= 4
        and x.dtype.kind in "fiu"
        and out.dtype == x.dtype
        and x.size
        and 1 <= len(kernel_size) <= 2
        and (stride is None or len(stride) <= 2)
        and 1 <= len(padding) <= 2
        and 1 <= len(dilation) <= 2
        and not any(padding)
        and x.size <= _INSIDE_MAX_SIZE
    ):
        return None
    kh, kw = kernel_size[0], kernel_size[-1]
    sh, sw = (stride[0], stride[-1]) if stride else (kh, kw)
    dh, dw = dilation[0], dilation[-1]
    h, w = x.shape[-2], x.shape[-1]
    if min(kh, kw, sh, sw, dh, dw) < 1 or h < dh * (kh - 1) + 1 or w < dw * (kw - 1) + 1:
        return None
    ho = (h - dh * (kh - 1) - 1) // sh + 1
    wo = (w - dw * (kw - 1) - 1) // sw + 1
    if (
        (not ceil_mode or ((h - dh * (kh - 1) - 1) % sh == 0 and (w - dw * (kw - 1) - 1) % sw == 0))
        and out.shape == x.shape[:-2] + (ho, wo)
        and out.flags.writeable
        and not np.may_share_memory(out, x)
    ):
        return (kh, kw), (sh, sw), (dh, dw), (ho, wo)
    return None


def _inside_max(
    x: np.ndarray,
    k: tuple[int, int],
    s: tuple[int, int],
    d: tuple[int, int],
    o: tuple[int, int],
    out: np.ndarray,
) -> np.ndarray | None:
    """The values of the fast path (see :func:`_max_pool_inside`) written into ``out``: returns
    the gathered ``taps`` (kh, kw, N, C, Ho, Wo), or None when a window holds NaN (``out``
    then holds NaN there, and the caller's general path recomputes it)."""
    (kh, kw), (sh, sw), (dh, dw), (ho, wo) = k, s, d, o
    n, c, h, w = x.shape
    sn, sc, sy, sx = x.strides
    shape = (kh, kw, n, c, ho, wo)
    strides = (dh * sy, dw * sx, sn, sc, sh * sy, sw * sx)
    if x.flags.c_contiguous:
        view = np.ndarray(shape, x.dtype, x, 0, strides)
    else:
        view = as_strided(x, shape, strides, writeable=False)
    taps = np.ascontiguousarray(view)
    best = np.maximum.reduce(taps, axis=(0, 1), out=out)  # propagates NaN
    if x.dtype.kind == "f":
        # NaN check: a sum of squares is NaN only if some value is (inf stays inf, and
        # np.vdot, unlike a ufunc, raises no floating-point warnings).
        ss = np.vdot(best, best)
        if ss != ss:
            return None
    return taps


def _max_pool_inside(
    x: np.ndarray,
    k: tuple[int, int],
    s: tuple[int, int],
    d: tuple[int, int],
    o: tuple[int, int],
    out: np.ndarray,
    indices: np.ndarray,
) -> bool:
    """Max pooling of 4-d ``x`` when every window lies inside the input (no padding, no
    ceil_mode overhang), in a fixed handful of whole-array numpy calls whatever the kernel:
    on small inputs the cost is the number of calls (per-row arg-reductions and masked
    ufuncs are slow in numpy).

    ``taps`` (kh, kw, N, C, Ho, Wo) holds every window tap, gathered by one copy of a strided
    view of ``x``; the values are its max over the two tap axes. Within a window the input
    offsets ``h * W + w`` of the taps grow with the tap number, so the first tap holding the
    max (torch moves on only to a strictly greater value) is the one with the smallest
    offset among the taps equal to the max; the offsets are one strided view of a ramp.
    Writes ``out`` and ``indices`` (4-d, int64) and returns True; returns False when a window
    holds NaN (torch reports its last NaN; the caller's general path handles that).
    """
    taps = _inside_max(x, k, s, d, o, out)
    if taps is None:
        return False
    (kh, kw), (sh, sw), (dh, dw), (ho, wo) = k, s, d, o
    h, w = x.shape[-2:]
    ramp = np.arange(h * w, dtype=np.int64)
    pos = np.ndarray((kh, kw, 1, 1, ho, wo), np.int64, ramp, 0, (dh * w * 8, dw * 8, 0, 0, sh * w * 8, sw * 8))
    pos = np.ascontiguousarray(pos)  # np.where is much slower on strided operands
    np.minimum.reduce(np.where(np.equal(taps, out), pos, h * w), axis=(0, 1), out=indices)
    return True


def _general_geometry(
    op: str, self: np.ndarray, kernel_size: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: bool
) -> tuple[np.ndarray, tuple[int, int], tuple[int, int], tuple[int, int], tuple[int, int], tuple[int, int], Any]:
    """The general path's 4-d input, kernel, stride, padding, dilation, output size and the
    fill value of the padding (the dtype's lowest value); raises on invalid arguments."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = _pool_args(op, kernel_size, stride, padding, dilation)
    x = _as4d(op, self)
    n, c, h, w = x.shape
    ho = _pool_size(op, h, kh, sh, ph, dh, ceil_mode)
    wo = _pool_size(op, w, kw, sw, pw, dw, ceil_mode)
    if x.dtype.kind == "f":
        low: Any = -np.inf
    elif x.dtype.kind == "b":
        low = False
    else:
        low = np.iinfo(x.dtype).min
    return x, (kh, kw), (sh, sw), (ph, pw), (dh, dw), (ho, wo), low


@kernel("aten::max_pool2d_with_indices.out", dtypes=REAL_MATH)
def max_pool2d_with_indices_out(
    self: np.ndarray,
    kernel_size: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    ceil_mode: bool,
    out: np.ndarray,
    indices: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Returns (values, indices); indices are int64 offsets ``h * W + w`` within each plane.

    :func:`max_pool2d_values_out` computes the same values (bit for bit) without the indices.
    """
    x = self
    if type(indices) is np.ndarray and indices.dtype == _I64 and indices.flags.writeable:
        # Fast path: every window inside the input.
        g = _inside_geometry(x, kernel_size, stride, padding, dilation, ceil_mode, out)
        if g is not None and indices.shape == out.shape:
            if x.ndim == 3:
                x4, o4, i4 = x[None], out[None], indices[None]
            else:
                x4, o4, i4 = x, out, indices
            if _max_pool_inside(x4, *g, o4, i4):
                return out, indices
    op = "aten::max_pool2d_with_indices.out"
    x, (kh, kw), (sh, sw), (ph, pw), (dh, dw), (ho, wo), low = _general_geometry(
        op, self, kernel_size, stride, padding, dilation, ceil_mode)
    n, c, h, w = x.shape
    oshape = (n, c, ho, wo)
    best, best_is_out = _buffer(out, self.shape[:-2] + (ho, wo), oshape, x.dtype, self)
    idx, idx_is_out = _buffer(indices, self.shape[:-2] + (ho, wo), oshape, _I64, self)
    ntaps = kh * kw
    tap_view = _tap_views(x, low, (kh, kw), (sh, sw), (ph, pw), (dh, dw), (ho, wo))

    # One forward pass over the taps keeps the running max and, per output, the number of
    # the first tap holding it (torch replaces only on a strictly greater value). The tap
    # number lives in a uint8 array updated with branch-free arithmetic (masked writes with
    # a random mask are ~10x slower in numpy).
    tap_dt = np.dtype(np.uint8 if ntaps <= 256 else np.int64)
    tap = np.zeros(oshape, tap_dt)
    gt = np.empty(oshape, np.bool_)
    delta = np.empty(oshape, tap_dt)
    np.copyto(best, tap_view(0, 0))
    for t in range(1, ntaps):
        v = tap_view(*divmod(t, kw))
        np.greater(v, best, out=gt)
        np.maximum(best, v, out=best)  # propagates NaN, as torch does
        # tap = gt ? t : tap, computed as tap + gt * (t - tap) (exact modulo 2**8).
        np.subtract(tap_dt.type(t), tap, out=delta)
        np.multiply(delta, gt, out=delta, casting="unsafe")
        np.add(tap, delta, out=tap)

    # Tap number -> offset from the window origin (ho * sh - ph, wo * sw - pw).
    ti, tj = np.divmod(np.arange(ntaps, dtype=np.int64), kw)
    offs = ti * dh * w + tj * dw
    np.take(offs, tap, out=idx)
    rows = np.arange(ho, dtype=np.int64) * sh - ph
    cols = np.arange(wo, dtype=np.int64) * sw - pw
    # Windows whose max is the padding value (-inf / int min): torch reports the first
    # tap inside the input.
    first = (_first_valid(rows, dh) - rows)[:, None] * w + (_first_valid(cols, dw) - cols)[None, :]
    at_low = best == low
    if at_low.any():
        np.copyto(idx, np.broadcast_to(first, oshape), where=at_low)
    if x.dtype.kind == "f":
        nan = np.isnan(best)
        if nan.any():
            # A window holding NaN: torch reports its last NaN.
            for t in range(ntaps):
                i, j = divmod(t, kw)
                np.isnan(tap_view(i, j), out=gt)
                gt &= nan
                np.copyto(idx, i * dh * w + j * dw, where=gt)
    idx += rows[:, None] * w + cols[None, :]
    return (
        out if best_is_out else finish(_restore(best, self), out),
        indices if idx_is_out else finish(_restore(idx, self), indices),
    )


def max_pool2d_values_out(
    self: np.ndarray,
    kernel_size: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    ceil_mode: bool,
    out: np.ndarray,
) -> np.ndarray:
    """The values of ``aten::max_pool2d_with_indices.out`` without the indices.

    Not an operator of its own: the interpreter binds it in place of
    :func:`max_pool2d_with_indices_out` when no instruction reads the indices (see
    ``CompiledPlan``). It takes the same path as the full kernel would (given an int64
    ``indices`` of ``out``'s shape, as a planned one is) and runs the same numpy calls on the
    values in the same order, so the values are bit-identical to the full kernel's, NaN
    propagation and signed zeros included; only the index bookkeeping is skipped (about 4x
    less work on the small inputs of the fast path).
    """
    x = self
    g = _inside_geometry(x, kernel_size, stride, padding, dilation, ceil_mode, out)
    if g is not None:
        if _inside_max(x[None] if x.ndim == 3 else x, *g, out[None] if x.ndim == 3 else out) is not None:
            return out
    op = "aten::max_pool2d_with_indices.out"
    x, (kh, kw), (sh, sw), (ph, pw), (dh, dw), (ho, wo), low = _general_geometry(
        op, self, kernel_size, stride, padding, dilation, ceil_mode)
    n, c, h, w = x.shape
    best, best_is_out = _buffer(out, self.shape[:-2] + (ho, wo), (n, c, ho, wo), x.dtype, self)
    tap_view = _tap_views(x, low, (kh, kw), (sh, sw), (ph, pw), (dh, dw), (ho, wo))
    np.copyto(best, tap_view(0, 0))
    for t in range(1, kh * kw):
        np.maximum(best, tap_view(*divmod(t, kw)), out=best)  # propagates NaN, as torch does
    return out if best_is_out else finish(_restore(best, self), out)


@kernel("aten::avg_pool2d.out", dtypes=FLOAT_MATH)
def avg_pool2d_out(
    self: np.ndarray,
    kernel_size: list[int],
    stride: list[int],
    padding: list[int],
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: int | None,
    out: np.ndarray,
) -> np.ndarray:
    op = "aten::avg_pool2d.out"
    (kh, kw), (sh, sw), (ph, pw), _ = _pool_args(op, kernel_size, stride, padding, (1, 1))
    if divisor_override is not None and divisor_override == 0:
        raise bad(op, "divisor_override must not be 0")
    x = _as4d(op, self)
    n, c, h, w = x.shape
    ho = _pool_size(op, h, kh, sh, ph, 1, ceil_mode)
    wo = _pool_size(op, w, kw, sw, pw, 1, ceil_mode)
    xp = _padded(x, ph, pw, (ho - 1) * sh + kh, (wo - 1) * sw + kw, 0)
    # Separable window sum: kh row slices, then kw column slices.
    rows = np.array(xp[:, :, 0 : sh * (ho - 1) + 1 : sh, :], copy=True)
    for i in range(1, kh):
        rows += xp[:, :, i : i + sh * (ho - 1) + 1 : sh, :]
    res = np.array(rows[..., 0 : sw * (wo - 1) + 1 : sw], copy=True)
    for j in range(1, kw):
        res += rows[..., j : j + sw * (wo - 1) + 1 : sw]
    if divisor_override is not None:
        res /= divisor_override
    else:
        hs = np.arange(ho) * sh - ph
        ws = np.arange(wo) * sw - pw
        he = np.minimum(hs + kh, h + ph)
        we = np.minimum(ws + kw, w + pw)
        if count_include_pad:
            dh_, dw_ = he - hs, we - ws
        else:
            dh_ = np.minimum(he, h) - np.maximum(hs, 0)
            dw_ = np.minimum(we, w) - np.maximum(ws, 0)
        res /= (dh_[:, None] * dw_[None, :]).astype(res.dtype)
    return finish(_restore(res, self), out)


def _adaptive_bounds(size: int, osize: int) -> tuple[np.ndarray, np.ndarray]:
    i = np.arange(osize, dtype=np.int64)
    return (i * size) // osize, -((-(i + 1) * size) // osize)


def _adaptive_avg(op: str, self: np.ndarray, output_size: Any, out: Any) -> np.ndarray:
    oh, ow = int_list(output_size, 2, op, "output_size")
    x = _as4d(op, self)
    n, c, h, w = x.shape
    if oh <= 0 or ow <= 0:
        raise bad(op, f"output_size must be positive, got {[oh, ow]}")
    if x.dtype.kind != "f":
        raise bad(op, f"expected a floating tensor, got {x.dtype}")
    check_fits(op, self.shape[:-2] + (oh, ow), out)
    check_scratch(op, (n, c, oh, w + 1), 8, "row sums")
    if h % oh == 0 and w % ow == 0:
        res = x.reshape(n, c, oh, h // oh, ow, w // ow).mean(axis=(3, 5))
    else:
        hs, he = _adaptive_bounds(h, oh)
        ws, we = _adaptive_bounds(w, ow)
        cs = np.zeros((n, c, h + 1, w), np.float64)
        np.cumsum(x, axis=2, dtype=np.float64, out=cs[:, :, 1:, :])
        rows = cs[:, :, he, :] - cs[:, :, hs, :]
        cs2 = np.zeros((n, c, oh, w + 1), np.float64)
        np.cumsum(rows, axis=3, out=cs2[..., 1:])
        res = cs2[..., we] - cs2[..., ws]
        res /= ((he - hs)[:, None] * (we - ws)[None, :])
        res = res.astype(x.dtype)
    return finish(_restore(res, self), out)


@kernel("aten::_adaptive_avg_pool2d.out", dtypes=FLOAT_MATH)
def adaptive_avg_pool2d_out_(self: np.ndarray, output_size: list[int], out: np.ndarray) -> np.ndarray:
    return _adaptive_avg("aten::_adaptive_avg_pool2d.out", self, output_size, out)


@kernel("aten::adaptive_avg_pool2d.out", dtypes=FLOAT_MATH)
def adaptive_avg_pool2d_out(self: np.ndarray, output_size: list[int], out: np.ndarray) -> np.ndarray:
    return _adaptive_avg("aten::adaptive_avg_pool2d.out", self, output_size, out)


# --------------------------------------------------------------------------- upsampling


def _out_size(
    op: str, x: np.ndarray, output_size: Any, scale_factors: Any
) -> tuple[int, int, Any, Any]:
    h, w = x.shape[-2:]
    if output_size is not None:
        if scale_factors is not None:
            raise bad(op, "give either output_size or scale_factors, not both")
        oh, ow = int_list(output_size, 2, op, "output_size")
        return oh, ow, None, None
    if scale_factors is None or len(scale_factors) != 2:
        raise bad(op, "expected output_size or two scale_factors")
    fh, fw = float(scale_factors[0]), float(scale_factors[1])
    return int(np.floor(h * fh)), int(np.floor(w * fw)), fh, fw


def _scale(in_size: int, out_size: int, scale: Any, dt: np.dtype) -> Any:
    # ATen's compute_scales_value, in the op's compute precision.
    if scale is not None and scale > 0:
        return dt.type(1.0 / scale)
    return dt.type(in_size) / dt.type(out_size)


def _nearest_index(in_size: int, out_size: int, scale: Any) -> np.ndarray:
    i = np.arange(out_size, dtype=np.int64)
    if out_size == in_size:
        return i
    if out_size == 2 * in_size:
        return i >> 1
    f32 = np.dtype(np.float32)
    src = np.floor(i.astype(np.float32) * _scale(in_size, out_size, scale, f32)).astype(np.int64)
    return np.minimum(src, in_size - 1)


def _nearest(op: str, self: np.ndarray, oh: int, ow: int, sh: Any, sw: Any, out: Any) -> np.ndarray:
    if self.ndim < 3:
        raise bad(op, f"expected an input with at least 3 dims, got {tuple(self.shape)}")
    if oh <= 0 or ow <= 0:
        raise bad(op, f"output size must be positive, got {[oh, ow]}")
    check_fits(op, self.shape[:-2] + (oh, ow), out)
    h, w = self.shape[-2:]
    hidx = _nearest_index(h, oh, sh)
    widx = _nearest_index(w, ow, sw)
    shape = self.shape[:-2] + (oh, ow)
    fh, fw = oh // h, ow // w
    if (
        oh == fh * h
        and ow == fw * w
        and np.array_equal(hidx, np.arange(oh) // fh)
        and np.array_equal(widx, np.arange(ow) // fw)
    ):
        # Integer factors: one broadcasting copy, straight into out.
        o = dest(out, shape, self.dtype)
        if o is None or not o.flags.c_contiguous or np.may_share_memory(o, self):
            o = np.empty(shape, self.dtype)
        o6 = o.reshape(self.shape[:-2] + (h, fh, w, fw))
        o6[...] = self[..., :, None, :, None]
        return finish(o, out)
    res = self[..., hidx[:, None], widx[None, :]]
    return finish(res, out)


@kernel("aten::upsample_nearest2d.vec_out", dtypes=ALL)
def upsample_nearest2d_vec_out(
    input: np.ndarray,  # noqa: A002
    output_size: list[int] | None,
    scale_factors: list[float] | None,
    out: np.ndarray,
) -> np.ndarray:
    op = "aten::upsample_nearest2d.vec_out"
    oh, ow, sh, sw = _out_size(op, input, output_size, scale_factors)
    return _nearest(op, input, oh, ow, sh, sw, out)


@kernel("aten::upsample_nearest2d.out", dtypes=ALL)
def upsample_nearest2d_out(
    self: np.ndarray,
    output_size: list[int],
    scales_h: float | None,
    scales_w: float | None,
    out: np.ndarray,
) -> np.ndarray:
    op = "aten::upsample_nearest2d.out"
    oh, ow = int_list(output_size, 2, op, "output_size")
    return _nearest(op, self, oh, ow, scales_h, scales_w, out)


def _linear_weights(
    in_size: int, out_size: int, align_corners: bool, scale: Any, dt: np.dtype
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    i = np.arange(out_size).astype(dt)
    if align_corners:
        s = dt.type(in_size - 1) / dt.type(out_size - 1) if out_size > 1 else dt.type(0)
        src = s * i
    else:
        s = _scale(in_size, out_size, scale, dt)
        src = s * (i + dt.type(0.5)) - dt.type(0.5)
        src = np.maximum(src, dt.type(0))
    i0 = src.astype(np.int64)
    i1 = np.minimum(i0 + 1, in_size - 1)
    l1 = np.clip(src - i0.astype(dt), 0, 1).astype(dt)
    l0 = (dt.type(1) - l1).astype(dt)
    return i0, i1, l0, l1


def _bilinear(
    op: str, self: np.ndarray, oh: int, ow: int, align_corners: bool, sh: Any, sw: Any, out: Any
) -> np.ndarray:
    if self.ndim < 3:
        raise bad(op, f"expected an input with at least 3 dims, got {tuple(self.shape)}")
    if self.dtype.kind != "f":
        raise bad(op, f"expected a floating tensor, got {self.dtype}")
    if oh <= 0 or ow <= 0:
        raise bad(op, f"output size must be positive, got {[oh, ow]}")
    dt = self.dtype
    h, w = self.shape[-2:]
    check_fits(op, self.shape[:-2] + (oh, ow), out)
    check_scratch(op, self.shape[:-2] + (oh, max(w, ow)), dt.itemsize, "row interpolation")
    h0, h1, lh0, lh1 = _linear_weights(h, oh, align_corners, sh, dt)
    w0, w1, lw0, lw1 = _linear_weights(w, ow, align_corners, sw, dt)
    top = self[..., h0, :]
    bot = self[..., h1, :]
    res = (top[..., w0] * lw0 + top[..., w1] * lw1) * lh0[:, None]
    res += (bot[..., w0] * lw0 + bot[..., w1] * lw1) * lh1[:, None]
    return finish(res, out)


@kernel("aten::upsample_bilinear2d.vec_out", dtypes=FLOAT_MATH)
def upsample_bilinear2d_vec_out(
    input: np.ndarray,  # noqa: A002
    output_size: list[int] | None,
    align_corners: bool,
    scale_factors: list[float] | None,
    out: np.ndarray,
) -> np.ndarray:
    op = "aten::upsample_bilinear2d.vec_out"
    oh, ow, sh, sw = _out_size(op, input, output_size, scale_factors)
    return _bilinear(op, input, oh, ow, align_corners, sh, sw, out)


@kernel("aten::upsample_bilinear2d.out", dtypes=FLOAT_MATH)
def upsample_bilinear2d_out(
    self: np.ndarray,
    output_size: list[int],
    align_corners: bool,
    scales_h: float | None,
    scales_w: float | None,
    out: np.ndarray,
) -> np.ndarray:
    op = "aten::upsample_bilinear2d.out"
    oh, ow = int_list(output_size, 2, op, "output_size")
    return _bilinear(op, self, oh, ow, align_corners, scales_h, scales_w, out)
