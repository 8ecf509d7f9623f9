"""XNNPACK backend: runs the delegates ExecuTorch's ``XnnpackPartitioner`` writes into a
``.pte`` (backend id ``XnnpackBackend``) with numpy, float32.

- :class:`XnnpackBackend` (runtime): verifies the delegate blob (``XH00`` header,
  ``XNNGraph`` flatbuffer, constants in the blob or in the program's named data) and compiles
  its graph once per Program into pre-bound numpy steps; each Method instance owns only its
  activations.
- :func:`summarize`: node types, tensor count and where the constants live, for
  ``orchestra inspect``.
- :func:`register_node` / :func:`register_datatype`: extend the compiler with node types or
  datatypes (e.g. quantized ones).

Registered through the entry point group ``orchestra.backends`` as ``XnnpackBackend``. See
README.md.
"""

from ._backend import BACKEND_ID, XnnpackBackend, XnnpackHandle, XnnpackStatistics
from ._compile import NODE_BUILDERS, Plan, register_datatype, register_node
from ._summary import XnnpackSummary, summarize

__all__ = [
    "BACKEND_ID",
    "NODE_BUILDERS",
    "Plan",
    "XnnpackBackend",
    "XnnpackHandle",
    "XnnpackStatistics",
    "XnnpackSummary",
    "register_datatype",
    "register_node",
    "summarize",
]
