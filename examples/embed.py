"""The orchestrator inside your own async application, no TOML: what ``orchestra run`` does,
in code you control.

A simulated 2-core NPU with a camera wired to each core; the program's method loaded once
per camera, each instance bound to its camera's core; two synthetic 30 fps cameras as
pipelines; a battery policy that switches the NPU to low power when a scripted battery
drops at 1.5 s. Runs 3 s and prints what happened.

    python examples/embed.py

Needs ``examples/models/convnet_npu.pte`` (made by ``examples/make_models.py``).
"""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path

import anyio
import structlog

from orchestra.backends.npu_sim import NpuDevice, register_device
from orchestra.orchestrator import InstanceSpec, NpuSimResource, Orchestrator
from orchestra.pipeline import Pipeline, Pipelines, SyntheticCamera
from orchestra.policies import BatteryPolicy, ScriptedSource
from orchestra.runtime import load_program

HERE = Path(__file__).resolve().parent
PROGRAM = HERE / "models" / "convnet_npu.pte"
CAMERAS = ("front", "rear")


class PowerModeCounter:
    """A pipeline executor around an instance that counts executes per NPU power mode: the
    mode *that* execute ran with (``execute(..., detail=True)`` returns an ``Execution``
    with the outputs and the options in force for it, so a policy's change racing with
    the execute can't mislabel it)."""

    def __init__(self, instance) -> None:  # noqa: ANN001 - an orchestrator Instance
        self.instance = instance
        self.by_mode: Counter[str] = Counter()

    async def execute(self, inputs: list) -> list:
        ex = await self.instance.execute(inputs, detail=True)
        self.by_mode[ex.options["NpuSimBackend"]["power_mode"]] += 1
        return ex.outputs

    def describe(self):  # noqa: ANN201 - what the pipeline's statistics show
        return self.instance.describe()


async def main() -> None:
    # the device: two cores, "front" wired to core 0 and "rear" to core 1; jobs take their
    # modelled time (time_scale=1), so the power mode shows in the latencies
    with NpuDevice("npu0", cores=2, links={"front": 0, "rear": 1}, time_scale=1.0) as npu:
        register_device(npu)  # the backend finds it by name (closing the device unregisters it)
        battery = ScriptedSource([(0, {"battery.percent": 80, "battery.charging": False}),
                                  (1.5, {"battery.percent": 12})], name="battery")
        policy = BatteryPolicy(low=20, high=30, low_options={"NpuSimBackend": {"power_mode": "low"}})
        async with Orchestrator(resources=[NpuSimResource(npu)], policies=[policy], signals=[battery],
                                period=0.5, poll_interval=0.1) as orch:
            program = await anyio.to_thread.run_sync(load_program, PROGRAM)
            pool = await orch.load(program, method="forward", name="convnet", instances=[
                InstanceSpec(name=cam, bind={"camera": cam},
                             backend_options={"NpuSimBackend": {"power_mode": "balanced"}})
                for cam in CAMERAS])
            executors = {cam: PowerModeCounter(pool[cam]) for cam in CAMERAS}
            group = Pipelines(
                Pipeline(cam, SyntheticCamera(cam, fps=30, shape=(1, 3, 16, 16), seed=i), executors[cam],
                         queue=4, drop="drop_oldest", deadline_s=0.2)
                for i, cam in enumerate(CAMERAS))
            battery.start()  # the script's time 0 is now
            stats = await group.run(duration_s=3.0)
            stats.accounting.check()  # every frame produced was processed or dropped

            print(f"{'camera':<7} {'unit':<11} {'produced':>8} {'processed':>9} {'dropped':>7} "
                  f"{'p50 ms':>7} {'p99 ms':>7}  executes per power mode")
            for s in stats.pipelines:
                a = s.accounting
                unit = " ".join(f"{k} {v}" for k, v in (s.unit or {}).items() if k.endswith(".core"))
                modes = ", ".join(f"{m}: {n}" for m, n in executors[s.name].by_mode.items())
                print(f"{s.name:<7} {unit:<11} {a.produced:>8} {a.processed:>9} {a.dropped_total:>7} "
                      f"{s.latency.p50 * 1e3:>7.2f} {s.latency.p99 * 1e3:>7.2f}  {modes}")
            o = orch.statistics()
            print(f"policy engine: {o.engine_runs} runs, {o.changes_applied} option changes")
            print(orch.explain().format())


if __name__ == "__main__":
    # the library logs through structlog and never configures it: the application does
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    # uvloop when it is installed, plain asyncio otherwise
    uvloop = importlib.util.find_spec("uvloop") is not None
    anyio.run(main, backend="asyncio", backend_options={"use_uvloop": uvloop})
