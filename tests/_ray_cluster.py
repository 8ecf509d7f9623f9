"""A REAL local Ray cluster for tests: a head and more nodes started with ``ray start`` on
127.0.0.1, each advertising the custom resources a test gives it (cameras, NPU cores).

Each node's ``ray start`` runs in its own process group (killed at the end, or by
:meth:`RayCluster.kill` to take one node down). Import ``ray`` only after checking it is
installed (``ray_or_none``)."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

try:
    import ray
except ImportError:  # the ray extra is not installed
    ray = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RayCluster:
    """``start(resources, head=True)`` then ``start(resources, head=False)`` for each other
    node; ``wait_nodes(n)`` connects this process (``ray.init``) and waits for n live nodes."""

    def __init__(self, tmp: pathlib.Path) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.killed: set[int] = set()  # pids of the nodes taken down on purpose
        self.env = dict(os.environ, RAY_DISABLE_USAGE_STATS="1")

    def start(self, resources: Mapping[str, float], *, head: bool, num_cpus: int = 1,
              labels: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
        args = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--disable-usage-stats",
                "--node-ip-address", "127.0.0.1", "--num-cpus", str(num_cpus), "--object-store-memory", "80000000",
                "--resources", json.dumps(dict(resources))]
        if labels:
            args += ["--labels", ",".join(f"{k}={v}" for k, v in labels.items())]
        if head:
            args += ["--head", "--port", str(self.port), "--include-dashboard=false", "--temp-dir", str(self.tmp / "ray")]
        else:
            args += ["--address", self.address]
        log = open(self.tmp / f"node{len(self.procs)}.log", "wb")  # noqa: SIM115 - kept for the session
        p = subprocess.Popen(args, env=self.env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def wait_nodes(self, n: int, timeout: float = 60.0) -> list[dict[str, Any]]:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            for k, p in enumerate(self.procs):
                if p.pid not in self.killed and p.poll() is not None:
                    raise RuntimeError(f"ray start exited {p.returncode}: "
                                       f"{(self.tmp / f'node{k}.log').read_text()[-2000:]}")
            try:
                if not ray.is_initialized():
                    socket.create_connection(("127.0.0.1", self.port), timeout=1).close()  # the head's GCS is up
                    ray.init(address=self.address, logging_level="ERROR", log_to_driver=False,
                             configure_logging=False)
                alive = [x for x in ray.nodes() if x["Alive"]]
                if len(alive) >= n:
                    return alive
            except Exception:  # noqa: BLE001 - the head is still starting
                pass
            time.sleep(0.3)
        raise RuntimeError(f"the Ray cluster did not reach {n} nodes in {timeout} s")

    def wait_resources(self, keys: set[str], timeout: float = 60.0) -> None:
        """Waits until live nodes advertise every resource in ``keys`` (a node that just died
        can stay listed alive for a while, so counting nodes is not enough)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            self.wait_nodes(1, timeout)
            if keys <= {k for n in ray.nodes() if n["Alive"] for k in n["Resources"]}:
                return
            time.sleep(0.3)
        raise RuntimeError(f"no live nodes advertise {sorted(keys)} after {timeout} s")

    def kill(self, p: subprocess.Popen[bytes]) -> None:
        """Takes one node down: its whole process group (raylet, workers), SIGKILL."""
        self.killed.add(p.pid)
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            pass

    def stop(self) -> None:
        if ray is not None and ray.is_initialized():
            ray.shutdown()
        for p in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
            self.kill(p)


def register_npu(name: str = "npu0", cores: int = 2, links: Mapping[str, int] | None = None,
                 time_scale: float = 0.0) -> None:
    """An Orchestrator's ``process_initializer`` for cluster tests: registers the simulated
    NPU device in the actor's process (devices registered in the driver don't exist there)."""
    from orchestra.backends.npu_sim import NpuDevice, get_device, register_device

    try:
        get_device(name)
    except Exception:  # noqa: BLE001 - not registered in this process yet
        register_device(NpuDevice(name, cores=cores, links=dict(links or {}), time_scale=time_scale))
