"""A camera's ``bind`` table: NPU cores (directly or through a device's camera links) and
CPUs; exclusivity, capacity and core memory across cameras."""

from __future__ import annotations

from typing import Any

from ._base import _BAD, NPU_BACKEND, Checker, _hint, _is_int, _join, _kind_of, _names, _plural, _show
from .devices import _Device
from .programs import _ProgramInfo


class BindChecks(Checker):
    """Checks a camera's ``bind`` (:meth:`check_bind`); tracks who holds which core/CPU."""

    devices: dict[str, _Device]  # DeviceChecks'

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.slots: dict[tuple[str, Any], list[str]] = {}  # slot -> cameras holding it
        self.core_load: dict[tuple[str, int], list[tuple[str, int]]] = {}  # core -> (camera, bytes)

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

