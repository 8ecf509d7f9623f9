"""OnnxRuntimeBackend: ONNX models imported as programs, run through orchestra's runtime and
compared with onnxruntime run directly; runtime options (init-only and hot); rejections."""

from __future__ import annotations

import threading

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from orchestra.aot import aot_backends, get_aot_backend, register_aot_backend  # noqa: E402
from orchestra.errors import BackendError, Error, InvalidArgumentError, NotFoundError, ProgramError  # noqa: E402
from orchestra.program import (  # noqa: E402
    AllocationDetails,
    BackendDelegate,
    BackendDelegateDataReference,
    BackendDelegateInlineData,
    Chain,
    CompileSpec,
    DataLocation,
    DelegateCall,
    EValue,
    ExecutionPlan,
    Instruction,
    ProgramDef,
    ScalarType,
    Tensor,
    TensorShapeDynamism,
    dumps,
    loads,
)
from orchestra.runtime import Backend, load_program, register_backend, registered_backends  # noqa: E402

import orchestra.backends.onnxruntime as ortb  # noqa: E402
from orchestra.backends.onnxruntime import (  # noqa: E402
    OnnxRuntimeBackend,
    OnnxRuntimeBackendDetails,
    OnnxRuntimeHandle,
    import_onnx,
)

ID = "OnnxRuntimeBackend"
if ID not in registered_backends():
    register_backend(Backend(ID, OnnxRuntimeBackend()))
if ID not in aot_backends():
    register_aot_backend(ID, OnnxRuntimeBackendDetails)

RNG = np.random.default_rng(7)


# -- models ---------------------------------------------------------------------------------
def _model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(a, n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    onnx.checker.check_model(m)
    return m


def mlp(batch: int | str = 2) -> onnx.ModelProto:
    """y = relu(relu(x @ W1 + b1) @ W2 + b2), x: [batch, 32]."""
    w1, b1 = RNG.standard_normal((32, 64), np.float32), RNG.standard_normal(64, np.float32)
    w2, b2 = RNG.standard_normal((64, 10), np.float32), RNG.standard_normal(10, np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h1"]), helper.make_node("Add", ["h1", "b1"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["h3"]), helper.make_node("MatMul", ["h3", "W2"], ["h4"]),
        helper.make_node("Add", ["h4", "b2"], ["h5"]), helper.make_node("Relu", ["h5"], ["y"]),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 32])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 10])],
                  [("W1", w1), ("b1", b1), ("W2", w2), ("b2", b2)])


def conv_net() -> onnx.ModelProto:
    """y = relu(conv3x3(x, 8 channels, pad 1)), x: [1, 3, 16, 16]."""
    w, b = RNG.standard_normal((8, 3, 3, 3), np.float32), RNG.standard_normal(8, np.float32)
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], [("W", w), ("B", b)])


def two_in_three_out() -> onnx.ModelProto:
    """a: float32 [2, 3], b: int64 [3] -> s = a + float(b) (float32), c = b * 2 (int64), g = a > 0 (bool)."""
    nodes = [
        helper.make_node("Cast", ["b"], ["bf"], to=TensorProto.FLOAT), helper.make_node("Add", ["a", "bf"], ["s"]),
        helper.make_node("Add", ["b", "b"], ["c"]),
        helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.zeros((), np.float32))),
        helper.make_node("Greater", ["a", "zero"], ["g"]),
    ]
    return _model(nodes, [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
                          helper.make_tensor_value_info("b", TensorProto.INT64, [3])],
                  [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, 3]),
                   helper.make_tensor_value_info("c", TensorProto.INT64, [3]),
                   helper.make_tensor_value_info("g", TensorProto.BOOL, [2, 3])])


def direct(model: onnx.ModelProto, feeds: dict, threads: int = 1) -> list[np.ndarray]:
    """The model run by onnxruntime itself, with the backend's default session settings."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def load(model, **kw):
    """import_onnx -> .pte bytes -> a verified Program (the writer/reader round trip)."""
    return load_program(dumps(import_onnx(model, **kw)))


def handle_of(method) -> OnnxRuntimeHandle:
    (backend, h), = method._handles
    assert isinstance(backend, OnnxRuntimeBackend)
    return h


# -- public surface -------------------------------------------------------------------------
def test_public_names_are_importable() -> None:
    for name in ortb.__all__:
        assert hasattr(ortb, name), name
    assert OnnxRuntimeBackend().is_available()
    assert get_aot_backend(ID) is OnnxRuntimeBackendDetails
    assert ID in registered_backends()


# -- results --------------------------------------------------------------------------------
@pytest.mark.parametrize("io_binding", [True, False])
@pytest.mark.parametrize("delegate_data", ["keep", "segment"])
def test_mlp_matches_onnxruntime_exactly(delegate_data: str, io_binding: bool) -> None:
    model = mlp()
    prog = load_program(dumps(import_onnx(model), delegate_data=delegate_data))
    meta = prog.method_meta("forward")
    assert [i.shape for i in meta.inputs] == [(2, 32)] and [o.shape for o in meta.outputs] == [(2, 10)]
    assert meta.backends == (ID,)
    with prog.load_method(backend_options={ID: {"intra_op_num_threads": 1, "io_binding": io_binding}}) as m:
        earlier = []
        for _ in range(4):
            x = RNG.standard_normal((2, 32), np.float32)
            (y,) = m.execute([x])
            (ref,) = direct(model, {"x": x})
            np.testing.assert_array_equal(y, ref)
            earlier.append((y, ref))
        for y, ref in earlier:  # results are the caller's: later executes don't write into them
            np.testing.assert_array_equal(y, ref)
        h = handle_of(m)
        assert (h.binding is not None) is io_binding
        if io_binding:  # bound to the Method's own planned arrays
            assert h.bound[0] is m._vals[0] and h.bound[1] is m._vals[1]


@pytest.mark.parametrize("io_binding", [True, False])
def test_conv_net_matches_onnxruntime(io_binding: bool) -> None:
    model = conv_net()
    with load(model).load_method(backend_options={ID: {"io_binding": io_binding}}) as m:
        x = RNG.standard_normal((1, 3, 16, 16), np.float32)
        (y,) = m.execute([x])
        np.testing.assert_allclose(y, direct(model, {"x": x})[0], rtol=1e-6, atol=1e-6)
        assert y.shape == (1, 8, 16, 16) and y.min() >= 0


def test_several_inputs_outputs_and_dtypes() -> None:
    model = two_in_three_out()
    prog = load(model)
    meta = prog.method_meta("forward")
    assert [i.scalar_type for i in meta.inputs] == [ScalarType.FLOAT, ScalarType.LONG]
    assert [o.scalar_type for o in meta.outputs] == [ScalarType.FLOAT, ScalarType.LONG, ScalarType.BOOL]
    for io_binding in (True, False):
        with prog.load_method(backend_options={ID: {"io_binding": io_binding}}) as m:
            for _ in range(2):
                a, b = RNG.standard_normal((2, 3), np.float32), RNG.integers(-5, 5, 3, dtype=np.int64)
                got = m.execute([a, b])
                for g, r in zip(got, direct(model, {"a": a, "b": b})):
                    assert g.dtype == r.dtype
                    np.testing.assert_array_equal(g, r)


def test_arena_offsets_are_aligned_and_disjoint() -> None:
    plan = import_onnx(two_in_three_out()).execution_plan[0]
    spans = []
    for ev in plan.values:
        t = ev.val
        assert t.allocation_info.memory_id == 1 and t.allocation_info.offset % 16 == 0
        n = int(np.prod(t.sizes)) * ScalarType(t.scalar_type).itemsize
        spans.append((t.allocation_info.offset, t.allocation_info.offset + n))
    spans.sort()
    assert all(e <= s for (_, e), (s, _) in zip(spans, spans[1:]))
    assert plan.non_const_buffer_sizes[1] >= spans[-1][1]
    (ins,) = plan.chains[0].instructions
    assert ins.instr_args == DelegateCall(0, (0, 1, 2, 3, 4))


def test_methods_in_parallel_threads_each_use_their_own_session() -> None:
    model = mlp()
    prog = load(model)
    xs = [RNG.standard_normal((2, 32), np.float32) for _ in range(8)]
    refs = [direct(model, {"x": x})[0] for x in xs]
    errors: list[BaseException] = []

    def work(m) -> None:
        try:
            for _ in range(10):
                for x, r in zip(xs, refs):
                    np.testing.assert_array_equal(m.execute([x])[0], r)
        except BaseException as exc:  # reported below
            errors.append(exc)

    methods = [prog.load_method() for _ in range(3)]
    threads = [threading.Thread(target=work, args=(m,)) for m in methods]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len({id(handle_of(m).session) for m in methods}) == 3
    for m in methods:
        m.close()


# -- init-only options ----------------------------------------------------------------------
def test_init_options_reach_the_session_per_method_instance() -> None:
    prog = load(mlp())
    with prog.load_method(backend_options={ID: {"intra_op_num_threads": 2, "execution_mode": "parallel",
                                                "inter_op_num_threads": 2, "graph_optimization_level": "basic"}}) as m1, \
            prog.load_method() as m2:
        so1 = handle_of(m1).session.get_session_options()
        so2 = handle_of(m2).session.get_session_options()
        assert (so1.intra_op_num_threads, so1.inter_op_num_threads) == (2, 2)
        assert so1.execution_mode == ort.ExecutionMode.ORT_PARALLEL
        assert so1.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        assert (so2.intra_op_num_threads, so2.inter_op_num_threads) == (1, 1)
        assert so2.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
        assert so2.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        assert so2.get_session_config_entry("session.intra_op.allow_spinning") == "1"


def test_init_only_change_recreates_the_session_once_at_the_next_execute() -> None:
    model = mlp()
    x = RNG.standard_normal((2, 32), np.float32)
    (ref,) = direct(model, {"x": x})
    with load(model).load_method() as m:
        np.testing.assert_array_equal(m.execute([x])[0], ref)
        old = handle_of(m)
        m.set_options({ID: {"intra_op_num_threads": 2, "allow_spinning": False}})
        assert handle_of(m) is old and old.session is not None  # nothing happens between executes
        np.testing.assert_array_equal(m.execute([x])[0], ref)
        new = handle_of(m)
        assert new is not old and old.session is None  # built, swapped, then the old one destroyed
        so = new.session.get_session_options()
        assert so.intra_op_num_threads == 2
        assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
        for _ in range(3):
            np.testing.assert_array_equal(m.execute([x])[0], ref)
        assert handle_of(m) is new
        assert m.statistics().reinits == 1
        assert m.options()[ID]["intra_op_num_threads"] == 2
    assert new.session is None  # close destroys it


def test_prepared_options_build_the_session_ahead_of_the_boundary() -> None:
    with load(mlp()).load_method() as m:
        x = RNG.standard_normal((2, 32), np.float32)
        m.execute([x])
        m.prepare_backend_options(ID, {"graph_optimization_level": "disable"})
        m.execute([x])
        so = handle_of(m).session.get_session_options()
        assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        assert m.statistics().reinits == 1


# -- hot options ----------------------------------------------------------------------------
def test_hot_change_builds_one_run_options_and_executes_reuse_it() -> None:
    model = mlp()
    x = RNG.standard_normal((2, 32), np.float32)
    (ref,) = direct(model, {"x": x})
    with load(model).load_method() as m:
        m.execute([x])
        h = handle_of(m)
        ro0 = h.run_options
        assert (ro0.log_severity_level, ro0.logid) == (2, "") and len(h.run_options_cache) == 1
        m.execute([x])
        assert h.run_options is ro0
        m.set_options({ID: {"run_tag": "camera-0", "log_severity_level": 3}})
        np.testing.assert_array_equal(m.execute([x])[0], ref)
        assert handle_of(m) is h and m.statistics().reinits == 0  # hot: same session
        ro1 = h.run_options
        assert ro1 is not ro0 and (ro1.log_severity_level, ro1.logid) == (3, "camera-0")
        assert len(h.run_options_cache) == 2
        for _ in range(3):
            m.execute([x])
            assert h.run_options is ro1
        # A per-call override uses its own RunOptions for that call only.
        np.testing.assert_array_equal(m.execute([x], backend_options={ID: {"run_tag": "once"}})[0], ref)
        assert h.run_options.logid == "once" and len(h.run_options_cache) == 3
        m.execute([x])
        assert h.run_options is ro1 and len(h.run_options_cache) == 3
        # Back to the first values: the cached RunOptions, not a new one.
        m.set_options({ID: {"run_tag": "", "log_severity_level": 2}})
        m.execute([x])
        assert h.run_options is ro0


def test_shrink_arena_runs_with_and_without_the_cpu_arena() -> None:
    model = conv_net()
    x = RNG.standard_normal((1, 3, 16, 16), np.float32)
    ref = direct(model, {"x": x})[0]
    for arena in (True, False):
        with load(model).load_method(backend_options={ID: {"enable_cpu_mem_arena": arena, "shrink_arena": True}}) as m:
            np.testing.assert_allclose(m.execute([x])[0], ref, rtol=1e-6, atol=1e-6)
            ro = handle_of(m).run_options
            if arena:
                assert ro.get_run_config_entry("memory.enable_memory_arena_shrinkage") == "cpu:0"
            else:  # no arena to shrink: onnxruntime would reject the entry
                with pytest.raises(Exception):
                    ro.get_run_config_entry("memory.enable_memory_arena_shrinkage")


def test_run_options_cache_is_bounded() -> None:
    with load(mlp()).load_method() as m:
        x = RNG.standard_normal((2, 32), np.float32)
        for i in range(40):
            m.execute([x], backend_options={ID: {"run_tag": f"frame-{i}"}})
        assert len(handle_of(m).run_options_cache) <= 16


# -- rejections -----------------------------------------------------------------------------
def test_unknown_provider_is_named_with_the_available_ones() -> None:
    prog = load(mlp())
    with pytest.raises(BackendError, match="'NoSuchExecutionProvider' is not available") as ei:
        prog.load_method(backend_options={ID: {"providers": "CPUExecutionProvider, NoSuchExecutionProvider"}})
    assert "CPUExecutionProvider" in str(ei.value).split("available:")[-1]
    with prog.load_method() as m:
        x = RNG.standard_normal((2, 32), np.float32)
        m.execute([x])
        m.set_options({ID: {"providers": "NoSuchExecutionProvider"}})  # checked at init, i.e. next execute
        with pytest.raises(BackendError, match="NoSuchExecutionProvider"):
            m.execute([x])
        m.set_options({ID: {"providers": "CPUExecutionProvider"}})
        m.execute([x])  # the old session still serves
        assert m.statistics().reinits == 0


def test_option_type_choice_and_key_messages_come_from_orchestra() -> None:
    with load(mlp()).load_method() as m:
        with pytest.raises(InvalidArgumentError, match="option 'intra_op_num_threads' must be int, got str"):
            m.set_options({ID: {"intra_op_num_threads": "2"}})
        with pytest.raises(InvalidArgumentError, match="option 'execution_mode' must be one of 'sequential', 'parallel'"):
            m.set_options({ID: {"execution_mode": "fast"}})
        with pytest.raises(InvalidArgumentError, match="option 'graph_optimization_level' must be one of"):
            m.set_options({ID: {"graph_optimization_level": "max"}})
        with pytest.raises(InvalidArgumentError, match="has no option 'threads'"):
            m.set_options({ID: {"threads": 2}})
        with pytest.raises(InvalidArgumentError, match="option 'providers' is init-only"):
            m.execute([np.zeros((2, 32), np.float32)], backend_options={ID: {"providers": "CPUExecutionProvider"}})
        assert m.statistics().reinits == 0
    with pytest.raises(InvalidArgumentError, match="option 'intra_op_num_threads' must be >= 0"):
        load(mlp()).load_method(backend_options={ID: {"intra_op_num_threads": -1}})


def test_thread_affinities_reach_the_session() -> None:
    model = mlp()
    opts = {"intra_op_num_threads": 2, "intra_op_thread_affinities": "1"}  # the 2nd thread on processor 1
    with load(model).load_method(backend_options={ID: opts}) as m:
        so = handle_of(m).session.get_session_options()
        assert so.get_session_config_entry("session.intra_op_thread_affinities") == "1"
        x = RNG.standard_normal((2, 32), np.float32)
        np.testing.assert_allclose(m.execute([x])[0], direct(model, {"x": x})[0], rtol=1e-6, atol=1e-6)


def test_bad_thread_affinity_is_a_backend_error() -> None:
    with pytest.raises(BackendError, match="could not create a session"):
        load(mlp()).load_method(backend_options={ID: {"intra_op_num_threads": 2, "intra_op_thread_affinities": "x"}})


def test_wrong_inputs_are_rejected_before_onnxruntime_runs() -> None:
    with load(mlp()).load_method() as m:
        with pytest.raises(InvalidArgumentError, match="dtype float64 does not match"):
            m.execute([np.zeros((2, 32), np.float64)])
        with pytest.raises(InvalidArgumentError, match=r"shape \[2, 31\] does not fit"):
            m.execute([np.zeros((2, 31), np.float32)])


def _hand_built(model_bytes: bytes, values: list[EValue], n_in: int, specs=()) -> ProgramDef:
    idx = tuple(range(len(values)))
    plan = ExecutionPlan("forward", None, tuple(values), idx[:n_in], idx[n_in:],
                         (Chain(idx[:n_in], idx[n_in:], (Instruction(DelegateCall(0, idx)),)),), (),
                         (BackendDelegate(ID, BackendDelegateDataReference(DataLocation.INLINE, 0), tuple(specs)),),
                         (0, 4096))
    return ProgramDef(0, (plan,), backend_delegate_data=(BackendDelegateInlineData(memoryview(model_bytes)),))


def _t(st: ScalarType, sizes, offset: int) -> EValue:
    return EValue(Tensor(st, 0, tuple(sizes), tuple(range(len(sizes))), allocation_info=AllocationDetails(1, offset)))


def test_delegate_checks_inputs_against_the_session_and_names_them() -> None:
    # A program that disagrees with its model: it declares 'a' as float64.
    model = two_in_three_out()
    values = [_t(ScalarType.DOUBLE, (2, 3), 0), _t(ScalarType.LONG, (3,), 64), _t(ScalarType.FLOAT, (2, 3), 128),
              _t(ScalarType.LONG, (3,), 192), _t(ScalarType.BOOL, (2, 3), 256)]
    with load_program(_hand_built(model.SerializeToString(), values, 2)).load_method() as m:
        with pytest.raises(InvalidArgumentError, match=r"model input 'a' \(argument 0\) expects float32 \[2, 3\], got float64 \[2, 3\]"):
            m.execute([np.zeros((2, 3), np.float64), np.zeros(3, np.int64)])
    # Too few values in the DelegateCall.
    with load_program(_hand_built(model.SerializeToString(), values[:4], 2)).load_method() as m:
        with pytest.raises(InvalidArgumentError, match="passes 4 values; the model takes 2 inputs and returns 3 outputs"):
            m.execute([np.zeros((2, 3), np.float64), np.zeros(3, np.int64)])


def test_compile_specs_reorder_inputs_and_select_outputs() -> None:
    model = two_in_three_out()
    specs = (CompileSpec("input_names", b"b,a"), CompileSpec("output_names", b"c, s"))
    values = [_t(ScalarType.LONG, (3,), 0), _t(ScalarType.FLOAT, (2, 3), 64), _t(ScalarType.LONG, (3,), 128),
              _t(ScalarType.FLOAT, (2, 3), 192)]
    prog = load_program(dumps(_hand_built(model.SerializeToString(), values, 2, specs)))
    a, b = RNG.standard_normal((2, 3), np.float32), np.array([4, 5, 6], np.int64)
    s, c, _ = direct(model, {"a": a, "b": b})
    with prog.load_method() as m:
        got_c, got_s = m.execute([b, a])
        assert handle_of(m).input_names == ("b", "a") and handle_of(m).output_names == ["c", "s"]
    np.testing.assert_array_equal(got_c, c)
    np.testing.assert_array_equal(got_s, s)
    bad = _hand_built(model.SerializeToString(), values, 2, (CompileSpec("input_names", b"b"),))
    with pytest.raises(InvalidArgumentError, match="must name every model input once.*missing: a"):
        load_program(bad).load_method()


def test_an_output_aliasing_an_input_is_not_bound_in_place() -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5])])
    values = [_t(ScalarType.FLOAT, (5,), 0), _t(ScalarType.FLOAT, (5,), 0)]  # y planned over x
    with load_program(_hand_built(model.SerializeToString(), values, 1)).load_method() as m:
        x = np.array([-2, -1, 0, 1, 2], np.float32)
        for _ in range(2):
            np.testing.assert_array_equal(m.execute([x])[0], [0, 0, 0, 1, 2])
        assert not handle_of(m).bindable and handle_of(m).binding is None


def test_binding_follows_new_arrays_once_then_gives_up() -> None:
    # Inputs without planned memory: the interpreter passes the caller's array itself.
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5])])
    values = [EValue(Tensor(ScalarType.FLOAT, 0, (5,), (0,))), _t(ScalarType.FLOAT, (5,), 0)]
    with load_program(_hand_built(model.SerializeToString(), values, 1)).load_method() as m:
        h = handle_of(m)
        seen = []
        for k in range(4):
            x = np.array([-2, -1, 0, 1, 2], np.float32) * (k + 1)
            np.testing.assert_array_equal(m.execute([x])[0], np.maximum(x, 0))
            seen.append((h.bindable, h.binding is not None))
        assert seen == [(True, True), (True, True), (False, False), (False, False)]


def test_a_blob_that_is_not_onnx_fails_at_load_naming_the_delegate() -> None:
    prog = _hand_built(b"definitely not onnx", [_t(ScalarType.FLOAT, (2,), 0), _t(ScalarType.FLOAT, (2,), 16)], 1)
    with pytest.raises(BackendError, match=r"method 'forward': delegate 0 \(OnnxRuntimeBackend\): onnxruntime could not create a session"):
        load_program(prog).load_method()


# -- dynamic shapes -------------------------------------------------------------------------
def test_dynamic_batch_with_bounds() -> None:
    model = mlp(batch="N")
    prog = load(model, dynamic_bounds={"x": (8, 32)})
    meta = prog.method_meta("forward")
    assert meta.inputs[0].shape == (8, 32) and meta.inputs[0].dynamism == TensorShapeDynamism.DYNAMIC_BOUND
    assert meta.outputs[0].shape == (8, 10) and meta.outputs[0].dynamism == TensorShapeDynamism.DYNAMIC_BOUND
    with prog.load_method() as m:
        assert not handle_of(m).bindable  # dynamic outputs: session.run, results copied or replaced
        for n in (1, 5, 8, 3, 3):
            x = RNG.standard_normal((n, 32), np.float32)
            (y,) = m.execute([x])
            assert y.shape == (n, 10)
            np.testing.assert_array_equal(y, direct(model, {"x": x})[0])
        with pytest.raises(InvalidArgumentError, match=r"shape \[9, 32\] does not fit the program's bound \[8, 32\]"):
            m.execute([np.zeros((9, 32), np.float32)])


def test_dynamic_dims_without_bounds_name_the_input_and_dim() -> None:
    with pytest.raises(InvalidArgumentError, match=r"model input 'x' of shape \[\?, 32\]: dims 0 are dynamic.*dynamic_bounds=\{'x'"):
        import_onnx(mlp(batch="N"))
    # -1 and 0 dims count as dynamic too.
    for bad in (-1, 0):
        m = mlp(batch=1)
        m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = bad
        with pytest.raises(InvalidArgumentError, match="model input 'x'.*dims 0 are dynamic"):
            import_onnx(m)


@pytest.mark.parametrize(("bounds", "message"), [
    ({"x": (8,)}, "has rank 1"),
    ({"x": (8, 31)}, "dim 1 is 31 but model input 'x'.*fixes it to 32"),
    ({"x": (0, 32)}, "dim 0 must be >= 1"),
    ({"x": (8, 32), "z": (1,)}, "names 'z', which the model doesn't have"),
    ({"x": "eight"}, "must be a sequence of ints"),
])
def test_bad_bounds_are_rejected(bounds, message) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        import_onnx(mlp(batch="N"), dynamic_bounds=bounds)


def test_output_bounds_can_be_given_when_inference_cannot_tell() -> None:
    # NonZero's output size depends on the data: shape inference leaves it unknown.
    model = _model([helper.make_node("NonZero", ["x"], ["i"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
                   [helper.make_tensor_value_info("i", TensorProto.INT64, [1, "K"])])
    with pytest.raises(InvalidArgumentError, match="model output 'i'.*dims 1 are dynamic"):
        import_onnx(model)
    prog = load(model, dynamic_bounds={"i": (1, 6)})
    assert prog.method_meta("forward").outputs[0].dynamism == TensorShapeDynamism.DYNAMIC_BOUND
    x = np.array([0, 1, 0, 2, 3, 0], np.float32)
    with prog.load_method() as m:
        np.testing.assert_array_equal(m.execute([x])[0], [[1, 3, 4]])


# -- bad models and the AOT half ------------------------------------------------------------
def test_bad_onnx_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(ProgramError, match=r"<bytes>: not .*ONNX model"):
        import_onnx(b"\x00\x01 this is not an onnx model")
    missing = tmp_path / "missing.onnx"
    with pytest.raises(NotFoundError, match="missing.onnx: no such ONNX model file"):
        import_onnx(missing)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\xff\xfe garbage \x00")
    with pytest.raises(ProgramError, match="junk.onnx: not .*ONNX model"):
        import_onnx(str(junk))
    unchecked = mlp()
    del unchecked.opset_import[:]
    with pytest.raises(ProgramError, match="not a valid ONNX model"):
        import_onnx(unchecked.SerializeToString())
    with pytest.raises(InvalidArgumentError, match="not a int"):
        import_onnx(3)


def test_unsupported_dtypes_are_named() -> None:
    model = _model([helper.make_node("Identity", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2])],
                   [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2])])
    with pytest.raises(ProgramError, match="model input 'x' has element type BFLOAT16"):
        import_onnx(model)


def test_preprocess_takes_bytes_modelproto_or_a_path(tmp_path) -> None:
    model = conv_net()
    data = model.SerializeToString()
    path = tmp_path / "conv.onnx"
    path.write_bytes(data)
    details = get_aot_backend(ID)
    for source in (data, model, path, str(path)):
        res = details.preprocess(source, [])
        assert res.processed_bytes == data and res.debug_handle_map is None
    res = details.preprocess(model, [CompileSpec("output_names", b"y")])
    assert res.processed_bytes == data
    with pytest.raises(InvalidArgumentError, match="unknown compile spec 'threads'"):
        details.preprocess(model, [CompileSpec("threads", b"2")])
    with pytest.raises(InvalidArgumentError, match="'output_names' names 'z', not outputs of the model"):
        details.preprocess(model, [CompileSpec("output_names", b"z")])
    with pytest.raises(InvalidArgumentError, match="export the graph to ONNX first"):
        details.preprocess(import_onnx(model), [])


def test_external_data_is_embedded_from_a_path(tmp_path) -> None:
    model = conv_net()
    path = tmp_path / "ext.onnx"
    saved = onnx.ModelProto()
    saved.CopyFrom(model)  # saving with external data rewrites the proto in place
    onnx.save_model(saved, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="ext.data", size_threshold=0)
    assert (tmp_path / "ext.data").exists()
    x = RNG.standard_normal((1, 3, 16, 16), np.float32)
    with load_program(loads(dumps(import_onnx(path)))).load_method() as m:
        np.testing.assert_allclose(m.execute([x])[0], direct(model, {"x": x})[0], rtol=1e-6, atol=1e-6)
    with pytest.raises(ProgramError, match="keep their data in external files"):
        import_onnx(path.read_bytes())


def test_execute_errors_from_onnxruntime_are_backend_errors() -> None:
    # Reshape to a shape that the data can't take fails inside onnxruntime.
    model = _model([helper.make_node("Reshape", ["x", "s"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6]),
                    helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["A", "B"])])
    prog = load(model, dynamic_bounds={"y": (6, 6)})
    with prog.load_method() as m:
        np.testing.assert_array_equal(m.execute([np.arange(6, dtype=np.float32), np.array([2, 3], np.int64)])[0],
                                      np.arange(6, dtype=np.float32).reshape(2, 3))
        with pytest.raises(BackendError, match="onnxruntime run failed") as ei:
            m.execute([np.arange(6, dtype=np.float32), np.array([4, 4], np.int64)])
        assert ei.value.code is Error.Internal
