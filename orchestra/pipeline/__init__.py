"""Per-camera pipelines: sources → bounded streams with drop policies → an executor → sinks,
with exact frame accounting and per-camera statistics.

A :class:`Pipeline` runs one camera: its :class:`Source` yields :class:`Frame`\\ s into a
bounded :class:`FrameStream` (``drop_oldest``, ``drop_newest`` or ``block``), workers take
them through an optional pre-process, an :class:`Executor` (an orchestrator instance or
pool, or anything with ``async execute(inputs) -> list``), an optional post-process and a
:class:`Sink`. :class:`Pipelines` runs many at once in one task group. A :class:`Batcher` stacks the
frames of several cameras into one execute (one member executor per camera). See README.md.
"""

from ._batch import BatchError, Batcher, BatchMember, BatchShare, BatchStatistics
from ._frame import Frame, Result
from ._metrics import Accounting, AccountingError, PipelineStatistics, PipelinesStatistics, RateMeter
from ._pipeline import Executor, FrameDropped, Pipeline, Pipelines, SourceError, keyed
from ._sinks import CallbackSink, CollectSink, Sink
from ._sources import (
    ENTRY_POINT_GROUP,
    FramesFile,
    Source,
    SyntheticCamera,
    load_source,
    register_source,
    source_names,
)
from ._stream import DropPolicy, DropReason, FrameStream

__all__ = [
    "ENTRY_POINT_GROUP",
    "Accounting",
    "AccountingError",
    "BatchError",
    "BatchMember",
    "BatchShare",
    "BatchStatistics",
    "Batcher",
    "CallbackSink",
    "CollectSink",
    "DropPolicy",
    "DropReason",
    "Executor",
    "Frame",
    "FrameDropped",
    "FrameStream",
    "FramesFile",
    "Pipeline",
    "PipelineStatistics",
    "Pipelines",
    "PipelinesStatistics",
    "RateMeter",
    "Result",
    "Sink",
    "Source",
    "SourceError",
    "SyntheticCamera",
    "keyed",
    "load_source",
    "register_source",
    "source_names",
]
