"""Image pre-processing: resize (letterbox / stretch / center crop), colour order,
normalisation, layout and dtype, from an RGB ``uint8`` ``[H, W, 3]`` image to a model's input
tensor (without the batch dimension)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError

__all__ = ["MAX_IMAGE_SIDE", "Preprocess"]

MAX_IMAGE_SIDE = 8192
"""The largest height or width (pixels) a :class:`Preprocess` accepts, as its ``resize`` or
as an input image, and that a video source decodes: frames from untrusted streams are checked
against it before anything is allocated for them."""

_MODES = ("letterbox", "stretch", "center_crop")
_COLORS = ("rgb", "bgr")
_LAYOUTS = ("nchw", "nhwc")
_DTYPES = ("float32", "uint8")


def _bad(field_name: str, message: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"pre-process: {field_name}: {message}")


def _triple(value: Any, field_name: str, *, positive: bool) -> tuple[float, float, float] | None:
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = (value,) * 3
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 3:
        raise _bad(field_name, f"expected 3 numbers (one per channel, in output channel order), got {value!r}")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise _bad(field_name, f"expected finite numbers, got {value!r}")
        if positive and v <= 0:
            raise _bad(field_name, f"every value must be > 0, got {value!r}")
        out.append(float(v))
    return (out[0], out[1], out[2])


@dataclass(frozen=True)
class Preprocess:
    """Turns an RGB ``uint8`` ``[H, W, 3]`` image into a model input (no batch dimension:
    ``[3, h, w]`` for ``nchw``, ``[h, w, 3]`` for ``nhwc``; a pipeline's executor adapter, or
    ``frame.data[None]``, adds it).

    Steps, in order: resize to ``resize = (h, w)`` (``None``: keep the size) by ``mode`` —
    ``"stretch"`` (to exactly h x w, aspect not kept), ``"letterbox"`` (scaled to fit inside,
    aspect kept, centred, the rest filled with ``pad``), ``"center_crop"`` (scaled to cover,
    aspect kept, the centre cut out); channel order ``color``; then for ``dtype="float32"``
    ``(pixel * scale - mean) / std`` per channel (``mean``/``std`` in the order of the *output*
    channels, on the scaled values: the default ``scale = 1/255`` gives 0..1); ``uint8`` keeps
    the pixels as they are (``mean``/``std`` are refused). Resizing here is bilinear with
    half-pixel centres (no anti-aliasing filter when shrinking); a
    :class:`~orchestra.pipeline.VideoSource` does the resize with the decoder's own scaler
    instead (FFmpeg's bilinear, which also filters when shrinking) and only the rest in numpy.

    Raises:
        InvalidArgumentError: a field is wrong; the message names it.
    """

    resize: tuple[int, int] | None = None
    mode: str = "letterbox"
    color: str = "rgb"
    mean: tuple[float, float, float] | None = None
    std: tuple[float, float, float] | None = None
    layout: str = "nchw"
    dtype: str = "float32"
    scale: float = 1.0 / 255.0
    pad: int = 0
    _mean: np.ndarray | None = field(init=False, repr=False, compare=False, default=None)
    _inv_std: np.ndarray | None = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        resize = self.resize
        if resize is not None:
            if isinstance(resize, (str, bytes)) or not isinstance(resize, Sequence) or len(resize) != 2 or any(
                    isinstance(v, bool) or not isinstance(v, int) for v in resize):
                raise _bad("resize", f"expected [height, width] (two ints) or None, got {resize!r}")
            if not all(1 <= v <= MAX_IMAGE_SIDE for v in resize):
                raise _bad("resize", f"height and width must be in 1..{MAX_IMAGE_SIDE}, got {list(resize)}")
            object.__setattr__(self, "resize", (int(resize[0]), int(resize[1])))
        for name, allowed in (("mode", _MODES), ("color", _COLORS), ("layout", _LAYOUTS), ("dtype", _DTYPES)):
            value = getattr(self, name)
            if value not in allowed:
                raise _bad(name, f"expected one of {', '.join(map(repr, allowed))}, got {value!r}")
        mean = _triple(self.mean, "mean", positive=False)
        std = _triple(self.std, "std", positive=True)
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)
        if self.dtype == "uint8" and (mean is not None or std is not None):
            raise _bad("mean" if mean is not None else "std", "only with dtype 'float32' (uint8 output keeps the pixels)")
        if isinstance(self.scale, bool) or not isinstance(self.scale, (int, float)) or not (
                math.isfinite(self.scale) and self.scale > 0):
            raise _bad("scale", f"expected a finite number > 0, got {self.scale!r}")
        object.__setattr__(self, "scale", float(self.scale))
        if isinstance(self.pad, bool) or not isinstance(self.pad, int) or not 0 <= self.pad <= 255:
            raise _bad("pad", f"expected an int in 0..255, got {self.pad!r}")
        if mean is not None:
            object.__setattr__(self, "_mean", np.asarray(mean, np.float32))
        if std is not None:
            object.__setattr__(self, "_inv_std", (1.0 / np.asarray(std, np.float64)).astype(np.float32))

    # --- shapes ---------------------------------------------------------------------------

    def output_shape(self, input_hw: tuple[int, int] | None = None) -> tuple[int, ...]:
        """The shape of one output (no batch dimension). Without ``resize`` the input's
        ``(height, width)`` decides; give it as ``input_hw`` (else InvalidArgumentError)."""
        if self.resize is not None:
            h, w = self.resize
        elif input_hw is not None:
            h, w = int(input_hw[0]), int(input_hw[1])
        else:
            raise _bad("resize", "not set: the output size is the input's, so give input_hw to output_shape()")
        return (3, h, w) if self.layout == "nchw" else (h, w, 3)

    def mismatch(self, shape: Sequence[int], dtype: Any, input_hw: tuple[int, int] | None = None, *,
                 batch: int | None = 1) -> str | None:
        """Why this pre-process's output can't feed an input of ``shape`` and ``dtype`` (a
        method's input: with a leading batch dimension of ``batch``, or none; ``batch=None``:
        any batch size, for frames stacked by a batcher), or None when it can. Without
        ``resize`` and ``input_hw``, only the channel dimension and dtype are checked."""
        try:
            want = tuple(int(s) for s in shape)
        except (TypeError, ValueError):
            return f"input shape {shape!r} is not a tuple of ints"
        try:
            dt = np.dtype(dtype)
        except TypeError:
            return f"input dtype {dtype!r} is not a dtype"
        given = f"{dt} {list(want)}"
        if dt != np.dtype(self.dtype):
            return f"makes {self.dtype}, the input is {given}"
        if len(want) == 4:
            if batch is not None and want[0] != batch:
                return f"makes one image (batch {batch}), the input's batch dimension is {want[0]}: {given}"
            want = want[1:]
        if len(want) != 3:
            return f"makes a 3-D image ({self.layout}, plus a batch dimension of 1), the input is {given}"
        if self.resize is None and input_hw is None:
            channels = want[0] if self.layout == "nchw" else want[2]
            if channels != 3:
                return f"makes 3 channels ({self.layout}), the input is {given}"
            return None
        got = self.output_shape(input_hw)
        if got != want:
            return f"makes {list(got)} ({self.layout}, plus a batch dimension of 1), the input is {given}"
        return None

    def check_against(self, shape: Sequence[int], dtype: Any, input_hw: tuple[int, int] | None = None, *,
                      batch: int | None = 1) -> None:
        """Raises InvalidArgumentError with :meth:`mismatch`'s reason, if there is one."""
        problem = self.mismatch(shape, dtype, input_hw, batch=batch)
        if problem is not None:
            raise InvalidArgumentError(f"pre-process: {problem}")

    def scaled_size(self, height: int, width: int) -> tuple[int, int]:
        """The ``(h, w)`` an ``height x width`` image is scaled to before padding (letterbox)
        or cropping (center_crop); the output size for stretch; the input size without resize.

        Raises:
            InvalidArgumentError: center_crop would scale the image past ``MAX_IMAGE_SIDE``.
        """
        if self.resize is None:
            return height, width
        th, tw = self.resize
        if self.mode == "stretch":
            return th, tw
        if self.mode == "letterbox":
            s = min(th / height, tw / width)
            return min(th, max(1, round(height * s))), min(tw, max(1, round(width * s)))
        s = max(th / height, tw / width)
        sh, sw = max(th, round(height * s)), max(tw, round(width * s))
        if sh > MAX_IMAGE_SIDE or sw > MAX_IMAGE_SIDE:  # a very thin picture: bound what is allocated
            raise InvalidArgumentError(
                f"pre-process: center_crop of a {height}x{width} image to {th}x{tw} would scale it to {sh}x{sw}, "
                f"more than {MAX_IMAGE_SIDE} per side")
        return sh, sw

    # --- the work -------------------------------------------------------------------------

    def __call__(self, image: np.ndarray) -> np.ndarray:
        """``image``: RGB ``uint8`` ``[H, W, 3]``. Returns the model input (see the class)."""
        image = self._check_image(image)
        h, w = self.scaled_size(image.shape[0], image.shape[1])
        if (h, w) != image.shape[:2]:
            image = resize_bilinear(image, h, w)
        return self.finish(image, color_done=False)

    def finish(self, scaled: np.ndarray, *, color_done: bool) -> np.ndarray:
        """The steps after the resize, for an image already at :meth:`scaled_size`: pad or
        crop, colour order (unless ``color_done``: already in ``color`` order), normalise,
        layout. A video source calls this after scaling with the decoder."""
        image = scaled
        if self.resize is not None and self.mode != "stretch":
            th, tw = self.resize
            h, w = image.shape[:2]
            if self.mode == "letterbox":
                if (h, w) != (th, tw):
                    out = np.full((th, tw, 3), self.pad, np.uint8)
                    top, left = (th - h) // 2, (tw - w) // 2
                    out[top:top + h, left:left + w] = image
                    image = out
            else:
                top, left = (h - th) // 2, (w - tw) // 2
                image = image[top:top + th, left:left + tw]
        if self.color == "bgr" and not color_done:
            image = image[..., ::-1]
        if self.dtype == "float32":
            out_f = image.astype(np.float32)
            out_f *= np.float32(self.scale)
            if self._mean is not None:
                out_f -= self._mean
            if self._inv_std is not None:
                out_f *= self._inv_std
            result = out_f
        else:
            result = image
        if self.layout == "nchw":
            result = result.transpose(2, 0, 1)
        return np.ascontiguousarray(result)

    @staticmethod
    def _check_image(image: Any) -> np.ndarray:
        if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            what = f"{image.dtype} {list(image.shape)}" if isinstance(image, np.ndarray) else type(image).__name__
            raise InvalidArgumentError(f"pre-process: expected an RGB uint8 image [H, W, 3], got {what}")
        if not (1 <= image.shape[0] <= MAX_IMAGE_SIDE and 1 <= image.shape[1] <= MAX_IMAGE_SIDE):
            raise InvalidArgumentError(
                f"pre-process: image {image.shape[0]}x{image.shape[1]} is outside 1..{MAX_IMAGE_SIDE} per side")
        return image


def _axis_weights(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each output index: the two input indices and the weight of the second
    (half-pixel centres, clamped at the edges)."""
    x = (np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5
    x = np.clip(x, 0.0, n_in - 1)
    i0 = np.floor(x).astype(np.intp)
    i1 = np.minimum(i0 + 1, n_in - 1)
    return i0, i1, (x - i0).astype(np.float32)


def resize_bilinear(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize of a ``uint8`` ``[H, W, C]`` image to ``[height, width, C]`` (half-pixel
    centres, edges clamped, rounded to nearest)."""
    y0, y1, wy = _axis_weights(image.shape[0], height)
    x0, x1, wx = _axis_weights(image.shape[1], width)
    src = image.astype(np.float32)
    rows = src[y0] * (1 - wy)[:, None, None] + src[y1] * wy[:, None, None]
    out = rows[:, x0] * (1 - wx)[None, :, None] + rows[:, x1] * wx[None, :, None]
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)
