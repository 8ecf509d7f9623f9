"""``orchestra run``'s terminal output: a live ANSI dashboard (stdout is a terminal), a
compact status line (it is not), and a buffer that keeps log lines off the dashboard.

No dependency: the dashboard redraws its block of lines in place with ANSI cursor control
(cursor up, clear line, clear below), each line cut to the terminal's width so nothing wraps
and the block keeps its height. Everything here is plain data in, text out; ``_run`` gathers
the data on the event loop.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

__all__ = ["CameraRow", "Dashboard", "Decision", "LogBuffer", "Screen", "StatusLine", "camera_table",
           "decision_table", "fmt_drops", "fmt_ms", "fmt_options", "fmt_unit", "fmt_value", "printable"]

_CSI = "\x1b["
HIDE_CURSOR = _CSI + "?25l"
SHOW_CURSOR = _CSI + "?25h"
CLEAR_EOL = _CSI + "K"
CLEAR_BELOW = _CSI + "J"
BOLD = _CSI + "1m"
DIM = _CSI + "2m"
RESET = _CSI + "0m"


# ---------------------------------------------------------------------------------------
# Data


@dataclass(frozen=True, slots=True)
class CameraRow:
    """One camera, now."""

    name: str
    state: str
    drop: str
    input_fps: float
    output_fps: float
    p50: float  # seconds
    p95: float
    p99: float
    produced: int
    processed: int
    failed: int
    dropped: Mapping[str, int]
    queue_depth: int
    queue_capacity: int
    unit: str
    options: str
    instance_state: str = ""


@dataclass(frozen=True, slots=True)
class Decision:
    """One policy decision (an option value changed, or an action applied)."""

    t: float  # seconds since the run started
    wall: float  # time.time()
    instance: str
    what: str  # "NpuSimBackend.power_mode" or an action ("pause", "move", ...)
    value: Any
    previous: Any
    policy: str | None
    reason: str
    source: str = "policy"  # or "spec" / "binding" / "default": back to the baseline

    def cells(self) -> list[str]:
        """at, time, instance, option, change, by, reason."""
        wall = time.strftime("%H:%M:%S", time.localtime(self.wall)) + f".{int(self.wall * 1000) % 1000:03d}"
        change = f"{fmt_value(self.previous)} -> {fmt_value(self.value)}" if self.previous is not None else fmt_value(self.value)
        return [f"{self.t:+.2f}s", wall, printable(self.instance), self.what, change, self.policy or f"({self.source})",
                self.reason or "-"]


def decision_table(decisions: Sequence[Decision], indent: str = "  ") -> list[str]:
    """Decisions as an aligned table with a header (no lines when there are none)."""
    if not decisions:
        return []
    rows = [["at", "time", "instance", "option", "change", "by", "reason"]] + [d.cells() for d in decisions]
    return [indent + line for line in _table(rows, right={0})]


# ---------------------------------------------------------------------------------------
# Formatting helpers (shared with the summary)


def printable(text: str) -> str:
    """``text`` safe to put on a terminal line: control characters (NUL, newline, ESC of an
    ANSI sequence, ...) shown as Python escapes (``\\x1b``), everything else as is."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def fmt_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def fmt_drops(dropped: Mapping[str, int]) -> str:
    """``"0"`` or ``"evicted 3, deadline 1"`` (reasons with a count only)."""
    parts = [f"{k} {v}" for k, v in dropped.items() if v]
    return ", ".join(parts) if parts else "0"


def fmt_unit(bind: Mapping[str, Any] | None) -> str:
    """A binding for people: ``{"camera": "front", "npu0.core": 0}`` -> ``npu0.core 0``."""
    if not bind:
        return "unbound"
    parts = []
    for k, v in bind.items():
        if k == "camera" or k.endswith(".camera"):
            continue  # the core it resolves to is shown
        if isinstance(v, (tuple, list)):
            v = ",".join(str(x) for x in v)
        parts.append(f"{k} {v}")
    if not parts:
        parts = [f"{k} {v}" for k, v in bind.items()]
    return " ".join(parts)


def fmt_options(options: Iterable[tuple[str, str, Any]], *, qualify: bool = False) -> str:
    """``[(backend, option, value)]`` -> ``power_mode=low priority=1``."""
    return " ".join(f"{b + '.' if qualify else ''}{k}={fmt_value(v)}" for b, k, v in options)


def _cut(line: str, width: int) -> str:
    return line if len(line) <= width else line[: max(width - 1, 0)] + "~"


def _table(rows: Sequence[Sequence[str]], right: Iterable[int] = ()) -> list[str]:
    if not rows:
        return []
    right = set(right)
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return ["  ".join(c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(r)).rstrip()
            for r in rows]


def camera_table(rows: Sequence[CameraRow], *, total: bool = True) -> list[str]:
    head = ["camera", "state", "in fps", "out fps", "p50 ms", "p95 ms", "p99 ms", "queue", "drops", "failed",
            "unit", "options"]
    body = [head]
    for r in rows:
        state = r.state if not r.instance_state or r.instance_state in ("running",) else f"{r.state}/{r.instance_state}"
        body.append([printable(r.name), state, f"{r.input_fps:.1f}", f"{r.output_fps:.1f}", fmt_ms(r.p50), fmt_ms(r.p95),
                     fmt_ms(r.p99), f"{r.queue_depth}/{r.queue_capacity}", fmt_drops(r.dropped), str(r.failed),
                     r.unit, r.options])
    if total and len(rows) > 1:
        dropped: dict[str, int] = collections.Counter()
        for r in rows:
            dropped.update(r.dropped)
        body.append(["total", "", f"{sum(r.input_fps for r in rows):.1f}", f"{sum(r.output_fps for r in rows):.1f}",
                     "", "", "", str(sum(r.queue_depth for r in rows)), fmt_drops(dropped),
                     str(sum(r.failed for r in rows)), "", ""])
    return _table(body, right={2, 3, 4, 5, 6, 7, 9})


# ---------------------------------------------------------------------------------------
# Log lines kept off the dashboard


class LogBuffer:
    """A file-like sink for log lines (any thread): the dashboard shows the latest, and
    they are written out after it is gone. Keeps the last ``maxlen`` lines."""

    def __init__(self, maxlen: int = 2000) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=maxlen)
        self._partial = ""
        self._lock = threading.Lock()
        self.total = 0

    def write(self, text: str) -> int:
        with self._lock:
            text = self._partial + text
            *lines, self._partial = text.split("\n")
            self._lines.extend(lines)
            self.total += len(lines)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def tail(self, n: int) -> list[str]:
        if n <= 0:
            return []
        with self._lock:
            return list(self._lines)[-n:]

    def drain(self) -> tuple[list[str], int]:
        """Every line kept, and how many earlier ones were not kept; empties the buffer."""
        with self._lock:
            lines = list(self._lines)
            if self._partial:
                lines.append(self._partial)
                self._partial = ""
            lost = self.total - len(self._lines)
            self._lines.clear()
            self.total = 0
        return lines, max(lost, 0)


# ---------------------------------------------------------------------------------------
# The screen


@dataclass(slots=True)
class Screen:
    """Everything one dashboard frame shows."""

    title: str
    elapsed: float
    duration: float | None
    state: str  # "running", "draining", "done"
    cameras: Sequence[CameraRow]
    decisions: Sequence[Decision]
    signals: Mapping[str, Any] = field(default_factory=dict)
    info: str = ""  # engine runs, metrics URL, ...


class Dashboard:
    """Redraws a :class:`Screen` in place on a terminal (``refresh`` about 4 times a second).

    Use as a context manager: the cursor is hidden while it runs and shown again after.
    """

    def __init__(self, out: TextIO, logs: LogBuffer | None = None, *, decisions: int = 8, log_lines: int = 6) -> None:
        self._out = out
        self._logs = logs
        self._height = 0  # lines drawn last time (the cursor sits below them)
        self._decisions = decisions
        self._log_lines = log_lines
        self.frames = 0

    def __enter__(self) -> Dashboard:
        self._write(HIDE_CURSOR)
        return self

    def __exit__(self, *exc: object) -> None:
        self._write(RESET + SHOW_CURSOR)

    def _size(self) -> tuple[int, int]:
        try:
            cols, rows = os.get_terminal_size(self._out.fileno())
        except (OSError, ValueError, AttributeError):
            cols, rows = 0, 0
        return (cols or 120), (rows or 50)

    def _write(self, text: str) -> None:
        try:
            self._out.write(text)
            self._out.flush()
        except (OSError, ValueError):  # the terminal went away
            pass

    def lines(self, screen: Screen, width: int, height: int) -> list[str]:
        """The frame's lines (no ANSI codes), at most ``height``."""
        span = f"{screen.elapsed:5.1f}s" + (f" / {screen.duration:g}s" if screen.duration else " (Ctrl-C to stop)")
        head = f"{screen.title}  {span}  {screen.state}"
        if screen.info:
            head += f"  {screen.info}"
        out = [head, ""]
        out += camera_table(screen.cameras)
        if screen.signals:
            sig = " ".join(f"{k}={fmt_value(v)}" for k, v in sorted(screen.signals.items()))
            out += ["", f"signals  {sig}"]
        fixed = len(out) + 3 + (2 if self._logs is not None else 0)
        room = max(height - 1 - fixed, 0)
        n_dec = min(self._decisions, room if self._logs is None else max(room - min(self._log_lines, room // 2), 0))
        decisions = list(screen.decisions)
        out += ["", f"policy decisions ({len(decisions)})"]
        shown = decisions[-n_dec:] if n_dec else []
        out += decision_table(shown) or (["  (none yet)"] if not decisions else [])
        if self._logs is not None:
            n_log = min(self._log_lines, max(height - 1 - len(out) - 2, 0))
            out += ["", "log"]
            out += ["  " + line for line in self._logs.tail(n_log)]
        return [_cut(line, width - 1) for line in out[: max(height - 1, 1)]]

    def render(self, screen: Screen) -> str:
        """The ANSI text that replaces the previous frame with this one."""
        width, height = self._size()
        lines = self.lines(screen, width, height)
        up = f"{_CSI}{self._height}A\r" if self._height else "\r"
        body = []
        for i, line in enumerate(lines):
            if i == 0:
                line = BOLD + line + RESET
            elif line.startswith(("camera ", "policy decisions", "log")) and i < len(lines):
                line = BOLD + line + RESET
            body.append(line + CLEAR_EOL)
        self._height = len(lines)
        return up + "\n".join(body) + "\n" + CLEAR_BELOW

    def refresh(self, screen: Screen) -> None:
        self._write(self.render(screen))
        self.frames += 1


class StatusLine:
    """When stdout is not a terminal: one compact line every few seconds."""

    def __init__(self, out: TextIO) -> None:
        self._out = out

    @staticmethod
    def line(screen: Screen) -> str:
        cams = " | ".join(f"{printable(r.name)} {r.input_fps:.0f}->{r.output_fps:.0f}fps p95 {fmt_ms(r.p95)}ms "
                          f"q{r.queue_depth} drop {sum(r.dropped.values())}"
                          + (f" fail {r.failed}" if r.failed else "") + (f" [{r.options}]" if r.options else "")
                          for r in screen.cameras)
        return f"[{screen.elapsed:6.1f}s] {cams} | decisions {len(screen.decisions)}"

    def show(self, screen: Screen) -> None:
        try:
            self._out.write(self.line(screen) + "\n")
            self._out.flush()
        except (OSError, ValueError):
            pass
