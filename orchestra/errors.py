"""orchestra's error type and error codes (the base layer).

Everything a user can get wrong raises a subclass of :class:`OrchestraError`. Each carries an
:class:`Error` code that mirrors ExecuTorch's runtime error codes, and a message that names the
file, method, operator, backend, option or config path involved.
"""

from __future__ import annotations

import enum

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


class Error(enum.IntEnum):
    """Error codes, numbered as ExecuTorch's ``executorch::runtime::Error``."""

    Ok = 0x00
    Internal = 0x01
    InvalidState = 0x02
    EndOfMethod = 0x03
    NotSupported = 0x10
    NotImplemented = 0x11
    InvalidArgument = 0x12
    InvalidType = 0x13
    OperatorMissing = 0x14
    NotFound = 0x20
    MemoryAllocationFailed = 0x21
    AccessFailed = 0x22
    InvalidProgram = 0x23
    InvalidExternalData = 0x24
    OutOfResources = 0x25
    DelegateInvalidCompatibility = 0x30
    DelegateMemoryAllocationFailed = 0x31
    DelegateInvalidHandle = 0x32


class OrchestraError(Exception):
    """Base class of every error orchestra raises for something a user can get wrong.

    Attributes:
        code: the :class:`Error` code.
        message: the human-readable message (also ``str(exc)``).
    """

    default_code: Error = Error.Internal

    def __init__(self, message: str, code: Error | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = self.default_code if code is None else code

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, code=Error.{self.code.name})"


class ProgramError(OrchestraError):
    """A ``.pte`` file (or bytes) is not a valid program; the message says where."""

    default_code = Error.InvalidProgram


class OperatorMissingError(OrchestraError):
    """A program calls an operator that has no registered kernel."""

    default_code = Error.OperatorMissing


class InvalidArgumentError(OrchestraError):
    """An argument (an input, an option, a parameter) is not acceptable."""

    default_code = Error.InvalidArgument


class NotFoundError(OrchestraError):
    """A named thing (method, backend, file, instance) does not exist."""

    default_code = Error.NotFound


class BackendError(OrchestraError):
    """A backend could not be found, initialised or executed."""

    default_code = Error.DelegateInvalidCompatibility


class ConfigError(OrchestraError):
    """A configuration file is invalid; ``errors`` holds one line per problem."""

    default_code = Error.InvalidArgument

    def __init__(self, message: str, errors: tuple[str, ...] = (), code: Error | None = None) -> None:
        super().__init__(message, code)
        self.errors = errors or (message,)
