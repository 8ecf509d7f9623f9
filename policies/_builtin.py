"""The policies shipped with orchestra.

Each is a small class with ``name``, ``priority``, ``signals`` and
``propose(signals, instances) -> Proposal``, configured through its constructor. A policy
proposes options only for backends an instance actually delegates to
(``InstanceView.backends``), and leaves out an option the instance's backend doesn't declare
or a value outside the option's choices when ``InstanceView.option_specs`` says so (the
engine would reject it). Every proposed option and action comes with a human-readable reason
in ``Proposal.reasons``; reasons for pool actions (``ScaleTo``) are keyed
``(pool, "", "ScaleTo")``, or ``(POOL, "", "ScaleTo")`` when the instances shown don't name
their pool (``InstanceView.pool`` is None; then the ``ScaleTo`` names none either).

The engine shows a policy the running instances of every pool. The policies that scale
(``core_availability``, ``memory_pressure``) group them by ``InstanceView.pool`` and propose
one ``ScaleTo`` per pool they change, naming it. Policies with hysteresis or a cool-down keep
that state on the policy object (per pool or per instance where it is about one); one policy
object serves one orchestrator.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from orchestra.errors import InvalidArgumentError
from orchestra.telemetry import get_logger

from ._protocol import EMPTY, Action, InstanceView, Proposal, ScaleTo, Signals

__all__ = [
    "POOL",
    "BatteryPolicy",
    "CoreAvailabilityPolicy",
    "LatencyTargetPolicy",
    "MemoryPressurePolicy",
    "ThermalPolicy",
    "applicable",
    "fmt",
]

POOL = "*"
"""The name in the reason key of a ``ScaleTo`` that names no pool: ``(POOL, "", "ScaleTo")``."""

_log = get_logger(__name__)

OptionsByBackend = Mapping[str, Mapping[str, Any]]


# ---------------------------------------------------------------------------- helpers


def fmt(value: Any) -> str:
    """A value as it reads in a reason: ``14.0`` → ``14``, ``0.0453`` → ``0.0453``, strings as is."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.6g}"
    return str(value)


def _number(signals: Signals, name: str) -> float | None:
    """A signal as a finite number, or None when absent or not a number."""
    v = signals.get(name)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return v


def _flag(signals: Signals, name: str) -> bool | None:
    v = signals.get(name)
    if isinstance(v, bool):
        return v
    if isinstance(v, int | float):
        return bool(v)
    if isinstance(v, str):
        return v.strip().lower() in ("1", "true", "yes", "on", "charging")
    return None


def applicable(instance: InstanceView, backend: str, option: str, value: Any) -> bool:
    """True when ``instance`` delegates to ``backend`` and, as far as its ``option_specs``
    tell, the backend declares ``option`` and allows ``value``."""
    if backend not in instance.backends:
        return False
    specs = instance.option_specs.get(backend)
    if not specs:
        return True  # nothing known: let the engine validate
    spec = specs.get(option)
    if spec is None:
        _log.debug("policy option not declared", instance=instance.name, backend=backend, option=option)
        return False
    choices = spec[2]
    if choices is not None and value not in choices:
        _log.debug("policy value not allowed", instance=instance.name, backend=backend, option=option, value=value)
        return False
    return True


def _pool_sizes(instances: Iterable[InstanceView]) -> dict[str | None, int]:
    """How many of ``instances`` each pool has, pools in the order they first appear (None:
    views that don't name their pool)."""
    sizes: dict[str | None, int] = {}
    for inst in instances:
        sizes[inst.pool] = sizes.get(inst.pool, 0) + 1
    return sizes


def _in_pool(pool: str | None, sizes: Mapping[str | None, int]) -> str:
    """`` in pool 'a'`` when several pools are shown; nothing for one (its reasons read as
    they always did)."""
    return f" in pool {pool!r}" if len(sizes) > 1 and pool is not None else ""


def _drain(sizes: Mapping[str | None, int], total: int) -> dict[str | None, int]:
    """Counts per pool summing to ``total`` where it can: one instance at a time off the
    largest pool (ties: the one listed last), never a pool below 1."""
    counts = dict(sizes)
    order = list(reversed(counts))
    while sum(counts.values()) > total:
        pool = max(order, key=counts.__getitem__)
        if counts[pool] <= 1:
            break
        counts[pool] -= 1
    return counts


def _restore(sizes: Mapping[str | None, int], marks: Mapping[str | None, int], total: int) -> dict[str | None, int]:
    """Counts per pool summing to at most ``total``: one instance at a time onto the pool
    furthest below its mark (ties: the one listed first), never a pool above its mark."""
    counts = dict(sizes)
    while sum(counts.values()) < total:
        behind = [p for p in counts if counts[p] < marks.get(p, 0)]
        if not behind:
            break
        counts[max(behind, key=lambda p: marks[p] - counts[p])] += 1
    return counts


class _Builder:
    """Collects options, actions and reasons for one Proposal."""

    def __init__(self) -> None:
        self.options: dict[str, dict[str, dict[str, Any]]] = {}
        self.actions: list[Action] = []
        self.reasons: dict[tuple[str, str, str], str] = {}

    def option(self, instance: InstanceView, backend: str, option: str, value: Any, reason: str) -> bool:
        if not applicable(instance, backend, option, value):
            return False
        self.options.setdefault(instance.name, {}).setdefault(backend, {})[option] = value
        self.reasons[(instance.name, backend, option)] = reason
        return True

    def options_for(self, instance: InstanceView, options: OptionsByBackend, reason: str) -> None:
        for backend, values in options.items():
            for option, value in values.items():
                self.option(instance, backend, option, value, reason)

    def scale_to(self, count: int, reason: str, pool: str | None = None) -> None:
        self.actions.append(ScaleTo(count, pool))
        self.reasons[(POOL if pool is None else pool, "", "ScaleTo")] = reason

    def build(self) -> Proposal:
        if not self.options and not self.actions:
            return EMPTY
        return Proposal(options=self.options, actions=tuple(self.actions), reasons=self.reasons)


def _check_number(owner: str, param: str, value: Any, *, minimum: float | None = None, integer: bool = False) -> None:
    kinds = int if integer else int | float
    if isinstance(value, bool) or not isinstance(value, kinds) or (isinstance(value, float) and not math.isfinite(value)):
        want = "an int" if integer else "a number"
        raise InvalidArgumentError(f"{owner}: parameter {param!r} must be {want}, got {type(value).__name__} {value!r}")
    if minimum is not None and value < minimum:
        raise InvalidArgumentError(f"{owner}: parameter {param!r} must be >= {fmt(minimum)}, got {value!r}")


def _check_str(owner: str, param: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidArgumentError(f"{owner}: parameter {param!r} must be a non-empty string, got {value!r}")


def _check_options(owner: str, param: str, value: Any) -> dict[str, dict[str, Any]]:
    """``{backend: {option: value}}`` checked and copied."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidArgumentError(f"{owner}: parameter {param!r} must map backend -> {{option: value}}, got {value!r}")
    out: dict[str, dict[str, Any]] = {}
    for backend, options in value.items():
        if not isinstance(backend, str) or not isinstance(options, Mapping):
            raise InvalidArgumentError(
                f"{owner}: parameter {param!r} must map backend -> {{option: value}}; entry {backend!r}: {options!r}"
            )
        for option in options:
            if not isinstance(option, str):
                raise InvalidArgumentError(f"{owner}: parameter {param!r}: backend {backend!r} option names are strings, got {option!r}")
        out[backend] = dict(options)
    return out


def _check_identity(owner: str, name: Any, priority: Any) -> None:
    _check_str(owner, "name", name)
    _check_number(owner, "priority", priority, integer=True)


# ---------------------------------------------------------------------------- battery


class BatteryPolicy:
    """Saves power when the battery runs low, with hysteresis.

    Reads ``battery.percent`` (0–100) and ``battery.charging`` (bool; absent counts as not
    charging). Switches to ``low_options`` when ``percent < low`` and not charging; switches
    back to ``normal_options`` only when ``percent >= high`` or charging. In between it keeps
    its current mode, so a level hovering around ``low`` doesn't flap.

    Proposes, for every instance, the current mode's options for the backends that instance
    delegates to. Nothing when there is no battery signal at all (a server), or in normal
    mode when ``normal_options`` is empty (then whatever was configured stays in force).

    Args:
        low: percent below which (not charging) the low-power options apply.
        high: percent at or above which the normal options apply again (``>= low``).
        low_options: backend id -> option -> value in low-power mode.
        normal_options: backend id -> option -> value in normal mode.
        name: the policy's name in explanations.
        priority: higher wins when two policies set the same option.
    """

    signals = ("battery.percent", "battery.charging")

    def __init__(
        self,
        low: float = 20,
        high: float = 30,
        low_options: OptionsByBackend | None = None,
        normal_options: OptionsByBackend | None = None,
        *,
        name: str = "battery",
        priority: int = 80,
    ) -> None:
        owner = "BatteryPolicy"
        _check_identity(owner, name, priority)
        _check_number(owner, "low", low, minimum=0)
        _check_number(owner, "high", high, minimum=0)
        if high < low:
            raise InvalidArgumentError(f"{owner}: parameter 'high' ({fmt(high)}) must be >= 'low' ({fmt(low)})")
        if low_options is None:
            low_options = {"NpuSimBackend": {"power_mode": "low"}}
        if normal_options is None:
            normal_options = {"NpuSimBackend": {"power_mode": "balanced"}}
        self.name = name
        self.priority = priority
        self.low = low
        self.high = high
        self.low_options = _check_options(owner, "low_options", low_options)
        self.normal_options = _check_options(owner, "normal_options", normal_options)
        self._saving = False

    @property
    def mode(self) -> str:
        """``"low"`` or ``"normal"``: the mode it is in now."""
        return "low" if self._saving else "normal"

    def propose(self, signals: Signals, instances: Sequence[InstanceView]) -> Proposal:
        percent = _number(signals, "battery.percent")
        charging = _flag(signals, "battery.charging")
        if percent is None and charging is None:
            return EMPTY
        p = f"battery.percent={fmt(percent)}" if percent is not None else "battery.percent unknown"
        if self._saving:
            if charging:
                self._saving, why = False, "battery.charging=True"
            elif percent is not None and percent >= self.high:
                self._saving, why = False, f"{p} >= high={fmt(self.high)}"
            elif percent is not None:
                why = f"{p} < high={fmt(self.high)} and not charging (stays low until >= high or charging)"
            else:
                why = f"{p} and not charging (stays low until >= high or charging)"
        else:
            if percent is not None and percent < self.low and not charging:
                self._saving, why = True, f"{p} < low={fmt(self.low)} and not charging"
            elif charging:
                why = "battery.charging=True"
            elif percent is not None:
                why = f"{p} >= low={fmt(self.low)}"
            else:
                why = f"{p}"
        options = self.low_options if self._saving else self.normal_options
        b = _Builder()
        for inst in instances:
            b.options_for(inst, options, why)
        return b.build()

    def __repr__(self) -> str:
        return f"BatteryPolicy(low={fmt(self.low)}, high={fmt(self.high)}, mode={self.mode!r}, name={self.name!r})"


# ---------------------------------------------------------------------------- cores


class CoreAvailabilityPolicy:
    """Shares the CPUs this process may use among the instances.

    Reads ``cpu.available`` (CPUs; when absent, the minimum of ``cpu.online``,
    ``cpu.affinity`` and ``cpu.quota``). For every instance delegating to ``backend`` it
    proposes ``option = max(min_threads, floor(available - reserve) // n)``, capped at
    ``max_threads``, where ``n`` is the number of such instances.

    With ``scale_instances``, when the CPUs fit fewer instances than run
    (``fit = floor(available - reserve) // min_threads < n``) it also proposes ``ScaleTo``
    that many (at least 1), and shares the CPUs among that many. When CPUs come back it
    proposes ``ScaleTo`` back up, never above the count it scaled down from. The ``n``
    instances may belong to several pools (``InstanceView.pool``): then it drains one
    instance at a time off the largest pool (ties: the one listed last; never a pool below 1)
    until ``fit`` remain, and on the way back adds one at a time to the pool furthest below
    the count it scaled that pool down from; it proposes one ``ScaleTo`` naming the pool for
    each pool it changes. With one pool this is the count above.

    Args:
        backend: the backend id whose thread count it sets (``NumpyCpuBackend``; for
            ``OnnxRuntimeBackend`` use ``option="intra_op_num_threads"``, an init-only option:
            each change re-initialises that instance's delegates).
        option: the option name (an int).
        min_threads: the fewest threads an instance gets (>= 1).
        max_threads: the most threads an instance gets, or None for no cap.
        scale_instances: also propose ``ScaleTo`` when there are fewer CPUs than instances.
        reserve: CPUs held back for other work (the event loop, the application).
        name: the policy's name in explanations.
        priority: higher wins when two policies set the same option.
    """

    signals = ("cpu.available", "cpu.online", "cpu.affinity", "cpu.quota")

    def __init__(
        self,
        backend: str = "NumpyCpuBackend",
        option: str = "num_threads",
        min_threads: int = 1,
        max_threads: int | None = None,
        scale_instances: bool = False,
        reserve: float = 0,
        *,
        name: str = "core_availability",
        priority: int = 50,
    ) -> None:
        owner = "CoreAvailabilityPolicy"
        _check_identity(owner, name, priority)
        _check_str(owner, "backend", backend)
        _check_str(owner, "option", option)
        _check_number(owner, "min_threads", min_threads, minimum=1, integer=True)
        if max_threads is not None:
            _check_number(owner, "max_threads", max_threads, minimum=min_threads, integer=True)
        _check_number(owner, "reserve", reserve, minimum=0)
        if not isinstance(scale_instances, bool):
            raise InvalidArgumentError(f"{owner}: parameter 'scale_instances' must be a bool, got {scale_instances!r}")
        self.name = name
        self.priority = priority
        self.backend = backend
        self.option = option
        self.min_threads = min_threads
        self.max_threads = max_threads
        self.scale_instances = scale_instances
        self.reserve = reserve
        self._scaled_from: dict[str | None, int] = {}  # pool -> the count it scaled it down from

    def available(self, signals: Signals) -> tuple[float, str] | None:
        """(CPUs, the signal it came from), or None when no CPU signal is present."""
        v = _number(signals, "cpu.available")
        if v is not None:
            return v, "cpu.available"
        found = [(x, n) for n in ("cpu.online", "cpu.affinity", "cpu.quota") if (x := _number(signals, n)) is not None]
        return min(found) if found else None

    def propose(self, signals: Signals, instances: Sequence[InstanceView]) -> Proposal:
        got = self.available(signals)
        using = [i for i in instances if self.backend in i.backends]
        if got is None or not using:
            return EMPTY
        available, source = got
        usable = max(0, math.floor(available - self.reserve))
        have = f"{source}={fmt(available)}" + (f" - reserve={fmt(self.reserve)}" if self.reserve else "")
        b = _Builder()
        count = self._scale(b, using, usable, have) if self.scale_instances else len(using)
        threads = max(self.min_threads, usable // count)
        capped = ""
        if self.max_threads is not None and threads > self.max_threads:
            threads, capped = self.max_threads, f", capped at max_threads={self.max_threads}"
        floor = " (min_threads)" if threads == self.min_threads and usable // count < self.min_threads else ""
        why = f"{have} over {count} instance(s) -> {self.option}={threads}{floor}{capped}"
        for inst in using:
            b.option(inst, self.backend, self.option, threads, why)
        return b.build()

    def _scale(self, b: _Builder, using: Sequence[InstanceView], usable: int, have: str) -> int:
        """Proposes ``ScaleTo`` per pool it changes; returns the instance count to share the
        CPUs among."""
        sizes = _pool_sizes(using)
        n = len(using)
        fit = max(1, usable // self.min_threads)
        marks = self._scaled_from
        if fit < n:
            counts = _drain(sizes, fit)
            for pool, k in sizes.items():
                if counts[pool] < k:
                    marks[pool] = max(marks.get(pool, 0), k)
                    b.scale_to(counts[pool], f"{have} fits {fit} instance(s) of >= {self.min_threads} thread(s), "
                                             f"{n} running{_in_pool(pool, sizes)}", pool)
            return sum(counts.values())
        if not any(k < marks.get(pool, 0) for pool, k in sizes.items()):
            marks.clear()
            return n
        counts = _restore(sizes, marks, fit) if fit > n else dict(sizes)
        for pool, k in sizes.items():
            if counts[pool] > k:
                b.scale_to(counts[pool], f"{have} fits {fit} instance(s) again; back towards "
                                         f"{marks[pool]}{_in_pool(pool, sizes)}", pool)
            if pool in marks and counts[pool] >= marks[pool]:
                del marks[pool]
        return sum(counts.values())

    def __repr__(self) -> str:
        return f"CoreAvailabilityPolicy(backend={self.backend!r}, option={self.option!r}, name={self.name!r})"


# ---------------------------------------------------------------------------- thermal


class ThermalPolicy:
    """Backs off when the machine runs hot, with hysteresis.

    Reads ``signal`` (°C; ``thermal.max_c`` by default, or one zone such as
    ``thermal.x86_pkg_temp_c``). Goes hot when the temperature is ``>= hot_c`` and proposes
    ``option = hot_value`` for ``backend``; goes back to normal only once it is ``<= cool_c``,
    proposing ``option = normal_value`` (nothing in normal mode when ``normal_value`` is None).
    Nothing at all when the signal is absent (no thermal zones, e.g. a VM) and it isn't hot.

    Args:
        hot_c: temperature (°C) at or above which it goes hot.
        cool_c: temperature (°C) at or below which it goes back to normal (``<= hot_c``).
        backend, option: what it sets (``NpuSimBackend`` ``power_mode`` by default).
        hot_value: the value when hot.
        normal_value: the value otherwise, or None to propose nothing then.
        signal: the temperature signal to read.
        name: the policy's name in explanations.
        priority: higher wins when two policies set the same option.
    """

    def __init__(
        self,
        hot_c: float = 80,
        cool_c: float = 70,
        backend: str = "NpuSimBackend",
        option: str = "power_mode",
        hot_value: Any = "low",
        normal_value: Any = "balanced",
        *,
        signal: str = "thermal.max_c",
        name: str = "thermal",
        priority: int = 100,
    ) -> None:
        owner = "ThermalPolicy"
        _check_identity(owner, name, priority)
        _check_number(owner, "hot_c", hot_c)
        _check_number(owner, "cool_c", cool_c)
        if cool_c > hot_c:
            raise InvalidArgumentError(f"{owner}: parameter 'cool_c' ({fmt(cool_c)}) must be <= 'hot_c' ({fmt(hot_c)})")
        _check_str(owner, "backend", backend)
        _check_str(owner, "option", option)
        _check_str(owner, "signal", signal)
        self.name = name
        self.priority = priority
        self.hot_c = hot_c
        self.cool_c = cool_c
        self.backend = backend
        self.option = option
        self.hot_value = hot_value
        self.normal_value = normal_value
        self.signal = signal
        self.signals = (signal,)
        self._hot = False

    @property
    def mode(self) -> str:
        """``"hot"`` or ``"normal"``."""
        return "hot" if self._hot else "normal"

    def propose(self, signals: Signals, instances: Sequence[InstanceView]) -> Proposal:
        temp = _number(signals, self.signal)
        t = f"{self.signal}={fmt(temp)}"
        if temp is None:
            if not self._hot:
                return EMPTY
            why = f"{self.signal} unknown (stays hot until <= cool_c={fmt(self.cool_c)})"
        elif self._hot:
            if temp <= self.cool_c:
                self._hot, why = False, f"{t} <= cool_c={fmt(self.cool_c)}"
            else:
                why = f"{t} > cool_c={fmt(self.cool_c)} (stays hot until <= cool_c)"
        elif temp >= self.hot_c:
            self._hot, why = True, f"{t} >= hot_c={fmt(self.hot_c)}"
        else:
            why = f"{t} < hot_c={fmt(self.hot_c)}"
        value = self.hot_value if self._hot else self.normal_value
        if value is None:
            return EMPTY
        b = _Builder()
        for inst in instances:
            b.option(inst, self.backend, self.option, value, why)
        return b.build()

    def __repr__(self) -> str:
        return f"ThermalPolicy(hot_c={fmt(self.hot_c)}, cool_c={fmt(self.cool_c)}, mode={self.mode!r}, name={self.name!r})"


# ---------------------------------------------------------------------------- memory


class MemoryPressurePolicy:
    """Drains an instance when memory runs short.

    Reads ``memory.psi_full_avg10`` (percent of the last 10 s all tasks stalled on memory)
    and ``memory.available_bytes`` (bytes). Under pressure — ``psi_full_avg10 >
    psi_full_threshold`` or ``available_bytes < min_available_bytes`` — it drains one
    instance: ``ScaleTo(n - 1)`` (never below 1), ``n`` being the number of instances, at
    most once per ``min_interval_s`` (``Signals.at`` is the clock); between steps it keeps
    proposing the last count while the pressure lasts. It proposes no options, and never
    scales up. When the instances belong to several pools (``InstanceView.pool``), the one
    instance comes off the largest pool (ties: the one listed last; never a pool below 1),
    ``n`` is that pool's size and the ``ScaleTo`` names it; between steps it holds that pool.

    Args:
        psi_full_threshold: percent (0–100) above which ``memory.psi_full_avg10`` is pressure.
        min_available_bytes: bytes below which ``memory.available_bytes`` is pressure.
        min_interval_s: seconds between two scale-down steps.
        name: the policy's name in explanations.
        priority: higher wins among policies.
    """

    signals = ("memory.psi_full_avg10", "memory.available_bytes")

    def __init__(
        self,
        psi_full_threshold: float = 10.0,
        min_available_bytes: int = 256 << 20,
        min_interval_s: float = 10.0,
        *,
        name: str = "memory_pressure",
        priority: int = 90,
    ) -> None:
        owner = "MemoryPressurePolicy"
        _check_identity(owner, name, priority)
        _check_number(owner, "psi_full_threshold", psi_full_threshold, minimum=0)
        _check_number(owner, "min_available_bytes", min_available_bytes, minimum=0)
        _check_number(owner, "min_interval_s", min_interval_s, minimum=0)
        self.name = name
        self.priority = priority
        self.psi_full_threshold = psi_full_threshold
        self.min_available_bytes = min_available_bytes
        self.min_interval_s = min_interval_s
        self._last_at: float | None = None
        self._last_pool: str | None = None
        self._last_count: int | None = None

    def pressure(self, signals: Signals) -> list[str]:
        """Why memory is under pressure now (empty when it isn't)."""
        why = []
        psi = _number(signals, "memory.psi_full_avg10")
        if psi is not None and psi > self.psi_full_threshold:
            why.append(f"memory.psi_full_avg10={fmt(psi)} > psi_full_threshold={fmt(self.psi_full_threshold)}")
        avail = _number(signals, "memory.available_bytes")
        if avail is not None and avail < self.min_available_bytes:
            why.append(f"memory.available_bytes={fmt(avail)} < min_available_bytes={fmt(self.min_available_bytes)}")
        return why

    def propose(self, signals: Signals, instances: Sequence[InstanceView]) -> Proposal:
        why = self.pressure(signals)
        n = len(instances)
        if not why or n == 0:
            return EMPTY
        reason = " and ".join(why)
        sizes = _pool_sizes(instances)
        b = _Builder()
        waiting = self._last_at is not None and signals.at - self._last_at < self.min_interval_s
        if waiting:
            pool = self._last_pool
            k = sizes.get(pool)
            if k is not None:  # None: that pool has no running instance now
                count = k if self._last_count is None else min(k, self._last_count)
                b.scale_to(count, f"{reason}: {k} -> {count}{_in_pool(pool, sizes)} "
                                  f"(next step after min_interval_s={fmt(self.min_interval_s)})", pool)
        elif all(k <= 1 for k in sizes.values()):
            for pool in sizes:
                b.scale_to(1, f"{reason}; already at 1 instance{_in_pool(pool, sizes)}", pool)
        else:
            pool = max(reversed(list(sizes)), key=sizes.__getitem__)
            k = sizes[pool]
            count = k - 1
            self._last_at, self._last_pool, self._last_count = signals.at, pool, count
            b.scale_to(count, f"{reason}: {k} -> {count} instance(s){_in_pool(pool, sizes)}", pool)
        return b.build()

    def __repr__(self) -> str:
        return (
            f"MemoryPressurePolicy(psi_full_threshold={fmt(self.psi_full_threshold)}, "
            f"min_available_bytes={self.min_available_bytes}, name={self.name!r})"
        )


# ---------------------------------------------------------------------------- latency


class LatencyTargetPolicy:
    """Keeps each instance's p95 latency near a target by stepping an option along a ladder.

    A per-instance feedback controller. ``ladder`` lists the option's values from cheapest
    to fastest (``[1, 2, 4]`` threads, ``["low", "balanced", "performance"]``). ``measure``
    names the latency it controls: ``"frame"`` — the camera's frame latency, capture to
    result, queueing included (``InstanceView.frame_latency_p95``, recorded by the pipeline
    the instance serves); ``"execute"`` — the execute on the worker alone
    (``InstanceView.latency_p95``); default (None): ``"frame"`` for an instance that serves
    a pipeline, else ``"execute"``. For each instance delegating to ``backend`` whose
    measured p95 (seconds) is known:

    - ``p95 > target_p95_s × (1 + band)``: one rung up (faster), unless at the top;
    - ``p95 < target_p95_s × (1 - band)``: one rung down (cheaper), unless at the bottom;
    - otherwise: hold.

    After a step the instance holds for ``min_interval_s`` (``Signals.at`` is the clock) so
    the latency window reflects the new value before the next decision. The current rung is
    the instance's value in force when it is on the ladder (so an option forced by a
    higher-priority policy doesn't make this one wind up); otherwise the rung it last
    proposed, else the highest rung not above a numeric value in force, else the bottom.
    It proposes the resulting value for every such instance (holding included). It reads no
    signals: run it periodically.

    Args:
        target_p95_s: the target p95 latency in seconds.
        backend, option: what it sets.
        ladder: the values, cheapest first (at least one, no duplicates).
        band: relative dead band around the target (``0 <= band < 1``).
        min_interval_s: seconds an instance holds after a step.
        measure: ``"frame"``, ``"execute"`` or None (frame latency where the instance serves
            a pipeline, else execute latency).
        name: the policy's name in explanations.
        priority: higher wins when two policies set the same option.
    """

    signals: tuple[str, ...] = ()

    def __init__(
        self,
        target_p95_s: float,
        backend: str,
        option: str,
        ladder: Sequence[Any],
        band: float = 0.1,
        min_interval_s: float = 5.0,
        *,
        measure: str | None = None,
        name: str = "latency_target",
        priority: int = 10,
    ) -> None:
        owner = "LatencyTargetPolicy"
        _check_identity(owner, name, priority)
        _check_number(owner, "target_p95_s", target_p95_s)
        if target_p95_s <= 0:
            raise InvalidArgumentError(f"{owner}: parameter 'target_p95_s' must be > 0, got {target_p95_s!r}")
        _check_str(owner, "backend", backend)
        _check_str(owner, "option", option)
        if isinstance(ladder, str | bytes) or not isinstance(ladder, Sequence) or not ladder:
            raise InvalidArgumentError(f"{owner}: parameter 'ladder' must be a non-empty list of values, got {ladder!r}")
        ladder = tuple(ladder)
        if len(set(map(repr, ladder))) != len(ladder):
            raise InvalidArgumentError(f"{owner}: parameter 'ladder' has duplicate values: {list(ladder)!r}")
        _check_number(owner, "band", band, minimum=0)
        if band >= 1:
            raise InvalidArgumentError(f"{owner}: parameter 'band' must be < 1, got {band!r}")
        _check_number(owner, "min_interval_s", min_interval_s, minimum=0)
        if measure is not None and measure not in ("frame", "execute"):
            raise InvalidArgumentError(
                f"{owner}: parameter 'measure' must be \"frame\", \"execute\" or absent (frame latency where the "
                f"instance serves a pipeline, else execute latency), got {measure!r}"
            )
        self.measure = measure
        self.name = name
        self.priority = priority
        self.target_p95_s = target_p95_s
        self.backend = backend
        self.option = option
        self.ladder = ladder
        self.band = band
        self.min_interval_s = min_interval_s
        self._rung: dict[str, int] = {}
        self._stepped_at: dict[str, float] = {}

    def rung(self, instance: InstanceView) -> int:
        """The ladder index ``instance`` is on now."""
        current = instance.options.get(self.backend, {}).get(self.option)
        for i, v in enumerate(self.ladder):
            if v == current and isinstance(v, bool) == isinstance(current, bool):
                return i
        if instance.name in self._rung:
            return self._rung[instance.name]
        if isinstance(current, int | float) and not isinstance(current, bool):
            below = [
                i
                for i, v in enumerate(self.ladder)
                if isinstance(v, int | float) and not isinstance(v, bool) and v <= current
            ]
            if below:
                return max(below, key=lambda i: self.ladder[i])
        return 0

    def propose(self, signals: Signals, instances: Sequence[InstanceView]) -> Proposal:
        hi = self.target_p95_s * (1 + self.band)
        lo = self.target_p95_s * (1 - self.band)
        now = signals.at
        b = _Builder()
        for inst in instances:
            if self.backend not in inst.backends:
                continue
            measure = self.measure or ("frame" if getattr(inst, "serves_pipeline", False) else "execute")
            p95 = getattr(inst, "frame_latency_p95", 0.0) if measure == "frame" else inst.latency_p95
            if not p95 or p95 <= 0 or not math.isfinite(p95):
                continue  # nothing measured yet
            rung = self.rung(inst)
            last = self._stepped_at.get(inst.name)
            new, why = self._decide(p95, rung, None if last is None else now - last, hi, lo,
                                    "frame_latency_p95" if measure == "frame" else "latency_p95")
            if new != rung:
                self._stepped_at[inst.name] = now
            self._rung[inst.name] = new
            b.option(inst, self.backend, self.option, self.ladder[new], why)
        return b.build()

    def _decide(self, p95: float, rung: int, since_step: float | None, hi: float, lo: float,
                label: str = "latency_p95") -> tuple[int, str]:
        """(the new rung, why) for one instance; ``label`` names the measured quantity."""
        cur = self.ladder[rung]
        p = f"{label}={fmt(p95)}s"
        target = f"target_p95_s={fmt(self.target_p95_s)}s"
        if lo <= p95 <= hi:
            return rung, f"{p} within [{fmt(lo)}s, {fmt(hi)}s] of {target}: hold {cur!r}"
        up = p95 > hi
        bound = f"{p} > {fmt(hi)}s" if up else f"{p} < {fmt(lo)}s"
        if rung == (len(self.ladder) - 1 if up else 0):
            end = "fastest" if up else "cheapest"
            return rung, f"{bound} ({target} {'+' if up else '-'} band); at the {end} rung {cur!r}"
        if since_step is not None and since_step < self.min_interval_s:
            return rung, (
                f"{bound} but holding {cur!r}: last step {fmt(since_step)}s ago "
                f"< min_interval_s={fmt(self.min_interval_s)}"
            )
        new = rung + 1 if up else rung - 1
        step = "step up" if up else "step down"
        return new, f"{bound} ({target} {'+' if up else '-'} band): {step} {cur!r} -> {self.ladder[new]!r}"

    def __repr__(self) -> str:
        return (
            f"LatencyTargetPolicy(target_p95_s={fmt(self.target_p95_s)}, backend={self.backend!r}, "
            f"option={self.option!r}, ladder={list(self.ladder)!r}, measure={self.measure!r}, name={self.name!r})"
        )
