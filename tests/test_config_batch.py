"""``[[batch]]`` in the TOML config: its one-line, path-first errors, what it loads into, and
``orchestra run`` batching cameras for real (the summary shows the batch-size distribution).

Programs: ``dynamic_batch.pte`` (input 0 ``[8, 2, 6, 6]``, a dynamic batch up to 8),
``mlp.pte`` (input 0 ``[2, 16]``, a fixed batch of 2) and ``convnet.pte`` (``[1, 3, 16, 16]``:
no batch to fill), all real ExecuTorch exports from the committed fixtures.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from orchestra.config import BatchConfig, ConfigError, load_config, validate_config

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"

PROGRAMS = """
[[program]]
name = "dyn"
path = "models/dynamic_batch.pte"

[[program]]
name = "mlp"
path = "models/mlp.pte"

[[program]]
name = "conv"
path = "models/convnet.pte"
"""


def camera(name: str, program: str = "dyn", source: str = 'source = { kind = "synthetic", fps = 30 }') -> str:
    return f'\n[[camera]]\nname = "{name}"\nprogram = "{program}"\n{source}\n'


DYN4 = "".join(camera(n) for n in ("a", "b", "c", "d"))
MLP2 = "".join(camera(n, "mlp") for n in ("m1", "m2"))
CONV = camera("k", "conv")
BASE = PROGRAMS + DYN4 + MLP2 + CONV
WHERE_DYN = "method 'forward' of models/dynamic_batch.pte"
BATCH_KEYS = "name, cameras, max_size, max_wait_ms, static_batch"


@pytest.fixture
def folder(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "models").mkdir()
    for name in ("dynamic_batch.pte", "mlp.pte"):
        shutil.copy(FIXTURES / name, tmp_path / "models" / name)
    shutil.copy(ROOT / "examples" / "models" / "convnet.pte", tmp_path / "models" / "convnet.pte")
    return tmp_path


def write(folder: pathlib.Path, text: str) -> pathlib.Path:
    path = folder / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


CASES: list[tuple[str, str, list[str]]] = [
    ("not an array of tables", "batch = 3\n" + BASE,
     ["batch: must be an array of tables ([[batch]]), got 3"]),
    ("unknown key with a hint", BASE + '\n[[batch]]\ncameras = ["a", "b"]\nmaxsize = 2\n',
     [f"batch[0].maxsize: unknown key (known keys: {BATCH_KEYS}); did you mean 'max_size'?"]),
    ("cameras missing", BASE + "\n[[batch]]\nmax_size = 2\n",
     ['batch[0].cameras: missing (required): the cameras to batch, e.g. cameras = ["front", "rear"]']),
    ("cameras not a list of names", BASE + '\n[[batch]]\ncameras = "a"\n',
     ['batch[0].cameras: must be a non-empty array of camera names, got "a"']),
    ("an unknown camera", BASE + '\n[[batch]]\ncameras = ["a", "bb"]\n',
     ["batch[0].cameras: no camera named 'bb' (cameras: a, b, c, d, m1, m2, k)"]),
    ("an unknown camera with a hint", BASE + '\n[[batch]]\ncameras = ["a", "m11"]\n',
     ["batch[0].cameras: no camera named 'm11' (cameras: a, b, c, d, m1, m2, k); did you mean 'm1'?"]),
    ("a camera listed twice", BASE + '\n[[batch]]\ncameras = ["a", "b", "a"]\n',
     ["batch[0].cameras: lists camera 'a' twice"]),
    ("a camera in two batches", BASE + '\n[[batch]]\ncameras = ["a", "b"]\n\n[[batch]]\ncameras = ["c", "b"]\n',
     ["batch[1].cameras: camera 'b' is already in batch[0]: a camera is in at most one batch"]),
    ("cameras of two programs", BASE + '\n[[batch]]\ncameras = ["a", "m1"]\n',
     ["batch[0].cameras: cameras of one batch must share one program (a -> dyn, m1 -> mlp)"]),
    ("duplicate batch names", BASE + '\n[[batch]]\nname = "x"\ncameras = ["a"]\n\n[[batch]]\nname = "x"\ncameras = ["b"]\n',
     ["batch[1].name: duplicate batch name 'x' (also batch[0])"]),
    ("max_size beyond the dynamic bound", BASE + '\n[[batch]]\ncameras = ["a", "b"]\nmax_size = 9\n',
     [f"batch[0].max_size: 9 is more than the batch bound of {WHERE_DYN} (input 0 is [8, 2, 6, 6], dynamic; "
      f"sizes are upper bounds)"]),
    ("static_batch beyond the dynamic bound", BASE + '\n[[batch]]\ncameras = ["a", "b"]\nstatic_batch = 16\n',
     [f"batch[0].static_batch: 16 is more than the batch bound of {WHERE_DYN} (input 0 is [8, 2, 6, 6], dynamic; "
      f"sizes are upper bounds)"]),
    ("a fixed batch needs static_batch", BASE + '\n[[batch]]\ncameras = ["m1", "m2"]\n',
     ["batch[0]: method 'forward' of models/mlp.pte takes batches of exactly 2 (input 0 is [2, 16]): set "
      "static_batch = 2 to pad partial batches"]),
    ("static_batch other than the program's", BASE + '\n[[batch]]\ncameras = ["m1", "m2"]\nstatic_batch = 4\n',
     ["batch[0].static_batch: 4 does not match method 'forward' of models/mlp.pte, whose input 0 is [2, 16] (batch 2)"]),
    ("max_size over static_batch", BASE + '\n[[batch]]\ncameras = ["a", "b", "c"]\nmax_size = 3\nstatic_batch = 2\n',
     ["batch[0].max_size: 3 is more than static_batch (2): a batch can't hold more frames than rows"]),
    ("a program with no batch to fill", BASE + '\n[[batch]]\ncameras = ["k"]\n',
     ["batch[0]: method 'forward' of models/convnet.pte takes batches of exactly 1 (input 0 is [1, 3, 16, 16]): "
      "export it with a batch dimension (torch.export.Dim) or a fixed batch >= max_size"]),
    ("bad values", BASE + '\n[[batch]]\ncameras = ["a"]\nmax_size = 0\nmax_wait_ms = -1\nstatic_batch = "2"\n',
     ["batch[0].max_size: must be a positive integer, got 0",
      "batch[0].max_wait_ms: must be a number >= 0, got -1",
      'batch[0].static_batch: must be a positive integer, got "2"']),
    ("a batched camera's frames have one row", PROGRAMS
     + camera("a", source='source = { kind = "synthetic", fps = 30, shape = [8, 2, 6, 6] }') + camera("b")
     + '\n[[batch]]\ncameras = ["a", "b"]\n',
     ["camera[0].source.shape: [8, 2, 6, 6] does not match input 0 of forward ([1, 2, 6, 6])"]),
    ("a batched camera of a fixed-batch program sends one row", PROGRAMS
     + camera("m1", "mlp", 'source = { kind = "synthetic", fps = 30, shape = [2, 16] }') + camera("m2", "mlp")
     + '\n[[batch]]\ncameras = ["m1", "m2"]\nstatic_batch = 2\n',
     ["camera[0].source.shape: [2, 16] does not match input 0 of forward ([1, 16])"]),
]


@pytest.mark.parametrize("text,expected", [pytest.param(t, e, id=n) for n, t, e in CASES])
def test_invalid_batch_tables(folder: pathlib.Path, text: str, expected: list[str]) -> None:
    path = write(folder, text)
    assert validate_config(path) == expected
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert list(info.value.errors) == expected


def test_a_valid_batch_loads_with_defaults_and_per_frame_sources(folder: pathlib.Path) -> None:
    text = (BASE + '\n[[batch]]\nname = "row"\ncameras = ["a", "b", "c"]\nmax_wait_ms = 25\n'
            + '\n[[batch]]\ncameras = ["m1", "m2"]\nstatic_batch = 2\n'
            + '\n[[batch]]\ncameras = ["d"]\nmax_size = 1\n')
    cfg = load_config(write(folder, text))
    assert cfg.batches == (
        BatchConfig("row", ("a", "b", "c"), "dyn", max_size=3, max_wait_s=0.025, static_batch=None),
        BatchConfig("batch1", ("m1", "m2"), "mlp", max_size=2, max_wait_s=0.01, static_batch=2),
        BatchConfig("batch2", ("d",), "dyn", max_size=1, max_wait_s=0.01, static_batch=None),
    )
    shapes = {c.name: tuple(c.source.params["shape"]) for c in cfg.cameras}
    assert shapes == {"a": (1, 2, 6, 6), "b": (1, 2, 6, 6), "c": (1, 2, 6, 6), "d": (1, 2, 6, 6),
                      "m1": (1, 16), "m2": (1, 16), "k": (1, 3, 16, 16)}
    assert cfg.warnings == ("batch[2].cameras: one camera: its frames have nothing to batch with",)
    b = cfg.batches[0].build(object.__new__(type("E", (), {"execute": lambda self, x: x})))
    assert (b.name, b.max_size, b.max_wait_s, b.static_batch) == ("row", 3, 0.025, None)
    # without [[batch]], the cameras' sources default to the method's input as before
    plain = load_config(write(folder, BASE))
    assert plain.batches == () and tuple(plain.cameras[0].source.params["shape"]) == (8, 2, 6, 6)


RUN = """
[[program]]
name = "dyn"
path = "models/dynamic_batch.pte"

[[program]]
name = "mlp"
path = "models/mlp.pte"
""" + "".join(camera(n, source=f'source = {{ kind = "synthetic", fps = 400, count = 40, seed = {k} }}\ndrop = "block"\n'
                     + ('placement = "process"\n' if k % 2 else ""))
              for k, n in enumerate(("a", "b", "c", "d", "e"))) + "".join(
    camera(n, "mlp", f'source = {{ kind = "synthetic", fps = 400, count = 30, seed = {k} }}\ndrop = "block"\n')
    for k, n in enumerate(("m1", "m2", "m3"))) + """
[[batch]]
name = "dyn4"
cameras = ["a", "b", "c", "d", "e"]
max_size = 4
max_wait_ms = 20

[[batch]]
name = "mlp2"
cameras = ["m1", "m2", "m3"]
max_size = 2
static_batch = 2
"""


def test_orchestra_run_batches_cameras_and_shows_the_batch_sizes(folder: pathlib.Path) -> None:
    """A real run: five cameras (thread and process placement) in batches of up to 4 on the
    dynamic-batch program, three padded to the mlp's fixed batch of 2; every frame processed,
    the summary's batch table adds up."""
    path = write(folder, RUN)
    env = dict(os.environ, PYTHONIOENCODING="utf-8", NO_COLOR="1")
    r = subprocess.run([sys.executable, "-m", "orchestra", "run", str(path), "--no-dashboard"], capture_output=True,
                       text=True, encoding="utf-8", env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "accounting: produced = processed + dropped + failed for every camera" in out
    lines = out.splitlines()
    for cam, n in (("a", 40), ("b", 40), ("c", 40), ("d", 40), ("e", 40), ("m1", 30), ("m2", 30), ("m3", 30)):
        row = next(line for line in lines if line.startswith(cam + " "))
        assert re.search(rf"^{cam}\s+block\s+{n}\s+{n}\s+0\s+0\s", row), row
    start = lines.index("batches (frames per execute: size x batches)")
    table = {}
    for line in lines[start + 2:]:
        if not line.strip():
            break
        cells = re.split(r"\s{2,}", line.strip())
        table[cells[0]] = cells
    assert set(table) == {"dyn4", "mlp2"}
    for name, members, frames, most in (("dyn4", 5, 200, 4), ("mlp2", 3, 90, 2)):
        _, m, batches, fr, _mean, _wait, failed, sizes = table[name]
        assert (int(m), int(fr), int(failed)) == (members, frames, 0)
        hist = {int(k): int(v) for k, v in (s.split("x") for s in sizes.split())}
        assert sum(k * v for k, v in hist.items()) == frames and sum(hist.values()) == int(batches)
        assert max(hist) <= most
    assert max(int(k) for k in table["dyn4"][7].replace("x", " ").split()[::2]) > 1  # frames did share executes
    # each batch ran on one of its cameras' instances: those executes add up to the batches
    start = lines.index("instances")
    head = re.split(r"\s{2,}", lines[start + 1].strip())
    executes = {}
    for line in lines[start + 2:]:
        if not line.strip():
            break
        cells = dict(zip(head, re.split(r"\s{2,}", line.strip())))
        executes[cells["instance"]] = int(cells["executes"])
    assert sum(executes[c] for c in "abcde") == int(table["dyn4"][2])
    assert sum(executes[c] for c in ("m1", "m2", "m3")) == int(table["mlp2"][2])
    assert executes["b"] + executes["d"] > 0 and executes["a"] + executes["c"] + executes["e"] > 0  # both placements


def test_batched_video_cameras_check_pre_per_frame_and_run(tmp_path: pathlib.Path) -> None:
    """Video cameras in a [[batch]]: each camera's pre-processing is checked against one row
    of the batched input (not the whole batch), and a real run stacks their decoded,
    pre-processed frames into the fixed batch of 2."""
    pytest.importorskip("av", reason="video sources need the video extra (PyAV)")
    import numpy as np

    from orchestra import aot

    b = aot.ProgramBuilder()
    m = b.method("forward")
    x = m.input(np.float32, (2, 3, 32, 32))
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    h = m.call("aten::convolution.out", x, w, np.zeros(4, np.float32), [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    m.output(m.call("aten::mean.out", h, [2, 3], False, None))
    (tmp_path / "b2.pte").write_bytes(b.to_bytes())
    shutil.copy(ROOT / "examples" / "media" / "traffic.mp4", tmp_path / "clip.mp4")
    cams = "".join(f'\n[[camera]]\nname = "{n}"\nsource = {{ kind = "video", uri = "clip.mp4", count = 20 }}\n'
                   f'pre = {{ resize = [32, 32] }}\n' for n in ("v1", "v2"))
    unbatched = write(tmp_path, f'[program]\nname = "b2"\npath = "b2.pte"\n{cams}')
    assert validate_config(unbatched) == [
        f"camera[{i}].pre: makes one image (batch 1), the input's batch dimension is 2: float32 [2, 3, 32, 32] "
        "(input 0 of forward)" for i in (0, 1)]
    path = write(tmp_path, f'[program]\nname = "b2"\npath = "b2.pte"\n{cams}\n[[batch]]\ncameras = ["v1", "v2"]\n'
                           'static_batch = 2\n')
    assert validate_config(path) == []
    env = dict(os.environ, PYTHONIOENCODING="utf-8", NO_COLOR="1")
    r = subprocess.run([sys.executable, "-m", "orchestra", "run", str(path), "--no-dashboard", "--duration", "10"],
                       capture_output=True, text=True, encoding="utf-8", env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    for cam in ("v1", "v2"):
        row = next(line for line in lines if line.startswith(cam + " "))
        assert re.search(rf"^{cam}\s+drop_oldest\s+20\s+20\s+0\s+0\s", row), row
    start = lines.index("batches (frames per execute: size x batches)")
    cells = re.split(r"\s{2,}", lines[start + 2].strip())
    assert (cells[1], cells[3], cells[6]) == ("2", "40", "0"), cells  # 2 cameras, 40 frames, no failed batch
