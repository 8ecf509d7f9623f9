"""Policies shipped with orchestra (installed as ``orchestra.policies``).

A :class:`Policy` proposes runtime option values per (instance × backend) and instance actions
from the current :class:`Signals`; signal sources read them from the machine.
"""

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

__all__ = [
    "InstanceView",
    "Move",
    "Pause",
    "Policy",
    "Proposal",
    "Resume",
    "ScaleTo",
    "SignalSource",
    "Signals",
    "TargetRate",
]
