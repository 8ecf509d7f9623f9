"""orchestra.pipeline post-processing: TopK, labels files (untrusted input), load_post.

Scores come from a real program: the committed ``cnn.pte`` classifier run by orchestra's
runtime, checked against the outputs ExecuTorch's own runtime produced (``cnn.npz``); the
expected rankings are computed independently here with a full ``np.argsort``.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import orchestra
from orchestra.errors import ConfigError, InvalidArgumentError, NotFoundError, OrchestraError
from orchestra.pipeline import Frame, TopK, load_labels, load_post

FIXTURES = Path(__file__).parent / "fixtures"


def frame(index: int = 0) -> Frame:
    return Frame("cam0", index, np.zeros((1,), np.float32), 0.0)


def reference_topk(scores: np.ndarray, k: int) -> list[int]:
    order = sorted(range(scores.size), key=lambda i: (-float(scores[i]), i))
    return order[:k]


@pytest.fixture(scope="module")
def cnn_logits() -> np.ndarray:
    program = orchestra.load_program(str(FIXTURES / "cnn.pte"))
    data = np.load(FIXTURES / "cnn.npz")
    out = program.load_method("forward").execute([data["forward.in_0"]])[0]
    np.testing.assert_allclose(out, data["forward.out_0"], rtol=1e-5, atol=1e-5)
    return np.asarray(out)


# --- labels files ------------------------------------------------------------------------

def test_labels_file_one_per_line(tmp_path: Path) -> None:
    p = tmp_path / "labels.txt"
    p.write_bytes("\ufeffcat\r\ndog \n  bird\nfisch \u00e4\n".encode())
    assert load_labels(p) == ("cat", "dog", "bird", "fisch \u00e4")
    p.write_text("a\nb")  # no final newline
    assert load_labels(p) == ("a", "b")


@pytest.mark.parametrize(("content", "message"), [
    (b"", "has no labels"),
    (b"a\n\nc\n", "line 2: empty"),
    (b"a\nb\n\xff\xfe\n", "line 3: not UTF-8"),
    (b"a\nb\x07c\n", "line 2: has control characters"),
    (b"a\n" + b"x" * 2000 + b"\n", "line 2: longer than 1024"),
])
def test_bad_labels_files_name_the_file_and_line(tmp_path: Path, content: bytes, message: str) -> None:
    p = tmp_path / "bad labels.txt"
    p.write_bytes(content)
    with pytest.raises(InvalidArgumentError) as info:
        load_labels(p)
    assert message in str(info.value) and str(p) in str(info.value)


def test_labels_file_size_is_capped_before_reading_it_all(tmp_path: Path) -> None:
    p = tmp_path / "huge.txt"
    p.write_bytes(b"label\n" * 2000)
    with pytest.raises(InvalidArgumentError, match="larger than 1000 bytes"):
        load_labels(p, max_bytes=1000)
    with pytest.raises(NotFoundError, match="missing.txt"):
        load_labels(tmp_path / "missing.txt")
    with pytest.raises(InvalidArgumentError, match="can't read"):
        load_labels(tmp_path)  # a folder


# --- TopK ---------------------------------------------------------------------------------

def test_topk_ranks_a_real_classifier_output(cnn_logits: np.ndarray, tmp_path: Path) -> None:
    assert cnn_logits.shape == (1, 10)
    labels = [f"class {i}" for i in range(10)]
    (tmp_path / "l.txt").write_text("\n".join(labels) + "\n")
    for k in (1, 3, 10, 50):
        value = TopK(k, labels=tmp_path / "l.txt")(frame(), [cnn_logits])
        want = reference_topk(cnn_logits[0], k)
        assert [v["index"] for v in value] == want
        assert [v["label"] for v in value] == [labels[i] for i in want]
        assert [v["score"] for v in value] == [float(cnn_logits[0, i]) for i in want]
        json.dumps(value, allow_nan=False)  # JSON-able as is

    probs = TopK(10, softmax=True)(frame(), [cnn_logits])
    e = np.exp(cnn_logits[0].astype(np.float64) - cnn_logits.max())
    ref = e / e.sum()
    assert [v["index"] for v in probs] == reference_topk(cnn_logits[0], 10)
    np.testing.assert_allclose([v["score"] for v in probs], ref[[v["index"] for v in probs]], rtol=1e-12)
    assert abs(sum(v["score"] for v in probs) - 1.0) < 1e-9
    assert all(v["label"] is None for v in probs)


def test_topk_ties_keep_index_order_and_nan_ranks_last() -> None:
    scores = np.array([0.5, 0.9, 0.5, 0.9, np.nan, 0.1], np.float32)
    assert [v["index"] for v in TopK(3)(frame(), [scores])] == [1, 3, 0]
    assert [v["index"] for v in TopK(6)(frame(), [scores])] == [1, 3, 0, 2, 5, 4]
    ints = np.array([[[3, 7, 7, 1]]], np.int64)  # leading 1s are squeezed
    assert [v["index"] for v in TopK(2)(frame(), [ints])] == [1, 2]


def test_topk_refuses_what_is_not_one_row_of_scores(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=r"camera 'cam0' frame 4: output 0 is \[2, 4\]"):
        TopK()(frame(4), [np.zeros((2, 4), np.float32)])
    with pytest.raises(InvalidArgumentError, match="output 1 asked, the executor returned 1"):
        TopK(output=1)(frame(), [np.zeros(4)])
    (tmp_path / "three.txt").write_text("a\nb\nc\n")
    with pytest.raises(InvalidArgumentError, match=r"labels file '.*three.txt' has 3 labels, output 0 has 4 classes"):
        TopK(labels=str(tmp_path / "three.txt"))(frame(), [np.zeros(4)])
    for bad in (dict(k=0), dict(k=True), dict(k="5"), dict(output=-1), dict(softmax="yes"), dict(labels=[]),
                dict(labels=[1, 2])):
        with pytest.raises(InvalidArgumentError):
            TopK(**bad)  # type: ignore[arg-type]


# --- load_post ----------------------------------------------------------------------------

@pytest.fixture
def plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = "orchestra_test_post_plugin"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent("""
        import numpy as np

        class MeanPost:
            def __init__(self, scale=1.0):
                self.scale = scale

            def __call__(self, frame, outputs):
                return {"camera": frame.camera, "mean": float(np.mean(outputs[0])) * self.scale}

        class NotCallable:
            pass

        def a_function(frame, outputs):
            return 1

        value = 3
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_load_post_builtin_and_module_attr(plugin_module: str, cnn_logits: np.ndarray) -> None:
    top = load_post("topk", k=2, softmax=True)
    assert isinstance(top, TopK) and top.k == 2
    post = load_post(f"{plugin_module}:MeanPost", scale=2.0)
    assert post(frame(), [cnn_logits]) == {"camera": "cam0", "mean": float(np.mean(cnn_logits)) * 2.0}


def test_load_post_errors(plugin_module: str) -> None:
    cases: list[tuple[str, dict[str, Any], type[OrchestraError], str]] = [
        ("nope", {}, NotFoundError, "no post-process 'nope'"),
        ("topk", {"kk": 1}, InvalidArgumentError, "post 'topk': bad parameters \\['kk'\\]"),
        (f"{plugin_module}:NotCallable", {}, ConfigError, "instances are not callable"),
        (f"{plugin_module}:a_function", {}, ConfigError, "not a class"),
        (f"{plugin_module}:value", {}, ConfigError, "not a class"),
        (f"{plugin_module}:Missing", {}, NotFoundError, "has no attribute 'Missing'"),
        ("no_such_module_xyz:Post", {}, NotFoundError, "can't import module 'no_such_module_xyz'"),
        ("os:system", {}, ConfigError, "not a class"),
    ]
    for spec, params, exc, message in cases:
        with pytest.raises(exc, match=message):
            load_post(spec, **params)
