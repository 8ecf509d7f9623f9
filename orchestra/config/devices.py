"""``[device.<name>]``: simulated NPUs (``kind = "npu_sim"``) and the host CPUs
(``kind = "cpu"``); and, once the cameras are known, that each NPU link names a camera."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ._base import (
    _BARE,
    _BAD,
    Checker,
    _any_bad,
    _freeze,
    _hint,
    _is_int,
    _is_num,
    _join,
    _kind_of,
    _names,
    _parse_size,
    _plural,
    _show,
    _thaw,
)

DEVICE_KINDS = ("npu_sim", "cpu")
# NpuDevice defaults (kept in step with orchestra.backends.npu_sim, imported lazily).
_NPU_DEFAULTS: dict[str, Any] = {"cores": 4, "core_memory": 4 << 20, "macs_per_cycle": 256,
                                 "time_scale": 0.0, "job_overhead_cycles": 2000}

_NPU_KEYS = ("kind", "cores", "core_memory", "clock_mhz", "power_w", "macs_per_cycle", "links", "time_scale",
             "job_overhead_cycles", "exclusive", "capacity")
_CPU_KEYS = ("kind", "cpus", "exclusive", "capacity", "thread_options")


@dataclass(frozen=True)
class DeviceConfig:
    """A device cameras bind to.

    ``kind == "npu_sim"``: ``params`` are :class:`~orchestra.backends.npu_sim.NpuDevice`'s
    keyword arguments (``cores``, ``core_memory`` in bytes, ``links``, ``time_scale``, ...),
    defaults filled in. ``kind == "cpu"``: ``params`` are ``cpus`` (a tuple, or None for the
    CPUs the process may use) and ``thread_options``.
    """

    name: str
    kind: str
    params: Mapping[str, Any] = field(default_factory=dict)
    exclusive: bool = True
    capacity: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", _freeze(self.params))

    def build_npu_device(self) -> Any:
        """A new :class:`~orchestra.backends.npu_sim.NpuDevice` (its core threads start
        now; close it, and ``register_device`` it so the backend finds it)."""
        if self.kind != "npu_sim":
            raise ConfigError(f"device.{self.name}: kind {self.kind!r} is not npu_sim")
        from orchestra.backends.npu_sim import NpuDevice

        kw = _thaw(self.params)
        return NpuDevice(self.name, **kw)

    def build_resource(self, npu_device: Any = None) -> Any:
        """The orchestrator resource for this device: an ``NpuSimResource`` over
        ``npu_device`` (from :meth:`build_npu_device`) or a ``CpuResource``."""
        from orchestra.orchestrator import CpuResource, NpuSimResource

        if self.kind == "npu_sim":
            if npu_device is None:
                raise ConfigError(f"device.{self.name}: build_resource needs the NpuDevice (build_npu_device())")
            return NpuSimResource(npu_device, exclusive=self.exclusive, capacity=self.capacity)
        cpus = self.params.get("cpus")
        return CpuResource(cpus, exclusive=self.exclusive, capacity=self.capacity, name=self.name,
                           thread_options=dict(self.params.get("thread_options") or {}) or None)


@dataclass
class _Device:
    name: str
    kind: str
    cores: int | None = None
    memory: list[int] | None = None
    links: dict[str, int] | None = None
    links_explicit: bool = False
    links_broken: bool = False  # some link entries were wrong (reported): don't blame bindings
    cpus: tuple[int, ...] | None = None
    exclusive: bool = True
    capacity: int | None = None
    ok: bool = True



class DeviceChecks(Checker):
    """Checks ``[device.*]``; fills ``devices`` (what bindings are checked against)."""

    camera_names: list[str]  # CameraChecks' (check_links runs after the cameras)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.devices: dict[str, _Device] = {}
        self.bad_devices: set[str] = set()  # declared, but too broken to check bindings against
        self.device_configs: list[DeviceConfig] = []

    def check_devices(self, value: Any) -> None:
        if not isinstance(value, dict):
            self.err("device", f"must be a table of devices ([device.<name>]), got {_kind_of(value)}")
            return
        cpu_device: str | None = None
        for name, raw in value.items():
            path = _join("device", name)
            t = self.table(raw, path)
            if t is None:
                self.bad_devices.add(name)
                continue
            if not _BARE.fullmatch(name):
                self.err(path, "device names may use only letters, digits, '_' and '-'")
                self.bad_devices.add(name)
                continue
            kind = self.choice(t, "kind", path, DEVICE_KINDS)
            if kind is _BAD:
                self.bad_devices.add(name)
                continue
            if kind == "cpu":
                if cpu_device is not None:
                    self.err(path, f'only one device of kind "cpu" is allowed ({_join("device", cpu_device)} is one)')
                    self.bad_devices.add(name)
                    continue
                cpu_device = name
                self.check_cpu_device(name, t, path)
            else:
                self.check_npu_device(name, t, path)

    def check_sharing(self, t: Mapping[str, Any], path: str, dev: _Device) -> None:
        exclusive = self.get(t, "exclusive", path, "bool", True)
        capacity = self.get(t, "capacity", path, "positive_int", None)
        dev.exclusive = True if exclusive is _BAD else exclusive
        dev.capacity = None if capacity is _BAD else capacity
        if exclusive is _BAD or capacity is _BAD:
            dev.ok = False
        elif capacity is not None and exclusive:
            self.err(_join(path, "capacity"), "only applies to a shared device: set exclusive = false")

    def check_npu_device(self, name: str, t: dict[str, Any], path: str) -> None:
        self.known(t, path, _NPU_KEYS)
        dev = _Device(name, "npu_sim")
        self.devices[name] = dev
        params: dict[str, Any] = {}
        cores = self.get(t, "cores", path, "positive_int", _NPU_DEFAULTS["cores"])
        if cores is not _BAD and cores > self.limits.max_npu_cores:
            self.err(_join(path, "cores"), f"{cores} is more than {self.limits.max_npu_cores} (ConfigLimits.max_npu_cores)")
            cores = _BAD
        dev.cores = None if cores is _BAD else cores
        params["cores"] = cores
        # core_memory: a size, or one per core
        mem = t.get("core_memory", _NPU_DEFAULTS["core_memory"])
        mp = _join(path, "core_memory")
        if isinstance(mem, list):
            sizes = [_parse_size(m) for m in mem]
            bad = [i for i, s in enumerate(sizes) if s is None]
            if bad:
                self.err(f"{mp}[{bad[0]}]", f'must be a size in bytes (an integer >= 0 or a string like "4MiB"), got {_show(mem[bad[0]])}')
                dev.ok = False
            elif dev.cores is not None and len(sizes) != dev.cores:
                self.err(mp, f"has {len(sizes)} sizes for {_plural(dev.cores, 'core')}: give one size, or one per core")
                dev.ok = False
            else:
                dev.memory = [s for s in sizes if s is not None]
                params["core_memory"] = tuple(dev.memory)
        else:
            size = _parse_size(mem)
            if size is None:
                self.err(mp, f'must be a size in bytes (an integer >= 0 or a string like "4MiB", units B, KB, MB, GB, '
                             f"KiB, MiB, GiB), got {_show(mem)}")
                dev.ok = False
            else:
                params["core_memory"] = size
                if dev.cores is not None:
                    dev.memory = [size] * dev.cores
        from ..backends.npu_sim import DEFAULT_CLOCK_MHZ, DEFAULT_LINKS, DEFAULT_POWER_W

        tables: dict[str, Any] = {"clock_mhz": dict(DEFAULT_CLOCK_MHZ), "power_w": dict(DEFAULT_POWER_W)}
        for key in ("clock_mhz", "power_w"):
            if key not in t:
                continue
            kp = _join(path, key)
            tab = self.table(t[key], kp)
            if tab is None or not tab:
                if tab is not None:
                    self.err(kp, "must name at least one power mode")
                tables[key] = _BAD
                continue
            clean: dict[str, float] = {}
            for mode, v in tab.items():
                if not _is_num(v) or v <= 0:
                    self.err(_join(kp, mode), f"must be a positive number, got {_kind_of(v)}")
                    tables[key] = _BAD
                else:
                    clean[mode] = float(v)
            if tables[key] is not _BAD:
                tables[key] = params[key] = clean
        clock, power = tables["clock_mhz"], tables["power_w"]
        if _any_bad(clock, power):
            dev.ok = False
        elif set(clock) != set(power):
            self.err(path, f"clock_mhz and power_w must name the same power modes (clock_mhz: {_names(list(clock))}; "
                           f"power_w: {_names(list(power))})")
            dev.ok = False
        for key, kind in (("macs_per_cycle", "positive_int"), ("job_overhead_cycles", "nonneg_int"),
                          ("time_scale", "nonneg_number")):
            v = self.get(t, key, path, kind, _NPU_DEFAULTS[key])
            if v is _BAD:
                dev.ok = False
            params[key] = v
        # links: camera -> core (checked against the cameras later)
        if "links" in t:
            lp = _join(path, "links")
            tab = self.table(t["links"], lp)
            links: dict[str, int] = {}
            if tab is None:
                dev.ok, dev.links_broken = False, True
            else:
                dev.links_explicit = True
                for link, core in tab.items():
                    if not _is_int(core) or core < 0:
                        self.err(_join(lp, link), f"must be a core number (an integer >= 0), got {_kind_of(core)}")
                        dev.ok, dev.links_broken = False, True
                    elif dev.cores is not None and core >= dev.cores:
                        self.err(_join(lp, link), f"core {core} does not exist on device {name} ({self.core_range(dev)})")
                        dev.ok, dev.links_broken = False, True
                    else:
                        links[link] = core
            dev.links = links
        else:
            # NpuDevice's default wiring; unknown when cores is wrong (reported; bindings skip it)
            dev.links = None if dev.cores is None else {k: c for k, c in DEFAULT_LINKS.items() if c < dev.cores}
        params["links"] = dict(dev.links or {})
        self.check_sharing(t, path, dev)
        if cores is _BAD:
            dev.ok = False
        if dev.ok:
            self.device_configs.append(DeviceConfig(name, "npu_sim", params, dev.exclusive, dev.capacity))

    @staticmethod
    def core_range(dev: _Device) -> str:
        n = dev.cores or 0
        return "core 0" if n == 1 else f"cores 0-{n - 1}"

    def check_cpu_device(self, name: str, t: dict[str, Any], path: str) -> None:
        self.known(t, path, _CPU_KEYS)
        dev = _Device(name, "cpu")
        self.devices[name] = dev
        params: dict[str, Any] = {"cpus": None, "thread_options": None}
        if "cpus" in t:
            cp = _join(path, "cpus")
            v = t["cpus"]
            if not isinstance(v, list) or not v or not all(_is_int(c) and c >= 0 for c in v):
                self.err(cp, f"must be a non-empty array of CPU numbers (integers >= 0), got {_kind_of(v)}")
                dev.ok = False
            elif len(set(v)) != len(v):
                self.err(cp, f"lists a CPU twice: {_show(v)}")
                dev.ok = False
            else:
                dev.cpus = tuple(sorted(v))
                params["cpus"] = dev.cpus
        else:
            try:
                dev.cpus = tuple(sorted(os.sched_getaffinity(0)))
            except (AttributeError, OSError):
                dev.cpus = tuple(range(os.cpu_count() or 1))
        if "thread_options" in t:
            tp = _join(path, "thread_options")
            tab = self.table(t["thread_options"], tp)
            if tab is None:
                dev.ok = False
            else:
                clean = {}
                for backend, option in tab.items():
                    bp = _join(tp, backend)
                    if backend not in self.backend_names():
                        self.err(bp, f"no backend named {backend!r} (backends: {_names(self.backend_names())})"
                                     f"{_hint(backend, self.backend_names())}")
                        dev.ok = False
                        continue
                    specs = self.option_specs(backend) or {}
                    spec = specs.get(option) if isinstance(option, str) else None
                    if spec is None or spec.type is not int:
                        ints = [n for n, s in specs.items() if s.type is int]
                        self.err(bp, f"must name an integer option of backend {backend!r} (integer options: "
                                     f"{_names(ints)}), got {_show(option)}")
                        dev.ok = False
                        continue
                    clean[backend] = option
                params["thread_options"] = clean
        self.check_sharing(t, path, dev)
        if dev.ok:
            self.device_configs.append(DeviceConfig(name, "cpu", params, dev.exclusive, dev.capacity))

    # -- links name cameras ---------------------------------------------------------------
    def check_links(self) -> None:
        names = self.camera_names
        if not names:
            return  # no cameras: reported under camera
        for dname, dev in self.devices.items():
            if dev.kind != "npu_sim" or not dev.links_explicit or not dev.links:
                continue
            for link in dev.links:
                if link not in names:
                    self.err(_join(_join(_join("device", dname), "links"), link),
                             f"no camera named {link!r} (cameras: {_names(names)}){_hint(link, names)}")
