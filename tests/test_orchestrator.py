"""The orchestrator end to end: real worker threads, real Methods, real backends.

Programs are built with ``orchestra.aot.ProgramBuilder``: kernel programs, and programs
delegating to NpuSimBackend (on a 4-core ``NpuDevice`` with cameras linked to cores,
registered here) and to small recording test backends. Process-placement tests spawn worker
processes, which import this module (registering the test backends there too) and run
``child_setup``. Nothing asserts on wall-clock time.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import anyio
import numpy as np
import pytest
import structlog

import orchestra.orchestrator as orchestrator_pkg
from orchestra import Error, InvalidArgumentError, NotFoundError, OrchestraError
from orchestra.aot import BackendDetails, CompileSpec, PreprocessResult, ProgramBuilder, aot_backends, register_aot_backend
from orchestra.backends import npu_sim
from orchestra.backends.npu_sim import NpuDevice, NpuSimBackend, register_device
from orchestra.orchestrator import (
    CpuResource,
    DeadlineError,
    ExecuteError,
    InstanceClosedError,
    InstanceFailedError,
    InstanceSpec,
    NpuSimResource,
    Orchestrator,
    ResourceError,
    ResourcePool,
    RestartPolicy,
)
from orchestra.policies import InstanceView, Move, Pause, Proposal, Resume, ScaleTo, Signals, TargetRate
from orchestra.runtime import (
    Backend,
    BackendInterface,
    Method,
    OptionSpec,
    get_backend_class,
    load_program,
    register_backend,
    registered_backends,
)

NPU = "NpuSimBackend"
PROBE = "OrchProbe"
FAULT = "OrchFault"
MODES = ("low", "balanced", "performance")


@pytest.fixture(params=[pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
                        pytest.param(("asyncio", {}), id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict]:
    return request.param


# -- test backends ------------------------------------------------------------------------
class Probe(BackendInterface):
    """Adds its blob's float; records, per handle, the options every execute saw, on which
    thread and with which CPU affinity."""

    option_specs = (
        OptionSpec("power_mode", str, "balanced", choices=MODES, hot=True),
        OptionSpec("threads", int, 1, hot=True),
        OptionSpec("sleep_s", float, 0.0, hot=True, doc="sleep this long in each execute"),
        OptionSpec("label", str, "", doc="init-only: who this handle belongs to"),
        OptionSpec("variant", str, "a", doc="init-only: anything; changing it re-initialises"),
    )

    def __init__(self) -> None:
        self.handles: list[dict] = []

    def init(self, context, processed, compile_specs):
        h = {"add": float(np.frombuffer(processed, np.float32)[0]), "init": dict(context.runtime_specs),
             "label": context.runtime_specs["label"], "executes": [], "destroyed": False,
             "init_thread": threading.get_ident()}
        self.handles.append(h)
        return h

    def execute(self, context, handle, args):
        specs = context.runtime_specs
        aff = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else ()
        handle["executes"].append({**dict(specs), "thread": threading.get_ident(), "affinity": aff})
        if specs["sleep_s"]:
            time.sleep(specs["sleep_s"])
        np.add(args[0], handle["add"], out=args[1])

    def destroy(self, handle) -> None:
        handle["destroyed"] = True

    def of(self, label: str) -> list[dict]:
        return [h for h in self.handles if h["label"] == label]

    def seen(self, label: str) -> list[dict]:
        """Every execute any handle labelled ``label`` ran, in order."""
        return [e for h in self.of(label) for e in h["executes"]]


# label -> what to do: {"raise": n} raises on the next n executes; {"raise": -1} always;
# {"hang": threading.Event, "hangs": n} blocks the next n executes until the event is set;
# {"sleep_once": path} sleeps 30 s in the first execute of any process, marked by the file.
FAULT_PLAN: dict[str, dict[str, Any]] = {}


class Fault(BackendInterface):
    option_specs = (OptionSpec("label", str, ""),)

    def __init__(self) -> None:
        self.handles: list[dict] = []

    def init(self, context, processed, compile_specs):
        h = {"label": context.runtime_specs["label"], "executes": 0, "destroyed": False}
        self.handles.append(h)
        return h

    def execute(self, context, handle, args):
        plan = FAULT_PLAN.get(handle["label"], {})
        handle["executes"] += 1
        if plan.get("raise"):
            if plan["raise"] > 0:
                plan["raise"] -= 1
            raise RuntimeError(f"injected fault in {handle['label']}")
        if plan.get("hangs"):
            plan["hangs"] -= 1
            plan["hang"].wait(30)
        if plan.get("sleep_once") and not os.path.exists(plan["sleep_once"]):
            open(plan["sleep_once"], "w").close()
            time.sleep(30)
        np.copyto(args[1], args[0])

    def destroy(self, handle) -> None:
        handle["destroyed"] = True


for _name, _cls in ((PROBE, Probe), (FAULT, Fault), (NPU, NpuSimBackend)):
    if _name not in registered_backends():
        register_backend(Backend(_name, _cls()))
PROBE_B: Probe = get_backend_class(PROBE)  # type: ignore[assignment]
FAULT_B: Fault = get_backend_class(FAULT)  # type: ignore[assignment]


@pytest.fixture(autouse=True)
def fresh_records() -> Iterator[None]:
    """Each test sees only the handles its own instances made."""
    PROBE_B.handles.clear()
    FAULT_B.handles.clear()
    FAULT_PLAN.clear()
    yield
    FAULT_PLAN.clear()


class AddDetails(BackendDetails):
    """AOT side of the test backends: the blob is the float the subgraph adds."""

    @staticmethod
    def preprocess(program, compile_specs):
        specs = {c.key: c.value for c in compile_specs}
        return PreprocessResult(np.float32(float(specs.get("add", b"0").decode())).tobytes())


for _name in (PROBE, FAULT):
    if _name not in aot_backends():
        register_aot_backend(_name, AddDetails)
if NPU not in aot_backends():
    register_aot_backend(NPU, npu_sim.NpuSimBackendDetails)


# -- programs -----------------------------------------------------------------------------
M, K, N = 8, 16, 8
W = (np.random.default_rng(0).standard_normal((K, N)) / 4).astype(np.float32)


def _adder(k: float, shape: tuple[int, ...]) -> ProgramBuilder:
    sub = ProgramBuilder()
    f = sub.method("forward")
    f.output(f.call("aten::add.Scalar_out", f.input(np.float32, shape), k))
    return sub


def npu_probe_program() -> Any:
    """forward(x[M, K]) = Probe(+1)(NpuSim(relu(x @ W)))."""
    sub = ProgramBuilder()
    s = sub.method("forward")
    s.output(s.call("aten::relu.out", s.call("aten::mm.out", s.input(np.float32, (M, K)), W)))
    outer = ProgramBuilder()
    f = outer.method("forward")
    (y,) = f.delegate(NPU, sub, [f.input(np.float32, (M, K))])
    (z,) = f.delegate(PROBE, _adder(1.0, (M, N)), [y], compile_specs=[CompileSpec("add", b"1")])
    f.output(z)
    return load_program(outer.to_bytes())


def probe_program() -> Any:
    """forward(x[4]) = Probe(+1)(x + 1): a kernel, then the probe delegate."""
    b = ProgramBuilder()
    f = b.method("forward")
    y = f.call("aten::add.Scalar_out", f.input(np.float32, (4,)), 1.0)
    (z,) = f.delegate(PROBE, _adder(1.0, (4,)), [y], compile_specs=[CompileSpec("add", b"1")])
    f.output(z)
    return load_program(b.to_bytes())


def fault_program() -> Any:
    b = ProgramBuilder()
    f = b.method("forward")
    y = f.call("aten::add.Scalar_out", f.input(np.float32, (4,)), 1.0)
    (z,) = f.delegate(FAULT, _adder(0.0, (4,)), [y])
    f.output(z)
    return load_program(b.to_bytes())


def kernel_program() -> Any:
    b = ProgramBuilder()
    f = b.method("forward")
    f.output(f.call("aten::mul.Scalar_out", f.input(np.float32, (4,)), 2.0))
    return load_program(b.to_bytes())


X4 = np.arange(4, dtype=np.float32)


def frame(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((M, K)).astype(np.float32)


def ref(x: np.ndarray) -> np.ndarray:
    return np.maximum(x @ W, 0) + 1


_dev_ids = itertools.count()
CAMERAS = {"front": 0, "rear": 1, "left": 2, "right": 3}


@pytest.fixture
def npu() -> Iterator[NpuDevice]:
    dev = register_device(NpuDevice(f"npu-orch-{next(_dev_ids)}", cores=4, links=CAMERAS))
    yield dev
    dev.close()


def core_thread(dev: NpuDevice, core: int) -> threading.Thread:
    return next(t for t in threading.enumerate() if t.name == f"npu-sim:{dev.name}:core{core}")


class Scripted:
    """A SignalSource whose values the test sets."""

    name = "scripted"

    def __init__(self, **values: Any) -> None:
        self.values: dict[str, Any] = dict(values)

    def read(self) -> Mapping[str, Any]:
        return dict(self.values)


class BatteryModes:
    """>= 50 %: performance; 20..50 %: balanced; < 20 %: low — on both backends at once."""

    name = "battery-modes"
    priority = 10
    signals = ("battery.percent",)

    def __init__(self, backends: Sequence[str] = (NPU, PROBE)) -> None:
        self.backends = tuple(backends)
        self.calls = 0

    def propose(self, signals: Signals, instances: Sequence[InstanceView]) -> Proposal:
        self.calls += 1
        pct = signals.get("battery.percent")
        if pct is None:
            return Proposal()
        mode, why = (("performance", f"battery.percent={pct} >= 50") if pct >= 50 else
                     ("balanced", f"battery.percent={pct} in [20, 50)") if pct >= 20 else
                     ("low", f"battery.percent={pct} < 20"))
        opts = {i.name: {b: {"power_mode": mode} for b in self.backends if b in i.backends} for i in instances}
        reasons = {(i.name, b, "power_mode"): why for i in instances for b in self.backends}
        return Proposal(opts, reasons=reasons)


def npu_pool(npu: NpuDevice) -> ResourcePool:
    return ResourcePool([NpuSimResource(npu)])


def cams(names: Sequence[str] = tuple(CAMERAS)) -> list[InstanceSpec]:
    return [InstanceSpec(name=c, bind={"camera": c}, backend_options={PROBE: {"label": c}}) for c in names]


# -- the RFC scenario ---------------------------------------------------------------------
@pytest.mark.anyio
async def test_rfc_four_cameras_each_instance_on_its_cameras_core_all_in_parallel(npu: NpuDevice) -> None:
    prog = npu_probe_program()
    runs = 12
    async with Orchestrator(resources=npu_pool(npu), period=None) as orch:
        p = await orch.load(prog, method="forward", instances=cams())
        assert tuple(p.instances) == tuple(CAMERAS) and p.instances["front"] is p["front"]
        got: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {c: [] for c in CAMERAS}

        async def camera(c: str, seed: int) -> None:
            for k in range(runs):
                x = frame(seed * 100 + k)
                (y,) = await p[c].execute([x])
                got[c].append((x, y))

        async with anyio.create_task_group() as tg:
            for seed, c in enumerate(CAMERAS):
                tg.start_soon(camera, c, seed)
        for c in CAMERAS:
            assert len(got[c]) == runs
            for x, y in got[c]:
                np.testing.assert_allclose(y, ref(x), rtol=1e-5, atol=1e-5)
        dev = npu.statistics()
        for c, core in CAMERAS.items():
            cs = dev.cores[core]
            assert cs.instances == (c,), cs.served  # each core served only its camera's instance
            assert cs.jobs == runs and cs.failed_jobs == 0 and cs.links == (c,)
            assert cs.last_job.thread_id == core_thread(npu, core).ident
            s = p[c].statistics()
            assert s.binding == {"camera": c, f"{npu.name}.core": core}
            assert s.options[NPU] == {"device": npu.name, "core": core, "power_mode": "balanced", "priority": 0, "label": c}
            assert s.executes == runs and s.failures == 0 and s.state == "running" and s.in_flight == 0
            assert s.latency.count == runs
            d = p[c].describe()
            assert (d["instance"], d["unit"], d["options"][NPU]["core"]) == (c, {"camera": c, f"{npu.name}.core": core}, core)
        ps = p.statistics()
        assert ps.executes == 4 * runs and [i.name for i in ps.instances] == list(CAMERAS)
        # each instance ran on its own worker thread, none on the event loop's thread
        threads = {c: {e["thread"] for e in PROBE_B.seen(c)} for c in CAMERAS}
        assert all(len(t) == 1 for t in threads.values()) and len(set().union(*threads.values())) == 4
        assert threading.get_ident() not in set().union(*threads.values())
        os_ = orch.statistics()
        assert os_["forward"].executes == 4 * runs and os_.engine_runs == 0
    assert all(c.reserved_bytes == 0 for c in npu.statistics().cores)  # closing released every core


# -- policies: the battery timeline -------------------------------------------------------
@pytest.mark.anyio
async def test_battery_timeline_switches_each_instance_at_the_first_execute_after_the_plan(npu: NpuDevice) -> None:
    prog = npu_probe_program()
    battery = Scripted(**{"battery.percent": 100})
    policy = BatteryModes()
    timeline = [100, 80, 60, 40, 30, 15]
    per_step = 3
    async with Orchestrator(resources=npu_pool(npu), policies=[policy], signals=[battery], period=None) as orch:
        p = await orch.load(prog, instances=cams())
        seen: dict[str, list[tuple[str, str]]] = {c: [] for c in CAMERAS}  # (npu mode, probe mode) per execute
        applied_at: dict[int, int] = {}  # step -> execute index of the first execute after the plan
        logs_at_15: list[dict] = []
        t_15 = (0.0, 0.0)

        async def run_step(c: str) -> None:
            for _ in range(per_step):
                await p[c].execute([frame(len(seen[c]))])
                npu_mode = npu.statistics().cores[CAMERAS[c]].last_job.cost.power_mode
                seen[c].append((npu_mode, PROBE_B.seen(c)[-1]["power_mode"]))

        for step, pct in enumerate(timeline):
            battery.values["battery.percent"] = pct
            if pct == 15:
                t0 = time.monotonic()
                with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
                    run = await orch.refresh()
                t_15 = (t0, time.monotonic())
                logs_at_15 = [e for e in logs if e["event"] == "backend option changed"]
            else:
                run = await orch.refresh()
            assert run.policies == ("battery-modes",) and run.errors == 0 and run.rejected == 0
            applied_at[step] = step * per_step
            async with anyio.create_task_group() as tg:
                for c in CAMERAS:
                    tg.start_soon(run_step, c)

        def want(pct: int) -> str:
            return "performance" if pct >= 50 else "balanced" if pct >= 20 else "low"

        expected = [want(pct) for pct in timeline for _ in range(per_step)]
        for c in CAMERAS:
            assert [n for n, _ in seen[c]] == expected, c  # NpuSim saw the plan at the exact execute
            assert [pm for _, pm in seen[c]] == expected, c  # so did the probe ...
            assert all(n == pm for n, pm in seen[c])  # ... in the same execute: never mixed
            switches = [k for k in range(1, len(expected)) if seen[c][k] != seen[c][k - 1]]
            assert switches == [applied_at[3], applied_at[5]]  # 60 -> 40 and 30 -> 15
        by_mode = {u.power_mode: u.jobs for u in npu.statistics().cores[0].by_mode}
        assert by_mode == {"performance": 9, "balanced": 6, "low": 3}
        # one structlog event per change, with the instance and backend bound
        assert len(logs_at_15) == 8
        assert {(e["instance"], e["backend"]) for e in logs_at_15} == {(c, b) for c in CAMERAS for b in (NPU, PROBE)}
        for e in logs_at_15:
            assert (e["option"], e["value"], e["previous"], e["policy"]) == ("power_mode", "low", "balanced", "battery-modes")
            assert e["reason"] == "battery.percent=15 < 20" and e["signals"] == {"battery.percent": 15}
        ex = orch.explain()
        e = ex["front"][NPU]["power_mode"]
        assert (e.value, e.source, e.policy, e.priority, e.reason) == ("low", "policy", "battery-modes", 10, "battery.percent=15 < 20")
        assert dict(e.signals) == {"battery.percent": 15} and e.in_force
        assert t_15[0] <= e.at <= t_15[1] and abs(e.wall - time.time()) < 60
        core = ex["front"][NPU]["core"]
        assert (core.value, core.source, core.policy) == (0, "binding", None)
        assert (ex["rear"][NPU]["priority"].source, ex["rear"][PROBE]["label"].source) == ("default", "spec")
        text = ex.format()
        assert "front NpuSimBackend.power_mode = 'low' <- battery-modes (priority 10): battery.percent=15 < 20" in text
        assert "\nrear NpuSimBackend.priority = " in text
        assert [ln for ln in text.splitlines() if "<- default" in ln and " at " in ln] == []  # never set: no time
        st = orch.statistics()
        assert st.engine_runs == len(timeline) and st.changes_applied == 8 * 3  # -> performance, balanced, low
        assert st.signals == {"battery.percent": 15}


@pytest.mark.anyio
async def test_no_execute_sees_mixed_options_while_plans_change_under_load(npu: NpuDevice) -> None:
    prog = npu_probe_program()
    battery = Scripted(**{"battery.percent": 100})
    async with Orchestrator(resources=npu_pool(npu), policies=[BatteryModes()], signals=[battery], period=None) as orch:
        p = await orch.load(prog, instances=cams())
        stop = anyio.Event()
        mixed: list[tuple] = []
        counts = dict.fromkeys(CAMERAS, 0)

        async def camera(c: str) -> None:
            core = CAMERAS[c]
            while not stop.is_set():
                await p[c].execute([frame(counts[c])])
                counts[c] += 1
                a = npu.statistics().cores[core].last_job.cost.power_mode
                b = PROBE_B.seen(c)[-1]["power_mode"]
                if a != b:
                    mixed.append((c, counts[c], a, b))

        async with anyio.create_task_group() as tg:
            for c in CAMERAS:
                tg.start_soon(camera, c)
            for pct in [100, 10, 45, 90, 5, 30, 70, 15] * 3:
                battery.values["battery.percent"] = pct
                await orch.refresh()
                await anyio.sleep(0.005)
            stop.set()
        assert not mixed
        assert all(n > 0 for n in counts.values())
        assert orch.statistics().changes_applied > 0


@pytest.mark.anyio
async def test_engine_runs_on_signal_changes_and_on_the_period(npu: NpuDevice) -> None:
    battery = Scripted(**{"battery.percent": 100})
    policy = BatteryModes()
    async with Orchestrator(resources=npu_pool(npu), policies=[policy], signals=[battery],
                            period=3600, poll_interval=0.01) as orch:
        p = await orch.load(npu_probe_program(), instances=cams(["front"]))
        with anyio.fail_after(10):
            while orch.explain()["front"][NPU]["power_mode"].value != "performance":
                await anyio.sleep(0.01)
        calls = policy.calls
        runs = orch.statistics().engine_runs
        with anyio.fail_after(10):  # 5 polls (one engine run each), no change
            while orch.statistics().engine_runs < runs + 5:
                await anyio.sleep(0.01)
        assert policy.calls == calls  # the policy did not run again
        battery.values["battery.percent"] = 12
        with anyio.fail_after(10):
            while orch.explain()["front"][NPU]["power_mode"].value != "low":
                await anyio.sleep(0.01)
        await p["front"].execute([frame(0)])
        assert PROBE_B.seen("front")[-1]["power_mode"] == "low"
        assert orch.statistics().engine_runs >= 3  # polls ran; the policy ran only when due


@pytest.mark.anyio
async def test_the_built_in_battery_policy_and_scripted_source_drive_the_engine(npu: NpuDevice) -> None:
    import orchestra.policies as policies

    if not hasattr(policies, "BatteryPolicy") or not hasattr(policies, "ScriptedSource"):
        pytest.skip("the built-in policies are not there yet")
    now = [0.0]
    script = policies.ScriptedSource([(0, {"battery.percent": 90}), (10, {"battery.percent": 12})], clock=lambda: now[0])
    battery = policies.BatteryPolicy(low=20, high=30, low_options={NPU: {"power_mode": "low"}})
    async with Orchestrator(resources=npu_pool(npu), policies=[battery], signals=[script], period=None) as orch:
        p = await orch.load(npu_probe_program(), instances=cams(["front", "rear"]))
        await orch.refresh()
        await p["front"].execute([frame(0)])
        now[0] = 11.0
        await orch.refresh()
        await p["front"].execute([frame(1)])
        await p["rear"].execute([frame(2)])
        modes = [u.power_mode for u in npu.statistics().cores[0].by_mode if u.jobs]
        assert sorted(modes) == ["balanced", "low"]
        assert npu.statistics().cores[1].last_job.cost.power_mode == "low"
        e = orch.explain()["rear"][NPU]["power_mode"]
        assert (e.value, e.policy) == ("low", "battery") and "battery.percent=12 < low=20" in e.reason
        assert dict(e.signals) == {"battery.percent": 12, "battery.charging": None}


# -- the engine: merging, validation, explain ---------------------------------------------
class Fixed:
    """Proposes fixed values; ``fail`` makes it raise."""

    signals: tuple[str, ...] = ()

    def __init__(self, name: str, priority: int, options: dict, actions: tuple = (), reason: str = "") -> None:
        self.name, self.priority, self.options, self.actions, self.reason = name, priority, options, actions, reason
        self.fail = False

    def propose(self, signals: Signals, instances: Sequence[InstanceView]) -> Proposal:
        if self.fail:
            raise RuntimeError(f"{self.name} broke")
        reasons = {(i, b, o): self.reason for i, per in self.options.items() for b, vs in per.items() for o in vs}
        return Proposal(self.options, self.actions, {**reasons, **getattr(self, "reasons", {})})


@pytest.mark.anyio
async def test_priority_merge_revert_validation_and_a_failing_policy(npu: NpuDevice) -> None:
    hi = Fixed("hi", 20, {"front": {PROBE: {"power_mode": "low"}}}, reason="hi wants low")
    lo = Fixed("lo", 5, {"front": {PROBE: {"power_mode": "performance", "threads": 3}}}, reason="lo")
    bad = Fixed("bad", 50, {
        "front": {PROBE: {"power_mode": "turbo", "nope": 1, "threads": "3"}, NPU: {"core": 2}, "Nope": {"x": 1}},
        "ghost": {PROBE: {"threads": 1}},
    })
    async with Orchestrator(resources=npu_pool(npu), policies=[lo, hi, bad], period=None) as orch:
        p = await orch.load(npu_probe_program(), instances=cams(["front"]))
        with structlog.testing.capture_logs() as logs:
            run = await orch.refresh()
        assert run.rejected == 6 and run.errors == 0 and run.changes == 2
        rejected = [e for e in logs if e["event"] == "policy proposal rejected"]
        assert len(rejected) == 6
        text = " | ".join(e["reason"] for e in rejected)
        assert "must be one of 'low', 'balanced', 'performance'; got 'turbo'" in text
        assert "has no option 'nope'" in text and "must be int, got str" in text
        assert "init-only and set by the resource binding" in text and "does not use backend 'Nope'" in text
        assert "no instance 'ghost'" in text
        await p["front"].execute([frame(0)])
        last = PROBE_B.seen("front")[-1]
        assert (last["power_mode"], last["threads"]) == ("low", 3)  # hi wins power_mode, lo's threads stays
        ex = orch.explain()["front"][PROBE]
        assert (ex["power_mode"].policy, ex["power_mode"].reason, ex["threads"].policy) == ("hi", "hi wants low", "lo")
        # hi stops proposing: lo's value takes over; then lo stops too: back to the baseline
        hi.options = {}
        await orch.refresh()
        await p["front"].execute([frame(1)])
        assert PROBE_B.seen("front")[-1]["power_mode"] == "performance"
        lo.options = {}
        lo.fail = True  # a failing policy keeps its last good proposal
        with structlog.testing.capture_logs() as logs:
            run = await orch.refresh()
        assert run.errors == 1 and any(e["event"] == "policy failed" and "lo broke" in e["error"] for e in logs)
        await p["front"].execute([frame(2)])
        assert PROBE_B.seen("front")[-1]["power_mode"] == "performance"
        lo.fail = False
        await orch.refresh()
        await p["front"].execute([frame(3)])
        last = PROBE_B.seen("front")[-1]
        assert (last["power_mode"], last["threads"]) == ("balanced", 1)
        ex = orch.explain()["front"][PROBE]
        assert (ex["power_mode"].source, ex["threads"].source) == ("default", "default")
        st = orch.statistics()
        assert st.policy_errors == 1 and st.proposals_rejected >= 6


@pytest.mark.anyio
async def test_an_init_only_change_is_prepared_off_the_worker_and_swapped_in_while_idle() -> None:
    variant = Fixed("variant", 1, {"v": {PROBE: {"variant": "b", "threads": 2}}}, reason="try b")
    async with Orchestrator(policies=[variant], period=None) as orch:
        p = await orch.load(probe_program(), instances=[InstanceSpec("v", backend_options={PROBE: {"label": "v"}})])
        await p["v"].execute([X4])
        (old,) = PROBE_B.of("v")
        worker = old["executes"][0]["thread"]
        run = await orch.refresh()
        assert run.changes == 2
        new = PROBE_B.of("v")[-1]
        assert new is not old and new["init"]["variant"] == "b"  # built before refresh() returned ...
        assert new["init_thread"] not in (worker, threading.get_ident())  # ... on a helper thread
        # the worker was idle: the swap happened at once, so refresh() returned with it in force
        assert len(new["executes"]) == 0 and old["destroyed"]
        assert p["v"].options()[PROBE]["variant"] == "b"
        await p["v"].execute([X4])  # the next execute runs on the new handle
        assert len(old["executes"]) == 1 and len(new["executes"]) == 1
        assert (new["executes"][0]["variant"], new["executes"][0]["threads"]) == ("b", 2)
        assert orch.explain()["v"][PROBE]["variant"].policy == "variant"


@pytest.mark.anyio
async def test_a_cancelled_execute_drops_its_result_and_the_instance_goes_on() -> None:
    async with Orchestrator(period=None) as orch:
        p = await orch.load(probe_program(), instances=[InstanceSpec("c", backend_options={PROBE: {"label": "c"}})])
        with anyio.move_on_after(0.05) as scope:
            await p["c"].execute([X4], {PROBE: {"sleep_s": 0.3}})
        assert scope.cancelled_caught
        np.testing.assert_array_equal((await p["c"].execute([X4]))[0], X4 + 2)  # queued behind it, then runs
        assert p["c"].in_flight == 0 and p["c"].statistics().executes == 2


@pytest.mark.anyio
async def test_a_thread_placed_instance_reads_its_inputs_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """Thread placement runs the Method on the caller's arrays (``borrow_inputs=True``: no
    copy into the Method's memory first): the same outputs as a Method that copies them."""
    path = os.path.join(os.path.dirname(__file__), "fixtures", "cnn.pte")
    ref = load_program(path).load_method("forward")
    x = np.random.default_rng(5).standard_normal(ref.meta.inputs[0].shape).astype(np.float32)
    want = ref.execute([x])
    seen: list[bool] = []
    run = Method.execute

    def recording(self: Method, *args: Any, borrow_inputs: bool = False, **kw: Any) -> Any:
        seen.append(borrow_inputs)
        return run(self, *args, borrow_inputs=borrow_inputs, **kw)

    monkeypatch.setattr(Method, "execute", recording)
    async with Orchestrator(period=None) as orch:
        p = await orch.load(load_program(path), instances=[InstanceSpec("t", placement="thread")])
        got = await p["t"].execute([x])
    assert seen == [True]
    for g, w in zip(got, want):
        assert np.array_equal(g, w)


# -- routing ------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_routing_sticks_per_key_and_otherwise_picks_the_least_loaded() -> None:
    prog = probe_program()
    names = ["r0", "r1", "r2"]
    specs = [InstanceSpec(n, backend_options={PROBE: {"label": n}}) for n in names]
    async with Orchestrator(period=None) as orch:
        p = await orch.load(prog, instances=specs)
        for k in range(30):
            key = f"cam{k % 5}"
            np.testing.assert_array_equal((await p.execute([X4], key=key))[0], X4 + 2)
        owners = {f"cam{k}": p.routed_to(f"cam{k}") for k in range(5)}
        assert all(o in names for o in owners.values())
        for n in names:  # every execute of a key ran on the instance the key sticks to
            assert len(PROBE_B.seen(n)) == 6 * sum(1 for o in owners.values() if o == n)
        # least loaded: f0 and f1 each hold a request (blocked in the backend until released),
        # so unkeyed work goes to f2
        fnames = ["f0", "f1", "f2"]
        f = await orch.load(fault_program(), name="faults",
                            instances=[InstanceSpec(n, backend_options={FAULT: {"label": n}}) for n in fnames])
        release = threading.Event()
        FAULT_PLAN["f0"] = {"hang": release, "hangs": 1}
        FAULT_PLAN["f1"] = {"hang": release, "hangs": 1}
        fexecutes = {n: next(h for h in FAULT_B.handles if h["label"] == n) for n in fnames}
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(f["f0"].execute, [X4])
                tg.start_soon(f["f1"].execute, [X4])
                with anyio.fail_after(10):  # both in their backend, held there
                    while fexecutes["f0"]["executes"] + fexecutes["f1"]["executes"] < 2:
                        await anyio.sleep(0.001)
                assert (f["f0"].in_flight, f["f1"].in_flight) == (1, 1)
                for _ in range(5):
                    await f.execute([X4])
                release.set()
        finally:
            release.set()
        assert {n: h["executes"] for n, h in fexecutes.items()} == {"f0": 1, "f1": 1, "f2": 5}
        # a paused instance is skipped, and its keys move
        victim = owners["cam0"]
        p[victim].pause()
        other = p.routed_to("cam0")
        await p.execute([X4], key="cam0")
        assert p.routed_to("cam0") != victim and other == victim
        assert p.statistics().routed == 30 + 1 and p.statistics().keys == 5 and f.statistics().routed == 5
        p[victim].resume()
        # a bounded memory of keys: the least recently routed one is forgotten first
        p.max_sticky_keys = 3
        for key in ("cam1", "cam2", "cam0", "cam3"):
            await p.execute([X4], key=key)
        assert p.statistics().keys == 3
        assert [p.routed_to(f"cam{k}") is not None for k in range(5)] == [True, False, True, True, False]


@pytest.mark.anyio
async def test_pause_waits_resume_releases_and_target_rate_paces_the_worker() -> None:
    prog = probe_program()
    pauser = Fixed("pauser", 1, {}, actions=(Pause("w0"), TargetRate("w1", 50.0)))
    pauser.reasons = {("w0", "", "Pause"): "w0 not needed"}
    async with Orchestrator(policies=[pauser], period=None) as orch:
        p = await orch.load(prog, instances=[InstanceSpec(n, backend_options={PROBE: {"label": n}}) for n in ("w0", "w1")])
        run = await orch.refresh()
        assert run.actions == 2
        assert p["w0"].statistics().state == "paused" and p["w1"].statistics().target_rate_hz == 50.0
        assert p["w1"]._worker.period == pytest.approx(0.02)
        for _ in range(4):  # routing skips the paused instance
            await p.execute([X4])
        assert len(PROBE_B.seen("w0")) == 0 and len(PROBE_B.seen("w1")) == 4
        done = anyio.Event()

        async def direct() -> None:  # execute on a paused instance waits for Resume
            await p["w0"].execute([X4])
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(direct)
            await anyio.wait_all_tasks_blocked()  # direct() is parked: nothing was handed to the worker
            assert not done.is_set() and p["w0"].in_flight == 0 and len(PROBE_B.seen("w0")) == 0
            pauser.actions = (Resume("w0"), TargetRate("w1", None))
            await orch.refresh()
        assert done.is_set() and len(PROBE_B.seen("w0")) == 1
        assert p["w1"]._worker.period == 0.0
        acts = orch.explain().actions_of("w0")
        assert acts["pause"].policy == "pauser" and acts["resume"].policy == "pauser"
        assert acts["pause"].reason == "w0 not needed"
        p["w0"].pause()
        p["w1"].pause()

        async def routed() -> None:
            await p.execute([X4])
            done2.set()

        done2 = anyio.Event()
        async with anyio.create_task_group() as tg:  # every instance paused: routed executes wait
            tg.start_soon(routed)
            await anyio.wait_all_tasks_blocked()
            assert not done2.is_set() and p["w0"].in_flight == p["w1"].in_flight == 0
            p["w1"].resume()
        assert done2.is_set()


# -- elastic ------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_add_remove_drains_and_scale_binds_free_units(npu: NpuDevice) -> None:
    prog = npu_probe_program()
    async with Orchestrator(resources=npu_pool(npu), period=None) as orch:
        p = await orch.load(prog, instances=cams(["front"]))
        await p.add(InstanceSpec("rear", bind={f"{npu.name}.core": 1}, backend_options={PROBE: {"label": "rear"}}))
        assert tuple(p.instances) == ("front", "rear")
        # remove drains: requests already queued complete
        slow = {PROBE: {"sleep_s": 0.02}}
        results = []

        async def one(k: int) -> None:
            results.append(await p["rear"].execute([frame(k)], slow))

        async with anyio.create_task_group() as tg:
            for k in range(5):
                tg.start_soon(one, k)
            # one checkpoint: the five tasks run up to their await (each queued its request);
            # no result can be resolved before the loop's next iteration
            await anyio.sleep(0)
            assert p["rear"].in_flight == 5
            rear = p["rear"]
            await p.remove("rear")
        assert len(results) == 5 and rear.statistics().executes == 5 and rear.state == "closed"
        with pytest.raises(InstanceClosedError, match="'rear' is closed"):
            await rear.execute([frame(0)])
        with pytest.raises(NotFoundError, match="pool 'forward' has no instance 'rear' \\(instances: front\\)"):
            p["rear"]
        # scale up: new instances named <pool>-<k>, each on a free camera/core
        added = await p.scale(4)
        assert added == ("forward-1", "forward-2", "forward-3") and len(p) == 4
        cores = {n: p[n].binding[f"{npu.name}.core"] for n in p.instances}
        assert sorted(cores.values()) == [0, 1, 2, 3]
        assert {p[n].binding["camera"] for n in p.instances} == set(CAMERAS)
        async with anyio.create_task_group() as tg:
            for n in p.instances:
                tg.start_soon(p[n].execute, [frame(1)])
        for n, core in cores.items():
            assert n in npu.statistics().cores[core].instances
        with pytest.raises(ResourceError, match="no free camera for instance 'forward-4'") as ei:
            await p.scale(5)
        assert ei.value.code is Error.OutOfResources and len(p) == 4
        # scale down removes the most recently added
        removed = await p.scale(2)
        assert removed == ("forward-3", "forward-2") and tuple(p.instances) == ("front", "forward-1")
        freed = cores["forward-3"]
        await p.add(InstanceSpec("again", bind={f"{npu.name}.core": freed}, backend_options={PROBE: {"label": "again"}}))
        # running totals: rear's 5, then one each on front and forward-1..3 (two of them removed since)
        assert p.statistics().executes == 9 and sum(s.executes for s in p.statistics().instances) == 2
        assert orch.resources.holders()[(f"{npu.name}.core", freed)] == ("again",)


@pytest.mark.anyio
async def test_scale_to_and_move_actions_from_a_policy(npu: NpuDevice) -> None:
    prog = npu_probe_program()
    mover = Fixed("mover", 1, {}, actions=(Move("front", {f"{npu.name}.core": 3}),), reason="")
    async with Orchestrator(resources=npu_pool(npu), policies=[mover], period=None) as orch:
        p = await orch.load(prog, instances=[InstanceSpec("front", bind={f"{npu.name}.core": 0},
                                                          backend_options={PROBE: {"label": "front"}})])
        await p["front"].execute([frame(0)])
        h0 = len(PROBE_B.of("front"))
        run = await orch.refresh()
        assert run.actions == 1
        assert p["front"].binding == {f"{npu.name}.core": 3}
        (y,) = await p["front"].execute([frame(1)])
        np.testing.assert_allclose(y, ref(frame(1)), rtol=1e-5, atol=1e-5)
        jobs = [c.jobs for c in npu.statistics().cores]
        assert jobs == [1, 0, 0, 1]  # the first execute after the move ran on core 3
        assert npu.statistics().cores[0].reserved_bytes == 0 and npu.statistics().cores[3].reservations == 1
        assert len(PROBE_B.of("front")) == h0  # only NpuSim re-initialised; the probe kept its handle
        ex = orch.explain()
        core = ex["front"][NPU]["core"]
        assert (core.value, core.source, core.policy) == (3, "binding", "mover")
        assert ex.actions_of("front")["move"].value == {f"{npu.name}.core": 3}
        # core 0 is free again
        await p.add(InstanceSpec("rear", bind={f"{npu.name}.core": 0}, backend_options={PROBE: {"label": "rear"}}))
        mover.actions = (ScaleTo(3), Move("front", {f"{npu.name}.core": 0}))
        with structlog.testing.capture_logs() as logs:
            run = await orch.refresh()
        assert any(e["event"] == "policy action failed" and f"{npu.name}.core 0 is held by instance 'rear'" in e["error"]
                   for e in logs)
        assert len(p) == 3 and list(p.instances)[-1] == "forward-1" and p["forward-1"].binding == {f"{npu.name}.core": 1}
        assert p["front"].binding == {f"{npu.name}.core": 3}  # the failed move changed nothing


# -- resources ----------------------------------------------------------------------------
@pytest.mark.anyio
async def test_resource_conflicts_and_bad_bindings_are_named(npu: NpuDevice) -> None:
    prog = npu_probe_program()
    core = f"{npu.name}.core"
    async with Orchestrator(resources=ResourcePool([NpuSimResource(npu), CpuResource(cpus=[0, 1])]), period=None) as orch:
        p = await orch.load(prog, instances=[InstanceSpec("rear", bind={core: 2}, backend_options={PROBE: {"label": "rear"}})])
        with pytest.raises(ResourceError, match=f"{core} 2 is held by instance 'rear'") as ei:
            await p.add(InstanceSpec("x", bind={core: 2}))
        assert ei.value.code is Error.OutOfResources and isinstance(ei.value, InvalidArgumentError)
        with pytest.raises(ResourceError, match=f"{core} 2 is held by instance 'rear'"):
            await p.add(InstanceSpec("x", bind={"camera": "left"}))  # left is wired to core 2
        with pytest.raises(ResourceError, match=f"unknown unit 'npu9.core' \\(units: {core}, {npu.name}.camera, camera, cpu\\)"):
            await p.add(InstanceSpec("x", bind={"npu9.core": 0}))
        with pytest.raises(ResourceError, match=f"{core} 7 is out of range \\({npu.name} has cores 0..3\\)"):
            await p.add(InstanceSpec("x", bind={core: 7}))
        with pytest.raises(ResourceError, match="camera 'top' is not wired to"):
            await p.add(InstanceSpec("x", bind={"camera": "top"}))
        with pytest.raises(ResourceError, match="cpu 5 is out of range \\(cpus: 0, 1\\)"):
            await p.add(InstanceSpec("x", bind={core: 0, "cpu": 5}))
        with pytest.raises(ResourceError, match="camera 'front' means .*core 0, but the binding also says .*core 1"):
            await p.add(InstanceSpec("x", bind={core: 1, "camera": "front"}))
        with pytest.raises(ResourceError, match="backend_options sets NpuSimBackend core=1 but its binding"):
            await p.add(InstanceSpec("x", bind={core: 0}, backend_options={NPU: {"core": 1}}))
        with pytest.raises(InvalidArgumentError, match="instance name 'rear' is taken \\(by pool 'forward'\\)"):
            await p.add(InstanceSpec("rear", bind={core: 0}))
        # all or nothing: the second instance's conflict releases the first one's core
        with pytest.raises(ResourceError, match=f"{core} 2 is held by instance 'rear'"):
            await orch.load(prog, instances=[InstanceSpec("a", bind={core: 0}), InstanceSpec("b", bind={core: 2})])
        assert (core, 0) not in orch.resources.holders() and list(orch.pools) == ["forward"]
        # a bad option is caught before any thread starts
        with pytest.raises(InvalidArgumentError, match="backend 'OrchProbe' option 'power_mode' must be one of"):
            await p.add(InstanceSpec("y", bind={core: 0}, backend_options={PROBE: {"power_mode": "turbo"}}))
        # a kernel-only program can't bind an NPU core
        with pytest.raises(ResourceError, match="binds .*core but its method does not delegate to NpuSimBackend"):
            await orch.load(kernel_program(), instances=[InstanceSpec("k", bind={core: 0})])
        assert orch.resources.holders() == {(core, 2): ("rear",)}
        await p.remove("rear")
        assert orch.resources.holders() == {}
    # shared units: capacity 2
    async with Orchestrator(resources=[NpuSimResource(npu, exclusive=False, capacity=2)], period=None) as orch:
        p = await orch.load(prog, instances=[InstanceSpec(n, bind={core: 0}) for n in ("s1", "s2")])
        with pytest.raises(ResourceError, match=f"{core} 0 is held by instances 's1', 's2' \\(capacity 2\\)"):
            await p.add(InstanceSpec("s3", bind={core: 0}))


def child_setup(plan: dict[str, dict[str, Any]]) -> None:
    """The process_initializer of process-placement tests (runs in each worker process,
    which imported this module and so registered the test backends)."""
    FAULT_PLAN.update(plan)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.anyio
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="process affinity needs Linux")
async def test_process_placement_runs_each_instance_in_its_own_pinned_process() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    perf = Fixed("perf", 1, {"p0": {PROBE: {"power_mode": "performance"}}}, reason="plugged in")
    specs = [InstanceSpec(n, bind={"cpu": c}, placement="process", backend_options={PROBE: {"label": n}})
             for n, c in (("p0", cpus[0]), ("p1", cpus[-1]))]
    async with Orchestrator(resources=[CpuResource(cpus=cpus, exclusive=False)], policies=[perf], period=None,
                            process_initializer=functools.partial(child_setup, {})) as orch:
        p = await orch.load(probe_program(), instances=specs)
        outs: dict[str, list] = {"p0": [], "p1": []}

        async def drive(n: str) -> None:
            for k in range(20):
                outs[n].append((await p[n].execute([X4 + k]))[0])

        async with anyio.create_task_group() as tg:
            tg.start_soon(drive, "p0")
            tg.start_soon(drive, "p1")
        for n in outs:
            for k, y in enumerate(outs[n]):
                np.testing.assert_array_equal(y, X4 + k + 2)
        pids = {n: p[n]._worker.method.pid for n in outs}
        assert len(set(pids.values())) == 2 and os.getpid() not in pids.values()
        assert os.sched_getaffinity(pids["p0"]) == {cpus[0]} and os.sched_getaffinity(pids["p1"]) == {cpus[-1]}
        assert PROBE_B.seen("p0") == []  # it ran in the worker process, not here
        await orch.refresh()
        await p["p0"].execute([X4])
        assert p["p0"].statistics().options[PROBE]["power_mode"] == "performance"
        assert p["p1"].statistics().options[PROBE]["power_mode"] == "balanced"
        with pytest.raises(ExecuteError, match="input 0: float64 \\[4\\] does not fit") as ei:
            await p["p1"].execute([np.zeros(4)])
        assert ei.value.code is Error.InvalidArgument and p["p1"].statistics().restarts == 0
        assert p.statistics().executes == 41
    assert not _alive(pids["p0"]) and not _alive(pids["p1"])


@pytest.mark.anyio
async def test_a_hanging_worker_process_is_killed_at_its_deadline_and_replaced(tmp_path) -> None:
    marker = tmp_path / "slept"
    plan = {"slow": {"sleep_once": str(marker)}}
    specs = [InstanceSpec("slow", placement="process", deadline_s=0.5, backend_options={FAULT: {"label": "slow"}})]
    async with Orchestrator(period=None, process_initializer=functools.partial(child_setup, plan)) as orch:
        p = await orch.load(fault_program(), instances=specs)
        pid = p["slow"]._worker.method.pid
        with pytest.raises(DeadlineError, match="its worker process killed"):
            await p["slow"].execute([X4])
        assert marker.exists()
        np.testing.assert_array_equal((await p["slow"].execute([X4]))[0], X4 + 1)  # on a fresh process
        assert p["slow"]._worker.method.pid != pid and p["slow"].statistics().replacements == 1
        with anyio.fail_after(10):
            while _alive(pid):
                await anyio.sleep(0.01)


@pytest.mark.anyio
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="thread affinity needs Linux")
async def test_cpu_binding_pins_the_worker_thread_and_sets_thread_count_options() -> None:
    cpus = sorted(os.sched_getaffinity(0))
    res = CpuResource(cpus=cpus, thread_options={PROBE: "threads"})
    async with Orchestrator(resources=[res], period=None) as orch:
        p = await orch.load(probe_program(), instances=[
            InstanceSpec("c0", bind={"cpu": cpus[0]}, backend_options={PROBE: {"label": "c0"}}),
            InstanceSpec("call", bind={"cpu": tuple(cpus[1:])} if len(cpus) > 1 else {}, backend_options={PROBE: {"label": "call"}}),
        ])
        await p["c0"].execute([X4])
        await p["call"].execute([X4])
        assert PROBE_B.seen("c0")[-1]["affinity"] == (cpus[0],)
        assert PROBE_B.seen("c0")[-1]["threads"] == 1
        if len(cpus) > 1:
            assert PROBE_B.seen("call")[-1]["affinity"] == tuple(cpus[1:])
            assert PROBE_B.seen("call")[-1]["threads"] == len(cpus) - 1
        assert p["c0"].statistics().cpus == (cpus[0],)
        assert os.sched_getaffinity(0) == set(cpus)  # the event loop's thread is untouched
        with pytest.raises(ResourceError, match=f"cpu {cpus[0]!r} is held by instance 'c0'"):
            await p.add(InstanceSpec("c1", bind={"cpu": cpus[0]}))


@pytest.mark.anyio
async def test_cpu_binding_sets_numpy_cpu_num_threads_which_policies_may_retune() -> None:
    numpy_cpu = pytest.importorskip("orchestra.backends.numpy_cpu")
    cpu_id = "NumpyCpuBackend"
    if cpu_id not in registered_backends():
        register_backend(Backend(cpu_id, numpy_cpu.NumpyCpuBackend()))
    if cpu_id not in aot_backends():
        register_aot_backend(cpu_id, numpy_cpu.NumpyCpuBackendDetails)
    sub = ProgramBuilder()
    s = sub.method("forward")
    s.output(s.call("aten::relu.out", s.call("aten::mm.out", s.input(np.float32, (M, K)), W)))
    outer = ProgramBuilder()
    f = outer.method("forward")
    (y,) = f.delegate(cpu_id, sub, [f.input(np.float32, (M, K))])
    f.output(y)
    prog = load_program(outer.to_bytes())
    cpus = tuple(sorted(os.sched_getaffinity(0)))[:2] if hasattr(os, "sched_getaffinity") else (0,)
    one = Fixed("one-thread", 1, {"n": {cpu_id: {"num_threads": 1}}}, reason="battery low")
    async with Orchestrator(resources=[CpuResource(cpus=cpus)], policies=[one], period=None) as orch:
        p = await orch.load(prog, instances=[InstanceSpec("n", bind={"cpu": cpus})])
        (out,) = await p["n"].execute([frame(0)])
        np.testing.assert_allclose(out, np.maximum(frame(0) @ W, 0), rtol=1e-5, atol=1e-5)
        assert p["n"].statistics().options[cpu_id]["num_threads"] == len(cpus)
        assert orch.explain()["n"][cpu_id]["num_threads"].source == "binding"
        run = await orch.refresh()  # a hot option the binding implies is a default a policy may override
        assert run.rejected == 0 and run.changes == (1 if len(cpus) > 1 else 0)
        await p["n"].execute([frame(1)])
        assert p["n"].statistics().options[cpu_id]["num_threads"] == 1


# -- faults -------------------------------------------------------------------------------
@pytest.mark.anyio
async def test_a_raising_backend_restarts_then_fails_while_the_others_keep_executing() -> None:
    prog = fault_program()
    FAULT_PLAN.clear()
    FAULT_PLAN["flaky"] = {"raise": 2}
    FAULT_PLAN["broken"] = {"raise": -1}
    fast = RestartPolicy(max_restarts=3, backoff_s=0.001, backoff_factor=2.0, restart_on_error=True)
    specs = [InstanceSpec(n, backend_options={FAULT: {"label": n}}, restart=fast) for n in ("ok", "flaky", "broken")]
    async with Orchestrator(period=None) as orch:
        p = await orch.load(prog, instances=specs)
        done = anyio.Event()
        ok_runs = 0

        async def steady() -> None:
            nonlocal ok_runs
            while not done.is_set():
                np.testing.assert_array_equal((await p["ok"].execute([X4]))[0], X4 + 1)
                ok_runs += 1
                await anyio.sleep(0)

        async with anyio.create_task_group() as tg:
            tg.start_soon(steady)
            for k in range(2):
                with pytest.raises(ExecuteError, match=f"restarting, {k + 1} of 3") as ei:
                    await p["flaky"].execute([X4])
                assert isinstance(ei.value.__cause__, OrchestraError) and ei.value.code is Error.Internal
                assert isinstance(ei.value.__cause__.__cause__, RuntimeError)
                assert "injected fault in flaky" in str(ei.value)
            np.testing.assert_array_equal((await p["flaky"].execute([X4]))[0], X4 + 1)
            for k in range(3):
                with pytest.raises(ExecuteError, match=f"restarting, {k + 1} of 3"):
                    await p["broken"].execute([X4])
            with pytest.raises(ExecuteError, match="instance failed: 4 consecutive failed executes \\(max_restarts=3\\)"):
                await p["broken"].execute([X4])
            with pytest.raises(InstanceFailedError, match="instance 'broken' failed: 4 consecutive failed executes") as ei:
                await p["broken"].execute([X4])
            assert "injected fault in broken" in str(ei.value)
            for _ in range(10):  # routing skips the failed instance
                await p.execute([X4])
            done.set()
        assert ok_runs > 0
        s = {n: p[n].statistics() for n in ("ok", "flaky", "broken")}
        assert (s["flaky"].restarts, s["flaky"].failures, s["flaky"].state) == (2, 2, "running")
        assert (s["broken"].restarts, s["broken"].failures, s["broken"].state) == (3, 4, "failed")
        assert "4 consecutive failed executes" in s["broken"].last_error
        assert s["ok"].failures == 0 and s["ok"].restarts == 0
        handles = [h for h in FAULT_B.handles if h["label"] == "broken"]
        assert len(handles) == 4 and all(h["destroyed"] for h in handles)  # 1 + 3 fresh Methods, all closed
        # input errors don't restart
        with pytest.raises(ExecuteError, match="not restarted: the inputs or options were rejected") as ei:
            await p["ok"].execute([np.zeros(3, np.float32)])
        assert ei.value.code is Error.InvalidArgument and p["ok"].statistics().restarts == 0
        await p.remove("broken")
        with pytest.raises(InstanceFailedError, match="pool 'forward' has no instance that can execute"):
            await p.scale(0)
            await p.execute([X4])


@pytest.mark.anyio
async def test_by_default_an_execute_that_raises_is_a_failed_execute_not_a_restart() -> None:
    FAULT_PLAN["flaky"] = {"raise": 3}
    async with Orchestrator(period=None) as orch:
        p = await orch.load(fault_program(), instances=[
            InstanceSpec("flaky", backend_options={FAULT: {"label": "flaky"}}, restart=RestartPolicy(max_restarts=1))])
        for _ in range(3):
            with pytest.raises(ExecuteError, match="injected fault in flaky.*not restarted: a failed execute"):
                await p["flaky"].execute([X4])
        np.testing.assert_array_equal((await p["flaky"].execute([X4]))[0], X4 + 1)
        s = p["flaky"].statistics()
        assert (s.executes, s.failures, s.restarts, s.state) == (1, 3, 0, "running")
        assert len([h for h in FAULT_B.handles if h["label"] == "flaky"]) == 1  # the same Method throughout


@pytest.mark.anyio
async def test_a_hanging_execute_hits_its_deadline_and_the_instance_is_replaced() -> None:
    prog = fault_program()
    release = threading.Event()
    FAULT_PLAN.clear()
    FAULT_PLAN["stuck"] = {"hang": release, "hangs": 1}
    specs = [InstanceSpec(n, backend_options={FAULT: {"label": n}}, deadline_s=0.2 if n == "stuck" else None)
             for n in ("stuck", "a", "b")]
    try:
        async with Orchestrator(period=None) as orch:
            p = await orch.load(prog, instances=specs)
            stuck_thread = p["stuck"]._worker.thread
            counts = {"a": 0, "b": 0}
            done = anyio.Event()

            async def steady(n: str) -> None:
                while not done.is_set():
                    await p[n].execute([X4])
                    counts[n] += 1
                    await anyio.sleep(0.001)

            queued: list = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(steady, "a")
                tg.start_soon(steady, "b")
                await anyio.sleep(0.02)
                before = dict(counts)

                async def later(k: int) -> None:
                    queued.append((await p["stuck"].execute([X4 + k]))[0])

                with structlog.testing.capture_logs() as logs:
                    async with anyio.create_task_group() as tg2:
                        tg2.start_soon(later, 100)  # queued behind the stuck execute
                        with pytest.raises(DeadlineError, match="ran past its deadline of 0.2 s") as ei:
                            await p["stuck"].execute([X4])
                        assert isinstance(ei.value, TimeoutError)
                done.set()
            assert counts["a"] > before["a"] and counts["b"] > before["b"]  # the others kept executing
            assert any(e["event"].startswith("instance quarantined") for e in logs)
            np.testing.assert_array_equal(queued[0], X4 + 101)  # moved to the replacement and run there
            s = p["stuck"].statistics()
            assert (s.replacements, s.failures, s.state) == (1, 1, "running")
            assert p["stuck"]._worker.thread is not stuck_thread and stuck_thread.is_alive()
            handles = [h for h in FAULT_B.handles if h["label"] == "stuck"]
            assert len(handles) == 2 and not handles[0]["destroyed"]  # the stuck Method is never reused
            for _ in range(3):
                np.testing.assert_array_equal((await p["stuck"].execute([X4]))[0], X4 + 1)
            assert handles[1]["executes"] == 4 and handles[0]["executes"] == 1
            release.set()
            stuck_thread.join(5)
            assert not stuck_thread.is_alive() and handles[0]["destroyed"]  # closed by its thread on return
    finally:
        release.set()


def _loop_thread_wakeups() -> int:
    """Voluntary context switches of the calling thread (each time it slept and woke)."""
    with open("/proc/thread-self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))


@pytest.mark.anyio
@pytest.mark.skipif(not os.path.exists("/proc/thread-self/status"), reason="needs Linux's per-thread status")
async def test_an_idle_orchestrator_leaves_its_event_loop_asleep_until_a_deadline_needs_watching() -> None:
    """No instance has a deadline: the watchdog waits for one instead of polling (it used to
    wake the loop 20 times a second, which an idle battery-powered device pays for). An
    instance with a deadline added later is watched from then on."""
    async with Orchestrator(period=None) as orch:
        p = await orch.load(kernel_program(), instances=[InstanceSpec("a")])
        np.testing.assert_array_equal((await p["a"].execute([X4]))[0], X4 * 2)
        await anyio.sleep(0.05)
        before = _loop_thread_wakeups()
        await anyio.sleep(1.0)
        assert _loop_thread_wakeups() - before <= 3  # the sleep's own wakeup (a poll: 20)
        prog = fault_program()
        release = threading.Event()
        FAULT_PLAN.clear()
        FAULT_PLAN["late"] = {"hang": release, "hangs": 1}
        try:
            q = await orch.load(prog, instances=[InstanceSpec("late", backend_options={FAULT: {"label": "late"}},
                                                              deadline_s=0.2)])
            with pytest.raises(DeadlineError, match="ran past its deadline of 0.2 s"):
                await q["late"].execute([X4])
            assert q["late"].statistics().replacements == 1
        finally:
            release.set()


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["remove", "aclose"])
async def test_removing_an_instance_stuck_in_a_thread_answers_every_caller_at_close_timeout(how: str) -> None:
    """No deadline, an execute stuck in a backend: remove() (or closing the orchestrator)
    gives up after close_timeout and every caller (the stuck one and those queued behind it)
    gets InstanceClosedError then; what the abandoned thread returns later is dropped."""
    prog = fault_program()
    release = threading.Event()
    FAULT_PLAN["stuck"] = {"hang": release, "hangs": 1}
    try:
        async with Orchestrator(period=None, close_timeout=0.2) as orch:
            p = await orch.load(prog, instances=[InstanceSpec("stuck", backend_options={FAULT: {"label": "stuck"}})])
            inst = p["stuck"]
            thread = inst._worker.thread
            answers: dict[int, Any] = {}

            async def call(k: int) -> None:
                try:
                    answers[k] = (await inst.execute([X4 + k]))[0]
                except Exception as exc:  # noqa: BLE001 - checked below
                    answers[k] = exc

            async with anyio.create_task_group() as tg:
                for k in range(4):
                    tg.start_soon(call, k)
                    await anyio.sleep(0.01)  # k=0 is the stuck one, the others queue behind it
                with anyio.fail_after(10):
                    await (p.remove("stuck") if how == "remove" else orch.aclose())
                    while len(answers) < 4:  # answered at the timeout, not when the thread returns
                        await anyio.sleep(0.005)
            assert not release.is_set() and thread.is_alive()
            for k in range(4):
                assert isinstance(answers[k], InstanceClosedError), (k, answers[k])
            release.set()
            thread.join(5)
            await anyio.sleep(0.05)  # the late result reaches the loop, which drops it
            assert all(isinstance(answers[k], InstanceClosedError) for k in range(4))
    finally:
        release.set()


@pytest.mark.anyio
async def test_pool_and_orchestrator_totals_are_running_totals() -> None:
    prog = kernel_program()
    async with Orchestrator(period=None) as orch:
        p = await orch.load(prog, instances=[InstanceSpec("a"), InstanceSpec("b")])
        for n in ("a", "a", "b"):
            await p[n].execute([X4])
        with pytest.raises(ExecuteError):  # a caller's mistake: rejected, not a failure
            await p["a"].execute([np.zeros(3, np.float32)])
        with pytest.raises(ExecuteError):  # per-call options refused: rejected too
            await p["a"].execute([np.zeros(4, np.float32)], {"NoSuchBackend": {"x": 1}})
        assert (p.statistics().executes, p.statistics().failures, p.statistics().rejected) == (3, 0, 2)
        await p.remove("a")
        s = p.statistics()
        assert (s.executes, s.failures, s.rejected, len(s.instances)) == (3, 0, 2, 1)
        assert (orch.statistics().executes, orch.statistics().failures, orch.statistics().rejected) == (3, 0, 2)
        q = await orch.load(prog, instances=[InstanceSpec("c")], name="other")
        await q.execute([X4])
        assert orch.statistics().executes == 4
        await orch.unload("other")
        await p.execute([X4])
        assert (orch.statistics().executes, orch.statistics().failures, orch.statistics().rejected) == (5, 0, 2)


# -- surface ------------------------------------------------------------------------------
def test_public_names_are_importable() -> None:
    for name in orchestrator_pkg.__all__:
        assert hasattr(orchestrator_pkg, name), name


@pytest.mark.anyio
async def test_orchestrator_statistics_and_misuse() -> None:
    orch = Orchestrator(period=None)
    with pytest.raises(InstanceClosedError, match="not running"):
        await orch.load(kernel_program(), instances=[InstanceSpec("k")])
    with pytest.raises(InvalidArgumentError, match="does not implement orchestra.policies.Policy"):
        Orchestrator(policies=[object()])
    with pytest.raises(InvalidArgumentError, match="period must be"):
        Orchestrator(period=0)
    async with orch:
        p = await orch.load(kernel_program(), instances=[InstanceSpec("k")])
        np.testing.assert_array_equal((await p["k"].execute([X4]))[0], X4 * 2)
        q = await orch.load(kernel_program(), instances=[InstanceSpec("k2")])
        assert (p.name, q.name) == ("forward", "forward2")
        with pytest.raises(NotFoundError, match="method 'nope' not found"):
            await orch.load(kernel_program(), method="nope")
        st = orch.statistics()
        assert [ps.name for ps in st.pools] == ["forward", "forward2"] and st["forward"]["k"].executes == 1
        assert orch.instance("k2") is q["k2"]
        await orch.unload("forward2")
        assert list(orch.pools) == ["forward"]
        k = p["k"]
    with pytest.raises(InstanceClosedError, match="'k' is closed"):
        await k.execute([X4])


# -- ScaleTo naming a pool ----------------------------------------------------------------
class Scaler:
    """Proposes the actions the test sets (with ``reasons``); records the pools it was shown."""

    signals: tuple[str, ...] = ()

    def __init__(self, name: str = "scaler", priority: int = 1, actions: tuple = (), reasons: dict | None = None) -> None:
        self.name, self.priority, self.actions, self.reasons = name, priority, actions, dict(reasons or {})
        self.shown: list[dict[str, str | None]] = []

    def propose(self, signals: Signals, instances: Sequence[InstanceView]) -> Proposal:
        self.shown.append({i.name: i.pool for i in instances})
        return Proposal(actions=self.actions, reasons=self.reasons)


def sizes(orch: Orchestrator) -> dict[str, int]:
    return {name: len(pool) for name, pool in orch.pools.items()}


async def two_pools(orch: Orchestrator, n: int = 2) -> None:
    for pool in ("a", "b"):
        await orch.load(probe_program(), name=pool, instances=[InstanceSpec(f"{pool}{k}") for k in range(n)])


@pytest.mark.anyio
async def test_scale_to_a_named_pool_scales_only_that_pool_and_without_a_name_every_pool() -> None:
    scaler = Scaler(actions=(ScaleTo(1, pool="a"),), reasons={("a", "", "ScaleTo"): "only a", ("*", "", "ScaleTo"): "all"})
    async with Orchestrator(policies=[scaler], period=None) as orch:
        await two_pools(orch)
        run = await orch.refresh()
        assert scaler.shown[-1] == {"a0": "a", "a1": "a", "b0": "b", "b1": "b"}  # every pool's instances, named
        assert run.actions == 1 and run.rejected == 0
        assert sizes(orch) == {"a": 1, "b": 2}
        ex = orch.explain()
        scaled = ex.actions_of("a")["scale"]
        assert (scaled.value, scaled.policy, scaled.reason) == (1, "scaler", "only a")
        assert ex.actions_of("b") == {}
        np.testing.assert_array_equal((await orch.pool("b").execute([X4]))[0], X4 + 2)
        # no pool named: every pool, as before (its reason under "*")
        scaler.actions = (ScaleTo(3),)
        run = await orch.refresh()
        assert run.actions == 2 and sizes(orch) == {"a": 3, "b": 3}
        ex = orch.explain()
        assert {p: ex.actions_of(p)["scale"].reason for p in "ab"} == {"a": "all", "b": "all"}
        # a later ScaleTo of the same policy naming a pool overrides its earlier one there
        scaler.actions = (ScaleTo(2), ScaleTo(1, pool="b"))
        await orch.refresh()
        assert sizes(orch) == {"a": 2, "b": 1}
        assert orch.explain().actions_of("b")["scale"].reason == "all"  # no reason keyed ("b", "", "ScaleTo"): "*"


@pytest.mark.anyio
async def test_scale_to_conflicts_are_settled_per_pool_by_priority() -> None:
    hi = Scaler("hi", 20, actions=(ScaleTo(1, pool="a"),))
    lo = Scaler("lo", 5, actions=(ScaleTo(3),))
    async with Orchestrator(policies=[lo, hi], period=None) as orch:
        await two_pools(orch)
        await orch.refresh()
        assert sizes(orch) == {"a": 1, "b": 3}  # hi wins pool a only; lo's every-pool ScaleTo takes b
        ex = orch.explain()
        assert (ex.actions_of("a")["scale"].policy, ex.actions_of("b")["scale"].policy) == ("hi", "lo")
        hi.actions, lo.actions = (ScaleTo(2),), (ScaleTo(1, pool="b"),)
        await orch.refresh()
        assert sizes(orch) == {"a": 2, "b": 2}  # an every-pool ScaleTo of higher priority wins each pool


@pytest.mark.anyio
async def test_scale_to_an_unknown_pool_is_a_warning_and_the_engine_goes_on() -> None:
    scaler = Scaler(actions=(ScaleTo(1, pool="nope"),))
    async with Orchestrator(policies=[scaler], period=None) as orch:
        await two_pools(orch)
        with structlog.testing.capture_logs() as logs:
            run = await orch.refresh()
        assert run.actions == 0 and run.rejected == 1 and run.errors == 0
        (w,) = [e for e in logs if e["event"] == "policy action rejected"]
        assert w["log_level"] == "warning" and w["policy"] == "scaler" and w["pool"] == "nope"
        assert w["reason"] == "no pool 'nope' (pools: a, b)"
        assert sizes(orch) == {"a": 2, "b": 2} and orch.explain().actions == ()
        assert orch.statistics().proposals_rejected == 1
    # the engine's own loop keeps running past it, and applies a good ScaleTo afterwards
    scaler = Scaler(actions=(ScaleTo(1, pool="nope"), ScaleTo(0, pool=3)))  # type: ignore[arg-type]
    async with Orchestrator(policies=[scaler], period=0.01) as orch:
        await two_pools(orch)
        with anyio.fail_after(30):
            while orch.statistics().proposals_rejected < 6:
                await anyio.sleep(0.01)
        assert sizes(orch) == {"a": 2, "b": 2} and orch.statistics().policy_errors == 0
        scaler.actions = (ScaleTo(1, pool="b"),)
        with anyio.fail_after(30):
            while sizes(orch) != {"a": 2, "b": 1}:
                await anyio.sleep(0.01)
        np.testing.assert_array_equal((await orch.pool("a").execute([X4]))[0], X4 + 2)



@pytest.mark.anyio
async def test_several_threads_of_an_interpreted_method_get_one_gil_hint() -> None:
    async with Orchestrator(period=None) as orch:
        with structlog.testing.capture_logs() as logs:
            p = await orch.load(kernel_program(), name="interp", instances=[InstanceSpec("k0")])
            assert not [e for e in logs if "GIL" in e["event"]]  # one instance: nothing to share
            await p.add(InstanceSpec("k1"))
            await p.add(InstanceSpec("k2"))
            await orch.load(probe_program(), name="delegated", instances=[InstanceSpec("d0"), InstanceSpec("d1")])
        hints = [e for e in logs if "GIL" in e["event"]]
        assert len(hints) == 1  # once per pool, and not for a method with a delegate
        assert hints[0]["pool"] == "interp" and hints[0]["instances"] == ["k0", "k1"]
        assert hints[0]["log_level"] == "warning" and "placement='process'" in hints[0]["hint"]
