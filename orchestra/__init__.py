"""orchestra: run many instances of one ExecuTorch program method at once."""

from .errors import (
    BackendError,
    ConfigError,
    Error,
    InvalidArgumentError,
    NotFoundError,
    OperatorMissingError,
    OrchestraError,
    ProgramError,
)
from .backends.onnxruntime import import_onnx
from .runtime import Method, MethodMeta, Program, Runtime, Session, load_program

__all__ = [
    "BackendError",
    "ConfigError",
    "Error",
    "InvalidArgumentError",
    "Method",
    "MethodMeta",
    "NotFoundError",
    "OperatorMissingError",
    "OrchestraError",
    "Program",
    "ProgramError",
    "Runtime",
    "Session",
    "import_onnx",
    "load_program",
]
__version__ = "0.1.0"
