"""NumpyCpuBackend: subgraphs delegated from ProgramBuilder and from ExecuTorch's own
``to_edge_transform_and_lower``, the per-instance thread pool and its hot ``num_threads``.
Nothing here asserts on wall-clock time.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest

from orchestra import BackendError, Error, InvalidArgumentError, OrchestraError
from orchestra.aot import CompileSpec, MethodBuilder, ProgramBuilder, Value, aot_backends, register_aot_backend
from orchestra.backends import numpy_cpu
from orchestra.backends.numpy_cpu import NumpyCpuBackend, NumpyCpuBackendDetails, NumpyCpuHandle
from orchestra.backends.numpy_cpu._pool import WorkerPool
from orchestra.program import DelegateCall
from orchestra.runtime import Backend, Method, load_program, register_backend, registered_backends

NC = "NumpyCpuBackend"
if NC not in registered_backends():
    register_backend(Backend(NC, NumpyCpuBackend()))
if NC not in aot_backends():
    register_aot_backend(NC, NumpyCpuBackendDetails)


# -- programs -----------------------------------------------------------------------------
def conv_net(f: MethodBuilder, x: Value, seed: int = 0) -> Value:
    """Every tiled path: 3x3 stride-1 (wide im2col), 3x3 stride-2, depthwise (groups), 1x1,
    batch norm, relu, broadcasting add, max-pool, addmm (row tiles) and mm (column tiles)."""
    rng = np.random.default_rng(seed)

    def conv(x: Value, co: int, k: int, s: int, g: int = 1) -> Value:
        ci = x.shape[1]
        w = (rng.standard_normal((co, ci // g, k, k)) / np.sqrt(k * k * ci / g)).astype(np.float32)
        b = (rng.standard_normal(co) * 0.1).astype(np.float32)
        return f.call("aten::convolution.out", x, w, b, [s, s], [k // 2, k // 2], [1, 1], False, [0, 0], g)

    x = f.call("aten::relu.out", conv(x, 32, 3, 1))
    c = x.shape[1]
    bn = [rng.random(c, dtype=np.float32) + 0.5, rng.standard_normal(c).astype(np.float32) * 0.1,
          rng.standard_normal(c).astype(np.float32) * 0.1, rng.random(c, dtype=np.float32) + 0.5]
    x = f.call("aten::_native_batch_norm_legit_no_training.out", x, *bn, 0.1, 1e-5)[0]
    y = f.call("aten::relu.out", conv(x, 32, 3, 1, g=32))           # depthwise
    x = f.call("aten::add.out", x, y)                                 # residual
    x = f.call("aten::relu.out", conv(x, 48, 3, 2))                   # strided
    x = f.call("aten::add.out", conv(x, 48, 1, 1), rng.standard_normal((48, 1, 1)).astype(np.float32))  # 1x1 + broadcast
    x = f.call("aten::max_pool2d_with_indices.out", x, [2, 2], [2, 2])[0]
    x = f.call("aten::view_copy.out", x, [-1, 48 * 8 * 8 // 4])       # 4 rows
    w1 = (rng.standard_normal((768, 512)) * 0.03).astype(np.float32)
    x = f.call("aten::mm.out", x, w1)                                 # few rows: column tiles
    x = f.call("aten::view_copy.out", x, [64, 32])
    w2 = (rng.standard_normal((32, 4096)) * 0.1).astype(np.float32)
    return f.call("aten::addmm.out", np.zeros(4096, np.float32), x, w2)  # row tiles


IN_SHAPE = (1, 3, 32, 32)


def build(delegate: bool) -> bytes:
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, IN_SHAPE)
    if delegate:
        sub = ProgramBuilder()
        g = sub.method("forward")
        g.output(conv_net(g, g.input(np.float32, IN_SHAPE)))
        f.output(*f.delegate(NC, sub, [x]))
    else:
        f.output(conv_net(f, x))
    return b.to_bytes()


@pytest.fixture(scope="module")
def delegated_bytes() -> bytes:
    return build(True)


@pytest.fixture(scope="module")
def plain_output() -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(7).standard_normal(IN_SHAPE, dtype=np.float32)
    with load_program(build(False)).load_method() as m:
        return x, m.execute([x])[0]


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cut even the small operators of these tests (read when a handle plans its tiles)."""
    monkeypatch.setattr(numpy_cpu._executor, "MIN_TILE_MACS", 4096)
    monkeypatch.setattr(numpy_cpu._executor, "MIN_TILE_ELEMENTS", 1024)


def handle_of(method: Method, index: int = 0) -> NumpyCpuHandle:
    """The delegate's handle (test-only introspection: Methods expose no handles)."""
    backend, handle = method._handles[index]
    assert isinstance(handle, NumpyCpuHandle)
    return handle


# -- (1) ProgramBuilder subgraph -----------------------------------------------------------
def test_program_builder_subgraph_matches_the_undelegated_program(delegated_bytes, plain_output) -> None:
    x, expected = plain_output
    program = load_program(delegated_bytes)
    assert [d.id for d in program.definition.plan("forward").delegates] == [NC]
    with program.load_method(backend_options={NC: {"max_tiles": 4}}) as m:
        got = m.execute([x])[0]
        ops = dict.fromkeys(name for name, _ in handle_of(m).statistics().tiled_ops)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # Every kind of tiling took part.
    assert set(ops) >= {"aten::convolution.out", "aten::relu.out", "aten::add.out", "aten::mm.out",
                        "aten::addmm.out", "aten::_native_batch_norm_legit_no_training.out"}


def test_max_tiles_1_runs_orchestras_steps_unchanged(delegated_bytes, plain_output) -> None:
    x, expected = plain_output
    with load_program(delegated_bytes).load_method(backend_options={NC: {"max_tiles": 1, "num_threads": 2}}) as m:
        got = m.execute([x])[0]
        stats = handle_of(m).statistics()
    assert stats.tiled_ops == () and stats.workers == 0
    np.testing.assert_array_equal(got, expected)  # the very same kernels on the very same arrays


def test_tiles_of_each_conv_path_match_the_kernel() -> None:
    rng = np.random.default_rng(3)
    for shape, co, k, s, pad, dil, g in [((2, 8, 20, 18), 16, 3, 1, 1, 1, 1), ((1, 8, 21, 19), 16, 3, 2, 1, 1, 1),
                                         ((1, 6, 16, 16), 12, 3, 1, 2, 2, 1), ((3, 8, 10, 10), 8, 1, 1, 0, 1, 1),
                                         ((1, 16, 24, 24), 16, 5, 1, 2, 1, 16), ((1, 8, 12, 12), 8, 3, 1, 1, 1, 2),
                                         ((2, 4, 15, 13), 8, 3, 2, 1, 1, 1), ((1, 4, 14, 14), 6, 5, 1, 0, 1, 1),
                                         ((5, 4, 9, 9), 6, 3, 1, 1, 1, 1)]:
        b = ProgramBuilder()
        f = b.method("forward")
        x = f.input(np.float32, shape)
        w = rng.standard_normal((co, shape[1] // g, k, k)).astype(np.float32)
        f.output(f.call("aten::convolution.out", x, w, rng.standard_normal(co).astype(np.float32),
                        [s, s], [pad, pad], [dil, dil], False, [0, 0], g))
        sub = b.build()
        ob = ProgramBuilder()
        of = ob.method("forward")
        xo = of.input(np.float32, shape)
        of.output(*of.delegate(NC, sub, [xo]))
        xin = rng.standard_normal(shape).astype(np.float32)
        with load_program(sub).load_method() as plain:
            want = plain.execute([xin])[0]
        with load_program(ob.to_bytes()).load_method(backend_options={NC: {"max_tiles": 3, "num_threads": 2}}) as m:
            got = m.execute([xin])[0]
            assert handle_of(m).statistics().tiled_ops == (("aten::convolution.out", 3 if g == 1 else min(3, g)),)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4, err_msg=f"{shape} k={k} s={s} g={g}")


def test_a_conv_with_its_batch_norm_folded_runs_as_written_where_tiled() -> None:
    """orchestra folds an inference batch norm into the convolution before it (one step for
    two instructions); the executor runs such a step as its two instructions when one of
    them is tiled, and as the folded step when none is."""
    rng = np.random.default_rng(5)
    shape = (1, 8, 20, 20)
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, shape)
    w = (rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32)
    y = f.call("aten::convolution.out", x, w, rng.standard_normal(16).astype(np.float32),
               [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    bn = [rng.random(16, dtype=np.float32) + 0.5, rng.standard_normal(16).astype(np.float32),
          rng.standard_normal(16).astype(np.float32), rng.random(16, dtype=np.float32) + 0.5]
    f.output(f.call("aten::_native_batch_norm_legit_no_training.out", y, *bn, 0.1, 1e-5)[0])
    sub = b.build()
    ob = ProgramBuilder()
    of = ob.method("forward")
    of.output(*of.delegate(NC, sub, [of.input(np.float32, shape)]))
    xin = rng.standard_normal(shape).astype(np.float32)
    with load_program(sub).load_method() as plain:
        assert [r.kind for r in plain._cp.rewrites] == ["conv_bn"]
        want = plain.execute([xin])[0]
    with load_program(ob.to_bytes()).load_method(backend_options={NC: {"max_tiles": 3, "num_threads": 2}}) as m:
        got = m.execute([xin])[0]
        ex = handle_of(m).executor
        assert {name for name, _ in handle_of(m).statistics().tiled_ops} == {
            "aten::convolution.out", "aten::_native_batch_norm_legit_no_training.out"}
        assert len(ex._steps) == 2 and ex.method._cp.step_spans == ((0, 1),)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    with load_program(ob.to_bytes()).load_method(backend_options={NC: {"max_tiles": 1}}) as m:
        np.testing.assert_array_equal(m.execute([xin])[0], want)  # the folded step itself
        assert handle_of(m).executor._steps == handle_of(m).executor.method._cp.steps


def test_a_matmul_reading_views_runs_its_copies_in_their_places_where_tiled() -> None:
    """orchestra reads a permuted constant as a view in the matmul step (the permute
    doesn't run); where the executor tiles that matmul it runs the permute as written,
    in its own place in the plan (before the relu, not next to the matmul)."""
    rng = np.random.default_rng(6)
    shape = (512, 256)
    w = (rng.standard_normal((384, 256)) * 0.1).astype(np.float32)
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, shape)
    p = f.call("aten::permute_copy.out", w, [1, 0])
    f.output(f.call("aten::mm.out", f.call("aten::relu.out", x), p))
    sub = b.build()
    ob = ProgramBuilder()
    of = ob.method("forward")
    of.output(*of.delegate(NC, sub, [of.input(np.float32, shape)]))
    xin = rng.standard_normal(shape).astype(np.float32)
    with load_program(sub).load_method() as plain:
        assert [r.kind for r in plain._cp.rewrites] == ["matmul_views"]
        assert plain._cp.step_spans == ((1,), (0, 2))
        want = plain.execute([xin])[0]
    with load_program(ob.to_bytes()).load_method(backend_options={NC: {"max_tiles": 3, "num_threads": 2}}) as m:
        got = m.execute([xin])[0]
        ex = handle_of(m).executor
        assert "aten::mm.out" in {name for name, _ in handle_of(m).statistics().tiled_ops}
        assert ex._spans == ((0,), (1,), (2,))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    with load_program(ob.to_bytes()).load_method(backend_options={NC: {"max_tiles": 1}}) as m:
        np.testing.assert_array_equal(m.execute([xin])[0], want)  # the view step itself
        assert handle_of(m).executor._steps == handle_of(m).executor.method._cp.steps


# -- (3) num_threads is hot -----------------------------------------------------------------
def test_num_threads_change_takes_effect_at_the_next_execute_and_results_stay_identical(delegated_bytes, plain_output) -> None:
    x, _ = plain_output
    with load_program(delegated_bytes).load_method(backend_options={NC: {"max_tiles": 4}}) as m:
        h = handle_of(m)
        one = m.execute([x])[0]
        s = h.statistics()
        assert (s.last_num_threads, s.last_threads_used, s.workers) == (1, 1, 0)
        m.set_options({NC: {"num_threads": 2}})
        assert h.statistics().last_num_threads == 1  # nothing happens before the next execute
        used = set()
        for _ in range(30):  # on a loaded machine a worker may miss an execute's tiles: try a few
            two = m.execute([x])[0]
            np.testing.assert_array_equal(two, one)  # tiling doesn't depend on num_threads
            s = h.statistics()
            assert (s.last_num_threads, s.workers) == (2, 1)
            used.add(s.last_threads_used)
            if 2 in used:
                break
        assert 2 in used, "the worker thread never ran a tile"
        workers = [t for t in threading.enumerate() if t.name.startswith(h.pool.name)]
        assert len(workers) == 1 and workers[0].ident in h.pool.thread_ids()
        assert m.statistics().reinits == 0  # hot: no re-initialisation
        # Per-call override, then back to the Method's value.
        m.set_options({NC: {"num_threads": 1}})
        np.testing.assert_array_equal(m.execute([x], backend_options={NC: {"num_threads": 3}})[0], one)
        assert h.statistics().last_num_threads == 3 and h.pool.workers <= 2
        m.execute([x])
        assert h.statistics().last_num_threads == 1 and h.statistics().last_threads_used == 1
    assert not any(t.is_alive() for t in workers)  # close() destroyed the handle: workers joined


def test_max_tiles_is_init_only_and_reinitialises(delegated_bytes, plain_output) -> None:
    x, _ = plain_output
    with load_program(delegated_bytes).load_method(backend_options={NC: {"max_tiles": 2}}) as m:
        m.execute([x])
        first = handle_of(m)
        assert max(t for _, t in first.statistics().tiled_ops) == 2
        m.set_options({NC: {"max_tiles": 4, "num_threads": 2}})
        m.execute([x])
        second = handle_of(m)
        assert second is not first and first.destroyed and m.statistics().reinits == 1
        assert max(t for _, t in second.statistics().tiled_ops) == 4
        with pytest.raises(InvalidArgumentError, match="'max_tiles' is init-only"):
            m.execute([x], backend_options={NC: {"max_tiles": 3}})


def test_two_instances_have_their_own_pools(delegated_bytes, plain_output) -> None:
    x, _ = plain_output
    program = load_program(delegated_bytes)
    with program.load_method(backend_options={NC: {"num_threads": 2}}) as a, \
            program.load_method(backend_options={NC: {"num_threads": 1}}) as b:
        ra, rb = a.execute([x])[0], b.execute([x])[0]
        np.testing.assert_array_equal(ra, rb)
        assert handle_of(a).pool is not handle_of(b).pool
        assert handle_of(a).statistics().workers == 1 and handle_of(b).statistics().workers == 0


# -- (4) bad values -------------------------------------------------------------------------
@pytest.mark.parametrize("value, message", [
    (0, "option 'num_threads' must be between 1 and 256, got 0"),
    (-3, "option 'num_threads' must be between 1 and 256, got -3"),
    (257, "option 'num_threads' must be between 1 and 256, got 257"),
    ("2", "option 'num_threads' must be int, got str '2'"),
    (True, "option 'num_threads' must be int, got bool True"),
    (2.0, "option 'num_threads' must be int, got float 2.0"),
])
def test_bad_num_threads_is_rejected_where_it_is_passed(delegated_bytes, plain_output, value, message) -> None:
    x, _ = plain_output
    program = load_program(delegated_bytes)
    with pytest.raises(InvalidArgumentError, match=message) as info:
        program.load_method(backend_options={NC: {"num_threads": value}})
    assert info.value.code == Error.InvalidArgument and "NumpyCpuBackend" in info.value.message
    with program.load_method() as m:
        with pytest.raises(InvalidArgumentError, match=message):
            m.set_options({NC: {"num_threads": value}})
        with pytest.raises(InvalidArgumentError, match=message):
            m.execute([x], backend_options={NC: {"num_threads": value}})
        m.execute([x])  # still usable, still with the old value
        assert m.options()[NC]["num_threads"] == 1


def test_bad_max_tiles_and_unknown_options_are_rejected(delegated_bytes) -> None:
    program = load_program(delegated_bytes)
    with pytest.raises(InvalidArgumentError, match="option 'max_tiles' must be between 1 and 64, got 0"):
        program.load_method(backend_options={NC: {"max_tiles": 0}})
    with pytest.raises(InvalidArgumentError, match="has no option 'threads'.*num_threads, max_tiles"):
        program.load_method(backend_options={NC: {"threads": 2}})


# -- the pool ---------------------------------------------------------------------------------
def test_pool_runs_every_tile_once_and_reraises_the_first_error() -> None:
    pool = WorkerPool("test-pool")
    try:
        seen: list[int] = []
        pool.run(seen.append, 50, 4)
        assert sorted(seen) == list(range(50)) and pool.workers == 3
        pool.run(seen.append, 3, 1)
        assert pool.workers == 3  # never shrinks

        def tile(k: int) -> None:
            seen.append(k)
            if k == 7:
                raise ValueError("tile 7 broke")

        seen.clear()
        with pytest.raises(ValueError, match="tile 7 broke"):
            pool.run(tile, 20, 3)
        assert sorted(seen) == list(range(20))  # the others still ran: nothing half-done is left
        threads = [t for t in threading.enumerate() if t.name.startswith("test-pool")]
        assert len(threads) == 3
    finally:
        pool.close()
    assert not any(t.is_alive() for t in threads) and pool.workers == 0


# -- AOT ----------------------------------------------------------------------------------------
def test_preprocess_rejects_compile_specs_and_foreign_programs() -> None:
    b = ProgramBuilder()
    f = b.method("forward")
    f.output(f.call("aten::relu.out", f.input(np.float32, (2, 2))))
    with pytest.raises(InvalidArgumentError, match="takes no compile specs \\(got 'threads'\\)"):
        NumpyCpuBackendDetails.preprocess(b.build(), [CompileSpec("threads", b"2")])
    with pytest.raises(BackendError, match="got bytes") as info:
        NumpyCpuBackendDetails.preprocess(b"not a program", [])
    assert info.value.code == Error.DelegateInvalidCompatibility
    blob = NumpyCpuBackendDetails.preprocess(b.build(), []).processed_bytes
    assert load_program(blob).method_names == ("forward",)


def test_a_blob_that_is_not_a_subgraph_is_rejected_at_init() -> None:
    from dataclasses import replace

    from orchestra.program import BackendDelegateInlineData

    sub = ProgramBuilder()
    sf = sub.method("forward")
    sf.output(sf.call("aten::relu.out", sf.input(np.float32, (2, 2))))
    ob = ProgramBuilder()
    of = ob.method("forward")
    of.output(*of.delegate(NC, sub, [of.input(np.float32, (2, 2))]))
    broken = replace(ob.build(), backend_delegate_data=(BackendDelegateInlineData(memoryview(b"garbage!")),))
    with pytest.raises(BackendError, match="NumpyCpuBackend: method 'forward' delegate 0: the processed blob is not a subgraph") as info:
        load_program(broken).load_method()
    assert info.value.code == Error.DelegateInvalidCompatibility


def test_the_bridge_imports_torch_only_when_used() -> None:
    code = ("import sys, orchestra.aot, orchestra.aot.executorch, orchestra.backends.numpy_cpu as n; "
            "n.NumpyCpuBackendDetails; assert 'torch' not in sys.modules and 'executorch' not in sys.modules, "
            "sorted(m for m in sys.modules if m.startswith(('torch', 'executorch')))[:5]")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_bridge_without_executorch_says_to_install_the_export_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestra.aot import executorch as bridge

    monkeypatch.setitem(sys.modules, "executorch", None)
    monkeypatch.setitem(sys.modules, "executorch.exir", None)
    for call in (lambda: bridge.partitioner(NC), lambda: bridge.to_program_def(object()),
                 lambda: bridge.executorch_backend_details(NC)):
        with pytest.raises(OrchestraError, match="install orchestra's 'export' extra") as info:
            call()
        assert info.value.code == Error.NotSupported


def test_public_names_are_importable() -> None:
    for name in numpy_cpu.__all__:
        assert getattr(numpy_cpu, name) is not None
    import orchestra.aot.executorch as bridge

    for name in bridge.__all__:
        assert callable(getattr(bridge, name))


# -- (2) ExecuTorch's to_edge_transform_and_lower -------------------------------------------------
@pytest.fixture(scope="module")
def et():
    pytest.importorskip("torch")
    pytest.importorskip("executorch.exir")
    import torch
    from executorch.exir import to_edge_transform_and_lower

    from orchestra.aot.executorch import partitioner

    def lower(module: torch.nn.Module, *args: torch.Tensor):
        part = partitioner(NC)
        ep = torch.export.export(module.eval(), args)
        program = to_edge_transform_and_lower(ep, partitioner=[part]).to_executorch()
        return program, part

    return torch, lower


def _models(torch):
    nn = torch.nn

    class ConvNet(nn.Module):
        """conv + bn + relu, depthwise conv + relu, max-pool, linear."""

        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 16, 3, padding=1)
            self.bn = nn.BatchNorm2d(16)
            self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
            self.pw = nn.Conv2d(16, 24, 1)
            self.pool = nn.MaxPool2d(2)
            self.fc = nn.Linear(24 * 16 * 16, 10)

        def forward(self, x):
            x = torch.relu(self.bn(self.conv(x)))
            x = torch.relu(self.dw(x))
            x = self.pool(torch.relu(self.pw(x)))
            return self.fc(torch.flatten(x, 1))

    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(64, 256)
            self.fc2 = nn.Linear(256, 256)
            self.fc3 = nn.Linear(256, 8)

        def forward(self, x):
            return self.fc3(torch.relu(self.fc2(torch.nn.functional.gelu(self.fc1(x)))))

    return ConvNet, Mlp


@pytest.mark.executorch
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")
@pytest.mark.parametrize("model, shape", [("ConvNet", (1, 3, 32, 32)), ("Mlp", (32, 64))])
def test_executorch_lowering_runs_in_orchestra_and_matches_torch(et, model, shape) -> None:
    torch, lower = et
    torch.manual_seed(0)
    module = dict(zip(("ConvNet", "Mlp"), _models(torch)))[model]()
    for m in module.modules():  # non-trivial batch-norm statistics
        if isinstance(m, torch.nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    x = torch.randn(*shape)
    program, part = lower(module, x)
    assert part.rejected == {}
    orch = load_program(program.buffer)
    plan = orch.definition.plan("forward")
    assert [d.id for d in plan.delegates] == [NC]
    calls = [i.instr_args for c in plan.chains for i in c.instructions if isinstance(i.instr_args, DelegateCall)]
    assert [plan.delegates[c.delegate_index].id for c in calls] == [NC]
    with torch.no_grad():
        want = module(x).numpy()
    for threads in (1, 2):
        with orch.load_method(backend_options={NC: {"num_threads": threads, "max_tiles": 2}}) as m:
            got = m.execute([x.numpy()])[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.executorch
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")
def test_executorch_partial_lowering_keeps_unsupported_nodes_outside(et) -> None:
    torch, _ = et
    from executorch.exir import to_edge_transform_and_lower

    from orchestra.aot.executorch import partitioner

    nn = torch.nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(16, 16)

        def forward(self, x, y):
            return self.a(x), torch.relu(y) * 2.0  # y has a dynamic batch: stays outside

    torch.manual_seed(0)
    module = Net().eval()
    x, y = torch.randn(4, 16), torch.randn(3, 5)
    ep = torch.export.export(module, (x, y), dynamic_shapes=({}, {0: torch.export.Dim("n", min=1, max=8)}))
    part = partitioner(NC)
    program = to_edge_transform_and_lower(ep, partitioner=[part]).to_executorch()
    assert part.rejected and all("dynamic" in why for why in part.rejected.values())
    orch = load_program(program.buffer)
    plan = orch.definition.plan("forward")
    assert [d.id for d in plan.delegates] == [NC]
    assert {op.name for op in plan.operators} >= {"aten::relu", "aten::mul"}  # orchestra's interpreter runs these
    with orch.load_method() as m:
        got = m.execute([x.numpy(), y.numpy()])
    with torch.no_grad():
        want = module(x, y)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.executorch
@pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")
def test_bridge_names_unknown_backends(et) -> None:
    from orchestra.aot.executorch import executorch_backend_details, partitioner

    with pytest.raises(BackendError, match="AOT backend 'NoSuchBackend' is not registered") as info:
        partitioner("NoSuchBackend")
    assert info.value.code == Error.NotFound
    cls = executorch_backend_details(NC)
    assert cls.__name__ == NC and executorch_backend_details(NC) is cls
    from executorch.exir.backend.backend_details import BackendDetails

    assert cls in BackendDetails.__subclasses__()
    with pytest.raises(OrchestraError, match="compile specs must be CompileSpec"):
        partitioner(NC, compile_specs=[("k", b"v")])


def test_a_tiled_matmul_reading_a_folded_constant_copy_runs_the_copy() -> None:
    """orchestra folds a copy of a constant (the addmm's bias) into a constant the addmm step
    reads (the copy doesn't run); where the executor tiles that addmm as written, the copy
    runs too, in its place, so the bias the tiles read is there."""
    rng = np.random.default_rng(7)
    shape = (512, 256)
    w = (rng.standard_normal((256, 384)) * 0.1).astype(np.float32)
    bias = rng.standard_normal(384).astype(np.float32)
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, shape)
    c = f.call("aten::_to_copy.out", bias, False, None)
    f.output(f.call("aten::addmm.out", c, f.call("aten::relu.out", x), w))
    sub = b.build()
    ob = ProgramBuilder()
    of = ob.method("forward")
    of.output(*of.delegate(NC, sub, [of.input(np.float32, shape)]))
    xin = rng.standard_normal(shape).astype(np.float32)
    with load_program(sub).load_method() as plain:
        assert [r.kind for r in plain._cp.rewrites] == ["constant_copy"]
        assert plain._cp.step_spans == ((1,), (0, 2))
        want = plain.execute([xin])[0]
    np.testing.assert_allclose(want, np.maximum(xin, 0) @ w + bias, rtol=1e-5, atol=1e-4)
    with load_program(ob.to_bytes()).load_method(backend_options={NC: {"max_tiles": 3, "num_threads": 2}}) as m:
        got = m.execute([xin])[0]
        assert "aten::addmm.out" in {name for name, _ in handle_of(m).statistics().tiled_ops}
        assert handle_of(m).executor._spans == ((0,), (1,), (2,))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
