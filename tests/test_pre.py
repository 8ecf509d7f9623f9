"""orchestra.pipeline.Preprocess against references computed here, independently: a per-pixel
bilinear resize made of 1-D ``np.interp`` passes, letterbox/crop geometry from first principles, and
(through VideoSource) FFmpeg's scaler on the decoder thread compared with the same reference
on the pictures a lossless video was made from."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from orchestra.errors import InvalidArgumentError
from orchestra.pipeline import MAX_IMAGE_SIDE, Preprocess


def reference_bilinear(image: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """The textbook bilinear resize, as two passes of 1-D linear interpolation (``np.interp``,
    which holds the end values outside the samples): each output pixel's centre is mapped back
    to the input (half-pixel centres) and sampled there."""
    in_h, in_w = image.shape[:2]
    xs = (np.arange(out_w) + 0.5) * in_w / out_w - 0.5
    ys = (np.arange(out_h) + 0.5) * in_h / out_h - 0.5
    img = image.astype(np.float64)
    rows = np.empty((in_h, out_w, img.shape[2]))
    for r in range(in_h):
        for c in range(img.shape[2]):
            rows[r, :, c] = np.interp(xs, np.arange(in_w), img[r, :, c])
    out = np.empty((out_h, out_w, img.shape[2]))
    for j in range(out_w):
        for c in range(img.shape[2]):
            out[:, j, c] = np.interp(ys, np.arange(in_h), rows[:, j, c])
    return out


def reference(image: np.ndarray, resize: tuple[int, int], mode: str, pad: int = 0) -> np.ndarray:
    """Letterbox / stretch / center-crop geometry done the obvious way, float result."""
    th, tw = resize
    h, w = image.shape[:2]
    img = image.astype(np.float64)
    if mode == "stretch":
        return reference_bilinear(img, th, tw)
    if mode == "letterbox":
        s = min(th / h, tw / w)
        sh, sw = round(h * s), round(w * s)
        canvas = np.full((th, tw, 3), float(pad))
        top, left = (th - sh) // 2, (tw - sw) // 2
        canvas[top:top + sh, left:left + sw] = reference_bilinear(img, sh, sw)
        return canvas
    s = max(th / h, tw / w)
    sh, sw = max(th, round(h * s)), max(tw, round(w * s))
    big = reference_bilinear(img, sh, sw)
    top, left = (sh - th) // 2, (sw - tw) // 2
    return big[top:top + th, left:left + tw]


def within_a_level(got: np.ndarray, want: np.ndarray) -> None:
    diff = np.abs(got.astype(np.float64) - want)
    assert diff.max() <= 1.0, f"max difference {diff.max()} at {np.unravel_index(diff.argmax(), diff.shape)}"


@pytest.fixture
def image() -> np.ndarray:
    return np.random.default_rng(7).integers(0, 256, (37, 53, 3), dtype=np.uint8)


@pytest.mark.parametrize("mode", ["stretch", "letterbox", "center_crop"])
@pytest.mark.parametrize("resize", [(20, 30), (64, 48), (37, 53), (50, 50)])
def test_resize_modes_match_the_reference(image: np.ndarray, mode: str, resize: tuple[int, int]) -> None:
    pre = Preprocess(resize=resize, mode=mode, dtype="uint8", layout="nhwc", pad=114)
    got = pre(image)
    assert got.shape == (*resize, 3) and got.dtype == np.uint8
    within_a_level(got, reference(image, resize, mode, pad=114))


def test_letterbox_places_the_picture_in_the_middle() -> None:
    img = np.full((240, 320, 3), 200, np.uint8)
    got = Preprocess(resize=(224, 224), mode="letterbox", dtype="uint8", layout="nhwc")(img)
    # 240x320 scaled by 0.7 = 168x224, 28 rows of padding above and below
    assert (got[:28] == 0).all() and (got[196:] == 0).all() and (got[28:196] == 200).all()


def test_normalisation_colour_and_layout(image: np.ndarray) -> None:
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    pre = Preprocess(resize=(32, 40), mode="stretch", color="bgr", mean=mean, std=std, layout="nchw")
    got = pre(image)
    assert got.shape == (3, 32, 40) and got.dtype == np.float32 and got.flags.c_contiguous
    pixels = np.rint(reference(image, (32, 40), "stretch"))[..., ::-1]          # BGR
    want = ((pixels / 255.0 - np.array(mean)) / np.array(std)).transpose(2, 0, 1)
    # one uint8 level of the resize, through the normalisation
    assert np.abs(got - want).max() <= 1 / 255 / min(std) + 1e-5
    # no resize: the image's own size; default scale to 0..1
    plain = Preprocess(resize=None, layout="nhwc")(image)
    np.testing.assert_allclose(plain, image / 255.0, rtol=1e-6)
    assert Preprocess(resize=None, dtype="uint8", color="bgr", layout="nhwc")(image).tolist() == \
        image[..., ::-1].tolist()
    scaled = Preprocess(resize=None, scale=1.0, mean=(123.675, 116.28, 103.53), std=1.0, layout="nhwc")(image)
    np.testing.assert_allclose(scaled, image - np.array([123.675, 116.28, 103.53]), rtol=1e-5, atol=1e-4)


def test_shapes_and_checks_against_a_method_input() -> None:
    pre = Preprocess(resize=(224, 224))
    assert pre.output_shape() == (3, 224, 224)
    assert Preprocess(resize=(224, 320), layout="nhwc").output_shape() == (224, 320, 3)
    assert pre.mismatch((1, 3, 224, 224), "float32") is None
    assert pre.mismatch((3, 224, 224), np.float32) is None
    assert pre.mismatch((1, 3, 256, 256), "float32") == \
        "makes [3, 224, 224] (nchw, plus a batch dimension of 1), the input is float32 [1, 3, 256, 256]"
    assert "uint8" in pre.mismatch((1, 3, 224, 224), "uint8")
    assert "batch dimension is 8" in pre.mismatch((8, 3, 224, 224), "float32")
    assert pre.mismatch((8, 3, 224, 224), "float32", batch=None) is None
    with pytest.raises(InvalidArgumentError, match=r"^pre-process: makes .*\[1, 224, 224, 3\]"):
        pre.check_against((1, 224, 224, 3), "float32")
    unsized = Preprocess(resize=None, dtype="uint8", layout="nhwc")
    assert unsized.mismatch((1, 480, 640, 3), "uint8") is None
    assert unsized.mismatch((1, 480, 640, 3), "uint8", input_hw=(240, 320)) is not None
    with pytest.raises(InvalidArgumentError, match="resize"):
        unsized.output_shape()
    assert unsized.output_shape((240, 320)) == (240, 320, 3)


@pytest.mark.parametrize(("fields", "name"), [
    ({"resize": (0, 10)}, "resize"),
    ({"resize": (10, MAX_IMAGE_SIDE + 1)}, "resize"),
    ({"resize": [224]}, "resize"),
    ({"resize": (2.5, 3)}, "resize"),
    ({"mode": "fit"}, "mode"),
    ({"color": "yuv"}, "color"),
    ({"layout": "chw"}, "layout"),
    ({"dtype": "float16"}, "dtype"),
    ({"mean": (1, 2)}, "mean"),
    ({"mean": "abc"}, "mean"),
    ({"std": (1, 0, 1)}, "std"),
    ({"std": (1, float("nan"), 1)}, "std"),
    ({"dtype": "uint8", "mean": (0, 0, 0)}, "mean"),
    ({"scale": 0}, "scale"),
    ({"pad": 256}, "pad"),
])
def test_bad_fields_are_named(fields: dict[str, Any], name: str) -> None:
    with pytest.raises(InvalidArgumentError, match=f"pre-process: {name}: "):
        Preprocess(**fields)


def test_a_thin_image_is_not_scaled_past_the_cap() -> None:
    pre = Preprocess(resize=(224, 224), mode="center_crop")
    with pytest.raises(InvalidArgumentError, match=f"2x4000 .* more than {MAX_IMAGE_SIDE} per side"):
        pre(np.zeros((2, 4000, 3), np.uint8))


def test_bad_images_are_refused() -> None:
    pre = Preprocess(resize=(8, 8))
    for bad in (np.zeros((4, 4, 3), np.float32), np.zeros((4, 4), np.uint8), np.zeros((4, 4, 4), np.uint8), [1, 2]):
        with pytest.raises(InvalidArgumentError, match="RGB uint8 image"):
            pre(bad)  # type: ignore[arg-type]


# --- on the decoder thread, resized by FFmpeg's scaler -----------------------------------------

@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize(("resize", "mode", "color"), [
    ((224, 224), "letterbox", "rgb"), ((224, 224), "stretch", "bgr"), ((224, 224), "center_crop", "rgb"),
    ((480, 640), "stretch", "rgb"), ((100, 120), "center_crop", "bgr")])
async def test_video_source_pre_matches_the_reference(tmp_path: Path, resize: tuple[int, int], mode: str,
                                                      color: str) -> None:
    av = pytest.importorskip("av")
    from orchestra.pipeline import VideoSource

    h, w = 240, 320
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)

    def picture(i: int) -> np.ndarray:  # smooth, so that the scaler's filter choice doesn't matter
        return np.rint(np.stack([x * 200 / w + 20, y * 180 / h + 30 + i, (x + y) * 100 / (w + h) + 2 * i],
                                -1)).astype(np.uint8)

    path = tmp_path / "lossless.mkv"
    with av.open(str(path), "w") as out:   # lossless RGB: decoded frames are exactly picture(i)
        stream = out.add_stream("ffv1", rate=30)
        stream.width, stream.height, stream.pix_fmt = w, h, "bgr0"
        for i in range(4):
            for packet in stream.encode(av.VideoFrame.from_ndarray(picture(i), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    pre = Preprocess(resize=resize, mode=mode, color=color, dtype="uint8", layout="nhwc")
    src = VideoSource("cam", path, realtime=False, pre=pre)
    n = 0
    async with aclosing(src.frames()) as frames:
        async for frame in frames:
            assert frame.data.shape == (*resize, 3)
            want = reference(picture(frame.index), resize, mode)
            within_a_level(frame.data, want[..., ::-1] if color == "bgr" else want)
            n += 1
    assert n == 4
