"""``orchestra run``'s terminal output: a live dashboard drawn with ``rich`` (stdout is a
terminal), a compact status line (it is not), and a buffer that carries log lines to the
dashboard, which prints each once above the live area (nothing is re-printed at exit).

Tables fit the terminal: when a table is wider than the screen its least important columns
are dropped first (the camera, its options — ``power_mode`` is the point — and its output
rate go last), and the options column folds rather than disappears. Everything here is
plain data in, text out; ``_run`` gathers the data on the event loop.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

__all__ = ["CameraRow", "Dashboard", "Decision", "LogBuffer", "Screen", "StatusLine", "decision_table", "fit_columns",
           "fmt_drops", "fmt_joules", "fmt_ms", "fmt_options", "fmt_unit", "fmt_value", "printable", "rich_header"]


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
    energy_joules: float | None = None  # modelled device energy so far (npu_sim), None: not modelled


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


def fmt_joules(j: float) -> str:
    """Energy with a readable unit: ``1.23 J``, ``45.6 mJ``, ``7.89 uJ``."""
    a = abs(j)
    if a == 0 or a >= 1:
        return f"{j:.3g} J" if a < 1000 else f"{j:.0f} J"
    if a >= 1e-3:
        return f"{j * 1e3:.3g} mJ"
    return f"{j * 1e6:.3g} uJ"


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


def _table(rows: Sequence[Sequence[str]], right: Iterable[int] = ()) -> list[str]:
    if not rows:
        return []
    right = set(right)
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return ["  ".join(c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(r)).rstrip()
            for r in rows]


@dataclass(frozen=True, slots=True)
class _Column:
    header: str
    cells: list[str]
    keep: int  # importance: the lowest is dropped first
    right: bool = False
    fold: bool = False  # may fold onto several lines instead of being dropped

    @property
    def width(self) -> int:
        return max([len(self.header), *(len(c) for c in self.cells)])


def fit_columns(widths: Sequence[int], keep: Sequence[int], width: int, *, gap: int = 2,
                min_fold: Mapping[int, int] | None = None) -> list[int]:
    """The indexes of the columns to show so that ``widths`` (plus ``gap`` between columns)
    fit in ``width``. The least important (lowest ``keep``) are dropped first, but only
    those less important than the columns that may fold (``min_fold``: index -> the
    narrowest it may fold to): when that is not enough, those fold before anything more
    important goes. The most important column is always kept."""
    fold = dict(min_fold or {})
    order = sorted(range(len(widths)), key=lambda c: keep[c])
    fold_keep = min((keep[i] for i in fold), default=math.inf)

    def need(cols: list[int], folded: bool) -> int:
        return sum(min(widths[i], fold[i]) if folded and i in fold else widths[i] for i in cols) + gap * (len(cols) - 1)

    cols = list(range(len(widths)))
    for i in order:
        if need(cols, False) <= width:
            return cols
        if keep[i] >= fold_keep or len(cols) == 1:
            break
        cols.remove(i)
    for i in order:
        if i not in cols:
            continue
        if need(cols, True) <= width or len(cols) == 1:
            return cols
        cols.remove(i)
    return cols


def _camera_columns(rows: Sequence[CameraRow]) -> list[_Column]:
    total = len(rows) > 1
    energy = any(r.energy_joules is not None for r in rows)

    def col(header: str, cells: list[str], keep: int, tot: str = "", **kw: Any) -> _Column:
        return _Column(header, cells + ([tot] if total else []), keep, **kw)

    dropped: dict[str, int] = collections.Counter()
    for r in rows:
        dropped.update(r.dropped)
    states = [r.state if not r.instance_state or r.instance_state == "running" else f"{r.state}/{r.instance_state}"
              for r in rows]
    cols = [
        col("camera", [printable(r.name) for r in rows], 100, "total"),
        col("state", states, 20),
        col("in fps", [f"{r.input_fps:.1f}" for r in rows], 30, f"{sum(r.input_fps for r in rows):.1f}", right=True),
        col("out fps", [f"{r.output_fps:.1f}" for r in rows], 80, f"{sum(r.output_fps for r in rows):.1f}", right=True),
        col("p50 ms", [fmt_ms(r.p50) for r in rows], 25, right=True),
        col("p95 ms", [fmt_ms(r.p95) for r in rows], 70, right=True),
        col("p99 ms", [fmt_ms(r.p99) for r in rows], 15, right=True),
        col("queue", [f"{r.queue_depth}/{r.queue_capacity}" for r in rows], 40, str(sum(r.queue_depth for r in rows)),
            right=True),
        col("drops", [fmt_drops(r.dropped) for r in rows], 50, fmt_drops(dropped)),
        col("failed", [str(r.failed) for r in rows], 35, str(sum(r.failed for r in rows)), right=True),
    ]
    if energy:
        tot = sum(r.energy_joules or 0.0 for r in rows)
        cols.append(col("energy", ["-" if r.energy_joules is None else fmt_joules(r.energy_joules) for r in rows], 60,
                        fmt_joules(tot), right=True))
    cols += [
        col("unit", [r.unit for r in rows], 10),
        col("options", [r.options for r in rows], 90, fold=True),
    ]
    return cols


def rich_header(screen: Screen) -> Any:
    """A dashboard's first line: the title, elapsed / duration, state and info (rich Text)."""
    from rich.text import Text

    span = f"{screen.elapsed:5.1f}s" + (f" / {screen.duration:g}s" if screen.duration else " (Ctrl-C to stop)")
    head = Text(no_wrap=True, overflow="ellipsis")
    head.append(screen.title, style="bold")
    head.append(f"  {span}  ")
    head.append(screen.state, style="bold green" if screen.state == "running" else "bold yellow")
    if screen.info:
        head.append(f"  {screen.info}", style="dim")
    return head


def _rich_table(cols: Sequence[_Column], width: int, *, bold_last: bool = False) -> Any:
    from rich import box
    from rich.table import Table

    keep = fit_columns([c.width for c in cols], [c.keep for c in cols], width,
                       min_fold={i: 16 for i, c in enumerate(cols) if c.fold})
    shown = [cols[i] for i in keep]
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1), collapse_padding=True,
                  expand=False, header_style="bold")
    for c in shown:
        table.add_column(c.header, justify="right" if c.right else "left", no_wrap=not c.fold,
                         overflow="fold" if c.fold else "ellipsis", min_width=min(c.width, 16) if c.fold else None)
    n = len(shown[0].cells) if shown else 0
    for r in range(n):
        table.add_row(*(c.cells[r] for c in shown), style="dim" if bold_last and r == n - 1 and n > 2 else None)
    return table


def _decision_columns(decisions: Sequence[Decision]) -> list[_Column]:
    cells = [d.cells() for d in decisions]
    keeps = [(80, True), (10, False), (90, False), (70, False), (95, False), (60, False), (50, False)]
    heads = ["at", "time", "instance", "option", "change", "by", "reason"]
    return [_Column(h, [c[i] for c in cells], k, right=r, fold=(h == "reason"))
            for i, (h, (k, r)) in enumerate(zip(heads, keeps))]


def _energy_line(energy: Sequence[Any]) -> str:
    """``balanced 1.23 J (2.01 mJ/job) | low 400 mJ (1.67 mJ/job)`` over every camera."""
    modes: dict[str, list[float]] = {}
    for e in energy:
        m = modes.setdefault(e.power_mode, [0, 0.0])
        m[0] += e.jobs
        m[1] += e.energy_joules
    parts = [f"{mode if mode != '*' else 'shared cores'} {fmt_joules(j)}" + (f" ({fmt_joules(j / n)}/job)" if n else "")
             for mode, (n, j) in modes.items()]
    return " | ".join(parts)


# ---------------------------------------------------------------------------------------
# Log lines kept off the dashboard


class LogBuffer:
    """A file-like sink for log lines (any thread). The dashboard :meth:`take` s the new
    ones at each refresh and prints them once above its live area; :meth:`drain` gives
    what nobody took. Keeps the last ``maxlen`` lines not taken yet."""

    def __init__(self, maxlen: int = 2000) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=maxlen)
        self._partial = ""
        self._lock = threading.Lock()
        self.total = 0

    def take(self) -> tuple[list[str], int]:
        """The complete lines written since the last take (or drain), and how many of
        them were not kept (more than ``maxlen`` arrived); empties the buffer."""
        with self._lock:
            lines = list(self._lines)
            lost = self.total - len(lines)
            self._lines.clear()
            self.total = 0
        return lines, max(lost, 0)

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
    energy: Sequence[Any] = ()  # EnergyUse: per camera and power mode


class Dashboard:
    """Redraws a :class:`Screen` in place on a terminal with ``rich`` (``refresh`` about 4
    times a second); new log lines are printed once, above it, as they come.

    Use as a context manager. ``console``: a ``rich.console.Console`` to draw on (default:
    one on ``out``, sized from the terminal, or ``COLUMNS``/``LINES``).
    """

    def __init__(self, out: TextIO, logs: LogBuffer | None = None, *, decisions: int = 8, console: Any = None) -> None:
        from rich.console import Console

        self._out = out
        self._logs = logs
        self._decisions = decisions
        self.console = console if console is not None else Console(file=out, highlight=False, soft_wrap=False)
        self._live: Any = None
        self.frames = 0

    def __enter__(self) -> Dashboard:
        from rich.live import Live

        self._live = Live(console=self.console, auto_refresh=False, transient=False, vertical_overflow="crop",
                          redirect_stdout=False, redirect_stderr=False)
        try:
            self._live.start()
        except (OSError, ValueError):
            self._live = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._print_logs()
            try:
                self._live.stop()
            except (OSError, ValueError):  # the terminal went away
                pass
            self._live = None

    def _print_logs(self) -> None:
        if self._logs is None or self._live is None:
            return
        lines, lost = self._logs.take()
        if not lines and not lost:
            return
        from rich.text import Text

        text = Text(no_wrap=False)
        if lost:
            text.append(f"({lost} log lines not kept)\n", style="dim")
        text.append("\n".join(printable(line) for line in lines))
        try:
            self._live.console.print(text, markup=False, highlight=False, crop=False)
        except (OSError, ValueError):
            pass

    def renderable(self, screen: Screen, width: int, height: int) -> Any:
        """The frame: a header, the camera table, energy, signals and the latest decisions,
        at most ``height`` lines (decisions give way first)."""
        from rich.console import Group
        from rich.text import Text

        parts: list[Any] = [rich_header(screen)]
        cams = _rich_table(_camera_columns(screen.cameras), width, bold_last=True)
        parts.append(cams)
        used = 1 + len(self.console.render_lines(cams, self.console.options.update(width=width), pad=False))
        extra = []
        if screen.energy:
            extra.append(Text.assemble(("energy ", "bold"), _energy_line(screen.energy), no_wrap=True,
                                       overflow="ellipsis"))
        if screen.signals:
            sig = " ".join(f"{k}={fmt_value(v)}" for k, v in sorted(screen.signals.items()))
            extra.append(Text.assemble(("signals ", "bold"), sig, no_wrap=True, overflow="ellipsis"))
        parts += extra
        used += len(extra)
        room = height - 1 - used - 2  # the decisions' title and header
        decisions = list(screen.decisions)
        title = Text(f"policy decisions ({len(decisions)})", style="bold")
        if room >= 1 or not decisions:
            parts.append(title)
            n = min(self._decisions, max(room - 1, 0))
            shown = decisions[-n:] if n else []
            if shown:
                parts.append(_rich_table(_decision_columns(shown), width))
            elif not decisions:
                parts.append(Text("  (none yet)", style="dim"))
        return Group(*parts)

    def refresh(self, screen: Screen) -> None:
        if self._live is None:
            return
        self._print_logs()
        width, height = self.console.size
        try:
            self._live.update(self.renderable(screen, width, height), refresh=True)
        except (OSError, ValueError):
            return
        self.frames += 1

    def render_text(self, screen: Screen, width: int = 80, height: int = 24) -> str:
        """The frame as plain text (no live display): for tests and logs."""
        from rich.console import Console

        console = Console(width=width, height=height, file=_Null(), record=True, color_system=None,
                          highlight=False, force_terminal=False)
        saved, self.console = self.console, console
        try:
            console.print(self.renderable(screen, width, height), crop=True)
        finally:
            self.console = saved
        return console.export_text()


class _Null:
    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


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
