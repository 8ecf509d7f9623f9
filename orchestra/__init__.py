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

__all__ = [
    "BackendError",
    "ConfigError",
    "Error",
    "InvalidArgumentError",
    "NotFoundError",
    "OperatorMissingError",
    "OrchestraError",
    "ProgramError",
]
__version__ = "0.1.0"
