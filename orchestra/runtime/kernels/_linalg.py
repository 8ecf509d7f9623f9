"""Matrix products: mm, bmm, addmm, linear."""

from __future__ import annotations

from typing import Any

import numpy as np

from ._registry import kernel
from ._util import REAL_MATH, bad, check_fits, dest, finish, load_native

__all__: list[str] = []

_native = load_native()  # orchestra's compiled kernels, or None (numpy/BLAS only)

# A product of fewer rows than this (a classifier's matrix-vector product) goes to the
# compiled kernel only when it may split over threads, or when b is a transposed view (the
# kernel's rows fetch weights ahead): on one thread, with b as it is, BLAS's sgemv is
# faster (1 x 1024 x 1000: 52 us against 66); the kernel's column blocks split where BLAS,
# held to one thread, can't.
_NATIVE_MIN_ROWS = 4

# Products of fewer multiply-adds than this stay with BLAS: below it the checks and the
# panel copies cost more than the kernel saves (the transformer fixture, d = 32: 10% slower).
_NATIVE_MIN_WORK = 1 << 16

_F32 = np.dtype(np.float32)


def _native_product(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None, out: Any) -> np.ndarray | None:
    """``a @ b`` (+ ``bias`` over the last axis) straight into ``out`` by the compiled kernel
    (float32; 2-d operands, or 3-d with equal batch), running on orchestra's own threads.
    None where it doesn't apply (the caller then uses numpy): another dtype or shape, fewer
    than ``_NATIVE_MIN_WORK`` multiply-adds, fewer than ``_NATIVE_MIN_ROWS`` rows on one
    thread, or an ``out`` that is not a writable C-contiguous array of the result's shape and
    dtype. An operand sharing memory with ``out`` is copied first."""
    if _native is None or type(a) is not np.ndarray or type(b) is not np.ndarray or a.dtype != _F32 or b.dtype != _F32:
        return None
    if a.ndim == 2 and b.ndim == 2:
        nb, batched = 1, False
    elif a.ndim == 3 and b.ndim == 3 and a.shape[0] == b.shape[0]:
        nb, batched = a.shape[0], True
    else:
        return None
    t, k = a.shape[-2:]
    n = b.shape[-1]
    bt = b.swapaxes(-1, -2)
    trans = bt.flags.c_contiguous and not b.flags.c_contiguous
    # A few rows against a transposed view (a classifier's x @ W.T) go to the kernel at any
    # thread count: its matrix-vector rows fetch the weights ahead, which BLAS's don't (1 x
    # 576 x 1024 from memory: 200 us against 339; the same from cache).
    if (nb * t * k * n < _NATIVE_MIN_WORK or b.shape[-2] != k or min(nb, k, n) < 1
            or (t < _NATIVE_MIN_ROWS and _native.get_threads() == 1 and not trans)):
        return None
    if bias is not None:
        if type(bias) is not np.ndarray or bias.dtype != _F32 or bias.shape not in ((n,), (1, n)):
            return None
        bias = np.ascontiguousarray(bias)
    if (type(out) is not np.ndarray or out.shape != a.shape[:-1] + (n,) or out.dtype != _F32
            or not out.flags.c_contiguous or not out.flags.writeable):
        return None
    # an operand on out's memory is copied aside first, as numpy's matmul would (the plan may
    # put a product's result on its input once a rewrite reads that input in place of a copy
    # of it: EfficientNet's classifier)
    if np.may_share_memory(out, a):
        a = a.copy()
    if np.may_share_memory(out, b):
        b = b.copy()
        bt = b.swapaxes(-1, -2)
        trans = False
    if bias is not None and np.may_share_memory(out, bias):
        bias = bias.copy()
    if trans:
        # b is a transposed view (a linear layer's W.T, attention's K^T): the kernel reads
        # its rows as columns, no transposing copy
        _native.linear_f32(np.ascontiguousarray(a), bt, bias, out, nb, t, k, n, batched, 0, True)
    else:
        _native.linear_f32(np.ascontiguousarray(a), np.ascontiguousarray(b), bias, out, nb, t, k, n, batched)
    return out


def _matmul(op: str, a: np.ndarray, b: np.ndarray, out: Any) -> np.ndarray:
    if a.shape[-1] != b.shape[-2]:
        raise bad(op, f"shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be multiplied")
    dt = np.result_type(a.dtype, b.dtype)
    try:
        shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + a.shape[-2:-1] + b.shape[-1:]
    except ValueError as exc:
        raise bad(op, f"shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be multiplied") from exc
    o = dest(out, shape, dt)
    if o is not None and (np.may_share_memory(o, a) or np.may_share_memory(o, b)):
        o = None
    if o is None:
        check_fits(op, shape, out)
    return np.matmul(a, b, out=o)


# Products of at least this many bytes are written straight into addmm's out.
_DIRECT_OUT_BYTES = 1 << 16


def _fits(out: Any, shape: tuple[int, ...], a: np.ndarray, b: np.ndarray) -> bool:
    """Whether the fast path may write ``a @ b`` straight into ``out``: same dtypes, right
    shape. (np.dot and np.matmul copy inputs that overlap ``out``; np.dot, cheaper to call
    than the np.matmul gufunc, also wants a C-contiguous ``out``, else it raises.)"""
    return (
        type(out) is np.ndarray
        and out.shape == shape
        and a.dtype == b.dtype
        and out.dtype == a.dtype
    )


@kernel("aten::mm.out", dtypes=REAL_MATH)
def mm_out(self: np.ndarray, mat2: np.ndarray, out: np.ndarray) -> np.ndarray:
    # (the size test first: a small product pays nothing for the compiled path)
    if (_native is not None and mat2.ndim == 2 and self.size * mat2.shape[1] >= _NATIVE_MIN_WORK
            and _native_product(self, mat2, None, out) is not None):
        return out
    if self.ndim == 2 and mat2.ndim == 2 and _fits(out, (self.shape[0], mat2.shape[1]), self, mat2):
        try:
            return np.dot(self, mat2, out=out)
        except ValueError:  # mismatched inner dims or a read-only out: the general path says
            pass
    if self.ndim != 2 or mat2.ndim != 2:
        raise bad("aten::mm.out", f"expected 2-d tensors, got {self.ndim}-d and {mat2.ndim}-d")
    return finish(_matmul("aten::mm.out", self, mat2, out), out)


@kernel("aten::bmm.out", dtypes=REAL_MATH)
def bmm_out(self: np.ndarray, mat2: np.ndarray, out: np.ndarray) -> np.ndarray:
    if (_native is not None and mat2.ndim == 3 and self.size * mat2.shape[2] >= _NATIVE_MIN_WORK
            and _native_product(self, mat2, None, out) is not None):
        return out
    if (
        self.ndim == 3
        and mat2.ndim == 3
        and self.shape[0] == mat2.shape[0]
        and _fits(out, (self.shape[0], self.shape[1], mat2.shape[2]), self, mat2)
    ):
        try:
            return np.matmul(self, mat2, out=out)
        except ValueError:
            pass
    if self.ndim != 3 or mat2.ndim != 3 or self.shape[0] != mat2.shape[0]:
        raise bad(
            "aten::bmm.out",
            f"expected 3-d tensors with equal batch, got {tuple(self.shape)} and {tuple(mat2.shape)}",
        )
    return finish(_matmul("aten::bmm.out", self, mat2, out), out)


@kernel("aten::addmm.out", dtypes=REAL_MATH)
def addmm_out(
    self: np.ndarray, mat1: np.ndarray, mat2: np.ndarray, beta: Any, alpha: Any, out: np.ndarray
) -> np.ndarray:
    """beta * self + alpha * (mat1 @ mat2); self is ignored when beta == 0 (torch)."""
    if (_native is not None and beta == 1 and alpha == 1 and mat2.ndim == 2
            and mat1.size * mat2.shape[1] >= _NATIVE_MIN_WORK and _native_product(mat1, mat2, self, out) is not None):
        return out
    if (
        beta == 1
        and alpha == 1
        and mat1.ndim == 2
        and mat2.ndim == 2
        and _fits(out, (mat1.shape[0], mat2.shape[1]), mat1, mat2)
        and self.dtype == out.dtype
    ):
        # Fast path (a linear layer): one product, one add that broadcasts self into out. A
        # large product goes straight into out (C-contiguous, sharing no memory with an
        # operand or self: np.dot would copy, and self is read after), then self is added in
        # place: a temporary of a transformer's size (hundreds of KB) comes from fresh pages
        # each time malloc has given the last one back to the system. (Small ones come from
        # malloc's free lists: there the checks would cost more than they save.)
        try:
            if (out.nbytes >= _DIRECT_OUT_BYTES and out.flags.c_contiguous and out.flags.writeable
                    and not np.may_share_memory(out, mat1) and not np.may_share_memory(out, mat2)
                    and not np.may_share_memory(out, self)):
                np.dot(mat1, mat2, out=out)
                return np.add(out, self, out=out)
            return np.add(np.dot(mat1, mat2), self, out=out)
        except ValueError:
            pass
    if mat1.ndim != 2 or mat2.ndim != 2:
        raise bad("aten::addmm.out", f"expected 2-d matrices, got {mat1.ndim}-d and {mat2.ndim}-d")
    if isinstance(out, np.ndarray) and np.may_share_memory(out, self):
        out_ok = None
    else:
        out_ok = out
    res = _matmul("aten::addmm.out", mat1, mat2, out_ok)
    if alpha != 1:
        res *= alpha
    if beta != 0:
        if beta == 1:
            res += self
        else:
            res += self * beta
    return finish(res, out)


@kernel("aten::linear.out", dtypes=REAL_MATH)
def linear_out(
    input: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, out: np.ndarray  # noqa: A002
) -> np.ndarray:
    if (
        weight.ndim == 2
        and input.ndim >= 1
        and _fits(out, input.shape[:-1] + weight.shape[:1], input, weight)
        and (bias is None or bias.dtype == out.dtype)
    ):
        try:
            # np.dot of an N-d and a 2-d array contracts the last axis with the first: matmul.
            if bias is None:
                return np.dot(input, weight.T, out=out)
            return np.add(np.dot(input, weight.T), bias, out=out)
        except ValueError:
            pass
    res = _matmul("aten::linear.out", input, weight.T, out)
    if bias is not None:
        res += bias
    return finish(res, out)
