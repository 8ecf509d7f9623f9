"""Resources instances bind to: devices and their units, allocated exclusively or shared.

A :class:`Resource` names the units it exposes (``"npu0.core"``, ``"camera"``, ``"cpu"``),
resolves a binding value to the *slots* it occupies (``("npu0.core", 2)``, ``("cpu", 0)``),
and turns a binding into init-time backend options and worker CPU placement. The
:class:`ResourcePool` keeps who holds which slot; a slot holds one instance (exclusive) or up
to ``capacity`` instances (shared). Everything here runs on the event loop's thread.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..errors import Error
from ..runtime import get_backend_class
from ._errors import ResourceError

if TYPE_CHECKING:  # pragma: no cover
    from ..backends.npu_sim import NpuDevice

__all__ = ["CpuResource", "NpuSimResource", "Reservation", "Resource", "ResourcePool"]

Slot = tuple[str, Hashable]


@dataclass(frozen=True, slots=True)
class Claim:
    """What one binding entry resolves to: the slots it occupies and its canonical form."""

    slots: tuple[Slot, ...]
    bind: Mapping[str, Any]  # unit -> canonical value (e.g. camera 'front' adds 'npu0.core': 0)


class Resource(abc.ABC):
    """A device whose units instances bind to (subclass it for new kinds of hardware).

    Attributes:
        name: the device name (unique in a pool).
        exclusive: True: each slot is held by at most one instance; False: by up to
            ``capacity`` instances (None: any number).
    """

    name: str
    exclusive: bool = True
    capacity: int | None = None

    @property
    @abc.abstractmethod
    def units(self) -> tuple[str, ...]:
        """The unit names this resource answers for (``bind`` keys)."""

    @abc.abstractmethod
    def claim(self, unit: str, value: Any) -> Claim:
        """Resolves ``bind[unit] = value``. Raises ResourceError naming a bad value."""

    @abc.abstractmethod
    def candidates(self, unit: str, like: Any) -> Iterable[Any]:
        """Values of ``unit`` shaped like ``like``, in the order ``scale`` should try them."""

    def backend_options(self, bind: Mapping[str, Any], instance: str, backends: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Init-time backend options the binding implies (only for ``backends`` the method uses)."""
        return {}

    def cpus(self, bind: Mapping[str, Any]) -> tuple[int, ...] | None:
        """CPUs the instance's worker runs on, or None for anywhere."""
        return None

    def slot_capacity(self) -> int | None:
        return 1 if self.exclusive else self.capacity

    @property
    def slot_units(self) -> tuple[str, ...]:
        """The unit names of the slots this resource's claims occupy."""
        return self.units


class NpuSimResource(Resource):
    """The cores of an :class:`~orchestra.backends.npu_sim.NpuDevice` and its camera links.

    Units: ``"<device>.core"`` (0..cores-1), ``"<device>.camera"`` and ``"camera"`` (a link
    name, resolved to the core it is wired to). A binding becomes the init-only options
    ``{"NpuSimBackend": {"device": <device>, "core": <core>, "label": <instance>}}``.
    """

    backend_id = "NpuSimBackend"

    def __init__(self, device: NpuDevice, exclusive: bool = True, capacity: int | None = None) -> None:
        self.device = device
        self.name = device.name
        self.exclusive = exclusive
        self.capacity = capacity
        self._core = f"{device.name}.core"
        self._camera = f"{device.name}.camera"

    @property
    def units(self) -> tuple[str, ...]:
        return (self._core, self._camera, "camera")

    @property
    def slot_units(self) -> tuple[str, ...]:
        return (self._core,)

    def _core_slot(self, core: Any) -> Claim:
        n = self.device.cores
        if isinstance(core, bool) or not isinstance(core, int) or not 0 <= core < n:
            raise ResourceError(f"{self._core} {core!r} is out of range ({self.name} has cores 0..{n - 1})")
        return Claim(((self._core, core),), {self._core: core})

    def claim(self, unit: str, value: Any) -> Claim:
        if unit == self._core:
            return self._core_slot(value)
        links = self.device.links
        if not isinstance(value, str) or value not in links:
            raise ResourceError(f"{unit} {value!r} is not wired to {self.name} (links: "
                                f"{', '.join(f'{k} -> core {c}' for k, c in links.items()) or 'none'})")
        core = links[value]
        return Claim(((self._core, core),), {unit: value, self._core: core})

    def candidates(self, unit: str, like: Any) -> Iterable[Any]:
        if unit == self._core:
            return range(self.device.cores)
        return list(self.device.links)

    def backend_options(self, bind: Mapping[str, Any], instance: str, backends: Sequence[str]) -> dict[str, dict[str, Any]]:
        if self.backend_id not in backends:
            raise ResourceError(f"instance {instance!r} binds {self._core} but its method does not delegate to "
                                f"{self.backend_id} (it delegates to: {', '.join(backends) or 'no backend'})")
        return {self.backend_id: {"device": self.name, "core": bind[self._core], "label": instance}}


class CpuResource(Resource):
    """Host CPUs. Unit ``"cpu"``: a CPU index or a tuple of indices.

    The instance's worker thread is pinned to those CPUs (``os.sched_setaffinity`` on the
    worker thread, Linux); backends in ``thread_options`` that the method delegates to and
    that declare that option get it set to the number of CPUs (by default
    ``NumpyCpuBackend``'s ``num_threads``).
    """

    def __init__(self, cpus: Iterable[int] | None = None, exclusive: bool = True, capacity: int | None = None,
                 name: str = "cpu", thread_options: Mapping[str, str] | None = None) -> None:
        if cpus is None:
            cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
        self.cpu_ids = tuple(sorted(set(cpus)))
        if not self.cpu_ids or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in self.cpu_ids):
            raise ResourceError(f"CpuResource: cpus must be CPU indices >= 0, got {cpus!r}")
        self.name = name
        self.exclusive = exclusive
        self.capacity = capacity
        self.thread_options = dict({"NumpyCpuBackend": "num_threads"} if thread_options is None else thread_options)

    @property
    def units(self) -> tuple[str, ...]:
        return ("cpu",)

    def claim(self, unit: str, value: Any) -> Claim:
        one = isinstance(value, int) and not isinstance(value, bool)
        cpus = (value,) if one else tuple(value) if isinstance(value, (tuple, list)) else None
        if not cpus or len(set(cpus)) != len(cpus):
            raise ResourceError(f"cpu must be a CPU index or a tuple of distinct indices, got {value!r}")
        for c in cpus:
            if c not in self.cpu_ids:
                raise ResourceError(f"cpu {c!r} is out of range (cpus: {', '.join(map(str, self.cpu_ids))})")
        return Claim(tuple(("cpu", c) for c in cpus), {"cpu": value if one else tuple(cpus)})

    def candidates(self, unit: str, like: Any) -> Iterable[Any]:
        if isinstance(like, int) and not isinstance(like, bool):
            return list(self.cpu_ids)
        k = len(like)
        return [tuple(self.cpu_ids[i:i + k]) for i in range(0, len(self.cpu_ids) - k + 1, k)]

    def cpus(self, bind: Mapping[str, Any]) -> tuple[int, ...] | None:
        v = bind["cpu"]
        return (v,) if isinstance(v, int) else tuple(v)

    def backend_options(self, bind: Mapping[str, Any], instance: str, backends: Sequence[str]) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        n = len(self.cpus(bind) or ())
        for backend, option in self.thread_options.items():
            if backend in backends and any(s.name == option for s in get_backend_class(backend).option_specs):
                out[backend] = {option: n}
        return out


@dataclass(frozen=True, slots=True)
class Reservation:
    """The slots one instance holds and what its binding implies."""

    instance: str
    bind: Mapping[str, Any]  # canonical, e.g. {"camera": "front", "npu0.core": 0}
    slots: tuple[Slot, ...]
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    cpus: tuple[int, ...] | None = None


class ResourcePool:
    """Devices and their units; who holds which.

    ``ResourcePool([NpuSimResource(npu), CpuResource()])``. One pool belongs to one
    Orchestrator; it is used from the event loop's thread only.
    """

    def __init__(self, resources: Iterable[Resource] = ()) -> None:
        self._resources: list[Resource] = []
        self._units: dict[str, list[Resource]] = {}
        self._holders: dict[Slot, list[str]] = {}
        for r in resources:
            self.add(r)

    def add(self, resource: Resource) -> None:
        """Adds a device. Its name must be new."""
        if not isinstance(resource, Resource):
            raise ResourceError(f"ResourcePool takes Resource objects, got {resource!r}")
        if any(r.name == resource.name for r in self._resources):
            raise ResourceError(f"ResourcePool already has a resource named {resource.name!r}")
        self._resources.append(resource)
        for u in resource.units:
            self._units.setdefault(u, []).append(resource)

    @property
    def resources(self) -> tuple[Resource, ...]:
        return tuple(self._resources)

    @property
    def units(self) -> tuple[str, ...]:
        return tuple(self._units)

    def holders(self) -> Mapping[Slot, tuple[str, ...]]:
        """Every held slot and who holds it."""
        return MappingProxyType({s: tuple(h) for s, h in self._holders.items() if h})

    # -- resolving ------------------------------------------------------------------------
    def _resource_for(self, unit: str, value: Any) -> Resource:
        rs = self._units.get(unit)
        if not rs:
            raise ResourceError(f"unknown unit {unit!r} (units: {', '.join(self._units) or 'none; the pool is empty'})")
        if len(rs) > 1:  # a unit several devices answer for (e.g. 'camera'): the one that has the value
            errors = []
            for r in rs:
                try:
                    r.claim(unit, value)
                    return r
                except ResourceError as exc:
                    errors.append(exc.message)
            raise ResourceError(f"{unit} {value!r} is not available on any device ({'; '.join(errors)})")
        return rs[0]

    def resolve(self, instance: str, bind: Mapping[str, Any], backends: Sequence[str],
                ignore: str | None = None) -> Reservation:
        """What ``bind`` would hold, checked against the current holders (``ignore``: an
        instance whose holdings don't count, for moves). Holds nothing yet."""
        slots: list[Slot] = []
        canon: dict[str, Any] = {}
        by_resource: dict[int, tuple[Resource, dict[str, Any]]] = {}
        for unit, value in bind.items():
            r = self._resource_for(unit, value)
            c = r.claim(unit, value)
            for k, v in c.bind.items():
                if k in canon and canon[k] != v:
                    raise ResourceError(f"instance {instance!r}: {unit} {value!r} means {k} {v!r}, "
                                        f"but the binding also says {k} {canon[k]!r}")
                canon[k] = v
            slots += [s for s in c.slots if s not in slots]
            by_resource.setdefault(id(r), (r, {}))[1].update(c.bind)
        for s in slots:
            self._check_free(s, instance, ignore)
        options: dict[str, dict[str, Any]] = {}
        cpus: tuple[int, ...] | None = None
        for r, rb in by_resource.values():
            for backend, vals in r.backend_options(rb, instance, backends).items():
                if backend in options:
                    raise ResourceError(f"instance {instance!r}: two bound devices both set {backend} options "
                                        f"({', '.join(sorted(options[backend]))}); bind one of them")
                options[backend] = vals
            c = r.cpus(rb)
            if c is not None:
                cpus = tuple(sorted(set(cpus or ()) | set(c)))
        return Reservation(instance, MappingProxyType(canon), tuple(slots),
                           MappingProxyType({b: MappingProxyType(v) for b, v in options.items()}), cpus)

    def _capacity(self, slot: Slot) -> int | None:
        rs = self._units.get(slot[0]) or []
        return rs[0].slot_capacity() if rs else 1

    def _check_free(self, slot: Slot, instance: str, ignore: str | None) -> None:
        held = [h for h in self._holders.get(slot, ()) if h not in (instance, ignore)]
        cap = self._capacity(slot)
        if cap is not None and len(held) >= cap:
            who = f"instance {held[0]!r}" if len(held) == 1 else f"instances {', '.join(map(repr, held))}"
            extra = "" if cap == 1 else f" (capacity {cap})"
            raise ResourceError(f"{slot[0]} {slot[1]!r} is held by {who}{extra}; instance {instance!r} can't bind it",
                                Error.OutOfResources)

    # -- holding --------------------------------------------------------------------------
    def reserve(self, instance: str, bind: Mapping[str, Any], backends: Sequence[str]) -> Reservation:
        """Holds the slots ``bind`` needs for ``instance``.

        Raises:
            ResourceError: an unknown unit or value (naming the unit and what exists), or a
                slot already held (code OutOfResources, naming the holder).
        """
        r = self.resolve(instance, bind, backends)
        self.hold(r)
        return r

    def hold(self, r: Reservation) -> None:
        for s in r.slots:
            self._holders.setdefault(s, []).append(r.instance)

    def release(self, r: Reservation | None) -> None:
        """Gives the slots of ``r`` back (idempotent per reservation)."""
        if r is None:
            return
        for s in r.slots:
            hs = self._holders.get(s)
            if hs and r.instance in hs:
                hs.remove(r.instance)
                if not hs:
                    del self._holders[s]

    def auto_bind(self, instance: str, like: Mapping[str, Any], backends: Sequence[str]) -> Mapping[str, Any]:
        """A binding with the same units as ``like`` using free values (for ``scale``).

        Raises:
            ResourceError: code OutOfResources when some unit has no free value (the
                message lists who holds what).
        """
        chosen: dict[str, Any] = {}
        taken: set[Slot] = set()
        cameras = any(u == "camera" or u.endswith(".camera") for u in like)
        for unit, value in like.items():
            if cameras and unit.endswith(".core"):
                continue  # the camera picks the core
            r = self._resource_for(unit, value)
            for cand in r.candidates(unit, value):
                try:
                    c = r.claim(unit, cand)
                    if taken & set(c.slots):
                        continue
                    for s in c.slots:
                        self._check_free(s, instance, None)
                except ResourceError:
                    continue
                chosen[unit] = cand
                taken |= set(c.slots)
                break
            else:
                held = [f"{s[0]} {s[1]!r} by {', '.join(map(repr, h))}" for s, h in self.holders().items()
                        if s[0] in r.slot_units]
                raise ResourceError(f"no free {unit} for instance {instance!r} (held: {'; '.join(held) or 'none'})",
                                    Error.OutOfResources)
        return MappingProxyType(chosen)
