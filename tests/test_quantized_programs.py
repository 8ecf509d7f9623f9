"""PT2E int8 programs (portable: quantize/dequantize ops around float kernels) run in orchestra's
runtime and match ExecuTorch's runtime within one quantization step per output element.

The committed fixtures live in ``tests/fixtures/int8/`` (made by
``tools/export_quant_fixtures.py``); a 224x224 int8 conv net is exported here when torch and
executorch are installed. "One quantization step" is the scale of the program's last static
``dequantize_per_tensor`` (the output's quantization); a program whose output is float
(dynamic activations) uses the step that int8-quantizing the expected output would have:
``(max(out, 0) - min(out, 0)) / 255``.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import threading
from typing import Any

import numpy as np
import pytest

from orchestra.program import KernelCall, load
from orchestra.runtime import load_program

try:  # tests/ may or may not be a package
    from ._executorch import executorch_available, run_executorch
except ImportError:
    from _executorch import executorch_available, run_executorch  # type: ignore[no-redef]

INT8 = pathlib.Path(__file__).parent / "fixtures" / "int8"
REPO = pathlib.Path(__file__).resolve().parents[1]
MAX_PTE_BYTES = 200 * 1024
PORTABLE = sorted(p.stem for p in INT8.glob("int8_*.pte"))
XNNPACK = sorted(p.stem for p in INT8.glob("xnnpack_int8_*.pte"))
_DQ = "quantized_decomposed::dequantize_per_tensor.out"


def _npz(name: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    with np.load(INT8 / f"{name}.npz", allow_pickle=False) as z:
        ins = [z[f"forward.in_{i}"] for i in range(sum(k.startswith("forward.in_") for k in z.files))]
        outs = [z[f"forward.out_{i}"] for i in range(sum(k.startswith("forward.out_") for k in z.files))]
    return ins, outs


def output_steps(pte: pathlib.Path | bytes, expected: list[np.ndarray]) -> list[float]:
    """One quantization step per output (see the module docstring)."""
    prog = load(pte) if isinstance(pte, pathlib.Path) else None
    if prog is None:
        from orchestra.program import loads

        prog = loads(pte)
    plan = prog.execution_plan[0]
    last_scale = None
    for chain in plan.chains:
        for ins in chain.instructions:
            a = ins.instr_args
            if isinstance(a, KernelCall) and plan.operators[a.op_index].qualified_name == _DQ:
                last_scale = plan.values[a.args[1]].val.double_val
    if last_scale is not None:
        return [float(last_scale)] * len(expected)
    return [float(max(o.max(), 0) - min(o.min(), 0)) / 255 for o in expected]


def assert_within_one_step(name: str, got: list[np.ndarray], want: list[np.ndarray], steps: list[float]) -> None:
    assert len(got) == len(want), f"{name}: {len(got)} outputs, expected {len(want)}"
    for i, (g, w, step) in enumerate(zip(got, want, steps)):
        assert g.shape == w.shape and g.dtype == w.dtype, f"{name}.out_{i}: {g.dtype}{g.shape} vs {w.dtype}{w.shape}"
        err = np.abs(g.astype(np.float64) - w.astype(np.float64))
        # float32 slack on top of the step: the dequantized values themselves are rounded.
        tol = step * (1 + 1e-5) + 1e-6
        assert err.max() <= tol, f"{name}.out_{i}: max error {err.max()} > one step {step}"


# --------------------------------------------------------------------------- committed fixtures


def test_int8_fixtures_are_present_and_small() -> None:
    assert set(PORTABLE) >= {"int8_convnet", "int8_block", "int8_dynamic_block"}
    assert {x.removeprefix("xnnpack_") for x in XNNPACK} == set(PORTABLE)
    for name in PORTABLE + XNNPACK:
        data = (INT8 / f"{name}.pte").read_bytes()
        assert len(data) < MAX_PTE_BYTES and data[4:8] == b"ET12", name
        assert (INT8 / f"{name}.npz").is_file(), name


@pytest.mark.parametrize("name", PORTABLE)
def test_portable_int8_programs_are_really_quantized(name: str) -> None:
    plan = load(INT8 / f"{name}.pte").execution_plan[0]
    ops = {op.qualified_name for op in plan.operators}
    assert any(o.startswith("quantized_decomposed::quantize_per_tensor") for o in ops), ops
    assert "quantized_decomposed::dequantize_per_channel.out" in ops  # int8 weights
    assert not plan.delegates


@pytest.mark.parametrize("name", PORTABLE)
def test_portable_int8_matches_executorch_within_one_step(name: str) -> None:
    ins, want = _npz(name)
    steps = output_steps(INT8 / f"{name}.pte", want)
    prog = load_program(INT8 / f"{name}.pte")
    with prog.load_method("forward") as m:
        for _ in range(2):  # the second run reuses the arenas
            assert_within_one_step(name, m.execute(ins), want, steps)


def test_int8_instances_run_in_parallel_threads() -> None:
    ins, want = _npz("int8_convnet")
    steps = output_steps(INT8 / "int8_convnet.pte", want)
    prog = load_program(INT8 / "int8_convnet.pte")
    results: dict[int, list[np.ndarray]] = {}

    def work(k: int) -> None:
        with prog.load_method("forward") as m:
            for _ in range(5):
                results[k] = m.execute(ins)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [0, 1, 2]
    for got in results.values():
        assert_within_one_step("int8_convnet", got, want, steps)


@pytest.mark.executorch
@pytest.mark.parametrize("name", PORTABLE + XNNPACK)
def test_executorch_reproduces_committed_int8_outputs(name: str) -> None:
    pytest.importorskip("executorch.runtime")
    if name.startswith("xnnpack_"):
        try:
            from ._executorch import xnnpack_available
        except ImportError:
            from _executorch import xnnpack_available  # type: ignore[no-redef]
        if not xnnpack_available():
            pytest.skip("XnnpackBackend is not registered in this ExecuTorch runtime")
    pytest.importorskip("executorch.kernels.quantized")  # registers ExecuTorch's quantized kernels
    ins, want = _npz(name)
    got = run_executorch((INT8 / f"{name}.pte").read_bytes(), "forward", ins)
    # Deterministic on one machine; other CPUs may pick other XNNPACK microkernels.
    assert_within_one_step(name, got, want, output_steps(INT8 / f"{name}.pte", want))


def test_static_portable_and_xnnpack_fixtures_agree_within_one_step() -> None:
    for name in ("int8_convnet", "int8_block"):
        ins_p, out_p = _npz(name)
        ins_x, out_x = _npz("xnnpack_" + name)
        np.testing.assert_array_equal(ins_p[0], ins_x[0])
        assert_within_one_step(name, out_p, out_x, output_steps(INT8 / f"{name}.pte", out_p))


# --------------------------------------------------------------------------- 224x224


def _export_tool() -> Any:
    spec = importlib.util.spec_from_file_location("export_quant_fixtures", REPO / "tools" / "export_quant_fixtures.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def int8_224(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The 224x224 int8 conv net, portable and XNNPACK, with ExecuTorch's outputs (exported
    once per session)."""
    if not executorch_available():
        pytest.skip("needs torch + executorch (the export extra)")
    pytest.importorskip("torchao")
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    tool = _export_tool()
    # Shared with backends/xnnpack/test (same session, same base temp folder).
    pairs = tool.cached_pair(tool.big_convnet_spec(), tmp_path_factory.getbasetemp() / "int8_convnet224")
    return {
        name: (path, [arrays["forward.in_0"]],
               [arrays[f"forward.out_{i}"] for i in range(sum(k.startswith("forward.out_") for k in arrays))])
        for name, (path, arrays) in pairs.items()
    }


@pytest.mark.executorch
def test_224_int8_portable_matches_executorch(int8_224: dict[str, Any]) -> None:
    path, ins, want = int8_224["int8_convnet224"]
    assert ins[0].shape == (1, 3, 224, 224)
    prog = load_program(path)
    with prog.load_method("forward") as m:
        assert_within_one_step("int8_convnet224", m.execute(ins), want, output_steps(path, want))
