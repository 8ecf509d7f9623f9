"""Config keys ``post`` and ``sink`` on a camera: one-line, path-first errors from
``validate_config``; paths relative to the config file; and a real ``orchestra run`` (in
process) of the committed convnet.pte writing TopK results to a shared JSONL file and arrays
to NPY stacks, with the summary naming where the results went.
"""

from __future__ import annotations

import io
import json
import pathlib
import shutil
import sys
import textwrap

import numpy as np
import pytest

from orchestra.config import ConfigError, PostConfig, SinkConfig, load_config, validate_config

try:
    import paho.mqtt  # noqa: F401
except ImportError:  # the mqtt extra is not installed: an mqtt sink table is refused for that
    paho = None
# Tests whose configs include mqtt sinks (with the others) check what validation says of them.
needs_mqtt = pytest.mark.skipif(paho is None, reason="needs paho-mqtt (pip install 'orchestra[mqtt]')")

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = ROOT / "examples" / "models"
HEAD = '[program]\npath = "models/convnet.pte"\n'
SYN = 'source = { kind = "synthetic", fps = 200, shape = [1, 3, 16, 16], count = 12 }'


def camera(name: str, extra: str = "", seed: int = 0) -> str:
    return f'\n[[camera]]\nname = "{name}"\n{SYN.replace("count", f"seed = {seed}, count")}\n{extra}\n'


@pytest.fixture
def folder(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "models").mkdir()
    shutil.copy(MODELS / "convnet.pte", tmp_path / "models" / "convnet.pte")
    (tmp_path / "labels.txt").write_text("".join(f"class {i}\n" for i in range(10)), encoding="utf-8")
    (tmp_path / "out").mkdir()
    return tmp_path


def write(folder: pathlib.Path, text: str) -> pathlib.Path:
    path = folder / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


def check(folder: pathlib.Path, text: str, expected: list[str]) -> None:
    path = write(folder, text)
    assert validate_config(path) == expected
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    assert list(ei.value.errors) == expected


@needs_mqtt
def test_post_and_sink_load_with_paths_relative_to_the_config(folder: pathlib.Path) -> None:
    text = (HEAD
            + camera("a", 'post = { kind = "topk", k = 3, labels = "labels.txt" }\n'
                          'sink = { kind = "jsonl", path = "out/r.jsonl", timeout_ms = 250 }')
            + camera("b", 'sink = { kind = "npy", dir = "out/arrays", what = "outputs" }')
            + camera("c", 'post = { kind = "topk" }\n'
                          'sink = { kind = "mqtt", host = "127.0.0.1", port = 1884, topic = "cams/{camera}", qos = 1 }')
            + camera("d"))
    cfg = load_config(write(folder, text))
    a, b, c, d = cfg.cameras
    assert a.post == PostConfig("topk", {"k": 3, "softmax": False, "output": 0, "labels": str(folder / "labels.txt")})
    assert a.sink == SinkConfig("jsonl", {"path": str(folder / "out" / "r.jsonl"), "append": False,
                                          "max_elements": 1024}, 0.25)
    assert a.sink.pipeline_timeout_s is None and a.sink.where() == f"{folder / 'out' / 'r.jsonl'} (jsonl)"
    assert b.post is None and b.sink.params["dir"] == str(folder / "out" / "arrays") and b.sink.timeout_s == 5.0
    assert c.post.params["k"] == 5
    assert dict(c.sink.params) == {"host": "127.0.0.1", "port": 1884, "topic": "cams/{camera}", "qos": 1,
                                   "retain": False, "keepalive": 60, "max_elements": 1024}
    assert d.post is None and d.sink is None


def test_post_errors_are_one_line_and_path_first(folder: pathlib.Path) -> None:
    (folder / "bad.txt").write_bytes(b"a\n\nc\n")
    text = (HEAD
            + camera("a", 'post = { kind = "topkk" }')
            + camera("b", 'post = { kind = "topk", k = 0, softmax = "yes", top = 3 }')
            + camera("c", 'post = { kind = "topk", labels = "bad.txt" }')
            + camera("d", 'post = { kind = "topk", labels = "missing.txt" }')
            + camera("e", 'post = { kind = "os:system" }')
            + camera("f", 'post = "topk"'))
    check(folder, text, [
        "camera[0].post.kind: no post-process kind 'topkk' (kinds: topk; or 'module:attr'); did you mean 'topk'?",
        "camera[1].post.top: unknown key (known keys: kind, k, labels, softmax, output)",
        "camera[1].post.k: must be a positive integer, got 0",
        "camera[1].post.softmax: must be true or false, got \"yes\"",
        "camera[2].post.labels: labels file 'bad.txt' line 2: empty (one label per line, line N names class N-1)",
        "camera[3].post.labels: labels file 'missing.txt' does not exist",
        "camera[4].post.kind: post 'os:system' is <built-in function system>, not a class: 'module:attr' must name a "
        "post-process class (instances called as (frame, outputs))",
        "camera[5].post: must be a table, got \"topk\"",
    ])


@needs_mqtt
def test_sink_errors_are_one_line_and_path_first(folder: pathlib.Path) -> None:
    text = (HEAD
            + camera("a", 'sink = { kind = "csv", path = "x.csv" }')
            + camera("b", 'sink = { kind = "jsonl", path = "nowhere/r.jsonl", apend = true }')
            + camera("c", 'sink = { kind = "jsonl", path = "out" }')
            + camera("d", 'sink = { kind = "npy", dir = "labels.txt", what = "all" }')
            + camera("e", 'sink = { kind = "mqtt", host = "h", port = 70000, qos = 3, topic = "a/#" }')
            + camera("f", 'sink = { kind = "mqtt", topic = "a/{cam}", timeout_ms = -1 }')
            + camera("g", 'sink = { kind = "collections:OrderedDict" }')
            + camera("h", 'sink = { kind = "jsonl", path = "out/r.jsonl" }')
            + camera("i", 'sink = { kind = "jsonl", path = "out/r.jsonl", append = true }'))
    check(folder, text, [
        "camera[0].sink.kind: no sink kind 'csv' (kinds: jsonl, npy, mqtt; or 'module:attr')",
        "camera[1].sink.apend: unknown key (known keys: kind, path, append, max_elements, timeout_ms); "
        "did you mean 'append'?",
        f"camera[1].sink.path: nowhere/r.jsonl: the folder {folder / 'nowhere'} does not exist",
        "camera[2].sink.path: out is a folder; a jsonl sink writes a file",
        "camera[3].sink.what: 'all' is not one of outputs, value",
        "camera[3].sink.dir: labels.txt exists and is not a folder",
        "camera[4].sink.port: 70000 is not a TCP port (1..65535)",
        "camera[4].sink.qos: 3 is not an MQTT QoS (0, 1 or 2)",
        "camera[4].sink.topic: topic 'a/#' has a wildcard (+, #) or NUL; one can't publish to it",
        "camera[5].sink.timeout_ms: must be a positive number, got -1",
        "camera[5].sink.host: missing (required)",
        "camera[5].sink.topic: topic 'a/{cam}': the only placeholder is {camera}",
        "camera[6].sink.kind: sink 'collections:OrderedDict' is <class 'collections.OrderedDict'>, which is not a "
        "sink class (it has no send(result))",
        "camera[8].sink.path: out/r.jsonl is also written by camera[7] with another sink table: cameras writing one "
        "jsonl output share one sink, so their sink tables must be equal",
    ])


def test_module_attr_sink_and_post_parameters_are_checked(folder: pathlib.Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    (folder / "my_outputs.py").write_text(textwrap.dedent("""
        class Sink:
            def __init__(self, prefix):
                self.prefix = prefix
            async def send(self, result):
                pass

        class Post:
            def __init__(self, scale=1.0):
                self.scale = scale
            def __call__(self, frame, outputs):
                return float(outputs[0].sum()) * self.scale
    """))
    monkeypatch.syspath_prepend(str(folder))
    try:
        text = (HEAD + camera("a", 'post = { kind = "my_outputs:Post", scale = 2.0 }\n'
                                   'sink = { kind = "my_outputs:Sink", prefix = "x", timeout_ms = 100 }')
                + camera("b", 'post = { kind = "my_outputs:Post", scal = 2.0 }\nsink = { kind = "my_outputs:Sink" }'))
        path = write(folder, text)
        lines = validate_config(path)
        assert len(lines) == 2
        assert lines[0].startswith("camera[1].post: post my_outputs:Post doesn't take ['scal']: ")
        assert lines[1].startswith("camera[1].sink: sink my_outputs:Sink doesn't take []: ")
        cfg = load_config(write(folder, HEAD + camera("a", 'post = { kind = "my_outputs:Post", scale = 2.0 }\n'
                                                           'sink = { kind = "my_outputs:Sink", prefix = "x", '
                                                           'timeout_ms = 100 }')))
        sink = cfg.cameras[0].sink
        assert dict(sink.params) == {"prefix": "x"} and sink.pipeline_timeout_s == 0.1
        assert sink.build().prefix == "x" and cfg.cameras[0].post.build().scale == 2.0
    finally:
        sys.modules.pop("my_outputs", None)


def test_run_writes_results_where_the_summary_says(folder: pathlib.Path) -> None:
    from orchestra._run import RunOptions, render_summary, run

    shared = 'post = { kind = "topk", k = 3, labels = "labels.txt" }\nsink = { kind = "jsonl", path = "out/r.jsonl" }'
    text = (HEAD + camera("a", shared + '\ndrop = "block"', seed=1) + camera("b", shared + '\ndrop = "block"', seed=2)
            + camera("c", 'sink = { kind = "npy", dir = "out/arrays" }\ndrop = "block"', seed=3)
            + "\n[run]\nduration_s = 30\n")
    result = run(load_config(write(folder, text)), RunOptions(use_uvloop=False, status_interval_s=60), out=io.StringIO())
    assert result.exit_code == 0, result.problems
    assert result.ended_by == "sources ended"
    assert {c.name: c.processed for c in result.cameras} == {"a": 12, "b": 12, "c": 12}
    records = [json.loads(line) for line in (folder / "out" / "r.jsonl").read_text().splitlines()]
    for cam in ("a", "b"):
        mine = [r for r in records if r["camera"] == cam]
        assert [r["index"] for r in mine] == list(range(12))
        for r in mine:
            assert len(r["value"]) == 3 and r["value"][0]["label"] == f"class {r['value'][0]['index']}"
            scores = [v["score"] for v in r["value"]]
            assert scores == sorted(scores, reverse=True)
    assert {r["camera"] for r in records} == {"a", "b"}
    out = np.load(folder / "out" / "arrays" / "c.out0.npy")
    frames = np.load(folder / "out" / "arrays" / "c.frames.npy")
    assert out.shape == (12, 1, 10) and frames["index"].tolist() == list(range(12))
    summary = render_summary(result)
    assert f"  {folder / 'out' / 'r.jsonl'} (jsonl): a, b" in summary.splitlines()
    assert f"  {folder / 'out' / 'arrays'}/ (npy stacks): c" in summary.splitlines()
    assert summary.rstrip().endswith("result: ok")


def test_topk_labels_are_counted_against_the_output_classes(folder: pathlib.Path) -> None:
    # convnet.pte's output 0 is [1, 10]: a 9-line labels file can't name its classes
    (folder / "nine.txt").write_text("".join(f"class {i}\n" for i in range(9)), encoding="utf-8")
    check(folder, HEAD + camera("a", 'post = { kind = "topk", labels = "nine.txt" }'), [
        "camera[0].post.labels: nine.txt has 9 labels; output 0 of method 'forward' of models/convnet.pte holds "
        "10 classes per frame",
    ])
