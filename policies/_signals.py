"""Signal sources: small readers of the machine's state, for policies.

Each source has a ``name`` and a ``read()`` returning ``{signal name: value}``. ``read`` is
quick (a few small file reads) and never raises for a signal that is missing or malformed
here: that signal is simply left out. Signal names are namespaced (``battery.percent``,
``cpu.available``, ``thermal.max_c``, ``memory.psi_full_avg10``) and their units are part of
the name or documented on the source.

Every path is a constructor parameter, so tests point a source at a temporary directory tree
that mimics sysfs or procfs: the parsing under test is the real one.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from orchestra.errors import InvalidArgumentError

from ._protocol import SignalValue

__all__ = [
    "BatterySource",
    "CpuSource",
    "ManualClock",
    "PressureSource",
    "ScriptedSource",
    "ThermalSource",
    "parse_cpu_list",
]


# ---------------------------------------------------------------------------- helpers


def _read_text(path: Path) -> str | None:
    """The stripped contents of a small file, or None when it can't be read (absent, EIO from
    a disabled sensor, permission, not valid text)."""
    try:
        with open(path, encoding="ascii") as f:
            return f.read(65536).strip()
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _subdirs(root: Path) -> list[Path]:
    try:
        return sorted(p for p in root.iterdir() if p.is_dir())
    except OSError:
        return []


def parse_cpu_list(text: str) -> set[int] | None:
    """Parses a kernel CPU list such as ``"0-3,5,7-8"`` into a set of CPU numbers.

    Returns None when ``text`` is not a valid list (the empty string is an empty set).
    """
    text = text.strip()
    if not text:
        return set()
    cpus: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            return None
        if a < 0 or b < a:
            return None
        cpus.update(range(a, b + 1))
    return cpus


# ---------------------------------------------------------------------------- battery

_ADAPTER_TYPES = ("mains", "usb", "wireless")


class BatterySource:
    """Battery state from ``/sys/class/power_supply``.

    Signals (all absent on a machine without a battery, e.g. a server):

    - ``battery.present`` (bool): a supply of ``type`` ``Battery`` is there (its ``present``
      file, when it has one, is not ``0``).
    - ``battery.percent`` (float, 0–100): charge level; the mean ``capacity`` of the present
      batteries (falling back to ``energy_now / energy_full`` or ``charge_now / charge_full``).
    - ``battery.charging`` (bool): on external power — a battery's ``status`` is
      ``Charging`` or ``Full``, or an AC/USB/wireless adapter's ``online`` is ``1``. Absent
      when neither a battery status nor an adapter can be read.

    Args:
        root: the power-supply class directory.
    """

    name = "battery"

    def __init__(self, root: str | os.PathLike[str] = "/sys/class/power_supply") -> None:
        self.root = Path(root)

    def read(self) -> dict[str, SignalValue]:
        percents: list[float] = []
        statuses: list[str] = []
        adapters_online: list[bool] = []
        batteries = 0
        for supply in _subdirs(self.root):
            kind = (_read_text(supply / "type") or "").lower()
            if kind == "battery":
                if _read_int(supply / "present") == 0:
                    continue
                batteries += 1
                percent = self._percent(supply)
                if percent is not None:
                    percents.append(percent)
                status = _read_text(supply / "status")
                if status:
                    statuses.append(status.lower())
            elif kind.startswith(_ADAPTER_TYPES):
                online = _read_int(supply / "online")
                if online is not None:
                    adapters_online.append(online != 0)
        if not batteries:
            return {}
        out: dict[str, SignalValue] = {"battery.present": True}
        if percents:
            out["battery.percent"] = sum(percents) / len(percents)
        if statuses or adapters_online:
            out["battery.charging"] = any(adapters_online) or any(s in ("charging", "full") for s in statuses)
        return out

    @staticmethod
    def _percent(supply: Path) -> float | None:
        capacity = _read_int(supply / "capacity")
        if capacity is not None:
            return float(min(capacity, 100)) if capacity >= 0 else None
        for now, full in (("energy_now", "energy_full"), ("charge_now", "charge_full")):
            n, f = _read_int(supply / now), _read_int(supply / full)
            if n is not None and f and f > 0 and n >= 0:
                return min(100.0, 100.0 * n / f)
        return None

    def __repr__(self) -> str:
        return f"BatterySource(root={str(self.root)!r})"


# ---------------------------------------------------------------------------- cpu


class CpuSource:
    """How many CPUs this process can use.

    Signals:

    - ``cpu.online`` (int, CPUs): CPUs the kernel has online, counted from the range list in
      ``online_path`` (``"0-3,5"`` → 5). Changes when cores are hot-plugged (phones switch
      cores off on low battery or heat).
    - ``cpu.affinity`` (int, CPUs): ``len(os.sched_getaffinity(0))`` where the platform has it
      and ``read_affinity`` is true.
    - ``cpu.quota`` (float, CPUs): the cgroup CPU bandwidth limit, ``quota / period``: cgroup
      v2 ``cpu.max`` (``"200000 100000"`` → 2.0; ``"max 100000"`` → no limit, absent), or
      cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (``-1`` → absent). The smallest
      limit on the way from this process's cgroup up to ``cgroup_root`` applies.
    - ``cpu.available`` (int or float, CPUs): the minimum of those present (a float only when
      a fractional quota is the minimum).

    Args:
        online_path: the kernel's online CPU list.
        cgroup_root: where the cgroup hierarchy is mounted (v2 unified, or v1 controllers
            below it as ``cpu/`` or ``cpu,cpuacct/``).
        cgroup_file: this process's cgroup membership (``/proc/self/cgroup``); when it can't
            be read only ``cgroup_root`` itself is looked at.
        read_affinity: read ``os.sched_getaffinity`` (turn off to make results depend on the
            given paths only).
    """

    name = "cpu"

    def __init__(
        self,
        online_path: str | os.PathLike[str] = "/sys/devices/system/cpu/online",
        cgroup_root: str | os.PathLike[str] = "/sys/fs/cgroup",
        cgroup_file: str | os.PathLike[str] = "/proc/self/cgroup",
        read_affinity: bool = True,
    ) -> None:
        self.online_path = Path(online_path)
        self.cgroup_root = Path(cgroup_root)
        self.cgroup_file = Path(cgroup_file)
        self.read_affinity = read_affinity

    def read(self) -> dict[str, SignalValue]:
        out: dict[str, SignalValue] = {}
        text = _read_text(self.online_path)
        if text is not None:
            cpus = parse_cpu_list(text)
            if cpus:
                out["cpu.online"] = len(cpus)
        if self.read_affinity and hasattr(os, "sched_getaffinity"):
            try:
                n = len(os.sched_getaffinity(0))
            except OSError:
                n = 0
            if n:
                out["cpu.affinity"] = n
        quota = self.quota()
        if quota is not None:
            out["cpu.quota"] = quota
        present = [v for v in out.values() if isinstance(v, int | float)]
        if present:
            out["cpu.available"] = min(present)
        return out

    def quota(self) -> float | None:
        """The effective cgroup CPU limit in CPUs, or None when there is none (or none can be
        read)."""
        groups = self._membership()
        quotas = [q for d in self._walk(self.cgroup_root, groups.get("")) if (q := self._v2(d)) is not None]
        if not quotas:
            for mount in self._v1_mounts():
                quotas += [q for d in self._walk(mount, groups.get("cpu")) if (q := self._v1(d)) is not None]
        return min(quotas) if quotas else None

    def _membership(self) -> dict[str, str]:
        """controller ("" for the v2 unified hierarchy) -> path, from ``/proc/self/cgroup``."""
        text = _read_text(self.cgroup_file)
        groups: dict[str, str] = {}
        for line in (text or "").splitlines():
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            _, controllers, path = parts
            if not controllers:
                groups[""] = path
            for c in controllers.split(","):
                if c:
                    groups.setdefault(c, path)
        return groups

    @staticmethod
    def _walk(root: Path, rel: str | None) -> Iterable[Path]:
        """``root/rel``, its parents, up to ``root`` itself."""
        parts = [p for p in (rel or "").split("/") if p and p not in (".", "..")]
        for i in range(len(parts), -1, -1):
            yield root.joinpath(*parts[:i])

    def _v1_mounts(self) -> list[Path]:
        return [d for d in _subdirs(self.cgroup_root) if "cpu" in d.name.split(",")]

    @staticmethod
    def _v2(d: Path) -> float | None:
        text = _read_text(d / "cpu.max")
        if text is None:
            return None
        fields = text.split()
        if not fields or fields[0] == "max":
            return None
        try:
            quota = int(fields[0])
            period = int(fields[1]) if len(fields) > 1 else 100000
        except ValueError:
            return None
        return quota / period if quota > 0 and period > 0 else None

    @staticmethod
    def _v1(d: Path) -> float | None:
        quota, period = _read_int(d / "cpu.cfs_quota_us"), _read_int(d / "cpu.cfs_period_us")
        if quota is None or quota <= 0 or not period or period <= 0:
            return None
        return quota / period

    def __repr__(self) -> str:
        return f"CpuSource(online_path={str(self.online_path)!r}, cgroup_root={str(self.cgroup_root)!r})"


# ---------------------------------------------------------------------------- thermal

_NOT_A_NAME = re.compile(r"[^a-z0-9]+")


class ThermalSource:
    """Temperatures from ``/sys/class/thermal``.

    Signals (absent on machines without thermal zones, e.g. most VMs):

    - ``thermal.max_c`` (float, °C): the hottest zone (``thermal_zone*/temp`` is in
      millidegrees Celsius).
    - ``thermal.<type>_c`` (float, °C): the hottest zone of each ``type``, the type
      lower-cased with runs of other characters than ``a-z0-9`` turned into ``_``
      (``x86_pkg_temp`` → ``thermal.x86_pkg_temp_c``, ``cpu-thermal`` → ``thermal.cpu_thermal_c``).

    A zone whose ``temp`` can't be read (disabled sensors answer EIO) or is below absolute
    zero is left out.

    Args:
        root: the thermal class directory.
    """

    name = "thermal"

    def __init__(self, root: str | os.PathLike[str] = "/sys/class/thermal") -> None:
        self.root = Path(root)

    def read(self) -> dict[str, SignalValue]:
        by_type: dict[str, float] = {}
        hottest: float | None = None
        for zone in _subdirs(self.root):
            if not zone.name.startswith("thermal_zone"):
                continue
            milli = _read_int(zone / "temp")
            if milli is None:
                continue
            celsius = milli / 1000.0
            if celsius < -273.15:
                continue
            hottest = celsius if hottest is None else max(hottest, celsius)
            kind = _NOT_A_NAME.sub("_", (_read_text(zone / "type") or "").lower()).strip("_")
            if kind:
                key = f"thermal.{kind}_c"
                by_type[key] = max(by_type.get(key, celsius), celsius)
        if hottest is None:
            return {}
        out: dict[str, SignalValue] = {"thermal.max_c": hottest}
        out.update(by_type)
        return out

    def __repr__(self) -> str:
        return f"ThermalSource(root={str(self.root)!r})"


# ---------------------------------------------------------------------------- pressure


def _psi(text: str | None) -> dict[str, float]:
    """``{"some": avg10, "full": avg10}`` from a PSI file's lines."""
    out: dict[str, float] = {}
    for line in (text or "").splitlines():
        kind, _, rest = line.partition(" ")
        for field_ in rest.split():
            key, _, value = field_.partition("=")
            if key == "avg10":
                try:
                    v = float(value)
                except ValueError:
                    break
                if math.isfinite(v) and v >= 0:
                    out[kind] = v
                break
    return out


class PressureSource:
    """Memory and CPU pressure from procfs.

    Signals:

    - ``memory.psi_some_avg10`` / ``memory.psi_full_avg10`` (float, percent of wall time over
      the last 10 s, 0–100): share of time some / all non-idle tasks were stalled waiting for
      memory (``/proc/pressure/memory``; needs a kernel with PSI).
    - ``memory.available_bytes`` (int, bytes): ``MemAvailable`` from ``/proc/meminfo``.
    - ``cpu.psi_some_avg10`` (float, percent, 0–100): share of time runnable tasks waited for
      a CPU (``/proc/pressure/cpu``).

    Args:
        proc: the procfs mount point.
    """

    name = "pressure"

    def __init__(self, proc: str | os.PathLike[str] = "/proc") -> None:
        self.proc = Path(proc)

    def read(self) -> dict[str, SignalValue]:
        out: dict[str, SignalValue] = {}
        memory = _psi(_read_text(self.proc / "pressure" / "memory"))
        for kind in ("some", "full"):
            if kind in memory:
                out[f"memory.psi_{kind}_avg10"] = memory[kind]
        available = self._mem_available()
        if available is not None:
            out["memory.available_bytes"] = available
        cpu = _psi(_read_text(self.proc / "pressure" / "cpu"))
        if "some" in cpu:
            out["cpu.psi_some_avg10"] = cpu["some"]
        return out

    def _mem_available(self) -> int | None:
        for line in (_read_text(self.proc / "meminfo") or "").splitlines():
            key, _, rest = line.partition(":")
            if key != "MemAvailable":
                continue
            fields = rest.split()
            try:
                value = int(fields[0])
            except (IndexError, ValueError):
                return None
            unit = fields[1].lower() if len(fields) > 1 else ""
            scale = {"": 1, "b": 1, "kb": 1024, "mb": 1 << 20, "gb": 1 << 30}.get(unit)
            return value * scale if scale is not None and value >= 0 else None
        return None

    def __repr__(self) -> str:
        return f"PressureSource(proc={str(self.proc)!r})"


# ---------------------------------------------------------------------------- scripted


class ManualClock:
    """A clock that moves only when told: ``clock()`` returns the time, ``advance(s)`` moves it."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = float(start)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise InvalidArgumentError(f"ManualClock.advance: seconds must be >= 0, got {seconds!r}")
        self.now += seconds


_VALUE_TYPES = (bool, int, float, str, type(None))


class ScriptedSource:
    """Signals that follow a script over time, for tests and demos.

    ``timeline`` is a sequence of ``(t_seconds, {signal: value})`` steps, e.g.
    ``[(0, {"battery.percent": 100}), (2.0, {"battery.percent": 15, "battery.charging": False})]``.
    ``read()`` returns every step whose time has passed since the source started (on
    ``start()`` or on the first ``read()``), later steps overriding earlier ones; a value of
    None removes the signal. Values and units are whatever the script says.

    Time comes from ``clock`` (seconds, monotonic); ``advance(seconds)`` adds to it, so with
    a clock that stands still (``clock=ManualClock()``, or ``lambda: 0.0``) a test moves through
    the script deterministically.

    Args:
        timeline: the steps, in any order (they are sorted by time; equal times keep order).
        clock: a callable returning seconds.
        name: the source's name.
    """

    def __init__(
        self,
        timeline: Iterable[tuple[float, Mapping[str, SignalValue]]],
        clock: Callable[[], float] = time.monotonic,
        *,
        name: str = "scripted",
    ) -> None:
        steps: list[tuple[float, dict[str, SignalValue]]] = []
        for i, step in enumerate(timeline):
            try:
                t, values = step
            except (TypeError, ValueError):
                raise InvalidArgumentError(
                    f"ScriptedSource timeline step {i} must be (t_seconds, {{signal: value}}), got {step!r}"
                ) from None
            if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
                raise InvalidArgumentError(f"ScriptedSource timeline step {i}: time must be a number >= 0, got {t!r}")
            if not isinstance(values, Mapping):
                raise InvalidArgumentError(f"ScriptedSource timeline step {i}: values must be a mapping, got {values!r}")
            for key, value in values.items():
                if not isinstance(key, str) or not key:
                    raise InvalidArgumentError(f"ScriptedSource timeline step {i}: signal names are strings, got {key!r}")
                if not isinstance(value, _VALUE_TYPES):
                    raise InvalidArgumentError(
                        f"ScriptedSource timeline step {i}: signal {key!r} must be a bool, int, float, str or None, "
                        f"got {type(value).__name__} {value!r}"
                    )
            steps.append((float(t), dict(values)))
        steps.sort(key=lambda s: s[0])
        self.name = name
        self._steps: tuple[tuple[float, dict[str, SignalValue]], ...] = tuple(steps)
        self._clock = clock
        self._t0: float | None = None
        self._offset = 0.0

    @property
    def timeline(self) -> Sequence[tuple[float, Mapping[str, SignalValue]]]:
        return self._steps

    def start(self) -> None:
        """(Re)starts the script: time 0 is now."""
        self._t0 = self._clock()
        self._offset = 0.0

    def advance(self, seconds: float) -> None:
        """Moves the script forward by ``seconds`` (starting it if needed)."""
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
            raise InvalidArgumentError(f"ScriptedSource.advance: seconds must be a number >= 0, got {seconds!r}")
        if self._t0 is None:
            self.start()
        self._offset += seconds

    def elapsed(self) -> float:
        """Seconds into the script (0.0 before it starts)."""
        if self._t0 is None:
            return 0.0
        return self._clock() - self._t0 + self._offset

    def read(self) -> dict[str, SignalValue]:
        if self._t0 is None:
            self.start()
        now = self.elapsed()
        merged: dict[str, SignalValue] = {}
        for t, values in self._steps:
            if t > now:
                break
            merged.update(values)
        return {k: v for k, v in merged.items() if v is not None}

    def __repr__(self) -> str:
        return f"ScriptedSource({len(self._steps)} steps, name={self.name!r})"
