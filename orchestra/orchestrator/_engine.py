"""The policy engine: signals in, one consistent option snapshot per instance out.

Each run:

1. polls every :class:`~orchestra.policies.SignalSource` (``read()`` on the loop: sources
   must be quick) into one :class:`~orchestra.policies.Signals`;
2. runs the policies that are due: all of them on the period, on ``refresh()`` and when
   the set of running instances changed (added, removed, failed, moved, paused), and
   between periods those whose listed ``signals`` changed since the last poll;
3. validates each proposal entry against the instance's backends' OptionSpecs (unknown
   instance / backend / option, wrong type or choice, or an init-only option the resource
   binding owns — hot ones it implies, like ``num_threads``, are defaults policies may
   override): bad entries are logged and skipped, a policy that raises is logged and keeps its
   last good proposal; nothing a policy does stops the engine;
4. applies the actions of the policies that ran (Pause/Resume, TargetRate, Move, ScaleTo;
   conflicts on one instance, or one pool for ScaleTo, go to the higher priority; an
   action's reason is ``Proposal.reasons[(instance, "", "Pause")]``). ``ScaleTo(n,
   pool="a")`` scales pool ``"a"`` only (its reason ``[("a", "", "ScaleTo")]``, else
   ``[("*", "", "ScaleTo")]``); ``ScaleTo(n)`` scales every pool (reason
   ``[("*", "", "ScaleTo")]``) and counts as one proposal per pool in conflicts, so a
   policy's later ``ScaleTo`` naming a pool overrides its earlier one for that pool. A
   ``ScaleTo`` naming no pool of the orchestrator is rejected (a ``policy action rejected``
   warning naming the policy and the pool); explain() records a scale under the pool's name;
5. merges every policy's latest option proposal — higher ``priority`` wins per
   (instance, backend, option), ties go to the policy listed first — over each instance's
   baseline (spec options, binding options, declared defaults: an option no policy
   proposes any more goes back to its baseline);
6. diffs against what is in force or pending and sends each instance its changes as ONE
   change: the worker publishes them back to back at one execute boundary
   (``set_options``, or ``prepare_backend_options`` on a helper thread
   for an init-only change of one backend), so every execute sees one consistent
   snapshot. Hot changes are in force for every execute that starts after the run;
   init-only ones once prepared (a run waits up to ``apply_timeout`` for that).

Every change is one structlog event (``backend option changed``) with the instance and
backend bound; ``explain()`` reports who set each value, why, on which signal values, when.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import anyio

from ..errors import InvalidArgumentError, OrchestraError
from ..policies import (
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
from ..telemetry import bound, get_logger
from ._instance import Instance, Origin
from ._stats import EngineRun

if TYPE_CHECKING:  # pragma: no cover
    from ._orchestrator import Orchestrator

__all__ = ["ActionExplanation", "Engine", "Explanation", "OptionExplanation"]

_log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class OptionExplanation:
    """Why one option of one instance has its value.

    ``source``: ``"policy"`` (then ``policy``, ``priority``, ``reason`` and the values of the
    policy's ``signals`` when it proposed it), ``"binding"``, ``"spec"`` or ``"default"``.
    ``at``/``wall``: when it was set (``time.monotonic()`` / ``time.time()``).
    ``in_force``: the instance's Method has it in force (False: pending the next execute).
    ``node``/``node_address``: with ``Orchestrator(cluster=...)``, the Ray node the
    instance runs on, where the value takes effect (None otherwise).
    """

    instance: str
    backend: str
    option: str
    value: Any
    in_force: bool
    source: str
    policy: str | None
    priority: int | None
    reason: str
    signals: Mapping[str, Any]
    at: float
    wall: float
    node: str | None = None
    node_address: str | None = None


@dataclass(frozen=True, slots=True)
class ActionExplanation:
    """The latest action of each kind applied to an instance (``pause``, ``resume``,
    ``target_rate``, ``move``, ``scale``) and which policy asked for it."""

    instance: str
    action: str
    value: Any
    policy: str | None
    priority: int | None
    reason: str
    signals: Mapping[str, Any]
    at: float
    wall: float


@dataclass(frozen=True, slots=True)
class Explanation:
    """What ``orch.explain()`` returns. ``explanation["front"]["NpuSimBackend"]["power_mode"]``."""

    options: tuple[OptionExplanation, ...]
    actions: tuple[ActionExplanation, ...]

    def __getitem__(self, instance: str) -> Mapping[str, Mapping[str, OptionExplanation]]:
        out: dict[str, dict[str, OptionExplanation]] = {}
        for e in self.options:
            if e.instance == instance:
                out.setdefault(e.backend, {})[e.option] = e
        if not out and not any(a.instance == instance for a in self.actions):
            raise KeyError(instance)
        return MappingProxyType(out)

    def actions_of(self, instance: str) -> dict[str, ActionExplanation]:
        return {a.action: a for a in self.actions if a.instance == instance}

    def format(self) -> str:
        """One line per option and action, for people."""
        lines = []
        for e in self.options:
            who = f"{e.policy} (priority {e.priority}): {e.reason}" if e.source == "policy" else e.source
            sig = f" [{', '.join(f'{k}={v!r}' for k, v in e.signals.items())}]" if e.signals else ""
            pend = "" if e.in_force else " (pending)"
            on = f" on node {e.node[:8]} ({e.node_address})" if e.node else ""
            lines.append(f"{e.instance}{on} {e.backend}.{e.option} = {e.value!r}{pend} <- {who}{sig}{_when(e.wall)}")
        for a in self.actions:
            lines.append(f"{a.instance} {a.action} {a.value!r} <- {a.policy}: {a.reason}{_when(a.wall)}")
        return "\n".join(lines)


def _when(wall: float) -> str:
    """`` at HH:MM:SS`` (local time), or nothing for a value that was never set (a default)."""
    return f" at {time.strftime('%H:%M:%S', time.localtime(wall))}" if wall else ""


@dataclass(slots=True)
class _Latest:
    """A policy's latest good proposal (its options persist until it proposes again)."""

    options: dict[tuple[str, str, str], tuple[Any, str]] = field(default_factory=dict)
    signals: Mapping[str, Any] = field(default_factory=dict)
    at: float = 0.0
    wall: float = 0.0


_ACTIONS = (Pause, Resume, TargetRate, Move, ScaleTo)


class Engine:
    """Runs policies and applies their merged proposals (owned by the Orchestrator)."""

    def __init__(self, orch: Orchestrator, policies: Sequence[Policy], sources: Sequence[SignalSource],
                 period: float | None, poll_interval: float | None) -> None:
        self._orch = orch
        names = set()
        for p in policies:
            ok = (isinstance(getattr(p, "name", None), str) and isinstance(getattr(p, "priority", None), int)
                  and isinstance(getattr(p, "signals", None), (tuple, list)) and callable(getattr(p, "propose", None)))
            if not ok:
                raise InvalidArgumentError(f"policy {p!r} does not implement orchestra.policies.Policy "
                                           f"(name: str, priority: int, signals: tuple[str, ...], propose())")
            if p.name in names:
                raise InvalidArgumentError(f"two policies are named {p.name!r}; policy names must be unique")
            names.add(p.name)
        for s in sources:
            if not isinstance(getattr(s, "name", None), str) or not callable(getattr(s, "read", None)):
                raise InvalidArgumentError(f"signal source {s!r} does not implement orchestra.policies.SignalSource "
                                           f"(name: str, read())")
        if period is not None and (isinstance(period, bool) or not isinstance(period, (int, float)) or not 0 < period < math.inf):
            raise InvalidArgumentError(f"period must be a number of seconds > 0 or None, got {period!r}")
        if poll_interval is not None and (isinstance(poll_interval, bool) or not isinstance(poll_interval, (int, float))
                                          or not 0 < poll_interval < math.inf):
            raise InvalidArgumentError(f"poll_interval must be a number of seconds > 0 or None, got {poll_interval!r}")
        self.policies = tuple(policies)
        self.sources = tuple(sources)
        self.period = period
        self.poll_interval = poll_interval if poll_interval is not None else period
        self._order = {p.name: k for k, p in enumerate(self.policies)}
        self._latest: dict[str, _Latest] = {}
        self._values: Mapping[str, Any] = {}
        self._next_full = 0.0
        self._shape: tuple = ()
        self._lock = anyio.Lock()
        self._actions: dict[tuple[str, str], ActionExplanation] = {}
        self.runs = 0
        self.changes = 0
        self.actions = 0
        self.rejected = 0
        self.errors = 0

    # -- signals --------------------------------------------------------------------------
    def poll(self) -> Signals:
        values: dict[str, Any] = {}
        for s in self.sources:
            try:
                got = s.read()
                for k, v in got.items():
                    values.setdefault(k, v)
            except Exception as exc:  # noqa: BLE001 - a broken source must not stop the engine
                _log.warning("signal source failed", source=getattr(s, "name", repr(s)), error=repr(exc))
        return Signals(MappingProxyType(values), time.monotonic())

    @property
    def signals(self) -> Mapping[str, Any]:
        return self._values

    # -- the loop -------------------------------------------------------------------------
    async def serve(self) -> None:
        """Runs forever: a poll every ``poll_interval``, every policy every ``period``."""
        if self.period is None:
            return
        while True:
            await anyio.sleep(self.poll_interval)
            try:
                await self.run(force=False)
            except Exception as exc:  # noqa: BLE001 - the engine never dies
                _log.exception("policy engine run failed", error=repr(exc))

    async def run(self, force: bool = True) -> EngineRun:
        async with self._lock:
            return await self._run(force)

    async def _run(self, force: bool) -> EngineRun:
        orch = self._orch
        signals = self.poll()
        now, wall = time.monotonic(), time.time()
        due = force or self.period is None or now >= self._next_full
        if due and self.period is not None:
            self._next_full = now + self.period
        old = self._values
        changed = {k for k in set(old) | set(signals.values) if old.get(k) != signals.values.get(k)}
        self._values = signals.values
        live = orch._live()
        shape = tuple((i.name, i.paused, tuple(i.reservation.slots)) for i in live)
        if shape != self._shape:  # instances came, went, moved, paused: every policy runs
            self._shape = shape
            due = True
        todo = [p for p in self.policies
                if due or p.name not in self._latest or changed.intersection(p.signals)]
        views = tuple(self._view(i) for i in live)
        rejected = errors = 0
        actions: list[tuple[Policy, Any, Mapping[str, Any], str]] = []
        for p in todo:
            try:
                prop = p.propose(signals, views)
                if not isinstance(prop, Proposal):
                    raise TypeError(f"propose() returned {type(prop).__name__}, expected a Proposal")
            except Exception as exc:  # noqa: BLE001 - logged; its last good proposal stays
                errors += 1
                _log.error("policy failed", policy=p.name, error=f"{type(exc).__name__}: {exc}")
                continue
            sig = MappingProxyType({name: signals.get(name) for name in p.signals})
            latest = _Latest({}, sig, now, wall)
            opts, bad = self._check_options(p, prop)
            latest.options = opts
            rejected += bad
            self._latest[p.name] = latest
            for a in prop.actions:
                why = self._check_action(a)
                if why:
                    rejected += 1
                    named = {"pool": a.pool} if isinstance(a, ScaleTo) and a.pool is not None else {}
                    _log.warning("policy action rejected", policy=p.name, action=repr(a), reason=why, **named)
                    continue
                actions.append((p, a, sig, _action_reason(prop, a)))
        n_actions, bad = await self._apply_actions(actions, now, wall)
        rejected += bad
        n_changes, acks = self._apply_options(now, wall)
        if acks:
            with anyio.move_on_after(orch.apply_timeout):
                for inst, fut in acks:
                    try:
                        await fut
                    except Exception as exc:  # noqa: BLE001 - logged; the engine goes on
                        with bound(instance=inst.name, pool=inst.pool.name):
                            _log.error("applying backend options failed", error=repr(exc))
        self.runs += 1
        self.changes += n_changes
        self.actions += n_actions
        self.rejected += rejected
        self.errors += errors
        return EngineRun(tuple(p.name for p in todo), n_changes, n_actions, rejected, errors)

    # -- views and validation -------------------------------------------------------------
    @staticmethod
    def _view(inst: Instance) -> InstanceView:
        pool = inst.pool
        options = {}
        specs = {}
        for b in pool.backends:
            bs = pool.option_specs[b]
            options[b] = MappingProxyType({k: inst.value(b, k) for k in bs})
            specs[b] = MappingProxyType({k: (s.type.__name__, s.hot, s.choices) for k, s in bs.items()})
        lat = inst.latency.summary()
        frames = inst.frame_latency.summary() if inst.serves_pipeline else None
        ex, fa, _, _ = inst._counts()
        return InstanceView(name=inst.name, bind=inst.reservation.bind, backends=pool.backends,
                            options=MappingProxyType(options), option_specs=MappingProxyType(specs),
                            executions=ex, failures=fa, latency_p50=lat.p50,
                            latency_p95=lat.p95, paused=inst.paused, pool=pool.name,
                            frame_latency_p50=frames.p50 if frames else 0.0,
                            frame_latency_p95=frames.p95 if frames else 0.0,
                            serves_pipeline=frames is not None)

    def _check_options(self, p: Policy, prop: Proposal) -> tuple[dict[tuple[str, str, str], tuple[Any, str]], int]:
        out: dict[tuple[str, str, str], tuple[Any, str]] = {}
        bad = 0
        reasons = prop.reasons if isinstance(prop.reasons, Mapping) else {}
        options = prop.options if isinstance(prop.options, Mapping) else None
        if options is None:
            _log.warning("policy proposal rejected", policy=p.name, reason=f"options must be a mapping, got {type(prop.options).__name__}")
            return out, 1
        for iname, per in options.items():
            if not isinstance(per, Mapping):
                bad += 1
                _log.warning("policy proposal rejected", policy=p.name, instance=iname, reason="expected backend -> option -> value")
                continue
            for b, vals in per.items():
                if not isinstance(vals, Mapping):
                    bad += 1
                    _log.warning("policy proposal rejected", policy=p.name, instance=iname, backend=b, reason="expected option -> value")
                    continue
                for opt, value in vals.items():
                    ok, v = self._check_option(iname, b, opt, value)
                    if ok:
                        out[(iname, b, opt)] = (v, str(reasons.get((iname, b, opt), "")))
                    else:
                        bad += 1
                        with bound(instance=iname, backend=b):
                            _log.warning("policy proposal rejected", policy=p.name, option=opt, value=value, reason=v)
        return out, bad

    def _check_option(self, iname: str, b: str, opt: str, value: Any) -> tuple[bool, Any]:
        inst = self._orch._instances.get(iname)
        if inst is None:
            return False, f"no instance {iname!r} (instances: {', '.join(self._orch._instances) or 'none'})"
        specs = inst.pool.option_specs.get(b)
        if specs is None:
            return False, f"instance {iname!r} does not use backend {b!r} (it uses: {', '.join(inst.pool.backends) or 'none'})"
        s = specs.get(opt)
        if s is None:
            return False, f"backend {b!r} has no option {opt!r} (options: {', '.join(specs) or 'none'})"
        if opt in inst.reservation.options.get(b, {}) and not s.hot:
            return False, (f"{b} option {opt!r} is init-only and set by the resource binding "
                           f"{dict(inst.reservation.bind)}; propose Move instead")
        try:
            return True, s.check(value, b)
        except OrchestraError as exc:
            return False, exc.message

    def _check_action(self, a: Any) -> str:
        if not isinstance(a, _ACTIONS):
            return f"unknown action type {type(a).__name__}"
        if isinstance(a, ScaleTo):
            if isinstance(a.count, bool) or not isinstance(a.count, int) or a.count < 0:
                return f"ScaleTo.count must be an int >= 0, got {a.count!r}"
            if a.pool is not None and not isinstance(a.pool, str):
                return f"ScaleTo.pool must be a pool name or None, got {a.pool!r}"
            if a.pool is not None and a.pool not in self._orch._pools:
                return f"no pool {a.pool!r} (pools: {', '.join(self._orch._pools) or 'none'})"
            return ""
        if a.instance not in self._orch._instances:
            return f"no instance {a.instance!r} (instances: {', '.join(self._orch._instances) or 'none'})"
        if isinstance(a, TargetRate) and a.hz is not None and (
                isinstance(a.hz, bool) or not isinstance(a.hz, (int, float)) or not 0 < a.hz < math.inf):
            return f"TargetRate.hz must be a number > 0 or None, got {a.hz!r}"
        if isinstance(a, Move) and not isinstance(a.bind, Mapping):
            return f"Move.bind must be a mapping, got {a.bind!r}"
        return ""

    # -- applying -------------------------------------------------------------------------
    def _rank(self, p: Policy) -> tuple[int, int]:
        return (-p.priority, self._order[p.name])

    async def _apply_actions(self, actions: list[tuple[Policy, Any, Mapping[str, Any], str]],
                             now: float, wall: float) -> tuple[int, int]:
        orch = self._orch
        winners: dict[tuple[str, str], tuple[Policy, Any, Mapping[str, Any], str]] = {}
        for entry in actions:  # later actions of one policy override its earlier ones
            p, a = entry[0], entry[1]
            if isinstance(a, ScaleTo):  # ("scale", pool name): one per pool it scales
                keys = [("scale", a.pool)] if a.pool is not None else [("scale", name) for name in orch._pools]
            else:
                keys = [("pause" if isinstance(a, (Pause, Resume)) else "rate" if isinstance(a, TargetRate) else "move",
                         a.instance)]
            for key in keys:
                have = winners.get(key)
                if have is None or self._rank(p) <= self._rank(have[0]):
                    winners[key] = entry
        applied = bad = 0
        for (kind, iname), (p, a, sig, reason) in winners.items():
            def record(instance: str, name: str, value: Any) -> None:
                self._actions[(instance, name)] = ActionExplanation(instance, name, value, p.name, p.priority, reason,
                                                                    sig, now, wall)
                with bound(instance=instance):
                    _log.info(f"instance {name}", value=value, policy=p.name, reason=reason, signals=dict(sig))
            try:
                if kind == "scale":
                    pool = orch._pools.get(iname)
                    if pool is None:  # unloaded while earlier actions were applied
                        continue
                    live = sum(1 for i in pool if i._state not in ("failed", "closed"))
                    if live != a.count:
                        await pool.scale(a.count)
                        self._actions[(pool.name, "scale")] = ActionExplanation(
                            pool.name, "scale", a.count, p.name, p.priority, reason, sig, now, wall)
                        _log.info("pool scaled", pool=pool.name, count=a.count, policy=p.name, reason=reason)
                        applied += 1
                    continue
                inst = orch._instances.get(iname)
                if inst is None or inst._state in ("failed", "closed", "draining"):
                    continue
                if isinstance(a, Pause) and not inst.paused:
                    inst.pause()
                    record(iname, "pause", True)
                    applied += 1
                elif isinstance(a, Resume) and inst.paused:
                    inst.resume()
                    record(iname, "resume", True)
                    applied += 1
                elif isinstance(a, TargetRate) and inst.target_rate_hz != a.hz:
                    inst.set_target_rate(a.hz)
                    record(iname, "target_rate", a.hz)
                    applied += 1
                elif isinstance(a, Move):
                    origin = Origin("policy", None, p.name, p.priority, reason, sig, now, wall)
                    if await inst.pool.move(iname, a.bind, origin=origin):
                        record(iname, "move", dict(inst.reservation.bind))
                        applied += 1
            except Exception as exc:  # noqa: BLE001 - logged, never fatal
                bad += 1
                with bound(**({"pool": iname} if kind == "scale" else {"instance": iname})):
                    _log.warning("policy action failed", policy=p.name, action=repr(a),
                                 error=exc.message if isinstance(exc, OrchestraError) else repr(exc))
        return applied, bad

    def _apply_options(self, now: float, wall: float) -> tuple[int, list]:
        merged: dict[tuple[str, str, str], tuple[Policy, Any, str, _Latest]] = {}
        for p in sorted(self.policies, key=self._rank):
            latest = self._latest.get(p.name)
            if latest is None:
                continue
            for key, (value, reason) in latest.options.items():
                if key not in merged:
                    merged[key] = (p, value, reason, latest)
        per_instance: dict[str, dict[tuple[str, str], Origin]] = {}
        for (iname, b, opt), (p, value, reason, latest) in merged.items():
            per_instance.setdefault(iname, {})[(b, opt)] = Origin(
                "policy", value, p.name, p.priority, reason, latest.signals, latest.at, latest.wall)
        n = 0
        acks = []
        for inst in self._orch._live():
            targets = per_instance.get(inst.name, {})
            for key, o in list(inst.origins.items()):
                if o.source == "policy" and key not in targets:  # no policy wants it any more
                    targets[key] = inst.baseline_origin(*key)
            changes: dict[str, dict[str, Any]] = {}
            for (b, opt), o in targets.items():
                cur = inst.value(b, opt)
                prev = inst.origins.get((b, opt))
                if cur != o.value:
                    changes.setdefault(b, {})[opt] = o.value
                    inst.origins[(b, opt)] = _stamp(o, now, wall)
                    with bound(instance=inst.name, backend=b):
                        _log.info("backend option changed", pool=inst.pool.name, option=opt, value=o.value,
                                  previous=cur, source=o.source, policy=o.policy, reason=o.reason,
                                  signals=dict(o.signals))
                elif prev is None or (prev.source, prev.policy) != (o.source, o.policy):
                    inst.origins[(b, opt)] = _stamp(o, now, wall)
            if changes:
                n += sum(len(v) for v in changes.values())
                fut = inst._send(changes)
                if any(not inst.pool.option_specs[b][k].hot for b, vals in changes.items() for k in vals):
                    acks.append((inst, fut))
                else:
                    fut.add_done_callback(_log_failure(inst))
        return n, acks

    # -- explain --------------------------------------------------------------------------
    def explain(self) -> Explanation:
        out = []
        for inst in self._orch._instances.values():
            in_force = inst.options()
            node, address = inst.node or (None, None)
            for b in inst.pool.backends:
                for opt in inst.pool.option_specs[b]:
                    value = inst.value(b, opt)
                    o = inst.origins.get((b, opt)) or inst.baseline_origin(b, opt)
                    out.append(OptionExplanation(
                        inst.name, b, opt, value, in_force.get(b, {}).get(opt, _NONE) == value, o.source, o.policy,
                        o.priority, o.reason, MappingProxyType(dict(o.signals)), o.at, o.wall, node, address))
        return Explanation(tuple(out), tuple(self._actions.values()))


_NONE = object()


def _action_reason(prop: Proposal, a: Any) -> str:
    """An action's reason: ``reasons[(instance, "", "Pause")]``; for ``ScaleTo``
    ``reasons[(pool, "", "ScaleTo")]`` when it names a pool, else (or when that is missing)
    ``reasons[("*", "", "ScaleTo")]`` (the built-in policies' keys)."""
    reasons = prop.reasons if isinstance(prop.reasons, Mapping) else {}
    kind = type(a).__name__
    first = (a.pool if a.pool is not None else "*") if isinstance(a, ScaleTo) else getattr(a, "instance", "*")
    for key in ((first, "", kind), ("*", "", kind)):
        if key in reasons:
            return str(reasons[key])
    return ""


def _stamp(o: Origin, now: float, wall: float) -> Origin:
    if o.source == "policy":
        return o  # stamped when the policy proposed it
    return Origin(o.source, o.value, at=now, wall=wall)


def _log_failure(inst: Instance):  # type: ignore[no-untyped-def]
    def done(fut: Any) -> None:
        if not fut.cancelled() and fut.exception() is not None:
            with bound(instance=inst.name, pool=inst.pool.name):
                _log.error("applying backend options failed", error=repr(fut.exception()))
    return done
