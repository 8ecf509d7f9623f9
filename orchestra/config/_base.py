"""The one helper every table's checks share: recording problems (one line each, path
first), reading typed values out of tables, and showing values and paths as TOML writes them.

Each table's checks are a mixin of :class:`Checker` (``programs.ProgramChecks``,
``cameras.CameraChecks``, ...); ``_load._Checker`` composes them. A check never raises for
anything in the file: it calls :meth:`Checker.err` and returns ``_BAD``.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..errors import OrchestraError

NPU_BACKEND = "NpuSimBackend"


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



@dataclass
class _Problem:
    path: str  # "" for the file itself
    message: str
    line: int | None = None


# ---------------------------------------------------------------------------------------
# The shared checker


class Checker:
    """What every table's checks share: the document, the config's folder, the limits, the
    problems and warnings found so far, and the registries (looked up once).

    Table mixins subclass it, declare their own state in ``__init__`` (calling
    ``super().__init__(*args, **kwargs)`` first) and add ``check_<table>`` methods."""

    def __init__(self, doc: dict[str, Any], base: Path, limits: ConfigLimits = DEFAULT_LIMITS) -> None:
        self.doc = doc
        self.base = base
        self.limits = limits
        self.problems: list[_Problem] = []
        self.warnings: list[str] = []
        self._option_specs: dict[str, Any] = {}
        self._backends: tuple[str, ...] | None = None

    # -- recording ----------------------------------------------------------------------
    def err(self, path: str, message: str) -> None:
        """Records a problem: ``path`` is where in the file (``camera[0].bind``; "" for the file
        itself), ``message`` one line (newlines are folded)."""
        self.problems.append(_Problem(path, _one_line(message)))

    def table(self, value: Any, path: str) -> dict[str, Any] | None:
        """``value`` if it is a table, else None after recording "must be a table"."""
        if isinstance(value, dict):
            return value
        self.err(path, f"must be a table, got {_kind_of(value)}")
        return None

    def known(self, table: Mapping[str, Any], path: str, known: Sequence[str]) -> None:
        """Records every key of ``table`` not in ``known`` (naming the known ones)."""
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
        """``table[key]``, one of the strings ``choices``; ``default`` when absent (as :meth:`get`)."""
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

    def entries(self, value: Any, key: str) -> list[tuple[str, dict[str, Any]]]:
        """The tables of an array of tables (``[[key]]``), each with its path ``key[i]``."""
        if not isinstance(value, list):
            self.err(key, f"must be an array of tables ([[{key}]]), got {_kind_of(value)}")
            return []
        out = []
        for i, raw in enumerate(value):
            t = self.table(raw, f"{key}[{i}]")
            if t is not None:
                out.append((f"{key}[{i}]", t))
        return out

    # -- registries (looked up once) -------------------------------------------------------
    def backend_names(self) -> tuple[str, ...]:
        if self._backends is None:
            from ..runtime import registered_backends

            try:
                self._backends = registered_backends()
            except OrchestraError as exc:  # a broken backend plugin
                self.err("", f"can't list the registered backends: {exc.message}")
                self._backends = ()
        return self._backends

    def option_specs(self, backend: str) -> dict[str, Any] | None:
        if backend not in self._option_specs:
            from ..runtime import get_backend_class

            try:
                specs = {s.name: s for s in get_backend_class(backend).option_specs}
            except OrchestraError:
                specs = None
            self._option_specs[backend] = specs
        return self._option_specs[backend]
