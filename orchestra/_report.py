"""``orchestra run --report PATH.html``: what the cameras and the policies did, over time, in
one self-contained HTML file (inline SVG and CSS; nothing fetched to view it).

During the run :class:`Timeline` records one sample about once a second: per camera its
frame rate, latency percentiles, queue depth and modelled energy, and the engine's numeric
signals (battery, CPUs, temperature, ...). Memory stays bounded on long runs: when
``max_points`` samples are held, every other one is dropped and the sampling stride
doubles (so a day-long run keeps ~``max_points`` evenly spread samples).
:func:`write_report` draws the charts, with the policy decisions as marked events (their
reasons in the list below the charts).

The charts are SVG written here rather than by matplotlib: a few line charts don't need a
plotting library's import time (about a second) and size, the report then works on a
plain install, and every element can carry the ``data-`` attributes and titles that make
the page checkable and readable without the run.
"""

from __future__ import annotations

import datetime
import html
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidArgumentError

__all__ = ["Sample", "Timeline", "render_cluster_report", "render_report", "write_report"]

DEFAULT_MAX_POINTS = 1800


@dataclass(frozen=True, slots=True)
class Sample:
    """One camera at one moment (``t`` seconds since the cameras started)."""

    t: float
    input_fps: float
    output_fps: float
    p50: float | None  # None before the camera's first processed frame
    p95: float | None
    p99: float | None
    queue_depth: int
    energy_joules: float | None
    power_w: float | None  # energy per second since the previous sample


@dataclass
class Timeline:
    """Per camera samples and numeric signals over the run (see the module docstring)."""

    cameras: list[str]
    max_points: int = DEFAULT_MAX_POINTS
    samples: dict[str, list[Sample]] = field(default_factory=dict)
    signals: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    decisions: list[Any] = field(default_factory=list)  # orchestra._dashboard.Decision, set at the end
    stride: int = 1
    _calls: int = 0
    _last_energy: dict[str, tuple[float, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_points < 4:
            raise InvalidArgumentError(f"Timeline: max_points must be at least 4, got {self.max_points}")
        for c in self.cameras:
            self.samples.setdefault(c, [])

    def add(self, t: float, rows: Sequence[Any], energy: Sequence[Any], signals: Mapping[str, Any]) -> None:
        """Records the cameras' :class:`~orchestra._dashboard.CameraRow` s and the signals
        at ``t`` (every ``stride``-th call is kept)."""
        self._calls += 1
        if (self._calls - 1) % self.stride:
            return
        for r in rows:
            e = r.energy_joules
            power = None
            if e is not None:
                prev = self._last_energy.get(r.name)
                if prev is None:
                    self._last_energy[r.name] = (t, e)
                elif t - prev[0] >= 0.4:  # over shorter spans the rate is mostly noise
                    power = max(e - prev[1], 0.0) / (t - prev[0])
                    self._last_energy[r.name] = (t, e)
            seen = r.processed > 0  # no latency before the first frame
            self.samples.setdefault(r.name, []).append(
                Sample(t, r.input_fps, r.output_fps, r.p50 if seen else None, r.p95 if seen else None,
                       r.p99 if seen else None, r.queue_depth, e, power))
        nums = {k: float(v) for k, v in signals.items()
                if isinstance(v, (int, float)) and math.isfinite(float(v))}
        self.signals.append((t, nums))
        if len(self.signals) >= self.max_points:
            self._halve()

    def _halve(self) -> None:
        for c, s in self.samples.items():
            self.samples[c] = s[::2]
        self.signals = self.signals[::2]
        self.stride *= 2

    @property
    def points(self) -> int:
        return len(self.signals)


# ---------------------------------------------------------------------------------------
# SVG

_W, _H = 900, 190  # one chart
_L, _R, _T, _B = 58, 150, 14, 26  # margins: the legend sits on the right
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step) * step
    out = []
    v = start
    while v <= hi + step * 1e-9:
        out.append(round(v, 10))
        v += step
    return out


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 100:
        return f"{v:.0f}"
    if a >= 1:
        return f"{v:.3g}"
    return f"{v:.2g}"


def _chart(title: str, unit: str, series: Sequence[tuple[str, Sequence[tuple[float, float]], str]], t_end: float,
           events: Sequence[tuple[float, str]], key: str, *, step: bool = False) -> str:
    """One line chart: ``series`` = (name, [(t, v)], colour); ``events``: (t, label) marked
    as vertical lines."""
    pw, ph = _W - _L - _R, _H - _T - _B
    values = [v for _, pts, _ in series for _, v in pts if v is not None and math.isfinite(v)]
    lo = min(0.0, min(values, default=0.0))
    hi = max(values, default=1.0)
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    hi *= 1.08
    t_end = max(t_end, 1e-6)

    def x(t: float) -> float:
        return _L + pw * max(min(t / t_end, 1.0), 0.0)

    def y(v: float) -> float:
        return _T + ph * (1 - (v - lo) / (hi - lo))

    out = [f'<svg class="chart" data-chart="{_e(key)}" data-t-end="{t_end:.3f}" data-plot="{_L} {_T} {pw} {ph}" '
           f'data-range="{lo:.6g} {hi:.6g}" xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
           f'viewBox="0 0 {_W} {_H}" role="img" aria-label="{_e(title)}">',
           f'<rect x="{_L}" y="{_T}" width="{pw}" height="{ph}" fill="#fbfbfd" stroke="#ccc"/>']
    for v in _ticks(lo, hi):
        if lo <= v <= hi:
            yy = y(v)
            out.append(f'<line x1="{_L}" x2="{_L + pw}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#e4e4e8"/>'
                       f'<text x="{_L - 6}" y="{yy + 4:.1f}" text-anchor="end" class="tick">{_fmt(v)}</text>')
    for t in _ticks(0.0, t_end, 8):
        if t <= t_end:
            xx = x(t)
            out.append(f'<text x="{xx:.1f}" y="{_H - 8}" text-anchor="middle" class="tick">{_fmt(t)}s</text>')
    out.append(f'<text x="12" y="{_T + ph / 2:.0f}" transform="rotate(-90 12 {_T + ph / 2:.0f})" '
               f'text-anchor="middle" class="unit">{_e(unit)}</text>')
    for t, label in events:
        xx = x(t)
        out.append(f'<line class="event" data-t="{t:.3f}" x1="{xx:.1f}" x2="{xx:.1f}" y1="{_T}" y2="{_T + ph}" '
                   f'stroke="#e8590c" stroke-width="1.5" stroke-dasharray="4 3"><title>{_e(label)}</title></line>')
    for i, (name, pts, color) in enumerate(series):
        pts = [(t, v) for t, v in pts if v is not None and math.isfinite(v)]
        if pts:
            coords = []
            for j, (t, v) in enumerate(pts):
                if step and j:
                    coords.append(f"{x(t):.1f},{y(pts[j - 1][1]):.1f}")
                coords.append(f"{x(t):.1f},{y(v):.1f}")
            out.append(f'<polyline class="series" data-series="{_e(name)}" fill="none" stroke="{color}" '
                       f'stroke-width="2.2" stroke-linejoin="round" points="{" ".join(coords)}">'
                       f'<title>{_e(name)}</title></polyline>')
        ly = _T + 12 + 16 * i
        out.append(f'<rect x="{_W - _R + 12}" y="{ly - 9}" width="14" height="4" fill="{color}"/>'
                   f'<text x="{_W - _R + 32}" y="{ly - 4}" class="legend">{_e(name)}</text>')
    out.append("</svg>")
    return "".join(out)


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 6px;border-bottom:1px solid #ddd}
h3{font-size:14px;margin:14px 0 2px}
.meta{color:#555} .tick{font-size:11px;fill:#555} .unit{font-size:11px;fill:#333} .legend{font-size:12px;fill:#222}
table{border-collapse:collapse;margin:6px 0} td,th{padding:3px 10px;border-bottom:1px solid #eee;text-align:left;
vertical-align:top} th{background:#f4f4f6} td.n{text-align:right;font-variant-numeric:tabular-nums}
.chart{display:block;margin:2px 0 10px}
"""


def render_report(result: Any) -> str:
    """The HTML text of the report for a :class:`~orchestra._run.RunResult` whose run
    recorded a timeline (``RunOptions.record_s``)."""
    tl: Timeline | None = result.timeline
    if tl is None:
        raise InvalidArgumentError("report: the run recorded no timeline (RunOptions.record_s was not set)")
    cams = list(tl.cameras)
    color = {c: _COLORS[i % len(_COLORS)] for i, c in enumerate(cams)}
    t_end = max([result.elapsed_s] + [t for t, _ in tl.signals])
    decisions = list(tl.decisions or result.decisions)
    # one marker per moment: decisions within 50 ms (the engine acting on all cameras) share it
    events: list[tuple[float, str]] = []
    for d in decisions:
        label = f"{d.t:+.2f}s {d.instance}: {d.what} " + (
            f"{d.previous} -> {d.value}" if d.previous is not None else f"{d.value}") + f" ({d.policy or d.source}: {d.reason})"
        if events and abs(events[-1][0] - d.t) < 0.05:
            events[-1] = (events[-1][0], events[-1][1] + "\n" + label)
        else:
            events.append((d.t, label))

    def per_cam(attr: str, scale: float = 1.0) -> list[tuple[str, list[tuple[float, float]], str]]:
        out = []
        for c in cams:
            pts = [(s.t, getattr(s, attr) * scale if getattr(s, attr) is not None else None) for s in tl.samples.get(c, [])]
            out.append((c, pts, color[c]))  # type: ignore[arg-type]
        return out

    started = datetime.datetime.now().astimezone()
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>orchestra run {_e(os.path.basename(str(result.config.path)))}</title>",
             f"<style>{_CSS}</style></head><body>",
             f"<h1>orchestra run {_e(os.path.basename(str(result.config.path)))}</h1>",
             f'<p class="meta">{result.elapsed_s:.1f} s ({_e(result.ended_by)}), {len(cams)} cameras, '
             f"{_e(result.loop)}; {len(decisions)} policy decisions; {tl.points} samples every "
             f"{tl.stride} tick(s); written {_e(started.isoformat(timespec='seconds'))}</p>"]

    parts.append('<h2>Cameras over time</h2><p class="meta">Dashed orange lines: policy decisions '
                 "(hover for the reason; the list is below).</p>")
    charts = [
        ("Frame rate to the sink", "frames/s", per_cam("output_fps"), "fps", False),
        ("Latency p50 (capture to sink)", "ms", per_cam("p50", 1000), "p50", False),
        ("Latency p95", "ms", per_cam("p95", 1000), "p95", False),
        ("Latency p99", "ms", per_cam("p99", 1000), "p99", False),
        ("Queue depth", "frames", per_cam("queue_depth"), "queue", True),
    ]
    if any(s.energy_joules is not None for ss in tl.samples.values() for s in ss):
        charts += [("Energy used (npu_sim model, cumulative)", "J", per_cam("energy_joules"), "energy", False),
                   ("Power (npu_sim model)", "W", per_cam("power_w"), "power", True)]
    for title, unit, series, key, step in charts:
        parts.append(f"<h3>{_e(title)}</h3>")
        parts.append(_chart(title, unit, series, t_end, events, key, step=step))

    names = sorted({k for _, s in tl.signals for k in s})
    if names:
        parts.append("<h2>Signals that drove the policies</h2>")
        groups: dict[str, list[str]] = {}
        for n in names:
            groups.setdefault(n.split(".", 1)[0], []).append(n)
        for gi, (group, keys) in enumerate(groups.items()):
            series = [(k, [(t, s.get(k)) for t, s in tl.signals], _COLORS[(gi + i) % len(_COLORS)])
                      for i, k in enumerate(keys)]
            parts.append(f"<h3>{_e(group)}</h3>")
            parts.append(_chart(group, "", series, t_end, events, f"signal:{group}", step=True))  # type: ignore[arg-type]

    parts.append(f'<h2>Policy decisions ({len(decisions)})</h2>')
    if decisions:
        parts.append('<table id="decisions"><tr><th>at</th><th>time</th><th>instance</th><th>option / action</th>'
                     "<th>change</th><th>by</th><th>reason</th></tr>")
        for d in decisions:
            at, wall, inst, what, change, by, reason = d.cells()
            parts.append(f'<tr class="decision" data-t="{d.t:.3f}"><td class="n">{_e(at)}</td><td>{_e(wall)}</td>'
                         f"<td>{_e(inst)}</td><td>{_e(what)}</td><td>{_e(change)}</td><td>{_e(by)}</td>"
                         f"<td>{_e(reason)}</td></tr>")
        parts.append("</table>")
    else:
        parts.append("<p>none</p>")

    if result.energy:
        parts.append("<h2>Energy per camera and power mode (npu_sim model)</h2><table id=\"energy\"><tr><th>camera</th>"
                     "<th>power mode</th><th>jobs</th><th>device ms</th><th>energy J</th><th>per job (uJ)</th></tr>")
        for e in result.energy:
            per = f"{e.energy_joules / e.jobs * 1e6:.3f}" if e.jobs else "-"
            parts.append(f"<tr><td>{_e(e.camera)}</td><td>{_e(e.power_mode)}</td><td class=n>{e.jobs}</td>"
                         f"<td class=n>{e.device_seconds * 1000:.2f}</td><td class=n>{e.energy_joules:.6f}</td>"
                         f"<td class=n>{per}</td></tr>")
        parts.append("</table>")

    parts.append("<h2>Summary</h2><table id=\"cameras\"><tr><th>camera</th><th>produced</th><th>processed</th>"
                 "<th>dropped</th><th>failed</th><th>p50 ms</th><th>p95 ms</th><th>p99 ms</th><th>executions per option set"
                 "</th></tr>")
    for c in result.cameras:
        sets = ", ".join(f"{label}: {n}" for label, n in result.executions.get(c.name, []))
        parts.append(f"<tr><td>{_e(c.name)}</td><td class=n>{c.produced}</td><td class=n>{c.processed}</td>"
                     f"<td class=n>{sum(c.dropped.values())}</td><td class=n>{c.failed}</td>"
                     f"<td class=n>{c.p50 * 1000:.1f}</td><td class=n>{c.p95 * 1000:.1f}</td>"
                     f"<td class=n>{c.p99 * 1000:.1f}</td><td>{_e(sets)}</td></tr>")
    parts.append("</table>")
    if result.problems:
        parts.append("<h2>Problems</h2><ul>" + "".join(f"<li>{_e(p)}</li>" for p in result.problems) + "</ul>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def render_cluster_report(result: Any, tl: Timeline, decisions: Sequence[Mapping[str, Any]],
                          elapsed_s: float) -> str:
    """The HTML text of a cluster run's report (``orchestra run --report`` with ``[cluster]``):
    each camera's frame rate and latency over time as the driver saw them (the nodes' reports,
    about once a second; a camera's label names its node), every node's policy decisions
    (``decisions``: :func:`orchestra._run.cluster_decisions`), and one summary row per camera
    with its node, frames over every try, accounting and restarts. ``result``: a
    :class:`~orchestra._run.ClusterRunResult`."""
    cams = list(tl.cameras)
    color = {c: _COLORS[i % len(_COLORS)] for i, c in enumerate(cams)}
    t_end = max([elapsed_s] + [t for t, _ in tl.signals])
    node_of = {r.camera: (r.node_id or "?")[:8] for r in result.runs}
    events: list[tuple[float, str]] = []
    for d in sorted(decisions, key=lambda d: d.get("t_s") or 0.0):
        t = float(d.get("t_s") or 0.0)
        label = (f"{t:+.2f}s {d['camera']} (node {(d.get('node_id') or '?')[:8]}): {d.get('what')} "
                 f"{d.get('previous')} -> {d.get('value')} ({d.get('policy') or d.get('source')}: {d.get('reason')})")
        if events and abs(events[-1][0] - t) < 0.05:
            events[-1] = (events[-1][0], events[-1][1] + "\n" + label)
        else:
            events.append((t, label))

    def per_cam(attr: str, scale: float = 1.0) -> list[tuple[str, list[tuple[float, float]], str]]:
        return [(f"{c}@{node_of.get(c, '?')}", [(x.t, getattr(x, attr) * scale if getattr(x, attr) is not None else None)
                                               for x in tl.samples.get(c, [])], color[c]) for c in cams]  # type: ignore[misc]

    name = _e(os.path.basename(str(result.config.path)))
    nodes = len({r.node_id for r in result.runs if r.node_id})
    written = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>orchestra run {name}</title>",
             f"<style>{_CSS}</style></head><body>", f"<h1>orchestra run {name} on the Ray cluster at "
             f"{_e(result.address)}</h1>",
             f'<p class="meta">{elapsed_s:.1f} s, {len(cams)} cameras on {nodes} node{"s" if nodes != 1 else ""}; '
             f"{len(decisions)} policy decisions; {tl.points} samples (the nodes' reports as the driver got them); "
             f"written {_e(written)}</p>",
             '<h2>Cameras over time</h2><p class="meta">Each camera as CAMERA@NODE. Dashed orange lines: policy '
             "decisions (hover for the reason; the list is below).</p>"]
    for title, unit, series, key in (("Frame rate to the sink", "frames/s", per_cam("output_fps"), "fps"),
                                     ("Latency p50 (capture to sink)", "ms", per_cam("p50", 1000), "p50"),
                                     ("Latency p95", "ms", per_cam("p95", 1000), "p95")):
        parts.append(f"<h3>{_e(title)}</h3>")
        parts.append(_chart(title, unit, series, t_end, events, key, step=False))
    parts.append(f"<h2>Policy decisions ({len(decisions)})</h2>")
    if decisions:
        parts.append('<table id="decisions"><tr><th>at</th><th>camera</th><th>node</th><th>option / action</th>'
                     "<th>change</th><th>by</th><th>reason</th></tr>")
        for d in decisions:
            t = float(d.get("t_s") or 0.0)
            parts.append(f'<tr class="decision" data-t="{t:.3f}"><td class="n">{t:+.2f}s</td><td>{_e(d["camera"])}</td>'
                         f"<td>{_e((d.get('node_id') or '?')[:12])}</td><td>{_e(d.get('what'))}</td>"
                         f"<td>{_e(d.get('previous'))} -&gt; {_e(d.get('value'))}</td>"
                         f"<td>{_e(d.get('policy') or d.get('source'))}</td><td>{_e(d.get('reason'))}</td></tr>")
        parts.append("</table>")
    else:
        parts.append("<p>none</p>")
    parts.append('<h2>Summary</h2><table id="cameras"><tr><th>camera</th><th>node</th><th>address</th><th>produced</th>'
                 "<th>processed</th><th>failed</th><th>dropped</th><th>accounting</th><th>restarts</th></tr>")
    for r in result.runs:
        counts = r.counts
        cells = [str(v) for v in counts] if counts is not None else ["-"] * 4
        parts.append(f"<tr><td>{_e(r.camera)}</td><td>{_e((r.node_id or '?')[:12])}</td><td>{_e(r.address or '?')}</td>"
                     + "".join(f"<td class=n>{_e(c)}</td>" for c in cells)
                     + f"<td>{_e(r.accounting)}</td><td class=n>{r.restarts}</td></tr>")
    parts.append("</table>")
    if result.problems:
        parts.append("<h2>Problems</h2><ul>" + "".join(f"<li>{_e(p)}</li>" for p in result.problems) + "</ul>")
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_report(result: Any, path: str | os.PathLike[str], text: str | None = None) -> None:
    """Writes :func:`render_report` (or ``text``, e.g. :func:`render_cluster_report`'s) to
    ``path`` (replaced atomically).

    Raises:
        InvalidArgumentError: ``path`` can't be written.
    """
    text = render_report(result) if text is None else text
    name = os.fspath(path)
    tmp = f"{name}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, name)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise InvalidArgumentError(f"--report {name}: can't write: {exc.strerror or exc}") from None
