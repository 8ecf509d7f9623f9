"""The base layer's metric primitives and logging helpers."""

from __future__ import annotations

import structlog

from orchestra.telemetry import LatencyWindow, bound, get_logger


def test_latency_window_percentiles_over_the_recent_window() -> None:
    w = LatencyWindow(size=100)
    assert w.summary().count == 0
    for i in range(1, 101):
        w.record(i / 1000)
    s = w.summary()
    assert (s.count, s.window) == (100, 100)
    assert abs(s.p50 - 0.0505) < 1e-9 and abs(s.max - 0.1) < 1e-12
    for _ in range(100):  # the window now holds only the new samples
        w.record(1.0)
    s = w.summary()
    assert s.count == 200 and s.p50 == 1.0 and s.p99 == 1.0


def test_bound_context_reaches_log_events() -> None:
    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        with bound(instance="front", core=0):
            get_logger("orchestra.test").info("hello", x=1)
    assert logs == [{"instance": "front", "core": 0, "x": 1, "event": "hello", "log_level": "info"}]


def test_histogram_buckets_are_le_bounds_and_cumulative() -> None:
    from orchestra.telemetry import Histogram

    h = Histogram((0.01, 0.1, 1.0))
    for v in (0.005, 0.01, 0.05, 0.5, 2.0, 3.0):
        h.observe(v)
    s = h.snapshot()
    assert s.counts == (2, 1, 1, 2) and s.count == 6
    assert abs(s.sum - 5.565) < 1e-12
    assert s.cumulative() == [("0.01", 2), ("0.1", 3), ("1.0", 4), ("+Inf", 6)]
    h.observe(0.02)  # the snapshot is a copy
    assert s.count == 6 and h.snapshot().count == 7
