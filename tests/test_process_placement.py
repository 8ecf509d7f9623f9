"""``placement="process"`` end to end: real worker processes, real pipes and shared memory.

The worker process holds up to two requests at once (the parent drives it from the event
loop), so these tests check what pipelining must not break: every request answered exactly
once and in order, option changes applied exactly between the executes sent before and after
them (never mixed across backends), restarts re-sending the requests that were behind a
failed one, a crashed process replaced, pacing, draining, cancellation.

The test backend lives here; worker processes import this module (registering it) through
``setup``, the orchestrator's ``process_initializer``. Marker files make "once" faults hold
across the fresh processes a restart starts. Nothing asserts on wall-clock time except a
lower bound on the pacing interval (which a slow machine only makes longer).
"""

from __future__ import annotations

import asyncio
import functools
import os
import pathlib
import time
from typing import Any

import anyio
import numpy as np
import pytest
import structlog

from orchestra import Error
from orchestra.aot import BackendDetails, CompileSpec, PreprocessResult, ProgramBuilder, aot_backends, register_aot_backend
from orchestra.orchestrator import (
    ExecuteError,
    InstanceClosedError,
    InstanceFailedError,
    InstanceSpec,
    Orchestrator,
    RestartPolicy,
)
from orchestra.runtime import Backend, BackendInterface, OptionSpec, load_program, register_backend, registered_backends

A, B = "ProcTestA", "ProcTestB"
X4 = np.arange(4, dtype=np.float32)

# label -> what to do, set in each worker process by ``setup``:
# {"raise_once": path}: the first execute of any process raises, marked by the file;
# {"raise": True}: every execute raises; {"raise_negative": True}: an execute whose first
# input element is negative raises; {"hang_once": path}: the first execute of any process
# sleeps 30 s, marked by the file; {"exit_once": path}: the first execute ends the
# process (os._exit), marked by the file; {"log": path}: append each execute's start time;
# {"slow_big": s}: an execute whose input holds a value >= 100 sleeps s seconds first.
PLAN: dict[str, dict[str, Any]] = {}


class Adder(BackendInterface):
    """out = in + ``add`` (a hot option), so every result tells which value it ran with."""

    option_specs = (
        OptionSpec("add", float, 0.0, hot=True),
        OptionSpec("label", str, "", doc="init-only: which plan entry applies"),
        OptionSpec("offset", float, 0.0, doc="init-only: also added (read at init)"),
        OptionSpec("init_sleep_s", float, 0.0, doc="init-only: init takes this long"),
    )

    def init(self, context, processed, compile_specs):
        specs = context.runtime_specs
        time.sleep(specs["init_sleep_s"])
        return {"label": specs["label"], "offset": specs["offset"]}

    def execute(self, context, handle, args):
        plan = PLAN.get(handle["label"], {})
        if plan.get("log"):
            with open(plan["log"], "a") as f:
                f.write(f"{time.perf_counter()}\n")
        if plan.get("slow_big") and args[0].max() >= 100:
            time.sleep(plan["slow_big"])
        if plan.get("hang_once") and not os.path.exists(plan["hang_once"]):
            pathlib.Path(plan["hang_once"]).touch()
            time.sleep(30)
        for key in ("raise_once", "exit_once"):
            marker = plan.get(key)
            if marker and not os.path.exists(marker):
                pathlib.Path(marker).touch()
                if key == "exit_once":
                    os._exit(3)
                raise RuntimeError(f"injected fault in {handle['label']}")
        if plan.get("raise"):
            raise RuntimeError(f"injected fault in {handle['label']}")
        if plan.get("raise_negative") and args[0][0] < 0:
            raise RuntimeError(f"injected fault in {handle['label']}: negative input {float(args[0][0])}")
        np.add(args[0], context.runtime_specs["add"] + handle["offset"], out=args[1])

    def destroy(self, handle) -> None:
        pass


class _Blob(BackendDetails):
    @staticmethod
    def preprocess(program, compile_specs):
        return PreprocessResult(b"\0")


for _name in (A, B):
    if _name not in registered_backends():
        register_backend(Backend(_name, Adder()))
    if _name not in aot_backends():
        register_aot_backend(_name, _Blob)


@pytest.fixture(params=[pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
                        pytest.param(("asyncio", {}), id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict]:
    return request.param


def setup(plan: dict[str, dict[str, Any]]) -> None:
    """The process_initializer: runs in each worker process (which imported this module)."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(50))
    PLAN.clear()
    PLAN.update(plan)


def _ident() -> ProgramBuilder:
    sub = ProgramBuilder()
    f = sub.method("forward")
    f.output(f.call("aten::add.Scalar_out", f.input(np.float32, (4,)), 0.0))
    return sub


def two_backend_program() -> Any:
    """forward(x[4]) = B(A(x)): x + a + b."""
    b = ProgramBuilder()
    f = b.method("forward")
    (y,) = f.delegate(A, _ident(), [f.input(np.float32, (4,))], compile_specs=[CompileSpec("k", b"1")])
    (z,) = f.delegate(B, _ident(), [y])
    f.output(z)
    return load_program(b.to_bytes())


def opts(label: str, a: float = 0.0, b: float = 0.0) -> dict[str, dict[str, Any]]:
    return {A: {"label": label, "add": a}, B: {"label": label, "add": b}}


def orch(plan: dict[str, dict[str, Any]] | None = None) -> Orchestrator:
    return Orchestrator(period=None, process_initializer=functools.partial(setup, plan or {}))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def gather(inst: Any, inputs: list[np.ndarray]) -> list[Any]:
    """Submits every input at once (the pipe holds two, the rest queue); results in order,
    an exception where a call raised."""
    out: list[Any] = [None] * len(inputs)

    async def one(k: int) -> None:
        try:
            out[k] = (await inst.execute([inputs[k]]))[0]
        except Exception as exc:  # noqa: BLE001 - returned for the test to check
            out[k] = exc

    async with anyio.create_task_group() as tg:
        for k in range(len(inputs)):
            tg.start_soon(one, k)
            if k == 0:
                await anyio.sleep(0)  # the first one goes first
    return out


@pytest.mark.anyio
async def test_many_requests_in_flight_are_each_answered_once_with_their_own_outputs() -> None:
    async with orch() as o:
        p = await o.load(two_backend_program(), instances=[
            InstanceSpec("w", placement="process", backend_options=opts("w", 1.0, 10.0))])
        inputs = [X4 * k for k in range(50)]
        outs = await gather(p["w"], inputs)
        for k, y in enumerate(outs):
            np.testing.assert_array_equal(y, X4 * k + 11)
        s = p["w"].statistics()
        assert (s.executes, s.failures, s.in_flight) == (50, 0, 0)
        # a non-contiguous input and one of another (fitting) dtype path
        y = (await p["w"].execute([np.arange(8, dtype=np.float32)[::2]]))[0]
        np.testing.assert_array_equal(y, np.arange(8, dtype=np.float32)[::2] + 11)


@pytest.mark.anyio
async def test_option_changes_apply_between_executes_and_never_mix_across_backends() -> None:
    async with orch() as o:
        p = await o.load(two_backend_program(), instances=[
            InstanceSpec("w", placement="process", backend_options=opts("w", 1.0, 10.0))])
        inst = p["w"]
        seen: list[float] = []
        stop = False

        async def drive() -> None:
            while not stop:
                seen.append(float((await inst.execute([X4]))[0][0]))

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(drive)
            for v in range(2, 12):
                while len(seen) < 5 * v:
                    await anyio.sleep(0.001)
                await inst.set_options({A: {"add": float(v)}, B: {"add": 10.0 * v}})
                mark = len(seen)
                # the first execute submitted after the ack sees the new pair
                assert float((await inst.execute([X4]))[0][0]) == 11.0 * v
                assert len(seen) >= mark
            stop = True
        # every result is a consistent (a, 10 a) pair, and values only move forward
        sums = [round(x) for x in seen]
        assert all(x % 11 == 0 for x in sums), [x for x in sums if x % 11]
        assert sums == sorted(sums)
        assert inst.statistics().options[A]["add"] == 11.0 and inst.statistics().options[B]["add"] == 110.0


@pytest.mark.anyio
async def test_an_init_only_change_is_built_in_the_process_while_it_keeps_executing() -> None:
    async with orch() as o:
        p = await o.load(two_backend_program(), instances=[
            InstanceSpec("w", placement="process", backend_options=opts("w", 1.0, 10.0))])
        inst = p["w"]
        done = asyncio.ensure_future(inst.set_options({A: {"offset": 100.0, "init_sleep_s": 0.3}}))
        during = []
        while not done.done():  # the old handles keep executing while the new ones are built
            during.append(float((await inst.execute([X4]))[0][0]))
        await done
        # old values while it was built (the process went on executing), then the new ones from
        # the first boundary after it was built (that execute's result may beat the ack here)
        k = during.index(111.0) if 111.0 in during else len(during)
        assert k > 0 and set(during[:k]) == {11.0} and set(during[k:]) <= {111.0}
        assert float((await inst.execute([X4]))[0][0]) == 111.0
        assert inst.statistics().options[A]["offset"] == 100.0
        # a second change right behind a first waits for it; both land, in order
        first = asyncio.ensure_future(inst.set_options({A: {"offset": 200.0, "init_sleep_s": 0.05}}))
        second = asyncio.ensure_future(inst.set_options({A: {"offset": 300.0, "init_sleep_s": 0.0}}))
        await first
        await second
        assert float((await inst.execute([X4]))[0][0]) == 311.0
        # an init-only change the backend rejects is reported, and the instance goes on
        bad = asyncio.ensure_future(inst.set_options({A: {"offset": 400.0, "init_sleep_s": -1.0}}))
        with pytest.raises(Exception, match="sleep length must be non-negative"):
            await bad
        assert float((await inst.execute([X4]))[0][0]) == 311.0


@pytest.mark.anyio
async def test_a_failed_execute_restarts_the_process_and_resends_what_was_behind_it(tmp_path: pathlib.Path) -> None:
    plan = {"w": {"raise_once": str(tmp_path / "raised")}}
    fast = RestartPolicy(max_restarts=3, backoff_s=0.001, restart_on_error=True)
    async with orch(plan) as o:
        p = await o.load(two_backend_program(), instances=[
            InstanceSpec("w", placement="process", restart=fast, backend_options=opts("w", 1.0, 10.0))])
        pid = p["w"]._worker.method.pid
        outs = await gather(p["w"], [X4 * k for k in range(8)])
        assert isinstance(outs[0], ExecuteError) and "restarting, 1 of 3" in str(outs[0])
        assert "injected fault in w" in str(outs[0]) and outs[0].code is Error.Internal
        for k in range(1, 8):  # the one behind it in the process and the queued ones: all answered once
            np.testing.assert_array_equal(outs[k], X4 * k + 11)
        s = p["w"].statistics()
        assert (s.executes, s.failures, s.restarts, s.state) == (7, 1, 1, "running")
        assert p["w"]._worker.method.pid != pid
        with anyio.fail_after(10):
            while _alive(pid):
                await anyio.sleep(0.01)


@pytest.mark.anyio
async def test_executes_that_raise_are_failed_executes_not_restarts() -> None:
    """60 of 400 requests raise in the backend: each caller gets its own answer and the
    worker process survives them all (no restart, no second process)."""
    async with orch({"w": {"raise_negative": True}}) as o:
        p = await o.load(two_backend_program(), instances=[
            InstanceSpec("w", placement="process", restart=RestartPolicy(max_restarts=1, backoff_s=0.001),
                         backend_options=opts("w", 1.0, 10.0))])
        pid = p["w"]._worker.method.pid
        bad = set(range(3, 400, 6)[:60])
        assert len(bad) == 60
        inputs = [X4 - 1000 - k if k in bad else X4 * k for k in range(400)]
        outs = await gather(p["w"], inputs)
        for k, y in enumerate(outs):
            if k in bad:
                assert isinstance(y, ExecuteError) and f"negative input {-1000.0 - k}" in str(y), (k, y)
                assert "not restarted" in str(y) and y.code is Error.Internal
            else:
                np.testing.assert_array_equal(y, X4 * k + 11)
        s = p["w"].statistics()
        assert (s.executes, s.failures, s.restarts, s.state, s.in_flight) == (340, 60, 0, "running", 0)
        assert p["w"]._worker.method.pid == pid


@pytest.mark.anyio
async def test_a_crashed_worker_process_fails_its_request_and_is_replaced(tmp_path: pathlib.Path) -> None:
    plan = {"w": {"exit_once": str(tmp_path / "exited")}}
    async with orch(plan) as o:
        p = await o.load(two_backend_program(), instances=[
            InstanceSpec("w", placement="process", restart=RestartPolicy(max_restarts=2, backoff_s=0.001),
                         backend_options=opts("w", 1.0, 10.0))])
        pid = p["w"]._worker.method.pid
        outs = await gather(p["w"], [X4 * k for k in range(4)])
        assert isinstance(outs[0], ExecuteError)
        assert "worker process exited unexpectedly" in str(outs[0]) and "restarting, 1 of 2" in str(outs[0])
        for k in range(1, 4):
            np.testing.assert_array_equal(outs[k], X4 * k + 11)
        assert p["w"]._worker.method.pid != pid and p["w"].statistics().restarts == 1


@pytest.mark.anyio
async def test_past_max_restarts_the_instance_fails_and_queued_requests_say_why() -> None:
    plan = {"w": {"raise": True}}
    async with orch(plan) as o:
        p = await o.load(two_backend_program(), instances=[
            InstanceSpec("w", placement="process", restart=RestartPolicy(max_restarts=1, backoff_s=0.001, restart_on_error=True),
                         backend_options=opts("w"))])
        outs = await gather(p["w"], [X4] * 6)
        assert "restarting, 1 of 1" in str(outs[0])
        assert isinstance(outs[1], ExecuteError) and "instance failed: 2 consecutive failed executes" in str(outs[1])
        for r in outs[2:]:
            assert isinstance(r, InstanceFailedError) and "2 consecutive failed executes" in str(r)
        s = p["w"].statistics()
        assert (s.state, s.failures, s.restarts, s.in_flight) == ("failed", 2, 1, 0)
        with pytest.raises(InstanceFailedError):
            await p["w"].execute([X4])


@pytest.mark.anyio
async def test_remove_drains_requests_in_flight_and_ends_the_process() -> None:
    async with orch() as o:
        p = await o.load(two_backend_program(), instances=[
            InstanceSpec("w", placement="process", backend_options=opts("w", 1.0, 10.0))])
        pid = p["w"]._worker.method.pid
        inst = p["w"]
        results: list[Any] = []

        async def one(k: int) -> None:
            results.append((k, (await inst.execute([X4 * k]))[0]))

        async with anyio.create_task_group() as tg:
            for k in range(6):
                tg.start_soon(one, k)
            await anyio.sleep(0)
            await p.remove("w")
        assert sorted(k for k, _ in results) == list(range(6))
        for k, y in results:
            np.testing.assert_array_equal(y, X4 * k + 11)
        assert not _alive(pid)
        with pytest.raises(InstanceClosedError):
            await inst.execute([X4])


@pytest.mark.anyio
async def test_a_cancelled_request_is_dropped_and_a_paced_instance_keeps_its_interval(tmp_path: pathlib.Path) -> None:
    log = tmp_path / "starts"
    async with orch({"w": {"log": str(log), "slow_big": 0.5}}) as o:
        p = await o.load(two_backend_program(), instances=[
            InstanceSpec("w", placement="process", backend_options=opts("w", 1.0, 10.0))])
        inst = p["w"]
        cancelled = None
        # cancelled before its result could come back (the worker sleeps 0.5 s on this input:
        # a fast reply could otherwise complete the await before the cancellation lands)
        with anyio.move_on_after(0):
            cancelled = await inst.execute([X4 * 100])
        assert cancelled is None
        # its result reaches nobody: the next call gets its own, and nothing stays in flight
        np.testing.assert_array_equal((await inst.execute([X4]))[0], X4 + 11)
        assert inst.in_flight == 0
        # already in the worker process's pipe when cancelled, so it ran there (once), counted
        ran = len(log.read_text().split()) // 2  # A and B both log each execute
        assert ran == inst.statistics().executes == 2
        log.unlink()
        inst.set_target_rate(50.0)
        t0 = time.perf_counter()  # CLOCK_MONOTONIC: the worker process's perf_counter too
        outs = await gather(inst, [X4 * k for k in range(6)])
        for k, y in enumerate(outs):
            np.testing.assert_array_equal(y, X4 * k + 11)
        starts = np.array([float(t) for t in log.read_text().split()][::2])  # A and B both log each execute
        assert len(starts) == 6
        # 50 Hz: request k is sent no sooner than k x 20 ms after the first, so it starts no
        # sooner than that after t0 (a loaded machine only delays starts: no bound on gaps)
        assert (starts - t0 >= np.arange(6) * 0.02 * 0.9).all(), starts - t0


@pytest.mark.anyio
async def test_rejected_inputs_are_not_sent_and_do_not_restart() -> None:
    async with orch() as o:
        p = await o.load(two_backend_program(), instances=[
            InstanceSpec("w", placement="process", backend_options=opts("w", 1.0, 10.0))])
        inst = p["w"]
        for bad, msg in (([np.zeros(5, np.float32)], "input 0: float32 \\[5\\] does not fit"),
                         ([X4, X4], "expected 1 inputs, got 2"),
                         ([np.zeros(4, np.int64)], "input 0: int64 \\[4\\] does not fit")):
            with pytest.raises(ExecuteError, match=msg) as ei:
                await inst.execute(bad)
            assert ei.value.code is Error.InvalidArgument
        # a per-call override that the backend rejects travels to the process and back
        with pytest.raises(ExecuteError, match="not restarted") as ei:
            await inst.execute([X4], {A: {"label": "x"}})
        assert ei.value.code is Error.InvalidArgument
        np.testing.assert_array_equal((await inst.execute([X4], {A: {"add": 5.0}}))[0], X4 + 15)
        s = inst.statistics()
        assert (s.restarts, s.failures, s.rejected, s.executes) == (0, 0, 4, 1)  # the caller's mistakes, not failures


@pytest.mark.anyio
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="process affinity needs Linux")
async def test_a_cpu_change_repins_the_worker_process() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    async with orch() as o:
        p = await o.load(two_backend_program(), instances=[
            InstanceSpec("w", placement="process", backend_options=opts("w", 1.0, 10.0))])
        inst = p["w"]
        pid = inst._worker.method.pid
        assert os.sched_getaffinity(pid) == set(cpus)
        await inst._send({}, cpus=(cpus[-1],))  # what Pool.move sends with a new binding's CPUs
        assert os.sched_getaffinity(pid) == {cpus[-1]}
        np.testing.assert_array_equal((await inst.execute([X4]))[0], X4 + 11)
        await inst._send({}, cpus=())  # back to what the orchestrator's process may use
        assert os.sched_getaffinity(pid) == set(cpus)


@pytest.mark.anyio
async def test_a_drain_that_times_out_kills_the_process_and_answers_its_callers(tmp_path: pathlib.Path) -> None:
    plan = {"w": {"hang_once": str(tmp_path / "hung")}}
    async with Orchestrator(period=None, close_timeout=0.5, process_initializer=functools.partial(setup, plan)) as o:
        p = await o.load(two_backend_program(), instances=[
            InstanceSpec("w", placement="process", backend_options=opts("w", 1.0, 10.0))])
        inst = p["w"]
        pid = inst._worker.method.pid
        outs: list[Any] = []

        async def one(k: int) -> None:
            try:
                outs.append((await inst.execute([X4 * k]))[0])
            except Exception as exc:  # noqa: BLE001 - checked below
                outs.append(exc)

        async with anyio.create_task_group() as tg:
            for k in range(3):
                tg.start_soon(one, k)
            with anyio.fail_after(10):
                while not (tmp_path / "hung").exists():
                    await anyio.sleep(0.01)
            with anyio.fail_after(10):
                await p.remove("w")  # gives up after close_timeout
        assert len(outs) == 3 and all(isinstance(r, InstanceClosedError) for r in outs), outs
        assert "its worker process was stopped" in str(outs[0])
        with anyio.fail_after(10):
            while _alive(pid):
                await anyio.sleep(0.01)
