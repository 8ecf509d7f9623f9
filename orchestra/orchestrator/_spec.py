"""What an instance is: its name, binding, options, restart policy, deadline, placement."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from ..errors import InvalidArgumentError

__all__ = ["InstanceSpec", "RestartPolicy"]


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """How an instance recovers from a fault.

    An execute that raises (a backend or kernel rejecting one input, say) is a *failed
    execute*: its caller gets :class:`~orchestra.orchestrator.ExecuteError` and the instance
    goes on with the same Method (and, with ``placement="process"``, the same worker
    process). Unless ``restart_on_error`` is set, or ``unhealthy_after`` executes in a row
    have failed with no success between them, that is all.

    A *restart* happens when the worker is unhealthy: its worker process crashed or sent a
    corrupt stream (``placement="process"``), ``unhealthy_after`` executes in a row failed
    (a backend whose device went away fails every execute; 0 turns this off), or
    ``restart_on_error`` is set and an execute raised. The Method is closed (the process killed) and a fresh one is loaded from the
    same Program, after ``backoff_s * backoff_factor ** (k - 1)`` seconds for the k-th
    consecutive restart. A successful execute resets the count. The fault that would be
    restart number ``max_restarts + 1`` marks the instance failed instead: it leaves
    routing, releases its resources, and its executes raise
    :class:`~orchestra.orchestrator.InstanceFailedError` naming the last error.
    Failures caused by the caller's inputs (``InvalidArgumentError``) never restart.
    (An execute past the instance's ``deadline_s`` is handled by a quarantine instead.)
    """

    max_restarts: int = 3
    backoff_s: float = 0.05
    backoff_factor: float = 2.0
    restart_on_error: bool = False
    unhealthy_after: int = 5

    def __post_init__(self) -> None:
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise InvalidArgumentError(f"RestartPolicy.max_restarts must be an int >= 0, got {self.max_restarts!r}")
        if isinstance(self.unhealthy_after, bool) or not isinstance(self.unhealthy_after, int) or self.unhealthy_after < 0:
            raise InvalidArgumentError(f"RestartPolicy.unhealthy_after must be an int >= 0, got {self.unhealthy_after!r}")
        if not isinstance(self.restart_on_error, bool):
            raise InvalidArgumentError(f"RestartPolicy.restart_on_error must be a bool, got {self.restart_on_error!r}")
        for key in ("backoff_s", "backoff_factor"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < math.inf:
                raise InvalidArgumentError(f"RestartPolicy.{key} must be a number >= 0, got {v!r}")

    def backoff(self, k: int) -> float:
        """Seconds to wait before the k-th consecutive restart (k >= 1)."""
        return float(self.backoff_s * self.backoff_factor ** max(k - 1, 0))


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """One instance of a pool.

    Attributes:
        name: unique in the orchestrator; policies and ``explain()`` use it.
        bind: resource units, e.g. ``{"npu0.core": 0}``, ``{"camera": "front"}`` or
            ``{"cpu": (0, 1)}``; resolved by the orchestrator's :class:`ResourcePool`, which
            turns it into init-only backend options and worker CPU affinity.
        backend_options: per backend id, this instance's options at load (the binding's
            options are added; giving a different value for a key the binding sets is an error).
        restart: what to do when an execute raises.
        deadline_s: an execute running longer than this on the worker is abandoned: the
            caller gets :class:`~orchestra.orchestrator.DeadlineError`, the instance is
            quarantined and replaced by a fresh one with the same spec and binding.
            None: no deadline.
        placement: ``"thread"``: the Method runs on a dedicated worker thread pinned to the
            binding's CPUs. ``"process"``: it runs in a worker process (spawned, pinned to
            the binding's CPUs, tensors through shared memory) driven by that thread; free
            of the GIL, at the cost of a copy of inputs and outputs and a process per
            instance (see ``Orchestrator(process_initializer=...)`` for backends registered
            at run time).
        target_rate_hz: pace this instance's executes to at most this rate (None: no limit).
    """

    name: str
    bind: Mapping[str, Any] = field(default_factory=dict)
    backend_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    deadline_s: float | None = None
    placement: Literal["thread", "process"] = "thread"
    target_rate_hz: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidArgumentError(f"InstanceSpec.name must be a non-empty string, got {self.name!r}")
        where = f"instance {self.name!r}"
        if not isinstance(self.bind, Mapping) or not all(isinstance(k, str) for k in self.bind):
            raise InvalidArgumentError(f"{where}: bind must map unit names to values, got {self.bind!r}")
        if not isinstance(self.backend_options, Mapping) or not all(
                isinstance(k, str) and isinstance(v, Mapping) for k, v in self.backend_options.items()):
            raise InvalidArgumentError(f"{where}: backend_options must map backend ids to option mappings, got {self.backend_options!r}")
        if not isinstance(self.restart, RestartPolicy):
            raise InvalidArgumentError(f"{where}: restart must be a RestartPolicy, got {self.restart!r}")
        if self.deadline_s is not None and (isinstance(self.deadline_s, bool) or not isinstance(self.deadline_s, (int, float))
                                            or not 0 < self.deadline_s < math.inf):
            raise InvalidArgumentError(f"{where}: deadline_s must be a number > 0 or None, got {self.deadline_s!r}")
        if self.placement not in ("thread", "process"):
            raise InvalidArgumentError(f"{where}: placement must be 'thread' or 'process', got {self.placement!r}")
        if self.target_rate_hz is not None and (isinstance(self.target_rate_hz, bool) or not isinstance(self.target_rate_hz, (int, float))
                                                or not 0 < self.target_rate_hz < math.inf):
            raise InvalidArgumentError(f"{where}: target_rate_hz must be a number > 0 or None, got {self.target_rate_hz!r}")
        object.__setattr__(self, "bind", MappingProxyType(dict(self.bind)))
        object.__setattr__(self, "backend_options", MappingProxyType({b: MappingProxyType(dict(v)) for b, v in self.backend_options.items()}))
