"""Real signal sources drive the engine: an online-CPU change retunes threads per instance."""

from __future__ import annotations

import numpy as np
import pytest

from orchestra.aot import ProgramBuilder, aot_backends, register_aot_backend
from orchestra.orchestrator import InstanceSpec, Orchestrator
from orchestra.policies import CoreAvailabilityPolicy, CpuSource
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
