"""ExecuTorch scalar types (``schema/scalar_type.fbs``) and their numpy equivalents."""

from __future__ import annotations

import enum

import numpy as np

__all__ = ["ScalarType", "numpy_dtype", "scalar_type_of"]


class ScalarType(enum.IntEnum):
    """Element types, numbered as in ExecuTorch's schema (and c10::ScalarType)."""

    BYTE = 0
    CHAR = 1
    SHORT = 2
    INT = 3
    LONG = 4
    HALF = 5
    FLOAT = 6
    DOUBLE = 7
    BOOL = 11
    QINT8 = 12
    QUINT8 = 13
    QINT32 = 14
    BFLOAT16 = 15
    QUINT4X2 = 16
    QUINT2X4 = 17
    BITS16 = 22
    FLOAT8E5M2 = 23
    FLOAT8E4M3FN = 24
    FLOAT8E5M2FNUZ = 25
    FLOAT8E4M3FNUZ = 26
    UINT16 = 27
    UINT32 = 28
    UINT64 = 29

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return _ITEMSIZE[self]


_ITEMSIZE: dict[ScalarType, int] = {
    ScalarType.BYTE: 1, ScalarType.CHAR: 1, ScalarType.SHORT: 2, ScalarType.INT: 4,
    ScalarType.LONG: 8, ScalarType.HALF: 2, ScalarType.FLOAT: 4, ScalarType.DOUBLE: 8,
    ScalarType.BOOL: 1, ScalarType.QINT8: 1, ScalarType.QUINT8: 1, ScalarType.QINT32: 4,
    ScalarType.BFLOAT16: 2, ScalarType.QUINT4X2: 1, ScalarType.QUINT2X4: 1,
    ScalarType.BITS16: 2, ScalarType.FLOAT8E5M2: 1, ScalarType.FLOAT8E4M3FN: 1,
    ScalarType.FLOAT8E5M2FNUZ: 1, ScalarType.FLOAT8E4M3FNUZ: 1, ScalarType.UINT16: 2,
    ScalarType.UINT32: 4, ScalarType.UINT64: 8,
}

# Types numpy computes with. The others (quantized, bfloat16, float8) are carried by the
# format layer but have no numpy dtype.
_TO_NUMPY: dict[ScalarType, np.dtype] = {
    ScalarType.BYTE: np.dtype(np.uint8),
    ScalarType.CHAR: np.dtype(np.int8),
    ScalarType.SHORT: np.dtype(np.int16),
    ScalarType.INT: np.dtype(np.int32),
    ScalarType.LONG: np.dtype(np.int64),
    ScalarType.HALF: np.dtype(np.float16),
    ScalarType.FLOAT: np.dtype(np.float32),
    ScalarType.DOUBLE: np.dtype(np.float64),
    ScalarType.BOOL: np.dtype(np.bool_),
    ScalarType.UINT16: np.dtype(np.uint16),
    ScalarType.UINT32: np.dtype(np.uint32),
    ScalarType.UINT64: np.dtype(np.uint64),
}
_FROM_NUMPY: dict[np.dtype, ScalarType] = {v: k for k, v in _TO_NUMPY.items()}


def numpy_dtype(scalar_type: int) -> np.dtype | None:
    """The numpy dtype for an ExecuTorch scalar type, or None if numpy has none."""
    # ScalarType is an IntEnum: a plain int finds its member's entry (hash and == agree).
    return _TO_NUMPY.get(scalar_type) if isinstance(scalar_type, int) else None


def scalar_type_of(dtype: np.dtype) -> ScalarType | None:
    """The ExecuTorch scalar type of a numpy dtype, or None if there is none."""
    return _FROM_NUMPY.get(np.dtype(dtype))
