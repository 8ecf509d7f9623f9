"""Convolution (1-d and 2-d, strided, padded, dilated, grouped, depthwise)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from orchestra.errors import OrchestraError

from ._registry import kernel
from ._util import F32_64, bad, check_fits, check_scratch, finish, int_list, load_native, unsupported

_native = load_native()  # orchestra's compiled kernels, or None (numpy paths only)

__all__: list[str] = []

_OP = "aten::convolution.out"

# Output maps of fewer pixels than this go to BLAS (a matrix-vector product) rather than the
# compiled product, whose tiles are 16-32 pixels wide (measured on MobileNetV3's
# squeeze-and-excite 1x1 convolutions on 1x1 maps: ~25 us compiled, a few us by np.dot).
_NATIVE_MIN_PIXELS = 8


def _pad_input_flat(x: np.ndarray, ph: int, pw: int, dt: np.dtype, tail: int) -> np.ndarray:
    """x zero-padded to (N, C, H + 2ph, W + 2pw), with the planes flattened and ``tail``
    trailing zeros: (N, C, Hp * Wp + tail)."""
    n, c, h, w = x.shape
    hp, wp = h + 2 * ph, w + 2 * pw
    flat = np.zeros((n, c, hp * wp + tail), dt)
    flat[:, :, : hp * wp].reshape(n, c, hp, wp)[:, :, ph : ph + h, pw : pw + w] = x
    return flat


def _windows(a: np.ndarray, shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    """A read-only strided view of ``a`` (which must contain every element it reaches)."""
    if a.flags.c_contiguous:
        # Much cheaper than as_strided; numpy still checks the view stays inside ``a``.
        v = np.ndarray(shape, a.dtype, a, 0, strides)
        v.flags.writeable = False
        return v
    return as_strided(a, shape=shape, strides=strides, writeable=False)


# Above this many im2col elements (N * C * kh * kw * Ho * Wo), stride-1 convolutions gather
# whole padded rows (contiguous runs) instead of exact windows.
_WIDE_MIN_COLS = 1 << 16


def _phase_planes(x: np.ndarray, stride: tuple[int, int], padding: tuple[int, int], dt: np.dtype,
                  rows: int, reach: int) -> tuple[np.ndarray, int]:
    """(P, wq): ``x`` zero-padded and split into its ``sh x sw`` stride phases, each phase
    flattened: ``P[n, c, a, b]`` holds ``padded[a::sh, b::sw]`` as rows of width ``wq``, at
    least ``rows`` rows plus ``reach`` trailing elements (zeros where past the image)."""
    n, c, h, wd = x.shape
    sh, sw = stride
    ph, pw = padding
    hq, wq = -(-(h + 2 * ph) // sh), -(-(wd + 2 * pw) // sw)
    p = np.zeros((n, c, sh, sw, max(hq, rows) * wq + reach), dt)
    for a in range(sh):
        k0 = -(-(ph - a) // sh) if ph > a else 0  # first phase row inside the image
        y0 = a + k0 * sh - ph
        ny = len(range(y0, h, sh))
        for b in range(sw):
            l0 = -(-(pw - b) // sw) if pw > b else 0
            x0 = b + l0 * sw - pw
            nx = len(range(x0, wd, sw))
            if ny and nx:
                dst = p[:, :, a, b, : hq * wq].reshape(n, c, hq, wq)
                dst[:, :, k0 : k0 + ny, l0 : l0 + nx] = x[:, :, y0::sh, x0::sw]
    return p, wq


def _phase_taps(x: np.ndarray, kh: int, kw: int, stride: tuple[int, int], padding: tuple[int, int],
                dilation: tuple[int, int], res: np.ndarray) -> tuple[list[tuple[int, int, int, int]], np.ndarray, int]:
    """Per kernel tap, its stride phase ``(a, b)`` and row/column shift ``(dy, dx)`` in that
    phase's plane; and the phase planes (:func:`_phase_planes`) tall and wide enough for
    every tap of a ``res``-shaped output."""
    sh, sw = stride
    dh, dw = dilation
    offs = [((i * dh) % sh, (j * dw) % sw, (i * dh // sh), (j * dw // sw))
            for i in range(kh) for j in range(kw)]
    p, wq = _phase_planes(x, stride, padding, res.dtype, res.shape[2] + max(t[2] for t in offs),
                          max(t[3] for t in offs))
    return offs, p, wq


def _conv_phases(x: np.ndarray, w: np.ndarray, b3: np.ndarray | None, stride: tuple[int, int],
                 padding: tuple[int, int], dilation: tuple[int, int], groups: int,
                 res: np.ndarray) -> np.ndarray:
    """Grouped (depthwise included) convolution whose im2col gathers contiguous runs: the
    padded input split into stride phases, each output row computed over a phase's whole
    width (the junk columns past the output are cropped by the bias add), so each kernel tap
    is one slice of a phase plane, one copy of ``ho * wq`` contiguous elements per channel,
    instead of ``ho`` short strided rows. Then one batched GEMM over the groups."""
    n, c, _, _ = x.shape
    o, cg, kh, kw = w.shape
    ho, wo = res.shape[2], res.shape[3]
    offs, p, wq = _phase_taps(x, kh, kw, stride, padding, dilation, res)
    span = ho * wq
    kk = kh * kw
    cols = np.empty((n, c, kk, span), res.dtype)
    for t, (a, b, dy, dx) in enumerate(offs):
        off = dy * wq + dx
        cols[:, :, t, :] = p[:, :, a, b, off : off + span]
    del p
    og = o // groups
    full = np.matmul(w.reshape(groups, og, cg * kk), cols.reshape(n, groups, cg * kk, span))
    full = full.reshape(n, o, ho, wq)[..., :wo]
    if b3 is not None:
        np.add(full, b3, out=res)
    else:
        np.copyto(res, full)
    return res


# Convolutions with at most this many input channels per group run compiled (where built):
# depthwise, narrow grouped, and a network's first (RGB) convolution; wider groups are better
# served by im2col and BLAS (parity at 16 channels per group, measured).
_NATIVE_MAX_GROUP_CHANNELS = 8

# A patch embedding (stride = kernel, no padding: ViT's 16x16 patches) whose patches hold at
# least this many values is a product of its patches by the filter (gathered into rows, then
# the compiled product on orchestra's threads) rather than a direct convolution: 2.3x faster
# for ViT's 3x16x16 -> 192 at one thread, 3.8x at two; at 3x8x8 (192 values) the direct
# path is as fast or faster (measured on a 2-vCPU VM).
_PATCH_MIN_K = 256


def conv_reads_input_first(n: int, groups: int, cg: int, og: int) -> bool:
    """Whether the compiled direct convolution (``conv_f32``) reads its whole input before it
    writes any output, so that ``out`` may share memory with ``x``: one image of one group,
    not depthwise (the kernel pads the input planes into its scratch first). The kernel
    refuses an overlapping call otherwise; callers then copy the input aside."""
    return n == 1 and groups == 1 and not (cg == 1 and og == 1)


# Depthwise convolutions with at least this many output elements per image take the
# stride-phase path when the plain im2col would gather short strided rows.
_PHASES_MIN_OUT = 4096
# A depthwise convolution's im2col columns are gathered and multiplied this many bytes of
# channels at a time, so they stay in cache between the copy and the GEMM (a whole im2col
# of a 96-channel 112x112 plane is 43 MiB: 5x slower, measured).
_DW_BLOCK_BYTES = 1 << 20


def _depthwise_blocked(x: np.ndarray, w: np.ndarray, b3: np.ndarray | None, stride: tuple[int, int],
                       padding: tuple[int, int], dilation: tuple[int, int], res: np.ndarray) -> np.ndarray:
    """Depthwise convolution (one input and one output channel per group): the stride-phase
    im2col of :func:`_conv_phases`, built and multiplied a block of channels at a time."""
    n, c, _, _ = x.shape
    _, _, kh, kw = w.shape
    sh, sw = stride
    dh, dw = dilation
    ho, wo = res.shape[2], res.shape[3]
    offs, p, wq = _phase_taps(x, kh, kw, stride, padding, dilation, res)
    span = ho * wq
    kk = kh * kw
    win = None
    if sh == 1 and sw == 1:
        # One plane: each tap is a shifted run of it, so the columns are one strided view.
        flat = p.reshape(n, c, -1)
        s_n, s_c, s_l = flat.strides
        win = _windows(flat, (n, c, kh, kw, span), (s_n, s_c, dh * wq * s_l, dw * s_l, s_l))
    cb = max(1, min(c, _DW_BLOCK_BYTES // max(1, n * kk * span * res.itemsize)))
    buf = np.empty((n, cb, kk, span), res.dtype)
    full = np.empty((n, c, 1, span), res.dtype)
    wm = w.reshape(c, 1, kk)
    for c0 in range(0, c, cb):
        c1 = min(c, c0 + cb)
        cols = buf[:, : c1 - c0]
        if win is not None:
            np.copyto(cols.reshape(n, c1 - c0, kh, kw, span), win[:, c0:c1])
        else:
            for t, (a, b, dy, dx) in enumerate(offs):
                off = dy * wq + dx
                cols[:, :, t, :] = p[:, c0:c1, a, b, off : off + span]
        np.matmul(wm[c0:c1], cols, out=full[:, c0:c1])
    del p, win
    cropped = full.reshape(n, c, ho, wq)[..., :wo]
    if b3 is not None:
        np.add(cropped, b3, out=res)
    else:
        np.copyto(res, cropped)
    return res


def conv2d(
    x: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    groups: int,
    out: Any,
    act: str | None = None,
) -> np.ndarray:
    """NCHW convolution as im2col + one GEMM (batched over groups), or compiled (narrow
    groups, float32, where built), then the activation ``act`` if given (``"relu"``,
    ``"hardswish"``, ``"silu"``: the same results as the activation kernels run after it).

    Returns ``out`` when it has the result's shape and dtype (and is writable and
    C-contiguous), else a new array. ``out`` may overlap ``x``: x is gathered into the
    im2col buffer (or read by np.matmul / np.dot, which copy overlapping inputs) before
    anything is written.
    """
    if act is not None and act not in _ACTS:
        raise bad(_OP, f"unknown activation {act!r} (one of {', '.join(_ACTS)})")
    res, done = _conv2d(x, w, bias, stride, padding, dilation, groups, out, act)
    if act is not None and not done:
        _activate(res, act)
    return res


# conv2d's activations: name -> the compiled kernels' code.
_ACTS = MappingProxyType({"relu": 1, "hardswish": 2, "silu": 3})


def _bias32(bias: np.ndarray | None) -> np.ndarray | None:
    return None if bias is None else np.ascontiguousarray(bias, np.float32)


def _activate(res: np.ndarray, act: str) -> None:
    """``act`` over ``res`` in place: one compiled pass where built, else the kernels' numpy."""
    if _native is not None and res.dtype == np.float32 and res.flags.c_contiguous:
        n, o = res.shape[:2]
        _native.bias_act_f32(res, None, n, o, res.size // max(1, n * o), _ACTS[act])
        return
    from ._elementwise import hardswish_out, relu_out, silu_out

    {"relu": relu_out, "hardswish": hardswish_out, "silu": silu_out}[act](res, res)


def _conv2d(
    x: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    groups: int,
    out: Any,
    act: str | None,
) -> tuple[np.ndarray, bool]:
    """:func:`conv2d`: the result and whether ``act`` was applied already."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    sh, sw = stride
    ph, pw = padding
    dh, dw = dilation
    if groups < 1 or c != cg * groups or o % groups:
        raise bad(
            _OP,
            f"input has {c} channels and weight {tuple(w.shape)} with groups={groups}: "
            f"expected input channels == weight.shape[1] * groups and out channels divisible by groups",
        )
    if sh < 1 or sw < 1 or dh < 1 or dw < 1 or ph < 0 or pw < 0:
        raise bad(_OP, f"invalid stride {stride}, padding {padding} or dilation {dilation}")
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if ho <= 0 or wo <= 0:
        raise bad(
            _OP,
            f"kernel {kh}x{kw} (dilation {dilation}) is larger than the padded input "
            f"{h + 2 * ph}x{wd + 2 * pw}",
        )
    if bias is not None and bias.shape != (o,):
        raise bad(_OP, f"bias has shape {tuple(bias.shape)}, expected ({o},)")
    dt = x.dtype if x.dtype == w.dtype else np.result_type(x.dtype, w.dtype)
    shape = (n, o, ho, wo)
    # Sizes come from the program's padding/stride/dilation: check before allocating.
    check_fits(_OP, shape, out)
    check_scratch(_OP, (n, c, h + 2 * ph, wd + 2 * pw), dt.itemsize, "padded input")
    check_scratch(_OP, (n, c, kh, kw, ho, max(wo, wd + 2 * pw)), dt.itemsize, "im2col buffer")
    if (
        type(out) is np.ndarray
        and out.shape == shape
        and out.dtype == dt
        and out.flags.c_contiguous
        and out.flags.writeable
    ):
        res = out
    else:
        res = np.empty(shape, dt)
    og = o // groups
    k = cg * kh * kw
    if w.dtype != dt:
        w = w.astype(dt)
    if x.dtype != dt:
        x = x.astype(dt)
    b3 = None if bias is None else bias.reshape(o, 1, 1)  # broadcasts over (N, O, Ho, Wo)
    wp = wd + 2 * pw
    hw = ho * wo

    if (cg <= _NATIVE_MAX_GROUP_CHANNELS and (groups > 1 or kh * kw > 1) and dt == np.float32
            and _native is not None):
        # Compiled direct convolution: each input plane padded into a small scratch, 8-column
        # output tiles, several output channels per input load; the GIL released.
        xc = np.ascontiguousarray(x)
        if not conv_reads_input_first(n, groups, cg, og) and np.may_share_memory(xc, res):
            xc = xc.copy()  # the planes are read while the output is written
        wc = np.ascontiguousarray(w)
        bc = _bias32(bias)
        _native.conv_f32(xc, wc, bc, res, n, c, h, wd, o, groups, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo,
                         0 if act is None else _ACTS[act])
        return res, True
    if cg == 1 and o == c and groups == c and c >= 16 and kh * kw > 1 and o * hw >= _PHASES_MIN_OUT:
        return _depthwise_blocked(x, w, b3, stride, padding, dilation, res), False
    if (cg == 1 and groups > 1 and c >= 16 and kh * kw > 1 and o * hw >= _PHASES_MIN_OUT
            and (sh > 1 or sw > 1 or (kh * kw >= 25 and 4 * (wp - wo) > wo))):
        return _conv_phases(x, w, b3, stride, padding, dilation, groups, res), False
    if kh == 1 and kw == 1 and sh == 1 and sw == 1 and ph == 0 and pw == 0:
        # 1x1 convolution: the input planes are the GEMM operand as they are.
        cols = x.reshape(n, groups, k, hw)
    elif sh == 1 and sw == 1 and 4 * (wp - wo) <= wo and n * c * kh * kw * hw >= _WIDE_MIN_COLS:
        # Stride 1, large: compute each output row over the padded width wp (the last
        # wp - wo columns are junk, cropped by the bias add). Every im2col row is then one
        # contiguous run of the flattened padded input, so building the columns is a memcpy
        # per row.
        flat = _pad_input_flat(x, ph, pw, dt, max((kw - 1) * dw, 1))
        s_n, s_c, s_l = flat.strides
        win = _windows(flat, (n, c, kh, kw, ho * wp), (s_n, s_c, dh * wp * s_l, dw * s_l, s_l))
        cols = np.ascontiguousarray(win).reshape(n, groups, k, ho * wp)
        del win, flat
        if groups == 1 and dt == np.float32 and _native is not None:
            # the compiled product, bias and activation included (the junk columns too)
            full = np.empty((n, o, ho, wp), dt)
            _native.conv1x1_f32(cols, np.ascontiguousarray(w), _bias32(bias), full, n, k, ho * wp, o,
                                0 if act is None else _ACTS[act])
            np.copyto(res, full[..., :wo])
            return res, True
        wm = w.reshape(groups, og, k)
        full = np.matmul(wm, cols).reshape(n, o, ho, wp)[..., :wo]
        if b3 is not None:
            np.add(full, b3, out=res)
        else:
            np.copyto(res, full)
        return res, False
    else:
        if ph or pw:
            xp = np.zeros((n, c, h + 2 * ph, wp), dt)
            xp[:, :, ph : ph + h, pw : pw + wd] = x
        else:
            xp = x
        s_n, s_c, s_h, s_w = xp.strides
        shape6 = (n, c, kh, kw, ho, wo)
        strides6 = (s_n, s_c, dh * s_h, dw * s_w, sh * s_h, sw * s_w)
        if xp.flags.c_contiguous:
            # Much cheaper than as_strided; numpy still checks the view stays inside xp.
            win = np.ndarray(shape6, dt, xp, 0, strides6)
        else:
            win = as_strided(xp, shape6, strides6, writeable=False)
        cols = np.ascontiguousarray(win).reshape(n, groups, k, hw)
        del win, xp
    if groups == 1 and dt == np.float32 and _native is not None and hw >= _NATIVE_MIN_PIXELS:
        # The compiled product (orchestra's threads, not BLAS's): bias and activation applied
        # as each tile of the result is stored. Its operands may not overlap its out.
        xc = np.ascontiguousarray(cols)
        if np.may_share_memory(xc, res):
            xc = xc.copy()
        _native.conv1x1_f32(xc, np.ascontiguousarray(w), _bias32(bias), res, n, k, hw, o,
                            0 if act is None else _ACTS[act])
        return res, True
    if groups == 1 and n == 1:
        # One plain matrix product (np.dot is cheaper to call than the np.matmul gufunc).
        np.dot(w.reshape(o, k), cols.reshape(k, hw), out=res.reshape(o, hw))
    else:
        np.matmul(w.reshape(groups, og, k), cols, out=res.reshape(n, groups, og, hw))
    if _native is not None and dt == np.float32 and (act is not None or b3 is not None):
        # bias and activation in one compiled pass over the GEMM's output
        bc = _bias32(bias)
        _native.bias_act_f32(res, bc, n, o, hw, 0 if act is None else _ACTS[act])
        return res, True
    if b3 is not None:
        np.add(res, b3, out=res)
    return res, False


def scale_weight(w: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """A read-only copy of weight ``w`` with output channel ``o`` multiplied by ``scale[o]``
    (in ``w``'s dtype, as a folded batch norm's weight is made)."""
    out = np.multiply(w, scale.reshape((-1,) + (1,) * (w.ndim - 1)))
    out.setflags(write=False)
    return out


def scales_in_product(x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride: tuple[int, int],
                      padding: tuple[int, int], dilation: tuple[int, int], groups: int) -> bool:
    """Whether :func:`plan_conv2d`'s run for this float32 convolution applies a ``scale`` per
    output channel in its product's last step (a 1x1 convolution over enough pixels, strided
    or not), rather than multiplying a copy of the weight by it when it is planned."""
    if _native is None or len(x_shape) != 4 or len(w_shape) != 4 or min(x_shape) < 1 or w_shape[2:] != (1, 1):
        return False
    n, _, h, wd = x_shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    if groups != 1 or ph != 0 or pw != 0 or min(sh, sw, dh, dw) < 1:
        return False
    hw = ((h - 1) // sh + 1) * ((wd - 1) // sw + 1)
    if sh == sw == 1:
        return n > 1 or hw >= _NATIVE_MIN_PIXELS  # run_1x1 (not run_gemv)
    return dh == dw == 1 and hw >= _NATIVE_MIN_PIXELS  # run_1x1_strided


def plan_conv2d(
    x_shape: tuple[int, ...],
    x_dtype: np.dtype,
    w: np.ndarray,
    bias: np.ndarray | None,
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    groups: int,
    act: str | None,
    scale: np.ndarray | None = None,
) -> Callable[[np.ndarray, Any], np.ndarray | None] | None:
    """For a convolution with constant weight and bias and literal arguments, planned once
    (a plan's step): ``run(x, out)`` computing what :func:`conv2d` computes for an input of
    exactly ``x_shape`` / ``x_dtype`` into an ``out`` of the result's shape, with every
    check and choice that depends only on those made here. ``run`` returns None when its
    arguments are not those (the caller then calls :func:`conv2d`). None: no planned path
    for this convolution (conv2d every time).

    ``scale`` (float32, one per output channel): the convolution's weight is ``w`` with
    output channel ``o`` multiplied by ``scale[o]`` (a batch norm folded in). Where
    :func:`scales_in_product` says so the product applies it to each sum before the bias
    (no copy of ``w``); elsewhere the plan multiplies a copy of ``w`` once."""
    if len(x_shape) != 4 or w.ndim != 4 or x_dtype != np.float32 or w.dtype != np.float32 or _native is None:
        return None
    if bias is not None and (bias.dtype != np.float32 or bias.shape != (w.shape[0],)):
        return None
    if act is not None and act not in _ACTS:
        return None
    if scale is not None:
        if scale.dtype != np.float32 or scale.shape != (w.shape[0],):
            return None
        if not scales_in_product(x_shape, w.shape, stride, padding, dilation, groups):
            w, scale = scale_weight(w, scale), None
    n, c, h, wd = x_shape
    o, cg, kh, kw = w.shape
    sh, sw = stride
    ph, pw = padding
    dh, dw = dilation
    if (groups < 1 or c != cg * groups or o % groups or min(sh, sw, dh, dw) < 1 or min(ph, pw) < 0
            or min(x_shape) < 1):
        return None
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if ho <= 0 or wo <= 0:
        return None
    shape = (n, o, ho, wo)
    f32 = np.dtype(np.float32)
    wc = np.ascontiguousarray(w)
    bc = None if bias is None else np.ascontiguousarray(bias)
    sc = None if scale is None else np.ascontiguousarray(scale)
    code = 0 if act is None else _ACTS[act]
    may_share = np.may_share_memory
    ndarray = np.ndarray

    def fits(x: Any, out: Any) -> bool:
        return (type(x) is ndarray and x.shape == x_shape and x.dtype == f32 and x.flags.c_contiguous
                and type(out) is ndarray and out.shape == shape and out.dtype == f32 and out.flags.c_contiguous
                and out.flags.writeable)

    # The (x, out) pair last found to fit and to share no memory, as weak references (a
    # closed Method's arrays are not kept alive): a plan's step passes the same two arrays
    # every execute (a Method's planned tensors), so the next call with them skips the
    # checks (about 1 us of a small convolution's 2). One tuple, replaced whole.
    last: list[Any] = [None]
    ref = weakref.ref

    def checked(x: Any, out: Any) -> bool | None:
        """True: x and out fit and share no memory; False: they fit but may share; None: no fit."""
        p = last[0]
        if p is not None and p[0]() is x and p[1]() is out:
            return True
        if not fits(x, out):
            return None
        if may_share(x, out):
            return False
        last[0] = (ref(x), ref(out))
        return True

    if (groups == 1 and (kh, kw) == (sh, sw) and kh * kw > 1 and ph == pw == 0 and dh == dw == 1
            and c * kh * kw >= _PATCH_MIN_K and ho * wo >= _NATIVE_MIN_PIXELS):
        k, p = c * kh * kw, ho * wo
        w2 = np.ascontiguousarray(wc.reshape(o, k))
        f32_empty = np.empty
        copyto = np.copyto

        def run_patches(x: Any, out: Any) -> np.ndarray | None:
            if _native is None or checked(x, out) is None:
                return None
            # each output pixel's patch as one row (its channels' kh rows of kw values: runs of
            # kw consecutive floats), gathered before out is written (out may lie on x)
            rows = f32_empty((n, ho, wo, c, kh, kw), f32)
            copyto(rows, x[:, :, :ho * kh, :wo * kw].reshape(n, c, ho, kh, wo, kw).transpose(0, 2, 4, 1, 3, 5))
            res = f32_empty((n, p, o), f32)
            _native.linear_f32(rows.reshape(n, p, k), w2, bc, res, n, p, k, o, False, code, True)
            copyto(out.reshape(n, o, p), res.transpose(0, 2, 1))
            return out
        return run_patches
    if cg <= _NATIVE_MAX_GROUP_CHANNELS and (groups > 1 or kh * kw > 1):
        try:
            check_scratch(_OP, (n, c, h + 2 * ph, wd + 2 * pw), 4, "padded input")
        except OrchestraError:
            return None
        args = (n, c, h, wd, o, groups, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo, code)
        in_place = conv_reads_input_first(n, groups, cg, o // groups)

        def run_direct(x: Any, out: Any) -> np.ndarray | None:
            if _native is None:  # (switched off since: conv2d's numpy path)
                return None
            ok = checked(x, out)
            if ok is None:
                return None
            _native.conv_f32(x if ok or in_place else x.copy(), wc, bc, out, *args)
            return out
        return run_direct
    if kh == kw == sh == sw == 1 and ph == pw == 0 and groups == 1 and n == 1 and ho * wo < _NATIVE_MIN_PIXELS:
        # A few pixels (squeeze-and-excite's 1x1 on a pooled 1x1 map): a matrix-vector product,
        # which BLAS does better than 4 x 32 tiles that are mostly padding.
        w2 = wc.reshape(o, c)
        hw = ho * wo
        dot = np.dot

        def run_gemv(x: Any, out: Any) -> np.ndarray | None:
            if _native is None or checked(x, out) is None:
                return None
            dot(w2, x.reshape(c, hw), out=out.reshape(o, hw))
            if bc is not None or code:
                _native.bias_act_f32(out, bc, 1, o, hw, code)
            return out
        return run_gemv
    if (kh == kw == 1 and (sh > 1 or sw > 1) and ph == pw == 0 and dh == dw == 1 and groups == 1
            and ho * wo >= _NATIVE_MIN_PIXELS):
        # A strided 1x1 convolution (a residual block's downsampling shortcut): the pixels it
        # reads gathered into one scratch, then the 1x1 product over them, as conv2d computes it.
        hw = ho * wo
        f32_empty = np.empty
        copyto = np.copyto

        def run_1x1_strided(x: Any, out: Any) -> np.ndarray | None:
            if _native is None or checked(x, out) is None:
                return None
            cols = f32_empty((n, c, ho, wo), f32)
            copyto(cols, x[:, :, : (ho - 1) * sh + 1 : sh, : (wo - 1) * sw + 1 : sw])
            _native.conv1x1_f32(cols, wc, bc, out, n, c, hw, o, code, sc)
            return out
        return run_1x1_strided
    if kh == kw == sh == sw == 1 and ph == pw == 0 and groups == 1:
        hw = ho * wo

        def run_1x1(x: Any, out: Any) -> np.ndarray | None:
            if _native is None:
                return None
            ok = checked(x, out)
            if ok is None:
                return None
            _native.conv1x1_f32(x if ok else x.copy(), wc, bc, out, n, c, hw, o, code, sc)
            return out
        return run_1x1
    return None


def _pair(v: Any, name: str) -> tuple[int, int]:
    if type(v) is list and len(v) == 2 and type(v[0]) is int and type(v[1]) is int:
        return v[0], v[1]
    return int_list(v, 2, _OP, name)  # type: ignore[return-value]


@kernel(_OP, dtypes=F32_64)
def convolution_out(
    input: np.ndarray,  # noqa: A002
    weight: np.ndarray,
    bias: np.ndarray | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool,
    output_padding: list[int],
    groups: int,
    out: np.ndarray,
) -> np.ndarray:
    return convolution_act(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, out,
                           None)


def convolution_act(
    input: np.ndarray,  # noqa: A002
    weight: np.ndarray,
    bias: np.ndarray | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool,
    output_padding: list[int],
    groups: int,
    out: np.ndarray,
    act: str | None,
) -> np.ndarray:
    """``aten::convolution.out`` then the activation ``act`` (None: none; see
    :func:`conv2d`): what the plan's fused convolution steps run."""
    if transposed:
        raise unsupported(_OP, "transposed convolution is not supported")
    spatial = weight.ndim - 2
    if input.ndim != weight.ndim:
        raise bad(_OP, f"input has {input.ndim} dims but weight has {weight.ndim}")
    if spatial == 2:
        st = _pair(stride, "stride")
        pd = _pair(padding, "padding")
        dl = _pair(dilation, "dilation")
        return finish(conv2d(input, weight, bias, st, pd, dl, int(groups), out, act), out)
    if spatial == 1:
        (s,) = int_list(stride, 1, _OP, "stride")
        (p,) = int_list(padding, 1, _OP, "padding")
        (d,) = int_list(dilation, 1, _OP, "dilation")
        o4 = out[:, :, None, :] if isinstance(out, np.ndarray) and out.ndim == 3 else None
        res = conv2d(input[:, :, None, :], weight[:, :, None, :], bias, (1, s), (0, p), (1, d),
                     int(groups), o4, act)
        if o4 is not None and res is o4:
            return out
        return finish(res[:, :, 0, :], out)
    raise unsupported(_OP, f"{spatial}-d convolution is not supported (only 1-d and 2-d)")
