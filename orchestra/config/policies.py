"""``[[policy]]`` and ``[[signal]]``: policies and signal sources, their parameters checked
by building them (``load_policy`` / ``load_source`` construct the object and start nothing)."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import OrchestraError
from ._base import _BAD, Checker, _freeze, _hint, _join, _names, _thaw

_POLICY_KEYS = ("use", "priority", "params")
_SIGNAL_KEYS = ("use", "params")


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



class PolicyChecks(Checker):
    """Checks ``[[policy]]`` and ``[[signal]]`` (needs OptionChecks); fills ``policies`` and
    ``signals``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.policies: list[PolicyConfig] = []
        self.signals: list[SignalConfig] = []

    def check_policies(self, value: Any) -> None:
        from ..policies import get_policy, load_policy, policy_names

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
        from ..policies import get_source, load_source, source_names

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
            from ..errors import InvalidArgumentError

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
