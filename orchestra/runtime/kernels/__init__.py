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
once. The steps that decide a real model's speed also have a compiled version in the
optional extension ``_native`` (built by ``pip install`` where a C compiler is available; it
releases the GIL while it computes): depthwise and narrow grouped convolutions, the float32
matrix products (1x1 and im2col convolutions, addmm / mm / bmm with at least 8 rows) with
their bias and activation, silu, hardswish, gelu; channels-last depthwise and grouped
convolutions and permuted copies (:func:`permute_geometry`), which the XNNPACK backend binds
through :func:`compiled`. :data:`NATIVE_KERNELS` says whether it is
there. Without it the numpy (BLAS) path runs, with the same results to float rounding.
"""

from typing import Any

from orchestra.errors import InvalidArgumentError

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
from ._shape import permute_geometry

#: True when orchestra's compiled kernels (the ``_native`` extension) were built and load.
NATIVE_KERNELS: bool = _conv._native is not None

#: The most threads :func:`set_threads` accepts.
MAX_THREADS = 16


def set_threads(n: int) -> None:
    """Lets one call of a compiled kernel (a product, a convolution, an activation) split its
    work over up to ``n`` threads (1 to :data:`MAX_THREADS`; 1 by default), process-wide. The
    threads are a pool started on the first call that splits (from about 2^18 multiply-adds);
    between calls they spin for 150 us (a model's calls come back to back) and then wait on a
    condition variable, so an idle pool takes no CPU; a call made while another
    thread's call holds the pool runs on its own thread, and a forked child starts its own
    pool. The orchestrator sets this with the compute threads it decides
    (``statistics().threads``, orchestra/orchestrator/README.md); without the compiled kernels
    it does nothing.

    Raises:
        orchestra.InvalidArgumentError: ``n`` is not an int from 1 to 16.
    """
    if type(n) is not int or not 1 <= n <= MAX_THREADS:
        raise InvalidArgumentError(f"set_threads: {n!r} threads (an int from 1 to {MAX_THREADS})")
    if _conv._native is not None:
        _conv._native.set_threads(n)


def rest() -> None:
    """Sends the compiled kernels' pool threads to sleep now instead of at the end of their
    150 us spin (:func:`set_threads`); the next call that splits wakes them. For a loop that
    hands the CPU to something else between executes: a worker process calls it before it
    answers, so that the orchestrating process, woken by the answer, finds their CPU free
    rather than preempting the thread that starts the next execute. Costs the next split
    call one wakeup. Does nothing without the compiled kernels."""
    if _conv._native is not None:
        _conv._native.pool_rest()


def compiled() -> Any:
    """The compiled kernels themselves (the ``_native`` extension module), for a backend that
    binds them into its own steps (the XNNPACK backend's channels-last convolutions, linear
    layers and activations); None where they were not built or ``ORCHESTRA_NATIVE_KERNELS=0``
    switched them off. Each function's docstring gives its signature; they take C-contiguous
    float32 buffers, check that every buffer holds what the sizes reach (``ValueError``
    otherwise), release the GIL, and split their work over the threads :func:`set_threads`
    allows."""
    return _conv._native


def threads() -> int:
    """How many threads one call of a compiled kernel may use (:func:`set_threads`); 1
    without the compiled kernels."""
    return int(_conv._native.get_threads()) if _conv._native is not None else 1


__all__ = ["MAX_THREADS", "NATIVE_KERNELS", "KernelDef", "compiled", "get_kernel", "kernel", "kernel_names",
           "nearest_kernel_names", "permute_geometry", "rest", "set_threads", "threads"]
