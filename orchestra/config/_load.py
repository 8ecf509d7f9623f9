"""The whole file: reading it (size, encoding, TOML, nesting), running every table's checks,
and the entry points :func:`load_config` / :func:`validate_config`."""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ._base import DEFAULT_LIMITS, _MISSING, ConfigLimits, _one_line, _plural, _Problem
from .batching import BatchChecks, BatchConfig
from .bindings import BindChecks
from .cameras import CameraChecks, CameraConfig
from .cluster import ClusterChecks, ClusterConfig
from .devices import DeviceChecks, DeviceConfig
from .effects import EffectChecks
from .options import OptionChecks
from .policies import PolicyChecks, PolicyConfig, SignalConfig
from .post import PostChecks
from .programs import ProgramChecks, ProgramConfig
from .run import RunChecks, RunConfig
from .sinks import SinkChecks
from .sources import SourceChecks
from .video import VideoChecks


@dataclass(frozen=True)
class Config:
    """A whole config file (see :mod:`orchestra.config` for the schema)."""

    path: Path
    programs: tuple[ProgramConfig, ...]
    devices: tuple[DeviceConfig, ...]
    cameras: tuple[CameraConfig, ...]
    policies: tuple[PolicyConfig, ...]
    signals: tuple[SignalConfig, ...]
    run: RunConfig
    warnings: tuple[str, ...] = ()  # "path: message" lines: valid, but probably not meant
    batches: tuple[BatchConfig, ...] = ()  # [[batch]]: cameras whose frames share executes
    cluster: ClusterConfig | None = None  # [cluster]: run the cameras across a Ray cluster

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


_TOP_KEYS = ("program", "device", "camera", "policy", "signal", "run", "batch", "cluster")


class _Checker(ProgramChecks, DeviceChecks, SourceChecks, VideoChecks, BindChecks, OptionChecks, PostChecks,
               SinkChecks, CameraChecks, PolicyChecks, RunChecks, EffectChecks, BatchChecks, ClusterChecks):
    """Every table's checks, composed; :meth:`run` checks the whole document in order."""

    def run(self) -> None:
        doc = self.doc
        self.known(doc, "", _TOP_KEYS)
        self.check_programs(doc.get("program", _MISSING))
        self.check_devices(doc.get("device", {}))
        self.scan_batch_members(doc.get("batch", []))
        self.check_cameras(doc.get("camera", _MISSING))
        self.check_links()
        self.check_batches(doc.get("batch", []))
        self.check_policies(doc.get("policy", []))
        self.check_signals(doc.get("signal", []))
        self.check_run(doc.get("run", {}))
        self.check_cluster(doc.get("cluster"))
        self.check_cluster_cameras()
        self.warn_no_ops()  # warnings, once everything is known


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
        batches=tuple(checker.batches),
        cluster=checker.cluster_config,
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

