"""The runtime: Program / Method execute real ExecuTorch programs like ExecuTorch does."""

from __future__ import annotations

import dataclasses
import pathlib
import threading

import numpy as np
import pytest

import orchestra
from orchestra import BackendError, Error, InvalidArgumentError, NotFoundError, OperatorMissingError, OrchestraError
from orchestra.program import load
from orchestra.runtime import Program, TensorInfo, load_program

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
DELEGATED = {"xnnpack_convnet", "xnnpack_inline"}
PLAIN = sorted(p.stem for p in FIXTURES.glob("*.pte") if p.stem not in DELEGATED)
TOLERANCE = {"transformer": 1e-4}


def _cases(name: str) -> dict[str, tuple[list[np.ndarray], list[np.ndarray]]]:
    npz = np.load(FIXTURES / f"{name}.npz")
    out: dict[str, tuple[list, list]] = {}
    for method in sorted({k.split(".")[0] for k in npz.files}):
        ins = [npz[f"{method}.in_{i}"] for i in range(sum(k.startswith(f"{method}.in_") for k in npz.files))]
        outs = [npz[f"{method}.out_{i}"] for i in range(sum(k.startswith(f"{method}.out_") for k in npz.files))]
        out[method] = (ins, outs)
    return out


@pytest.mark.parametrize("name", PLAIN)
def test_fixture_matches_executorch_outputs(name: str) -> None:
    prog = load_program(FIXTURES / f"{name}.pte")
    cases = _cases(name)
    assert set(cases) == set(prog.method_names)
    for method, (ins, want) in cases.items():
        with prog.load_method(method) as m:
            for _ in range(2):  # the second run reuses the arenas
                got = m.execute(ins)
                assert len(got) == len(want)
                for g, w in zip(got, want):
                    assert g.dtype == w.dtype and g.shape == w.shape
                    np.testing.assert_allclose(g, w, rtol=0, atol=TOLERANCE.get(name, 1e-5))


def test_outputs_are_owned_by_the_caller() -> None:
    prog = load_program(FIXTURES / "mlp.pte")
    (ins, _), = _cases("mlp").values()
    m = prog.load_method()
    a = m.execute(ins)[0]
    keep = a.copy()
    m.execute([np.ones_like(ins[0])])
    np.testing.assert_array_equal(a, keep)
    a[...] = 0  # writable, and writing it changes nothing in the Method
    np.testing.assert_array_equal(m.execute(ins)[0], keep)


def test_constants_are_shared_read_only_views() -> None:
    prog = load_program(FIXTURES / "convnet.pte")
    m1, m2 = prog.load_method(), prog.load_method()
    c1 = [v for v in m1._vals if isinstance(v, np.ndarray) and not v.flags.writeable]
    c2 = [v for v in m2._vals if isinstance(v, np.ndarray) and not v.flags.writeable]
    assert c1 and len(c1) == len(c2)
    for a, b in zip(c1, c2):
        assert np.shares_memory(a, b)  # one copy of the weights, in the file's mapping
    arenas1 = [v for v in m1._vals if isinstance(v, np.ndarray) and v.flags.writeable]
    arenas2 = [v for v in m2._vals if isinstance(v, np.ndarray) and v.flags.writeable]
    assert not any(np.shares_memory(a, b) for a in arenas1 for b in arenas2)


def test_dynamic_batch_every_size_and_out_of_bounds() -> None:
    prog = load_program(FIXTURES / "dynamic_batch.pte")
    meta = prog.method_meta("forward")
    info = meta.inputs[0]
    assert isinstance(info, TensorInfo) and info.is_dynamic and info.shape[0] == 8
    m = prog.load_method()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8,) + info.shape[1:]).astype(np.float32)
    singles = [m.execute([x[i : i + 1]])[0] for i in range(8)]
    for b in range(1, 9):
        got = m.execute([x[:b]])[0]
        assert got.shape[0] == b
        np.testing.assert_allclose(got, np.concatenate(singles[:b]), atol=1e-5)
    (ins, want), = _cases("dynamic_batch").values()
    np.testing.assert_allclose(m.execute(ins)[0], want[0], atol=1e-5)
    with pytest.raises(InvalidArgumentError, match=r"input 0: shape \[9, .*\] does not fit the program's bound \[8, "):
        m.execute([np.zeros((9,) + info.shape[1:], np.float32)])
    # A failed call leaves the Method usable.
    np.testing.assert_allclose(m.execute(ins)[0], want[0], atol=1e-5)


@pytest.mark.executorch
def test_dynamic_batch_matches_executorch_for_every_size() -> None:
    et = pytest.importorskip("executorch.runtime")
    torch = pytest.importorskip("torch")
    data = (FIXTURES / "dynamic_batch.pte").read_bytes()
    etm = et.Runtime.get().load_program(data).load_method("forward")
    m = load_program(data).load_method()
    rng = np.random.default_rng(1)
    shape = m.meta.inputs[0].shape
    for b in range(1, 9):
        x = rng.standard_normal((b,) + shape[1:]).astype(np.float32)
        np.testing.assert_allclose(m.execute([x])[0], etm.execute([torch.from_numpy(x)])[0].numpy(), atol=1e-5)


def test_input_checks_name_the_input() -> None:
    m = load_program(FIXTURES / "mlp.pte").load_method()
    (ins, _), = _cases("mlp").values()
    with pytest.raises(InvalidArgumentError, match="expected 1 inputs, got 2"):
        m.execute(ins + ins)
    with pytest.raises(InvalidArgumentError, match="input 0: dtype float64 does not match the program's float32"):
        m.execute([ins[0].astype(np.float64)])
    with pytest.raises(InvalidArgumentError, match=r"input 0: shape \[3, 3\] does not fit the program's shape"):
        m.execute([np.zeros((3, 3), np.float32)])
    with pytest.raises(InvalidArgumentError, match="input 0: expected a numpy array"):
        m.execute(["nope"])
    assert m.statistics().failures == 4
    m.execute(ins)
    assert m.statistics().executions == 1


def test_unregistered_backend_fails_at_load_method() -> None:
    # XnnpackBackend is registered now (backends/xnnpack): rename the delegate's backend.
    d = load(FIXTURES / "xnnpack_convnet.pte")
    plan = d.execution_plan[0]
    dels = tuple(dataclasses.replace(x, id="NoSuchBackend") for x in plan.delegates)
    prog = load_program(dataclasses.replace(d, execution_plan=(dataclasses.replace(plan, delegates=dels),)))
    assert prog.method_meta("forward").backends == ("NoSuchBackend",)  # loading the program is fine
    with pytest.raises(BackendError, match=r"backend 'NoSuchBackend' is not registered \(registered: ") as ei:
        prog.load_method("forward")
    assert ei.value.code is Error.NotFound


def test_missing_operator_fails_at_load_method_with_nearest_names() -> None:
    d = load(FIXTURES / "convnet.pte")
    plan = d.execution_plan[0]
    ops = tuple(dataclasses.replace(o, name="aten::convolutoin") if o.name == "aten::convolution" else o for o in plan.operators)
    prog = load_program(dataclasses.replace(d, execution_plan=(dataclasses.replace(plan, operators=ops),)))
    with pytest.raises(OperatorMissingError, match=r"operator aten::convolutoin\.out has no kernel \(nearest registered: aten::convolution\.out") as ei:
        prog.load_method()
    assert ei.value.code is Error.OperatorMissing


def test_unknown_method() -> None:
    prog = load_program(FIXTURES / "two_methods.pte")
    assert set(prog.method_names) == {"forward", "encode"}
    with pytest.raises(NotFoundError, match=r"method 'decode' not found \(methods: "):
        prog.load_method("decode")


def test_closed_method_refuses_to_execute() -> None:
    m = load_program(FIXTURES / "mlp.pte").load_method()
    m.close()
    m.close()
    with pytest.raises(OrchestraError, match="closed Method") as ei:
        m.execute([])
    assert ei.value.code is Error.InvalidState


def test_load_method_returns_independent_instances() -> None:
    prog = load_program((FIXTURES / "mlp.pte").read_bytes())
    a, b = prog.load_method(), prog.load_method()
    assert a is not b
    (ins, want), = _cases("mlp").values()
    a.execute([np.zeros_like(ins[0])])
    np.testing.assert_allclose(b.execute(ins)[0], want[0], atol=1e-5)


def test_list_values_hold_each_methods_own_tensors() -> None:
    """A program's list values (a TensorList for cat, an OptionalTensorList with an absent
    index, a one-item list, an IntList) are built per Method from its own values: two Methods
    of one program, executed in turn, each read their own inputs."""
    from orchestra.aot import ProgramBuilder

    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (3, 4))
    y = f.input(np.float32, (3, 4))
    idx = f.input(np.int64, (2,))
    both = f.call("aten::cat.out", [x, y], 0)  # (6, 4)
    picked = f.call("aten::index.Tensor_out", both, [None, idx])  # columns idx of every row: (6, 2)
    alone = f.call("aten::cat.out", [picked], 1)
    f.output(f.call("aten::sum.IntList_out", alone, [0, 1], False))
    f.output(alone)
    prog = load_program(b.to_bytes())
    m1, m2 = prog.load_method(), prog.load_method()
    rng = np.random.default_rng(3)
    for _ in range(3):
        runs = []
        for m in (m1, m2):
            xs = [rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32),
                  rng.integers(0, 4, 2).astype(np.int64)]
            runs.append((m.execute(xs), xs))
        for (total, cols), (xv, yv, iv) in runs:
            want = np.concatenate([xv, yv], 0)[:, iv]
            np.testing.assert_array_equal(cols, want)
            np.testing.assert_allclose(total, want.sum(), rtol=1e-5)


def test_borrowed_inputs_are_read_in_place_and_given_back() -> None:
    """execute(borrow_inputs=True) reads a tensor input where it is (the Method's own input
    memory is not written), gives the same outputs as a copy would, keeps no reference to
    the caller's array, and a later plain execute copies again. An input the program writes
    (a delegate may, so its arguments count as written) is copied even when borrowing."""
    import sys
    import weakref

    from orchestra.aot import ProgramBuilder

    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (2, 3, 16, 16))
    y = f.call("aten::mul.Scalar_out", f.call("aten::add.Scalar_out", x, 1.0), 2.0)
    f.output(f.call("aten::sum.IntList_out", y, [2, 3], False))
    prog = load_program(b.to_bytes())
    m = prog.load_method()
    assert m._cp.borrowable == (True,)
    idx = m._cp.input_idx[0]
    own = m._vals[idx]
    rng = np.random.default_rng(5)
    a = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    want = ((a + 1) * 2).sum(axis=(2, 3))
    own.fill(np.nan)  # what a copy would overwrite
    refs = sys.getrefcount(a)
    got = m.execute([a], borrow_inputs=True)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert np.isnan(own).all() and m._vals[idx] is own  # read in place; its own memory back
    assert sys.getrefcount(a) == refs  # no reference kept
    alive = weakref.ref(a)
    c = a.copy()
    del a
    assert alive() is None
    np.testing.assert_allclose(m.execute([c])[0], want, rtol=1e-5)  # plain: copied in again
    np.testing.assert_array_equal(own, c)
    # not borrowed: another dtype's array is refused as ever; a strided view is copied
    with pytest.raises(InvalidArgumentError, match="dtype float64"):
        m.execute([c.astype(np.float64)], borrow_inputs=True)
    own.fill(np.nan)
    wide = np.zeros((2, 3, 16, 32), np.float32)
    wide[..., ::2] = c
    np.testing.assert_allclose(m.execute([wide[..., ::2]], borrow_inputs=True)[0], want, rtol=1e-5)
    np.testing.assert_array_equal(own, c)  # copied
    assert m._borrowed == []


def test_an_input_a_list_value_holds_is_copied_even_when_borrowing() -> None:
    """A list value (cat's TensorList) holds the Method's own input array from its creation:
    that input is not borrowable, and borrowing copies it as usual."""
    from orchestra.aot import ProgramBuilder

    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (4, 8))
    f.output(f.call("aten::cat.out", [x, x], 0))
    m = load_program(b.to_bytes()).load_method()
    assert m._cp.borrowable == (False,)
    a = np.arange(32, dtype=np.float32).reshape(4, 8)
    np.testing.assert_array_equal(m.execute([a], borrow_inputs=True)[0], np.concatenate([a, a]))
    np.testing.assert_array_equal(m._vals[m._cp.input_idx[0]], a)  # copied in


def test_an_input_the_plan_also_reads_under_another_name_is_not_borrowed() -> None:
    """A plan may read an input's bytes through a second value at the same memory (an alias:
    no instruction writes it, as ExecuTorch leaves a flatten). Such an input is copied even
    when borrowing, so the alias still sees it; an alias of bytes another value wrote first
    (the usual flatten of a pooling's result) does not stop borrowing."""
    from orchestra.aot import ProgramBuilder
    from orchestra.program import dumps, loads

    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (2, 8))
    f.output(f.call("aten::add.Scalar_out", x, 1.0))
    pd = loads(b.to_bytes())
    plan = pd.execution_plan[0]
    (k,) = plan.inputs
    xt = plan.values[k].val
    flat = dataclasses.replace(xt, sizes=(16,), dim_order=(0,))  # the input's bytes, seen flat
    values = (*plan.values, dataclasses.replace(plan.values[k], val=flat))
    w = len(plan.values)
    (ins,) = plan.chains[0].instructions
    call = ins.instr_args
    out = call.args[-1]
    out_t = plan.values[out].val
    values = tuple(dataclasses.replace(v, val=dataclasses.replace(out_t, sizes=(16,), dim_order=(0,)))
                   if i == out else v for i, v in enumerate(values))
    args = (w, *call.args[1:])  # add reads the alias in place of the input
    chain = dataclasses.replace(plan.chains[0], instructions=(dataclasses.replace(ins, instr_args=dataclasses.replace(call, args=args)),))
    pd = dataclasses.replace(pd, execution_plan=(dataclasses.replace(plan, values=values, chains=(chain,)),))
    m = load_program(dumps(pd)).load_method()
    assert m._cp.borrowable == (False,)
    a = np.arange(16, dtype=np.float32).reshape(2, 8)
    np.testing.assert_array_equal(m.execute([a], borrow_inputs=True)[0], a.reshape(16) + 1)
    np.testing.assert_array_equal(m.execute([a * 2], borrow_inputs=True)[0], a.reshape(16) * 2 + 1)


def test_two_methods_on_two_threads_give_correct_results_every_time() -> None:
    prog = load_program(FIXTURES / "convnet.pte")
    ref = prog.load_method()
    rng = np.random.default_rng(7)
    shape = prog.method_meta("forward").inputs[0].shape
    inputs = [rng.standard_normal(shape).astype(np.float32) for _ in range(16)]
    expected = [ref.execute([x])[0] for x in inputs]
    errors: list[str] = []
    counts = [0, 0]

    def worker(k: int) -> None:
        m = prog.load_method()
        for i in range(1000):
            j = (i * (k + 3)) % len(inputs)  # the two threads walk the inputs differently
            got = m.execute([inputs[j]])[0]
            if not np.array_equal(got, expected[j]):
                errors.append(f"thread {k} iteration {i}")
            counts[k] += 1

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:5]
    assert counts == [1000, 1000]


def test_public_surface() -> None:
    assert orchestra.load_program is load_program
    assert isinstance(orchestra.load_program(FIXTURES / "mlp.pte"), Program)


_RSS_SCRIPT = """
import gc, sys, numpy as np
from orchestra.runtime import load_program
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
path, inp = sys.argv[1], sys.argv[2]
prog = load_program(path)
x = np.load(inp)["forward.in_0"]
first = prog.load_method()
first.execute([x])  # compiles the plan and warms numpy's caches
gc.collect()
before = rss()
methods = [prog.load_method() for _ in range(100)]
for m in methods:
    m.execute([x])  # touch every arena page
gc.collect()
print(rss() - before, prog.method_meta("forward").planned_bytes)
"""


@pytest.mark.skipif(not pathlib.Path("/proc/self/statm").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("name", ["convnet", "cnn"])
def test_hundred_instances_cost_little_more_than_their_arenas(name: str) -> None:
    """Measured in a fresh process: the test runner's own heap would blur RSS."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(FIXTURES / f"{name}.pte"), str(FIXTURES / f"{name}.npz")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    growth, planned = map(int, r.stdout.split())
    assert growth <= 1.1 * 100 * planned, f"RSS grew {growth} bytes for 100 x {planned} planned bytes"


def test_loading_leaves_the_garbage_collector_as_it_found_it() -> None:
    """load_program / load_method pause Python's cyclic collector while they decode and
    compile (full collections of a large heap cost more than the load), and put it back as
    it was: on, off, and after a load that failed."""
    import gc

    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            prog = load_program(FIXTURES / "convnet.pte")
            prog.load_method("forward")
            assert gc.isenabled() is enabled
            with pytest.raises(OrchestraError):
                load_program(b"not a program")
            assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_a_delegates_init_runs_with_the_collector_paused_and_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """A delegate's init (the XNNPACK backend compiling its blob) runs with the cyclic collector
    paused, as the plan's compile does; it is back as it was after, also when the init fails."""
    import gc

    from orchestra.backends.xnnpack import XnnpackBackend

    seen: list[bool] = []
    real = XnnpackBackend.init

    def init(self, ctx, processed, compile_specs):  # noqa: ANN001, ANN202
        seen.append(gc.isenabled())
        if fail:
            raise BackendError("refused by the test", Error.InvalidProgram)
        return real(self, ctx, processed, compile_specs)

    monkeypatch.setattr(XnnpackBackend, "init", init)
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            for fail in (False, True):
                prog = load_program(FIXTURES / "xnnpack_convnet.pte")
                if fail:
                    with pytest.raises(BackendError, match="refused by the test"):
                        prog.load_method("forward")
                else:
                    prog.load_method("forward")
                assert gc.isenabled() is enabled
        assert seen == [False] * 4
    finally:
        (gc.enable if was else gc.disable)()
