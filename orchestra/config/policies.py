"""``[[policy]]`` and ``[[signal]]``: policies and signal sources, their parameters checked
by building them (``load_policy`` / ``load_source`` construct the object and start nothing)."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import OrchestraError
from ._base import _BAD, Checker, _freeze, _hint, _join, _names, _thaw

_POLICY_KEYS = ("use", "priority", "params", "node")
_SIGNAL_KEYS = ("use", "params", "node")


@dataclass(frozen=True)
class PolicyConfig:
    """A policy: ``use`` (a registered name or ``module:attr``) and its parameters
    (``priority`` included when the file gives one). ``node``: with ``[cluster]``, the node
    it runs on only (the one whose cameras have that ``node``); None: on every node."""

    use: str
    params: Mapping[str, Any] = field(default_factory=dict)
    node: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", _freeze(self.params))

    def build(self) -> Any:
        """The policy object (``orchestra.policies.load_policy(use, **params)``)."""
        from orchestra.policies import load_policy

        return load_policy(self.use, **_thaw(self.params))


@dataclass(frozen=True)
class SignalConfig:
    """A signal source: ``use`` and its parameters. ``node``: with ``[cluster]``, the node it
    runs on only (it drives that node's policies); None: on every node."""

    use: str
    params: Mapping[str, Any] = field(default_factory=dict)
    node: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", _freeze(self.params))

    def build(self) -> Any:
        """The source object (``orchestra.policies.load_source(use, **params)``)."""
        from orchestra.policies import load_source

        return load_source(self.use, **_thaw(self.params))


class PolicyChecks(Checker):
    """Checks ``[[policy]]`` and ``[[signal]]`` (needs OptionChecks); fills ``policies`` and
    ``signals``. Every problem with an entry's parameters is reported at once: parameters it
    doesn't take, bad option tables, and every value its constructor rejects (see
    :meth:`build`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.policies: list[PolicyConfig] = []
        self.signals: list[SignalConfig] = []
        self.policy_paths: list[str] = []  # "policy[i]" of each entry of policies (for node checks)
        self.signal_paths: list[str] = []
        # (path, use, params as given, the object built) of every valid entry: what the
        # no-op warnings (effects.py) look at
        self.built_policies: list[tuple[str, str, dict[str, Any], Any]] = []
        self.built_sources: list[tuple[str, str, dict[str, Any], Any]] = []

    def check_policies(self, value: Any) -> None:
        from ..policies import get_policy, load_policy, policy_names

        for path, t in self.entries(value, "policy"):
            self.known(t, path, _POLICY_KEYS)
            use = self.get(t, "use", path, "string")
            priority = self.get(t, "priority", path, "int", None)
            node = self.check_node(path, t)
            params = self.table(t.get("params", {}), _join(path, "params"))
            if use is _BAD or params is None or node is _BAD:
                continue
            params = dict(params)
            ok = priority is not _BAD
            if priority is not None and priority is not _BAD:
                if "priority" in params:
                    self.err(_join(path, "priority"), "also given in params: give it once")
                    ok = False  # the parameters are still checked (with the params' priority)
                else:
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
            skip = set(self.params_fit(path, f"policy {use!r}", factory, params)) if factory is not None else set()
            for key, v in params.items():
                if key.endswith("_options") and isinstance(v, dict) and key not in skip:
                    if not self.check_options_table(_join(_join(path, "params"), key), v, None)[1]:
                        skip.add(key)
            obj = self.build(path, "policy", use, params, load_policy, factory, skip)
            if obj is not _BAD and ok and not skip:
                self.policies.append(PolicyConfig(use, params, node))
                self.policy_paths.append(path)
                self.built_policies.append((path, use, params, obj))

    def check_signals(self, value: Any) -> None:
        from ..policies import get_source, load_source, source_names

        for path, t in self.entries(value, "signal"):
            self.known(t, path, _SIGNAL_KEYS)
            use = self.get(t, "use", path, "string")
            node = self.check_node(path, t)
            params = self.table(t.get("params", {}), _join(path, "params"))
            if use is _BAD or params is None or node is _BAD:
                continue
            factory = None
            skip: set[str] = set()
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
                skip = set(self.params_fit(path, f"signal source {use!r}", factory, params))
            obj = self.build(path, "signal source", use, params, load_source, factory, skip)
            if obj is not _BAD and not skip:
                self.signals.append(SignalConfig(use, params, node))
                self.signal_paths.append(path)
                self.built_sources.append((path, use, dict(params), obj))

    def params_fit(self, path: str, label: str, factory: Any, params: Mapping[str, Any]) -> list[str]:
        """Reports every parameter ``factory`` doesn't take (the registry reports only the
        first) and returns their names."""
        try:
            sig = inspect.signature(factory)
        except (TypeError, ValueError):
            return []
        ps = sig.parameters.values()
        if any(p.kind is p.VAR_KEYWORD for p in ps):
            return []
        accepted = [p.name for p in ps if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        unknown = [k for k in params if k not in accepted]
        for k in unknown:
            self.err(_join(_join(path, "params"), k),
                     f"{label} has no parameter {k!r} (parameters: {_names(accepted)}){_hint(k, accepted)}")
        return unknown

    _PARAM = re.compile(r"(?:parameters?|needs parameter) '([^']+)'")
    # stand-ins for a required parameter whose value was rejected (or is missing), so that
    # the constructor goes on to check the others; one of them fits most parameters
    _STAND_INS: tuple[Any, ...] = (1, 0.5, "x", [1, 2], {}, True)

    def build(self, path: str, kind: str, use: str, params: dict[str, Any], loader: Callable[..., Any],
              factory: Any = None, skip: set[str] | frozenset[str] = frozenset()) -> Any:
        """Builds the entry (``loader(use, **params)``) and returns the object, or _BAD after
        reporting why not.

        A constructor stops at the first value it rejects; to report them all at once, each
        rejected parameter is reported, then left out (it has a default) or replaced by a
        stand-in value (required), and the entry built again. ``skip``: parameters already
        reported (left out from the start). A rejection that mentions a parameter left out
        or replaced may be caused by that: it is not reported, and checking stops there."""
        pp = _join(path, "params")
        left = {k: v for k, v in params.items() if k not in skip}
        altered = set(skip)
        stand_ins: dict[str, Iterator[Any]] = {}
        required = _required(factory)
        for _ in range((len(params) + 2) * (len(self._STAND_INS) + 1)):
            try:
                obj = loader(use, **left)
            except OrchestraError as exc:
                from ..errors import InvalidArgumentError

                msg = exc.message
                named = self._named(msg, params)
                if named is not None and named in stand_ins:  # that stand-in didn't fit: the next one
                    nxt = next(stand_ins[named], _BAD)
                    if nxt is _BAD:
                        return _BAD
                    left[named] = nxt
                    continue
                if _mentions(msg, altered):
                    return _BAD
                if not isinstance(exc, InvalidArgumentError):
                    self.err(_join(path, "use"), msg)
                    return _BAD
                needs = "needs parameter" in msg
                self.err(_join(pp, named) if named in params and not needs else pp, msg)
                if named is None:
                    return _BAD
                if needs:
                    stand_ins[named] = iter(self._STAND_INS)
                    left[named] = next(stand_ins[named])
                    altered.add(named)
                    continue
                # the rejected parameter, and any other it is compared with ('high' must be >= 'low')
                about = [named, *(k for k in left if k != named and _mentions(msg, {k}))]
                if named not in left:
                    return _BAD
                for k in about:
                    if required is not None and k in required:
                        stand_ins[k] = iter(self._STAND_INS)
                        left[k] = next(stand_ins[k])
                    else:
                        del left[k]
                    altered.add(k)
                continue
            except (Exception, SystemExit, KeyboardInterrupt) as exc:  # noqa: BLE001 - user code behind module:attr: never a traceback, never an exit
                if not altered:  # else it may be our leaving a parameter out: reported when the others are fixed
                    self.err(_join(path, "use"), f"{kind} {use!r} failed: {type(exc).__name__}: {exc}")
                return _BAD
            return _BAD if altered else obj
        return _BAD

    def _named(self, msg: str, params: Mapping[str, Any]) -> str | None:
        """The parameter a rejection is about: named as ``parameter 'x'``, or else the one
        parameter it mentions as a word (``ScriptedSource timeline step 0: ...``)."""
        m = self._PARAM.search(msg)
        if m:
            return m.group(1)
        words = [k for k in params if re.search(rf"\b{re.escape(k)}\b", msg)]
        return words[0] if len(words) == 1 else None


_LISTED = re.compile(r"\((?:parameters|integer options|options): [^)]*\)")


def _mentions(msg: str, names: set[str] | frozenset[str]) -> bool:
    """Whether ``msg`` speaks of one of ``names`` (not counting a list of every parameter)."""
    text = _LISTED.sub("", msg)
    return any(re.search(rf"\b{re.escape(k)}\b", text) for k in names)


def _required(factory: Any) -> set[str] | None:
    """The parameters ``factory`` can't do without (None: unknown)."""
    if factory is None:
        return None
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return None
    return {n for n, p in sig.parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty}
