"""Real signal sources drive the engine: an online-CPU change retunes threads per instance;
CPUs going offline and memory pressure scale the pool the policy names, and only it."""

from __future__ import annotations

import numpy as np
import pytest

from orchestra.aot import ProgramBuilder, aot_backends, register_aot_backend
from orchestra.orchestrator import InstanceSpec, Orchestrator
from orchestra.policies import CoreAvailabilityPolicy, CpuSource, MemoryPressurePolicy, PressureSource
from orchestra.runtime import Backend, load_program, register_backend, registered_backends

numpy_cpu = pytest.importorskip("orchestra.backends.numpy_cpu")
CPU_ID = "NumpyCpuBackend"
W = np.linspace(-1, 1, 8 * 6, dtype=np.float32).reshape(8, 6)


@pytest.fixture(params=[pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"), pytest.param("asyncio", id="asyncio")])
def anyio_backend(request):
    return request.param


def numpy_cpu_program():
    if CPU_ID not in registered_backends():
        register_backend(Backend(CPU_ID, numpy_cpu.NumpyCpuBackend()))
    if CPU_ID not in aot_backends():
        register_aot_backend(CPU_ID, numpy_cpu.NumpyCpuBackendDetails)
    sub = ProgramBuilder()
    s = sub.method("forward")
    s.output(s.call("aten::relu.out", s.call("aten::mm.out", s.input(np.float32, (4, 8)), W)))
    outer = ProgramBuilder()
    f = outer.method("forward")
    (y,) = f.delegate(CPU_ID, sub, [f.input(np.float32, (4, 8))])
    f.output(y)
    return load_program(outer.to_bytes())


@pytest.mark.anyio
async def test_online_cpu_change_is_picked_up_and_threads_per_instance_follow(tmp_path) -> None:
    online = tmp_path / "online"
    online.write_text("0-3\n")  # a sysfs-like file the test changes, read by the real source
    source = CpuSource(online_path=online, cgroup_root=tmp_path / "no-cgroup", cgroup_file=tmp_path / "no-file",
                       read_affinity=False)
    policy = CoreAvailabilityPolicy(backend=CPU_ID, option="num_threads")
    x = np.ones((4, 8), np.float32)
    want = np.maximum(x @ W, 0)
    async with Orchestrator(policies=[policy], signals=[source], period=None) as orch:
        pool = await orch.load(numpy_cpu_program(), instances=[InstanceSpec("a"), InstanceSpec("b")])

        async def threads_after_refresh() -> list[int]:
            await orch.refresh()
            for name in ("a", "b"):
                (out,) = await pool[name].execute([x])  # the change applies at this execute boundary
                np.testing.assert_allclose(out, want, rtol=1e-6)
            return [pool[n].statistics().options[CPU_ID]["num_threads"] for n in ("a", "b")]

        assert await threads_after_refresh() == [2, 2]  # 4 online CPUs shared by 2 instances
        online.write_text("0-1\n")  # two CPUs go offline (hot-plug)
        assert await threads_after_refresh() == [1, 1]
        online.write_text("0-7\n")
        assert await threads_after_refresh() == [4, 4]
        explained = orch.explain()["a"][CPU_ID]["num_threads"]
        assert explained.policy == "core_availability" and "cpu" in explained.reason


@pytest.mark.anyio
async def test_core_availability_scales_the_pool_it_drains_and_only_that_pool(tmp_path) -> None:
    online = tmp_path / "online"
    online.write_text("0-3\n")
    source = CpuSource(online_path=online, cgroup_root=tmp_path / "no-cgroup", cgroup_file=tmp_path / "no-file",
                       read_affinity=False)
    policy = CoreAvailabilityPolicy(backend=CPU_ID, option="num_threads", scale_instances=True)
    async with Orchestrator(policies=[policy], signals=[source], period=None) as orch:
        a = await orch.load(numpy_cpu_program(), name="a", instances=[InstanceSpec(f"a{k}") for k in range(3)])
        b = await orch.load(numpy_cpu_program(), name="b", instances=[InstanceSpec("b0")])
        await orch.refresh()
        assert (len(a), len(b)) == (3, 1)  # 4 CPUs fit all 4 instances
        online.write_text("0-1\n")  # 2 CPUs fit 2 instances: both come off the larger pool
        await orch.refresh()
        assert (len(a), len(b)) == (1, 1)
        ex = orch.explain()
        scaled = ex.actions_of("a")["scale"]
        assert (scaled.value, scaled.policy) == (1, "core_availability")
        assert scaled.reason == "cpu.available=2 fits 2 instance(s) of >= 1 thread(s), 4 running in pool 'a'"
        assert ex.actions_of("b") == {}
        online.write_text("0-3\n")  # back: pool a grows back to the 3 it had
        await orch.refresh()
        assert (len(a), len(b)) == (3, 1)
        x = np.ones((4, 8), np.float32)
        for pool in (a, b):
            (out,) = await pool.execute([x])
            np.testing.assert_allclose(out, np.maximum(x @ W, 0), rtol=1e-6)


@pytest.mark.anyio
async def test_memory_pressure_read_from_procfs_drains_the_largest_pool_only(tmp_path) -> None:
    (tmp_path / "pressure").mkdir()
    memory = tmp_path / "pressure" / "memory"

    def psi(full: float) -> None:
        memory.write_text(f"some avg10={full:.2f} avg60=0.00 avg300=0.00 total=1\n"
                          f"full avg10={full:.2f} avg60=0.00 avg300=0.00 total=1\n")

    psi(0.0)
    async with Orchestrator(policies=[MemoryPressurePolicy()], signals=[PressureSource(proc=tmp_path)],
                            period=None) as orch:
        a = await orch.load(numpy_cpu_program(), name="a", instances=[InstanceSpec("a0")])
        b = await orch.load(numpy_cpu_program(), name="b", instances=[InstanceSpec(f"b{k}") for k in range(3)])
        assert (await orch.refresh()).actions == 0
        psi(40.0)
        run = await orch.refresh()
        assert run.actions == 1 and (len(a), len(b)) == (1, 2)
        scaled = orch.explain().actions_of("b")["scale"]
        assert scaled.policy == "memory_pressure"
        assert scaled.reason == "memory.psi_full_avg10=40 > psi_full_threshold=10: 3 -> 2 instance(s) in pool 'b'"
        assert scaled.signals["memory.psi_full_avg10"] == 40.0
