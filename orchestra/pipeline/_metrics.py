"""Frame accounting and per-camera statistics (small frozen dataclasses), and a rate meter."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..errors import Error, OrchestraError
from ..telemetry import LatencySummary
from ._stream import DropReason

__all__ = ["Accounting", "AccountingError", "PipelineStatistics", "PipelinesStatistics", "RateMeter"]


class AccountingError(OrchestraError):
    """Frames were lost or counted twice: ``produced`` doesn't match where frames went."""

    default_code = Error.Internal


def _reasons(counts: Mapping[str, int] | None = None) -> Mapping[str, int]:
    d = {r.value: 0 for r in DropReason}
    if counts:
        for k, v in counts.items():
            d[str(k)] = d.get(str(k), 0) + v
    return MappingProxyType(d)


# failure stages of a frame, in pipeline order (PipelineStatistics.failed_by keys)
FAILURE_STAGES = ("pre", "execute", "post", "sink")
_NO_FAILURES: Mapping[str, int] = MappingProxyType(dict.fromkeys(FAILURE_STAGES, 0))


@dataclass(frozen=True, slots=True)
class Accounting:
    """Where every frame one pipeline's camera produced went, at one moment.

    The identity ``produced == processed + failed + dropped_total + in_flight`` holds at
    every moment the event loop can observe, and ``in_flight == 0`` once ``run`` returned.
    ``in_flight`` is counted on its own (``queued`` in the stream + ``active`` between the
    stream and the sink), so :meth:`check` tests the bookkeeping rather than restating it.
    """

    name: str  # the pipeline's (or "*" for a group's total)
    produced: int
    processed: int
    failed: int
    dropped: Mapping[str, int]  # by DropReason value; every reason present
    queued: int
    active: int
    running: bool

    @property
    def in_flight(self) -> int:
        return self.queued + self.active

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    def check(self) -> None:
        """Raises :class:`AccountingError` unless every produced frame is accounted for
        exactly once (and none is still in flight after the run)."""
        counts = {"produced": self.produced, "processed": self.processed, "failed": self.failed,
                  "queued": self.queued, "active": self.active, **dict(self.dropped)}
        negative = [k for k, v in counts.items() if v < 0]
        if negative:
            raise AccountingError(f"pipeline {self.name!r}: negative counts {negative}: {self}")
        total = self.processed + self.failed + self.dropped_total + self.in_flight
        if total != self.produced:
            raise AccountingError(
                f"pipeline {self.name!r}: produced {self.produced} != processed {self.processed} + failed "
                f"{self.failed} + dropped {self.dropped_total} {dict(self.dropped)} + in flight {self.in_flight} "
                f"(= {total})"
            )
        if not self.running and self.in_flight:
            raise AccountingError(f"pipeline {self.name!r}: {self.in_flight} frames still in flight after the run: {self}")

    @classmethod
    def total(cls, parts: Iterable[Accounting], name: str = "*") -> Accounting:
        """The sum of several cameras' accounting (``running`` if any of them is)."""
        parts = list(parts)
        dropped: dict[str, int] = {}
        for a in parts:
            for k, v in a.dropped.items():
                dropped[k] = dropped.get(k, 0) + v
        return cls(name, sum(a.produced for a in parts), sum(a.processed for a in parts),
                   sum(a.failed for a in parts), _reasons(dropped), sum(a.queued for a in parts),
                   sum(a.active for a in parts), any(a.running for a in parts))


@dataclass(frozen=True, slots=True)
class PipelineStatistics:
    """One camera's pipeline.

    Rates are frames per second over the last few seconds (``input_fps``: produced by the
    source, ``output_fps``: processed to the sink). ``latency`` is capture → sink over the
    recent processed frames. ``instance``, ``unit`` and ``options`` come from the executor's
    ``describe()`` when it has one (``executor_info`` holds all it said).

    ``failed_by`` splits ``accounting.failed`` by the stage that failed (``pre``,
    ``execute``, ``post``, ``sink``); ``sink_failures`` is its ``sink`` entry: frames whose
    sink raised or timed out (each counted ``failed``, never ``processed``).
    """

    name: str
    camera: str
    state: str  # idle, running, stopping, done, failed
    drop: str
    accounting: Accounting
    input_fps: float
    output_fps: float
    latency: LatencySummary
    queue_depth: int
    queue_max: int
    queue_capacity: int
    inflight: int  # concurrent frames allowed at the executor
    instance: str | None
    unit: Any
    options: Mapping[str, Any] | None
    executor_info: Mapping[str, Any] | None
    last_error: str | None
    failed_by: Mapping[str, int] = field(default_factory=lambda: _NO_FAILURES)

    @property
    def dropped(self) -> Mapping[str, int]:
        return self.accounting.dropped

    @property
    def failures(self) -> int:
        return self.accounting.failed

    @property
    def sink_failures(self) -> int:
        """Frames whose sink raised or timed out (part of ``failures``)."""
        return self.failed_by.get("sink", 0)


@dataclass(frozen=True, slots=True)
class PipelinesStatistics:
    """Every pipeline of a :class:`Pipelines` group, and their totals.

    ``latency`` is over the recent frames of all cameras together.
    """

    pipelines: tuple[PipelineStatistics, ...]
    accounting: Accounting
    input_fps: float
    output_fps: float
    latency: LatencySummary
    queue_max: int  # the deepest any camera's queue has been

    @property
    def sink_failures(self) -> int:
        """Frames whose sink raised or timed out, over all cameras."""
        return sum(p.sink_failures for p in self.pipelines)

    def __getitem__(self, name: str) -> PipelineStatistics:
        for p in self.pipelines:
            if p.name == name:
                return p
        raise KeyError(name)


class RateMeter:
    """Events per second over the last ``window_s`` seconds, counted in ``buckets`` slots.

    ``record`` is O(1) (one division, no allocation); one writer (the event loop).
    """

    __slots__ = ("_counts", "_ids", "_n", "_width")

    def __init__(self, window_s: float = 5.0, buckets: int = 10) -> None:
        self._n = buckets
        self._width = window_s / buckets
        self._ids = [-1] * buckets
        self._counts = [0] * buckets

    def record(self, t: float) -> None:
        b = int(t // self._width)
        i = b % self._n
        if self._ids[i] != b:
            self._ids[i] = b
            self._counts[i] = 1
        else:
            self._counts[i] += 1

    def rate(self, now: float, since: float) -> float:
        """The rate at ``now``; ``since`` is when counting started (a young meter's window
        is shorter)."""
        nb = int(now // self._width)
        lo = nb - self._n
        count = sum(c for b, c in zip(self._ids, self._counts) if lo < b <= nb)
        span = min(now - since, now - (lo + 1) * self._width)
        return count / span if span > 0 else 0.0
