"""Normalisation: batch norm (inference), layer norm, group norm."""

from __future__ import annotations

import numpy as np

from ._registry import kernel
from ._util import FLOAT_MATH, bad, dest, finish, load_native

__all__: list[str] = []

_native = load_native()  # orchestra's compiled kernels, or None (numpy paths only)
_F32 = np.dtype(np.float32)


def _layer_norm_native(x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None, eps: float,
                       out0: np.ndarray, out1: np.ndarray, out2: np.ndarray) -> bool:
    """The float32 layer norm over the last dim, compiled (one pass for the statistics, one
    for the result, rows split over the kernels' threads): True when it ran. Where an array
    is not a C-contiguous float32 one of its shape (out writable; mean and rstd of the rows'
    shape with a trailing 1), or an output overlaps an operand, False: nothing written."""
    if _native is None or x.dtype != _F32 or not x.flags.c_contiguous:
        return False
    rows_shape = x.shape[:-1] + (1,)
    for o in (out0, out1, out2):
        if o.dtype != _F32 or not o.flags.c_contiguous or not o.flags.writeable:
            return False
    if out1.shape != rows_shape or out2.shape != rows_shape:
        return False
    for p in (weight, bias):
        if p is not None and (type(p) is not np.ndarray or p.dtype != _F32 or not p.flags.c_contiguous):
            return False
    d = x.shape[-1]
    try:
        _native.layer_norm_f32(x, weight, bias, out0, out1, out2, x.size // d, d, float(eps))
    except (ValueError, BufferError):
        return False
    return True


def _channel_view(v: np.ndarray, ndim: int) -> np.ndarray:
    """A per-channel vector shaped to broadcast along dim 1 of an ``ndim``-d tensor."""
    return v.reshape((1, -1) + (1,) * (ndim - 2))


@kernel("aten::_native_batch_norm_legit_no_training.out", dtypes=FLOAT_MATH)
def native_batch_norm_legit_no_training_out(
    input: np.ndarray,  # noqa: A002
    weight: np.ndarray | None,
    bias: np.ndarray | None,
    running_mean: np.ndarray,
    running_var: np.ndarray,
    momentum: float,
    eps: float,
    out0: np.ndarray,
    out1: np.ndarray,
    out2: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x - mean) / sqrt(var + eps) * weight + bias along dim 1.

    Returns (out, save_mean, save_invstd); in inference mode the latter two are empty
    (shape ``(0,)``), as in torch and ExecuTorch.
    """
    x = input
    nd = x.ndim
    dt = x.dtype
    if (
        type(out0) is np.ndarray
        and out0.shape == x.shape
        and out0.dtype == dt
        and dt.kind == "f"
        and nd >= 2
        and running_var.dtype == dt
        and running_var.shape == running_mean.shape == x.shape[1:2]
        and type(out1) is np.ndarray
        and out1.shape == (0,)
        and type(out2) is np.ndarray
        and out2.shape == (0,)
    ):
        # Fast path: the same fold in x's dtype, as torch's CPU kernel computes it
        # (alpha = weight / sqrt(var + eps), beta = bias - mean * alpha), then the channel
        # vectors shaped (C, 1, ..., 1) to broadcast against (N, C, ...) from the right.
        scale = np.add(running_var, eps)  # a Python float does not widen float32
        np.sqrt(scale, out=scale)
        if weight is not None:
            np.divide(weight, scale, out=scale)
        else:
            np.reciprocal(scale, out=scale)
        shift = np.multiply(running_mean, scale)
        if bias is not None:
            np.subtract(bias, shift, out=shift)
        else:
            np.negative(shift, out=shift)
        cshape = x.shape[1:2] + (1,) * (nd - 2)
        try:
            np.multiply(x, scale.reshape(cshape), out=out0)
        except ValueError:  # a read-only out0
            pass
        else:
            np.add(out0, shift.reshape(cshape), out=out0)
            return out0, out1, out2
    if x.ndim < 2:
        raise bad(
            "aten::_native_batch_norm_legit_no_training.out",
            f"expected a tensor with a channel dim (>= 2-d), got shape {tuple(x.shape)}",
        )
    dt = x.dtype
    # Fold the statistics into one scale and shift per channel (C elements, float64 so the
    # fold adds no rounding of its own), then one multiply-add pass over the input.
    scale = 1.0 / np.sqrt(running_var.astype(np.float64) + eps)
    if weight is not None:
        scale = scale * weight
    shift = -running_mean * scale
    if bias is not None:
        shift = shift + bias
    nd = x.ndim
    scale_b = _channel_view(scale.astype(dt), nd)
    shift_b = _channel_view(shift.astype(dt), nd)
    o = dest(out0, x.shape, dt)
    res = np.multiply(x, scale_b, out=o)
    res += shift_b
    empty1 = out1 if isinstance(out1, np.ndarray) and out1.shape == (0,) else np.empty((0,), dt)
    empty2 = out2 if isinstance(out2, np.ndarray) and out2.shape == (0,) else np.empty((0,), dt)
    return finish(res, out0), finish(empty1, out1), finish(empty2, out2)


def _normalize(
    x: np.ndarray, rows: int, eps: float, out: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x - mean) * rstd over the trailing elements of each of ``rows`` rows (biased
    variance, torch's). Returns (normalised (rows, D), mean (rows, 1), rstd (rows, 1)); the
    first is written into ``out`` when given (C-contiguous, x's size and dtype)."""
    x2 = x.reshape(rows, -1)
    d = x2.shape[1]
    y = np.empty(x2.shape, x.dtype) if out is None else out.reshape(x2.shape)
    mean = np.mean(x2, axis=1, keepdims=True)
    np.subtract(x2, mean, out=y)
    # Sum of squares without a temporary.
    var = np.einsum("ij,ij->i", y, y).reshape(rows, 1)
    var /= max(d, 1)
    var += eps
    rstd = np.sqrt(var, out=var)
    np.reciprocal(rstd, out=rstd)
    y *= rstd
    return y, mean, rstd


def _norm_buffer(out: object, x: np.ndarray) -> np.ndarray | None:
    o = dest(out, x.shape, x.dtype)
    if o is None or not o.flags.c_contiguous or np.may_share_memory(o, x):
        return None
    return o


@kernel("aten::native_layer_norm.out", dtypes=FLOAT_MATH)
def native_layer_norm_out(
    input: np.ndarray,  # noqa: A002
    normalized_shape: list[int],
    weight: np.ndarray | None,
    bias: np.ndarray | None,
    eps: float,
    out0: np.ndarray,
    out1: np.ndarray,
    out2: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Returns (out, mean, rstd); mean and rstd keep the normalised dims as size 1."""
    x = input
    k = len(normalized_shape)
    dt = x.dtype
    if (
        k == 1
        and type(out0) is np.ndarray
        and out0.shape == x.shape
        and out0.dtype == dt
        and dt.kind == "f"
        and dt.itemsize >= 4
        and type(out1) is np.ndarray
        and type(out2) is np.ndarray
        and x.ndim
    ):
        d = x.shape[-1]
        if (
            normalized_shape[0] == d
            and d
            and (weight is None or weight.shape == (d,))
            and (bias is None or bias.shape == (d,))
        ):
            if _layer_norm_native(x, weight, bias, eps, out0, out1, out2):
                return out0, out1, out2
            # Fast path over the last dim: row means as one product with a column of 1/d,
            # straight into out1, the biased variance likewise into out2, then rstd in place.
            # (np.dot insists on outs of exactly the result's shape and dtype, C-contiguous
            # and writable: else it raises and the general path below recomputes it all.)
            col = np.empty((d, 1), dt)
            col.fill(1.0 / d)
            try:
                mean = np.dot(x, col, out=out1)
                y = np.subtract(x, mean, out=out0)
                var = np.dot(np.square(y), col, out=out2)
            except ValueError:
                pass
            else:
                var += np.array(eps, dt)
                np.sqrt(var, out=var)
                y *= np.reciprocal(var, out=var)
                if weight is not None:
                    y *= weight
                if bias is not None:
                    y += bias
                return out0, out1, out2
    if k == 0 or k > x.ndim or tuple(x.shape[x.ndim - k :]) != tuple(int(s) for s in normalized_shape):
        raise bad(
            "aten::native_layer_norm.out",
            f"normalized_shape {list(normalized_shape)} does not match the end of input shape "
            f"{tuple(x.shape)}",
        )
    if x.dtype.kind != "f":
        raise bad("aten::native_layer_norm.out", f"expected a floating tensor, got {x.dtype}")
    lead = x.shape[: x.ndim - k]
    rows = int(np.prod(lead, dtype=np.int64))
    o = _norm_buffer(out0, x)
    y, mean, rstd = _normalize(x, rows, eps, o)
    if weight is not None:
        y *= weight.reshape(1, -1)
    if bias is not None:
        y += bias.reshape(1, -1)
    stat_shape = lead + (1,) * k
    return (
        out0 if o is not None else finish(y.reshape(x.shape), out0),
        finish(mean.reshape(stat_shape), out1),
        finish(rstd.reshape(stat_shape), out2),
    )


@kernel("aten::native_group_norm.out", dtypes=FLOAT_MATH)
def native_group_norm_out(
    input: np.ndarray,  # noqa: A002
    weight: np.ndarray | None,
    bias: np.ndarray | None,
    N: int,  # noqa: N803
    C: int,  # noqa: N803
    HxW: int,  # noqa: N803
    group: int,
    eps: float,
    out0: np.ndarray,
    out1: np.ndarray,
    out2: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Returns (out, mean, rstd) with mean and rstd of shape (N, group)."""
    x = input
    n, c = int(N), int(C)
    g = int(group)
    if g <= 0 or c % g or x.size != n * c * int(HxW):
        raise bad(
            "aten::native_group_norm.out",
            f"input {tuple(x.shape)} does not match N={N}, C={C}, HxW={HxW}, group={group}",
        )
    y, mean, rstd = _normalize(x, n * g, eps, None)
    y = y.reshape(n, c, -1)
    if weight is not None:
        y *= weight.reshape(1, c, 1)
    if bias is not None:
        y += bias.reshape(1, c, 1)
    return (
        finish(y.reshape(x.shape), out0),
        finish(mean.reshape(n, g), out1),
        finish(rstd.reshape(n, g), out2),
    )
