"""The ahead-of-time layer: ``BackendDetails.preprocess`` and a torch-free ``ProgramBuilder``.

- :class:`BackendDetails` / :class:`PreprocessResult` / :class:`CompileSpec`: ExecuTorch's
  AOT backend seed without torch; register implementations with
  :func:`register_aot_backend` or the ``orchestra.aot_backends`` entry-point group.
- :class:`ProgramBuilder`: author ``.pte`` programs from numpy: inputs, constants, operator
  calls encoded as ExecuTorch's emitter encodes them, delegates, memory planning. The bytes
  load in orchestra's runtime and in ExecuTorch's.
"""

from ._backend_details import (
    BackendDetails,
    CompileSpec,
    PreprocessResult,
    aot_backends,
    get_aot_backend,
    register_aot_backend,
)
from ._builder import MethodBuilder, ProgramBuilder, Value
from ._planner import MemoryPlan, plan_memory
from ._schema import REQUIRED, OperatorSchema, SchemaArgument, operator_schema

__all__ = [
    "REQUIRED",
    "BackendDetails",
    "CompileSpec",
    "MemoryPlan",
    "MethodBuilder",
    "OperatorSchema",
    "PreprocessResult",
    "ProgramBuilder",
    "SchemaArgument",
    "Value",
    "aot_backends",
    "get_aot_backend",
    "operator_schema",
    "plan_memory",
    "register_aot_backend",
]
