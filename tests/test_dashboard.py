"""The live dashboard, drawn by ``orchestra run`` in a real pseudo-terminal at 80x24 and
160x45: the final screen (replayed by a small terminal model below) shows every camera
with its power mode, energy and the policy decision, and logs are printed once."""

from __future__ import annotations

import pathlib
import re
import sys

import pytest
from _pty import run_in_pty

ROOT = pathlib.Path(__file__).resolve().parent.parent
CAMERAS = ROOT / "examples" / "cameras.toml"
NAMES = ("front", "rear", "left", "right")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX ptys")

_SEQ = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])|\x1b[()][A-Za-z0-9]|\x1b.|[\r\n\b]|[^\x1b\r\n\b]+", re.S)


class Terminal:
    """Just enough of a VT100 to replay what rich writes: text, CR/LF, cursor moves
    (A/B/C/D/G/H), erase in line/display (K/J), scrolling at the bottom; colours ignored."""

    def __init__(self, cols: int, rows: int) -> None:
        self.cols, self.rows = cols, rows
        self.lines = [[" "] * cols for _ in range(rows)]
        self.x = self.y = 0
        self.scrolled: list[str] = []  # lines that scrolled off the top

    def _newline(self) -> None:
        self.y += 1
        if self.y >= self.rows:
            self.scrolled.append("".join(self.lines.pop(0)).rstrip())
            self.lines.append([" "] * self.cols)
            self.y = self.rows - 1

    def feed(self, data: str) -> None:
        for m in _SEQ.finditer(data):
            tok = m.group(0)
            if m.group(2):
                args = [int(a) if a.isdigit() else 0 for a in m.group(1).lstrip("?").split(";")] if m.group(1) else []
                n = args[0] if args and args[0] else 1
                cmd = m.group(2)
                if m.group(1).startswith("?"):
                    continue
                if cmd == "A":
                    self.y = max(self.y - n, 0)
                elif cmd == "B":
                    self.y = min(self.y + n, self.rows - 1)
                elif cmd == "C":
                    self.x = min(self.x + n, self.cols - 1)
                elif cmd == "D":
                    self.x = max(self.x - n, 0)
                elif cmd == "G":
                    self.x = min(n - 1, self.cols - 1)
                elif cmd == "H":
                    self.y = min((args[0] or 1) - 1 if args else 0, self.rows - 1)
                    self.x = min((args[1] or 1) - 1 if len(args) > 1 else 0, self.cols - 1)
                elif cmd == "K":
                    mode = args[0] if args else 0
                    row = self.lines[self.y]
                    lo, hi = {0: (self.x, self.cols), 1: (0, self.x + 1), 2: (0, self.cols)}[mode]
                    row[lo:hi] = [" "] * (hi - lo)
                elif cmd == "J":
                    mode = args[0] if args else 0
                    if mode == 0:
                        self.lines[self.y][self.x:] = [" "] * (self.cols - self.x)
                        for r in range(self.y + 1, self.rows):
                            self.lines[r] = [" "] * self.cols
                    elif mode == 2:
                        self.lines = [[" "] * self.cols for _ in range(self.rows)]
                continue
            if tok.startswith("\x1b"):
                continue
            if tok == "\r":
                self.x = 0
            elif tok == "\n":
                self._newline()
                self.x = 0  # the pty's onlcr
            elif tok == "\b":
                self.x = max(self.x - 1, 0)
            else:
                for ch in tok:
                    if self.x >= self.cols:
                        self.x = 0
                        self._newline()
                    self.lines[self.y][self.x] = ch
                    self.x += 1

    def screen(self) -> list[str]:
        return ["".join(r).rstrip() for r in self.lines]


def _run_in_pty(cols: int, rows: int, duration: float) -> tuple[int, Terminal, list[tuple[float, str]], str]:
    rc, got = run_in_pty([sys.executable, "-m", "orchestra", "run", str(CAMERAS), "--duration", str(duration)],
                         cols, rows, cwd=ROOT, env={"NO_COLOR": None})
    chunks = [(t, c.decode("utf-8", "replace")) for t, c in got]
    text = b"".join(c for _, c in got).decode("utf-8", "replace")
    term = Terminal(cols, rows)
    term.feed(text)
    return rc, term, chunks, text


@pytest.mark.parametrize(("cols", "rows"), [(80, 24), (160, 45)])
def test_dashboard_in_a_pty_keeps_power_mode_visible(cols: int, rows: int) -> None:
    rc, term, chunks, text = _run_in_pty(cols, rows, 3.5)
    everything = "\n".join(term.scrolled + term.screen())
    assert rc == 0, everything[-3000:]
    assert "Traceback" not in everything
    # replay up to the last dashboard frame (before the summary): the final frame on screen
    frame = Terminal(cols, rows)
    frame.feed(text[: text.rfind("\x1b[?25h")])  # rich shows the cursor again when the live view stops
    screen = frame.screen()
    assert all(len(line) <= cols for line in screen)
    table = [line for line in screen if line.split(" ", 1)[0] in NAMES]
    assert {line.split()[0] for line in table} == set(NAMES), screen
    header = next(line for line in screen if line.startswith("camera"))
    assert "options" in header and "out fps" in header
    body = "\n".join(screen)
    for cam in NAMES:  # the power mode the camera ran with at the end, on its row (or folded just below)
        i = next(i for i, line in enumerate(screen) if line.startswith(cam + " "))
        assert re.search(r"power_mode=(low|balanced|l\s*$)", screen[i] + " " + screen[i + 1]) or \
            "power_mode=" in screen[i], screen
    assert "power_mode=low" in body.replace("\n", "") or "power_mode=lo" in body, screen
    assert "energy" in body
    assert "policy decisions (4)" in body
    if rows >= 45:
        assert "balanced -> low" in body and "battery" in body
        assert "unit" in header and "p99 ms" in header  # room for every column
    else:
        assert "unit" not in header  # the least important columns went first
    # shown from the first moment: the first frame came before the cameras were 1 s old
    first = next(t for t, c in chunks if "camera" in c and "options" in c)
    running = re.search(r"\s(\d+\.\d)s / 3\.5s", next(c for _, c in chunks if re.search(r"\d+\.\ds / 3\.5s", c)))
    assert running is not None and float(running.group(1)) < 1.0, first
    # log lines printed once (above the live area), not again at exit
    assert everything.count("cameras running") == 1
    assert everything.count("orchestrator started") == 1
    assert "executions per option set" in everything and everything.rstrip().endswith("result: ok")


def _rows() -> list[object]:
    from orchestra._dashboard import CameraRow

    return [CameraRow(name=n, state="running", drop="drop_oldest", input_fps=30.0, output_fps=29.9, p50=0.0012,
                      p95=0.0051, p99=0.0093, produced=100, processed=98, failed=0, dropped={"evicted": 2},
                      queue_depth=1, queue_capacity=8, unit=f"npu0.core {i}", options="power_mode=balanced priority=1",
                      energy_joules=0.00042) for i, n in enumerate(NAMES)]


@pytest.mark.parametrize("width", [60, 80, 100, 160])
def test_frame_fits_the_width_and_keeps_the_options(width: int) -> None:
    import io

    from orchestra._dashboard import Dashboard, Screen

    screen = Screen(title="orchestra run cameras.toml", elapsed=1.0, duration=5.0, state="running",
                    cameras=_rows(), decisions=[], signals={"battery.percent": 100})
    text = Dashboard(io.StringIO()).render_text(screen, width, 24)
    lines = text.splitlines()
    assert all(len(line) <= width for line in lines), text
    assert len(lines) <= 24
    rows = [line for line in lines if line.split(" ", 1)[0] in NAMES]
    assert len(rows) == 4, text
    assert text.count("power_mode=") >= 4 or text.replace("\n", "").count("power_mode") >= 4, text
    header = next(line for line in lines if line.startswith("camera"))
    if width >= 160:
        assert all(h in header for h in ("state", "in fps", "p50 ms", "p99 ms", "unit", "energy"))
    if width <= 80:
        assert "unit" not in header and "p99 ms" not in header  # dropped first
        assert "out fps" in header and "options" in header


def test_fit_columns_drops_the_least_important_first() -> None:
    from orchestra._dashboard import fit_columns

    widths, keep = [6, 10, 10, 30], [100, 10, 50, 90]
    assert fit_columns(widths, keep, 80) == [0, 1, 2, 3]
    assert fit_columns(widths, keep, 50) == [0, 2, 3]
    assert fit_columns(widths, keep, 40) == [0, 3]
    assert fit_columns(widths, keep, 30, min_fold={3: 16}) == [0, 3]  # the options fold instead of going
    assert fit_columns(widths, keep, 3) == [0]
