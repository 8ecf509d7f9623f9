"""Programs with state: mutable buffers, state shared by the methods of one program, training.

The committed fixtures (``tests/fixtures/state``, made by ``tools/export_state_fixtures.py``)
hold sequences of executes on one loaded program: ``NNN.METHOD.in_K`` / ``.out_K``, from
ExecuTorch's runtime (torch eager for ``state_counter``, which ExecuTorch's Python runtime
crashes on). Each is replayed on a ProgramInstance (the program's methods loaded together),
a Session, and pools of the orchestrator (thread and process placement), where two instances
must keep separate state while they execute concurrently. The ``executorch`` tests export
the committed equivalents of ExecuTorch's own ``test/models`` programs
(``tests/fixtures/state/et_test_models``) against ExecuTorch's runtime; all 16 load.
"""

from __future__ import annotations

import pathlib
import re
import threading
from typing import Any

import anyio
import numpy as np
import pytest

import orchestra
from orchestra import Error, InvalidArgumentError, NotFoundError, OrchestraError, ProgramError
from orchestra.orchestrator import InstanceSpec, Orchestrator
from orchestra.program import loads
from orchestra.runtime import ProgramInstance, Session, load_program

STATE = pathlib.Path(__file__).parent / "fixtures" / "state"
FIXTURES = STATE.parent
KEY = re.compile(r"^(?P<step>\d{3})\.(?P<method>[A-Za-z_]\w*)\.(?P<kind>in|out)_(?P<k>\d+)$")

Step = tuple[str, list[Any], list[np.ndarray]]


def steps(name: str) -> list[Step]:
    """The committed sequence of ``name``: (method, inputs, outputs) per execute, in order."""
    found: dict[int, dict[str, Any]] = {}
    with np.load(STATE / f"{name}.npz", allow_pickle=False) as z:
        for key in z.files:
            m = KEY.match(key)
            if m is None:
                continue
            s = found.setdefault(int(m["step"]), {"method": m["method"], "in": {}, "out": {}})
            assert s["method"] == m["method"], key
            s[m["kind"]][int(m["k"])] = z[key]
    assert sorted(found) == list(range(len(found))), f"{name}: steps {sorted(found)}"
    return [(s["method"], [s["in"][k] for k in range(len(s["in"]))], [s["out"][k] for k in range(len(s["out"]))])
            for _, s in sorted(found.items())]


def npz(name: str) -> dict[str, np.ndarray]:
    with np.load(STATE / f"{name}.npz", allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def assert_outputs(got: list[Any], want: list[np.ndarray], where: str, atol: float = 1e-6) -> None:
    assert len(got) == len(want), f"{where}: {len(got)} outputs, expected {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        assert g.dtype == w.dtype and g.shape == w.shape, f"{where} out_{k}: {g.dtype}{g.shape} != {w.dtype}{w.shape}"
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=atol, err_msg=f"{where} out_{k}")


def replay(execute: Any, name: str, seq: list[Step] | None = None) -> None:
    for i, (method, ins, outs) in enumerate(seq or steps(name)):
        assert_outputs(execute(method, ins), outs, f"{name} step {i} {method}")


@pytest.fixture(params=[pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
                        pytest.param(("asyncio", {}), id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict]:
    return request.param


# -- the fixtures ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["state_counter", "state_shared", "kv_cache", "segments_no_header"])
def test_program_instance_replays_the_committed_sequence(name: str) -> None:
    with load_program(STATE / f"{name}.pte").load_methods() as inst:
        replay(inst.execute, name)
        st = inst.statistics()
        assert st.executions == len(steps(name)) and st.failures == 0


def test_counter_state_persists_across_executes_of_a_lone_method() -> None:
    """The int32 buffer is exported unplanned (ExecuTorch leaves its memory to the app): each
    Method owns one, zeroed, so count 1, 2, 3, 4 comes back over the executes."""
    seq = steps("state_counter")
    prog = load_program(STATE / "state_counter.pte")
    with prog.load_method() as m:
        replay(lambda _, ins: m.execute(ins), "state_counter", seq)
    with prog.load_method() as fresh:  # a new Method starts from zero again
        (method, ins, outs), = seq[:1]
        assert_outputs(fresh.execute(ins), outs, "fresh Method")


def test_methods_loaded_alone_keep_their_own_state() -> None:
    prog = load_program(STATE / "state_shared.pte")
    x = np.arange(4, dtype=np.float32)
    with prog.load_method("forward") as fwd, prog.load_method("get_state") as get:
        np.testing.assert_array_equal(fwd.execute([x])[0], 2 * x)
        np.testing.assert_array_equal(get.execute([])[0], np.zeros(4, np.float32))  # not forward's


def test_two_program_instances_never_see_each_others_state() -> None:
    prog = load_program(STATE / "state_shared.pte")
    a, b = prog.load_methods(), prog.load_methods(["get_state", "set_state"])
    with a, b:
        a.execute("set_state", [np.full(4, 3, np.float32)])
        b.execute("set_state", [np.full(4, -1, np.float32)])
        a.execute("forward", [np.ones(4, np.float32)])
        np.testing.assert_array_equal(a.execute("get_state", [])[0], np.full(4, 4, np.float32))
        np.testing.assert_array_equal(b.execute("get_state", [])[0], np.full(4, -1, np.float32))
        assert b.method_names == ("get_state", "set_state")
        with pytest.raises(NotFoundError, match="'forward' is not loaded in this program instance"):
            b.method("forward")


def test_kv_cache_instances_interleaved_keep_their_own_cache() -> None:
    seq = steps("kv_cache")
    prog = load_program(STATE / "kv_cache.pte")
    other = [(m, [x + 0.5 if x.dtype == np.float32 else x for x in ins]) for m, ins, _ in seq]
    with prog.load_methods(["prefill", "decode"]) as ref:  # the other sequence, run alone
        other_out = [ref.execute(m, ins) for m, ins in other]
    with prog.load_methods() as a, prog.load_methods() as b:
        for i, ((m, ins, outs), (_, ins_b), outs_b) in enumerate(zip(seq, other, other_out)):
            assert_outputs(a.execute(m, ins), outs, f"a step {i}")
            assert_outputs(b.execute(m, ins_b), outs_b, f"b step {i}")


def test_threads_each_with_their_own_instance_run_concurrently() -> None:
    seq = steps("kv_cache")
    prog = load_program(STATE / "kv_cache.pte")
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with prog.load_methods() as inst:
                for _ in range(5):
                    for i, (m, ins, outs) in enumerate(seq):
                        assert_outputs(inst.execute(m, ins), outs, f"step {i}")
                    inst.execute("prefill", seq[0][1])  # a new sequence overwrites the prompt
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_train_step_gives_loss_grads_and_sgd_updated_weights() -> None:
    data = npz("train_step")
    lr = float(data["lr"])
    seq = steps("train_step")
    with load_program(STATE / "train_step.pte").load_methods(["forward"]) as inst:
        fwd = inst.method("forward")
        params = fwd.named_parameters()
        assert sorted(params) == ["linear.bias", "linear.weight"]
        for i, (method, ins, outs) in enumerate(seq):
            assert_outputs(inst.execute(method, ins), outs, f"train step {i}")
            grads = fwd.named_gradients()
            for name, p in params.items():
                p -= lr * grads[name]  # the SGD step, in place in the Method's memory
        for name, p in fwd.named_parameters().items():
            np.testing.assert_allclose(p, data[f"final.{name}"], rtol=1e-5, atol=1e-6, err_msg=name)
    # the training metadata methods load and run like any method
    with load_program(STATE / "train_step.pte").load_methods() as everything:
        assert everything.execute("__et_training_fqn_forward", []) == ["linear.weight", "linear.bias"]


def test_named_parameters_of_a_method_that_does_not_train() -> None:
    with load_program(STATE / "state_shared.pte").load_method("forward") as m:
        with pytest.raises(InvalidArgumentError, match="not a training method"):
            m.named_parameters()


def test_a_fresh_training_method_starts_from_the_exported_weights() -> None:
    (method, ins, outs), = steps("train_step")[:1]
    prog = load_program(STATE / "train_step.pte")
    with prog.load_method() as m:
        for name, p in m.named_parameters().items():
            p[...] = 0.0  # scribble on this Method's weights only
    with prog.load_method() as m:
        assert_outputs(m.execute(ins), outs, "fresh training Method")


def test_session_functions_share_their_programs_state_until_trim() -> None:
    with Session() as s:
        s.append_program(STATE / "state_shared.pte", name="st")
        s.append_program(STATE / "state_shared.pte", name="other")
        replay(lambda m, ins: s.call_by_name(f"st.{m}", ins), "state_shared")
        np.testing.assert_array_equal(s.call_by_name("other.get_state", [])[0], np.zeros(4, np.float32))
        assert s.statistics().live_methods == 4
        assert s.trim() == 4
        np.testing.assert_array_equal(s.call_by_name("st.get_state", [])[0], np.zeros(4, np.float32))


def test_one_execute_at_a_time_per_program_instance() -> None:
    """While one method of an instance executes (its busy flag, shared by the instance's
    methods, is set as another thread's execute sets it), any of its methods refuses to run:
    they share memory."""
    prog = load_program(STATE / "state_shared.pte")
    with prog.load_methods() as inst:
        inst._busy[0] = True  # as while another thread runs one of its methods
        with pytest.raises(OrchestraError, match="per ProgramInstance") as err:
            inst.execute("get_state", [])
        assert err.value.code == Error.InvalidState
        inst._busy[0] = False
        np.testing.assert_array_equal(inst.execute("get_state", [])[0], np.zeros(4, np.float32))


def test_public_names() -> None:
    assert orchestra.ProgramInstance is ProgramInstance
    assert "ProgramInstance" in orchestra.runtime.__all__ and "ProgramInstanceStatistics" in orchestra.runtime.__all__


def test_closed_instance() -> None:
    inst = load_program(STATE / "state_shared.pte").load_methods(["get_state"])
    inst.close()
    inst.close()
    with pytest.raises(NotFoundError):
        inst.execute("get_state", [])


def test_load_methods_rejects_options_for_a_backend_no_method_uses() -> None:
    with pytest.raises(InvalidArgumentError, match="'NoSuch'"):
        load_program(STATE / "state_shared.pte").load_methods(backend_options={"NoSuch": {}})


# -- segments without an extended header -------------------------------------------------------
def test_segments_without_extended_header_load_when_unused() -> None:
    data = (STATE / "segments_no_header.pte").read_bytes()
    assert data[8:12] != b"eh00"
    prog = loads(data)
    assert len(prog.segments) == 1 and prog.segments[0].size == 0


@pytest.mark.parametrize(("name", "what"), [("two_methods", "constant data"),
                                            ("xnnpack_convnet", "segments\\[")])
def test_a_segment_used_without_extended_header_is_a_program_error(name: str, what: str) -> None:
    data = bytearray((FIXTURES / f"{name}.pte").read_bytes())
    assert data[8:12] == b"eh00"
    data[8:12] = b"\0\0\0\0"  # the header is gone: the segments' base offset is unknown
    with pytest.raises(ProgramError, match=f"{what}.*no extended header") as err:
        loads(bytes(data))
    assert err.value.code == Error.InvalidProgram


# -- the orchestrator ------------------------------------------------------------------------------
async def _kv_pool_run(placement: str) -> None:
    seq = steps("kv_cache")
    other = [(m, [x - 0.25 if x.dtype == np.float32 else x for x in ins]) for m, ins, _ in seq]
    with load_program(STATE / "kv_cache.pte").load_methods() as ref:
        other_out = [ref.execute(m, ins) for m, ins in other]
    async with Orchestrator(period=None) as orch:
        pool = await orch.load(STATE / "kv_cache.pte", "decode", methods=("prefill",),
                               instances=[InstanceSpec(n, placement=placement) for n in ("a", "b")])
        assert pool.methods == ("decode", "prefill")

        async def run(inst: str, sequence: list[tuple[str, list[Any]]], want: list[list[np.ndarray]]) -> None:
            for _ in range(3):
                for i, ((m, ins), outs) in enumerate(zip(sequence, want)):
                    assert_outputs(await pool[inst].execute(ins, method=m if m != "decode" else None), outs,
                                   f"{placement} {inst} step {i}")

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "a", [(m, ins) for m, ins, _ in seq], [outs for *_, outs in seq])
            tg.start_soon(run, "b", other, other_out)
        # routed by key: a sequence sticks to one instance
        for i, (m, ins, outs) in enumerate(seq):
            assert_outputs(await pool.execute(ins, key="seq7", method=m), outs, f"{placement} routed step {i}")
        with pytest.raises(InvalidArgumentError, match="'nope' is not loaded"):
            await pool.execute([], method="nope")
        # a pool of the method alone: its own state, as before (decode without a prefill)
        alone = await orch.load(STATE / "kv_cache.pte", "prefill", name="alone",
                                instances=[InstanceSpec("c", placement=placement)])
        assert alone.methods == ("prefill",)
        assert_outputs(await alone["c"].execute(seq[0][1]), seq[0][2], f"{placement} alone")
        with pytest.raises(InvalidArgumentError):
            await alone["c"].execute(seq[1][1], method="decode")


@pytest.mark.anyio
async def test_pool_of_program_instances_thread_placement() -> None:
    await _kv_pool_run("thread")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [("asyncio", {"use_uvloop": True})], ids=["uvloop"])
async def test_pool_of_program_instances_process_placement() -> None:
    await _kv_pool_run("process")


@pytest.mark.anyio
async def test_orchestrator_load_rejects_unknown_methods() -> None:
    async with Orchestrator(period=None) as orch:
        with pytest.raises(NotFoundError, match="'nope'"):
            await orch.load(STATE / "kv_cache.pte", "decode", methods=("nope",), instances=[InstanceSpec("a")])
        with pytest.raises(InvalidArgumentError, match="sequence of method names"):
            await orch.load(STATE / "kv_cache.pte", "decode", methods="prefill", instances=[InstanceSpec("a")])


# -- ExecuTorch's own test programs ------------------------------------------------------------------

_ET_INPUTS: dict[str, dict[str, list[Any]]] = {
    "Basic": {"forward": [np.linspace(-3, 3, 100, dtype=np.float32)]},
    "Index": {"forward": [np.arange(1000, dtype=np.float32).reshape(10, 10, 10)]},
    "IntBool": {"forward": [np.ones(1, np.float32), 1, True]},
    "NoOp": {"forward": [np.ones((2, 2), np.float32), np.full((2, 2), 2, np.float32)]},
    "Add": {"forward": [np.ones((2, 2), np.float32), np.full((2, 2), 2, np.float32), 1.0]},
    "AddHalf": {"forward": [np.ones((2, 2), np.float16), np.full((2, 2), 2, np.float16), 1.0]},
    "DynCat": {"forward": [np.arange(8, dtype=np.float32).reshape(2, 4)]},
    "AddMul": {"forward": [np.full((2, 2), 2, np.float32)]},
    "Linear": {"forward": [np.array([1, 2, 3], np.float32)]},
    "Multi": {"forward": [np.ones((2, 2), np.float32)], "forward2": [np.ones((2, 2), np.float32)]},
    "Train": {"forward": [np.array([0.1, 0.2, 0.3], np.float32), np.array([1, 0, 0], np.float32)]},
    "Stateful": {"forward": [np.ones(1, np.float32)]},
    "KVInputPos": {"forward": [np.array([[1, 2, 3]], np.int64), np.array([0], np.int64)]},
    "KVCachePos": {"forward": [np.array([[1, 2, 3]], np.int64), np.arange(3, dtype=np.int64)]},
    "NoKV": {"forward": [np.array([[1, 2, 3]], np.int64)]},
    "Shared": {"forward": [np.ones(1, np.float32)], "get_state": [], "set_state": [np.full(1, 5, np.float32)]},
}
# Calls made on ONE loaded program (state carries over); default: each method twice.
_ET_ORDER = {"Shared": ["get_state", "forward", "get_state", "forward", "set_state", "get_state", "forward"]}


ET_MODELS = STATE / "et_test_models"


def _calls(name: str) -> list[str]:
    return _ET_ORDER.get(name, [m for m in _ET_INPUTS[name] for _ in range(2)])


def _run_executorch(path: pathlib.Path, name: str) -> list[list[np.ndarray]]:
    import torch
    from executorch.runtime import Runtime

    prog = Runtime.get().load_program(path.read_bytes())  # its host-only methods share arenas
    res = []
    for m in _calls(name):
        args = [torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in _ET_INPUTS[name][m]]
        res.append([o.numpy().copy() if isinstance(o, torch.Tensor) else o for o in prog.load_method(m).execute(args)])
    return res


def _run_orchestra(name: str) -> list[list[Any]]:
    with load_program(ET_MODELS / f"{name}.pte").load_methods() as inst:
        return [inst.execute(m, _ET_INPUTS[name][m]) for m in _calls(name)]


def test_all_16_executorch_test_programs_load_and_run() -> None:
    assert sorted(p.stem for p in ET_MODELS.glob("*.pte")) == sorted(_ET_INPUTS)
    for name in sorted(_ET_INPUTS):
        assert len(_run_orchestra(name)) == len(_calls(name))
    # the counter, by hand (ExecuTorch's runtime crashes on it: no memory for the buffer)
    assert [o[0].tolist() for o in _run_orchestra("Stateful")] == [[2.0], [3.0]]


@pytest.mark.executorch
@pytest.mark.parametrize("name", sorted(set(_ET_INPUTS) - {"Stateful"}))
def test_executorch_test_programs_agree_with_executorch(name: str) -> None:
    pytest.importorskip("executorch.runtime")
    got, want = _run_orchestra(name), _run_executorch(ET_MODELS / f"{name}.pte", name)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        if name == "Shared" and _calls(name)[k] == "set_state":
            assert g == [None] and len(w) == 1, (g, w)
            continue
        assert_outputs([np.asarray(x) for x in g], [np.asarray(x) for x in w], f"{name} call {k}", atol=1e-3)
