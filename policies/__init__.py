"""Policies shipped with orchestra (installed as ``orchestra.policies``).

A :class:`Policy` proposes runtime option values per (instance × backend) and instance actions
from the current :class:`Signals`; signal sources read them from the machine. See README.md
for every built-in policy and source.
"""

from ._builtin import (
    POOL,
    BatteryPolicy,
    CoreAvailabilityPolicy,
    LatencyTargetPolicy,
    MemoryPressurePolicy,
    ThermalPolicy,
)
from ._protocol import (
    InstanceView,
    Move,
    Pause,
    Policy,
    Proposal,
    Resume,
    ScaleTo,
    SignalSource,
    Signals,
    TargetRate,
)
from ._registry import (
    get_policy,
    get_source,
    load_policy,
    load_source,
    policy_names,
    register_policy,
    register_source,
    source_names,
)
from ._signals import (
    BatterySource,
    CpuSource,
    ManualClock,
    PressureSource,
    ScriptedSource,
    ThermalSource,
    parse_cpu_list,
)

__all__ = [
    "POOL",
    "BatteryPolicy",
    "BatterySource",
    "CoreAvailabilityPolicy",
    "CpuSource",
    "InstanceView",
    "LatencyTargetPolicy",
    "ManualClock",
    "MemoryPressurePolicy",
    "Move",
    "Pause",
    "Policy",
    "PressureSource",
    "Proposal",
    "Resume",
    "ScaleTo",
    "ScriptedSource",
    "SignalSource",
    "Signals",
    "TargetRate",
    "ThermalPolicy",
    "ThermalSource",
    "get_policy",
    "get_source",
    "load_policy",
    "load_source",
    "parse_cpu_list",
    "policy_names",
    "register_policy",
    "register_source",
    "source_names",
]
