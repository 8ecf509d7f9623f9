"""The orchestrator: many instances of one program method at once, each on its own worker
thread and bound hardware, retuned between executes by a policy engine.

``Orchestrator`` (anyio; runs on asyncio with or without uvloop) loads a method as a
:class:`Pool` of :class:`Instance` objects described by :class:`InstanceSpec` and bound to
units of a :class:`ResourcePool` (:class:`NpuSimResource`, :class:`CpuResource`).
``Orchestrator(cluster="HOST:PORT")`` runs every instance's Method in a Ray actor on the
node of a Ray cluster that has its binding (:class:`ClusterError`, :class:`PlacementError`,
:class:`ActorLostError`; Ray is imported only then).
"""

from ._engine import ActionExplanation, Explanation, OptionExplanation
from ._errors import (
    DeadlineError,
    ExecuteError,
    ExecuteRejectedError,
    InstanceClosedError,
    InstanceFailedError,
    ResourceError,
)
from ._instance import Execution, Instance, Origin, Pool
from ._orchestrator import Orchestrator
from ._ray import ActorLostError, ClusterError, PlacementError
from ._resources import CpuResource, NpuSimResource, Reservation, Resource, ResourcePool
from ._spec import InstanceSpec, RestartPolicy
from ._stats import EngineRun, InstanceStatistics, OrchestratorStatistics, PoolStatistics, ThreadBudget

__all__ = [
    "ActionExplanation",
    "ActorLostError",
    "ClusterError",
    "CpuResource",
    "DeadlineError",
    "EngineRun",
    "ExecuteError",
    "ExecuteRejectedError",
    "Execution",
    "Explanation",
    "Instance",
    "InstanceClosedError",
    "InstanceFailedError",
    "InstanceSpec",
    "InstanceStatistics",
    "NpuSimResource",
    "OptionExplanation",
    "Orchestrator",
    "OrchestratorStatistics",
    "Origin",
    "PlacementError",
    "Pool",
    "PoolStatistics",
    "Reservation",
    "Resource",
    "ResourceError",
    "ResourcePool",
    "RestartPolicy",
    "ThreadBudget",
]
