"""The AOT layer: BackendDetails registration, and ProgramBuilder programs that run the same
in orchestra, in numpy and in ExecuTorch's own runtime.

The ExecuTorch cross-checks skip when executorch is not installed.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

import orchestra.aot as aot
from orchestra.aot import (
    BackendDetails,
    CompileSpec,
    PreprocessResult,
    ProgramBuilder,
    aot_backends,
    get_aot_backend,
    operator_schema,
    plan_memory,
    register_aot_backend,
)
from orchestra.errors import BackendError, Error, InvalidArgumentError, OperatorMissingError
from orchestra.program import (
    Bool,
    BoolList,
    DelegateCall,
    Double,
    DoubleList,
    Int,
    IntList,
    KernelCall,
    Null,
    OptionalTensorList,
    ProgramDef,
    String,
    Tensor,
    TensorList,
    TensorShapeDynamism,
    dumps,
    load,
    loads,
    numpy_dtype,
)
from orchestra.runtime import Backend, BackendInterface, load_program, register_backend, registered_backends

try:  # tests/ may or may not be a package
    from ._executorch import FIXTURES, run_executorch
except ImportError:
    from _executorch import FIXTURES, run_executorch  # type: ignore[no-redef]

ATOL = 1e-5
RNG = np.random.default_rng(20240611)


def randn(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# ---------------------------------------------------------------------------------------
# public surface


def test_public_names_are_importable() -> None:
    for name in aot.__all__:
        assert getattr(aot, name) is not None, name
    assert aot.CompileSpec is __import__("orchestra.program", fromlist=["CompileSpec"]).CompileSpec


# ---------------------------------------------------------------------------------------
# BackendDetails registry


class _Echo(BackendDetails):
    @staticmethod
    def preprocess(program: Any, compile_specs: Any) -> PreprocessResult:
        return PreprocessResult(b"echo" + b"".join(cs.value for cs in compile_specs))


if "AotTestEcho" not in aot_backends():
    register_aot_backend("AotTestEcho", _Echo)


def test_registered_backend_is_found_and_preprocesses() -> None:
    assert "AotTestEcho" in aot_backends()
    details = get_aot_backend("AotTestEcho")
    assert details is _Echo
    assert details.preprocess(None, [CompileSpec("k", b"v")]) == PreprocessResult(b"echov")


def test_abstract_subclass_is_rejected() -> None:
    class NoPreprocess(BackendDetails):
        pass

    with pytest.raises(InvalidArgumentError, match="NoPreprocess is abstract .*preprocess") as ei:
        register_aot_backend("AotTestAbstract", NoPreprocess)
    assert ei.value.code is Error.InvalidArgument
    assert "AotTestAbstract" not in aot_backends()


def test_non_subclass_is_rejected() -> None:
    class NotDetails:
        @staticmethod
        def preprocess(program: Any, compile_specs: Any) -> PreprocessResult:
            return PreprocessResult(b"")

    with pytest.raises(InvalidArgumentError, match="'AotTestNot'.*NotDetails.*not a BackendDetails subclass"):
        register_aot_backend("AotTestNot", NotDetails)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="not a BackendDetails subclass"):
        register_aot_backend("AotTestNot", _Echo())  # type: ignore[arg-type]
    assert "AotTestNot" not in aot_backends()


def test_duplicate_name_is_rejected() -> None:
    with pytest.raises(InvalidArgumentError, match="AOT backend 'AotTestEcho' is already registered"):
        register_aot_backend("AotTestEcho", _Echo)


def test_unknown_backend_is_not_found_and_lists_registered() -> None:
    with pytest.raises(BackendError, match="AOT backend 'Nope' is not registered .*AotTestEcho") as ei:
        get_aot_backend("Nope")
    assert ei.value.code is Error.NotFound


def test_backends_are_discovered_through_entry_points(tmp_path) -> None:
    (tmp_path / "ep_aot_backend.py").write_text(textwrap.dedent("""
        from orchestra.aot import BackendDetails, PreprocessResult

        class Reverse(BackendDetails):
            @staticmethod
            def preprocess(program, compile_specs):
                return PreprocessResult(bytes(reversed(compile_specs[0].value)))
    """))
    dist = tmp_path / "ep_aot_backend-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-aot-backend\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[orchestra.aot_backends]\nEpReverse = ep_aot_backend:Reverse\n")
    code = textwrap.dedent("""
        from orchestra.aot import CompileSpec, aot_backends, get_aot_backend
        assert "EpReverse" in aot_backends(), aot_backends()
        print(get_aot_backend("EpReverse").preprocess(None, [CompileSpec("k", b"abc")]).processed_bytes.decode())
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.path.dirname(__file__)]))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "cba"


def test_broken_entry_point_names_itself(tmp_path) -> None:
    (tmp_path / "ep_broken.py").write_text("class Abstract:\n    pass\n")
    dist = tmp_path / "ep_broken-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-broken\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[orchestra.aot_backends]\nEpBroken = ep_broken:Abstract\n")
    code = textwrap.dedent("""
        from orchestra.aot import get_aot_backend
        from orchestra.errors import BackendError
        try:
            get_aot_backend("EpBroken")
        except BackendError as e:
            print(e.code.name, e.message)
    """)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("NotFound entry point 'EpBroken'"), r.stdout
    assert "not a BackendDetails subclass" in r.stdout


# ---------------------------------------------------------------------------------------
# numpy references


def conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int, pad: int) -> np.ndarray:
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    ho, wo = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((n, o, ho, wo), np.float64)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i : i + stride * ho : stride, j : j + stride * wo : stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return (out + b[None, :, None, None]).astype(np.float32)


def maxpool2x2(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n, c, h, w = x.shape
    win = x.reshape(n, c, h // 2, 2, w // 2, 2).transpose(0, 1, 2, 4, 3, 5).reshape(n, c, h // 2, w // 2, 4)
    k = win.argmax(-1)
    rows = np.arange(h // 2)[:, None] * 2 + k // 2
    cols = np.arange(w // 2)[None, :] * 2 + k % 2
    return win.max(-1), (rows * w + cols).astype(np.int64)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


# ---------------------------------------------------------------------------------------
# ProgramBuilder programs


@dataclass
class Case:
    builder: ProgramBuilder
    runs: list[tuple[str, list[np.ndarray], list[np.ndarray]]]  # (method, inputs, expected)


def case_mlp() -> Case:
    w1, b1, w2, b2 = randn(6, 16), randn(16), randn(16, 4), randn(4)
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (3, 6))
    h = f.call("aten::mm.out", x, f.constant(w1))
    h = f.call("aten::add.out", h, f.constant(b1))
    h = f.call("aten::relu.out", h)
    y = f.call("aten::addmm.out", f.constant(b2), h, f.constant(w2), beta=1, alpha=0.5)
    f.output(y)
    xin = randn(3, 6)
    ref = b2 + 0.5 * (np.maximum(xin @ w1 + b1, 0) @ w2)
    return Case(b, [("forward", [xin], [ref])])


def case_conv_bn_pool() -> Case:
    w, cb = randn(4, 3, 3, 3) * 0.5, randn(4)
    gamma, beta, mean, var = randn(4), randn(4), randn(4), np.abs(randn(4)) + 0.5
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (1, 3, 8, 8))
    y = f.call("aten::convolution.out", x, f.constant(w), f.constant(cb), [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    bn, save_mean, save_invstd = f.call(
        "aten::_native_batch_norm_legit_no_training.out",
        y, f.constant(gamma), f.constant(beta), f.constant(mean), f.constant(var), 0.1, 1e-5,
    )
    assert save_mean.shape == (0,) and save_invstd.shape == (0,)
    r = f.call("aten::relu.out", bn)
    pooled, indices = f.call("aten::max_pool2d_with_indices.out", r, [2, 2], [2, 2])
    assert indices.dtype == np.int64
    f.output(pooled, indices)
    xin = randn(1, 3, 8, 8)
    c = conv2d(xin, w, cb, 1, 1)
    c = (c - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5) * gamma[None, :, None, None] + beta[None, :, None, None]
    ref_pool, ref_idx = maxpool2x2(np.maximum(c, 0))
    return Case(b, [("forward", [xin], [ref_pool, ref_idx])])


def case_layer_norm_gelu_softmax() -> Case:
    gamma, beta = randn(8), randn(8)
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (2, 5, 8))
    y, mu, rstd = f.call("aten::native_layer_norm.out", x, [8], f.constant(gamma), f.constant(beta), 1e-5)
    g = f.call("aten::gelu.out", y, approximate="tanh")
    s = f.call("aten::_softmax.out", g, -1, False)
    f.output(s, rstd)
    xin = randn(2, 5, 8)
    m = xin.mean(-1, keepdims=True)
    v = xin.var(-1, keepdims=True)
    norm = (xin - m) / np.sqrt(v + 1e-5) * gamma + beta
    return Case(b, [("forward", [xin], [softmax(gelu_tanh(norm)), 1 / np.sqrt(v + 1e-5)])])


def case_cat_split() -> Case:
    c = randn(2, 1)
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (2, 3))
    y = f.input(np.float32, (2, 2))
    cat = f.call("aten::cat.out", [x, y, f.constant(c)], 1)
    p0, p1 = f.call("aten::split_with_sizes_copy.out", cat, [4, 2], 1)
    f.output(cat, f.call("aten::mul.out", p1, np.float32(2.0)), p0)
    xin, yin = randn(2, 3), randn(2, 2)
    full = np.concatenate([xin, yin, c], 1)
    return Case(b, [("forward", [xin, yin], [full, full[:, 4:] * 2, full[:, :4]])])


def case_view_permute() -> Case:
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (6, 4))
    v = f.call("aten::view_copy.out", x, [2, 3, 4])
    p = f.call("aten::permute_copy.out", v, [2, 0, 1])
    t = f.call("aten::transpose_copy.int_out", p, 0, 2)
    f.output(p, t)
    xin = randn(6, 4)
    ref = xin.reshape(2, 3, 4).transpose(2, 0, 1)
    return Case(b, [("forward", [xin], [ref, ref.transpose(2, 1, 0)])])


def case_dynamic_batch() -> Case:
    w, bias = randn(6, 5), randn(5)
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (8, 2, 3), dynamic=True)
    n = f.call("aten::sym_size.int", x, 0)
    assert n.kind == "int" and n.dynamic
    flat = f.call("aten::view_copy.out", x, [n, -1])
    h = f.call("aten::relu.out", flat)
    y = f.call("aten::addmm.out", f.constant(bias), h, f.constant(w))
    assert y.dynamic and y.shape == (8, 5)
    f.output(y)
    runs = []
    for batch in (3, 1, 8):
        xin = randn(batch, 2, 3)
        runs.append(("forward", [xin], [bias + np.maximum(xin.reshape(batch, 6), 0) @ w]))
    return Case(b, runs)


def case_two_methods() -> Case:
    w, bias = randn(12, 8), randn(8)
    b = ProgramBuilder()
    enc = b.method("encode")
    x = enc.input(np.float32, (4, 12))
    enc.output(enc.call("aten::tanh.out", enc.call("aten::addmm.out", enc.constant(bias), x, enc.constant(w))))
    fwd = b.method("forward")
    x2 = fwd.input(np.float32, (2, 12))
    h = fwd.call("aten::tanh.out", fwd.call("aten::addmm.out", fwd.constant(bias), x2, fwd.constant(w)))
    fwd.output(fwd.call("aten::sigmoid.out", h))
    a, c = randn(4, 12), randn(2, 12)
    return Case(b, [
        ("encode", [a], [np.tanh(a @ w + bias)]),
        ("forward", [c], [1 / (1 + np.exp(-np.tanh(c @ w + bias)))]),
    ])


def case_memory_reuse() -> Case:
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (32, 32))
    h = x
    for op in ("aten::relu.out", "aten::neg.out", "aten::sigmoid.out", "aten::tanh.out", "aten::exp.out", "aten::neg.out"):
        h = f.call(op, h)
    f.output(f.call("aten::add.out", h, x, alpha=2))
    xin = randn(32, 32)
    ref = np.exp(np.tanh(1 / (1 + np.exp(np.maximum(xin, 0)))))
    return Case(b, [("forward", [xin], [-ref + 2 * xin])])


CASES: dict[str, Callable[[], Case]] = {
    "mlp": case_mlp,
    "conv_bn_pool": case_conv_bn_pool,
    "layer_norm_gelu_softmax": case_layer_norm_gelu_softmax,
    "cat_split": case_cat_split,
    "view_permute": case_view_permute,
    "dynamic_batch": case_dynamic_batch,
    "two_methods": case_two_methods,
    "memory_reuse": case_memory_reuse,
}


def run_orchestra(data: bytes, method: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    with load_program(data).load_method(method) as m:
        return [np.array(o) for o in m.execute(inputs)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_builder_program_runs_in_orchestra(name: str) -> None:
    case = CASES[name]()
    data = case.builder.to_bytes()
    assert loads(data).method_names == tuple(m.name for m in case.builder.methods)
    for method, inputs, expected in case.runs:
        got = run_orchestra(data, method, inputs)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert g.shape == e.shape and g.dtype == e.dtype, (g.shape, g.dtype, e.shape, e.dtype)
            np.testing.assert_allclose(g, e, atol=ATOL, rtol=1e-5)


@pytest.mark.executorch
@pytest.mark.parametrize("name", sorted(CASES))
def test_builder_program_runs_in_executorch(name: str) -> None:
    pytest.importorskip("executorch.runtime")
    case = CASES[name]()
    data = case.builder.to_bytes()
    for method, inputs, _ in case.runs:
        ours = run_orchestra(data, method, inputs)
        theirs = run_executorch(data, method, inputs)
        assert len(theirs) == len(ours)
        for t, o in zip(theirs, ours):
            assert t.shape == o.shape and t.dtype == o.dtype
            np.testing.assert_allclose(t, o, atol=ATOL, rtol=0)


def test_memory_is_reused_between_intermediates() -> None:
    b = CASES["memory_reuse"]().builder
    plan = b.build().plan("forward")
    tensors = [v.val for v in plan.values if isinstance(v.val, Tensor)]
    planned = [t for t in tensors if t.allocation_info is not None]
    pinned = {plan.inputs[0], plan.outputs[0]}
    nbytes = [int(np.prod(t.sizes)) * 4 for t in planned]
    assert sum(nbytes) == 8 * 32 * 32 * 4  # input, 6 intermediates, output
    arena = plan.non_const_buffer_sizes
    assert arena[0] == 0 and arena[1] < sum(nbytes)
    assert arena[1] == 4 * 32 * 32 * 4  # input + output + two alternating intermediates
    # Inputs and outputs share with nothing; every offset is 16-aligned and in bounds.
    spans = {i: (v.val.allocation_info.offset, v.val.allocation_info.offset + 4096)
             for i, v in enumerate(plan.values) if isinstance(v.val, Tensor)}
    for i in pinned:
        for j, (lo, hi) in spans.items():
            if j != i:
                assert hi <= spans[i][0] or spans[i][1] <= lo
    assert all(lo % 16 == 0 and hi <= arena[1] for lo, hi in spans.values())


def test_planner_never_overlaps_live_tensors() -> None:
    sizes = [100, 40, 40, 64, 0, 32]
    lifetimes = [(0, 5), (0, 1), (1, 2), (2, 4), (3, 3), (5, 5)]
    pinned = [True, False, False, False, False, True]
    mp = plan_memory(sizes, lifetimes, pinned)
    for i in range(len(sizes)):
        assert mp.offsets[i] % 16 == 0 and mp.offsets[i] + sizes[i] <= mp.size
        for j in range(i):
            live = not (lifetimes[i][1] < lifetimes[j][0] or lifetimes[j][1] < lifetimes[i][0])
            if sizes[i] and sizes[j] and (live or pinned[i] or pinned[j]):
                a, b = mp.offsets[i], mp.offsets[j]
                assert a + sizes[i] <= b or b + sizes[j] <= a, (i, j)
    # Tensor 1 (live 0..1) and tensor 3 (live 2..4) share memory.
    assert mp.offsets[1] == mp.offsets[3]
    assert mp.size < sum(-(-s // 16) * 16 for s in sizes)


def test_program_layout_follows_executorch() -> None:
    case = case_two_methods()
    prog = loads(case.builder.to_bytes())
    # Constants: one segment, offsets[0] reserved, the shared weight and bias stored once.
    cs = prog.constant_segment
    assert cs is not None and cs.segment_index == 0 and cs.offsets[0] == 0
    assert len(cs.offsets) == 3 and all(o % 16 == 0 for o in cs.offsets)
    assert prog.segments[0].size == 12 * 8 * 4 + 8 * 4 + (-(12 * 8 * 4) % 16)
    for plan in prog.execution_plan:
        assert plan.non_const_buffer_sizes[0] == 0
        for v in plan.values:
            t = v.val
            if isinstance(t, Tensor):
                assert t.storage_offset == 0 and t.dim_order == tuple(range(len(t.sizes)))
                if t.allocation_info is not None:
                    assert t.allocation_info.memory_id == 1 and t.allocation_info.offset % 16 == 0
                    assert t.data_buffer_idx == 0
                else:
                    assert t.data_buffer_idx in (1, 2)


def test_dynamic_input_is_dynamic_bound() -> None:
    plan = case_dynamic_batch().builder.build().plan("forward")
    t = plan.values[plan.inputs[0]].val
    assert isinstance(t, Tensor) and t.shape_dynamism == TensorShapeDynamism.DYNAMIC_BOUND and t.sizes == (8, 2, 3)
    out = plan.values[plan.outputs[0]].val
    assert out.shape_dynamism == TensorShapeDynamism.DYNAMIC_BOUND and out.sizes == (8, 5)
    # A constant-only op stays static.
    consts = [v.val for v in plan.values if isinstance(v.val, Tensor) and v.val.allocation_info is None]
    assert all(c.shape_dynamism == TensorShapeDynamism.STATIC for c in consts)
    with pytest.raises(Exception, match="9"):
        run_orchestra(case_dynamic_batch().builder.to_bytes(), "forward", [randn(9, 2, 3)])


# ---------------------------------------------------------------------------------------
# Encoding: every KernelCall of the real-toolchain fixtures, rebuilt with ProgramBuilder,
# is encoded exactly as ExecuTorch encoded it.


def _decode(plan: Any, i: int, f: Any) -> Any:
    v = plan.values[i].val
    if isinstance(v, Tensor):
        dt = numpy_dtype(v.scalar_type)
        return f.input(dt, tuple(v.sizes), dynamic=v.shape_dynamism != TensorShapeDynamism.STATIC)
    if isinstance(v, Int):
        return v.int_val
    if isinstance(v, Bool):
        return v.bool_val
    if isinstance(v, Double):
        return v.double_val
    if isinstance(v, String):
        return v.string_val
    if isinstance(v, Null):
        return None
    if isinstance(v, IntList):
        return [plan.values[j].val.int_val for j in v.items]
    if isinstance(v, (DoubleList, BoolList)):
        return list(v.items)
    if isinstance(v, TensorList):
        return [_decode(plan, j, f) for j in v.items]
    if isinstance(v, OptionalTensorList):
        return [None if j < 0 else _decode(plan, j, f) for j in v.items]
    raise AssertionError(type(v))


def _signature(plan: Any, args: tuple[int, ...]) -> list[Any]:
    """What a KernelCall's args are, independent of value numbering."""
    pos: dict[int, int] = {}
    out = []
    for p, i in enumerate(args):
        v = plan.values[i].val
        seen = pos.setdefault(i, p)
        if isinstance(v, Tensor):
            desc: Any = ("Tensor", v.scalar_type, tuple(v.sizes), v.shape_dynamism, seen)
        elif isinstance(v, IntList):
            desc = ("IntList", tuple(plan.values[j].val.int_val for j in v.items),
                    tuple(type(plan.values[j].val).__name__ for j in v.items))
        elif isinstance(v, (TensorList, OptionalTensorList)):
            desc = (type(v).__name__, tuple(pos.get(j, "new") if j >= 0 else None for j in v.items))
        else:
            desc = (type(v).__name__, v)
        out.append(desc)
    return out


def _fixture_calls() -> list[tuple[str, int]]:
    calls = []
    for name in ("convnet", "dwsep", "transformer", "dynamic_batch", "two_methods", "mlp", "cnn"):
        prog = load(FIXTURES / f"{name}.pte")
        for plan in prog.execution_plan:
            for k, ins in enumerate(plan.chains[0].instructions):
                a = ins.instr_args
                if isinstance(a, KernelCall):
                    op = plan.operators[a.op_index].qualified_name
                    if operator_schema(op).returns != "tensor":
                        calls.append((f"{name}.{plan.name}", k))
    return calls


@pytest.mark.parametrize("where", [f"{n}#{k}" for n, k in _fixture_calls()])
def test_kernel_calls_are_encoded_as_executorch_encodes_them(where: str) -> None:
    fixture, k = where.split("#")
    name, method = fixture.split(".")
    plan = load(FIXTURES / f"{name}.pte").plan(method)
    call = plan.chains[0].instructions[int(k)].instr_args
    op = plan.operators[call.op_index].qualified_name
    schema = operator_schema(op)
    b = ProgramBuilder()
    f = b.method("forward")
    args = [_decode(plan, i, f) for a, i in zip(schema.arguments, call.args) if not a.is_out]
    res = f.call(op, *args)
    f.output(*(res if isinstance(res, tuple) else (res,)))
    ours = b.build().plan("forward")
    mine = ours.chains[0].instructions[0].instr_args
    assert ours.operators[mine.op_index].qualified_name == op
    assert _signature(ours, mine.args) == _signature(plan, call.args)


# ---------------------------------------------------------------------------------------
# Schemas


def test_schema_comes_from_the_kernel_signature_and_tables() -> None:
    s = operator_schema("aten::max_pool2d_with_indices.out")
    assert [a.name for a in s.arguments] == [
        "self", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "out", "indices"]
    assert [a.name for a in s.outputs] == ["out", "indices"] and s.returns == "outs"
    assert s.arguments[3].default == [0, 0] and s.arguments[1].type == "int[]"
    assert operator_schema("aten::gelu.out").arguments[1].default == "none"
    assert operator_schema("aten::split_with_sizes_copy.out").returns == "out_list"
    assert operator_schema("aten::sym_size.int").returns == "int"
    assert operator_schema("aten::mm.out").returns == "out"


@pytest.mark.executorch
def test_schemas_match_torch() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("executorch.exir")
    torchgen_model = pytest.importorskip("torchgen.model")
    import importlib
    import re

    # The quantized_decomposed ops exist in torch.ops only once registered: do it here, so
    # that they are checked whatever ran before (torch's own ops, then ExecuTorch's .out ones).
    for mod in ("torch.ao.quantization.fx._decomposed", "executorch.kernels.quantized"):
        try:
            importlib.import_module(mod)
        except ImportError:
            pass

    from orchestra.runtime.kernels import kernel_names

    def norm(t: str) -> str:
        return re.sub(r"\[\d+\]", "[]", re.sub(r"\([a-z]!?\)", "", t)).replace("SymInt", "int")

    checked = 0
    for name in kernel_names():
        ns, rest = name.split("::")
        opname, _, overload = rest.partition(".")
        try:
            ts = getattr(getattr(getattr(torch.ops, ns), opname), overload or "default")._schema
        except (AttributeError, RuntimeError):
            continue  # executorch_prim ops that exist only in ExecuTorch's runtime
        parsed = torchgen_model.FunctionSchema.parse(str(ts).split("::", 1)[1])
        mine = operator_schema(name)
        theirs = [(a.name, norm(str(pa.type)), a.is_out, a.default_value if a.has_default_value() else aot.REQUIRED)
                  for a, pa in zip(ts.arguments, parsed.arguments.flat_all)]
        assert [(a.name, a.type, a.is_out, a.default) for a in mine.arguments] == theirs, name
        checked += 1
    assert checked > 150


# ---------------------------------------------------------------------------------------
# Validation


def test_unknown_operator_names_nearest() -> None:
    f = ProgramBuilder().method()
    x = f.input(np.float32, (2, 2))
    with pytest.raises(OperatorMissingError, match="'aten::mm.outt'.*aten::mm.out") as ei:
        f.call("aten::mm.outt", x, x)
    assert ei.value.code is Error.OperatorMissing


def test_values_from_other_methods_and_builders_are_rejected() -> None:
    b = ProgramBuilder()
    f, g = b.method("forward"), b.method("other")
    x = f.input(np.float32, (2, 2))
    with pytest.raises(InvalidArgumentError, match="method 'other': aten::relu.out: argument 'self'.*belongs to method 'forward'"):
        g.call("aten::relu.out", x)
    with pytest.raises(InvalidArgumentError, match="method 'other': output 0: .*belongs to method 'forward'"):
        g.output(x)
    h = ProgramBuilder().method("forward")
    with pytest.raises(InvalidArgumentError, match="another ProgramBuilder"):
        h.call("aten::relu.out", x)


def test_bad_arguments_name_method_operator_and_argument() -> None:
    f = ProgramBuilder().method("forward")
    x = f.input(np.float32, (2, 2))
    with pytest.raises(InvalidArgumentError, match=r"method 'forward': aten::mm.out: takes at most 2 arguments \(self, mat2\), got 3"):
        f.call("aten::mm.out", x, x, x)
    with pytest.raises(InvalidArgumentError, match="missing argument 'mat2'"):
        f.call("aten::mm.out", x)
    with pytest.raises(InvalidArgumentError, match="no argument named 'bogus'"):
        f.call("aten::relu.out", x, bogus=1)
    with pytest.raises(InvalidArgumentError, match="'out' is an out argument"):
        f.call("aten::relu.out", x, out=x)
    with pytest.raises(InvalidArgumentError, match=r"argument 'dims' \(int\[\]\): expected a list of ints"):
        f.call("aten::permute_copy.out", x, 1)
    with pytest.raises(InvalidArgumentError, match=r"argument 'approximate' \(str\): expected a string"):
        f.call("aten::gelu.out", x, approximate=1)
    with pytest.raises(InvalidArgumentError, match="aten::mm.out: .*"):
        f.call("aten::mm.out", x, f.input(np.float32, (3, 3)))  # the kernel rejects the shapes
    i = f.input(np.int32, (2, 2))
    with pytest.raises(InvalidArgumentError, match="aten::gelu.out: argument 'self' has dtype int32.*supported: float32, float64"):
        f.call("aten::gelu.out", i)
    with pytest.raises(InvalidArgumentError, match="view and in-place"):
        f.call("aten::alias", x)
    # A failed call leaves no trace in the method.
    n = len(f._records)
    with pytest.raises(InvalidArgumentError):
        f.call("aten::cat.out", [x, np.zeros((2, 2), np.float32), 3])
    assert len(f._records) == n


def test_outputs_and_methods_are_validated() -> None:
    b = ProgramBuilder()
    f = b.method("forward")
    with pytest.raises(InvalidArgumentError, match="method 'forward' already exists"):
        b.method("forward")
    with pytest.raises(InvalidArgumentError, match="identifier"):
        b.method("not a name")
    c = f.constant(np.ones(2, np.float32))
    with pytest.raises(InvalidArgumentError, match="method 'forward': output 0: a constant can't be a method output"):
        f.output(c)
    with pytest.raises(InvalidArgumentError, match="expected a Value"):
        f.output(np.ones(2))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="method 'forward': no outputs"):
        b.build()
    with pytest.raises(InvalidArgumentError, match="no methods"):
        ProgramBuilder().build()
    with pytest.raises(InvalidArgumentError, match="complex128 has no ExecuTorch scalar type"):
        f.input(np.complex128, (2,))


def test_out_dtypes_follow_torch() -> None:
    f = ProgramBuilder().method()
    x = f.input(np.float32, (2, 3))
    i = f.input(np.int32, (2, 3))
    assert f.call("aten::eq.Scalar_out", x, 1).dtype == np.bool_
    assert f.call("aten::argmax.out", x, 1).dtype == np.int64
    assert f.call("aten::add.out", i, i).dtype == np.int32
    assert f.call("aten::add.Scalar_out", i, 1.5).dtype == np.float32
    assert f.call("aten::mul.Scalar_out", i, 2).dtype == np.int32
    assert f.call("aten::sum.IntList_out", i, [1]).dtype == np.int64
    assert f.call("aten::sum.IntList_out", x, [1], dtype=np.float64).dtype == np.float64
    assert f.call("aten::exp.out", i).dtype == np.float32
    assert f.call("aten::add.out", x, i, out_dtype=np.float64).dtype == np.float64


def test_quantized_ops_build_with_their_out_dtypes_and_run() -> None:
    """quantize writes its dtype argument's type, dequantize float32 (or out_dtype),
    choose_qparams a float64 scale and an int64 zero point (one element each)."""
    b = ProgramBuilder()
    f = b.method()
    x = f.input(np.float32, (4, 8))
    q = f.call("quantized_decomposed::quantize_per_tensor.out", x, 0.05, 3, -128, 127, np.int8)
    d = f.call("quantized_decomposed::dequantize_per_tensor.out", q, 0.05, 3, -128, 127, np.int8)
    d16 = f.call("quantized_decomposed::dequantize_per_tensor.out", q, 0.05, 3, -128, 127, np.int8,
                 out_dtype=np.float16)
    s, z = f.call("quantized_decomposed::choose_qparams.Tensor_out", x, -128, 127, 1e-7, np.int8)
    ts, tz = f.call("quantized_decomposed::choose_qparams_per_token_asymmetric.out", x, np.int8)
    assert (q.dtype, d.dtype, d16.dtype, s.dtype, z.dtype) == (np.int8, np.float32, np.float16, np.float64, np.int64)
    assert (s.shape, ts.shape, tz.dtype) == ((1,), (4, 1), np.int64)
    f.output(q, d, d16, s, z, ts)
    xin = np.linspace(-3, 4, 32, dtype=np.float32).reshape(4, 8)
    qo, do, d16o, so, zo, tso = load_program(dumps(b.build())).load_method("forward").execute([xin])
    want = np.clip(np.rint(xin / np.float32(0.05)) + 3, -128, 127).astype(np.int8)
    np.testing.assert_array_equal(qo, want)
    np.testing.assert_allclose(do, (want.astype(np.float32) - 3) * np.float32(0.05), rtol=1e-6)
    assert d16o.dtype == np.float16 and so.shape == (1,) and zo.dtype == np.int64
    np.testing.assert_allclose(so, [7.0 / 255], rtol=1e-6)  # (max - min) / (quant_max - quant_min)
    np.testing.assert_allclose(tso[:, 0], (np.maximum(xin.max(1), 0) - np.minimum(xin.min(1), 0)) / 255, rtol=1e-6)


# ---------------------------------------------------------------------------------------
# Delegates


class _SerialiseSubprogram(BackendDetails):
    """Test AOT backend: the processed blob is the subgraph itself, as .pte bytes."""

    @staticmethod
    def preprocess(program: Any, compile_specs: Any) -> PreprocessResult:
        assert isinstance(program, ProgramDef) and program.method_names == ("forward",)
        return PreprocessResult(dumps(program))


class _RunSubprogram(BackendInterface):
    """Test runtime backend: loads the blob with orchestra's runtime and runs ``forward``."""

    def __init__(self) -> None:
        self.specs: list[dict[str, bytes]] = []

    def init(self, context: Any, processed: memoryview, compile_specs: Any) -> Any:
        self.specs.append({cs.key: cs.value for cs in compile_specs})
        program = load_program(bytes(processed))
        return program.load_method("forward"), len(program.method_meta("forward").inputs)

    def execute(self, context: Any, handle: Any, args: list[Any]) -> None:
        method, n = handle
        for k, out in enumerate(method.execute(args[:n])):
            np.copyto(args[n + k], out)

    def destroy(self, handle: Any) -> None:
        handle[0].close()


_RUNTIME = _RunSubprogram()
if "AotTestSubprogram" not in aot_backends():
    register_aot_backend("AotTestSubprogram", _SerialiseSubprogram)
if "AotTestSubprogram" not in registered_backends():
    register_backend(Backend("AotTestSubprogram", _RUNTIME))


def _subgraph(w: np.ndarray, bias: np.ndarray) -> ProgramBuilder:
    sb = ProgramBuilder()
    s = sb.method("forward")
    x = s.input(np.float32, (3, 6))
    h = s.call("aten::relu.out", s.call("aten::addmm.out", s.constant(bias), x, s.constant(w)))
    s.output(h, s.call("aten::sigmoid.out", h))
    return sb


def test_delegated_program_matches_the_undelegated_one() -> None:
    w, bias, w2 = randn(6, 4), randn(4), randn(4, 2)
    xin = randn(3, 6)

    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (3, 6))
    h, s = f.delegate("AotTestSubprogram", _subgraph(w, bias), [x], compile_specs=[CompileSpec("k", b"v")])
    assert (h.shape, s.shape, h.dtype) == ((3, 4), (3, 4), np.float32)
    f.output(f.call("aten::mm.out", h, f.constant(w2)), s)
    prog = b.build()
    plan = prog.plan("forward")
    (d,) = plan.delegates
    assert d.id == "AotTestSubprogram" and d.compile_specs == (CompileSpec("k", b"v"),)
    assert d.processed.location == 0 and loads(bytes(prog.delegate_data(d.processed))).method_names == ("forward",)
    call = plan.chains[0].instructions[0].instr_args
    assert isinstance(call, DelegateCall) and call.args == (x.index, h.index, s.index)

    u = ProgramBuilder()
    g = u.method("forward")
    xu = g.input(np.float32, (3, 6))
    hu = g.call("aten::relu.out", g.call("aten::addmm.out", g.constant(bias), xu, g.constant(w)))
    g.output(g.call("aten::mm.out", hu, g.constant(w2)), g.call("aten::sigmoid.out", hu))

    for mode in ("keep", "segment"):
        got = run_orchestra(b.to_bytes(delegate_data=mode), "forward", [xin])
        ref = run_orchestra(u.to_bytes(), "forward", [xin])
        for a, e in zip(got, ref):
            np.testing.assert_allclose(a, e, atol=ATOL)
    np.testing.assert_allclose(got[0], np.maximum(xin @ w + bias, 0) @ w2, atol=ATOL)
    assert _RUNTIME.specs[-1] == {"k": b"v"}


def test_delegate_errors() -> None:
    w, bias = randn(6, 4), randn(4)
    f = ProgramBuilder().method()
    x = f.input(np.float32, (3, 6))
    with pytest.raises(BackendError, match="AOT backend 'Missing' is not registered") as ei:
        f.delegate("Missing", _subgraph(w, bias), [x])
    assert ei.value.code is Error.NotFound
    with pytest.raises(InvalidArgumentError, match="method 'forward': delegate to 'AotTestSubprogram': input 0: shape \\[2, 6\\]"):
        f.delegate("AotTestSubprogram", _subgraph(w, bias), [f.input(np.float32, (2, 6))])
    with pytest.raises(InvalidArgumentError, match="takes 1 inputs, got 2"):
        f.delegate("AotTestSubprogram", _subgraph(w, bias), [x, x])
    dyn = ProgramBuilder()
    d = dyn.method("forward")
    d.output(d.call("aten::relu.out", d.input(np.float32, (3, 6), dynamic=True)))
    with pytest.raises(InvalidArgumentError, match="static shapes"):
        f.delegate("AotTestSubprogram", dyn, [x])
    with pytest.raises(InvalidArgumentError, match="the subgraph has no 'forward' method \\(methods: other\\)"):
        other = ProgramBuilder()
        o = other.method("other")
        o.output(o.call("aten::relu.out", o.input(np.float32, (3, 6))))
        f.delegate("AotTestSubprogram", other, [x])


def test_preprocess_sees_only_forward() -> None:
    w, bias = randn(6, 4), randn(4)
    sub = _subgraph(w, bias)
    extra = sub.method("extra")
    extra.output(extra.call("aten::relu.out", extra.input(np.float32, (1,))))
    b = ProgramBuilder()
    f = b.method()
    (h, _) = f.delegate("AotTestSubprogram", sub, [f.input(np.float32, (3, 6))])
    f.output(h)
    prog = b.build()
    (d,) = prog.plan("forward").delegates
    assert loads(bytes(prog.delegate_data(d.processed))).method_names == ("forward",)


def test_scalar_ops_return_an_int_placeholder_like_executorch() -> None:
    b = ProgramBuilder()
    f = b.method()
    x = f.input(np.float32, (6, 4), dynamic=True)
    n = f.call("aten::sym_size.int", x, 0)
    big = f.call("executorch_prim::gt.Scalar", n, 3)
    half = f.call("executorch_prim::truediv.Scalar", n, 2)
    assert (n.kind, big.kind, half.kind) == ("int", "bool", "float") and n.dynamic
    flat = f.call("aten::view_copy.out", x, [f.call("executorch_prim::mul.Scalar", n, 4)])
    f.output(flat, big)
    plan = b.build().plan("forward")
    for i in (n.index, big.index, half.index):
        assert plan.values[i].val == Int(0)
    data = b.to_bytes()
    for batch in (2, 6):
        xin = randn(batch, 4)
        out, flag = run_orchestra(data, "forward", [xin])
        np.testing.assert_array_equal(out, xin.reshape(-1))
        assert bool(flag) is (batch > 3)


@pytest.mark.executorch
def test_scalar_outputs_run_in_executorch() -> None:
    pytest.importorskip("executorch.runtime")
    b = ProgramBuilder()
    f = b.method()
    x = f.input(np.float32, (6, 4), dynamic=True)
    n = f.call("aten::sym_size.int", x, 0)
    f.output(f.call("aten::relu.out", x), f.call("executorch_prim::gt.Scalar", n, 3), n)
    data = b.to_bytes()
    for batch in (2, 6):
        xin = randn(batch, 4)
        ours, theirs = run_orchestra(data, "forward", [xin]), run_executorch(data, "forward", [xin])
        np.testing.assert_array_equal(ours[0], theirs[0])
        assert [bool(ours[1]), int(ours[2])] == [bool(theirs[1]), int(theirs[2])] == [batch > 3, batch]
