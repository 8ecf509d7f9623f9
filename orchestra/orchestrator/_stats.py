"""Statistics: small frozen dataclasses (anyio style), built on demand on the loop."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..telemetry import LatencySummary

__all__ = ["EngineRun", "InstanceStatistics", "OrchestratorStatistics", "PoolStatistics", "ThreadBudget"]


@dataclass(frozen=True, slots=True)
class ThreadBudget:
    """The compute threads of one instance (DESIGN: orchestra owns every compute thread).

    ``blas`` is the compute threads in force in the process that runs the instance (its
    worker process, or this process for thread placement): where orchestra's compiled kernels
    are built, the threads their products and convolutions split over (the BLAS/OpenMP pools
    then run one thread in a worker process); else the BLAS/OpenMP pools' count (None: no such
    library loaded). The name is the ``blas_threads`` option's. ``blas_source`` who set it:
    ``"orchestra"`` (the CPUs bound, every CPU for a lone unbound instance, or 1), an
    environment variable the user set (``"OPENBLAS_NUM_THREADS"``, ``"MKL_NUM_THREADS"``,
    ``"OMP_NUM_THREADS"``), or ``"blas_threads option"`` (``Orchestrator(blas_threads=)``).
    ``backend`` maps each backend with a thread option to its value in force (e.g.
    ``{"NumpyCpuBackend": 2}``: orchestra's own tiling).
    """

    placement: str
    blas: int | None
    blas_source: str
    backend: Mapping[str, int]

    def format(self) -> str:
        """``"blas 1 (orchestra), NumpyCpuBackend 2"``."""
        parts = [f"blas {self.blas if self.blas is not None else '-'} ({self.blas_source})"]
        parts += [f"{b} {n}" for b, n in self.backend.items()]
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class InstanceStatistics:
    """One instance.

    ``executes`` counts executes that returned, ``failures`` those that raised (including
    the one a deadline cut short); ``rejected`` the requests it refused for the caller's
    mistake (wrong inputs or per-call options: :class:`ExecuteRejectedError`, never a
    failure, never a restart); ``restarts`` fresh Methods after a failure;
    ``replacements`` quarantines after a deadline. ``latency`` is the time of
    ``Method.execute`` on the worker (not the queueing before it). ``options`` are the
    values in force (as of the last execute boundary) per backend; ``pending`` the values
    the engine has set that are not in force yet. ``threads``: its compute threads (BLAS
    threads and backend threads, a :class:`ThreadBudget`). ``node`` and ``node_address``:
    with ``Orchestrator(cluster=...)``, the Ray node its actor runs on (None otherwise).
    """

    name: str
    pool: str
    state: str  # running, paused, restarting, replacing, draining, failed, closed
    binding: Mapping[str, Any]
    cpus: tuple[int, ...] | None
    executes: int
    failures: int
    restarts: int
    replacements: int
    in_flight: int
    latency: LatencySummary
    options: Mapping[str, Mapping[str, Any]]
    pending: Mapping[str, Mapping[str, Any]]
    paused: bool
    target_rate_hz: float | None
    last_error: str | None
    threads: ThreadBudget | None = None  # None: the worker has not loaded yet
    rejected: int = 0
    node: str | None = None  # Orchestrator(cluster=...): the Ray node id its actor runs on
    node_address: str | None = None  # ... and that node's address


@dataclass(frozen=True, slots=True)
class PoolStatistics:
    """One pool: each instance, and running totals.

    ``executes``, ``failures``, ``restarts``, ``replacements`` and ``rejected`` count everything the pool's
    instances did since it was loaded, including instances removed since (they never go
    down); ``in_flight`` is the sum over its current instances.
    """

    name: str
    method: str
    instances: tuple[InstanceStatistics, ...]
    executes: int
    failures: int
    restarts: int
    replacements: int
    in_flight: int
    routed: int  # executes routed by the pool (p.execute)
    keys: int  # sticky routing keys
    rejected: int = 0  # requests refused for the caller's mistake (not failures)

    def __getitem__(self, name: str) -> InstanceStatistics:
        for s in self.instances:
            if s.name == name:
                return s
        raise KeyError(name)


@dataclass(frozen=True, slots=True)
class OrchestratorStatistics:
    """The orchestrator: its pools and its policy engine.

    ``executes``, ``failures``, ``restarts`` and ``replacements`` are running totals over
    every pool it ever had (unloaded pools and removed instances included).
    """

    pools: tuple[PoolStatistics, ...]
    engine_runs: int
    changes_applied: int
    actions_applied: int
    proposals_rejected: int
    policy_errors: int
    signals: Mapping[str, Any]
    executes: int = 0
    failures: int = 0
    restarts: int = 0
    replacements: int = 0
    rejected: int = 0  # requests refused for the caller's mistake (not failures)

    def __getitem__(self, name: str) -> PoolStatistics:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)


@dataclass(frozen=True, slots=True)
class EngineRun:
    """What one run of the policy engine did (``await orch.refresh()`` returns it)."""

    policies: tuple[str, ...]  # the policies that ran
    changes: int  # option values changed (instance x backend x option)
    actions: int  # actions applied
    rejected: int  # proposal entries and actions rejected (logged)
    errors: int  # policies that raised (logged)
