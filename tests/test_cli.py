"""The ``orchestra`` command: ``inspect`` on every fixture, ``--json``, and bad files.

Runs the real entry point both as a subprocess (``python -m orchestra``) and in-process
through ``main([...])``.
"""

from __future__ import annotations

import ast
import io
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from orchestra import _cli
from orchestra.program import DataLocation, KernelCall, Tensor, TensorShapeDynamism, load

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
ALL = sorted(p.stem for p in FIXTURES.glob("*.pte"))


def _run(*args: str, cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONIOENCODING="utf-8")
    return subprocess.run(
        [sys.executable, "-m", "orchestra", *args],
        capture_output=True, text=True, encoding="utf-8", env=env, cwd=cwd, timeout=60,
    )


def _main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = _cli.main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def _expected_words(name: str) -> list[str]:
    """What the text output must mention for this fixture, derived from the program."""
    prog = load(FIXTURES / f"{name}.pte")
    words = [f"{name}.pte"]
    for plan in prog.execution_plan:
        words.append(f"method {plan.name}")
        words += [op.qualified_name for op in plan.operators]
        words += [d.id for d in plan.delegates]
    return words


def _check_text(name: str, out: str) -> None:
    for word in _expected_words(name):
        assert word in out, f"{word!r} missing from inspect output of {name}"
    assert "Traceback" not in out


# -- every fixture ------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_inspect_in_process(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _main(capsys, "inspect", str(FIXTURES / f"{name}.pte"))
    assert (rc, err) == (0, "")
    _check_text(name, out)
    prog = load(FIXTURES / f"{name}.pte")
    sections = out.split("\nmethod ")[1:]
    assert [s.split("\n", 1)[0] for s in sections] == list(prog.method_names)
    for plan, section in zip(prog.execution_plan, sections):
        for op_index, op in enumerate(plan.operators):
            calls = sum(
                1 for c in plan.chains for i in c.instructions
                if isinstance(i.instr_args, KernelCall) and i.instr_args.op_index == op_index
            )
            # operator name, then its KernelCall count on the same line
            line = next(ln for ln in section.splitlines() if ln.strip().startswith(op.qualified_name + " "))
            assert line.split()[-2:] == [str(calls), "call" if calls == 1 else "calls"], line


@pytest.mark.parametrize("name", ALL)
def test_inspect_subprocess(name: str, tmp_path: pathlib.Path) -> None:
    r = _run("inspect", str(FIXTURES / f"{name}.pte"), cwd=tmp_path)
    assert (r.returncode, r.stderr) == (0, "")
    _check_text(name, r.stdout)


def test_convnet_layout(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _main(capsys, "inspect", str(FIXTURES / "convnet.pte"))
    assert rc == 0
    assert "identifier   ET12" in out
    assert "schema       version 0" in out
    assert "constants (15 buffers)" in out  # the constant segment; buffer 0 is reserved
    assert "aten::convolution.out" in out
    assert "[0]  value 16  tensor  float32  [1, 3, 16, 16]  static" in out
    assert "planned memory  24,576 bytes in 1 buffer" in out
    assert "buffer 1  24,576 bytes" in out
    assert "delegates       0" in out


def test_xnnpack_segment_delegate(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _main(capsys, "inspect", str(FIXTURES / "xnnpack_convnet.pte"))
    assert rc == 0
    assert "XnnpackBackend" in out
    assert "delegate 0 of method forward" in out  # the segment holding the blob says so
    assert "segment [1]" in out
    prog = load(FIXTURES / "xnnpack_convnet.pte")
    for nd in prog.named_data:
        assert f"named data {nd.key}" in out
    assert "1 delegate call" in out


def test_xnnpack_inline_delegate(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _main(capsys, "inspect", str(FIXTURES / "xnnpack_inline.pte"))
    assert rc == 0
    assert "XnnpackBackend" in out
    assert "inline [0]" in out
    assert "inline delegate data" in out


def test_two_methods(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _main(capsys, "inspect", str(FIXTURES / "two_methods.pte"))
    assert rc == 0
    assert "method encode" in out and "method forward" in out
    assert "methods      2 (encode, forward)" in out
    assert "aten::sigmoid.out" in out.split("method forward")[1]
    assert "aten::sigmoid.out" not in out.split("method forward")[0]


def test_dynamic_batch_shows_bound(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _main(capsys, "inspect", str(FIXTURES / "dynamic_batch.pte"))
    assert rc == 0
    assert "float32  [8, 2, 6, 6]  dynamic ≤ bound (sizes are upper bounds)" in out
    assert "aten::sym_size.int" in out
    assert "executorch_prim::et_view.default" in out


def test_int64_input_dtype(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _main(capsys, "inspect", str(FIXTURES / "transformer.pte"))
    assert rc == 0
    assert "tensor  int64  [1, 8]  static" in out


def test_ascii_terminal_gets_ascii_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.BytesIO()
    stream = io.TextIOWrapper(buf, encoding="ascii")
    monkeypatch.setattr(sys, "stdout", stream)
    assert _cli.main(["inspect", str(FIXTURES / "dynamic_batch.pte")]) == 0
    stream.flush()
    assert b"dynamic <= bound" in buf.getvalue()


# -- --json -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_json(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = FIXTURES / f"{name}.pte"
    rc, out, err = _main(capsys, "inspect", str(path), "--json")
    assert (rc, err) == (0, "")
    facts = json.loads(out)
    assert list(facts) == ["file", "segments", "inline_delegate_data", "methods"]
    prog = load(path)
    f = facts["file"]
    assert f["size"] == path.stat().st_size
    assert f["identifier"] == "ET12"
    assert f["schema_version"] == prog.version
    assert [s["size"] for s in facts["segments"]] == [s.size for s in prog.segments]
    assert [m["name"] for m in facts["methods"]] == list(prog.method_names)
    for m, plan in zip(facts["methods"], prog.execution_plan):
        assert m["values"] == len(plan.values)
        assert m["chains"] == [len(c.instructions) for c in plan.chains]
        assert [o["name"] for o in m["operators"]] == [op.qualified_name for op in plan.operators]
        assert sum(o["calls"] for o in m["operators"]) == m["instructions"]["kernel_calls"]
        assert [d["backend"] for d in m["delegates"]] == [d.id for d in plan.delegates]
        for d, pd in zip(m["delegates"], plan.delegates):
            assert d["blob_size"] == len(prog.delegate_data(pd.processed))
            assert d["location"] == ("inline" if pd.processed.location == DataLocation.INLINE else "segment")
        assert m["planned_memory"]["total"] == sum(plan.non_const_buffer_sizes[1:])
        assert [b["id"] for b in m["planned_memory"]["buffers"]] == list(range(1, len(plan.non_const_buffer_sizes)))
        for entry, vi in zip(m["inputs"], plan.inputs):
            v = plan.values[vi].val
            assert entry["value"] == vi
            if isinstance(v, Tensor):
                assert entry["kind"] == "tensor"
                assert entry["shape"] == list(v.sizes)
        # stable keys: every input/output entry has the same keys, tensor or not
        keys = {tuple(e) for e in m["inputs"] + m["outputs"]}
        assert keys == {("index", "value", "kind", "dtype", "shape", "dynamism", "nbytes", "literal")}


def test_json_dynamic_and_segments(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _main(capsys, "inspect", "--json", str(FIXTURES / "dynamic_batch.pte"))
    inp = json.loads(out)["methods"][0]["inputs"][0]
    assert (inp["dtype"], inp["shape"], inp["dynamism"]) == ("float32", [8, 2, 6, 6], "dynamic_bound")
    assert load(FIXTURES / "dynamic_batch.pte").execution_plan[0].values[inp["value"]].val.shape_dynamism == TensorShapeDynamism.DYNAMIC_BOUND

    _, out, _ = _main(capsys, "inspect", "--json", str(FIXTURES / "xnnpack_convnet.pte"))
    segs = json.loads(out)["segments"]
    kinds = [[r["kind"] for r in s["used_by"]] for s in segs]
    assert kinds == [["constants"], ["delegate"], *[["named_data"]] * 6]
    assert segs[1]["used_by"][0] == {"kind": "delegate", "method": "forward", "delegate": 0}


def test_json_subprocess() -> None:
    r = _run("inspect", "--json", str(FIXTURES / "two_methods.pte"))
    assert (r.returncode, r.stderr) == (0, "")
    assert [m["name"] for m in json.loads(r.stdout)["methods"]] == ["encode", "forward"]


# -- bad files ----------------------------------------------------------------------------


def _bad_files(tmp: pathlib.Path) -> dict[str, pathlib.Path]:
    data = (FIXTURES / "convnet.pte").read_bytes()
    files = {
        "missing": tmp / "no_such.pte",
        "directory": tmp,
        "empty": tmp / "empty.pte",
        "random": tmp / "random.pte",
        "random_with_identifier": tmp / "random_et12.pte",
    }
    files["empty"].write_bytes(b"")
    rnd = bytes((i * 7919 + 13) % 251 for i in range(4096))
    files["random"].write_bytes(rnd)
    files["random_with_identifier"].write_bytes(rnd[:4] + b"ET12" + rnd[8:])
    for cut in (4, 8, 40, 200, len(data) // 2, len(data) - 1):
        p = tmp / f"truncated_{cut}.pte"
        p.write_bytes(data[:cut])
        files[f"truncated_{cut}"] = p
    return files


def _check_error(rc: int, out: str, err: str, path: pathlib.Path) -> None:
    assert rc == 2
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("orchestra: "), err
    assert str(path) in err  # the message names the file
    assert "Traceback" not in out + err


def test_bad_files_in_process(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    for kind, path in _bad_files(tmp_path).items():
        for extra in ((), ("--json",)):
            rc, out, err = _main(capsys, "inspect", str(path), *extra)
            _check_error(rc, out, err, path)


def test_bad_files_subprocess(tmp_path: pathlib.Path) -> None:
    for kind, path in _bad_files(tmp_path).items():
        r = _run("inspect", str(path))
        _check_error(r.returncode, r.stdout, r.stderr, path)


def test_error_names_schema_path(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = (FIXTURES / "convnet.pte").read_bytes()
    p = tmp_path / "cut.pte"
    p.write_bytes(data[: len(data) - 1])
    _, _, err = _main(capsys, "inspect", str(p))
    assert err.startswith(f"orchestra: {p}: extended_header.segment_data_size: ")


# -- usage --------------------------------------------------------------------------------


def test_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli.main([]) == 2
    assert _cli.main(["frobnicate"]) == 2
    assert _cli.main(["inspect"]) == 2
    assert _cli.main(["inspect", "a.pte", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert "usage: orchestra" in err and "Traceback" not in err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("orchestra ")
    r = _run("--version")
    assert r.returncode == 0 and r.stdout.startswith("orchestra ")


def test_usage_error_subprocess() -> None:
    r = _run()
    assert r.returncode == 2
    assert "usage: orchestra" in r.stderr and "Traceback" not in r.stderr


def test_import_configures_no_logging() -> None:
    code = (
        "import logging, structlog\n"
        "import orchestra._cli\n"
        "assert not logging.getLogger().handlers, logging.getLogger().handlers\n"
        "assert not structlog.is_configured()\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


# -- the README's dumps() example: the bytes reach ExecuTorch's own runtime ------------------------


@pytest.mark.executorch
@pytest.mark.parametrize("name", ["xnnpack_convnet", "xnnpack_inline"])
@pytest.mark.parametrize("mode", ["segment", "inline"])
def test_dumps_output_runs_in_executorchs_runtime(name: str, mode: str) -> None:
    try:  # tests/ may or may not be a package
        from ._executorch import (delegate_backends, executorch_available, load_npz, run_executorch,
                                  xnnpack_available)
    except ImportError:
        from _executorch import (delegate_backends, executorch_available, load_npz,  # type: ignore[no-redef]
                                 run_executorch, xnnpack_available)
    from orchestra.program import dumps

    if not executorch_available():
        pytest.skip("needs executorch (the export extra)")
    if name.startswith("xnnpack") and not xnnpack_available():
        pytest.skip("XnnpackBackend is not registered in this ExecuTorch runtime")
    data = dumps(load(str(FIXTURES / f"{name}.pte")), delegate_data=mode)  # type: ignore[arg-type]
    # ExecuTorch's reader sees every delegate blob where it was asked to be
    for method, delegates in delegate_backends(data).items():
        assert all(where == mode for _, where in delegates), (method, delegates)
    if name.startswith("xnnpack"):
        assert delegate_backends(data)["forward"], "the fixture delegates to XNNPACK"
    for method, io in load_npz(name).items():
        got = run_executorch(data, method, io["in"])
        assert len(got) == len(io["out"])
        for g, w in zip(got, io["out"], strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
