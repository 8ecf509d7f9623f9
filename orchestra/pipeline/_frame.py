"""The values that flow through a pipeline: :class:`Frame` in, :class:`Result` out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Frame", "Result"]


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame of one camera.

    Attributes:
        camera: the source's name.
        index: the frame's number at its source, from 0, one more per frame produced (a
            frame dropped later keeps its number, so gaps in a sink's indices are drops).
        data: the pixels (or any array); the pipeline never copies or writes it.
        t_capture: when it was captured, in seconds of the source's clock (``time.monotonic``
            unless the source says otherwise); latencies are measured from here.
        pts: the source's own presentation timestamp in seconds (a video stream's pts), carried
            unchanged to the sink; None when the source has none (synthetic frames, files of
            arrays).
    """

    camera: str
    index: int
    data: np.ndarray
    t_capture: float
    pts: float | None = None

    def __repr__(self) -> str:
        d = self.data
        return (f"Frame(camera={self.camera!r}, index={self.index}, data=<{d.dtype} {tuple(d.shape)}>, "
                f"t_capture={self.t_capture:.6f}"
                + (f", pts={self.pts:.6f})" if self.pts is not None else ")"))


@dataclass(frozen=True, slots=True)
class Result:
    """What a sink receives for each processed frame.

    Attributes:
        frame: the frame it came from.
        outputs: what the executor returned for it.
        value: what the post-process returned (``outputs`` when there is none).
        t_done: when the result reached the sink, on the frame's clock.
        options: the runtime options in force for the execute that made it (backend name ->
            that backend's options), when the executor returned them (an object with
            ``outputs`` and ``options`` attributes, such as the orchestrator's
            ``Execution``); None when it returned a plain list.
    """

    frame: Frame
    outputs: list[Any]
    value: Any
    t_done: float
    options: Mapping[str, Any] | None = None

    @property
    def latency(self) -> float:
        """Seconds from capture to the sink."""
        return self.t_done - self.frame.t_capture
