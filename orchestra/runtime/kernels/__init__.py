"""orchestra's numpy kernels and their registry.

Importing this package registers every kernel. A kernel is looked up by the operator's full
ExecuTorch name (``aten::convolution.out``) with :func:`get_kernel`.

Calling convention (what the interpreter relies on):

- ``fn(*values[:num_params])`` where ``values`` are the KernelCall's arguments in schema
  order, ``out`` (and every other out argument) included: tensors as numpy arrays (possibly
  non-contiguous views), scalars as Python ints/floats/bools, int lists as lists/tuples,
  absent optionals as None, tensor lists as lists of arrays, ScalarType args as int codes.
- The kernel returns the result: an array in ``out``'s dtype (a tuple for multi-output ops, a
  list for list outputs, a Python scalar for scalar ops). When ``out`` already has the result's
  shape the kernel writes into it and returns ``out`` itself; otherwise (an upper-bound dynamic
  ``out``) it returns a new array, for the interpreter to resize ``out`` and copy it in.
- View ops (``executorch_prim::et_view.default``, ``aten::alias``) return a view of their
  input, which the interpreter aliases.

Kernels are numpy, vectorised, and keep no state, so they may run on several threads at
once. A few steps numpy can't do at speed (depthwise and narrow grouped convolutions, silu,
hardswish) also have a compiled
version in the optional extension ``_native`` (built by ``pip install`` where a C compiler
is available; it releases the GIL while it computes): :data:`NATIVE_KERNELS` says whether
it is there. Without it the numpy path runs, with the same results to float rounding.
"""

from . import (  # noqa: F401  (imported to register their kernels)
    _conv,
    _creation,
    _elementwise,
    _linalg,
    _norm,
    _pool,
    _prim,
    _quant,
    _reduce,
    _shape,
)
from ._registry import KernelDef, get_kernel, kernel, kernel_names, nearest_kernel_names

#: True when orchestra's compiled kernels (the ``_native`` extension) were built and load.
NATIVE_KERNELS: bool = _conv._native is not None

__all__ = ["NATIVE_KERNELS", "KernelDef", "get_kernel", "kernel", "kernel_names", "nearest_kernel_names"]
