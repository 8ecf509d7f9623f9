"""Registries of policies and signal sources, and loading them by name or ``module:attr``.

Policies are registered by name, explicitly with :func:`register_policy` or through the
entry-point group ``orchestra.policies`` (each entry point names a factory: a Policy class,
or any callable returning a Policy), discovered once, on first lookup. An entry point is
imported only when its name is looked up, so a broken plugin breaks only its own name.
Signal sources have the same kind of registry (:func:`register_source`, group
``orchestra.signal_sources``). The built-ins are registered at import.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from orchestra.errors import ConfigError, InvalidArgumentError, NotFoundError, OrchestraError

from ._builtin import BatteryPolicy, CoreAvailabilityPolicy, LatencyTargetPolicy, MemoryPressurePolicy, ThermalPolicy
from ._protocol import Policy, SignalSource
from ._signals import BatterySource, CpuSource, PressureSource, ScriptedSource, ThermalSource

__all__ = [
    "get_policy",
    "get_source",
    "load_policy",
    "load_source",
    "policy_names",
    "register_policy",
    "register_source",
    "source_names",
]

POLICY_ENTRY_POINT_GROUP = "orchestra.policies"
SOURCE_ENTRY_POINT_GROUP = "orchestra.signal_sources"

Factory = Callable[..., Any]


class _Registry:
    """name -> factory, filled by ``register`` and (lazily loaded) entry points."""

    def __init__(self, kind: str, group: str) -> None:
        self.kind = kind  # "policy" / "signal source"
        self.group = group
        self._factories: dict[str, Factory] = {}
        self._entry_points: dict[str, EntryPoint] = {}
        self._discovered = False

    def register(self, name: str, factory: Factory) -> None:
        if not isinstance(name, str) or not name or ":" in name:
            raise InvalidArgumentError(f"{self.kind} name must be a non-empty string without ':', got {name!r}")
        if not callable(factory):
            raise InvalidArgumentError(f"{self.kind} {name!r}: the factory must be callable, got {factory!r}")
        if name in self._factories:
            raise InvalidArgumentError(f"{self.kind} {name!r} is already registered ({self._factories[name]!r})")
        self._factories[name] = factory

    def _discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True
        for ep in entry_points(group=self.group):
            if ep.name not in self._factories:
                self._entry_points.setdefault(ep.name, ep)

    def names(self) -> tuple[str, ...]:
        self._discover()
        return tuple(sorted(set(self._factories) | set(self._entry_points)))

    def get(self, name: str) -> Factory:
        self._discover()
        factory = self._factories.get(name)
        if factory is not None:
            return factory
        ep = self._entry_points.get(name)
        if ep is None:
            have = ", ".join(self.names()) or "none"
            raise NotFoundError(
                f"{self.kind} {name!r} is not registered (registered: {have}; or give 'module:attr')"
            )
        try:
            factory = ep.load()
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            raise NotFoundError(
                f"{self.kind} {name!r}: entry point in group {self.group!r} ({ep.value}) failed to load: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if not callable(factory):
            raise ConfigError(
                f"{self.kind} {name!r}: entry point in group {self.group!r} ({ep.value}) is {factory!r}, not a factory"
            )
        self._factories.setdefault(name, factory)
        del self._entry_points[name]
        return self._factories[name]

    def resolve(self, spec: str) -> tuple[Factory | Any, str, bool]:
        """(the factory, or the object ``module:attr`` names; a label for messages; whether
        it was registered: code declared it a factory, so any callable may be called)."""
        if not isinstance(spec, str) or not spec:
            raise InvalidArgumentError(f"{self.kind} spec must be a registered name or 'module:attr', got {spec!r}")
        self._discover()
        if spec in self._factories or spec in self._entry_points or ":" not in spec:
            return self.get(spec), f"{self.kind} {spec!r}", True
        return _import_attr(spec, self.kind), f"{self.kind} {spec!r}", False


def _import_attr(spec: str, kind: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise NotFoundError(f"{kind} {spec!r}: expected a registered name or 'module:attr'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise NotFoundError(f"{kind} {spec!r}: can't import module {module_name!r}: {exc}") from exc
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # user code: exiting at import is an error too
        raise ConfigError(f"{kind} {spec!r}: importing module {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise NotFoundError(f"{kind} {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    return obj


def _bad_params(label: str, factory: Factory, params: dict[str, Any]) -> str | None:
    """Why ``factory(**params)`` can't bind, naming the parameter; None when it can (or when
    the signature can't be read)."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return None
    try:
        sig.bind(**params)
    except TypeError:
        pass
    else:
        return None
    accepted = [
        n for n, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    unknown = [k for k in params if k not in accepted] if not takes_kwargs else []
    if unknown:
        return f"{label} has no parameter {unknown[0]!r} (parameters: {', '.join(accepted) or 'none'})"
    missing = [
        n
        for n, p in sig.parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty and n not in params
    ]
    if missing:
        return f"{label} needs parameter {missing[0]!r} (parameters: {', '.join(accepted) or 'none'})"
    positional = [n for n, p in sig.parameters.items() if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if positional:
        return f"{label} needs positional parameter {positional[0]!r}, which can't be given by name"
    return f"{label}: parameters {sorted(params)} don't fit {sig}"


def _build(label: str, target: Any, params: dict[str, Any], check: Callable[[Any], str | None], method: str,
           registered: bool) -> Any:
    """``target(**params)``, checked. A target named by ``module:attr`` (not ``registered``)
    is called only when it is a class implementing the protocol (``method`` callable on
    the class): a config file must not be able to call ``os:system``."""
    if not callable(target) or (not isinstance(target, type) and check(target) is None):
        # an already-built object named by module:attr
        problem = check(target)
        if problem is not None:
            raise ConfigError(f"{label} is {target!r}, which {problem}")
        if params:
            raise InvalidArgumentError(f"{label} is an object, not a factory: it takes no parameters (got {sorted(params)})")
        return target
    if isinstance(target, type) and not callable(getattr(target, method, None)):
        raise ConfigError(f"{label} is the class {target.__qualname__!r}, which {check(None)}")
    if not registered and not isinstance(target, type):
        kind = label.split(" '")[0]
        raise ConfigError(f"{label} is {target!r}, not a class: 'module:attr' must name a {kind} class (one with "
                          f"{method}()) or a built {kind} object; other callables are never called")
    why = _bad_params(label, target, params)
    if why is not None:
        raise InvalidArgumentError(why)
    try:
        obj = target(**params)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{label}: {exc.message}") from exc
    except OrchestraError:
        raise
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{label}: bad parameters {sorted(params)}: {type(exc).__name__}: {exc}") from exc
    problem = check(obj)
    if problem is not None:
        raise ConfigError(f"{label} made {obj!r}, which {problem}")
    return obj


def _policy_problem(obj: Any) -> str | None:
    if isinstance(obj, type) or not isinstance(obj, Policy):
        return "is not a Policy (needs name, priority, signals and propose(signals, instances))"
    if not isinstance(obj.name, str) or not obj.name:
        return f"is not a Policy: name must be a non-empty string, got {obj.name!r}"
    if isinstance(obj.priority, bool) or not isinstance(obj.priority, int):
        return f"is not a Policy: priority must be an int, got {obj.priority!r}"
    if isinstance(obj.signals, str) or not all(isinstance(s, str) for s in obj.signals):
        return f"is not a Policy: signals must be a tuple of signal names, got {obj.signals!r}"
    if not callable(obj.propose):
        return "is not a Policy: propose is not callable"
    return None


def _source_problem(obj: Any) -> str | None:
    if isinstance(obj, type) or not isinstance(obj, SignalSource):
        return "is not a SignalSource (needs name and read())"
    if not callable(obj.read):
        return "is not a SignalSource: read is not callable"
    return None


# Registries (DESIGN: the only module-level mutable state allowed).
_POLICIES = _Registry("policy", POLICY_ENTRY_POINT_GROUP)
_SOURCES = _Registry("signal source", SOURCE_ENTRY_POINT_GROUP)


def register_policy(name: str, factory: Factory) -> None:
    """Registers ``factory`` (a Policy class or a callable returning a Policy) as ``name``.

    Raises:
        InvalidArgumentError: the name is taken or not a string, or ``factory`` isn't callable.
    """
    _POLICIES.register(name, factory)


def get_policy(name: str) -> Factory:
    """The factory registered as ``name`` (entry points of group ``orchestra.policies``
    included).

    Raises:
        NotFoundError: no policy has that name (the message lists those that exist), or its
            entry point failed to load.
    """
    return _POLICIES.get(name)


def policy_names() -> tuple[str, ...]:
    """Names of every registered policy, sorted."""
    return _POLICIES.names()


def load_policy(spec: str, **params: Any) -> Policy:
    """Builds a policy from a registered name (``"battery"``) or ``"module:attr"``
    (``"myapp.policies:NightMode"``; ``attr`` may be dotted), calling its factory with
    ``params``. ``module:attr`` imports ``module`` (running its code) and must name a class
    with ``propose()`` (called with ``params``) or an already-built policy object (then no
    params); a function it names is never called (register it to use it as a factory).

    Raises:
        NotFoundError: the name isn't registered, the module can't be found, or has no such
            attribute.
        ConfigError: importing the module failed, or what it names or makes is not a Policy
            (a ``module:attr`` function: not a Policy class).
        InvalidArgumentError: ``params`` don't fit (the message names the policy and the
            parameter), or the policy rejected a value.
    """
    target, label, registered = _POLICIES.resolve(spec)
    return _build(label, target, params, _policy_problem, "propose", registered)


def register_source(name: str, factory: Factory) -> None:
    """Registers a signal source factory (a class or a callable returning a SignalSource)."""
    _SOURCES.register(name, factory)


def get_source(name: str) -> Factory:
    """The signal source factory registered as ``name``.

    Raises:
        NotFoundError: no source has that name (the message lists those that exist).
    """
    return _SOURCES.get(name)


def source_names() -> tuple[str, ...]:
    """Names of every registered signal source, sorted."""
    return _SOURCES.names()


def load_source(spec: str, **params: Any) -> SignalSource:
    """Builds a signal source from a registered name (``"battery"``, ``"cpu"``,
    ``"thermal"``, ``"pressure"``, ``"scripted"``) or ``"module:attr"``, with ``params``.

    Raises the same errors as :func:`load_policy`.
    """
    target, label, registered = _SOURCES.resolve(spec)
    return _build(label, target, params, _source_problem, "read", registered)


for _name, _factory in (
    ("battery", BatteryPolicy),
    ("core_availability", CoreAvailabilityPolicy),
    ("thermal", ThermalPolicy),
    ("memory_pressure", MemoryPressurePolicy),
    ("latency_target", LatencyTargetPolicy),
):
    register_policy(_name, _factory)

for _name, _factory in (
    ("battery", BatterySource),
    ("cpu", CpuSource),
    ("thermal", ThermalSource),
    ("pressure", PressureSource),
    ("scripted", ScriptedSource),
):
    register_source(_name, _factory)
del _name, _factory
