"""Per-camera pipelines: sources → bounded streams with drop policies → an executor → sinks,
with exact frame accounting and per-camera statistics.

A :class:`Pipeline` runs one camera: its :class:`Source` yields :class:`Frame`\\ s into a
bounded :class:`FrameStream` (``drop_oldest``, ``drop_newest`` or ``block``), workers take
them through an optional pre-process, an :class:`Executor` (an orchestrator instance or
pool, or anything with ``async execute(inputs) -> list``), an optional post-process and a
:class:`Sink` (:class:`JsonlSink`, :class:`NpySink`, :class:`MqttSink`, or your own; post-process
with :class:`TopK`). :class:`VideoSource` decodes files, RTSP/HTTP streams and V4L2 devices
(PyAV, the ``video`` extra) on a thread of its own, with :class:`Preprocess` applied there.
:class:`Pipelines` runs many at once in one task group. A :class:`Batcher` stacks the frames of
several cameras into one execute (one member executor per camera). See README.md.
"""

from ._batch import BatchError, Batcher, BatchMember, BatchShare, BatchStatistics
from ._frame import Frame, Result
from ._metrics import Accounting, AccountingError, PipelineStatistics, PipelinesStatistics, RateMeter
from ._pipeline import Executor, FrameDropped, Pipeline, Pipelines, SourceError, keyed
from ._mqtt import MqttSink
from ._post import TopK, load_labels, load_post
from ._sinks import (
    CallbackSink,
    CollectSink,
    JsonlSink,
    NpySink,
    Sink,
    SinkError,
    ThreadedSink,
    jsonable,
    load_sink,
    result_record,
)
from ._sources import (
    ENTRY_POINT_GROUP,
    FramesFile,
    Source,
    SyntheticCamera,
    load_source,
    register_source,
    source_names,
)
from ._pre import MAX_IMAGE_SIDE, Preprocess
from ._stream import DropPolicy, DropReason, FrameStream
from ._video import MAX_FRAME_SIDE, ReconnectPolicy, VideoSource, VideoSourceStatistics

__all__ = [
    "ENTRY_POINT_GROUP",
    "MAX_FRAME_SIDE",
    "MAX_IMAGE_SIDE",
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
    "JsonlSink",
    "MqttSink",
    "NpySink",
    "Frame",
    "FrameDropped",
    "FrameStream",
    "FramesFile",
    "Pipeline",
    "PipelineStatistics",
    "Pipelines",
    "PipelinesStatistics",
    "Preprocess",
    "RateMeter",
    "ReconnectPolicy",
    "Result",
    "Sink",
    "SinkError",
    "Source",
    "SourceError",
    "SyntheticCamera",
    "ThreadedSink",
    "TopK",
    "VideoSource",
    "VideoSourceStatistics",
    "jsonable",
    "keyed",
    "load_labels",
    "load_post",
    "load_sink",
    "load_source",
    "result_record",
    "register_source",
    "source_names",
]
