"""Issue 15 (items 1-5): one options API on Method, Instance and Pool, binding-owned options,
caller errors apart from failures, and the options each execute ran with.

Real worker threads and processes, real Methods, programs built with ``ProgramBuilder``: a
delegate to ``Api15Adder`` (``out = in + add + offset``: every result says which option
values it ran with) and to ``NpuSimBackend`` on a registered ``NpuDevice``.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Iterator
from typing import Any

import anyio
import numpy as np
import pytest
import structlog

from orchestra import InvalidArgumentError
from orchestra.aot import BackendDetails, PreprocessResult, ProgramBuilder, aot_backends, register_aot_backend
from orchestra.backends import npu_sim
from orchestra.backends.npu_sim import NpuDevice, register_device
from orchestra.orchestrator import (
    ExecuteError,
    ExecuteRejectedError,
    Execution,
    InstanceSpec,
    NpuSimResource,
    Orchestrator,
    ResourceError,
    ResourcePool,
)
from orchestra.runtime import Backend, BackendInterface, OptionSpec, load_program, register_backend, registered_backends

ADD = "Api15Adder"
NPU = "NpuSimBackend"
X4 = np.arange(4, dtype=np.float32)


class Adder(BackendInterface):
    """out = in + ``add`` (hot) + ``offset`` (init-only); ``sleep_s`` (hot) slows an execute."""

    option_specs = (
        OptionSpec("add", float, 0.0, hot=True),
        OptionSpec("offset", float, 0.0, doc="init-only: read at init"),
        OptionSpec("sleep_s", float, 0.0, hot=True),
        OptionSpec("mode", str, "a", choices=("a", "b"), hot=True),
    )

    def init(self, context, processed, compile_specs):
        return {"offset": context.runtime_specs["offset"]}

    def execute(self, context, handle, args):
        specs = context.runtime_specs
        if specs["sleep_s"]:
            time.sleep(specs["sleep_s"])
        np.add(args[0], specs["add"] + handle["offset"], out=args[1])

    def destroy(self, handle) -> None:
        pass


class _Blob(BackendDetails):
    @staticmethod
    def preprocess(program, compile_specs):
        return PreprocessResult(b"\0")


if ADD not in registered_backends():
    register_backend(Backend(ADD, Adder()))
if ADD not in aot_backends():
    register_aot_backend(ADD, _Blob)
if NPU not in aot_backends():
    register_aot_backend(NPU, npu_sim.NpuSimBackendDetails)


def setup() -> None:
    """The process_initializer: worker processes import this module (registering Adder)."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(50))


@pytest.fixture(params=[pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
                        pytest.param(("asyncio", {}), id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict]:
    return request.param


def adder_program() -> Any:
    """forward(x[4]) = Adder(x)."""
    return load_program(_bytes_of_adder())


def npu_program() -> Any:
    """forward(x[4, 4]) = NpuSim(relu(x @ I))."""
    sub = ProgramBuilder()
    s = sub.method("forward")
    s.output(s.call("aten::relu.out", s.call("aten::mm.out", s.input(np.float32, (4, 4)), np.eye(4, dtype=np.float32))))
    b = ProgramBuilder()
    f = b.method("forward")
    (y,) = f.delegate(NPU, sub, [f.input(np.float32, (4, 4))])
    f.output(y)
    return load_program(b.to_bytes())


_ids = itertools.count()


@pytest.fixture
def npu() -> Iterator[NpuDevice]:
    dev = register_device(NpuDevice(f"npu-api15-{next(_ids)}", cores=2, links={"a": 0, "b": 1}))
    yield dev
    dev.close()


# -- item 1: bad options on an instance are the error a Method gives ---------------------
@pytest.mark.anyio
async def test_bad_options_on_an_instance_raise_the_invalid_argument_error_a_method_raises() -> None:
    prog = adder_program()
    m = prog.load_method("forward")
    async with Orchestrator(period=None) as orch:
        p = await orch.load(prog, instances=[InstanceSpec("i")])
        inst = p["i"]
        for bad, words in (({"NoSuchBackend": {"add": 1.0}}, ("'NoSuchBackend'", "is not used", ADD)),
                           ({ADD: {"ad": 1.0}}, ("'ad'", "has no option", "add, offset")),
                           ({ADD: {"add": "x"}}, ("add",)),
                           ({ADD: {"mode": "c"}}, ("mode",)),
                           ({ADD: 3}, ("mapping",))):
            with pytest.raises(InvalidArgumentError) as by_method:
                m.set_options(bad)
            with pytest.raises(InvalidArgumentError) as by_instance:
                await inst.set_options(bad)
            assert type(by_instance.value) is type(by_method.value), (bad, by_instance.value, by_method.value)
            for w in words:
                assert w in str(by_instance.value), (w, str(by_instance.value))
            assert "instance 'i'" in str(by_instance.value)
            with pytest.warns(DeprecationWarning), pytest.raises(InvalidArgumentError):
                inst.apply_options(bad)  # the old name: the same check, never a KeyError
        # nothing changed, and the instance runs on
        assert inst.options()[ADD]["add"] == 0.0
        np.testing.assert_array_equal((await inst.execute([X4]))[0], X4)
    m.close()


# -- item 2: options a binding sets change only through Pool.move ------------------------
@pytest.mark.anyio
async def test_an_option_the_binding_sets_is_refused_and_explain_stays_true(npu: NpuDevice) -> None:
    async with Orchestrator(resources=ResourcePool([NpuSimResource(npu)]), period=None) as orch:
        p = await orch.load(npu_program(), instances=[InstanceSpec("a", bind={"camera": "a"}),
                                                      InstanceSpec("b", bind={"camera": "b"})])
        for opts in ({NPU: {"core": 1}}, {NPU: {"device": "elsewhere"}}, {NPU: {"label": "b"}}):
            with pytest.raises(ResourceError) as ei:
                await p["a"].set_options(opts)
            msg = str(ei.value)
            assert "set by its binding" in msg and "Pool.move('a', bind)" in msg and "'camera': 'a'" in msg, msg
        e = orch.explain()["a"][NPU]["core"]
        assert (e.value, e.source, e.in_force) == (0, "binding", True)
        assert p["a"].options()[NPU]["core"] == 0
        x = np.eye(4, dtype=np.float32)
        await p["a"].execute([x])
        assert npu.statistics().cores[0].instances == ("a",)  # still on its own core
        # the way to change it: Pool.move, which checks the resource (core 1 is b's)
        with pytest.raises(ResourceError, match="held by instance 'b'"):
            await p.move("a", {f"{npu.name}.core": 1})
        # a hot option of the same backend is the instance's own to change
        await p["a"].set_options({NPU: {"power_mode": "low"}})
        e = orch.explain()["a"][NPU]["power_mode"]
        assert (e.value, e.source, e.in_force) == ("low", "api", True)


# -- item 3: a caller's bad input is an InvalidArgumentError and not a failure -----------
@pytest.mark.anyio
@pytest.mark.parametrize("placement", ["thread", "process"])
async def test_a_bad_input_is_an_invalid_argument_error_counted_apart_from_failures(placement: str) -> None:
    async with Orchestrator(period=None, process_initializer=setup) as orch:
        p = await orch.load(adder_program(), instances=[InstanceSpec("i", placement=placement)])
        for call in (lambda: p.execute([np.zeros(3, np.float32)]), lambda: p["i"].execute([X4, X4]),
                     lambda: p["i"].execute([X4], {ADD: {"offset": 1.0}})):  # init-only per call: refused
            with pytest.raises(InvalidArgumentError) as ei:
                await call()
            assert isinstance(ei.value, ExecuteRejectedError) and isinstance(ei.value, ExecuteError)
            assert isinstance(ei.value.__cause__, InvalidArgumentError) and ei.value.instance == "i"
        np.testing.assert_array_equal((await p.execute([X4]))[0], X4)
        s = p["i"].statistics()
        assert (s.executes, s.failures, s.rejected, s.restarts, s.state) == (1, 0, 3, 0, "running")
        assert s.last_error is None
        assert (p.statistics().failures, p.statistics().rejected) == (0, 3)
        assert (orch.statistics().failures, orch.statistics().rejected) == (0, 3)


# -- item 4: awaiting set_options means it is in force ---------------------------------------
@pytest.mark.anyio
@pytest.mark.parametrize("placement", ["thread", "process"])
async def test_awaited_set_options_is_in_force_hot_and_init_only(placement: str) -> None:
    async with Orchestrator(period=None, process_initializer=setup) as orch:
        p = await orch.load(adder_program(), instances=[InstanceSpec("i", placement=placement)])
        inst = p["i"]
        await inst.set_options({ADD: {"add": 2.0}})
        assert inst.options()[ADD]["add"] == 2.0  # idle: in force at once
        await inst.set_options({ADD: {"offset": 10.0}})  # init-only: re-initialised, then acked
        assert inst.options()[ADD]["offset"] == 10.0
        np.testing.assert_array_equal((await inst.execute([X4]))[0], X4 + 12)
        # busy: the change waits for the execute running now, which runs with the old values
        slow = anyio.Event()
        got: list[Any] = []

        async def run_slow() -> None:
            slow.set()
            got.append(await inst.execute([X4], {ADD: {"sleep_s": 0.3}}, detail=True))

        async with anyio.create_task_group() as tg:
            tg.start_soon(run_slow)
            await slow.wait()
            await anyio.sleep(0.05)
            await inst.set_options({ADD: {"add": 5.0}})
            assert got, "set_options returned before the execute it had to wait for"
            assert inst.options()[ADD]["add"] == 5.0
        np.testing.assert_array_equal(got[0].outputs[0], X4 + 12)
        assert got[0].options[ADD]["add"] == 2.0
        np.testing.assert_array_equal((await inst.execute([X4]))[0], X4 + 15)
        e = orch.explain()["i"][ADD]["add"]
        assert (e.value, e.source, e.in_force) == (5.0, "api", True)


# -- item 5: the options each execute ran with ----------------------------------------------
@pytest.mark.anyio
@pytest.mark.parametrize("placement", ["thread", "process"])
async def test_each_execution_reports_the_options_it_ran_with(placement: str) -> None:
    """Executes race with option changes; every result says which ``add`` it ran with, and
    the output (x + add) proves it."""
    async with Orchestrator(period=None, process_initializer=setup) as orch:
        p = await orch.load(adder_program(), instances=[InstanceSpec("i", placement=placement),
                                                        InstanceSpec("j", placement=placement)])
        done: list[Execution] = []

        async def camera(seed: int) -> None:
            for k in range(40):
                x = np.full(4, seed * 1000 + k, np.float32)
                ex = await p.execute([x], key=seed, detail=True)
                assert isinstance(ex, Execution) and ex.instance in ("i", "j") and ex.latency_s >= 0
                np.testing.assert_array_equal(ex.outputs[0], x + ex.options[ADD]["add"])
                done.append(ex)

        async def changer() -> None:
            for v in range(1, 9):
                for name in ("i", "j"):
                    await p[name].set_options({ADD: {"add": float(v)}})
                await anyio.sleep(0.005)

        async with anyio.create_task_group() as tg:
            for seed in range(3):
                tg.start_soon(camera, seed)
            tg.start_soon(changer)
        assert len(done) == 120
        seen = {ex.options[ADD]["add"] for ex in done}
        assert len(seen) >= 2, seen  # the changes landed between executes
        with pytest.raises(TypeError):
            done[0].options[ADD]["add"] = 99.0  # type: ignore[index]  # a read-only snapshot
        plain = await p.execute([X4])  # without detail: the outputs, as before
        assert isinstance(plain, list) and len(plain) == 1


# -- item 4: one vocabulary; the old names still work, with a DeprecationWarning -------------
@pytest.mark.anyio
async def test_one_vocabulary_and_the_old_names_as_deprecated_aliases(tmp_path: Any) -> None:
    prog = adder_program()
    m = prog.load_method("forward")
    with pytest.deprecated_call(match=r"use set_options\(\{backend: values\}\)"):
        m.set_backend_options(ADD, {"add": 1.0})
    m.execute([X4])
    with pytest.deprecated_call(match=r"use options\(\)\[backend\]"):
        assert m.backend_options(ADD)["add"] == 1.0
    assert m.options()[ADD]["add"] == 1.0
    m.close()
    pi = prog.load_methods(["forward"])
    pi.set_options({ADD: {"add": 3.0}})
    with pytest.deprecated_call():
        pi.set_backend_options(ADD, {"add": 4.0})
    np.testing.assert_array_equal(pi.execute("forward", [X4])[0], X4 + 4)
    assert pi.options()[ADD]["add"] == 4.0
    pi.close()
    path = tmp_path / "camera_net.pte"
    path.write_bytes(_bytes_of_adder())
    async with Orchestrator(period=None) as orch:
        # the default pool name follows the TOML rule: the file's stem, else the method name
        from_file = await orch.load(str(path), instances=[InstanceSpec("f")])
        again = await orch.load(str(path), instances=[InstanceSpec("g")])
        from_bytes = await orch.load(prog, instances=[InstanceSpec("i"), InstanceSpec("j")])
        assert (from_file.name, again.name, from_bytes.name) == ("camera_net", "camera_net2", "forward")
        # orch.pools and pool.instances: the same shape (name -> object)
        assert dict(orch.pools) == {"camera_net": from_file, "camera_net2": again, "forward": from_bytes}
        assert dict(from_bytes.instances) == {"i": from_bytes["i"], "j": from_bytes["j"]}
        await from_bytes.set_options({ADD: {"add": 2.0}})  # every instance, in force when it returns
        assert {n: o[ADD]["add"] for n, o in from_bytes.options().items()} == {"i": 2.0, "j": 2.0}
        inst = from_bytes["i"]
        with pytest.deprecated_call(match=r"use await set_options\(changes\)"):
            await inst.apply_options({ADD: {"add": 5.0}})
        with pytest.deprecated_call(match=r"use options\(\)"):
            assert inst.options_in_force()[ADD]["add"] == 5.0
        await inst.execute([X4])
        with pytest.deprecated_call(match=r"use statistics\(\)"):
            assert inst.counters() == (1, 0, 0)
        assert (inst.statistics().executes, inst.statistics().failures) == (1, 0)
        with pytest.deprecated_call(match=r"use await pool.aclose\(\)"):
            await again.close()
        await from_file.aclose()
        assert len(again) == 0 and len(from_file) == 0


def _bytes_of_adder() -> bytes:
    sub = ProgramBuilder()
    s = sub.method("forward")
    s.output(s.call("aten::add.Scalar_out", s.input(np.float32, (4,)), 0.0))
    b = ProgramBuilder()
    f = b.method("forward")
    (y,) = f.delegate(ADD, sub, [f.input(np.float32, (4,))])
    f.output(y)
    return b.to_bytes()
