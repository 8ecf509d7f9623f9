#!/usr/bin/env python3
"""orchestra on Ray (the ``ray`` extra): what an actor costs per execute, and what a second
node buys, on a local Ray cluster started here (127.0.0.1; stopped at the end).

1. **Per-execute overhead**: one instance of ``examples/models/convnet.pte`` executed
   ``--executes`` times (a) by a bare ``Method``, (b) by a bare Ray actor holding one on the
   head node (``ray.get(actor.execute.remote(inputs))``: the inputs and outputs cross the object
   store), (c) through ``Orchestrator()`` (a worker thread) and (d) through
   ``Orchestrator(cluster=ADDRESS)`` (the same instance in a Ray actor: the worker thread's
   round trip to it). Medians, and the differences per execute measured in the same run.
   (``run_cluster`` never does this per frame: the whole pipeline runs in the actor.)
2. **Cameras over 2 nodes vs 1**: ``--cameras`` synthetic cameras (``--frames`` each, drop
   ``block``, NPU cores at ``time_scale`` 1: jobs take their modelled time) run with
   :func:`orchestra._run.run_cluster`, first with every camera's resources on the head node, then
   split over the head and a second node (``ray start`` processes, ``--cpus-per-node`` each).
   Frames per second over the cluster run's wall time, and the ratio 2 nodes / 1 measured in the
   same run, over the cameras' own run time and over the whole call (actor start-up included).
   Every camera runs in its own actor process either way: on one machine the second node adds
   a raylet, not cores.

    python benchmarks/bench_cluster.py [--executes 300] [--cameras 2] [--frames 3000] [--cpus-per-node 1]

Both nodes share this machine's cores: the ratio is what process-level parallelism gives here,
not what two machines would.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ray  # noqa: E402

from orchestra import load_program  # noqa: E402
from orchestra._run import RunOptions, run_cluster  # noqa: E402
from orchestra.config import load_config  # noqa: E402

MODEL = ROOT / "examples" / "models" / "convnet.pte"
NPU_MODEL = ROOT / "examples" / "models" / "convnet_npu.pte"


class Cluster:
    """``ray start`` processes on 127.0.0.1, each in its own process group (killed at stop)."""

    def __init__(self, cpus: int) -> None:
        self.tmp = pathlib.Path(tempfile.mkdtemp(prefix="orc-rayb-", dir="/tmp"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.cpus = cpus
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, resources: dict[str, float], head: bool = False) -> None:
        args = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--disable-usage-stats",
                "--node-ip-address", "127.0.0.1", "--num-cpus", str(self.cpus), "--object-store-memory", "100000000",
                "--resources", json.dumps(resources)]
        args += (["--head", "--port", str(self.port), "--include-dashboard=false", "--temp-dir", str(self.tmp)]
                 if head else ["--address", self.address])
        env = dict(os.environ, RAY_DISABLE_USAGE_STATS="1")
        self.procs.append(subprocess.Popen(args, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the Ray head did not start") from None
                time.sleep(0.3)

    def nodes(self, n: int) -> None:
        ray.init(address=self.address, logging_level="ERROR", log_to_driver=False, configure_logging=False)
        try:
            deadline = time.monotonic() + 60
            while len([x for x in ray.nodes() if x["Alive"]]) < n:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the cluster did not reach {n} nodes")
                time.sleep(0.2)
        finally:
            ray.shutdown()

    def stop(self) -> None:
        for p in reversed(self.procs):
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    p.wait(3)
                except subprocess.TimeoutExpired:
                    continue
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.procs.clear()
        shutil.rmtree(self.tmp, ignore_errors=True)


class Holder:
    """A Ray actor's body: one instance of the program's method."""

    def __init__(self, path: str) -> None:
        self.method = load_program(path).load_method("forward")

    def execute(self, inputs: list[Any]) -> list[Any]:
        return self.method.execute(inputs)


def per_execute(address: str, n: int) -> tuple[float, float]:
    x = [np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)]
    m = load_program(str(MODEL)).load_method("forward")
    local = []
    for _ in range(n):
        t = time.perf_counter()
        m.execute(x)
        local.append(time.perf_counter() - t)
    ray.init(address=address, logging_level="ERROR", log_to_driver=False, configure_logging=False)
    try:
        actor = ray.remote(num_cpus=0)(Holder).remote(str(MODEL))
        ref = ray.put(x)
        ray.get(actor.execute.remote(ref))  # started, warmed
        remote = []
        for _ in range(n):
            t = time.perf_counter()
            ray.get(actor.execute.remote(x))
            remote.append(time.perf_counter() - t)
        want = m.execute(x)[0]
        got = ray.get(actor.execute.remote(x))[0]
        assert np.array_equal(want, got), "the actor's instance computed something else"
    finally:
        ray.shutdown()
    return statistics.median(local), statistics.median(remote)


def per_execute_orchestrator(address: str | None, n: int) -> float:
    """Median ``await pool[...].execute(x)`` through an Orchestrator, here or on ``address``."""
    import anyio

    from orchestra.orchestrator import InstanceSpec, Orchestrator

    x = [np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)]
    want = load_program(str(MODEL)).load_method("forward").execute(x)[0]

    async def go() -> float:
        async with Orchestrator(period=None, cluster=address) as orch:
            pool = await orch.load(MODEL, instances=[InstanceSpec("i")])
            inst = pool["i"]
            got = (await inst.execute(x))[0]
            assert np.array_equal(want, got), "the orchestrated instance computed something else"
            times = []
            for _ in range(n):
                t = time.perf_counter()
                await inst.execute(x)
                times.append(time.perf_counter() - t)
            if address is not None:
                assert inst.statistics().node is not None, "not on a Ray node"
            return statistics.median(times)

    return anyio.run(go, backend="asyncio")


def cameras_config(folder: pathlib.Path, cameras: int, frames: int) -> pathlib.Path:
    names = [f"cam{i}" for i in range(cameras)]
    text = [f'[program]\npath = {json.dumps(str(NPU_MODEL))}\n',
            f'[device.npu0]\nkind = "npu_sim"\ncores = {cameras}\ntime_scale = 1.0\n'
            f'links = {{ {", ".join(f"{n} = {i}" for i, n in enumerate(names))} }}\n']
    for i, n in enumerate(names):
        text.append(f'[[camera]]\nname = "{n}"\nsource = {{ kind = "synthetic", fps = 10000, count = {frames}, '
                    f'seed = {i} }}\nbind = {{ "npu0.core" = {i} }}\ndrop = "block"\n')
    text.append("[cluster]\naddress = \"auto\"\n")
    path = folder / "bench_cluster.toml"
    path.write_text("\n".join(text), encoding="utf-8")
    return path


def throughput(cfg: Any, address: str) -> tuple[float, float, int]:
    """Frames per second over the cameras' own run time (the longest node's, actor start-up
    left out) and over the whole ``run_cluster`` call's wall time; the nodes used."""
    t = time.perf_counter()
    r = run_cluster(cfg, RunOptions(duration_s=600), address=address)
    wall = time.perf_counter() - t
    if r.problems:
        raise SystemExit(f"cluster run failed: {r.problems}")
    frames = sum(x.summary["cameras"][0]["processed"] for x in r.runs)
    ran = max(x.summary["elapsed_s"] for x in r.runs)
    return frames / ran, frames / wall, len({x.node_id for x in r.runs})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--executes", type=int, default=300)
    ap.add_argument("--cameras", type=int, default=2)
    ap.add_argument("--frames", type=int, default=3000)
    ap.add_argument("--cpus-per-node", type=int, default=1)
    a = ap.parse_args()
    names = [f"cam{i}" for i in range(a.cameras)]
    every = {**{f"camera.{n}": 1 for n in names}, **{f"npu0.core.{i}": 1 for i in range(a.cameras)}}
    half = a.cameras // 2
    first = {**{f"camera.{n}": 1 for n in names[:half]}, **{f"npu0.core.{i}": 1 for i in range(half)}}
    second = {**{f"camera.{n}": 1 for n in names[half:]}, **{f"npu0.core.{i}": 1 for i in range(half, a.cameras)}}
    folder = pathlib.Path(tempfile.mkdtemp(prefix="orc-benchcfg-"))
    cfg = load_config(cameras_config(folder, a.cameras, a.frames))
    one = Cluster(a.cpus_per_node)
    try:
        one.start(every, head=True)
        one.nodes(1)
        local, remote = per_execute(one.address, a.executes)
        print(f"per execute (median of {a.executes}, convnet.pte): bare Method {local * 1e6:.1f} us, bare Ray actor "
              f"{remote * 1e6:.1f} us: +{(remote - local) * 1e6:.1f} us per execute ({remote / local:.1f}x)")
        orch_local = per_execute_orchestrator(None, a.executes)
        orch_ray = per_execute_orchestrator(one.address, a.executes)
        print(f"per execute through an Orchestrator (median of {a.executes}): Orchestrator() {orch_local * 1e6:.1f} us, "
              f"Orchestrator(cluster=...) {orch_ray * 1e6:.1f} us: +{(orch_ray - orch_local) * 1e6:.1f} us per execute "
              f"({orch_ray / orch_local:.1f}x); vs the bare actor: +{(orch_ray - remote) * 1e6:.1f} us")
        fps1, wall1, n1 = throughput(cfg, one.address)
    finally:
        one.stop()
    two = Cluster(a.cpus_per_node)
    try:
        two.start(first, head=True)
        two.start(second)
        two.nodes(2)
        fps2, wall2, n2 = throughput(cfg, two.address)
    finally:
        two.stop()
        shutil.rmtree(folder, ignore_errors=True)
    print(f"{a.cameras} cameras x {a.frames} frames, frames/s while the cameras ran: {n1} node {fps1:.1f}, "
          f"{n2} nodes {fps2:.1f}: {fps2 / fps1:.2f}x; over the whole call (actor start-up included): "
          f"{wall1:.1f} vs {wall2:.1f}: {wall2 / wall1:.2f}x (both nodes on this machine, every camera in its own "
          f"actor process either way)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
