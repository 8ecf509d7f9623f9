"""The policy protocol: what a policy sees and what it may propose.

A policy is a pure-ish function of the current signals and the instances: it proposes option
values per (instance × backend) and instance actions. The orchestrator's policy engine runs
policies on signal changes and on a period, merges their proposals by priority, diffs them
against what is in force, and hands each instance one immutable snapshot that applies at its
next execute boundary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

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

SignalValue = float | int | bool | str | None


@dataclass(frozen=True, slots=True)
class Signals:
    """A snapshot of signal values by name (e.g. ``"battery.percent"``, ``"cpu.online"``).

    A signal that is not available here (no battery on a server) is absent: ``get`` returns
    None and ``name in signals`` is False. ``at`` is the monotonic time of the snapshot.
    """

    values: Mapping[str, SignalValue]
    at: float = 0.0

    def get(self, name: str, default: SignalValue = None) -> SignalValue:
        v = self.values.get(name)
        return default if v is None else v

    def __contains__(self, name: str) -> bool:
        return self.values.get(name) is not None


@dataclass(frozen=True, slots=True)
class InstanceView:
    """What a policy knows about one instance (read-only).

    Attributes:
        name: the instance name (e.g. ``"front"``).
        bind: its resource binding, e.g. ``{"npu0.core": 0}`` or ``{"cpu": (0, 1)}``.
        backends: backend ids its method delegates to.
        options: option values in force, per backend id.
        option_specs: per backend id, option name -> (type name, hot, choices or None).
        executions / failures: counters.
        latency_p50 / latency_p95: seconds over recent executes (0.0 when unknown): the
            time of the execute on the worker, not the queueing before it.
        frame_latency_p50 / frame_latency_p95: seconds over recent frames of the pipeline
            the instance serves, from capture to result (queueing included; 0.0 when
            unknown).
        serves_pipeline: the instance serves a pipeline (it has recorded frame latencies).
        paused: True when a policy paused it.
        pool: the name of the pool it belongs to. The engine shows every policy the running
            instances of every pool, so a policy that proposes ``ScaleTo`` groups them by
            this to name the pool it means. None when unknown (a view built by hand).
    """

    name: str
    bind: Mapping[str, Any] = field(default_factory=dict)
    backends: tuple[str, ...] = ()
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    option_specs: Mapping[str, Mapping[str, tuple[str, bool, tuple[Any, ...] | None]]] = field(default_factory=dict)
    executions: int = 0
    failures: int = 0
    latency_p50: float = 0.0
    latency_p95: float = 0.0
    paused: bool = False
    pool: str | None = None
    frame_latency_p50: float = 0.0
    frame_latency_p95: float = 0.0
    serves_pipeline: bool = False


@dataclass(frozen=True, slots=True)
class Pause:
    instance: str


@dataclass(frozen=True, slots=True)
class Resume:
    instance: str


@dataclass(frozen=True, slots=True)
class TargetRate:
    """Limit an instance to ``hz`` executes per second (None lifts the limit)."""

    instance: str
    hz: float | None


@dataclass(frozen=True, slots=True)
class Move:
    """Rebind an instance to another unit, e.g. ``{"npu0.core": 2}``."""

    instance: str
    bind: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ScaleTo:
    """Run ``count`` instances of a pool (the orchestrator adds or drains instances).

    Attributes:
        count: the number of instances to run (an int >= 0).
        pool: the name of the pool to scale (``InstanceView.pool``); None scales every pool
            of the orchestrator to ``count``. The engine rejects (logs, never raises) a name
            that is no pool. Its reason is ``Proposal.reasons[(pool, "", "ScaleTo")]``, or
            ``[("*", "", "ScaleTo")]`` (``POOL``) for every pool and as the fallback.
    """

    count: int
    pool: str | None = None


Action = Pause | Resume | TargetRate | Move | ScaleTo


@dataclass(frozen=True, slots=True)
class Proposal:
    """What one policy wants now.

    Attributes:
        options: instance -> backend id -> option -> value.
        actions: instance actions, and ``ScaleTo`` for pools.
        reasons: (instance, backend, option) -> why, e.g. ``"battery.percent=14 < 20"``;
            the engine's ``explain()`` reports it. An action's reason is keyed
            ``(instance, "", "Pause")`` (the action's class name); ``ScaleTo``'s is keyed
            ``(pool, "", "ScaleTo")``, or ``("*", "", "ScaleTo")`` when it names no pool.
    """

    options: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    actions: tuple[Action, ...] = ()
    reasons: Mapping[tuple[str, str, str], str] = field(default_factory=dict)


EMPTY = Proposal()


@runtime_checkable
class Policy(Protocol):
    """A policy. ``name`` identifies it in explanations; higher ``priority`` wins when two
    policies set the same option; ``signals`` names the signals it reads (the engine re-runs
    it when one of them changes). ``propose`` is shown the running instances of every pool of
    the orchestrator; ``InstanceView.pool`` says which pool each one belongs to."""

    name: str
    priority: int
    signals: tuple[str, ...]

    def propose(self, signals: Signals, instances: Sequence[InstanceView]) -> Proposal: ...


@runtime_checkable
class SignalSource(Protocol):
    """Reads some signals now. ``read`` must be quick and never raise for a missing signal:
    it leaves it out (or sets it to None)."""

    name: str

    def read(self) -> Mapping[str, SignalValue]: ...
