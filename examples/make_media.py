"""Writes the example videos in ``examples/media/`` (needs the ``video`` extra: PyAV).

``traffic.mp4``: 4 seconds of a synthetic street scene at 320x240, 30 fps (MPEG-4 Part 2, so
any FFmpeg build decodes it): a sky/road gradient with coloured boxes ("cars") driving across
at different speeds and a frame counter bar along the bottom, so consecutive frames differ
and a decoder's output can be checked by eye. The main job (``examples/cameras.toml``) loops
it on every camera.

Run from anywhere: ``python examples/make_media.py``.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np

MEDIA = pathlib.Path(__file__).resolve().parent / "media"
WIDTH, HEIGHT, FPS, SECONDS = 320, 240, 30, 4

# (row, height, width, speed in px/frame, rgb) of each car
CARS = (
    (120, 28, 60, 3, (200, 30, 30)),
    (150, 30, 70, -2, (30, 90, 210)),
    (185, 34, 80, 5, (240, 200, 40)),
    (205, 26, 50, -4, (40, 170, 60)),
)


def frame(k: int) -> np.ndarray:
    """Frame ``k`` of the scene, ``uint8 [HEIGHT, WIDTH, 3]`` RGB."""
    img = np.empty((HEIGHT, WIDTH, 3), np.uint8)
    rows = np.arange(HEIGHT, dtype=np.float32)[:, None]
    sky = rows < 110
    img[..., 0] = np.where(sky, 90 + rows * 0.8, 70).astype(np.uint8)
    img[..., 1] = np.where(sky, 140 + rows * 0.6, 70).astype(np.uint8)
    img[..., 2] = np.where(sky, 220, 75).astype(np.uint8)
    img[168:172:, (np.arange(WIDTH) // 20) % 2 == 0] = 230                 # lane markings
    for row, h, w, speed, rgb in CARS:
        x = (k * speed) % (WIDTH + w) - w
        lo, hi = max(x, 0), min(x + w, WIDTH)
        if hi > lo:
            img[row - h // 2: row + h // 2, lo:hi] = rgb
    img[HEIGHT - 6:, : (k * WIDTH) // (FPS * SECONDS)] = 255              # progress bar
    return img


def main() -> int:
    try:
        import av
    except ImportError:
        print("PyAV is not installed: pip install 'orchestra[video]'")
        return 1
    MEDIA.mkdir(exist_ok=True)
    path = MEDIA / "traffic.mp4"
    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        stream.bit_rate = 300_000
        for k in range(FPS * SECONDS):
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame(k), format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
