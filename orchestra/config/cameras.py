"""``[[camera]]``: one instance of the program's method and one pipeline each. The camera
table's own keys are checked here; its sub-tables by their modules (``sources``,
``bindings``, ``options``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._base import _BAD, _MISSING, NPU_BACKEND, Checker, _any_bad, _freeze, _hint, _join, _kind_of, _names, _show, _thaw
from .post import PostConfig
from .programs import _ProgramInfo
from .sinks import SinkConfig
from .sources import SourceConfig
from .video import PreConfig

DROP_POLICIES = ("drop_oldest", "drop_newest", "block")
_CAMERA_KEYS = ("name", "program", "source", "pre", "bind", "backend_options", "queue", "drop", "deadline_ms",
                "inflight", "placement", "post", "sink", "node")


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
    placement: str = "thread"  # "thread" or "process" (a config's "auto" is resolved at load)
    auto_placement: bool = False  # placement was chosen by "auto" (the default), not written
    pre: PreConfig | None = None
    add_batch: bool = False  # frames come without input 0's leading batch dimension of 1: add it
    post: PostConfig | None = None
    sink: SinkConfig | None = None
    node: str | None = None  # [cluster]: run on the node advertising the Ray resource "node.NAME"

    def __post_init__(self) -> None:
        object.__setattr__(self, "bind", _freeze(self.bind))
        object.__setattr__(self, "backend_options", _freeze(self.backend_options))

    def build_source(self) -> Any:
        """The camera's source object, named after the camera (with the camera's ``pre``)."""
        if self.pre is not None:
            return self.source.build(self.name, pre=self.pre.build())
        return self.source.build(self.name)

    def instance_spec(self) -> Any:
        """An :class:`~orchestra.orchestrator.InstanceSpec` (name, bind, backend_options)."""
        from orchestra.orchestrator import InstanceSpec

        return InstanceSpec(name=self.name, bind=_thaw(self.bind),
                            backend_options={b: dict(v) for b, v in self.backend_options.items()},
                            placement=self.placement)  # type: ignore[arg-type]


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _auto_placement(prog: Any, core: tuple[str, int] | None) -> str:
    """``placement = "auto"`` (the default): ``"process"`` (each camera's instance in its own
    worker process) when the program runs on the CPU and this machine gives orchestra more
    than one CPU — numpy-interpreted programs hold the GIL for much of an execute, so
    instances on threads of one process share about one core (measured: 2 threads ran
    MobileNetV3-small 1.14x as fast as one, 2 processes 1.88x); ``"thread"`` for a camera
    bound to an NPU core or a program delegating to npu_sim devices (simulated devices live
    in this process), on a single CPU, or when the program is unknown."""
    if prog is None or core is not None or "NpuSimBackend" in getattr(prog, "backends", ()):
        return "thread"
    return "process" if _usable_cpus() > 1 else "thread"


class CameraChecks(Checker):
    """Checks ``[[camera]]`` (needs ProgramChecks, DeviceChecks, SourceChecks, BindChecks and
    OptionChecks in the composed checker); fills ``cameras``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cameras: list[CameraConfig] = []
        self.camera_names: list[str] = []

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
        pre = self.check_pre(path, t, prog, source, name or "camera")
        add_batch = False
        if source is not _BAD and source.kind == "video" and pre is not _BAD:
            if pre is None:
                self.check_video_without_pre(path, prog, name or "camera")
            inp = prog.inputs[0] if prog is not None and prog.inputs and len(prog.inputs) == 1 else None
            add_batch = inp is not None and len(inp.sizes) == 4
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
        placement = self.choice(t, "placement", path, ("auto", "thread", "process"), "auto")
        post = self.check_post(path, t, prog)
        sink = self.check_sink(path, t, name)
        bind, core = self.check_bind(path, t, prog, name)
        node = self.check_node(path, t)  # type: ignore[attr-defined]  # ClusterChecks
        options = self.check_camera_options(path, t, prog, bind, core, name)
        auto = placement == "auto"
        if auto:
            placement = _auto_placement(prog, core)
        if placement == "process" and prog is not None and (core is not None or "NpuSimBackend" in prog.backends):
            where = f"npu_sim device {core[0]!r}" if core is not None else "npu_sim devices"
            self.err(_join(path, "placement"), f'"process" can\'t reach {where}: simulated devices live in the '
                                               f'orchestra process; use placement = "thread" for this camera')
            placement = _BAD
        if _any_bad(source, pre, queue, drop, deadline_ms, inflight, placement, bind, options, post, sink, node) or not ok \
                or prog is None:
            return
        self.cameras.append(CameraConfig(
            name=name, program=prog.name, source=source, bind=bind, backend_options=options, queue=queue, drop=drop,
            deadline_s=None if deadline_ms is None else deadline_ms / 1000.0, inflight=inflight, core=core,
            placement=placement, auto_placement=auto, pre=pre, add_batch=add_batch, post=post, sink=sink, node=node))

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
