"""The runtime: ``Program``, ``Method``, the interpreter, numpy kernels and backends."""

from ._backend import (
    Backend,
    BackendExecutionContext,
    BackendInitContext,
    BackendInterface,
    get_backend_class,
    register_backend,
    registered_backends,
)
from ._options import OptionSpec, RuntimeSpecs
from ._method import Method, MethodMeta, MethodStatistics, TensorInfo, ValueInfo
from ._program import Program, ProgramInstance, ProgramInstanceStatistics, load_program
from ._session import Function, Runtime, Session, SessionStatistics

__all__ = [
    "Backend",
    "Function",
    "BackendExecutionContext",
    "BackendInitContext",
    "BackendInterface",
    "Method",
    "OptionSpec",
    "MethodMeta",
    "MethodStatistics",
    "Program",
    "ProgramInstance",
    "ProgramInstanceStatistics",
    "Runtime",
    "RuntimeSpecs",
    "Session",
    "SessionStatistics",
    "TensorInfo",
    "ValueInfo",
    "get_backend_class",
    "load_program",
    "register_backend",
    "registered_backends",
]
