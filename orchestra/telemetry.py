"""structlog helpers and metric primitives (the base layer).

The library never configures logging: it logs through :func:`get_logger` with context bound
via contextvars (instance, camera, backend, core); applications and the CLI configure output.
"""

from __future__ import annotations

import array
import bisect
import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

__all__ = ["LATENCY_BUCKETS", "Histogram", "HistogramSnapshot", "LatencySummary", "LatencyWindow", "bound",
           "get_logger"]


def get_logger(name: str) -> Any:
    """A structlog logger for module ``name`` (configure structlog in the app, not here)."""
    return structlog.get_logger(name)


@contextlib.contextmanager
def bound(**context: Any) -> Iterator[None]:
    """Binds ``context`` (e.g. ``instance="front", core=0``) to every log event in the block."""
    with structlog.contextvars.bound_contextvars(**context):
        yield


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """Percentiles over a window of recent samples, in seconds."""

    count: int  # samples ever recorded
    window: int  # samples the percentiles are computed over
    mean: float
    p50: float
    p95: float
    p99: float
    max: float


class LatencyWindow:
    """The last ``size`` latency samples in a ring buffer, for percentiles.

    ``record`` is O(1) with no allocation; one writer at a time (the owner of the thing
    measured); ``summary`` may be called from another thread and sees a recent state.
    """

    __slots__ = ("_buf", "_n", "_size")

    def __init__(self, size: int = 1024) -> None:
        if size <= 0:
            raise ValueError(f"size must be positive, got {size}")
        # array.array: a store costs a third of a numpy item assignment; zero-filled now, so
        # memory doesn't creep as it fills
        self._buf = array.array("d", bytes(8 * size))
        self._n = 0
        self._size = size

    def record(self, seconds: float) -> None:
        self._buf[self._n % self._size] = seconds
        self._n += 1

    @property
    def count(self) -> int:
        return self._n

    def summary(self) -> LatencySummary:
        n = self._n
        w = min(n, self._size)
        if w == 0:
            return LatencySummary(0, 0, 0.0, 0.0, 0.0, 0.0, 0.0)
        data = np.frombuffer(self._buf, np.float64, w).copy()
        p50, p95, p99 = np.percentile(data, (50, 95, 99))
        return LatencySummary(n, w, float(data.mean()), float(p50), float(p95), float(p99), float(data.max()))


# Upper bounds (seconds) for latency histograms: sub-millisecond executes up to frames that
# waited seconds in a queue (Prometheus adds +Inf).
LATENCY_BUCKETS: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                      0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    """A histogram at one moment: ``counts[i]`` observations <= ``bounds[i]`` (not
    cumulative), ``counts[-1]`` those above the last bound; ``sum`` of every observation."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus buckets: ``[("0.001", n <= 0.001), ..., ("+Inf", count)]``."""
        out, total = [], 0
        for bound_, n in zip((*self.bounds, math.inf), self.counts):
            total += n
            out.append(("+Inf" if bound_ == math.inf else repr(float(bound_)), total))
        return out


class Histogram:
    """Counts observations into fixed buckets, for Prometheus histograms.

    One writer (e.g. the event loop): :meth:`observe` is a bisect and two stores, no lock,
    no allocation. :meth:`snapshot` copies the counts; called by the writer's thread it is
    exact, from another thread it may be one observation behind in ``sum``.
    """

    __slots__ = ("_bounds", "_counts", "_sum")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        b = tuple(float(x) for x in bounds)
        if not b or any(not math.isfinite(x) for x in b) or list(b) != sorted(set(b)):
            raise ValueError(f"bounds must be finite, increasing and non-empty, got {bounds!r}")
        self._bounds = b
        self._counts = [0] * (len(b) + 1)
        self._sum = 0.0

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, value)] += 1
        self._sum += value

    def snapshot(self) -> HistogramSnapshot:
        return HistogramSnapshot(self._bounds, tuple(self._counts), self._sum)
