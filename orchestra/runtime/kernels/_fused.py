"""Kernels for the fused steps of a plan: squeeze-and-excite in one compiled call.

A squeeze-and-excite block as exported is six steps on tiny vectors around one large tensor
(global average pool, 1x1 convolution, activation, 1x1 convolution, gate, channel scale);
run as steps, their Python and call overheads cost more than their arithmetic. The plan
(``orchestra.runtime._optimize``) replaces six such consecutive steps with one call of
:func:`squeeze_excite_into`, which writes every value the six steps wrote, in their order.
"""

from __future__ import annotations

import numpy as np

from ._util import load_native

__all__ = [
    "SE_ADD",
    "SE_CLAMP",
    "SE_DIV",
    "SE_MUL",
    "SE_MULX",
    "SE_SIGMOID",
    "squeeze_excite_available",
    "squeeze_excite_into",
]

_native = load_native()  # orchestra's compiled kernels, or None

# The operation codes of squeeze_excite_into's op lists, (code, a, b) float32 triples applied
# in order to a vector v (each in float32, as the elementwise kernels compute it): v + a, v * a,
# v / a, v clamped to [a, b] (a NaN bound: none on that side; NaN stays NaN), 1 / (1 + exp(-v)),
# and v times the vector the list started from (sigmoid then that: silu).
SE_ADD, SE_MUL, SE_DIV, SE_CLAMP, SE_SIGMOID, SE_MULX = 1, 2, 3, 4, 5, 6

_F32 = np.dtype(np.float32)


def squeeze_excite_available() -> bool:
    """Whether :func:`squeeze_excite_into` can run (the compiled kernels are built)."""
    return _native is not None


def squeeze_excite_into(x: np.ndarray, out: np.ndarray, s: np.ndarray, t1: np.ndarray, t2: np.ndarray,
                        t3: np.ndarray, g: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray,
                        b2: np.ndarray, ops1: np.ndarray, ops2: np.ndarray) -> bool:
    """Squeeze-and-excite of ``x`` (N, C, H, W), float32: ``s`` = each plane's mean, ``t1`` =
    ``w1`` (R, C) . s + ``b1``, ``t2`` = ops1(t1), ``t3`` = ``w2`` (C, R) . t2 + ``b2``, ``g`` =
    ops2(t3), ``out`` = x * g plane by plane: each written in that order, x read again for the
    product after g is written (a value the plan put on x's memory changes it first, as the
    steps as written would). ``out`` is ``x`` or shares no memory with it.

    False, with nothing written, where the compiled kernels are not built or an operand is not
    a C-contiguous float32 array of its size (the caller then runs the steps as written)."""
    if _native is None:
        return False
    for a in (x, out, s, t1, t2, t3, g, w1, b1, w2, b2, ops1, ops2):
        if type(a) is not np.ndarray or a.dtype != _F32 or not a.flags.c_contiguous:
            return False
    if x.ndim != 4 or w1.ndim != 2:
        return False
    n, c, h, w = x.shape
    try:
        _native.se_f32(x, out, s, t1, t2, t3, g, w1, b1, w2, b2, ops1, ops2, n, c, w1.shape[0], h * w)
    except (ValueError, BufferError):
        return False
    return True
