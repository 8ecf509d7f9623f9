"""Convolution (1-d and 2-d, strided, padded, dilated, grouped, depthwise)."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ._registry import kernel
from ._util import F32_64, bad, dest_contig, finish, int_list, unsupported

__all__: list[str] = []

_OP = "aten::convolution.out"


def _pad_input(x: np.ndarray, ph: int, pw: int, dt: np.dtype, tail: int = 0) -> np.ndarray:
    """x zero-padded to (N, C, H + 2ph, W + 2pw); with ``tail`` > 0 the planes are returned
    flattened, (N, C, Hp * Wp + tail), with ``tail`` trailing zeros."""
    n, c, h, w = x.shape
    if tail == 0 and ph == 0 and pw == 0:
        return x if x.dtype == dt else x.astype(dt)
    hp, wp = h + 2 * ph, w + 2 * pw
    flat = np.zeros((n, c, hp * wp + tail), dt)
    flat[:, :, : hp * wp].reshape(n, c, hp, wp)[:, :, ph : ph + h, pw : pw + w] = x
    return flat if tail else flat.reshape(n, c, hp, wp)


def _windows(a: np.ndarray, shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    """A read-only strided view of ``a`` (which must contain every element it reaches)."""
    if a.flags.c_contiguous:
        # Much cheaper than as_strided; numpy still checks the view stays inside ``a``.
        v = np.ndarray(shape, a.dtype, a, 0, strides)
        v.flags.writeable = False
        return v
    return as_strided(a, shape=shape, strides=strides, writeable=False)


def conv2d(
    x: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    stride: tuple[int, int],
    padding: tuple[int, int],
    dilation: tuple[int, int],
    groups: int,
    out: Any,
) -> np.ndarray:
    """NCHW convolution as im2col + one GEMM (batched over groups).

    Returns ``out`` when it has the result's shape and dtype (and is writable), else a new
    array.
    """
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
    if min(sh, sw) < 1 or min(dh, dw) < 1 or min(ph, pw) < 0:
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
    res = dest_contig(out, shape, dt)
    if res is None or np.may_share_memory(res, x):
        res = np.empty(shape, dt)
    og = o // groups
    k = cg * kh * kw
    wm = w.reshape(groups, og, k)
    if wm.dtype != dt:
        wm = wm.astype(dt)
    b4 = None if bias is None else bias.reshape(1, o, 1, 1).astype(dt, copy=False)
    wp = wd + 2 * pw

    if kh == 1 and kw == 1 and sh == 1 and sw == 1 and ph == 0 and pw == 0:
        # 1x1 convolution: the input planes are the GEMM operand as they are.
        width = wo
        cols = x.reshape(n, groups, k, ho * wo)
        if cols.dtype != dt:
            cols = cols.astype(dt)
    elif sh == 1 and sw == 1 and 4 * (wp - wo) <= wo:
        # Stride 1: compute each output row over the padded width wp (the last wp - wo
        # columns are junk, cropped below). Every im2col row is then one contiguous run of
        # the flattened padded input, so building the columns is a memcpy per row.
        width = wp
        flat = _pad_input(x, ph, pw, dt, tail=max((kw - 1) * dw, 1))
        s_n, s_c, s_l = flat.strides
        win = _windows(flat, (n, c, kh, kw, ho * wp), (s_n, s_c, dh * wp * s_l, dw * s_l, s_l))
        cols = np.empty((n, c, kh, kw, ho * wp), dt)
        np.copyto(cols, win)
        del win, flat
        cols = cols.reshape(n, groups, k, ho * wp)
    else:
        width = wo
        xp = _pad_input(x, ph, pw, dt)
        s_n, s_c, s_h, s_w = xp.strides
        win = _windows(xp, (n, c, kh, kw, ho, wo), (s_n, s_c, dh * s_h, dw * s_w, sh * s_h, sw * s_w))
        cols = np.empty((n, c, kh, kw, ho, wo), dt)
        np.copyto(cols, win)
        del win, xp
        cols = cols.reshape(n, groups, k, ho * wo)

    if width == wo:
        np.matmul(wm, cols, out=res.reshape(n, groups, og, ho * wo))
        if b4 is not None:
            res += b4
    else:
        full = np.matmul(wm, cols).reshape(n, o, ho, width)[..., :wo]
        if b4 is not None:
            np.add(full, b4, out=res)
        else:
            np.copyto(res, full)
    return res


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
    if transposed:
        raise unsupported(_OP, "transposed convolution is not supported")
    spatial = weight.ndim - 2
    if input.ndim != weight.ndim:
        raise bad(_OP, f"input has {input.ndim} dims but weight has {weight.ndim}")
    if spatial == 2:
        st = int_list(stride, 2, _OP, "stride")
        pd = int_list(padding, 2, _OP, "padding")
        dl = int_list(dilation, 2, _OP, "dilation")
        return finish(conv2d(input, weight, bias, st, pd, dl, int(groups), out), out)
    if spatial == 1:
        (s,) = int_list(stride, 1, _OP, "stride")
        (p,) = int_list(padding, 1, _OP, "padding")
        (d,) = int_list(dilation, 1, _OP, "dilation")
        o4 = out[:, :, None, :] if isinstance(out, np.ndarray) and out.ndim == 3 else None
        res = conv2d(input[:, :, None, :], weight[:, :, None, :], bias, (1, s), (0, p), (1, d),
                     int(groups), o4)
        if o4 is not None and res is o4:
            return out
        return finish(res[:, :, 0, :], out)
    raise unsupported(_OP, f"{spatial}-d convolution is not supported (only 1-d and 2-d)")
