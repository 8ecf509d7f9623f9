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
