"""The ``.pte`` format layer: read, verify and write ExecuTorch programs."""

from ._scalar_type import ScalarType, numpy_dtype, scalar_type_of

__all__ = ["ScalarType", "numpy_dtype", "scalar_type_of"]
