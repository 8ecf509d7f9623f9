"""structlog helpers and metric primitives (the base layer).

The library never configures logging: it logs through :func:`get_logger` with context bound
via contextvars (instance, camera, backend, core); applications and the CLI configure output.
"""

from __future__ import annotations

import array
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

__all__ = ["LatencySummary", "LatencyWindow", "bound", "get_logger"]


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
