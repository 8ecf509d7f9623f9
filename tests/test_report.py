"""``orchestra run --report``: the main example's report, opened in headless Chromium.

The screenshot's chart areas must hold drawn series (decoded with the small PNG reader
below), and the rendered DOM must list the battery policy's power-mode switch at the time
the scripted battery dropped (2.5 s), with the battery series stepping down there too.
``--summary-json`` of the same run is checked against its schema.
"""

from __future__ import annotations

import html.parser
import json
import os
import pathlib
import re
import shutil
import struct
import subprocess
import sys
import zlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
NAMES = ("front", "rear", "left", "right")
CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"), "/usr/bin/chromium")
                 if p and os.path.exists(p)), None)


def read_png(data: bytes) -> tuple[int, int, int, bytes]:
    """(width, height, channels, pixels) of an 8-bit, non-interlaced RGB/RGBA/grey PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and interlace == 0 and ctype in (0, 2, 4, 6), (depth, ctype, interlace)
            channels = {0: 1, 2: 3, 4: 2, 6: 4}[ctype]
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = width * channels
    out = bytearray(stride * height)
    prev = bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out[y * stride:(y + 1) * stride] = line
        prev = line
    return width, height, channels, bytes(out)


class _Collect(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[float, list[str]]] = []
        self.charts: dict[str, dict[str, str]] = {}
        self.series: dict[tuple[str, str], str] = {}
        self._row: list[str] | None = None
        self._t = 0.0
        self._chart = ""
        self._cell = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "tr" and a.get("class") == "decision":
            self._row, self._t = [], float(a["data-t"])
        elif tag == "td" and self._row is not None:
            self._row.append("")
            self._cell = True
        elif tag == "svg" and "data-chart" in a:
            self._chart = a["data-chart"]
            self.charts[self._chart] = a
        elif tag == "polyline" and "data-series" in a:
            self.series[(self._chart, a["data-series"])] = a["points"]

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._cell = False
        elif tag == "tr" and self._row is not None:
            self.rows.append((self._t, self._row))
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._row is not None and self._cell:
            self._row[-1] += data


def _chromium(args: list[str], tmp: pathlib.Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--no-first-run", f"--user-data-dir={tmp / 'chrome'}", *args],
                          capture_output=True, timeout=120)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="linux")
def test_report_of_the_main_job_in_headless_chromium(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("av", reason="the main job decodes video: the video extra (PyAV)")
    shutil.copytree(ROOT / "examples", tmp_path / "examples")  # its results go to the copy's out/
    report, summary = tmp_path / "run.html", tmp_path / "run.json"
    r = subprocess.run([sys.executable, "-m", "orchestra", "run", str(tmp_path / "examples" / "street.toml"), "--duration", "5", "--no-dashboard",
                        "--report", str(report), "--summary-json", str(summary)], capture_output=True, text=True,
                       encoding="utf-8", env=dict(os.environ, NO_COLOR="1"), cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    page = report.read_text(encoding="utf-8")
    # self-contained: nothing to fetch
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page, re.I)
    assert "<script" not in page and "@import" not in page

    # the decision list and the signal series, as Chromium rendered the page
    dom = _chromium(["--dump-dom", report.as_uri()], tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    parsed = _Collect()
    parsed.feed(dom.stdout.decode("utf-8"))
    switches = [(t, row) for t, row in parsed.rows if row[3] == "NpuSimBackend.power_mode"]
    assert {row[2] for _, row in switches} == set(NAMES)
    for t, row in switches:
        assert row[4] == "balanced -> low" and row[5] == "battery", row
        assert "battery.percent=15" in row[6], row
        assert 2.5 <= t < 3.5, (t, row)  # the scripted drop is at 2.5 s; the engine polls every 0.1 s
    chart = parsed.charts["signal:battery"]
    x0, _, pw, _ = (float(v) for v in chart["data-plot"].split())
    t_end = float(chart["data-t-end"])
    pts = [tuple(map(float, p.split(","))) for p in parsed.series[("signal:battery", "battery.percent")].split()]
    drop = next(x for (x, y), (_, y_prev) in zip(pts[1:], pts) if y > y_prev)  # y grows downwards
    t_drop = (drop - x0) / pw * t_end
    assert 2.4 <= t_drop <= 3.6, t_drop  # sampled ~1 Hz, and early when a signal moves
    for key in ("fps", "p50", "p95", "p99", "queue", "energy", "power"):
        assert key in parsed.charts, key
        assert {s for c, s in parsed.series if c == key} == set(NAMES) or key in ("power",), key

    # the screenshot: every chart's plot area holds drawn (coloured) pixels
    shot = tmp_path / "shot.png"
    res = _chromium([f"--screenshot={shot}", "--window-size=1000,4200", report.as_uri()], tmp_path)
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    width, height, ch, px = read_png(shot.read_bytes())

    def pixel(x: int, y: int) -> tuple[int, int, int]:
        i = (y * width + x) * ch
        return (px[i], px[i], px[i]) if ch < 3 else (px[i], px[i + 1], px[i + 2])

    # plot areas: bands of rows whose pixel just inside the plot's left edge (body margin 24 +
    # the chart's left margin) is not the page's white: the plot background, grid or a line
    probe = 24 + int(x0) + 3
    bands, start = [], None
    for y in range(height):
        inside = pixel(probe, y) != (255, 255, 255)
        if inside and start is None:
            start = y
        elif not inside and start is not None:
            if y - start > 60:
                bands.append((start, y))
            start = None
    assert len(bands) >= len(parsed.charts), (bands, sorted(parsed.charts))  # every chart of the page drawn
    for y0, y1 in bands:
        coloured = 0
        for y in range(y0, y1, 2):
            for x in range(probe, 24 + int(x0 + pw) - 2, 2):
                r_, g, b = pixel(x, y)
                if max(r_, g, b) - min(r_, g, b) > 60:  # a series or event line, not grey grid/background
                    coloured += 1
        assert coloured > 40, (y0, y1, coloured)

    # --summary-json: the same run, machine-readable
    doc = json.loads(summary.read_text(encoding="utf-8"))
    assert doc["schema"] == "orchestra.run.summary/1" and doc["result"] == "ok" and doc["exit_code"] == 0
    assert [c["name"] for c in doc["cameras"]] == list(NAMES)
    for c in doc["cameras"]:
        assert c["accounting"] == "ok"
        assert c["produced"] == c["processed"] + c["failed"] + sum(c["dropped"].values())
        modes = c["energy_by_power_mode"]
        assert set(modes) == {"balanced", "low"}
        per_job = {m: v["energy_joules"] / v["jobs"] for m, v in modes.items()}
        assert per_job["low"] < per_job["balanced"]  # what the battery policy buys
        assert abs(c["energy_joules"] - sum(v["energy_joules"] for v in modes.values())) < 1e-12
        assert sum(doc["executions"][c["name"]].values()) == c["processed"]
    assert len(doc["decisions"]) == 4
    assert all(re.search(r"T\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d$", d["time"]) for d in doc["decisions"])


def test_timeline_memory_stays_bounded_on_long_runs() -> None:
    from orchestra._dashboard import CameraRow
    from orchestra._report import Timeline

    tl = Timeline(["a"], max_points=8)
    for i in range(1000):  # 1000 ticks of a long run
        row = CameraRow(name="a", state="running", drop="block", input_fps=1.0, output_fps=1.0, p50=0.001, p95=0.002,
                        p99=0.003, produced=i, processed=i, failed=0, dropped={}, queue_depth=0, queue_capacity=1,
                        unit="", options="", energy_joules=0.5 * i)
        tl.add(float(i), [row], [], {"battery.percent": 100 - i / 10})
    ts = [s.t for s in tl.samples["a"]]
    assert len(ts) == tl.points <= 8 and tl.stride >= 128
    assert ts[0] == 0.0 and ts[-1] >= 1000 - 2 * tl.stride  # still spans the whole run
    gaps = {b - a for a, b in zip(ts, ts[1:])}
    assert gaps == {float(tl.stride)}, gaps  # evenly spread
    assert all(s.power_w == 0.5 for s in tl.samples["a"][1:])  # J/s between samples
