"""int8 XNNPACK delegates (PT2E + XnnpackPartitioner) against ExecuTorch's XNNPACK runtime.

Acceptance: every output element within one quantization step of ExecuTorch's output (the
scale of the graph's last qs8 -> float Convert; for float outputs of dynamically quantized
graphs, the step int8-quantizing the expected output would have). The committed programs are
in ``tests/fixtures/int8/``; a 224x224 int8 conv net and a model with more node shapes are
exported here when torch + executorch are installed (once per session). The XNNPACK int8 math
is also tested on its own.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from orchestra.backends.xnnpack import _quantized as Q
from orchestra.backends.xnnpack._blob import parse_blob
from orchestra.backends.xnnpack._compile import compile_graph
from orchestra.errors import BackendError, Error
from orchestra.program import load
from orchestra.runtime import load_program

REPO = pathlib.Path(__file__).resolve().parents[3]
INT8 = REPO / "tests" / "fixtures" / "int8"
XNNPACK = sorted(p.stem for p in INT8.glob("xnnpack_int8_*.pte"))


def _npz(path: pathlib.Path) -> tuple[list[np.ndarray], list[np.ndarray]]:
    with np.load(path, allow_pickle=False) as z:
        ins = [z[f"forward.in_{i}"] for i in range(sum(k.startswith("forward.in_") for k in z.files))]
        outs = [z[f"forward.out_{i}"] for i in range(sum(k.startswith("forward.out_") for k in z.files))]
    return ins, outs


def _graph(path: pathlib.Path) -> Any:
    prog = load(path)
    d = prog.execution_plan[0].delegates[0]
    assert d.id == "XnnpackBackend"
    return prog, parse_blob(prog.delegate_data(d.processed), str(path))


def output_steps(path: pathlib.Path, expected: list[np.ndarray]) -> list[float]:
    """One quantization step per output (see the module docstring)."""
    _, g = _graph(path)
    values = g.value_by_id()
    steps: dict[int, float] = {}
    for node in g.nodes:
        if node.type != "XNNConvert":
            continue
        src, dst = values[node.fields["input_id"]], values[node.fields["output_id"]]
        if dst.is_output and src.quant is not None and src.quant.kind == "PerTensorQuant":
            steps[dst.external_id] = float(src.quant.scale[0])
    outs = sorted(v.external_id for v in g.values if v.is_output)
    return [steps.get(ext, float(max(o.max(), 0) - min(o.min(), 0)) / 255) for ext, o in zip(outs, expected)]


def assert_within_one_step(name: str, got: list[np.ndarray], want: list[np.ndarray], steps: list[float]) -> None:
    assert len(got) == len(want)
    for i, (g, w, step) in enumerate(zip(got, want, steps)):
        assert g.shape == w.shape and g.dtype == w.dtype, f"{name}.out_{i}"
        err = np.abs(g.astype(np.float64) - w.astype(np.float64)).max()
        assert err <= step * (1 + 1e-5) + 1e-6, f"{name}.out_{i}: max error {err} > one step {step}"


def _run(path: pathlib.Path, ins: list[np.ndarray], times: int = 2) -> list[np.ndarray]:
    prog = load_program(path)
    with prog.load_method("forward") as m:
        for _ in range(times):  # the second run reuses the workspace
            got = m.execute(ins)
    return got


# --------------------------------------------------------------------------- committed programs


def test_int8_fixtures_are_xnnpack_int8_graphs() -> None:
    assert {"xnnpack_int8_convnet", "xnnpack_int8_block", "xnnpack_int8_dynamic_block"} <= set(XNNPACK)
    kinds = set()
    for name in XNNPACK:
        _, g = _graph(INT8 / f"{name}.pte")
        kinds |= {v.datatype_name for v in g.values}
    assert {"qint8", "qcint8", "qcint32", "qdint8"} <= kinds


@pytest.mark.parametrize("name", XNNPACK)
def test_int8_delegate_matches_executorch_within_one_step(name: str) -> None:
    path = INT8 / f"{name}.pte"
    ins, want = _npz(INT8 / f"{name}.npz")
    assert_within_one_step(name, _run(path, ins), want, output_steps(path, want))


def test_int8_plan_is_shared_and_instances_are_independent() -> None:
    path = INT8 / "xnnpack_int8_convnet.pte"
    ins, want = _npz(INT8 / "xnnpack_int8_convnet.npz")
    prog = load_program(path)
    m1, m2 = prog.load_method("forward"), prog.load_method("forward")
    rng = np.random.default_rng(0)
    other = rng.standard_normal(ins[0].shape).astype(np.float32)
    a = m1.execute(ins)[0]
    b = m2.execute([other])[0]
    again = m1.execute(ins)[0]
    np.testing.assert_array_equal(a, again)
    assert not np.array_equal(a, b)
    assert_within_one_step("xnnpack_int8_convnet", [a], want, output_steps(path, want))


def test_dynamic_quantization_follows_the_input_range() -> None:
    """qd8 parameters are computed per execute: scaling the input scales the output's
    dynamic part (the biases stay), which static parameters could not do."""
    path = INT8 / "xnnpack_int8_dynamic_block.pte"
    ins, _ = _npz(INT8 / "xnnpack_int8_dynamic_block.npz")
    prog = load_program(path)
    with prog.load_method("forward") as m:
        small = m.execute([ins[0] * np.float32(1e-3)])[0]
        big = m.execute([ins[0] * np.float32(1e3)])[0]
        zero = m.execute([np.zeros_like(ins[0])])[0]
    # With a zero input every FC sees a constant row: output = the bias path only.
    assert np.isfinite(zero).all()
    assert np.abs(big - zero).max() > 100 * np.abs(small - zero).max()


def test_corrupt_quantization_parameters_are_rejected() -> None:
    prog, g = _graph(INT8 / "xnnpack_int8_convnet.pte")

    def compile_with(index: int, **changes: Any) -> None:
        v = g.values[index]
        values = list(g.values)
        values[index] = dataclasses.replace(v, quant=dataclasses.replace(v.quant, **changes))
        compile_graph(dataclasses.replace(g, values=tuple(values)), "bad.pte", prog.named_data_bytes)

    weights = next(i for i, v in enumerate(g.values) if v.datatype_name == "qcint8")
    act = next(i for i, v in enumerate(g.values) if v.datatype_name == "qint8")
    cases = [
        (weights, {"num_scales": 3}, "scales"),
        (weights, {"channel_dim": 7}, "channel_dim 7"),
        (weights, {"scale_buffer_idx": 999}, "out of range"),
        (act, {"scale": (0.0,)}, "finite and positive"),
        (act, {"scale": (float("nan"),)}, "finite and positive"),
        (act, {"zero_point": 300}, "zero point 300"),
        (act, {"scale": (0.1, 0.2)}, "2 scales"),
    ]
    for index, changes, match in cases:
        with pytest.raises(BackendError, match=match) as exc:
            compile_with(index, **changes)
        assert f"id {g.values[index].id}" in str(exc.value)
        assert exc.value.code in (Error.InvalidProgram, Error.NotSupported)


def test_scale_checks_reject_every_non_finite_or_non_positive_scale() -> None:
    """_qparams' check of the scales, on each of its paths (a Python loop up to 16 scales, numpy
    reductions beyond, the compiled kernels' one pass over float32): a NaN (either sign), an
    infinity, a zero (either sign) or a negative anywhere fails it; the smallest subnormal and
    the largest float32 pass."""
    from orchestra.backends.xnnpack._quantized import _finite_positive
    from orchestra.runtime.kernels import compiled

    for native in {None, compiled()}:
        for n in (1, 2, 16, 17, 1000):
            for dtype in (np.float32, np.float64):
                good = np.full(n, 0.02, dtype)
                assert _finite_positive(good, native)
                for edge in (1e-45, 3.4028235e38):
                    a = good.copy()
                    a[n // 2] = edge
                    assert _finite_positive(a, native), (n, edge)
                for bad in (np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, -0.5, -1e-45):
                    for at in {0, n // 2, n - 1}:
                        a = good.copy()
                        a[at] = bad
                        assert not _finite_positive(a, native), (n, dtype, bad, at)
            strided = np.full(2 * n, 0.02, np.float32)[::2]  # not contiguous
            strided[-1] = 0.0
            assert not _finite_positive(strided, native)
    native = compiled()
    if native is not None:
        a = np.full(40, 0.5, np.float32)
        a[39] = np.nan
        assert native.positive_finite_f32(a, 39) and not native.positive_finite_f32(a, 40)
        with pytest.raises(ValueError, match="fewer than the 41 float32"):
            native.positive_finite_f32(a, 41)


# --------------------------------------------------------------------------- exported in the test


def _export_tool() -> Any:
    name = "export_quant_fixtures"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / "export_quant_fixtures.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _exported(tmp_path_factory: pytest.TempPathFactory, which: str) -> dict[str, Any]:
    pytest.importorskip("executorch.runtime")
    pytest.importorskip("torchao")
    import warnings

    from executorch.runtime import Runtime

    if not Runtime.get().backend_registry.is_available("XnnpackBackend"):
        pytest.skip("XnnpackBackend is not registered in this ExecuTorch runtime")
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    tool = _export_tool()
    spec = {"convnet224": tool.big_convnet_spec, "wide": tool.wide_spec, "islands": tool.islands_spec}.get(
        which, tool.variety_spec)()
    # Same folder as tests/test_quantized_programs.py: one export per session.
    pairs = tool.cached_pair(spec, tmp_path_factory.getbasetemp() / f"int8_{which}")
    return {name: (path, [a["forward.in_0"]],
                   [a[f"forward.out_{i}"] for i in range(sum(k.startswith("forward.out_") for k in a))])
            for name, (path, a) in pairs.items()}


@pytest.fixture(scope="session")
def int8_pair(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, Any]]:
    """The exported pair of a test model by name (convnet224, variety, wide, islands), each
    exported once per session."""
    pairs: dict[str, dict[str, Any]] = {}

    def get(which: str) -> dict[str, Any]:
        if which not in pairs:
            pairs[which] = _exported(tmp_path_factory, which)
        return pairs[which]

    return get


@pytest.mark.executorch
@pytest.mark.parametrize("products", ["int8", "float32"])
@pytest.mark.parametrize("which", ["wide", "convnet224", "variety", "islands"])
def test_the_compiled_int8_path_equals_the_numpy_path_and_executorch(which: str, products: str,
                                                                     int8_pair: Callable[[str], dict[str, Any]],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Where orchestra's compiled kernels are built, int8 convolutions (depthwise, 1x1,
    im2col, grouped, the RGB stem), fully-connected layers, multiplies and converts run on
    them. Many-row products (1x1 convolutions, convolutions of one group) take qs8_gemm's /
    qs8_conv's int32 sums where the CPU has AVX-512 VNNI, depthwise ones dwconv_qs8 where it
    has AVX-512; else (``float32``, also where the test hides those) exact float32 products of
    centred values (dot products over 514 terms split into parts) and one requantizing pass.
    Bit-equal to the numpy path, and within one step of ExecuTorch. Linear layers of few rows
    sum int32 over the int8 filter."""
    from orchestra.runtime import kernels

    module = kernels.compiled()
    if module is None:
        pytest.skip("orchestra's compiled kernels are not built")
    if products == "int8" and not (module.QS8_GEMM_VNNI or module.QS8_GEMM_AVX2):
        pytest.skip("this CPU has neither AVX-512 VNNI nor AVX2: the float32 products run (the int8 kernels' plain "
                    "copies are tested in tests/test_native_kernels.py)")
    path, ins, want = int8_pair(which)[f"xnnpack_int8_{which}"]
    bound: set[str] = set()
    lookups = [0]

    class Recording:
        def __getattr__(self, kernel: str) -> Any:
            if kernel in ("QS8_GEMM_VNNI", "QS8_GEMM_AVX2", "DWCONV_QS8_AVX512", "DWCONV_QS8_AVX2"):
                return getattr(module, kernel) if products == "int8" else 0
            bound.add(kernel)
            lookups[0] += kernel == "lut_u8"
            return getattr(module, kernel)

    monkeypatch.setattr(kernels, "compiled", lambda: Recording())
    compiled = _run(path, ins)
    monkeypatch.setattr(kernels, "compiled", lambda: None)
    numpy_path = _run(path, ins)
    for g, n in zip(compiled, numpy_path):
        np.testing.assert_array_equal(g, n)
    assert_within_one_step(f"xnnpack_int8_{which}", compiled, want, output_steps(path, want))
    if which == "islands":
        # hardswish, two lone sigmoids, a SiLU: one lookup each (the tables made by the
        # islands' own float steps). Staying as they are: the SiLU whose float result a float
        # mean also reads, and hardsigmoid's add / clamp / clamp / divide, whose 3 and 6 the
        # exporter passes in as the delegate's inputs (a table can't be made before they come)
        assert lookups[0] == 4, lookups
        return
    assert lookups[0] == 0
    # every model ends in a 1-row linear layer (qs8_rows_dot); the variety model's other
    # products are grouped or stem convolutions (gconv), the others have many-row 1x1 ones
    assert {"quantize_qs8", "dequantize_qs8", "qs8_rows_dot"} <= bound, bound
    if products == "float32" or which == "variety":  # float32 products, grouped convolutions
        assert "requant_qs8" in bound, bound
    if which != "variety":
        assert ("qs8_gemm" if products == "int8" else "linear_f32") in bound, bound
    if products == "float32":
        assert not {"qs8_gemm", "qs8_conv", "qs8_gconv", "dwconv_qs8"} & bound, bound
    elif which != "variety":
        assert "qs8_conv" in bound, bound  # the RGB stem (and the wide model's 3x3 convolutions)
    if which != "convnet224":
        assert {"mul_qs8", "gap_qs8"} <= bound, bound  # x * y of one shape; global average pooling
    else:
        assert "add_qs8" in bound, bound  # the residual connection
    if which == "wide":
        one_pass = module.DWCONV_QS8_AVX512 or module.DWCONV_QS8_AVX2  # (the wide model's channels: 96)
        dw = "dwconv_qs8" if products == "int8" and one_pass else "dwconv_nhwc_f32"
        assert {dw, "qs8_gconv" if products == "int8" else "gconv_nhwc_f32"} <= bound, bound
        _, g = _graph(path)
        ks = []
        for node in g.nodes:  # the dot-product lengths the graph holds
            if node.type == "XNNConv2d":
                f = node.fields
                ks.append(f["kernel_height"] * f["kernel_width"] * f["group_input_channels"])
        assert max(ks) > Q._EXACT_K and min(ks) < Q._EXACT_K, ks


@pytest.mark.executorch
def test_224_int8_delegate_matches_executorch(int8_pair: Callable[[str], dict[str, Any]]) -> None:
    path, ins, want = int8_pair("convnet224")["xnnpack_int8_convnet224"]
    assert ins[0].shape == (1, 3, 224, 224)
    assert_within_one_step("xnnpack_int8_convnet224", _run(path, ins, times=1), want, output_steps(path, want))


@pytest.mark.executorch
def test_more_int8_node_shapes_match_executorch(int8_pair: Callable[[str], dict[str, Any]]) -> None:
    variety = int8_pair("variety")
    path, ins, want = variety["xnnpack_int8_variety"]
    _, g = _graph(path)
    types = {n.type for n in g.nodes}
    assert {"XNNConv2d", "XNNDepthwiseConv2d", "XNNClamp", "XNNMultiply", "XNNMaxPooling2d",
            "XNNGlobalAvgPooling2d", "XNNFullyConnected"} <= types
    assert_within_one_step("xnnpack_int8_variety", _run(path, ins), want, output_steps(path, want))
    # The portable twin of the same quantized graph agrees too.
    ppath, pins, pwant = variety["int8_variety"]
    assert_within_one_step("int8_variety", _run(ppath, pins), pwant, output_steps(path, pwant))


# --------------------------------------------------------------------------- the math on its own


def test_the_compiled_multiply_takes_same_shapes_and_per_channel_gates_either_way_round() -> None:
    assert Q._mul_layout((1, 7, 7, 96), (1, 7, 7, 96), (1, 7, 7, 96)) == (False, 1, 49, 96, 49)
    assert Q._mul_layout((2, 7, 7, 96), (2, 7, 7, 96), (2, 1, 1, 96)) == (False, 2, 49, 96, 1)
    assert Q._mul_layout((1, 7, 7, 96), (1, 1, 96), (1, 7, 7, 96)) == (True, 1, 49, 96, 1)  # gate first, lower rank
    assert Q._mul_layout((6,), (6,), (6,)) == (False, 1, 1, 6, 1)
    assert Q._mul_layout((2, 7, 7, 96), (2, 7, 7, 96), (1, 1, 1, 96)) is None  # one gate for every image
    assert Q._mul_layout((1, 7, 7, 96), (1, 7, 7, 96), (1, 7, 1, 96)) is None


@pytest.mark.parametrize("sa,za,sb,zb,so,zo", [(0.02, 3, 0.05, -10, 0.04, 1), (0.5, -128, 0.001, 127, 0.3, 0),
                                                (0.01, 0, 0.01, 0, 0.02, -5)])
def test_the_compiled_int8_add_is_xnnpacks_fixed_point_add(sa: float, za: int, sb: float, zb: int, so: float,
                                                           zo: int) -> None:
    from orchestra.runtime import kernels

    native = kernels.compiled()
    if native is None:
        pytest.skip("orchestra's compiled kernels are not built")
    rng = np.random.default_rng(5)
    a = rng.integers(-128, 128, size=100_003).astype(np.int8)
    b = rng.integers(-128, 128, size=a.size).astype(np.int8)
    p = Q.add_params(sa, za, sb, zb, so)
    out = np.empty_like(a)
    native.add_qs8(a, b, out, a.size, p.a_multiplier, p.b_multiplier, p.bias, p.shift, zo, -128, 110)
    np.testing.assert_array_equal(out, Q.qs8_add(a, b, p, zo, -128, 110))
    native.add_qs8(a, b, a, a.size, p.a_multiplier, p.b_multiplier, p.bias, p.shift, zo, -128, 110)  # in place
    np.testing.assert_array_equal(a, out)
    with pytest.raises(ValueError, match="fewer int8"):
        native.add_qs8(a, b[:10], out, a.size, p.a_multiplier, p.b_multiplier, p.bias, p.shift, zo, -128, 127)
    with pytest.raises(ValueError, match="inconsistent"):
        native.add_qs8(a, b, out, a.size, 1 << 22, p.b_multiplier, p.bias, p.shift, zo, -128, 127)


def test_the_compiled_int8_mean_sums_in_int32_and_rounds_twice() -> None:
    from orchestra.runtime import kernels

    native = kernels.compiled()
    if native is None:
        pytest.skip("orchestra's compiled kernels are not built")
    rng = np.random.default_rng(4)
    for n, p, ch in [(1, 49, 1280), (2, 3136, 24), (3, 1, 600)]:
        x = rng.integers(-128, 128, size=(n, p, ch)).astype(np.int8)
        s = np.float32(np.float32(0.7) * (np.float32(1) / np.float32(p)))
        yzp = np.float32(3) - np.float32(np.float32(p * -5) * s)
        lo, hi = -128, 120
        v = np.multiply(x.sum(axis=1, dtype=np.int32).astype(np.float32), s, dtype=np.float32) + yzp
        want = np.clip(np.rint(v), lo, hi).astype(np.int8)
        out = np.empty((n, ch), np.int8)
        native.gap_qs8(x, out, n, p, ch, float(s), float(yzp), float(lo), float(hi))
        np.testing.assert_array_equal(out, want)
    with pytest.raises(ValueError, match="fewer int8"):
        native.gap_qs8(x, out[:1], n, p, ch, 1.0, 0.0, -128.0, 127.0)
    with pytest.raises(ValueError, match="inconsistent"):
        native.gap_qs8(x, out, n, p, ch, 1.0, 0.0, 1.0, -1.0)


def test_the_compiled_int8_multiply_is_the_numpy_one() -> None:
    from orchestra.runtime import kernels

    native = kernels.compiled()
    if native is None:
        pytest.skip("orchestra's compiled kernels are not built")
    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, size=(2, 5, 5, 24)).astype(np.int8)
    for b in (rng.integers(-128, 128, size=(2, 5, 5, 24)).astype(np.int8),
              rng.integers(-128, 128, size=(2, 1, 1, 24)).astype(np.int8)):
        za, zb, zp, scale = 3, -7, 2, np.float32(2.5e-4)
        lo, hi = -128, 100
        want = Q.requantize(np.multiply(a.astype(np.int32) - za, b.astype(np.int32) - zb), scale, zp, lo, hi)
        out = np.empty_like(a)
        native.mul_qs8(a, za, b, zb, out, 2, 25, 24, b.shape[1] * b.shape[2], float(scale), float(lo - zp),
                       float(hi - zp), zp)
        np.testing.assert_array_equal(out, want)
    with pytest.raises(ValueError, match="fewer int8"):
        native.mul_qs8(a, 0, b, 0, out, 2, 25, 24, 25, 1.0, -128.0, 127.0, 0)  # b holds one row per image
    with pytest.raises(ValueError, match="inconsistent"):
        native.mul_qs8(a, 0, b, 0, out, 2, 25, 24, 5, 1.0, -128.0, 127.0, 0)
    with pytest.raises(ValueError, match="overlaps"):
        native.mul_qs8(a, 0, a, 0, a, 2, 25, 24, 25, 1.0, -128.0, 127.0, 0)


def test_quantize_rounds_half_to_even_and_saturates() -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 126.5, 127.5, 1e9, -1e9, -128.5], np.float32)
    np.testing.assert_array_equal(Q.quantize(x, 1.0, 0), [0, 2, 2, 0, -2, 126, 127, 127, -128, -128])
    # zero point shifts before rounding: 0.5 + 3 -> 3.5 is not a tie of the product
    np.testing.assert_array_equal(Q.quantize(np.array([0.5, 1.5], np.float32), 1.0, 3), [3, 5])
    q = Q.quantize(np.array([-1.0, 0.0, 1.0], np.float32), 0.5, 128, 0, 255, np.uint8)
    np.testing.assert_array_equal(q, [126, 128, 130])


def test_quantize_agrees_with_the_portable_kernel_in_range() -> None:
    from orchestra.runtime.kernels import get_kernel

    rng = np.random.default_rng(1)
    x = (rng.standard_normal(4096) * 3).astype(np.float32)
    kd = get_kernel("quantized_decomposed::quantize_per_tensor.out")
    assert kd is not None
    for scale, zp in ((0.02, 0), (0.013, -7), (1 / 3, 5)):
        want = kd.fn(x, scale, zp, -128, 127, 1, np.zeros(x.shape, np.int8))
        np.testing.assert_array_equal(Q.quantize(x, np.float32(scale), zp), want)


def test_dequantize() -> None:
    q = np.arange(-128, 128, dtype=np.int8)
    np.testing.assert_array_equal(Q.dequantize(q, 0.25, -3), ((q.astype(np.int32) + 3) * np.float32(0.25)).astype(np.float32))


def test_requantize_ties_and_bounds() -> None:
    acc = np.array([1, 3, 5, -1, -3, 1000, -1000, 0], np.int64)
    np.testing.assert_array_equal(Q.requantize(acc, np.float32(0.5), 0), [0, 2, 2, 0, -2, 127, -128, 0])
    np.testing.assert_array_equal(Q.requantize(acc, np.float32(0.5), -128, -128, 127)[:3], [-128, -126, -126])
    np.testing.assert_array_equal(Q.requantize(acc, np.float32(1.0), 10, 10, 20), [11, 13, 15, 10, 10, 20, 10, 10])


def test_quantize_bound() -> None:
    assert Q.quantize_bound(0.0, 0.1, -5) == -5
    assert Q.quantize_bound(math.inf, 0.1, -5) == 127
    assert Q.quantize_bound(-math.inf, 0.1, -5) == -128
    assert Q.quantize_bound(6.0, 0.05, -128) == -8
    assert Q.quantize_bound(1e9, 1e-9, 0) == 127


def test_requantization_scale_is_float32_left_to_right() -> None:
    s = Q.requantization_scale(0.1, np.array([0.02, 0.003], np.float32), 0.07)
    assert s.dtype == np.float32
    np.testing.assert_array_equal(s, (np.float32(0.1) * np.array([0.02, 0.003], np.float32)) / np.float32(0.07))


def test_compiled_requantization_scale_is_bit_equal_to_numpy() -> None:
    from orchestra.runtime import kernels

    native = kernels.compiled()
    if native is None:
        pytest.skip("orchestra's compiled kernels are not built")
    rng = np.random.default_rng(21)
    for n in (1, 7, 64, 1000):
        fs = (10.0 ** rng.uniform(-38, 3, n)).astype(np.float32)
        fs[: n // 3] = rng.uniform(1e-4, 1e-1, n // 3)  # the usual range, with everything else around it
        for xs, os_ in [(0.02, 0.05), (1e-30, 1e30), (3e38, 1e-3), (1e-45, 7.0), (0.1, 0.07)]:
            out = np.empty(n, np.float32)
            native.qs8_requant_scale(fs, n, xs, os_, out)
            with np.errstate(all="ignore"):
                want = Q.requantization_scale(xs, fs, os_)
            np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))
    fs = np.full(8, 0.5, np.float32)
    with pytest.raises(ValueError, match="fewer than the 9 float32"):
        native.qs8_requant_scale(fs, 9, 1.0, 1.0, np.empty(9, np.float32))
    with pytest.raises(ValueError, match="overlaps"):
        native.qs8_requant_scale(fs, 8, 1.0, 1.0, fs)


def test_exact_dtype_switches_to_float64_when_float32_sums_could_round() -> None:
    assert Q.exact_dtype(27) == np.float32 and Q.exact_dtype(514) == np.float32
    assert Q.exact_dtype(515) == np.float64 and Q.exact_dtype(3136) == np.float64
    k = 514  # the largest float32 case: the worst-case sum is still an exact float32
    assert float(np.float32(k * 255 * 128)) == k * 255 * 128 and k * 255 * 128 < 2**24


def test_int_matmul_is_exact() -> None:
    rng = np.random.default_rng(2)
    xc = rng.integers(-255, 256, (7, 1000))
    w = rng.integers(-127, 128, (1000, 9))
    np.testing.assert_array_equal(Q.int_matmul(xc, w).astype(np.int64), xc.astype(np.int64) @ w.astype(np.int64))


@pytest.mark.parametrize(("sa", "za", "sb", "zb", "so", "zo"), [
    (0.02, 3, 0.03, -5, 0.04, 1), (0.1, -128, 0.1, -128, 0.2, -128), (0.005, 0, 0.9, 10, 0.05, -2),
])
def test_qs8_add_is_within_one_step_of_the_float_sum(sa: float, za: int, sb: float, zb: int, so: float, zo: int) -> None:
    p = Q.add_params(sa, za, sb, zb, so)
    assert (1 << 20) <= max(abs(p.a_multiplier), abs(p.b_multiplier)) <= (1 << 21)
    assert 12 <= p.shift <= 30
    for m, s in ((p.a_multiplier, sa), (p.b_multiplier, sb)):
        assert abs(m / 2.0**p.shift - np.float32(s) / np.float32(so)) <= 2.0**-p.shift
    a = np.arange(-128, 128, dtype=np.int8).repeat(256)
    b = np.tile(np.arange(-128, 128, dtype=np.int8), 256)
    got = Q.qs8_add(a, b, p, zo)
    exact = ((a.astype(np.float64) - za) * sa + (b.astype(np.float64) - zb) * sb) / so + zo
    inside = (exact > -127.5) & (exact < 126.5)
    assert np.abs(got[inside] - exact[inside]).max() <= 0.5 + 1e-3  # correctly rounded, up to the multiplier's 21 bits
    assert (got[exact >= 127.5] == 127).all() and (got[exact <= -128.5] == -128).all()


def _add_params_numpy(a_scale: float, a_zp: int, b_scale: float, b_zp: int, out_scale: float) -> tuple[int, ...]:
    """xnn_init_qs8_add_minmax_scalar_params in numpy float32 scalars (the reference add_params'
    Python-float arithmetic must equal)."""
    bits = lambda v: int(np.array(v, np.float32).view(np.uint32))  # noqa: E731
    from_bits = lambda b: float(np.array(b & 0xFFFFFFFF, np.uint32).view(np.float32))  # noqa: E731
    with np.errstate(all="ignore"):
        a_os, b_os = np.float32(a_scale) / np.float32(out_scale), np.float32(b_scale) / np.float32(out_scale)
    abs_a, abs_b = abs(float(a_os)), abs(float(b_os))
    if not all(2.0**-10 <= r < 2.0**8 for r in (abs_a, abs_b)):
        raise ValueError("out of range")
    shift = 20 - ((bits(max(abs_a, abs_b)) >> 23) - 127)
    a_mul = int(np.rint(np.float32(from_bits(bits(abs_a) + (shift << 23))))) * (-1 if a_os < 0 else 1)
    b_mul = int(np.rint(np.float32(from_bits(bits(abs_b) + (shift << 23))))) * (-1 if b_os < 0 else 1)
    return a_mul, b_mul, (1 << (shift - 1)) - a_mul * a_zp - b_mul * b_zp, shift


def test_add_params_equal_numpy_float32_arithmetic() -> None:
    rng = np.random.default_rng(11)
    cases = [(float(np.float32(a)), int(za), float(np.float32(b)), int(zb), float(np.float32(o)))
             for (a, b, o), (za, zb) in zip(10.0 ** rng.uniform(-5, 1, (20_000, 3)), rng.integers(-128, 128, (20_000, 2)))]
    f32 = lambda v: float(np.float32(v))  # noqa: E731
    for o in (1.0, 0.37, 3e-3):  # ratios at and next to the range's ends, and exact halves after the shift
        for r in (2.0**-10, 2.0**8, f32(2.0**8 * (1 - 2**-24)), f32(2.0**-10 * (1 - 2**-24)), 1.5, 0.75 + 2**-22):
            cases += [(f32(r * o), 5, f32(0.5 * o), -7, o), (-f32(r * o), -128, f32(r * o), 127, o)]
    valid = 0
    for a, za, b, zb, o in cases:
        try:
            want = _add_params_numpy(a, za, b, zb, o)
        except ValueError:
            with pytest.raises(ValueError, match="outside XNNPACK's range"):
                Q.add_params(a, za, b, zb, o)
            continue
        p = Q.add_params(a, za, b, zb, o)
        assert (p.a_multiplier, p.b_multiplier, p.bias, p.shift) == want, (a, za, b, zb, o)
        valid += 1
    assert valid > 5_000
    for bad in (0.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="outside XNNPACK's range"):
            Q.add_params(0.1, 0, 0.1, 0, bad)


def test_qs8_add_rejects_unsupported_scale_ratios() -> None:
    with pytest.raises(ValueError, match="outside XNNPACK's range"):
        Q.add_params(1.0, 0, 1.0, 0, 1e-4)


def test_qd8_rows() -> None:
    rng = np.random.default_rng(3)
    x = np.concatenate([
        rng.standard_normal((4, 33)).astype(np.float32) * 5,
        np.abs(rng.standard_normal((1, 33))).astype(np.float32),  # all positive: zp -128
        -np.abs(rng.standard_normal((1, 33))).astype(np.float32),  # all negative: zp 127
        np.zeros((1, 33), np.float32),  # constant row: scale 1
    ])
    q, step, zp = Q.quantize_rows(x)
    assert q.dtype == np.int8 and step.dtype == np.float32 and zp.dtype == np.int32
    assert zp[4] == -128 and zp[5] == 127 and step[6] == 1 and (q[6] == zp[6]).all()
    back = Q.dequantize(q, step[:, None], zp[:, None])
    assert (np.abs(back - x) <= step[:, None] * 0.5 + 1e-6 * np.abs(x) + 1e-7).all()
    # Each row uses its full range: one end reaches -128 or 127.
    assert ((q.min(axis=1)[:6] == -128) | (q.max(axis=1)[:6] == 127)).all()
    scale, step2, zp2 = Q.qd8_params(np.float32(-1.0), np.float32(1.0))
    assert scale == np.float32(255 / 2) and step2 == np.float32(1) / np.float32(255 / 2) and zp2 in (0, -1)
