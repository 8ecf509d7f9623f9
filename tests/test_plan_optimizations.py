"""CompiledPlan's compile-time rewrites: max-pool without indices, batch norm folded into
the convolution, matmul operands read as views instead of permute / view / clone copies,
elementwise chains run as one step.
Each rewrite is checked against the same program compiled without rewrites
(``CompiledPlan(..., optimize=False)``), and each near-miss pattern is checked to be left
exactly as written."""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from orchestra.aot import MethodBuilder, ProgramBuilder, Value
from orchestra.errors import OrchestraError
from orchestra.program import AllocationDetails, Bool, EValue, Instruction, JumpFalseCall, KernelCall, ProgramDef, Tensor
from orchestra.runtime import Program, load_program
from orchestra.runtime._method import CompiledPlan, Method
from orchestra.runtime import _optimize
from orchestra.runtime.kernels import get_kernel
from orchestra.runtime.kernels._pool import max_pool2d_values_out, max_pool2d_with_indices_out

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
BN = "aten::_native_batch_norm_legit_no_training.out"
CONV = "aten::convolution.out"
MAXPOOL = "aten::max_pool2d_with_indices.out"
PERMUTE = "aten::permute_copy.out"

rng = np.random.default_rng(1234)


def randn(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def build(body: Callable[..., None], in_shape: tuple[int, ...] = (1, 3, 8, 8),
          dtype: type = np.float32, extra_inputs: tuple[tuple[int, ...], ...] = ()) -> Program:
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(dtype, in_shape)
    extras = [f.input(dtype, s) for s in extra_inputs]
    body(f, x, *extras)
    return load_program(b.to_bytes())


def unoptimised(prog: Program) -> Method:
    return Method(CompiledPlan(prog.definition, prog.definition.plan("forward"), "unoptimised", optimize=False))


def kinds(prog: Program) -> list[str]:
    with prog.load_method() as m:
        return [r.kind for r in m._cp.rewrites]


def run_both(prog: Program, inputs: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The outputs of the program as compiled by Program (rewritten), and unoptimised."""
    with prog.load_method() as m, unoptimised(prog) as u:
        m.execute(inputs)  # the second run reuses the arenas
        return m.execute(inputs), u.execute(inputs)


def bn_params(c: int, dtype: type = np.float32) -> list[np.ndarray]:
    return [randn(c, dtype=dtype), randn(c, dtype=dtype), randn(c, dtype=dtype),
            (np.abs(randn(c, dtype=dtype)) + 0.5).astype(dtype)]


def conv(f: MethodBuilder, x: Value, w: np.ndarray | Value, b: np.ndarray | Value | None, stride: int = 1,
         padding: int = 1, dilation: int = 1, groups: int = 1) -> Value:
    spatial = len(x.shape) - 2
    return f.call(CONV, x, w, b, [stride] * spatial, [padding] * spatial, [dilation] * spatial, False,
                  [0] * spatial, groups)


# -- batch norm folding ----------------------------------------------------------------------
FOLD_CASES = {
    "plain": dict(),
    "stride2_dilated": dict(stride=2, dilation=2, padding=2),
    "depthwise": dict(groups=4, cin=4),
    "grouped_no_padding": dict(groups=2, cin=4, padding=0),
    "no_conv_bias": dict(conv_bias=False),
    "no_bn_affine": dict(affine=False),
    "float64": dict(dtype=np.float64),
    "conv1d": dict(spatial=1),
    "1x1": dict(k=1, padding=0),
}


@pytest.mark.parametrize("case", sorted(FOLD_CASES))
def test_conv_batch_norm_is_folded_and_matches_the_unfused_pair(case: str) -> None:
    o = FOLD_CASES[case]
    dtype = o.get("dtype", np.float32)
    cin, groups, k = o.get("cin", 3), o.get("groups", 1), o.get("k", 3)
    spatial = o.get("spatial", 2)
    w = randn(4, cin // groups, *([k] * spatial), dtype=dtype) * 0.5
    cb = randn(4, dtype=dtype) if o.get("conv_bias", True) else None
    gamma, beta, mean, var = bn_params(4, dtype)
    if not o.get("affine", True):
        gamma = beta = None
    in_shape = (2, cin) + (9,) * spatial

    def body(f: MethodBuilder, x: Value) -> None:
        y = conv(f, x, w, cb, o.get("stride", 1), o.get("padding", 1), o.get("dilation", 1), groups)
        out, _, _ = f.call(BN, y, gamma, beta, mean, var, 0.1, 1e-3)
        f.output(f.call("aten::relu.out", out))

    prog = build(body, in_shape, dtype)
    with prog.load_method() as m:
        if dtype == np.float32:  # the relu that alone reads the batch norm's output joins the step
            assert [(r.kind, r.instructions) for r in m._cp.rewrites] == [("conv_bn", (0, 1)),
                                                                        ("conv_activation", (0, 1, 2))]
            assert len(m._cp.steps) == 1 and m._cp.step_spans == ((0, 1, 2),)
            assert "(folded) + relu" in m._cp.steps[0].__qualname__
        else:
            assert [(r.kind, r.instructions) for r in m._cp.rewrites] == [("conv_bn", (0, 1))]
            assert len(m._cp.steps) == 2 and m._cp.step_spans == ((0, 1), (2,))
            assert "folded" in m._cp.steps[0].__qualname__
    x = randn(*in_shape, dtype=dtype)
    got, want = run_both(prog, [x])
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got[0], want[0], rtol=tol, atol=tol)


@pytest.mark.parametrize("case", ["1x1", "1x1_strided", "1x1_few_pixels"])
def test_a_1x1_convolution_scales_its_sums_rather_than_a_copy_of_its_weight(case: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch norm after a 1x1 convolution over enough pixels folds into the planned product's
    last step (each sum times its channel's scale, then the bias): the weight stays the
    program's bytes (no copy: a large model's folded weights were most of its load), the fold
    budget counts only the two vectors, and the result stays within folding's rounding of the
    unfused pair. A map too small for the product (a matrix-vector product) folds a copy."""
    from orchestra.runtime import _optimize
    from orchestra.runtime.kernels import _conv

    cin, cout = 64, 96
    hw, stride = {"1x1": (56, 1), "1x1_strided": (56, 2), "1x1_few_pixels": (2, 1)}[case]
    w, cb = randn(cout, cin, 1, 1) * 0.2, randn(cout)
    gamma, beta, mean, var = bn_params(cout)

    def body(f: MethodBuilder, x: Value) -> None:
        y = conv(f, x, w, cb, stride, padding=0)
        out, _, _ = f.call(BN, y, gamma, beta, mean, var, 0.1, 1e-3)
        f.output(f.call("aten::relu.out", out))

    prog = build(body, (1, cin, hw, hw))
    scaled = case != "1x1_few_pixels" and _conv._native is not None
    # room for the two vectors only: a weight the product scales is not a copy the budget counts
    monkeypatch.setattr(_optimize, "FOLD_BUDGET_BYTES", 2 * cout * 4 if scaled else 1 << 20)
    with prog.load_method() as m:
        assert [r.kind for r in m._cp.rewrites] == ["conv_bn", "conv_activation"]
        consts = m._cp.rewrites[0].constants
        if scaled:
            wk, bk, sk = consts
            assert not wk.flags.owndata and np.array_equal(wk, w)  # a view of the program's bytes
            assert sk.shape == bk.shape == (cout,) and not sk.flags.writeable
        else:
            wk, bk = consts
            assert wk.flags.owndata and not np.array_equal(wk, w)  # the scaled copy
    x = randn(1, cin, hw, hw)
    got, want = run_both(prog, [x])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)


def test_folded_constants_are_read_only_shared_and_leave_the_program_alone() -> None:
    w, cb = randn(4, 3, 3, 3), randn(4)
    gamma, beta, mean, var = bn_params(4)

    def body(f: MethodBuilder, x: Value) -> None:
        y = conv(f, x, w, cb)
        f.output(f.call(BN, y, gamma, beta, mean, var, 0.1, 1e-5)[0])

    prog = build(body)
    before = [np.array(a, copy=True) for a in (w, cb, gamma, beta, mean, var)]
    m1, m2 = prog.load_method(), prog.load_method()
    assert m1._cp is m2._cp  # compiled once per Program
    (rewrite,) = m1._cp.rewrites
    w2, b2 = rewrite.constants
    assert not w2.flags.writeable and not b2.flags.writeable
    assert w2.shape == w.shape and b2.shape == (4,) and w2.dtype == b2.dtype == np.float32
    consts = [v for v in m1._cp.template if isinstance(v, np.ndarray)]
    assert len(consts) == 6
    assert not any(np.shares_memory(c, f) for c in consts for f in (w2, b2))
    # The program's constants are what was written.
    for c, want in zip(sorted(consts, key=lambda a: (a.ndim, a.size, a.tobytes())),
                       sorted(before, key=lambda a: (a.ndim, a.size, a.tobytes()))):
        np.testing.assert_array_equal(c, want)
    x = randn(1, 3, 8, 8)
    r1, r2 = m1.execute([x])[0], m2.execute([x])[0]
    np.testing.assert_array_equal(r1, r2)
    scale = gamma / np.sqrt(var.astype(np.float64) + 1e-5)
    np.testing.assert_allclose(w2, w * scale[:, None, None, None], rtol=1e-6)
    np.testing.assert_allclose(b2, (cb - mean) * scale + beta, rtol=1e-6, atol=1e-7)


def near_misses() -> dict[str, tuple[Callable[..., None], tuple[tuple[int, ...], ...]]]:
    w, cb = randn(4, 3, 3, 3), randn(4)
    gamma, beta, mean, var = bn_params(4)

    def conv_output_read_elsewhere(f: MethodBuilder, x: Value) -> None:
        y = conv(f, x, w, cb)
        out = f.call(BN, y, gamma, beta, mean, var, 0.1, 1e-5)[0]
        f.output(f.call("aten::add.out", out, y))

    def conv_output_is_a_method_output(f: MethodBuilder, x: Value) -> None:
        y = conv(f, x, w, cb)
        f.output(f.call(BN, y, gamma, beta, mean, var, 0.1, 1e-5)[0], y)

    def bn_weight_is_an_input(f: MethodBuilder, x: Value, g: Value) -> None:
        y = conv(f, x, w, cb)
        f.output(f.call(BN, y, g, beta, mean, var, 0.1, 1e-5)[0])

    def bn_running_var_is_computed(f: MethodBuilder, x: Value) -> None:
        y = conv(f, x, w, cb)
        v = f.call("aten::abs.out", var)
        f.output(f.call(BN, y, gamma, beta, mean, v, 0.1, 1e-5)[0])

    def conv_weight_is_an_input(f: MethodBuilder, x: Value, wi: Value) -> None:
        y = conv(f, x, wi, cb)
        f.output(f.call(BN, y, gamma, beta, mean, var, 0.1, 1e-5)[0])

    def save_mean_is_read(f: MethodBuilder, x: Value) -> None:
        y = conv(f, x, w, cb)
        out, save_mean, _ = f.call(BN, y, gamma, beta, mean, var, 0.1, 1e-5)
        f.output(out, f.call("aten::add.out", save_mean, save_mean))

    def save_invstd_is_an_output(f: MethodBuilder, x: Value) -> None:
        y = conv(f, x, w, cb)
        out, _, save_invstd = f.call(BN, y, gamma, beta, mean, var, 0.1, 1e-5)
        f.output(out, save_invstd)

    def bn_not_right_after_conv(f: MethodBuilder, x: Value) -> None:
        y = conv(f, x, w, cb)
        z = f.call("aten::relu.out", x)
        f.output(f.call(BN, y, gamma, beta, mean, var, 0.1, 1e-5)[0], z)

    def bn_of_something_else(f: MethodBuilder, x: Value) -> None:
        y = conv(f, x, w, cb)
        f.output(y, f.call(BN, x, gamma[:3], beta[:3], mean[:3], var[:3], 0.1, 1e-5)[0])

    def infinite_scale(f: MethodBuilder, x: Value) -> None:
        y = conv(f, x, w, cb)
        f.output(f.call(BN, y, gamma, beta, mean, np.zeros(4, np.float32), 0.1, 0.0)[0])

    return {
        "conv_output_read_elsewhere": (conv_output_read_elsewhere, ()),
        "conv_output_is_a_method_output": (conv_output_is_a_method_output, ()),
        "bn_weight_is_an_input": (bn_weight_is_an_input, ((4,),)),
        "bn_running_var_is_computed": (bn_running_var_is_computed, ()),
        "conv_weight_is_an_input": (conv_weight_is_an_input, ((4, 3, 3, 3),)),
        "save_mean_is_read": (save_mean_is_read, ()),
        "save_invstd_is_an_output": (save_invstd_is_an_output, ()),
        "bn_not_right_after_conv": (bn_not_right_after_conv, ()),
        "bn_of_something_else": (bn_of_something_else, ()),
        "infinite_scale": (infinite_scale, ()),
    }


@pytest.mark.parametrize("case", sorted(near_misses()))
def test_near_misses_are_not_folded_and_run_as_written(case: str) -> None:
    body, extra = near_misses()[case]
    with np.errstate(all="ignore"):  # infinite_scale divides by zero, as written
        prog = build(body, extra_inputs=extra)
    with prog.load_method() as m:
        # a convolution left alone is still planned once (same kernel, same bits)
        planned = {r.instructions[0] for r in m._cp.rewrites if r.kind == "conv_planned"}
        assert [r for r in m._cp.rewrites if r.kind != "conv_planned"] == []
        assert len(m._cp.steps) == len(m._cp.instruction_steps)
        assert all(a is b for k, (a, b) in enumerate(zip(m._cp.steps, m._cp.instruction_steps)) if k not in planned)
    inputs = [randn(1, 3, 8, 8)] + [randn(*s) for s in extra]
    with np.errstate(all="ignore"):
        got, want = run_both(prog, inputs)
    for g, w_ in zip(got, want):
        np.testing.assert_array_equal(g, w_)


def test_control_flow_disables_every_rewrite() -> None:
    w, cb = randn(4, 3, 3, 3), randn(4)
    gamma, beta, mean, var = bn_params(4)
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (1, 3, 8, 8))
    y = f.call(BN, conv(f, x, w, cb), gamma, beta, mean, var, 0.1, 1e-5)[0]
    pooled = f.call(MAXPOOL, y, [2, 2], [2, 2])[0]
    f.output(pooled)
    f.output(f.call("aten::mm.out", f.call("aten::view_copy.out", pooled, [4, 16]), f.call(PERMUTE, randn(5, 16), [1, 0])))
    plain = load_program(b.build())
    assert kinds(plain) == ["conv_bn", "maxpool_values", "matmul_views"]
    # The same plan behind a JumpFalse that never jumps (its condition is a literal True).
    d = b.build()
    plan = d.execution_plan[0]
    cond = len(plan.values)
    chain = plan.chains[0]
    chain = dataclasses.replace(chain, instructions=(Instruction(JumpFalseCall(cond, 1)),) + chain.instructions)
    plan = dataclasses.replace(plan, values=plan.values + (EValue(Bool(True)),), chains=(chain,))
    branchy = load_program(dataclasses.replace(d, execution_plan=(plan,)))
    with branchy.load_method() as m:
        assert m._cp.rewrites == () and len(m._cp.steps) == 7
        xin = randn(1, 3, 8, 8)
        for g, w in zip(m.execute([xin]), unoptimised(branchy).execute([xin])):
            np.testing.assert_array_equal(g, w)


def test_convnet_fixture_is_rewritten_and_stays_close_to_executorch() -> None:
    prog = load_program(FIXTURES / "convnet.pte")
    with prog.load_method() as m:
        assert [r.kind for r in m._cp.rewrites] == ["conv_bn", "conv_activation", "conv_bn", "elementwise_chain",
                                                     "maxpool_values", "maxpool_values", "matmul_views"]
        assert len(m._cp.steps) == 6 and m.meta.num_instructions == 11
    npz = np.load(FIXTURES / "convnet.npz")
    got, want = run_both(prog, [npz["forward.in_0"]])
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(got[0], npz["forward.out_0"], rtol=0, atol=1e-5)


def test_folding_stops_at_the_weight_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Folded weights are a copy the Program keeps; past FOLD_BUDGET_BYTES per method the
    batch norms stay separate steps and the weights stay views into the file."""
    from orchestra.runtime import _optimize

    first = load_program(FIXTURES / "convnet.pte").load_method()
    w0 = first._cp.rewrites[0].constants[0]
    monkeypatch.setattr(_optimize, "FOLD_BUDGET_BYTES", w0.nbytes + first._cp.rewrites[0].constants[1].nbytes)
    with load_program(FIXTURES / "convnet.pte").load_method() as m:
        assert [r.kind for r in m._cp.rewrites].count("conv_bn") == 1  # the first fits, the second doesn't
    monkeypatch.setattr(_optimize, "FOLD_BUDGET_BYTES", 0)
    prog = load_program(FIXTURES / "convnet.pte")
    with prog.load_method() as m:
        assert "conv_bn" not in [r.kind for r in m._cp.rewrites]
    npz = np.load(FIXTURES / "convnet.npz")
    got, _ = run_both(prog, [npz["forward.in_0"]])
    np.testing.assert_allclose(got[0], npz["forward.out_0"], rtol=0, atol=1e-5)
    first.close()


def test_a_fused_step_is_described_by_both_instructions() -> None:
    prog = load_program(FIXTURES / "convnet.pte")
    with prog.load_method() as m:
        cp = m._cp
        assert cp.describe_step(0) == f"instructions 0-2 ({CONV} + {BN} (folded) + relu)"
        assert cp.describe_step(1) == f"instructions 3-4 ({CONV} + {BN} (folded))"
        assert cp.describe_step(2) == "instructions 5-6 (aten::add.out + aten::relu.out (elementwise chain))"
        assert cp.describe_step(3) == f"instruction 7 ({MAXPOOL} (values only))"


# -- max-pool without indices ----------------------------------------------------------------
def test_unread_indices_use_the_values_only_kernel_bit_identically() -> None:
    def body(f: MethodBuilder, x: Value) -> None:
        r = f.call("aten::relu.out", x)
        values, _ = f.call(MAXPOOL, r, [2, 2], [2, 2])
        padded, _ = f.call(MAXPOOL, x, [3, 3], [2, 2], [1, 1])  # the general path
        f.output(values, padded)

    prog = build(body, (2, 3, 8, 8))
    assert kinds(prog) == ["maxpool_values", "maxpool_values"]
    x = randn(2, 3, 8, 8)
    x[0, 0, 0, 0] = x[1, 2, 5, 5] = np.nan
    x[0, 1, :2, :2] = [[-0.0, 0.0], [0.0, -0.0]]
    got, want = run_both(prog, [x])
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))
    assert np.isnan(got[1][0, 0, 0, 0]) and np.isnan(got[0][1, 2, 2, 2])


@pytest.mark.parametrize("reader", ["method_output", "later_instruction", "list_argument"])
def test_indices_that_are_read_are_computed(reader: str) -> None:
    def body(f: MethodBuilder, x: Value) -> None:
        values, indices = f.call(MAXPOOL, x, [2, 2], [2, 2])
        if reader == "method_output":
            f.output(values, indices)
        elif reader == "later_instruction":
            f.output(values, f.call("aten::add.out", indices, indices))
        else:
            f.output(values, f.call("aten::cat.out", [indices, indices], 1))

    prog = build(body)
    assert kinds(prog) == []
    x = randn(1, 3, 8, 8)
    x[0, 0, 2, 3] = np.nan
    got, want = run_both(prog, [x])
    ref_values, ref_indices = max_pool2d_with_indices_out(x, [2, 2], [2, 2], [0, 0], [1, 1], False,
                                                          np.empty((1, 3, 4, 4), np.float32),
                                                          np.empty((1, 3, 4, 4), np.int64))
    np.testing.assert_array_equal(got[0], ref_values)
    expect = {"method_output": ref_indices, "later_instruction": ref_indices * 2,
              "list_argument": np.concatenate([ref_indices, ref_indices], 1)}[reader]
    np.testing.assert_array_equal(got[1], expect)
    np.testing.assert_array_equal(want[1], expect)


POOL_CASES = [
    ((1, 3, 8, 8), [2, 2], [2, 2], [0, 0], [1, 1], False),
    ((2, 3, 9, 11), [3, 3], [2, 2], [1, 1], [1, 1], False),
    ((2, 3, 9, 11), [3, 3], [2, 2], [1, 1], [1, 1], True),
    ((1, 2, 10, 10), [3, 2], [], [1, 0], [1, 1], True),
    ((1, 2, 13, 12), [3, 3], [1, 2], [1, 1], [2, 2], False),
    ((3, 7, 7), [2, 2], [1, 1], [1, 1], [1, 1], False),
    ((1, 1, 5, 5), [2, 2], [2, 2], [0, 0], [1, 1], True),
    ((2, 3, 8, 8), [2, 2], [2, 2], [0, 0], [1, 1], True),
    ((1, 2, 9, 9), [3, 3], [1, 1], [0, 0], [1, 1], False),
    ((1, 2, 11, 11), [3, 2], [2, 1], [0, 0], [2, 1], False),
    ((2, 4, 7, 9), [2, 3], [], [0, 0], [1, 1], False),
    ((3, 8, 8), [2, 2], [2, 2], [0, 0], [1, 1], False),
    ((1, 1, 6, 6), [1, 1], [1, 1], [0, 0], [1, 1], False),
    ((1, 32, 64, 64), [2, 2], [2, 2], [0, 0], [1, 1], False),  # too big for the fast path
    ((1, 8, 40, 40), [3, 3], [2, 2], [1, 1], [1, 1], False),  # stride phases
]


@pytest.mark.parametrize("shape,k,s,p,d,ceil", POOL_CASES)
@pytest.mark.parametrize("fill", ["random", "nan", "signed_zeros", "int64", "neg_inf"])
def test_values_only_kernel_is_bit_identical_to_the_full_kernel(shape, k, s, p, d, ceil, fill) -> None:
    dtype = np.int64 if fill == "int64" else np.float32
    if fill == "int64":
        x = rng.integers(-5, 5, shape).astype(np.int64)
    elif fill == "signed_zeros":
        x = np.where(rng.random(shape) < 0.5, np.float32(-0.0), np.float32(0.0)).astype(np.float32)
    elif fill == "neg_inf":
        x = np.full(shape, -np.inf, np.float32)
    else:
        x = randn(*shape)
        if fill == "nan":
            flat = x.reshape(-1)
            flat[rng.choice(flat.size, max(1, flat.size // 7), replace=False)] = np.nan
    oshape = max_pool2d_with_indices_out(x, k, s, p, d, ceil, None, None)[0].shape
    full_out, full_idx = np.empty(oshape, dtype), np.empty(oshape, np.int64)
    full = max_pool2d_with_indices_out(x, k, s, p, d, ceil, full_out, full_idx)[0]
    out = np.empty(oshape, dtype)
    got = max_pool2d_values_out(x, k, s, p, d, ceil, out)
    assert got is out
    np.testing.assert_array_equal(got.view(np.uint8), full.view(np.uint8))
    # Without a usable out (a different shape, as an upper-bound dynamic out): a new array.
    got2 = max_pool2d_values_out(x, k, s, p, d, ceil, None)
    full2 = max_pool2d_with_indices_out(x, k, s, p, d, ceil, None, None)[0]
    np.testing.assert_array_equal(np.ascontiguousarray(got2).view(np.uint8), np.ascontiguousarray(full2).view(np.uint8))


def test_values_only_max_pool_with_a_dynamic_batch() -> None:
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (4, 3, 8, 8), dynamic=True)
    f.output(f.call(MAXPOOL, x, [2, 2], [2, 2])[0])
    prog = load_program(b.to_bytes())
    assert kinds(prog) == ["maxpool_values"]
    with prog.load_method() as m, unoptimised(prog) as u:
        for n in (1, 4, 2, 2, 3):
            xin = randn(n, 3, 8, 8)
            xin[0, 0, 0, 0] = np.nan
            g, w = m.execute([xin])[0], u.execute([xin])[0]
            assert g.shape == (n, 3, 4, 4)
            np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))


# -- matmul operands as views of permute / view / clone copies ------------------------------
MM, BMM, ADDMM = "aten::mm.out", "aten::bmm.out", "aten::addmm.out"
CLONE = "dim_order_ops::_clone_dim_order.out"


def build_inputs(body: Callable[..., None], shapes: tuple[tuple[int, ...], ...], dtype: type = np.float32) -> Program:
    b = ProgramBuilder()
    f = b.method("forward")
    body(f, *(f.input(dtype, s) for s in shapes))
    return load_program(b.to_bytes())


def views_cases() -> dict[str, tuple[Callable[..., None], tuple[tuple[int, ...], ...], int]]:
    """name -> (body, input shapes, copies the rewrite leaves out)."""
    w, bias = randn(12, 16), randn(12)

    def linear(f: MethodBuilder, x: Value) -> None:  # what torch.export makes of nn.Linear
        f.output(f.call(ADDMM, bias, x, f.call(PERMUTE, w, [1, 0])))

    def mm_weight_t_copy(f: MethodBuilder, x: Value) -> None:
        f.output(f.call(MM, x, f.call("aten::t_copy.out", w)))

    def mm_activation_operand0(f: MethodBuilder, x: Value) -> None:
        r = f.call("aten::relu.out", x)  # (16, 6) -> read as its transpose
        f.output(f.call(MM, f.call("aten::transpose_copy.int_out", r, 0, 1), w.T.copy()))

    def addmm_mat1(f: MethodBuilder, x: Value) -> None:
        f.output(f.call(ADDMM, bias, f.call(PERMUTE, f.call("aten::tanh.out", x), [1, 0]), w.T.copy(), beta=0.5, alpha=2.0))

    def bmm_keys_transposed(f: MethodBuilder, q: Value, k: Value) -> None:
        f.output(f.call(BMM, q, f.call(PERMUTE, f.call("aten::neg.out", k), [0, 2, 1])))

    def bmm_both_operands_and_a_view(f: MethodBuilder, q: Value, k: Value) -> None:
        # (1, 5, 3, 4) heads-last -> (1, 3, 5, 4) -> (3, 5, 4): the attention layout.
        qh = f.call("aten::view_copy.out", f.call(PERMUTE, q, [0, 2, 1, 3]), [3, 5, 4])
        kh = f.call("aten::view_copy.out", f.call(PERMUTE, k, [0, 2, 3, 1]), [3, 4, 5])
        f.output(f.call(BMM, qh, kh))

    def permute_clone_view_copies_once(f: MethodBuilder, a: Value) -> None:
        # (2, 3, 4, 4) -> (2, 4, 3, 4) -> (8, 12): numpy can only reshape it by copying.
        p = f.call(PERMUTE, f.call("aten::relu.out", a), [0, 2, 1, 3])
        v = f.call("aten::view_copy.out", f.call(CLONE, p), [8, 12])
        f.output(f.call(MM, v, randn(12, 5)))

    def planned_input_source(f: MethodBuilder, x: Value) -> None:
        f.output(f.call(MM, f.call(PERMUTE, x, [1, 0]), randn(16, 3)))

    def qkv_unbind_slices(f: MethodBuilder, qkv: Value) -> None:
        # What torch.export makes of q, k, v = qkv.unbind(0); q @ k.transpose(-2, -1).
        def head(i: int) -> Value:
            return f.call("aten::squeeze_copy.dims_out", f.call("aten::slice_copy.Tensor_out", qkv, 0, i, i + 1, 1), [0])

        q = f.call("aten::view_copy.out", f.call("aten::expand_copy.out", head(0), [1, 2, 5, 4], False), [2, 5, 4])
        k = f.call("aten::view_copy.out", f.call(PERMUTE, head(1), [0, 1, 3, 2]), [2, 4, 5])
        f.output(f.call(BMM, q, k))

    return {
        "linear": (linear, ((5, 16),), 1),
        "mm_weight_t_copy": (mm_weight_t_copy, ((5, 16),), 1),
        "mm_activation_operand0": (mm_activation_operand0, ((16, 6),), 1),
        "addmm_mat1": (addmm_mat1, ((16, 7),), 1),
        "bmm_keys_transposed": (bmm_keys_transposed, ((3, 5, 4), (3, 6, 4)), 1),
        "bmm_both_operands_and_a_view": (bmm_both_operands_and_a_view, ((1, 5, 3, 4), (1, 4, 3, 5)), 4),
        "permute_clone_view_copies_once": (permute_clone_view_copies_once, ((2, 3, 4, 4),), 3),
        "planned_input_source": (planned_input_source, ((16, 9),), 1),
        "qkv_unbind_slices": (qkv_unbind_slices, ((3, 1, 2, 5, 4),), 8),
    }


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", sorted(views_cases()))
def test_matmul_reads_copies_as_views_and_matches_the_copies(case: str, dtype: type) -> None:
    body, shapes, dropped = views_cases()[case]
    prog = build_inputs(body, shapes, dtype)
    with prog.load_method() as m:
        cp = m._cp
        assert [r.kind for r in cp.rewrites] == ["matmul_views"]
        assert len(cp.steps) == len(cp.instruction_steps) - dropped
        (span,) = [s for s in cp.step_spans if len(s) > 1]
        assert span == cp.rewrites[0].instructions and len(span) == dropped + 1
        assert "(as views)" in cp.steps[cp.step_spans.index(span)].__qualname__
    inputs = [randn(*s, dtype=dtype) for s in shapes]
    with prog.load_method() as m, unoptimised(prog) as u:
        for _ in range(3):  # the arenas are reused: the views must follow every write
            inputs = [randn(*s, dtype=dtype) for s in shapes]
            got, want = m.execute(inputs), u.execute(inputs)
            # BLAS may take another path for a strided operand: rounding only.
            np.testing.assert_allclose(got[0], want[0], rtol=1e-6 if dtype == np.float32 else 1e-12, atol=1e-6)


def test_views_of_constants_are_made_once_and_views_of_planned_tensors_once_per_method() -> None:
    w = randn(12, 16)
    x_shape = (5, 16)

    def body(f: MethodBuilder, x: Value) -> None:
        r = f.call("aten::relu.out", x)
        h = f.call(MM, f.call(PERMUTE, f.call(MM, r, f.call(PERMUTE, w, [1, 0])), [1, 0]), randn(5, 3))
        f.output(h)

    prog = build_inputs(body, (x_shape,))
    m1, m2 = prog.load_method(), prog.load_method()
    cp = m1._cp
    assert [r.kind for r in cp.rewrites] == ["matmul_views", "matmul_views"]
    (wt,) = cp.rewrites[0].constants  # W.T: a read-only view of the program's bytes
    assert not wt.flags.writeable and wt.shape == (16, 12) and wt.base is not None
    consts = [v for v in cp.template[: len(cp.plan.values)] if isinstance(v, np.ndarray)]
    assert any(np.shares_memory(wt, c) for c in consts)
    assert cp.rewrites[1].constants == ()
    ((idx, src, _),) = cp.derived  # the transposed activation: one view per Method
    v1, v2 = m1._vals[idx], m2._vals[idx]
    assert np.shares_memory(v1, m1._vals[src]) and not np.shares_memory(v1, v2)
    x = randn(*x_shape)
    np.testing.assert_allclose(m1.execute([x])[0], unoptimised(prog).execute([x])[0], rtol=1e-6, atol=1e-6)
    m1.close()
    m2.close()


def with_alias(d: ProgramDef, value: int, *, output: bool) -> tuple[ProgramDef, int]:
    """``d`` with a new value on ``value``'s memory (the same allocation, sizes and dtype, as
    a view op removed at export leaves), made a method output when ``output``."""
    plan = d.execution_plan[0]
    t = plan.values[value].val
    assert isinstance(t, Tensor) and isinstance(t.allocation_info, AllocationDetails)
    alias = len(plan.values)
    plan = dataclasses.replace(plan, values=plan.values + (EValue(dataclasses.replace(t)),))
    if output:
        plan = dataclasses.replace(plan, outputs=plan.outputs + (alias,))
    return dataclasses.replace(d, execution_plan=(plan,)), alias


def reroute(d: ProgramDef, pc: int, args: tuple[int, ...]) -> ProgramDef:
    """``d`` with instruction ``pc``'s KernelCall arguments replaced."""
    plan = d.execution_plan[0]
    chain = plan.chains[0]
    ins = list(chain.instructions)
    ins[pc] = Instruction(KernelCall(ins[pc].instr_args.op_index, args))
    plan = dataclasses.replace(plan, chains=(dataclasses.replace(chain, instructions=tuple(ins)),))
    return dataclasses.replace(d, execution_plan=(plan,))


def views_near_misses() -> dict[str, tuple[Callable[[], ProgramDef], tuple[tuple[int, ...], ...]]]:
    w = randn(6, 4)

    def builder(shapes: tuple[tuple[int, ...], ...]) -> tuple[ProgramBuilder, MethodBuilder, list[Value]]:
        b = ProgramBuilder()
        f = b.method("forward")
        return b, f, [f.input(np.float32, s) for s in shapes]

    def permuted_value_also_read_elsewhere() -> ProgramDef:
        b, f, (x,) = builder(((6, 4),))
        p = f.call(PERMUTE, f.call("aten::relu.out", x), [1, 0])
        f.output(f.call(MM, w, p), f.call("aten::neg.out", p))
        return b.build()

    def permuted_value_is_an_output() -> ProgramDef:
        b, f, (x,) = builder(((6, 4),))
        p = f.call(PERMUTE, f.call("aten::relu.out", x), [1, 0])
        f.output(f.call(MM, w, p), p)
        return b.build()

    def permuted_value_read_twice_by_the_matmul() -> ProgramDef:
        b, f, (x,) = builder(((6, 6),))
        p = f.call(PERMUTE, f.call("aten::relu.out", x), [1, 0])
        f.output(f.call(MM, p, p))
        return b.build()

    def consumer_is_not_a_matmul() -> ProgramDef:
        b, f, (x,) = builder(((6, 4),))
        f.output(f.call("aten::add.out", f.call(PERMUTE, f.call("aten::relu.out", x), [1, 0]), w.T.copy()))
        return b.build()

    def source_memory_reused_in_between() -> ProgramDef:
        # s dies at the permute, so the planner puts t on its bytes: the matmul would read t.
        b, f, (x, y) = builder(((6, 4), (5, 4)))
        s = f.call("aten::relu.out", x)
        p = f.call(PERMUTE, s, [1, 0])
        t = f.call("aten::neg.out", y)
        f.output(f.call(MM, t, p))
        d = b.build()
        vals = d.execution_plan[0].values
        assert vals[s.index].val.allocation_info == vals[t.index].val.allocation_info
        return d

    def source_written_in_between() -> ProgramDef:
        # As built: relu, permute, neg, mm(t, p). Rerouted: the neg writes s itself and the
        # matmul reads it: mm(-y, relu(x).T), where the views would compute mm(-y, (-y).T).
        b, f, (x, y) = builder(((5, 4), (5, 4)))
        s = f.call("aten::relu.out", x)
        p = f.call(PERMUTE, s, [1, 0])
        t = f.call("aten::neg.out", y)
        out = f.call(MM, t, p)
        f.output(out)
        d = reroute(b.build(), 2, (y.index, s.index, s.index))
        return reroute(d, 3, (s.index, p.index, out.index, out.index))

    def permuted_memory_read_through_an_alias() -> ProgramDef:
        b, f, (x,) = builder(((6, 4),))
        p = f.call(PERMUTE, f.call("aten::relu.out", x), [1, 0])
        f.output(f.call(MM, w, p))
        return with_alias(b.build(), p.index, output=True)[0]

    def dims_computed_at_run_time() -> ProgramDef:
        b, f, (x,) = builder(((6, 4),))
        one = f.call("aten::sym_size.int", np.zeros((1, 2), np.float32), 0)
        p = f.call(PERMUTE, f.call("aten::relu.out", x), [1, 0])
        f.output(f.call(MM, w, p))
        d = b.build()
        # The sym_size (1) now writes the Int the permutation starts with.
        plan = d.execution_plan[0]
        pc_size, pc_perm = 0, 2
        assert plan.operators[plan.chains[0].instructions[pc_size].instr_args.op_index].name == "aten::sym_size"
        dims = plan.values[plan.chains[0].instructions[pc_perm].instr_args.args[1]].val.items
        args = plan.chains[0].instructions[pc_size].instr_args.args
        assert args[-1] == one.index
        return reroute(d, pc_size, args[:-1] + (dims[0],))

    def expand_that_broadcasts() -> ProgramDef:
        b, f, (x,) = builder(((1, 1, 4),))
        e = f.call("aten::expand_copy.out", f.call("aten::relu.out", x), [1, 5, 4], False)
        f.output(f.call(BMM, e, randn(1, 4, 3)))
        return b.build()

    def sliced_value_is_an_output() -> ProgramDef:
        b, f, (x,) = builder(((2, 6, 4),))
        s_ = f.call("aten::slice_copy.Tensor_out", f.call("aten::relu.out", x), 0, 0, 1, 1)  # (1, 6, 4)
        f.output(f.call(BMM, s_, randn(1, 4, 3)), s_)
        return b.build()

    return {
        "expand_that_broadcasts": (expand_that_broadcasts, ((1, 1, 4),)),
        "sliced_value_is_an_output": (sliced_value_is_an_output, ((2, 6, 4),)),
        "permuted_value_also_read_elsewhere": (permuted_value_also_read_elsewhere, ((6, 4),)),
        "permuted_value_is_an_output": (permuted_value_is_an_output, ((6, 4),)),
        "permuted_value_read_twice_by_the_matmul": (permuted_value_read_twice_by_the_matmul, ((6, 6),)),
        "consumer_is_not_a_matmul": (consumer_is_not_a_matmul, ((6, 4),)),
        "source_memory_reused_in_between": (source_memory_reused_in_between, ((6, 4), (5, 4))),
        "source_written_in_between": (source_written_in_between, ((5, 4), (5, 4))),
        "permuted_memory_read_through_an_alias": (permuted_memory_read_through_an_alias, ((6, 4),)),
        "dims_computed_at_run_time": (dims_computed_at_run_time, ((6, 4),)),
    }


@pytest.mark.parametrize("case", sorted(views_near_misses()))
def test_views_near_misses_are_not_rewritten_and_run_as_written(case: str) -> None:
    make, shapes = views_near_misses()[case]
    prog = load_program(make())
    with prog.load_method() as m:
        assert m._cp.rewrites == ()
        assert all(a is b for a, b in zip(m._cp.steps, m._cp.instruction_steps, strict=True))
        assert m._cp.derived == ()
    with prog.load_method() as m, unoptimised(prog) as u:
        for _ in range(3):
            inputs = [randn(*s) for s in shapes]
            for g, w_ in zip(m.execute(inputs), u.execute(inputs), strict=True):
                np.testing.assert_array_equal(g, w_)


def test_the_rewrite_would_be_wrong_in_the_near_misses() -> None:
    """The near misses are real: the views would give other results (checked by hand for
    two of them, against numpy)."""
    make, shapes = views_near_misses()["source_written_in_between"]
    x, y = randn(*shapes[0]), randn(*shapes[1])
    (got,) = load_program(make()).load_method().execute([x, y])
    np.testing.assert_allclose(got, (-y) @ np.maximum(x, 0).T, rtol=1e-6)
    assert not np.allclose(got, (-y) @ (-y).T)
    make, shapes = views_near_misses()["source_memory_reused_in_between"]
    x, y = randn(*shapes[0]), randn(*shapes[1])
    (got,) = load_program(make()).load_method().execute([x, y])
    np.testing.assert_allclose(got, (-y) @ np.maximum(x, 0).T, rtol=1e-6)


def test_a_view_chain_stops_where_its_source_is_overwritten() -> None:
    """permute -> permute -> bmm where the first permute's source memory is reused before
    the matmul: only the second permute is read as a view (of the first one's result)."""
    def body(f: MethodBuilder, a: Value, c: Value) -> None:
        s = f.call("aten::relu.out", a)  # (3, 5, 4), dies at the first permute
        p1 = f.call(PERMUTE, s, [0, 2, 1])  # (3, 4, 5)
        t = f.call("aten::neg.out", c)  # (3, 5, 4): on s's bytes
        p2 = f.call(PERMUTE, p1, [0, 2, 1])  # (3, 5, 4)
        f.output(f.call(BMM, t, f.call(PERMUTE, p2, [0, 2, 1])))

    prog = build_inputs(body, ((3, 5, 4), (3, 5, 4)))
    with prog.load_method() as m:
        (r,) = m._cp.rewrites
        assert r.kind == "matmul_views" and r.instructions == (3, 4, 5)  # p2 and the last permute
        assert len(m._cp.steps) == 4
    inputs = [randn(3, 5, 4), randn(3, 5, 4)]
    got, want = run_both(prog, inputs)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[0], -inputs[1] @ np.maximum(inputs[0], 0).transpose(0, 2, 1), rtol=1e-5, atol=1e-6)


def test_a_view_step_is_described_by_all_its_instructions() -> None:
    prog = load_program(FIXTURES / "transformer.pte")
    with prog.load_method() as m:
        cp = m._cp
        k = cp.step_spans.index((5, 8, 9))
        assert cp.describe_step(k) == f"instructions 5, 8, 9 ({PERMUTE} + {PERMUTE} + {BMM} (as views))"
        assert cp.describe_step(cp.step_spans.index((2, 3))) == f"instructions 2-3 ({PERMUTE} + {ADDMM} (as views))"


def test_transformer_fixture_reads_its_permutes_as_views_and_stays_close_to_executorch() -> None:
    prog = load_program(FIXTURES / "transformer.pte")
    with prog.load_method() as m:
        cp = m._cp
        assert [r.kind for r in cp.rewrites] == ["matmul_views"] * 2 + ["elementwise_chain"] + ["matmul_views"] * 4
        assert [r.instructions for r in cp.rewrites] == [(2, 3), (5, 8, 9), (10, 11), (14, 15, 16, 17), (20, 21),
                                                         (23, 24), (26, 27)]
        assert len(cp.steps) == 19 and m.meta.num_instructions == 29
        # The two head permutes whose sources the plan overwrites before their matmul run.
        assert [s.__qualname__ for s in cp.steps].count(f"step[6] {PERMUTE}") == 1
        assert [s.__qualname__ for s in cp.steps].count(f"step[7] {PERMUTE}") == 1
    npz = np.load(FIXTURES / "transformer.npz")
    got, want = run_both(prog, [npz["forward.in_0"]])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got[0], npz["forward.out_0"], rtol=1e-5, atol=1e-5)


def test_plans_with_tensors_of_unknown_memory_get_no_views() -> None:
    """dynamic_batch's et_view result has no planned memory: it may share anyone's."""
    prog = load_program(FIXTURES / "dynamic_batch.pte")
    with prog.load_method() as m:  # (its convolution is planned per input shape: no memory involved)
        assert [r for r in m._cp.rewrites if r.kind != "conv_planned"] == [] and m._cp.derived == ()


# -- memory shared between values --------------------------------------------------------------
def test_max_pool_indices_read_through_a_value_on_their_memory_are_computed() -> None:
    """A view op removed at export leaves a second value on the indices' bytes; the
    indices are then read, though no instruction names them."""
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (1, 3, 8, 8))
    values, indices = f.call(MAXPOOL, x, [2, 2], [2, 2])
    f.output(values)
    plain = load_program(b.build())
    assert kinds(plain) == ["maxpool_values"]
    d, _ = with_alias(b.build(), indices.index, output=True)
    prog = load_program(d)
    assert kinds(prog) == []
    xin = randn(1, 3, 8, 8)
    got, want = run_both(prog, [xin])
    np.testing.assert_array_equal(got[1], want[1])
    ref = max_pool2d_with_indices_out(xin, [2, 2], [2, 2], [0, 0], [1, 1], False,
                                      np.empty((1, 3, 4, 4), np.float32), np.empty((1, 3, 4, 4), np.int64))[1]
    np.testing.assert_array_equal(got[1], ref)


def test_a_convolution_output_read_through_a_value_on_its_memory_is_not_folded() -> None:
    w, cb = randn(4, 3, 3, 3), randn(4)
    gamma, beta, mean, var = bn_params(4)
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (1, 3, 8, 8))
    y = conv(f, x, w, cb)
    f.output(f.call(BN, y, gamma, beta, mean, var, 0.1, 1e-5)[0])
    assert kinds(load_program(b.build())) == ["conv_bn"]
    d, _ = with_alias(b.build(), y.index, output=True)
    prog = load_program(d)
    assert [k for k in kinds(prog) if k != "conv_planned"] == []
    got, want = run_both(prog, [randn(1, 3, 8, 8)])
    for g, w_ in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w_)


def test_a_folded_convolution_writing_on_its_inputs_memory_computes_into_its_own_output(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan puts the batch norm's result on the convolution input's memory (the input is
    dead once the convolution has read it): the fused step computes into the convolution's
    own output, which the fold leaves out, and copies the result over, rather than copying
    the whole input aside every execute. The results are those of the plan as written."""
    from orchestra.runtime import _optimize

    def body(f: MethodBuilder, x: Value) -> None:
        x1 = f.call("aten::abs.out", x)  # planned, dead after the convolution
        y = conv(f, x1, randn(8, 8, 1, 1) * 0.5, randn(8), 1, 0, 1, 1)
        f.output(f.call("aten::abs.out", f.call(BN, y, *bn_params(8), 0.1, 1e-3)[0]))

    prog = build(body, (1, 8, 20, 20))
    with prog.load_method() as m:
        cp = m._cp
        assert [r.kind for r in cp.rewrites] == ["conv_bn"]
        ins = [c.instr_args.args for c in cp.plan.chains[0].instructions]
        conv_x, conv_y, bn_out = ins[1][0], ins[1][9], ins[2][7]
        a, b = cp.slots[conv_x], cp.slots[bn_out]
        assert (a.memory_id, a.offset) == (b.memory_id, b.offset)  # the case this test is about
    outs: list[np.ndarray] = []
    real = _optimize.plan_conv2d

    def spy(*args: Any) -> Any:
        run = real(*args)
        return None if run is None else (lambda x, out: (outs.append(out), run(x, out))[1])

    monkeypatch.setattr(_optimize, "plan_conv2d", spy)
    x = randn(1, 8, 20, 20)
    got, want = run_both(prog, [x])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert outs and all(o.shape == (1, 8, 20, 20) for o in outs)
    with prog.load_method() as m:
        outs.clear()
        m.execute([x])
        assert len(outs) == 1 and outs[0] is m._vals[conv_y]  # the convolution's own output
        assert not np.shares_memory(outs[0], m._vals[conv_x])


# -- elementwise chains ------------------------------------------------------------------------
EW = "elementwise_chain"


def ew_spans(prog: Program) -> list[tuple[int, ...]]:
    with prog.load_method() as m:
        return [r.instructions for r in m._cp.rewrites if r.kind == EW]


def ew_cases() -> dict[str, tuple[Callable[..., None], tuple[tuple[int, ...], ...], list[tuple[int, ...]], bool]]:
    """name -> (body, extra input shapes, expected chain spans, bit-identical)."""
    three, six = np.array(3, np.float32), np.array(6, np.float32)
    gate_c = randn(1, 3, 1, 1)

    def hardswish(f: MethodBuilder, x: Value) -> None:
        y = f.call("aten::abs.out", x)  # a planned value the plan may reuse after its last read
        a = f.call("aten::add.out", y, three, 1)
        b = f.call("aten::clamp.out", a, 0, None)
        c = f.call("aten::clamp.out", b, None, 6)
        d = f.call("aten::mul.out", y, c)
        f.output(f.call("aten::div.out", d, six))

    def silu(f: MethodBuilder, x: Value) -> None:
        f.output(f.call("aten::mul.out", x, f.call("aten::sigmoid.out", x)))

    def add_relu(f: MethodBuilder, x: Value, y: Value) -> None:
        f.output(f.call("aten::relu.out", f.call("aten::add.out", x, y, 1)))

    def gate_broadcast(f: MethodBuilder, x: Value, g: Value) -> None:
        r = f.call("aten::hardtanh.out", x, -1.0, 1.0)
        f.output(f.call("aten::mul.out", f.call("aten::hardsigmoid.out", g), f.call("aten::sub.out", r, gate_c, 1)))

    def right_operands(f: MethodBuilder, x: Value, y: Value) -> None:
        a = f.call("aten::sigmoid.out", x)
        b = f.call("aten::div.out", y, a)  # the running value on the right
        f.output(f.call("aten::hardswish.out", f.call("aten::add.out", three, b, 1)))

    return {
        "hardswish": (hardswish, (), [(1, 2, 3, 4, 5)], True),
        "silu": (silu, (), [(0, 1)], False),
        "add_relu": (add_relu, ((1, 3, 8, 8),), [(0, 1)], True),
        "gate_broadcast": (gate_broadcast, ((1, 3, 1, 1),), [(2, 3)], True),  # hardtanh: the gate comes between
        "right_operands": (right_operands, ((1, 3, 8, 8),), [(0, 1, 2, 3)], True),
    }


@pytest.mark.parametrize("case", sorted(ew_cases()))
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["f32", "f64"])
def test_elementwise_chains_run_as_one_step_and_match_the_steps_as_written(case: str, dtype: type) -> None:
    body, extra, spans, exact = ew_cases()[case]
    if dtype is np.float64 and case in ("hardswish", "right_operands", "gate_broadcast"):
        pytest.skip("the body's constants are float32")
    prog = build(body, extra_inputs=extra, dtype=dtype)
    assert ew_spans(prog) == spans
    with prog.load_method() as m:
        assert len(m._cp.steps) == len(m._cp.instruction_steps) - sum(len(s) - 1 for s in spans)
    inputs = [randn(1, 3, 8, 8, dtype=dtype) * 4] + [randn(*s, dtype=dtype) * 4 for s in extra]
    got, want = run_both(prog, inputs)
    for g, w_ in zip(got, want, strict=True):
        if exact:
            np.testing.assert_array_equal(g, w_)
        else:  # sigmoid then mul as silu: float rounding only
            np.testing.assert_allclose(g, w_, rtol=1e-6, atol=1e-6)


def ew_near_misses() -> dict[str, tuple[Callable[..., None], tuple[tuple[int, ...], ...]]]:
    def intermediate_is_an_output(f: MethodBuilder, x: Value) -> None:
        a = f.call("aten::relu.out", x)
        f.output(f.call("aten::sigmoid.out", a), a)

    def intermediate_read_twice(f: MethodBuilder, x: Value) -> None:
        a = f.call("aten::relu.out", x)
        f.output(f.call("aten::mul.out", a, a))

    def other_operand_widens(f: MethodBuilder, x: Value, y: Value) -> None:
        a = f.call("aten::relu.out", x)
        f.output(f.call("aten::add.out", a, y, 1))

    def alpha_is_not_one(f: MethodBuilder, x: Value, y: Value) -> None:
        a = f.call("aten::relu.out", x)
        f.output(f.call("aten::add.out", a, y, 2))

    def not_elementwise_in_between(f: MethodBuilder, x: Value) -> None:
        a = f.call("aten::relu.out", x)
        b = f.call("aten::abs.out", a)
        f.output(f.call("aten::sigmoid.out", b))

    def clamp_bound_is_a_tensor(f: MethodBuilder, x: Value, lo: Value) -> None:
        a = f.call("aten::relu.out", x)
        f.output(f.call("aten::clamp.Tensor_out", a, lo, None))

    return {
        "intermediate_is_an_output": (intermediate_is_an_output, ()),
        "intermediate_read_twice": (intermediate_read_twice, ()),
        "other_operand_widens": (other_operand_widens, ((2, 3, 8, 8),)),
        "alpha_is_not_one": (alpha_is_not_one, ((1, 3, 8, 8),)),
        "not_elementwise_in_between": (not_elementwise_in_between, ()),
        "clamp_bound_is_a_tensor": (clamp_bound_is_a_tensor, ((1, 3, 1, 1),)),
    }


@pytest.mark.parametrize("case", sorted(ew_near_misses()))
def test_elementwise_near_misses_are_not_chained_and_run_as_written(case: str) -> None:
    body, extra = ew_near_misses()[case]
    prog = build(body, extra_inputs=extra)
    with prog.load_method() as m:
        assert m._cp.rewrites == ()
        assert all(a is b for a, b in zip(m._cp.steps, m._cp.instruction_steps, strict=True))
    inputs = [randn(1, 3, 8, 8)] + [randn(*s) for s in extra]
    got, want = run_both(prog, inputs)
    for g, w_ in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w_)


def test_an_elementwise_intermediate_read_through_a_value_on_its_memory_is_not_chained() -> None:
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (1, 3, 8, 8))
    a = f.call("aten::relu.out", x)
    f.output(f.call("aten::sigmoid.out", a))
    assert ew_spans(load_program(b.build())) == [(0, 1)]
    d, _ = with_alias(b.build(), a.index, output=True)
    prog = load_program(d)
    assert kinds(prog) == []
    got, want = run_both(prog, [randn(1, 3, 8, 8)])
    for g, w_ in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w_)


def test_a_chain_stops_before_an_instruction_that_overwrites_its_input() -> None:
    """The hardswish's divisor is made between the multiply and the division; placed on the
    memory of the chain's input once the multiply has read it, the chain ends at the multiply."""
    three = np.array(3, np.float32)
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (1, 3, 8, 8))
    sixes = f.input(np.float32, (1, 3, 8, 8))  # not a constant: the copy runs
    y = f.call("aten::abs.out", x)
    a = f.call("aten::add.out", y, three, 1)
    c = f.call("aten::clamp.out", a, 0, 6)
    d = f.call("aten::mul.out", y, c)
    six = f.call("aten::_to_copy.out", sixes, False, None)
    f.output(f.call("aten::div.out", d, six))
    d_ = b.build()
    plan = d_.execution_plan[0]
    alloc = {v.index: plan.values[v.index].val.allocation_info for v in (y, c, six)}
    assert alloc[six.index] == alloc[y.index]  # the builder's planner reuses y's bytes for the divisor
    prog = load_program(d_)
    assert ew_spans(prog) == [(1, 2, 3)]
    # The divisor on the clamp's bytes instead: the chain steps over the copy.
    moved = dataclasses.replace(plan.values[six.index].val, allocation_info=alloc[c.index])
    values = plan.values[: six.index] + (EValue(moved),) + plan.values[six.index + 1:]
    prog2 = load_program(dataclasses.replace(d_, execution_plan=(dataclasses.replace(plan, values=values),)))
    assert ew_spans(prog2) == [(1, 2, 3, 5)]
    xin = randn(1, 3, 8, 8)
    for p_ in (prog, prog2):
        got, want = run_both(p_, [xin, np.full((1, 3, 8, 8), 6, np.float32)])
        np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[0], np.abs(xin) * np.clip(np.abs(xin) + 3, 0, 6) / 6, rtol=1e-6)


def test_an_elementwise_chain_stays_within_one_chain_of_the_plan() -> None:
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (1, 3, 8, 8))
    f.output(f.call("aten::sigmoid.out", f.call("aten::relu.out", x)))
    d = b.build()
    assert ew_spans(load_program(d)) == [(0, 1)]
    plan = d.execution_plan[0]
    (chain,) = plan.chains
    split = (dataclasses.replace(chain, instructions=chain.instructions[:1]),
             dataclasses.replace(chain, instructions=chain.instructions[1:]))
    prog = load_program(dataclasses.replace(d, execution_plan=(dataclasses.replace(plan, chains=split),)))
    assert kinds(prog) == []
    got, want = run_both(prog, [randn(1, 3, 8, 8)])
    np.testing.assert_array_equal(got[0], want[0])


# -- gelu with a Method-owned scratch buffer -------------------------------------------------
GELU = "aten::gelu.out"


def test_large_float32_gelus_share_one_scratch_per_method_and_match_the_kernel() -> None:
    """Two exact gelus of different sizes over 2049+ float32 elements run
    the fit in one scratch buffer per Method (3 x the larger one's elements): the same results
    as the kernel as written, executes after the first included; two Methods don't share it."""
    def body(f: MethodBuilder, x: Value) -> None:
        a = f.call(GELU, x, "none")
        b = f.call(GELU, f.call("aten::view_copy.out", a, [2, 3 * 24 * 32 // 2]), "none")
        f.output(a, b)

    prog = build(body, (1, 3, 24, 32))
    with prog.load_method() as m, prog.load_method() as m2:
        assert [(r.kind, r.instructions) for r in m._cp.rewrites] == [("gelu_scratch", (0,)), ("gelu_scratch", (2,))]
        scratch = [v for v in m._vals[len(prog.definition.plan("forward").values):] if isinstance(v, np.ndarray)]
        assert [s.shape for s in scratch] == [(3 * 3 * 24 * 32,)] and scratch[0].dtype == np.float32
        other = m2._vals[len(prog.definition.plan("forward").values)]
        assert not np.shares_memory(scratch[0], other)
    for scale in (1.0, 6.0):
        x = randn(1, 3, 24, 32) * scale
        got, want = run_both(prog, [x])
        for g, w_ in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w_)


def gelu_near_misses() -> dict[str, tuple[Callable[..., None], tuple[int, ...], type]]:
    """name -> (body, input shape, dtype): gelus the scratch step must leave as written."""
    def tanh(f: MethodBuilder, x: Value) -> None:
        f.output(f.call(GELU, x, "tanh"))

    def plain(f: MethodBuilder, x: Value) -> None:
        f.output(f.call(GELU, x, "none"))

    return {
        "tanh": (tanh, (1, 3, 24, 32), np.float32),
        "table_size": (plain, (2, 1024), np.float32),  # 2048 elements: the table path
        "float64": (plain, (1, 3, 24, 32), np.float64),
    }


@pytest.mark.parametrize("case", sorted(gelu_near_misses()))
def test_gelu_near_misses_keep_the_kernel_step(case: str) -> None:
    body, shape, dtype = gelu_near_misses()[case]
    prog = build(body, shape, dtype)
    with prog.load_method() as m:
        assert m._cp.rewrites == ()
        assert all(a is b for a, b in zip(m._cp.steps, m._cp.instruction_steps, strict=True))
    got, want = run_both(prog, [randn(*shape, dtype=dtype) * 3])
    np.testing.assert_array_equal(got[0], want[0])


def test_gelu_of_a_dynamic_shape_keeps_the_kernel_step() -> None:
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (4, 1024), dynamic=True)
    f.output(f.call(GELU, x, "none"))
    prog = load_program(b.to_bytes())
    assert kinds(prog) == []
    x = randn(3, 1024) * 3
    with prog.load_method() as m:
        np.testing.assert_allclose(m.execute([x])[0], get_kernel(GELU).fn(x, "none", np.empty_like(x)), rtol=0, atol=0)


# -- constant copies folded --------------------------------------------------------------------
TO_DIM = "dim_order_ops::_to_dim_order_copy.out"
CC = "constant_copy"


def exporter_hardswish(f: MethodBuilder, x: Value) -> None:
    """MobileNetV3's hardswish as exported: int64 scalar constants converted to float32 by
    ``_to_dim_order_copy`` (identity dim order, or none) right before their readers. (The
    builder makes them 1-element tensors.)"""
    y = f.call("aten::abs.out", x)
    three = f.call(TO_DIM, np.array(3, np.int64), False, [0], out_dtype=np.float32)
    a = f.call("aten::add.out", y, three, 1)
    c = f.call("aten::clamp.out", f.call("aten::clamp.out", a, 0, None), None, 6)
    d = f.call("aten::mul.out", y, c)
    six = f.call(TO_DIM, np.array(6, np.int64), False, None, out_dtype=np.float32)
    f.output(f.call("aten::div.out", d, six), f.call("aten::mul.out", y, six))


def test_constant_copies_are_folded_and_the_hardswish_chain_takes_its_division() -> None:
    prog = build(exporter_hardswish)
    with prog.load_method() as m:
        rw = m._cp.rewrites
        assert [(r.kind, r.instructions) for r in rw if r.kind == CC] == [(CC, (1,)), (CC, (6,))]
        assert [r.constants[0].tolist() for r in rw if r.kind == CC] == [[3.0], [6.0]]
        assert all(not r.constants[0].flags.writeable and r.constants[0].dtype == np.float32 for r in rw if r.kind == CC)
        assert ew_spans(prog) == [(2, 3, 4, 5, 7)]  # add, clamp, clamp, mul and the division
        # No step runs a copy; the steps reading one name it in their span (an executor that
        # runs a step's instructions as written runs it).
        assert m._cp.step_spans == ((0,), (1, 2, 3, 4, 5, 6, 7), (6, 8))
        assert "constant operand" in m._cp.steps[-1].__qualname__  # the other reader of six
    x = randn(1, 3, 8, 8) * 4
    got, want = run_both(prog, [x])
    for g, w_ in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w_)
    np.testing.assert_allclose(got[0], np.abs(x) * np.clip(np.abs(x) + 3, 0, 6) / 6, rtol=1e-6)


def cc_near_misses() -> dict[str, tuple[Callable[..., None], tuple[tuple[int, ...], ...]]]:
    """name -> (body, extra inputs): copies that must run as written."""
    def copy_is_an_output(f: MethodBuilder, x: Value) -> None:
        three = f.call(TO_DIM, np.array(3, np.int64), False, None, out_dtype=np.float32)
        f.output(f.call("aten::add.out", x, three, 1), three)

    def source_is_an_input(f: MethodBuilder, x: Value, s: Value) -> None:
        f.output(f.call("aten::add.out", x, f.call(TO_DIM, s, False, None, out_dtype=np.float32), 1))

    def read_in_a_list(f: MethodBuilder, x: Value) -> None:
        c = f.call(TO_DIM, np.ones((1, 3, 8, 8), np.float32), False, [0, 1, 2, 3])
        f.output(f.call("aten::cat.out", [x, c], 1))

    def channels_last(f: MethodBuilder, x: Value) -> None:
        c = f.call(TO_DIM, np.ones((1, 3, 8, 8), np.float32), False, [0, 2, 3, 1])
        f.output(f.call("aten::add.out", x, c, 1))

    def too_large(f: MethodBuilder, x: Value) -> None:  # 9600 elements
        c = f.call(TO_DIM, np.ones((2, 3, 40, 40), np.float32), False, [0, 1, 2, 3])
        f.output(f.call("aten::relu.out", x), f.call("aten::add.out", c, c, 1))

    def read_by_a_matmul_chain(f: MethodBuilder, x: Value) -> None:
        w = f.call("aten::_to_copy.out", randn(8, 8), False, None)
        f.output(f.call("aten::mm.out", f.call("aten::view_copy.out", x, [24, 8]), f.call(PERMUTE, w, [1, 0])))

    return {
        "copy_is_an_output": (copy_is_an_output, ()),
        "source_is_an_input": (source_is_an_input, ((),)),
        "read_in_a_list": (read_in_a_list, ()),
        "channels_last": (channels_last, ()),
        "too_large": (too_large, ()),
        "read_by_a_matmul_chain": (read_by_a_matmul_chain, ()),
    }


@pytest.mark.parametrize("case", sorted(cc_near_misses()))
def test_constant_copy_near_misses_run_as_written(case: str) -> None:
    body, extra = cc_near_misses()[case]
    try:
        prog = build(body, extra_inputs=extra)
    except OrchestraError as exc:  # the builder's own checks (a layout it can't plan)
        pytest.skip(f"not buildable: {exc}")
    assert CC not in kinds(prog)
    inputs = [randn(1, 3, 8, 8)] + [randn(*s) for s in extra]
    got, want = run_both(prog, inputs)
    for g, w_ in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w_)


def test_a_constant_copy_read_through_a_value_on_its_memory_is_not_folded() -> None:
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (1, 3, 8, 8))
    three = f.call(TO_DIM, np.array(3, np.int64), False, None, out_dtype=np.float32)
    f.output(f.call("aten::add.out", x, three, 1))
    assert CC in kinds(load_program(b.build()))
    d, _ = with_alias(b.build(), three.index, output=True)
    prog = load_program(d)
    assert CC not in kinds(prog)
    got, want = run_both(prog, [randn(1, 3, 8, 8)])
    for g, w_ in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w_)


def test_a_constant_copy_the_kernel_rejects_is_left_to_fail_at_execute() -> None:
    """A copy whose constant doesn't fit its out (an untrusted program) is not folded at
    load: the step as written raises at execute, naming the instruction."""
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (1, 3))
    c = f.call(TO_DIM, np.ones(3, np.float32), False, None)
    f.output(f.call("aten::add.out", x, c, 1))
    d = b.build()
    plan = d.execution_plan[0]
    src = plan.values[c.index].val  # the out: make it (2,) while the constant stays (3,)
    bad_out = dataclasses.replace(src, sizes=(2,))
    values = plan.values[: c.index] + (EValue(bad_out),) + plan.values[c.index + 1:]
    d2 = dataclasses.replace(d, execution_plan=(dataclasses.replace(plan, values=values),))
    try:
        prog = load_program(d2)
    except OrchestraError:
        pytest.skip("the loader rejects the changed plan already")
    assert CC not in kinds(prog)
    with prog.load_method() as m, pytest.raises(OrchestraError):
        m.execute([randn(1, 3)])


def test_an_exported_hardswish_chain_runs_as_one_hardswish(monkeypatch: pytest.MonkeyPatch) -> None:
    """add 3, clamp 0, clamp 6, mul by the input, div by 6 (as exported, constant copies
    folded): one hardswish pass (the compiled kernel where built), bit-identical."""
    from orchestra.runtime.kernels import _elementwise as ew

    calls: list[str] = []

    class Counting:
        def __init__(self, real: Any) -> None:
            self.real = real

        def __getattr__(self, name: str) -> Any:
            calls.append(name)
            return getattr(self.real, name)

    if ew._native is not None:
        monkeypatch.setattr(ew, "_native", Counting(ew._native))
    prog = build(exporter_hardswish)
    x = randn(1, 3, 8, 8) * 4
    got, want = run_both(prog, [x])
    for g, w_ in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w_)
    if ew._native is not None:
        assert calls == ["hardswish_f32"] * 2  # one pass per execute (run twice); the steps as written call none


def _conv_bn(f: MethodBuilder, x: Value, groups: int = 1) -> Value:
    c = 8
    w = randn(c, 8 // groups, 3, 3) * 0.5
    y = conv(f, x, w, randn(c), 1, 1, 1, groups)
    out, _, _ = f.call(BN, y, *bn_params(c), 0.1, 1e-3)
    return out


def conv_act_cases() -> dict[str, tuple[Callable[..., None], str, int]]:
    """name -> (body, the activation fused, the convolution's groups)."""
    def hardswish(f: MethodBuilder, x: Value) -> None:  # as exported: constant copies around it
        y = _conv_bn(f, x)
        three = f.call(TO_DIM, np.array(3, np.int64), False, [0], out_dtype=np.float32)
        c = f.call("aten::clamp.out", f.call("aten::clamp.out", f.call("aten::add.out", y, three, 1), 0, None), None, 6)
        d = f.call("aten::mul.out", y, c)
        six = f.call(TO_DIM, np.array(6, np.int64), False, None, out_dtype=np.float32)
        f.output(f.call("aten::div.out", d, six))

    def silu(f: MethodBuilder, x: Value) -> None:
        y = _conv_bn(f, x, groups=8)  # depthwise: the compiled convolution applies it
        f.output(f.call("aten::mul.out", y, f.call("aten::sigmoid.out", y)))

    def relu(f: MethodBuilder, x: Value) -> None:
        f.output(f.call("aten::relu.out", _conv_bn(f, x, groups=2)))

    return {"hardswish": (hardswish, "hardswish", 1), "silu": (silu, "silu", 8), "relu": (relu, "relu", 2)}


@pytest.mark.parametrize("case", sorted(conv_act_cases()))
def test_a_folded_convolution_applies_the_activation_that_alone_reads_it(case: str) -> None:
    """The fused step gives the activation kernel's bits on the folded convolution's result,
    and stays within folding's rounding of the plan as written."""
    from orchestra.runtime.kernels import _conv
    from orchestra.runtime.kernels import _elementwise as ew

    body, act, groups = conv_act_cases()[case]
    prog = build(body, (2, 8, 12, 12))
    with prog.load_method() as m:
        assert len(m._cp.steps) == 1, [s.__qualname__ for s in m._cp.steps]
        assert m._cp.steps[0].__qualname__.endswith(f"(folded) + {act}")
        assert [r.kind for r in m._cp.rewrites if r.kind.startswith("conv")] == ["conv_bn", "conv_activation"]
        assert m._cp.step_spans[0] == tuple(range(m.meta.num_instructions))  # every instruction, copies included
        w, b = next(r.constants for r in m._cp.rewrites if r.kind == "conv_bn")
    x = randn(2, 8, 12, 12) * 2
    got, want = run_both(prog, [x])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)  # folding: float rounding
    conv_out = _conv.conv2d(x, w, b, (1, 1), (1, 1), (1, 1), groups, None)
    fn = {"relu": ew.relu_out, "hardswish": ew.hardswish_out, "silu": ew.silu_out}[act]
    assert np.array_equal(got[0], fn(conv_out, np.empty_like(conv_out)))


def test_an_activation_whose_input_is_read_elsewhere_stays_a_step_of_its_own() -> None:
    def body(f: MethodBuilder, x: Value) -> None:
        y = _conv_bn(f, x)
        f.output(f.call("aten::relu.out", y), f.call("aten::abs.out", y))

    prog = build(body, (1, 8, 10, 10))
    assert "conv_activation" not in kinds(prog)
    got, want = run_both(prog, [randn(1, 8, 10, 10)])
    for g, w_ in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w_, rtol=1e-5, atol=1e-5)


# -- squeeze-and-excite in one step -----------------------------------------------------------
SE = "squeeze_excite"


def _se_body(act: str, gate: str, mul_other: str = "x", bias: bool = True, dims: tuple[int, ...] = (-1, -2),
             t1_out: bool = False) -> Callable[..., None]:
    """A squeeze-and-excite block as torchvision's exports it: x -> mean -> 1x1 conv -> act ->
    1x1 conv -> gate -> x * gate; a depthwise convolution before it (its input)."""
    c, r = 24, 8
    w1, b1 = randn(r, c, 1, 1) * 0.3, randn(r) if bias else None
    w2, b2 = randn(c, r, 1, 1) * 0.3, randn(c)
    dw = randn(c, 1, 3, 3)
    three, six = np.array(3, np.float32), np.array(6, np.float32)

    def body(f: MethodBuilder, x0: Value) -> None:
        x = conv(f, x0, dw, None, 1, 1, 1, c)
        s = f.call("aten::mean.out", x, list(dims), True, None)
        t1 = conv(f, s, w1, b1, 1, 0, 1, 1)
        if act in ("relu", "tanh"):
            t2 = f.call(f"aten::{act}.out", t1)
        else:  # silu as exported: sigmoid, then a multiply by its input
            t2 = f.call("aten::mul.out", t1, f.call("aten::sigmoid.out", t1))
        t3 = conv(f, t2, w2, b2, 1, 0, 1, 1)
        if gate == "sigmoid":
            g = f.call("aten::sigmoid.out", t3)
        else:  # hardsigmoid as exported: add 3, clamp to 0..6, divide by 6
            g = f.call("aten::div.out", f.call("aten::clamp.out", f.call("aten::clamp.out", f.call(
                "aten::add.out", t3, three, 1), 0, None), None, 6), six)
        other = {"x": x, "x0": x0}[mul_other]
        f.output(f.call("aten::abs.out", f.call("aten::mul.out", g, other) if mul_other == "x0"
                        else f.call("aten::mul.out", other, g)), *((t1,) if t1_out else ()))

    return body


@pytest.mark.parametrize("act,gate,t1_out", [("relu", "hardsigmoid", False), ("silu", "sigmoid", False),
                                             ("relu", "sigmoid", True)])
@pytest.mark.parametrize("n", [1, 2])
def test_a_squeeze_and_excite_block_is_one_step(act: str, gate: str, t1_out: bool, n: int) -> None:
    """The six steps of the block become one compiled call that writes every value they wrote,
    in their order: the results are those of the plan as written (float rounding of the
    mean's and the products' sums), whatever memory the plan gave the block's values, and an
    intermediate value that is also an output (t1_out) holds what its step wrote."""
    from orchestra.runtime.kernels import _fused

    if not _fused.squeeze_excite_available():
        pytest.skip("orchestra's compiled kernels are not built here")
    prog = build(_se_body(act, gate, t1_out=t1_out), (n, 24, 20, 20))
    with prog.load_method() as m:
        assert kinds(prog).count(SE) == 1
        names = [s.__qualname__ for s in m._cp.steps]
        assert sum("squeeze-and-excite" in q for q in names) == 1, names
        assert len(m._cp.steps) == 3  # the depthwise convolution, the block, the abs
    x = randn(n, 24, 20, 20)
    got, want = run_both(prog, [x])
    assert len(got) == 1 + t1_out
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["mul_by_another", "mean_over_one_dim", "unsupported_activation"])
def test_near_squeeze_and_excite_blocks_stay_steps(case: str) -> None:
    body = {"mul_by_another": _se_body("relu", "sigmoid", mul_other="x0"),
            "mean_over_one_dim": _se_body("relu", "sigmoid", dims=(-1,)),
            "unsupported_activation": _se_body("tanh", "hardsigmoid")}[case]
    prog = build(body, (1, 24, 20, 20))
    assert SE not in kinds(prog)
    got, want = run_both(prog, [randn(1, 24, 20, 20)])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


def test_a_squeeze_and_excite_step_runs_the_steps_where_the_compiled_call_declines(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestra.runtime import _optimize
    from orchestra.runtime.kernels import _fused

    if not _fused.squeeze_excite_available():
        pytest.skip("orchestra's compiled kernels are not built here")
    prog = build(_se_body("silu", "sigmoid", bias=False), (1, 24, 20, 20))
    assert kinds(prog).count(SE) == 1
    x = randn(1, 24, 20, 20)
    with prog.load_method() as m:
        fused = m.execute([x])[0].copy()
        monkeypatch.setattr(_optimize, "squeeze_excite_into", lambda *a: False)
        declined = m.execute([x])[0].copy()
    monkeypatch.setattr(_optimize, "squeeze_excite_available", lambda: False)
    with load_program(prog.definition).load_method() as m:  # a plan without the block's step: its six steps
        assert SE not in [r.kind for r in m._cp.rewrites]
        six = m.execute([x])[0]
    np.testing.assert_array_equal(declined, six)  # the same steps: the same bits
    with unoptimised(prog) as u:
        np.testing.assert_allclose(fused, u.execute([x])[0], rtol=1e-5, atol=1e-6)


def test_a_residual_add_and_relu_chain_runs_compiled_on_several_threads_with_the_same_bits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An add of two same-shape float32 tensors then relu (a residual connection) is one
    elementwise chain; on several kernel threads it runs as one compiled pass (add_f32_into),
    bit for bit the plan as written."""
    from orchestra.runtime import _optimize
    from orchestra.runtime import kernels as kern
    from orchestra.runtime.kernels import _fused

    if not _fused.squeeze_excite_available():
        pytest.skip("orchestra's compiled kernels are not built here")

    def body(f: MethodBuilder, x: Value) -> None:
        y = f.call("aten::abs.out", x)
        f.output(f.call("aten::relu.out", f.call("aten::add.out", f.call("aten::neg.out", x), y, 1)))

    prog = build(body, (1, 24, 56, 56))
    assert ew_spans(prog) == [(2, 3)]
    used: list[bool] = []
    real = _optimize.add_f32_into
    monkeypatch.setattr(_optimize, "add_f32_into", lambda *a, **k: used.append(real(*a, **k)) or used[-1])
    x = randn(1, 24, 56, 56)
    kern.set_threads(2)
    try:
        got, want = run_both(prog, [x])
    finally:
        kern.set_threads(1)
    assert used and all(used)
    np.testing.assert_array_equal(got[0], want[0])


def test_the_compiled_batch_norm_vectors_are_numpys_bit_for_bit() -> None:
    """bn_fold_f32 computes the fold's scale and shift as numpy's float64 operations do, one at a
    time, over ordinary, tiny, huge, zero, negative and non-finite statistics, with and without
    each optional vector."""
    from orchestra.runtime.kernels import _elementwise
    if _elementwise._native is None:
        pytest.skip("the compiled kernels are not built")
    rng = np.random.default_rng(21)
    n = 4096
    special = np.array([0.0, -0.0, 1e-45, 1e-38, 3.4e38, -3.4e38, np.inf, -np.inf, np.nan, -1.0, 1e-7, 65504.0],
                       np.float32)

    def vec(scale: float) -> np.ndarray:
        v = (rng.standard_normal(n) * scale).astype(np.float32)
        v[rng.integers(0, n, 200)] = rng.choice(special, 200)
        return v

    var, mean, gamma, beta, bias = vec(2.0) ** 2, vec(3.0), vec(1.0), vec(1.0), vec(5.0)
    var[:100] = rng.choice(special, 100)
    f64 = np.float64
    for eps in (1e-5, 0.0, 1e-3):
        for g, be, bi in ((gamma, beta, bias), (None, None, None), (gamma, None, bias), (None, beta, None)):
            got = _elementwise.bn_fold_f32(var, mean, g, be, bi, eps)
            assert got is not None
            with np.errstate(all="ignore"):
                scale = 1.0 / np.sqrt(var.astype(f64) + eps)
                if g is not None:
                    scale = g.astype(f64) * scale
                shift = -mean.astype(f64) if bi is None else bi.astype(f64) - mean.astype(f64)
                shift = shift * scale
                if be is not None:
                    shift = shift + be.astype(f64)
                want_s, want_h = scale.astype(np.float32), shift.astype(np.float32)
            np.testing.assert_array_equal(got[0].view(np.uint32), want_s.view(np.uint32))
            np.testing.assert_array_equal(got[1].view(np.uint32), want_h.view(np.uint32))
            assert got[2] == bool(np.isfinite(want_h).all() and np.isfinite(want_s).all())
    ok = np.ones(8, np.float32)
    assert _elementwise.bn_fold_f32(ok, ok, None, None, ok[:4], 1e-5) is None  # lengths differ: numpy's path
    assert _elementwise.bn_fold_f32(ok.astype(np.float64), ok, None, None, None, 1e-5) is None
    assert _elementwise.bn_fold_f32(np.ones(16, np.float32)[::2], ok, None, None, None, 1e-5) is None
    assert _elementwise.bn_fold_f32(ok, ok, ok, ok, ok, 1e-5)[2] is True
    # the kernel's own checks (no Python ones before it): each operand in turn refused alike
    bad = (ok.astype(">f4"), np.ones(16, np.float32)[1::2], np.ones((2, 4), np.float32), ok[:7], ok.astype(np.float16))
    for k in range(5):
        for b in bad:
            args = [ok, ok, ok, ok, ok]
            args[k] = b
            assert _elementwise.bn_fold_f32(*args, 1e-5) is None, (k, b.dtype, b.shape)
    with pytest.raises(TypeError):
        _elementwise.bn_fold_f32(ok, object(), None, None, None, 1e-5)
    out = np.empty(8, np.float32)
    with pytest.raises(ValueError, match="overlaps"):
        _elementwise._native.bn_fold_f32(ok, ok, None, None, None, 1e-5, out, out)


@pytest.mark.parametrize("compiled", [True, False])
def test_the_batch_norm_fold_is_exact_and_refuses_non_finite_weights(compiled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """W' = W * float32(gamma / sqrt(var + eps)) row by row (the compiled kernel or numpy: the
    same products), b' in float64 rounded once; no fold where a folded value is not finite."""
    if not compiled:
        monkeypatch.setattr(_optimize, "scale_rows_into", lambda w, s, out: None)
        monkeypatch.setattr(_optimize, "bn_fold_f32", lambda *a: None)
    rng = np.random.default_rng(9)
    w = rng.standard_normal((64, 32, 3, 3)).astype(np.float32)
    b, gamma, beta, mean = (rng.standard_normal(64).astype(np.float32) for _ in range(4))
    var = rng.random(64).astype(np.float32) + 0.1
    w2, b2, none = _optimize.fold_batch_norm(w, b, gamma, beta, mean, var, 1e-5)
    scale = gamma.astype(np.float64) / np.sqrt(var.astype(np.float64) + 1e-5)
    assert np.array_equal(w2, w * scale.astype(np.float32)[:, None, None, None]) and w2.dtype == np.float32
    assert np.array_equal(b2, ((b.astype(np.float64) - mean) * scale + beta).astype(np.float32))
    assert not w2.flags.writeable and not b2.flags.writeable and none is None
    # Without the copy: the weight itself, the same shift, and the rounded scale the product applies.
    same, b3, s3 = _optimize.fold_batch_norm(w, b, gamma, beta, mean, var, 1e-5, copy=False)
    assert same is w and np.array_equal(b3, b2) and np.array_equal(s3, scale.astype(np.float32))
    assert not b3.flags.writeable and not s3.flags.writeable
    for value in (np.inf, np.nan, 3e38):
        bad = w.copy()
        bad[63, 31, 2, 2] = value
        g = gamma.copy()
        g[63] = 1e3 if value == 3e38 else g[63]  # 3e38 * ~3e3 overflows to inf
        assert _optimize.fold_batch_norm(bad, b, g, beta, mean, var, 1e-5) is None, value
        # Scaling the sums computes the unfused pair's operations reassociated: a non-finite
        # weight propagates as it would there, so it is no reason to refuse.
        assert _optimize.fold_batch_norm(bad, b, g, beta, mean, var, 1e-5, copy=False) is not None, value
    zero_var = var.copy()
    zero_var[0] = 0.0
    assert _optimize.fold_batch_norm(w, b, gamma, beta, mean, zero_var, 0.0) is None  # scale inf
    assert _optimize.fold_batch_norm(w, b, gamma, beta, mean, zero_var, 0.0, copy=False) is None
    w64 = w.astype(np.float64)  # numpy's multiply
    f64 = _optimize.fold_batch_norm(w64, None, None, None, mean.astype(np.float64), var.astype(np.float64), 1e-5)
    assert f64 is not None and f64[0].dtype == np.float64
