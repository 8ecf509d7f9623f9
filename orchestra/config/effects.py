"""Warnings for settings that are valid but can never do anything (silent no-ops): a policy
no signal source feeds, a policy whose options target a backend no camera's method uses,
``thread_options`` for a backend no camera bound to that CPU device uses, a ``latency_target``
that can never act. They are warnings, not errors: ``Config.warnings``, printed by
``orchestra validate`` and at the start of ``orchestra run``.

They run after every table is checked, on what the checks built: the policy and signal
source objects (``PolicyChecks.built_policies`` / ``built_sources``), the cameras and their
programs' backends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import OrchestraError
from ._base import Checker, _is_int, _join, _names, _show
from .cameras import CameraConfig
from .devices import DeviceConfig
from .programs import _ProgramInfo
from .run import RunConfig

# signals each built-in source class provides: exact names, and name prefixes
_CPU_SIGNALS = ("cpu.online", "cpu.affinity", "cpu.quota", "cpu.available")
_PRESSURE_SIGNALS = ("memory.psi_some_avg10", "memory.psi_full_avg10", "cpu.psi_some_avg10", "memory.available_bytes")


def _builtin_feeds() -> dict[type, tuple[tuple[str, ...], tuple[str, ...]]]:
    from ..policies import BatterySource, CpuSource, PressureSource, ThermalSource

    return {BatterySource: ((), ("battery.",)), CpuSource: (_CPU_SIGNALS, ()),
            ThermalSource: ((), ("thermal.",)), PressureSource: (_PRESSURE_SIGNALS, ())}


def _fed(signal: str, exact: Sequence[str] | set[str], prefixes: Sequence[str]) -> bool:
    return signal in exact or any(signal.startswith(p) for p in prefixes)


class EffectChecks(Checker):
    """:meth:`warn_no_ops`: needs ProgramChecks, DeviceChecks, CameraChecks, PolicyChecks and
    RunChecks in the composed checker."""

    cameras: list[CameraConfig]
    programs: dict[str, _ProgramInfo]
    device_configs: list[DeviceConfig]
    built_policies: list[tuple[str, str, dict[str, Any], Any]]
    built_sources: list[tuple[str, str, dict[str, Any], Any]]
    run_config: RunConfig

    def warn_no_ops(self) -> None:
        if self.problems or not self.cameras:
            return  # warnings are shown only for a valid file
        used: set[str] = set()
        for cam in self.cameras:
            used.update(self.programs[cam.program].backends)
        self.warn_thread_options()
        try:
            fed = self.signals_fed()
        except Exception:  # noqa: BLE001 - a module:attr source's attributes: no warning rather than a failure
            fed = None
        for path, use, params, obj in self.built_policies:
            try:
                self.warn_unfed(path, use, obj, fed)
                self.warn_backends(path, use, params, obj, used)
                self.warn_latency_target(path, use, params, obj, used)
            except Exception:  # noqa: BLE001 - a module:attr policy's attributes are its own code: best effort
                continue

    # -- signals ------------------------------------------------------------------------------
    def signals_fed(self) -> tuple[set[str], list[str]] | None:
        """(signal names, name prefixes) the configured sources provide; None when a source
        can't tell (``module:attr`` or a plugin: it may provide anything)."""
        feeds = _builtin_feeds()
        exact: set[str] = set()
        prefixes: list[str] = []
        from ..policies import ScriptedSource

        for _, _, _, obj in self.built_sources:
            if type(obj) is ScriptedSource:
                for _, values in obj.timeline:
                    exact.update(values)
            elif type(obj) in feeds:
                e, p = feeds[type(obj)]
                exact.update(e)
                prefixes.extend(p)
            else:
                return None
        return exact, prefixes

    def warn_unfed(self, path: str, use: str, obj: Any, fed: tuple[set[str], list[str]] | None) -> None:
        wants = getattr(obj, "signals", ())
        if fed is None or not isinstance(wants, (tuple, list)) or not wants:
            return
        exact, prefixes = fed
        if any(_fed(s, exact, prefixes) for s in wants):
            return
        sources = [u for _, u, _, _ in self.built_sources]
        have = f"sources: {_names(sources)}" if sources else "there are no [[signal]] sources"
        from ..policies import get_source, source_names

        feeds = _builtin_feeds()
        suggest = []
        for name in source_names():
            try:
                e, p = feeds.get(get_source(name), ((), ()))
            except OrchestraError:  # a broken plugin: no suggestion
                continue
            if any(_fed(s, e, p) for s in wants):
                suggest.append(name)
        add = f'; add a [[signal]] with use = "{suggest[0]}"' if suggest else ""
        self.warnings.append(f"{path}: policy {use!r} reads {', '.join(wants)}, which no signal source provides "
                             f"({have}): it never acts{add}")

    # -- backends -----------------------------------------------------------------------------
    def warn_backends(self, path: str, use: str, params: Mapping[str, Any], obj: Any, used: set[str]) -> None:
        """Options for backends no camera's method delegates to; an option the backend
        doesn't have."""
        pp = _join(path, "params")
        targets: dict[tuple[str, str], list[str]] = {}  # (where, backend) -> defaults it comes from
        backend = getattr(obj, "backend", None)
        if isinstance(backend, str):
            targets.setdefault((_join(pp, "backend") if "backend" in params else path, backend), []).append(
                "" if "backend" in params else "backend")
        try:
            attrs = dict(vars(obj))
        except TypeError:
            attrs = {}
        for attr, value in attrs.items():
            if attr.endswith("_options") and not attr.startswith("_") and isinstance(value, Mapping):
                for b in value:
                    if isinstance(b, str):
                        where = _join(_join(pp, attr), b) if attr in params else path
                        targets.setdefault((where, b), []).append("" if attr in params else attr)
        if not targets:
            return
        never = all(b not in used for _, b in targets)
        delegate = f"the cameras' methods delegate to: {_names(sorted(used)) if used else 'no backend'}"
        for (where, b), defaults in targets.items():
            if b in used:
                continue
            dflt = [d for d in defaults if d]
            how = f" (its default {', '.join(dflt)})" if dflt else ""
            tail = "it never acts" if never else "those options never apply"
            self.warnings.append(f"{where}: policy {use!r} sets options of backend {b!r}{how}, which no camera's "
                                 f"method delegates to ({delegate}): {tail}")
        option = getattr(obj, "option", None)
        if isinstance(backend, str) and backend in used and isinstance(option, str):
            specs = self.option_specs(backend)
            if specs is not None and option not in specs:
                where = _join(pp, "option") if "option" in params else path
                self.warnings.append(f"{where}: policy {use!r} sets option {option!r} of backend {backend!r}, which "
                                     f"has no such option (options: {_names(list(specs))}): it never acts")

    # -- latency_target -------------------------------------------------------------------------
    def warn_latency_target(self, path: str, use: str, params: Mapping[str, Any], obj: Any, used: set[str]) -> None:
        from ..policies import LatencyTargetPolicy

        if not isinstance(obj, LatencyTargetPolicy):
            return
        lp = _join(_join(path, "params"), "ladder")
        ladder = list(obj.ladder)
        specs = self.option_specs(obj.backend) if obj.backend in used else None
        spec = specs.get(obj.option) if specs else None
        if spec is not None:
            bad = [v for v in ladder if not _fits(v, spec)]
            want = (f"one of {', '.join(map(repr, spec.choices))}" if spec.choices is not None
                    else f"{'an' if spec.type.__name__[0] in 'aeiou' else 'a'} {spec.type.__name__}")
            if len(bad) == len(ladder):
                self.warnings.append(f"{lp}: policy {use!r}: no value of its ladder is a valid {obj.backend} "
                                     f"{obj.option} (must be {want}): it never acts")
            elif bad:
                self.warnings.append(f"{lp}: policy {use!r}: {_show(bad)} are not valid {obj.backend} {obj.option} "
                                     f"values (must be {want}): those rungs never apply")
        if len(ladder) == 1 and not (spec is not None and not _fits(ladder[0], spec)):
            self.warnings.append(f"{lp}: policy {use!r} has a one-value ladder: it only ever sets {obj.option} = "
                                 f"{_show(ladder[0])} and never steps")
        run = self.run_config
        if run.duration_s is not None and run.duration_s <= run.engine_period_s:
            self.warnings.append(f"{path}: policy {use!r} reads no signals, so only the policy engine's periodic run "
                                 f"(run.engine_period_s = {run.engine_period_s:g} s) acts on latency, and "
                                 f"run.duration_s = {run.duration_s:g} s ends the run first (unless --duration says otherwise): "
                                 f"it never acts")

    # -- [device.*] thread_options ----------------------------------------------------------------
    def warn_thread_options(self) -> None:
        for dev in self.device_configs:
            options = dev.params.get("thread_options") if dev.kind == "cpu" else None
            if not options:
                continue  # not given: the default (NumpyCpuBackend's num_threads) is not the user's doing
            tp = _join(_join("device", dev.name), "thread_options")
            bound = [c for c in self.cameras if "cpu" in c.bind]
            if not bound:
                self.warnings.append(f"{tp}: no camera binds to device {dev.name} (bind = {{ cpu = N }}): "
                                     f"thread_options never applies")
                continue
            backends: set[str] = set()
            for cam in bound:
                backends.update(self.programs[cam.program].backends)
            for b in options:
                if b not in backends:
                    self.warnings.append(
                        f"{_join(tp, b)}: no camera bound to device {dev.name} runs a method that delegates to "
                        f"backend {b!r} (they delegate to: {_names(sorted(backends)) if backends else 'no backend'}): "
                        f"this entry never sets anything")


def _fits(value: Any, spec: Any) -> bool:
    """Whether ``value`` is a valid value of the option ``spec`` (as the config checks them)."""
    typ = spec.type
    ok = isinstance(value, typ) and not (typ is int and isinstance(value, bool)) or (typ is float and _is_int(value))
    return ok and (spec.choices is None or value in spec.choices)
