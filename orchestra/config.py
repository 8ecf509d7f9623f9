"""orchestra's TOML configuration: programs, devices, cameras, policies, signal sources.

:func:`load_config` reads a file into a :class:`Config` (frozen dataclasses; paths resolved
against the config file's folder) or raises :class:`~orchestra.errors.ConfigError` whose
``errors`` hold *every* problem found, one line each, starting with its path in the file::

    camera[2].bind: core 7 does not exist on device npu0 (cores 0-3)
    policy[0].params.lwo: policy 'battery' has no parameter 'lwo' (parameters: low, high, ...)

:func:`validate_config` returns those lines (``[]`` when the file is valid). A config is
untrusted input: nothing in it makes these functions raise anything but ``ConfigError``, and
sizes and rates are bounded by :class:`ConfigLimits`. ``orchestra validate FILE`` prints them.
A ``"module:attr"`` in the file imports that module (its code runs): only a class
implementing the protocol (Policy, SignalSource, frame source) is then called.

Schema (every table rejects keys it doesn't know, naming the known ones)::

    [program]                       # or [[program]] entries, each with a unique name
    name = "convnet"                # optional for a single program (default: the file's stem)
    path = "models/convnet.pte"     # relative to the config file's folder; loaded and checked
    method = "forward"              # default "forward"

    [device.npu0]                   # device names: letters, digits, '_' and '-'
    kind = "npu_sim"                # a simulated NPU (orchestra.backends.npu_sim.NpuDevice)
    cores = 4                       # default 4
    core_memory = "4MiB"            # bytes per core: an int or "512KiB", "4MiB", "1GB", ...;
                                    #   or a list, one per core (default 4MiB)
    links = { front = 0, rear = 1 } # camera -> core wiring; each link names a camera
                                    #   (default: front -> 0, rear -> 1, the cores it has)
    time_scale = 1.0                # 0: modelled time only; s > 0: jobs take s x modelled time
    clock_mhz = { low = 200, balanced = 500, performance = 1000 }   # optional
    power_w = { low = 0.3, balanced = 0.9, performance = 2.5 }      # optional, same modes
    macs_per_cycle = 256            # optional
    job_overhead_cycles = 2000      # optional
    exclusive = true                # a core serves one camera (default); false: shared,
    capacity = 2                    #   by at most `capacity` cameras (default: any number)

    [device.cpu]
    kind = "cpu"                    # host CPUs (at most one such device)
    cpus = [0, 1]                   # default: the CPUs this process may use
    exclusive = true
    capacity = 2
    thread_options = { NumpyCpuBackend = "num_threads" }   # backend -> int option set to
                                                            #   the number of bound CPUs

    [[camera]]
    name = "front"                  # unique
    program = "convnet"             # needed only when there are several programs
    source = { kind = "synthetic", fps = 30, shape = [1, 3, 16, 16], dtype = "float32", seed = 1 }
        # synthetic: fps (required), shape and dtype (default: the method's input 0), seed,
        #   count (frames, default endless)
        # kind = "file": path (.npy stack, or .raw/.bin with shape and dtype), fps, loop
        # any other kind: a registered orchestra.pipeline source or "module:attr"; the
        #   table's other keys are its parameters
    bind = { "npu0.core" = 0 }      # or { camera_link = "npu0" } (the core npu0's link for
                                    #   this camera's name is wired to), { "npu0.camera" = "rear" },
                                    #   { cpu = 1 } or { cpu = [0, 1] }; cpu combines with the others
    backend_options = { NpuSimBackend = { power_mode = "balanced", priority = 1 } }
                                    # checked against each backend's declared options; only
                                    #   backends the method delegates to
    queue = 8                       # frames waiting for the executor (default 8)
    drop = "drop_oldest"            # drop_oldest | drop_newest | block
    deadline_ms = 200               # frames older than this are dropped (optional)
    inflight = 1                    # frames between stream and sink at once (default 1)
    placement = "thread"            # thread | process: "process" runs the instance in a worker
                                    #   process (scales numpy-interpreted programs across cores;
                                    #   not with npu_sim devices, which live in this process)

    [[policy]]
    use = "battery"                 # a registered policy name or "module:attr"
    priority = 80                   # optional (the policy's default otherwise)
    params = { low = 20, high = 30, low_options = { NpuSimBackend = { power_mode = "low" } } }
        # the policy's constructor parameters; *_options tables are checked like
        #   backend_options

    [[signal]]
    use = "scripted"                # battery | cpu | thermal | pressure | scripted | "module:attr"
    params = { timeline = [[0, { "battery.percent" = 100 }], [2.5, { "battery.percent" = 15 }]] }

    [run]
    duration_s = 5                  # optional: run until interrupted
    engine_period_s = 0.5           # the policy engine runs at least this often (default 1.0)
    poll_interval_s = 0.25          # how often signals are polled (default: engine_period_s)

Besides types and ranges, the checks that need the whole file: the program loads
(``orchestra.program.load``) and has the method; each delegated backend is registered and
available; a camera's source shape/dtype matches the method's input 0; binding a core of an
``npu_sim`` device needs a method that delegates to ``NpuSimBackend`` (and such a method
needs a configured device); two cameras can't hold one exclusive core; the cameras on a core
fit its memory (each instance reserves the NpuSim subgraphs' working set); a backend option
set by a binding (``device``, ``core``, ``label``) can't be given another value; policy and
signal-source parameters are checked by building them (``load_policy`` / ``load_source``,
which construct the object and start nothing).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import json
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from .errors import ConfigError, OrchestraError

__all__ = [
    "CameraConfig",
    "Config",
    "ConfigError",
    "ConfigLimits",
    "DeviceConfig",
    "PolicyConfig",
    "ProgramConfig",
    "RunConfig",
    "SignalConfig",
    "SourceConfig",
    "load_config",
    "validate_config",
]

DROP_POLICIES = ("drop_oldest", "drop_newest", "block")
DEVICE_KINDS = ("npu_sim", "cpu")
NPU_BACKEND = "NpuSimBackend"
# NpuDevice defaults (kept in step with orchestra.backends.npu_sim, imported lazily).
_NPU_DEFAULTS: dict[str, Any] = {"cores": 4, "core_memory": 4 << 20, "macs_per_cycle": 256,
                                 "time_scale": 0.0, "job_overhead_cycles": 2000}


# ---------------------------------------------------------------------------------------
# The result


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({k: _freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    """Plain dicts and lists again (what constructors that check ``list``/``dict`` want)."""
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class ConfigLimits:
    """Bounds on what a config may ask for, so an untrusted file can't exhaust memory or the
    event loop. Pass your own to :func:`load_config` / :func:`validate_config` to allow more.

    Attributes:
        max_depth: how deeply tables and arrays may nest (the schema needs 5).
        max_fps: a source's ``fps`` (a source at an fps the machine can't reach produces
            every frame late, at once).
        max_queue: a camera's ``queue`` (frames held in memory, per camera).
        max_inflight: a camera's ``inflight``.
        max_npu_cores: an ``npu_sim`` device's ``cores`` (each core is a thread and state).
        max_name_length: a camera's name (names are printed in the live view and logs).
        queue_warn_s: warn (not an error) when a camera's queue holds more than this many
            seconds of its source's frames (stale frames, memory).
    """

    max_depth: int = 32
    max_fps: float = 10_000.0
    max_queue: int = 4096
    max_inflight: int = 64
    max_npu_cores: int = 256
    max_name_length: int = 64
    queue_warn_s: float = 5.0


DEFAULT_LIMITS = ConfigLimits()


@dataclass(frozen=True)
class ProgramConfig:
    """A program: ``path`` is absolute (resolved against the config's folder)."""

    name: str
    path: Path
    method: str = "forward"


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


@dataclass(frozen=True)
class SourceConfig:
    """A camera's frame source: ``kind`` (``synthetic``, ``file``, a registered source name
    or ``module:attr``) and the factory's parameters (without ``name``). ``synthetic``
    params are complete (``fps``, ``shape``, ``dtype``, ``seed``, and ``count`` if given);
    a ``file`` path is absolute."""

    kind: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", _freeze(self.params))

    def build(self, name: str) -> Any:
        """The source object (``orchestra.pipeline.load_source(kind, name=name, **params)``)."""
        from orchestra.pipeline import load_source

        return load_source(self.kind, name=name, **_thaw(self.params))


@dataclass(frozen=True)
class CameraConfig:
    """One camera: one instance of the program's method, one pipeline.

    ``bind`` is in the orchestrator's form (``{"npu0.core": 0}``, ``{"npu0.camera":
    "front"}``, ``{"cpu": 1}``); ``core`` is the NPU core it resolves to, as
    ``(device, core)``, or None.
    """

    name: str
    program: str
    source: SourceConfig
    bind: Mapping[str, Any] = field(default_factory=dict)
    backend_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    queue: int = 8
    drop: str = "drop_oldest"
    deadline_s: float | None = None
    inflight: int = 1
    core: tuple[str, int] | None = None
    placement: str = "thread"

    def __post_init__(self) -> None:
        object.__setattr__(self, "bind", _freeze(self.bind))
        object.__setattr__(self, "backend_options", _freeze(self.backend_options))

    def build_source(self) -> Any:
        """The camera's source object, named after the camera."""
        return self.source.build(self.name)

    def instance_spec(self) -> Any:
        """An :class:`~orchestra.orchestrator.InstanceSpec` (name, bind, backend_options)."""
        from orchestra.orchestrator import InstanceSpec

        return InstanceSpec(name=self.name, bind=_thaw(self.bind),
                            backend_options={b: dict(v) for b, v in self.backend_options.items()},
                            placement=self.placement)  # type: ignore[arg-type]


@dataclass(frozen=True)
class PolicyConfig:
    """A policy: ``use`` (a registered name or ``module:attr``) and its parameters
    (``priority`` included when the file gives one)."""

    use: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", _freeze(self.params))

    def build(self) -> Any:
        """The policy object (``orchestra.policies.load_policy(use, **params)``)."""
        from orchestra.policies import load_policy

        return load_policy(self.use, **_thaw(self.params))


@dataclass(frozen=True)
class SignalConfig:
    """A signal source: ``use`` and its parameters."""

    use: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", _freeze(self.params))

    def build(self) -> Any:
        """The source object (``orchestra.policies.load_source(use, **params)``)."""
        from orchestra.policies import load_source

        return load_source(self.use, **_thaw(self.params))


@dataclass(frozen=True)
class RunConfig:
    """How long to run (None: until interrupted) and how often the policy engine runs."""

    duration_s: float | None = None
    engine_period_s: float = 1.0
    poll_interval_s: float | None = None


@dataclass(frozen=True)
class Config:
    """A whole config file (see the module docstring for the schema)."""

    path: Path
    programs: tuple[ProgramConfig, ...]
    devices: tuple[DeviceConfig, ...]
    cameras: tuple[CameraConfig, ...]
    policies: tuple[PolicyConfig, ...]
    signals: tuple[SignalConfig, ...]
    run: RunConfig
    warnings: tuple[str, ...] = ()  # "path: message" lines: valid, but probably not meant

    def program(self, name: str | None = None) -> ProgramConfig:
        """The program called ``name`` (None: the only one)."""
        if name is None and len(self.programs) == 1:
            return self.programs[0]
        for p in self.programs:
            if p.name == name:
                return p
        raise ConfigError(f"{self.path}: no program named {name!r} (programs: {', '.join(p.name for p in self.programs)})")

    def device(self, name: str) -> DeviceConfig:
        for d in self.devices:
            if d.name == name:
                return d
        raise ConfigError(f"{self.path}: no device named {name!r} (devices: {', '.join(d.name for d in self.devices) or 'none'})")


# ---------------------------------------------------------------------------------------
# Showing values and paths


_BARE = re.compile(r"[A-Za-z0-9_-]+")


def _key(k: str) -> str:
    return k if _BARE.fullmatch(k) else json.dumps(k, ensure_ascii=False)


def _join(path: str, key: str) -> str:
    return f"{path}.{_key(key)}" if path else _key(key)


def _show(v: Any, limit: int = 60) -> str:
    """A value as TOML would write it (shortened)."""

    def show(x: Any) -> str:
        if isinstance(x, bool):
            return "true" if x else "false"
        if isinstance(x, str):
            return json.dumps(x, ensure_ascii=False)
        if isinstance(x, float):
            return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf") if math.isinf(x) else repr(x)
        if isinstance(x, int):
            return str(x)
        if isinstance(x, Mapping):
            return "{ " + ", ".join(f"{_key(str(k))} = {show(val)}" for k, val in x.items()) + " }" if x else "{}"
        if isinstance(x, (list, tuple)):
            return "[" + ", ".join(show(i) for i in x) + "]"
        if hasattr(x, "isoformat"):
            return x.isoformat()
        return repr(x)

    s = show(v)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _kind_of(v: Any) -> str:
    """What was given, for "must be ..., got <this>" (a table by kind, anything else by value)."""
    return "a table" if isinstance(v, Mapping) and v else _show(v)


def _one_line(msg: str) -> str:
    return " ".join(str(msg).split("\n"))


def _names(items: Sequence[str]) -> str:
    return ", ".join(items) or "none"


def _hint(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.7)
    return f"; did you mean {close[0]!r}?" if close else ""


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {plural or word + 's'}"


# ---------------------------------------------------------------------------------------
# Value checks: each returns the (converted) value, or _BAD after recording the problem.


class _Bad:
    def __repr__(self) -> str:
        return "<bad>"


_BAD: Any = _Bad()
_MISSING: Any = object()


def _any_bad(*values: Any) -> bool:
    return any(v is _BAD for v in values)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# name -> (test, converter, "must be ..." text)
_KINDS: dict[str, tuple[Callable[[Any], bool], Callable[[Any], Any], str]] = {
    "positive_int": (lambda v: _is_int(v) and v > 0, int, "a positive integer"),
    "nonneg_int": (lambda v: _is_int(v) and v >= 0, int, "an integer >= 0"),
    "int": (_is_int, int, "an integer"),
    "positive_number": (lambda v: _is_num(v) and v > 0, float, "a positive number"),
    "nonneg_number": (lambda v: _is_num(v) and v >= 0, float, "a number >= 0"),
    "string": (lambda v: isinstance(v, str) and v != "", str, "a non-empty string"),
    "bool": (lambda v: isinstance(v, bool), bool, "true or false"),
}

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")
_UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "kib": 1024, "mib": 1024**2, "gib": 1024**3}


def _parse_size(v: Any) -> int | None:
    if _is_int(v):
        return v if v >= 0 else None
    if not isinstance(v, str):
        return None
    m = _SIZE.fullmatch(v)
    if m is None or m.group(2).lower() not in _UNITS:
        return None
    n = float(m.group(1)) * _UNITS[m.group(2).lower()]
    return int(n) if n == int(n) else None


# ---------------------------------------------------------------------------------------
# What the checks learn about a program


@dataclass
class _Input:
    dtype: np.dtype | None
    sizes: tuple[int, ...]
    dynamism: int


@dataclass
class _ProgramInfo:
    name: str
    written: str  # the path as the file gives it
    path: Path
    method: str
    inputs: list[_Input] | None = None  # None: the program couldn't be read
    backends: tuple[str, ...] = ()
    npu_working_set: int = 0  # bytes one instance reserves on its NPU core

    @property
    def where(self) -> str:
        return f"method {self.method!r} of {self.written}"


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


@dataclass
class _Problem:
    path: str  # "" for the file itself
    message: str
    line: int | None = None


# ---------------------------------------------------------------------------------------
# The checker


_TOP_KEYS = ("program", "device", "camera", "policy", "signal", "run")
_PROGRAM_KEYS = ("name", "path", "method")
_NPU_KEYS = ("kind", "cores", "core_memory", "clock_mhz", "power_w", "macs_per_cycle", "links", "time_scale",
             "job_overhead_cycles", "exclusive", "capacity")
_CPU_KEYS = ("kind", "cpus", "exclusive", "capacity", "thread_options")
_CAMERA_KEYS = ("name", "program", "source", "bind", "backend_options", "queue", "drop", "deadline_ms", "inflight",
                "placement")
_SYNTHETIC_KEYS = ("kind", "fps", "shape", "dtype", "seed", "count")
_FILE_KEYS = ("kind", "path", "fps", "loop", "shape", "dtype")
_POLICY_KEYS = ("use", "priority", "params")
_SIGNAL_KEYS = ("use", "params")
_RUN_KEYS = ("duration_s", "engine_period_s", "poll_interval_s")


class _Checker:
    def __init__(self, doc: dict[str, Any], base: Path, limits: ConfigLimits = DEFAULT_LIMITS) -> None:
        self.doc = doc
        self.base = base
        self.limits = limits
        self.problems: list[_Problem] = []
        self.warnings: list[str] = []
        self.programs: dict[str, _ProgramInfo] = {}
        self.programs_broken = False  # a [program] entry without a usable name (reported)
        self.program_configs: list[ProgramConfig] = []
        self.devices: dict[str, _Device] = {}
        self.bad_devices: set[str] = set()  # declared, but too broken to check bindings against
        self.device_configs: list[DeviceConfig] = []
        self.cameras: list[CameraConfig] = []
        self.camera_names: list[str] = []
        self.policies: list[PolicyConfig] = []
        self.signals: list[SignalConfig] = []
        self.run_config = RunConfig()
        self.slots: dict[tuple[str, Any], list[str]] = {}  # slot -> cameras holding it
        self.core_load: dict[tuple[str, int], list[tuple[str, int]]] = {}  # core -> (camera, bytes)
        self._option_specs: dict[str, Any] = {}
        self._backends: tuple[str, ...] | None = None

    # -- recording ----------------------------------------------------------------------
    def err(self, path: str, message: str) -> None:
        self.problems.append(_Problem(path, _one_line(message)))

    def table(self, value: Any, path: str) -> dict[str, Any] | None:
        if isinstance(value, dict):
            return value
        self.err(path, f"must be a table, got {_kind_of(value)}")
        return None

    def known(self, table: Mapping[str, Any], path: str, known: Sequence[str]) -> None:
        for k in table:
            if k not in known:
                self.err(_join(path, k), f"unknown key (known keys: {', '.join(known)}){_hint(k, known)}")

    def get(self, table: Mapping[str, Any], key: str, path: str, kind: str, default: Any = _MISSING) -> Any:
        """``table[key]`` checked as ``kind``; ``default`` when absent (absent and no default: required)."""
        p = _join(path, key)
        if key not in table:
            if default is _MISSING:
                self.err(p, "missing (required)")
                return _BAD
            return default
        v = table[key]
        test, convert, want = _KINDS[kind]
        if not test(v):
            self.err(p, f"must be {want}, got {_kind_of(v)}")
            return _BAD
        return convert(v)

    def choice(self, table: Mapping[str, Any], key: str, path: str, choices: Sequence[str], default: Any = _MISSING) -> Any:
        p = _join(path, key)
        if key not in table:
            if default is _MISSING:
                self.err(p, f"missing (required; one of {', '.join(choices)})")
                return _BAD
            return default
        v = table[key]
        if v not in choices or not isinstance(v, str):
            shown = repr(v) if isinstance(v, str) else _show(v)
            self.err(p, f"{shown} is not one of {', '.join(choices)}{_hint(v, choices) if isinstance(v, str) else ''}")
            return _BAD
        return v

    def at_most(self, v: Any, path: str, key: str, limit: str) -> Any:
        """``v`` unless it exceeds ``ConfigLimits.<limit>`` (then recorded, _BAD)."""
        most = getattr(self.limits, limit)
        if v is not _BAD and v is not None and v > most:
            self.err(_join(path, key), f"{_show(v)} is more than {most:g} (ConfigLimits.{limit})")
            return _BAD
        return v

    # -- registries (looked up once) -------------------------------------------------------
    def backend_names(self) -> tuple[str, ...]:
        if self._backends is None:
            from .runtime import registered_backends

            try:
                self._backends = registered_backends()
            except OrchestraError as exc:  # a broken backend plugin
                self.err("", f"can't list the registered backends: {exc.message}")
                self._backends = ()
        return self._backends

    def option_specs(self, backend: str) -> dict[str, Any] | None:
        if backend not in self._option_specs:
            from .runtime import get_backend_class

            try:
                specs = {s.name: s for s in get_backend_class(backend).option_specs}
            except OrchestraError:
                specs = None
            self._option_specs[backend] = specs
        return self._option_specs[backend]

    # -- the document ---------------------------------------------------------------------
    def run(self) -> None:
        doc = self.doc
        self.known(doc, "", _TOP_KEYS)
        self.check_programs(doc.get("program", _MISSING))
        self.check_devices(doc.get("device", {}))
        self.check_cameras(doc.get("camera", _MISSING))
        self.check_links()
        self.check_policies(doc.get("policy", []))
        self.check_signals(doc.get("signal", []))
        self.check_run(doc.get("run", {}))

    # -- [program] ------------------------------------------------------------------------
    def check_programs(self, value: Any) -> None:
        if value is _MISSING:
            self.err("program", 'missing (required): add [program] with path = "model.pte"')
            return
        if isinstance(value, dict):
            entries = [("program", value)]
        elif isinstance(value, list):
            if not value:
                self.err("program", "no programs: add [[program]] entries or one [program] table")
                return
            entries = [(f"program[{i}]", v) for i, v in enumerate(value)]
        else:
            self.err("program", f"must be a table ([program]) or an array of tables ([[program]]), got {_kind_of(value)}")
            return
        many = len(entries) > 1
        seen: dict[str, str] = {}
        for path, raw in entries:
            t = self.table(raw, path)
            if t is None:
                continue
            self.known(t, path, _PROGRAM_KEYS)
            written = self.get(t, "path", path, "string")
            method = self.get(t, "method", path, "string", "forward")
            name = self.get(t, "name", path, "string", None if not many else _MISSING)
            if name is None and written is not _BAD:
                name = Path(written).stem or "main"
            if name is _BAD or name is None:
                self.programs_broken = True
                continue
            if name in seen:
                self.err(_join(path, "name"), f"duplicate program name {name!r} (also {seen[name]})")
                continue
            seen[name] = path
            if written is _BAD or method is _BAD:
                self.programs[name] = _ProgramInfo(name, "?", Path(), "forward", None)
                continue
            resolved = (self.base / written).resolve() if not Path(written).is_absolute() else Path(written)
            info = _ProgramInfo(name, written, resolved, method)
            self.programs[name] = info
            self.load_program(info, path)
            self.program_configs.append(ProgramConfig(name, resolved, method))

    def load_program(self, info: _ProgramInfo, path: str) -> None:
        from .program import TensorShapeDynamism, load, loads, numpy_dtype
        from .program import Tensor as TensorDef

        p = _join(path, "path")
        if not info.path.exists():
            self.err(p, f"{info.written}: no such file")
            return
        if info.path.is_dir():
            self.err(p, f"{info.written}: is a directory, not a .pte file")
            return
        if not info.path.is_file():  # a FIFO or a device would block or never end
            self.err(p, f"{info.written}: not a regular file")
            return
        try:
            prog = load(str(info.path))
        except OrchestraError as exc:
            self.err(p, exc.message.replace(str(info.path), info.written))  # the path as the file wrote it
            return
        except (OSError, MemoryError, ValueError) as exc:
            self.err(p, f"{info.written}: can't read: {type(exc).__name__}: {exc}")
            return
        methods = prog.method_names
        if info.method not in methods:
            self.err(_join(path, "method"), f"no method {info.method!r} in {info.written} (methods: {_names(methods)})"
                     f"{_hint(info.method, methods)}")
            return
        plan = prog.plan(info.method)
        inputs = []
        for vi in plan.inputs:
            t = plan.values[vi].val if 0 <= vi < len(plan.values) else None
            if isinstance(t, TensorDef):
                inputs.append(_Input(numpy_dtype(t.scalar_type), tuple(t.sizes), t.shape_dynamism))
            else:
                inputs.append(_Input(None, (), TensorShapeDynamism.STATIC))
        info.inputs = inputs
        backends: list[str] = []
        for d in plan.delegates:
            if d.id not in backends:
                backends.append(d.id)
        info.backends = tuple(backends)
        for b in backends:
            if b not in self.backend_names():
                self.err(p, f"{info.where} delegates to backend {b!r}, which is not registered "
                            f"(registered: {_names(self.backend_names())})")
                continue
            from .runtime import get_backend_class

            try:
                available = get_backend_class(b).is_available()
            except Exception:  # noqa: BLE001 - a plugin's is_available must not break validation
                available = False
            if not available:
                self.err(p, f"{info.where} delegates to backend {b!r}, which is not available on this machine")
        if NPU_BACKEND in backends and NPU_BACKEND in self.backend_names():
            try:
                from .backends.npu_sim import analyze_subgraph

                total = 0
                for d in plan.delegates:
                    if d.id == NPU_BACKEND:
                        total += analyze_subgraph(loads(bytes(prog.delegate_data(d.processed)))).working_set_bytes
                info.npu_working_set = total
            except OrchestraError as exc:
                self.err(p, f"{info.where}: {NPU_BACKEND} delegate: {exc.message}")
            except (IndexError, ImportError) as exc:
                self.err(p, f"{info.where}: {NPU_BACKEND} delegate can't be read: {exc}")

    # -- [device.*] -----------------------------------------------------------------------
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
        from .backends.npu_sim import DEFAULT_CLOCK_MHZ, DEFAULT_LINKS, DEFAULT_POWER_W

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

    # -- [[camera]] -----------------------------------------------------------------------
    def check_cameras(self, value: Any) -> None:
        if value is _MISSING:
            self.err("camera", "no cameras: add at least one [[camera]]")
            return
        if not isinstance(value, list):
            self.err("camera", f"must be an array of tables ([[camera]]), got {_kind_of(value)}")
            return
        if not value:
            self.err("camera", "no cameras: add at least one [[camera]]")
            return
        seen: dict[str, str] = {}
        raw_tables: list[tuple[str, dict[str, Any]]] = []
        for i, raw in enumerate(value):
            path = f"camera[{i}]"
            t = self.table(raw, path)
            if t is None:
                continue
            name = self.camera_name(t, path)
            if name is not _BAD:
                if name in seen:
                    self.err(_join(path, "name"), f"duplicate camera name {name!r} (also {seen[name]})")
                else:
                    seen[name] = path
                    self.camera_names.append(name)
            raw_tables.append((path, t))
        for path, t in raw_tables:
            self.check_camera(path, t)

    def camera_name(self, t: Mapping[str, Any], path: str) -> Any:
        """The camera's name: printable (it is shown on terminals: no control characters,
        escapes or newlines) and at most ``max_name_length`` characters."""
        name = self.get(t, "name", path, "string")
        if name is _BAD:
            return _BAD
        if not name.isprintable():
            self.err(_join(path, "name"), f"{_show(name)} holds control characters (newlines, escapes, NUL, ...): "
                                          f"use printable characters")
            return _BAD
        if len(name) > self.limits.max_name_length:
            self.err(_join(path, "name"), f"is {len(name)} characters long, more than {self.limits.max_name_length} "
                                          f"(ConfigLimits.max_name_length)")
            return _BAD
        return name

    def check_camera(self, path: str, t: dict[str, Any]) -> None:
        self.known(t, path, _CAMERA_KEYS)
        raw_name = t.get("name")
        name = raw_name if (isinstance(raw_name, str) and raw_name and raw_name.isprintable()
                            and len(raw_name) <= self.limits.max_name_length) else None
        ok = name is not None
        # program
        prog: _ProgramInfo | None = None
        if "program" in t:
            pname = self.get(t, "program", path, "string")
            if pname is not _BAD:
                prog = self.programs.get(pname)
                if prog is None and not self.programs_broken:
                    self.err(_join(path, "program"), f"no program named {pname!r} (programs: {_names(list(self.programs))})"
                                                     f"{_hint(pname, list(self.programs))}")
            ok = ok and prog is not None
        elif len(self.programs) == 1:
            prog = next(iter(self.programs.values()))
        elif len(self.programs) > 1 or self.programs_broken:
            if not self.programs_broken:
                self.err(path, f"missing key 'program': there are several programs ({', '.join(self.programs)})")
            ok = False
        else:
            ok = False  # no usable program: reported under [program]
        source = self.check_source(path, t, prog, name or "camera")
        queue = self.at_most(self.get(t, "queue", path, "positive_int", 8), path, "queue", "max_queue")
        drop = self.choice(t, "drop", path, DROP_POLICIES, "drop_oldest")
        deadline_ms = self.get(t, "deadline_ms", path, "positive_number", None)
        inflight = self.at_most(self.get(t, "inflight", path, "positive_int", 1), path, "inflight", "max_inflight")
        if queue is not _BAD and source is not _BAD and source.params.get("fps"):
            seconds = queue / source.params["fps"]
            if seconds > self.limits.queue_warn_s:
                self.warnings.append(f"{_join(path, 'queue')}: holds {seconds:.3g} s of frames at "
                                     f"{source.params['fps']:g} fps (more than {self.limits.queue_warn_s:g} s: "
                                     f"stale frames and memory); a smaller queue keeps results fresh")
        placement = self.choice(t, "placement", path, ("thread", "process"), "thread")
        bind, core = self.check_bind(path, t, prog, name)
        options = self.check_camera_options(path, t, prog, bind, core, name)
        if placement == "process" and prog is not None and (core is not None or "NpuSimBackend" in prog.backends):
            where = f"npu_sim device {core[0]!r}" if core is not None else "npu_sim devices"
            self.err(_join(path, "placement"), f'"process" can\'t reach {where}: simulated devices live in the '
                                               f'orchestra process; use placement = "thread" for this camera')
            placement = _BAD
        if _any_bad(source, queue, drop, deadline_ms, inflight, placement, bind, options) or not ok or prog is None:
            return
        self.cameras.append(CameraConfig(
            name=name, program=prog.name, source=source, bind=bind, backend_options=options, queue=queue, drop=drop,
            deadline_s=None if deadline_ms is None else deadline_ms / 1000.0, inflight=inflight, core=core,
            placement=placement))

    def check_source(self, path: str, t: dict[str, Any], prog: _ProgramInfo | None, camera: str) -> Any:
        sp = _join(path, "source")
        if "source" not in t:
            self.err(sp, 'missing (required), e.g. source = { kind = "synthetic", fps = 30 }')
            return _BAD
        s = self.table(t["source"], sp)
        if s is None:
            return _BAD
        kind = self.get(s, "kind", sp, "string")
        if kind is _BAD:
            return _BAD
        inp = prog.inputs[0] if prog is not None and prog.inputs else None
        if prog is not None and prog.inputs is not None and len(prog.inputs) != 1:
            self.err(sp, f"a camera feeds one frame per execute, but {prog.where} takes {len(prog.inputs)} inputs")
            inp = None
        if kind == "synthetic":
            return self.check_synthetic(sp, s, prog, inp)
        if kind == "file":
            return self.check_file_source(sp, s, prog, inp, camera)
        return self.check_other_source(sp, s, kind)

    def check_dtype(self, s: Mapping[str, Any], sp: str) -> Any:
        if "dtype" not in s:
            return None
        v = s["dtype"]
        dp = _join(sp, "dtype")
        if not isinstance(v, str) or not v:
            self.err(dp, f'must be a numpy dtype name like "float32", got {_kind_of(v)}')
            return _BAD
        try:
            dt = np.dtype(v)
        except (TypeError, ValueError):
            self.err(dp, f'{v!r} is not a numpy dtype (e.g. "float32", "uint8")')
            return _BAD
        if dt.kind not in "iuf":
            self.err(dp, f"frames must be integers or floats, got {dt}")
            return _BAD
        return dt

    def check_shape(self, s: Mapping[str, Any], sp: str) -> Any:
        if "shape" not in s:
            return None
        v = s["shape"]
        if not isinstance(v, list) or not v or not all(_is_int(d) and d > 0 for d in v):
            self.err(_join(sp, "shape"), f"must be a non-empty array of positive integers, got {_kind_of(v)}")
            return _BAD
        return tuple(v)

    def match_input(self, path: str, prog: _ProgramInfo, inp: _Input, shape: tuple[int, ...] | None,
                    dtype: np.dtype | None, what: str = "") -> None:
        from .program import TensorShapeDynamism

        target = f"input 0 of {prog.method}"
        if shape is not None:
            want = inp.sizes
            if inp.dynamism == TensorShapeDynamism.STATIC:
                ok = tuple(shape) == tuple(want)
            elif inp.dynamism == TensorShapeDynamism.DYNAMIC_BOUND:
                ok = len(shape) == len(want) and all(a <= b for a, b in zip(shape, want))
            else:
                ok = len(shape) == len(want)
            if not ok:
                bound = "" if inp.dynamism == TensorShapeDynamism.STATIC else ", dynamic; sizes are upper bounds"
                self.err(_join(path, "shape") if not what else path,
                         f"{what}{_show(list(shape))} does not match {target} ({_show(list(want))}{bound})")
        if dtype is not None and inp.dtype is not None and dtype != inp.dtype:
            self.err(_join(path, "dtype") if not what else path, f"{what}{dtype} does not match {target} ({inp.dtype})")

    def check_synthetic(self, sp: str, s: dict[str, Any], prog: _ProgramInfo | None, inp: _Input | None) -> Any:
        self.known(s, sp, _SYNTHETIC_KEYS)
        fps = self.at_most(self.get(s, "fps", sp, "positive_number"), sp, "fps", "max_fps")
        seed = self.get(s, "seed", sp, "int", 0)
        count = self.get(s, "count", sp, "nonneg_int", None)
        shape = self.check_shape(s, sp)
        dtype = self.check_dtype(s, sp)
        if inp is not None and prog is not None and shape is not _BAD and dtype is not _BAD:
            self.match_input(sp, prog, inp, shape, dtype)
        if shape is None:  # the method's input shape (unknown when the program has problems: reported)
            shape = _BAD if inp is None else inp.sizes
        if dtype is None:
            dtype = inp.dtype if inp is not None and inp.dtype is not None and inp.dtype.kind in "iuf" else np.dtype(np.float32)
        if _any_bad(fps, seed, count, shape, dtype):
            return _BAD
        params: dict[str, Any] = {"fps": fps, "shape": tuple(shape), "dtype": str(dtype), "seed": seed}
        if count is not None:
            params["count"] = count
        return SourceConfig("synthetic", params)

    def check_file_source(self, sp: str, s: dict[str, Any], prog: _ProgramInfo | None, inp: _Input | None,
                          camera: str) -> Any:
        self.known(s, sp, _FILE_KEYS)
        written = self.get(s, "path", sp, "string")
        fps = self.at_most(self.get(s, "fps", sp, "positive_number", None), sp, "fps", "max_fps")
        loop = self.get(s, "loop", sp, "bool", False)
        shape = self.check_shape(s, sp)
        dtype = self.check_dtype(s, sp)
        if _any_bad(written, fps, loop, shape, dtype):
            return _BAD
        resolved = Path(written) if Path(written).is_absolute() else (self.base / written).resolve()
        pp = _join(sp, "path")
        if not resolved.exists():
            self.err(pp, f"{written}: no such file")
            return _BAD
        params: dict[str, Any] = {"path": str(resolved), "fps": fps, "loop": loop}
        if shape is not None:
            params["shape"] = shape
        if dtype is not None:
            params["dtype"] = str(dtype)
        try:
            from .pipeline import FramesFile
        except ImportError:  # the pipeline layer is unavailable: the checks above are all we can do
            return SourceConfig("file", params)
        try:
            frames = FramesFile(resolved, fps=fps, loop=loop, shape=shape, dtype=dtype, name=camera)
        except OrchestraError as exc:
            self.err(pp, exc.message.replace(str(resolved), written))
            return _BAD
        except Exception as exc:  # noqa: BLE001 - untrusted file contents: never a traceback
            self.err(pp, f"{written}: can't read frames: {type(exc).__name__}: {exc}")
            return _BAD
        if inp is not None and prog is not None:
            self.match_input(pp, prog, inp, tuple(frames.frame_shape), frames.dtype,
                             what=f"{written} holds frames of ")
        del frames
        return SourceConfig("file", params)

    def check_other_source(self, sp: str, s: dict[str, Any], kind: str) -> Any:
        kp = _join(sp, "kind")
        try:
            from .pipeline import source_names
        except ImportError:
            self.err(kp, f"{kind!r} is not one of synthetic, file (the pipeline package is unavailable)")
            return _BAD
        if ":" in kind:
            module_name, _, attr = kind.partition(":")
            try:
                obj: Any = importlib.import_module(module_name)
                for part in attr.split("."):
                    obj = getattr(obj, part)
            except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001 - user code: never a traceback, never an exit
                self.err(kp, f"source {kind!r} can't be imported: {type(exc).__name__}: {exc}")
                return _BAD
            from .pipeline._sources import module_attr_problem

            problem = module_attr_problem(obj)
            if problem is not None:
                self.err(kp, f"source {kind!r} is {_show(obj)}, {problem}")
                return _BAD
        else:
            try:
                names = source_names()
            except Exception as exc:  # noqa: BLE001 - a broken source plugin
                self.err(kp, f"can't list the sources: {type(exc).__name__}: {exc}")
                return _BAD
            if kind not in names:
                self.err(kp, f"no source kind {kind!r} (kinds: {_names(names)}; or 'module:attr'){_hint(kind, names)}")
                return _BAD
        if "name" in s:
            self.err(_join(sp, "name"), "is the camera's name: set it with the camera's name key")
            return _BAD
        return SourceConfig(kind, {k: v for k, v in s.items() if k != "kind"})

    # bindings ------------------------------------------------------------------------------
    def check_bind(self, path: str, t: dict[str, Any], prog: _ProgramInfo | None, camera: str | None) -> tuple[Any, Any]:
        bp = _join(path, "bind")
        bind_in = t.get("bind", {})
        if not isinstance(bind_in, dict):
            self.err(bp, f"must be a table, got {_kind_of(bind_in)}")
            return _BAD, None
        bind: dict[str, Any] = {}
        cores: list[tuple[str, int]] = []
        cpu_slots: list[int] = []
        cpu_dev: _Device | None = None
        ok = True
        npu_names = [n for n, d in self.devices.items() if d.kind == "npu_sim"]
        forms = ('"<device>.core" = N, "<device>.camera" = "<link>", camera_link = "<device>", cpu = N or cpu = [N, ...]')
        for key, v in bind_in.items():
            kp = _join(bp, key)
            if key == "camera_link":
                if not isinstance(v, str) or not v:
                    self.err(kp, f"must name an npu_sim device (devices: {_names(npu_names)}), got {_kind_of(v)}")
                    ok = False
                    continue
                dev = self.npu_device(kp, v, npu_names)
                if dev is None:
                    ok = False
                    continue
                if camera is None or dev.links is None:
                    ok = False
                    continue
                if camera not in dev.links:
                    if dev.links_broken:
                        ok = False
                        continue
                    self.err(bp, f"device {v} has no link for camera {camera!r} (links: {_names(list(dev.links))})")
                    ok = False
                    continue
                bind[f"{v}.camera"] = camera
                cores.append((v, dev.links[camera]))
            elif key == "cpu":
                cpu_dev = next((d for d in self.devices.values() if d.kind == "cpu"), None)
                one = _is_int(v)
                vals = [v] if one else v if isinstance(v, list) else None
                if not vals or not all(_is_int(c) and c >= 0 for c in vals) or len(set(vals)) != len(vals):
                    self.err(kp, f"must be a CPU number or an array of distinct CPU numbers, got {_kind_of(v)}")
                    ok = False
                    continue
                if cpu_dev is None:
                    self.err(kp, 'no device of kind "cpu" is configured: add [device.cpu] with kind = "cpu"')
                    ok = False
                    continue
                missing = [c for c in vals if cpu_dev.cpus is not None and c not in cpu_dev.cpus]
                if missing:
                    self.err(kp, f"cpu {missing[0]} does not exist on device {cpu_dev.name} "
                                 f"(cpus {', '.join(map(str, cpu_dev.cpus or ()))})")
                    ok = False
                    continue
                bind["cpu"] = v if one else tuple(vals)
                cpu_slots = list(vals)
            elif "." in key and key.rsplit(".", 1)[1] in ("core", "camera"):
                dname, unit = key.rsplit(".", 1)
                dev = self.npu_device(kp, dname, npu_names)
                if dev is None:
                    ok = False
                    continue
                if unit == "core":
                    if not _is_int(v) or v < 0:
                        self.err(kp, f"must be a core number (an integer >= 0), got {_kind_of(v)}")
                        ok = False
                        continue
                    if dev.cores is None:
                        ok = False
                        continue
                    if v >= dev.cores:
                        self.err(bp, f"core {v} does not exist on device {dname} ({self.core_range(dev)})")
                        ok = False
                        continue
                    bind[key] = v
                    cores.append((dname, v))
                else:
                    if dev.links is None:
                        ok = False
                        continue
                    if not isinstance(v, str) or v not in dev.links:
                        if dev.links_broken and isinstance(v, str):
                            ok = False
                            continue
                        self.err(kp, f"device {dname} has no camera link {_show(v)} (links: {_names(list(dev.links))})")
                        ok = False
                        continue
                    bind[key] = v
                    cores.append((dname, dev.links[v]))
            else:
                self.err(kp, f"unknown binding (bind with {forms})")
                ok = False
        if len(set(cores)) > 1:
            self.err(bp, "binds more than one NPU core (" + ", ".join(f"{d}.core {c}" for d, c in cores) + ")")
            return _BAD, None
        if len(cores) > 1:
            self.err(bp, f"binds {cores[0][0]}.core {cores[0][1]} {len(cores)} times: keep one of its bindings")
            return _BAD, None
        core = cores[0] if cores else None
        # what the method needs from a core
        if core is not None and prog is not None and prog.inputs is not None and NPU_BACKEND not in prog.backends:
            self.err(bp, f"binds {core[0]}.core {core[1]} but {prog.where} does not delegate to {NPU_BACKEND} "
                         f"(it delegates to: {_names(list(prog.backends)) if prog.backends else 'no backend'})")
            ok = False
        # exclusivity / capacity, and memory
        if ok and camera is not None:
            if core is not None:
                ok = self.take_slot(bp, ("npu", core), self.devices[core[0]], f"{core[0]}.core {core[1]}", camera)
                if ok and prog is not None:
                    ok = self.take_memory(bp, core, camera, prog.npu_working_set)
            if ok and cpu_dev is not None:
                for c in cpu_slots:
                    if not self.take_slot(_join(bp, "cpu"), ("cpu", c), cpu_dev, f"cpu {c}", camera):
                        ok = False
                        break
        return (bind if ok else _BAD), core

    def npu_device(self, path: str, name: str, npu_names: list[str]) -> _Device | None:
        dev = self.devices.get(name)
        if dev is None and name in self.bad_devices:
            return None  # its own problems are reported
        if dev is None:
            self.err(path, f"no device named {name!r} (devices: {_names(list(self.devices))}){_hint(name, list(self.devices))}")
            return None
        if dev.kind != "npu_sim":
            self.err(path, f"device {name} is of kind {dev.kind!r}; cores and camera links belong to npu_sim devices "
                           f"({_names(npu_names)})")
            return None
        return dev

    def take_slot(self, path: str, slot: tuple[str, Any], dev: _Device, what: str, camera: str) -> bool:
        holders = self.slots.setdefault(slot, [])
        if dev.exclusive and holders:
            self.err(path, f"{what} is already bound to camera {holders[0]!r}")
            return False
        if not dev.exclusive and dev.capacity is not None and len(holders) >= dev.capacity:
            self.err(path, f"{what} is shared by at most {_plural(dev.capacity, 'camera')} (capacity); "
                           f"already bound to {', '.join(map(repr, holders))}")
            return False
        holders.append(camera)
        return True

    def take_memory(self, path: str, core: tuple[str, int], camera: str, need: int) -> bool:
        dev = self.devices[core[0]]
        if dev.memory is None or need <= 0:
            return True
        load = self.core_load.setdefault(core, [])
        used = sum(n for _, n in load)
        cap = dev.memory[core[1]]
        if used + need > cap:
            others = f"; {used:,} already reserved by {', '.join(repr(c) for c, _ in load)}" if load else ""
            self.err(path, f"{core[0]} core {core[1]} has {cap:,} bytes of memory: camera {camera!r} needs "
                           f"{need:,} (its {NPU_BACKEND} working set){others}")
            return False
        load.append((camera, need))
        return True

    # backend options ---------------------------------------------------------------------
    def check_options_table(self, path: str, value: Any, used_by: _ProgramInfo | None
                            ) -> tuple[dict[str, dict[str, Any]] | None, bool]:
        """backend -> {option: value}, checked against each backend's OptionSpecs. With
        ``used_by``, every backend must be one the program's method delegates to. Returns
        the valid entries (None when ``value`` is not a table) and whether all were valid."""
        t = self.table(value, path)
        if t is None:
            return None, False
        out: dict[str, dict[str, Any]] = {}
        ok = True
        for backend, opts in t.items():
            bp = _join(path, backend)
            if backend not in self.backend_names():
                self.err(bp, f"no backend named {backend!r} (backends: {_names(self.backend_names())})"
                             f"{_hint(backend, self.backend_names())}")
                ok = False
                continue
            if used_by is not None and used_by.inputs is not None and backend not in used_by.backends:
                self.err(bp, f"backend {backend!r} is not used by {used_by.where} (it delegates to: "
                             f"{_names(list(used_by.backends)) if used_by.backends else 'no backend'})")
                ok = False
                continue
            ot = self.table(opts, bp)
            if ot is None:
                ok = False
                continue
            specs = self.option_specs(backend)
            if specs is None:
                ok = False
                continue
            clean: dict[str, Any] = {}
            for key, v in ot.items():
                op = _join(bp, key)
                spec = specs.get(key)
                if spec is None:
                    self.err(op, f"backend {backend!r} has no option {key!r} (options: {_names(list(specs))})"
                                 f"{_hint(key, list(specs))}")
                    ok = False
                    continue
                typ = spec.type
                good = isinstance(v, typ) and not (typ is int and isinstance(v, bool))
                if typ is float and _is_int(v):
                    v, good = float(v), True
                if not good:
                    self.err(op, f"must be {'a' if typ.__name__[0] not in 'aeiou' else 'an'} {typ.__name__}, got {_kind_of(v)}")
                    ok = False
                    continue
                if spec.choices is not None and v not in spec.choices:
                    self.err(op, f"must be one of {', '.join(map(repr, spec.choices))}; got {v!r}")
                    ok = False
                    continue
                clean[key] = v
            out[backend] = clean
        return out, ok

    def check_camera_options(self, path: str, t: dict[str, Any], prog: _ProgramInfo | None, bind: Any,
                             core: tuple[str, int] | None, camera: str | None) -> Any:
        op = _join(path, "backend_options")
        options, ok = self.check_options_table(op, t["backend_options"], prog) if "backend_options" in t else ({}, True)
        if options is None:
            return _BAD
        npu = options.get(NPU_BACKEND, {})
        npu_path = _join(op, NPU_BACKEND)
        if core is not None and bind is not _BAD:
            # the binding sets these init-only options; another value would be rejected at load
            implied = {"device": core[0], "core": core[1], "label": camera}
            for k, want in implied.items():
                if k in npu and npu[k] != want:
                    self.err(_join(npu_path, k), f"{_show(npu[k])} conflicts with the binding ({k} = {_show(want)} from bind)")
                    ok = False
        elif prog is not None and NPU_BACKEND in prog.backends and bind is not _BAD:
            # not bound to a core: the delegate runs where its options say (default npu0, core 0)
            dname = npu.get("device", "npu0")
            dev = self.devices.get(dname)
            if dname in self.bad_devices:
                return _BAD  # the device's own problems are reported
            if dev is None or dev.kind != "npu_sim":
                npus = [n for n, d in self.devices.items() if d.kind == "npu_sim"]
                self.err(_join(path, "bind"), f"{prog.where} delegates to {NPU_BACKEND}, which needs a device: bind "
                                              f"the camera to a core (e.g. bind = {{ \"{(npus or ['npu0'])[0]}.core\" = 0 }}) "
                                              f"or declare [device.{dname}] with kind = \"npu_sim\"")
                return _BAD
            c = npu.get("core", 0)
            if dev.cores is not None and not 0 <= c < dev.cores:
                self.err(_join(npu_path, "core"), f"core {c} does not exist on device {dname} ({self.core_range(dev)})")
                return _BAD
            if ok and camera is not None and not self.take_memory(_join(path, "bind"), (dname, c), camera, prog.npu_working_set):
                return _BAD
        return options if ok else _BAD

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

    # -- [[policy]] and [[signal]] ------------------------------------------------------------
    def entries(self, value: Any, key: str) -> list[tuple[str, dict[str, Any]]]:
        if not isinstance(value, list):
            self.err(key, f"must be an array of tables ([[{key}]]), got {_kind_of(value)}")
            return []
        out = []
        for i, raw in enumerate(value):
            t = self.table(raw, f"{key}[{i}]")
            if t is not None:
                out.append((f"{key}[{i}]", t))
        return out

    def check_policies(self, value: Any) -> None:
        from .policies import get_policy, load_policy, policy_names

        for path, t in self.entries(value, "policy"):
            self.known(t, path, _POLICY_KEYS)
            use = self.get(t, "use", path, "string")
            priority = self.get(t, "priority", path, "int", None)
            params = self.table(t.get("params", {}), _join(path, "params"))
            if use is _BAD or params is None or priority is _BAD:
                continue
            params = dict(params)
            if priority is not None:
                if "priority" in params:
                    self.err(_join(path, "priority"), "also given in params: give it once")
                    continue
                params["priority"] = priority
            factory = None
            if ":" not in use:
                names = policy_names()
                if use not in names:
                    self.err(_join(path, "use"), f"no policy named {use!r} (policies: {_names(names)}; or 'module:attr')"
                                                 f"{_hint(use, names)}")
                    continue
                try:
                    factory = get_policy(use)
                except OrchestraError as exc:
                    self.err(_join(path, "use"), exc.message)
                    continue
            if factory is not None and not self.params_fit(path, f"policy {use!r}", factory, params):
                continue
            ok = True
            for key, v in params.items():
                if key.endswith("_options") and isinstance(v, dict):
                    if not self.check_options_table(_join(_join(path, "params"), key), v, None)[1]:
                        ok = False
            if not ok:
                continue
            if self.build(path, "policy", use, params, load_policy):
                self.policies.append(PolicyConfig(use, params))

    def check_signals(self, value: Any) -> None:
        from .policies import get_source, load_source, source_names

        for path, t in self.entries(value, "signal"):
            self.known(t, path, _SIGNAL_KEYS)
            use = self.get(t, "use", path, "string")
            params = self.table(t.get("params", {}), _join(path, "params"))
            if use is _BAD or params is None:
                continue
            if ":" not in use:
                names = source_names()
                if use not in names:
                    self.err(_join(path, "use"), f"no signal source named {use!r} (signal sources: {_names(names)}; "
                                                 f"or 'module:attr'){_hint(use, names)}")
                    continue
                try:
                    factory = get_source(use)
                except OrchestraError as exc:
                    self.err(_join(path, "use"), exc.message)
                    continue
                if not self.params_fit(path, f"signal source {use!r}", factory, params):
                    continue
            if self.build(path, "signal source", use, params, load_source):
                self.signals.append(SignalConfig(use, params))

    def params_fit(self, path: str, label: str, factory: Any, params: Mapping[str, Any]) -> bool:
        """Reports every parameter ``factory`` doesn't take (the registry reports only the first)."""
        try:
            sig = inspect.signature(factory)
        except (TypeError, ValueError):
            return True
        ps = sig.parameters.values()
        if any(p.kind is p.VAR_KEYWORD for p in ps):
            return True
        accepted = [p.name for p in ps if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        unknown = [k for k in params if k not in accepted]
        for k in unknown:
            self.err(_join(_join(path, "params"), k),
                     f"{label} has no parameter {k!r} (parameters: {_names(accepted)}){_hint(k, accepted)}")
        return not unknown

    _PARAM = re.compile(r"(?:parameters?|needs parameter) '([^']+)'")

    def build(self, path: str, kind: str, use: str, params: dict[str, Any],
              loader: Callable[..., Any]) -> bool:
        pp = _join(path, "params")
        try:
            loader(use, **params)
        except OrchestraError as exc:
            from .errors import InvalidArgumentError

            msg = exc.message
            if not isinstance(exc, InvalidArgumentError):
                self.err(_join(path, "use"), msg)
                return False
            where = pp
            m = self._PARAM.search(msg)
            named = m.group(1) if m else None
            if named is None:  # e.g. "ScriptedSource timeline step 0: ...": the parameter named as a word
                words = [k for k in params if re.search(rf"\b{re.escape(k)}\b", msg)]
                named = words[0] if len(words) == 1 else None
            if named in params and "needs parameter" not in msg:
                where = _join(pp, named)
            self.err(where, msg)
            return False
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001 - user code behind module:attr: never a traceback, never an exit
            self.err(_join(path, "use"), f"{kind} {use!r} failed: {type(exc).__name__}: {exc}")
            return False
        return True

    # -- [run] ----------------------------------------------------------------------------
    def check_run(self, value: Any) -> None:
        t = self.table(value, "run")
        if t is None:
            return
        self.known(t, "run", _RUN_KEYS)
        duration = self.get(t, "duration_s", "run", "positive_number", None)
        period = self.get(t, "engine_period_s", "run", "positive_number", 1.0)
        poll = self.get(t, "poll_interval_s", "run", "positive_number", None)
        if not _any_bad(duration, period, poll):
            self.run_config = RunConfig(duration, period, poll)


# ---------------------------------------------------------------------------------------
# Entry points


_TOML_AT = re.compile(r"\s*\(at line (\d+), column (\d+)\)\s*$")
_TOML_END = re.compile(r"\s*\(at end of document\)\s*$")


def _depth(doc: Any, limit: int) -> bool:
    """Whether tables/arrays in ``doc`` nest more than ``limit`` deep (iterative: no recursion)."""
    stack = [(doc, 1)]
    while stack:
        v, d = stack.pop()
        if d > limit:
            return True
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values() if isinstance(x, (dict, list)))
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v if isinstance(x, (dict, list)))
    return False


def _check(path: str | os.PathLike[str], limits: ConfigLimits = DEFAULT_LIMITS) -> tuple[Config | None, list[_Problem]]:
    p = Path(os.fspath(path))
    name = p.name or str(p)
    try:
        if p.exists() and not p.is_dir() and not p.is_file():  # a FIFO would block reading it
            return None, [_Problem("", "not a regular file")]
        data = p.read_bytes()
    except FileNotFoundError:
        return None, [_Problem("", "no such file")]
    except IsADirectoryError:
        return None, [_Problem("", "is a directory, not a TOML file")]
    except OSError as exc:
        return None, [_Problem("", f"can't read: {exc.strerror or exc}")]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        return None, [_Problem("", f"not UTF-8 text (byte {exc.start})", line)]
    try:
        doc = tomllib.loads(text)
    except RecursionError:
        return None, [_Problem("", f"tables or arrays nested too deeply (more than {limits.max_depth} levels: "
                                   f"ConfigLimits.max_depth)")]
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = _TOML_AT.search(msg)
        if m:
            return None, [_Problem("", f"{msg[: m.start()]} (column {m.group(2)})", int(m.group(1)))]
        m = _TOML_END.search(msg)
        if m:
            return None, [_Problem("", f"{msg[: m.start()]} (at end of document)", text.count("\n") + 1)]
        return None, [_Problem("", _one_line(msg))]
    if _depth(doc, limits.max_depth):
        return None, [_Problem("", f"tables or arrays nested more than {limits.max_depth} levels deep "
                                   f"(ConfigLimits.max_depth)")]
    checker = _Checker(doc, p.resolve().parent, limits)
    try:
        checker.run()
    except Exception as exc:  # noqa: BLE001 - a bug of ours must still not be a traceback for a config
        checker.problems.append(_Problem("", f"internal error while checking {name}: {type(exc).__name__}: {exc}"))
    if checker.problems:
        return None, checker.problems
    config = Config(
        path=p.resolve(),
        programs=tuple(checker.program_configs),
        devices=tuple(checker.device_configs),
        cameras=tuple(checker.cameras),
        policies=tuple(checker.policies),
        signals=tuple(checker.signals),
        run=checker.run_config,
        warnings=tuple(checker.warnings),
    )
    return config, []


def _format(problem: _Problem, file: str) -> str:
    """One line: ``file[:line]: message`` for the file itself, else ``path: message``."""
    if problem.path:
        return f"{problem.path}: {problem.message}"
    line = f":{problem.line}" if problem.line is not None else ""
    return f"{file}{line}: {problem.message}"


def validate_config(path: str | os.PathLike[str], *, limits: ConfigLimits = DEFAULT_LIMITS) -> list[str]:
    """Every problem in the config file at ``path``, one line each (``[]`` when valid).

    Lines start with the path of the offending value (``camera[2].bind: ...``), or with the
    file's name for problems with the file itself (``cameras.toml:12: <TOML syntax error>``).
    ``limits`` bound sizes and rates (see :class:`ConfigLimits`). Never raises for anything
    in the file. Warnings (valid, but probably not meant) are in ``load_config(...).warnings``.
    """
    _, problems = _check(path, limits)
    name = Path(os.fspath(path)).name or os.fspath(path)
    return [_format(p, name) for p in problems]


def load_config(path: str | os.PathLike[str], *, limits: ConfigLimits = DEFAULT_LIMITS) -> Config:
    """Reads and checks the config file at ``path`` (sizes and rates bounded by ``limits``).

    Raises:
        ConfigError: the file is missing, unreadable, not TOML, or invalid; ``errors`` holds
            every problem, one line each (as :func:`validate_config` returns them).
    """
    config, problems = _check(path, limits)
    if config is None:
        name = Path(os.fspath(path)).name or os.fspath(path)
        lines = tuple(_format(p, name) for p in problems)
        more = f" (and {_plural(len(lines) - 1, 'more problem')})" if len(lines) > 1 else ""
        raise ConfigError(f"invalid config {os.fspath(path)}: {lines[0]}{more}", lines)
    return config


def _check_for_cli(path: str) -> tuple[Config | None, list[str]]:
    """For ``orchestra validate``: the config, or lines prefixed ``FILE: `` (``FILE:LINE: ``
    for problems with the file itself, so editors can jump to them)."""
    config, problems = _check(path)
    lines = []
    for p in problems:
        if p.path:
            lines.append(f"{path}: {p.path}: {p.message}")
        else:
            lines.append(f"{path}{'' if p.line is None else f':{p.line}'}: {p.message}")
    return config, lines

