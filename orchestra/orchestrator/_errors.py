"""Errors the orchestrator raises (all :class:`~orchestra.OrchestraError` subclasses)."""

from __future__ import annotations

from ..errors import Error, InvalidArgumentError, OrchestraError

__all__ = ["DeadlineError", "ExecuteError", "ExecuteRejectedError", "InstanceClosedError", "InstanceFailedError",
           "ResourceError"]


class ResourceError(InvalidArgumentError):
    """A binding can't be satisfied: an unknown unit, a value out of range, or a unit held by
    another instance (code ``OutOfResources``; the message names the unit and its holder)."""


class ExecuteError(OrchestraError):
    """An execute raised inside an instance. ``__cause__`` is the original exception; the
    code is the cause's code (``Internal`` when the cause is not an OrchestraError).

    Attributes:
        instance: the instance that ran it.
    """

    def __init__(self, message: str, code: Error | None = None, *, instance: str = "") -> None:
        super().__init__(message, code)
        self.instance = instance


class ExecuteRejectedError(ExecuteError, InvalidArgumentError):
    """The instance refused the caller's request: wrong inputs (count, dtype, shape) or
    per-call options. A caller's mistake, not a fault of the instance: it is an
    :class:`~orchestra.InvalidArgumentError` (and an :class:`ExecuteError`), counts as
    ``rejected`` in the statistics, never as a failure, and never restarts the instance.
    ``__cause__`` is the runtime's error."""

    default_code = Error.InvalidArgument


class DeadlineError(OrchestraError, TimeoutError):
    """An execute ran past its instance's ``deadline_s``; the instance was quarantined and
    replaced. Also a :class:`TimeoutError`."""

    default_code = Error.InvalidState

    def __init__(self, message: str, code: Error | None = None, *, instance: str = "") -> None:
        super().__init__(message, code)
        self.instance = instance


class InstanceFailedError(OrchestraError):
    """The instance gave up after its restart policy's ``max_restarts``; the message says
    why (the last error)."""

    default_code = Error.InvalidState

    def __init__(self, message: str, code: Error | None = None, *, instance: str = "") -> None:
        super().__init__(message, code)
        self.instance = instance


class InstanceClosedError(OrchestraError):
    """The instance (or its pool, or the orchestrator) was removed or closed."""

    default_code = Error.InvalidState
