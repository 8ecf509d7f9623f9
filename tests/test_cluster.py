"""orchestra across a REAL local Ray cluster: a head and a second node started with
``ray start`` on 127.0.0.1, each advertising its own cameras and NPU cores as Ray custom
resources; a two-camera config runs with each camera's pipeline on the node wired to it.

Skipped when Ray (the ``ray`` extra) is not importable. The cluster is started once per
session and its process groups are killed at the end."""

from __future__ import annotations

import io
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import pytest

from _pty import run_in_pty
from _ray_cluster import RayCluster, free_port
from orchestra.cluster import CameraJob, NodeInfo, PlacementError, camera_resources, check_placement
from orchestra.config import load_config, validate_config

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODEL = ROOT / "examples" / "models" / "convnet_npu.pte"
FRAMES = 30
EDGE_B = {"camera.rear": 1, "npu0.core.1": 1, "node.edge-b": 1}

try:
    import ray
except ImportError:  # the ray extra is not installed: only the tests that need no cluster run
    ray = None

pytestmark = pytest.mark.timeout(120)
needs_ray = pytest.mark.skipif(ray is None, reason="needs Ray (pip install 'orchestra[ray]')")


@pytest.fixture(scope="session")
def cluster() -> Iterator[RayCluster]:
    if ray is None:  # every test using the cluster skips, marked needs_ray or not
        pytest.skip("needs Ray (pip install 'orchestra[ray]')")
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="orc-ray-", dir="/tmp"))  # Ray's socket paths must stay short
    c = RayCluster(tmp)
    try:
        c.start({"camera.front": 1, "npu0.core.0": 1, "node.edge-a": 1}, head=True)
        c.wait_nodes(1)
        c.start(EDGE_B, head=False)
        c.wait_nodes(2)
        ray.shutdown()  # the tests connect as orchestra does
        yield c
    finally:
        c.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _config(tmp: pathlib.Path, *, rear: str = "rear", extra: str = "") -> pathlib.Path:
    text = f"""
[program]
name = "convnet"
path = {json.dumps(str(MODEL))}

[device.npu0]
kind = "npu_sim"
cores = 2
links = {{ front = 0, {rear} = 1 }}
time_scale = 0

[[camera]]
name = "front"
source = {{ kind = "synthetic", fps = 300, count = {FRAMES}, seed = 1 }}
bind = {{ "npu0.core" = 0 }}
drop = "block"
node = "edge-a"

[[camera]]
name = "{rear}"
source = {{ kind = "synthetic", fps = 300, count = {FRAMES}, seed = 2 }}
bind = {{ "npu0.core" = 1 }}
drop = "block"

[run]
duration_s = 30

{extra}
"""
    path = tmp / "cluster.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _node_ids(address: str, timeout: float = 60.0) -> dict[str, str]:
    """camera resource -> node id, from Ray's own view of the cluster. A node killed by an
    earlier test can stay listed alive (with its cameras) for a while after its replacement
    joined, so this waits until every camera is held by exactly one live node."""
    ray.init(address=address, logging_level="ERROR", log_to_driver=False, configure_logging=False)
    try:
        t0 = time.monotonic()
        while True:
            held: dict[str, list[str]] = {}
            for n in ray.nodes():
                if n["Alive"]:
                    for k in n["Resources"]:
                        if k.startswith("camera."):
                            held.setdefault(k, []).append(n["NodeID"])
            if all(len(v) == 1 for v in held.values()):
                return {k: v[0] for k, v in held.items()}
            assert time.monotonic() - t0 < timeout, f"cameras held by several live nodes: {held}"
            time.sleep(0.3)
    finally:
        ray.shutdown()


# -- config --------------------------------------------------------------------------------


def test_cluster_table_and_node_key_are_checked(tmp_path: pathlib.Path) -> None:
    path = _config(tmp_path, extra='[cluster]\naddress = "no address"\ntimeout_s = 0\nport = 1\n'
                                   'wait_for_node = true\nwait_for_nodes = "yes"\n')
    assert validate_config(path) == [
        "cluster.port: unknown key (known keys: address, timeout_s, wait_for_nodes)",
        "cluster.wait_for_node: unknown key (known keys: address, timeout_s, wait_for_nodes); did you mean "
        "'wait_for_nodes'?",
        'cluster.address: "no address" is not a Ray address: use "auto", "HOST:PORT" (a head node) or '
        '"ray://HOST:PORT"',
        "cluster.timeout_s: must be a positive number, got 0",
        'cluster.wait_for_nodes: must be true or false, got "yes"',
    ]
    cfg = load_config(_config(tmp_path))  # node without [cluster]: a warning
    assert cfg.cluster is None
    assert cfg.cameras[0].node == "edge-a"
    assert "camera[0].node: has no effect without a [cluster] table (the cameras run on this machine)" in cfg.warnings
    cfg = load_config(_config(tmp_path, extra='[cluster]\naddress = "ray://10.0.0.1:10001"\n'))
    assert cfg.cluster is not None and cfg.cluster.address == "ray://10.0.0.1:10001"
    assert cfg.cluster.wait_for_nodes is False
    cfg = load_config(_config(tmp_path, extra='[cluster]\nwait_for_nodes = true\n'))
    assert cfg.cluster is not None and cfg.cluster.wait_for_nodes is True


def test_without_a_cluster_table_ray_is_never_imported(tmp_path: pathlib.Path) -> None:
    path = _config(tmp_path)
    code = ("import sys, orchestra.cluster, orchestra._run\n"
            "from orchestra.config import load_config\n"
            "from orchestra._run import RunOptions, run\n"
            f"r = run(load_config({str(path)!r}), RunOptions(duration_s=30))\n"
            "assert r.exit_code == 0, r.problems\n"
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines()[-1] == "[]"


# -- placement, without a cluster ------------------------------------------------------------


def test_an_impossible_binding_names_the_resource_and_every_node() -> None:
    nodes = [NodeInfo("aaaaaaaa11", "10.0.0.1", {"CPU": 1.0, "camera.front": 1.0, "npu0.core.0": 1.0, "memory": 5.0}),
             NodeInfo("bbbbbbbb22", "10.0.0.2", {"CPU": 1.0, "camera.rear": 1.0, "npu0.core.1": 1.0})]
    job = CameraJob("rear", camera_resources("rear", ("npu0", 0)), print)
    with pytest.raises(PlacementError) as e:
        check_placement([job], nodes)
    assert str(e.value).startswith(
        "camera 'rear' needs Ray resources camera.rear=1, npu0.core.0=1: no node has them all (nodes: "
        "node aaaaaaaa (10.0.0.1): CPU=1, camera.front=1, npu0.core.0=1; "
        "node bbbbbbbb (10.0.0.2): CPU=1, camera.rear=1, npu0.core.1=1)")
    with pytest.raises(PlacementError, match=r"camera 'side' needs Ray resources camera.side=1: no node advertises "
                                             r"camera.side \(nodes: "):
        check_placement([CameraJob("side", camera_resources("side"), print)], nodes)
    two = [CameraJob("a", {"npu0.core.0": 1.0}, print), CameraJob("b", {"npu0.core.0": 1.0}, print)]
    with pytest.raises(PlacementError, match=r"camera 'b' needs Ray resources npu0.core.0=1: no node has them all "
                                             r"free \(taken by camera a\)"):
        check_placement(two, nodes)
    assert check_placement([CameraJob("front", camera_resources("front", ("npu0", 0)), print), job.__class__(
        "rear", camera_resources("rear", ("npu0", 1)), print)], nodes) == {"front": "aaaaaaaa11", "rear": "bbbbbbbb22"}


@needs_ray
def test_an_address_nobody_listens_on_fails_at_once(tmp_path: pathlib.Path) -> None:
    from orchestra._run import RunOptions, run_cluster
    from orchestra.cluster import ClusterError

    port = free_port()
    cfg = load_config(_config(tmp_path, extra=f'[cluster]\naddress = "127.0.0.1:{port}"\n'))
    with pytest.raises(ClusterError, match=rf"can't connect to the Ray cluster at '127.0.0.1:{port}': .*refused.* "
                                           rf"\(is its head node started\? ray start --head --port {port}\)"):
        run_cluster(cfg, RunOptions(duration_s=30))
    assert not ray.is_initialized()


def test_batches_cannot_run_on_a_cluster_yet(tmp_path: pathlib.Path) -> None:
    path = _config(tmp_path, extra='[cluster]\n\n[[batch]]\ncameras = ["front", "rear"]\n')
    assert "cluster: can't run [[batch]] tables on a cluster yet (a batch's cameras may sit on different nodes): " \
           "remove [cluster] or the [[batch]] tables" in validate_config(path)


# -- a real cluster --------------------------------------------------------------------------


@needs_ray
def test_each_camera_runs_on_the_node_wired_to_it(cluster: RayCluster, tmp_path: pathlib.Path) -> None:
    from orchestra._run import RunOptions, render_cluster_summary, run_cluster

    cfg = load_config(_config(tmp_path, extra=f'[cluster]\naddress = "{cluster.address}"\n'))
    r = run_cluster(cfg, RunOptions(duration_s=30))
    assert [x.camera for x in r.runs] == ["front", "rear"]
    where = _node_ids(cluster.address)
    assert r.runs[0].node_id == where["camera.front"]
    assert r.runs[1].node_id == where["camera.rear"]
    assert where["camera.front"] != where["camera.rear"]
    assert r.runs[0].resources == {"camera.front": 1.0, "npu0.core.0": 1.0, "node.edge-a": 0.01}
    assert r.runs[1].resources == {"camera.rear": 1.0, "npu0.core.1": 1.0}
    for x in r.runs:
        assert x.error is None, x.error
        s = x.summary
        assert s["result"] == "ok" and s["ended_by"] == "sources ended", s
        (cam,) = s["cameras"]
        assert cam["name"] == x.camera
        assert (cam["produced"], cam["processed"], cam["failed"], sum(cam["dropped"].values())) == (FRAMES, FRAMES, 0, 0)
        assert cam["accounting"] == "ok"
        assert sum(s["executions"][x.camera].values()) == FRAMES
        (inst,) = s["instances"]
        assert inst["executes"] == FRAMES and inst["failures"] == 0 and inst["options"]["NpuSimBackend"]["core"] == \
            (0 if x.camera == "front" else 1)
        assert s["pid"] != os.getpid()
    assert r.exit_code == 0
    text = render_cluster_summary(r)
    assert f"on the Ray cluster at {cluster.address}: 2 cameras on 2 nodes" in text
    assert "problems" not in text


@needs_ray
def test_a_binding_no_node_has_fails_before_running(cluster: RayCluster, tmp_path: pathlib.Path) -> None:
    from orchestra._run import RunOptions, run_cluster

    cfg = load_config(_config(tmp_path, rear="side", extra=f'[cluster]\naddress = "{cluster.address}"\n'))
    with pytest.raises(PlacementError) as e:
        run_cluster(cfg, RunOptions(duration_s=30))
    msg = str(e.value)
    assert msg.startswith("camera 'side' needs Ray resources camera.side=1, npu0.core.1=1: no node advertises "
                          "camera.side (nodes: node "), msg
    assert "camera.front=1" in msg and "camera.rear=1" in msg and "npu0.core.1=1" in msg, msg
    assert not ray.is_initialized()


@needs_ray
def test_orchestra_run_uses_the_cluster_table(cluster: RayCluster, tmp_path: pathlib.Path) -> None:
    path = _config(tmp_path, extra=f'[cluster]\naddress = "{cluster.address}"\n')
    summary = tmp_path / "summary.json"
    env = dict(os.environ, RAY_DISABLE_USAGE_STATS="1")
    r = subprocess.run([sys.executable, "-m", "orchestra", "run", str(path), "--summary-json", str(summary)],
                       capture_output=True, text=True, timeout=90, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"orchestra run cluster.toml on the Ray cluster at {cluster.address}: 2 cameras on 2 nodes" in r.stdout
    doc = json.loads(summary.read_text())
    where = _node_ids(cluster.address)
    assert [(c["camera"], c["node_id"]) for c in doc["cameras"]] == [("front", where["camera.front"]),
                                                                    ("rear", where["camera.rear"])]
    assert [c["summary"]["cameras"][0]["processed"] for c in doc["cameras"]] == [FRAMES, FRAMES]
    assert doc["exit_code"] == 0 and doc["problems"] == []
    bad = _config(tmp_path, rear="side", extra=f'[cluster]\naddress = "{cluster.address}"\n')
    r = subprocess.run([sys.executable, "-m", "orchestra", "run", str(bad)], capture_output=True, text=True,
                       timeout=90, env=env)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "orchestra: camera 'side' needs Ray resources camera.side=1, npu0.core.1=1: no node advertises" in r.stderr


@needs_ray
def test_a_node_that_dies_fails_its_camera_and_the_other_runs_on(cluster: RayCluster, tmp_path: pathlib.Path) -> None:
    """The second node's process group (raylet, its workers) is killed while its camera runs
    and does not come back before the run ends: that camera is reported failed, naming its
    dead actor; the head's camera completes with exact accounting. The node is started again
    afterwards (the session's cluster)."""
    import threading

    from orchestra._run import RunOptions, render_cluster_summary, run_cluster

    text = _config(tmp_path, extra=f'[cluster]\naddress = "{cluster.address}"\n').read_text()
    text = text.replace(f'fps = 300, count = {FRAMES}, seed = 2 }}',
                        'fps = 50, seed = 2 }\nsink = { kind = "jsonl", path = "rear.jsonl" }')
    text = text.replace(f'fps = 300, count = {FRAMES}, seed = 1 }}', f'fps = 20, count = {FRAMES}, seed = 1 }}')
    path = tmp_path / "death.toml"
    path.write_text(text, encoding="utf-8")
    cfg = load_config(path)
    out: list = []
    def go() -> None:
        try:
            out.append(run_cluster(cfg, RunOptions(duration_s=10)))
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            out.append(exc)

    t = threading.Thread(target=go)
    t0 = time.monotonic()
    t.start()
    sink = tmp_path / "rear.jsonl"
    while not (sink.exists() and sink.read_bytes().count(b"\n") >= 40):  # rear has run on node b for ~0.8 s
        assert time.monotonic() - t0 < 40 and t.is_alive(), "the rear camera never wrote a result"
        time.sleep(0.1)
    node_b = cluster.procs[1]
    try:
        cluster.kill(node_b)
        t.join(60)
        assert not t.is_alive()
        (r,) = out
        if isinstance(r, BaseException):
            raise r
        front, rear = r.runs
        assert rear.error is not None and rear.summary is None
        assert rear.error.startswith("its actor died"), rear.error
        assert rear.restarts == 0  # node b did not come back before the run ended: not restarted
        assert front.error is None
        cam = front.summary["cameras"][0]
        assert (cam["produced"], cam["processed"], cam["accounting"]) == (FRAMES, FRAMES, "ok")
        assert r.exit_code == 1 and r.problems[0].startswith("rear: its actor died")
        # what node b reported last closes its camera's accounting: frames in flight count as failed
        assert rear.lost is not None, "node b never reported its counts"
        produced, processed, failed, dropped, in_flight = rear.lost
        assert processed >= 1 and failed == 0 and in_flight >= 0
        assert produced == processed + failed + dropped + in_flight
        assert rear.accounting == "closed (node lost)"
        assert f"frame{'s' if in_flight != 1 else ''} in flight counted as failed; {processed} processed before" \
            in r.problems[0]
        line = next(x for x in render_cluster_summary(r).splitlines() if x.strip().startswith("rear"))
        assert line.split()[3:7] == [str(produced), str(processed), str(failed + in_flight), str(dropped)], line
        assert "closed (node lost)" in line
    finally:
        cluster.procs.remove(node_b)
        cluster.start(EDGE_B, head=False)
        dead = out[0].runs[1].node_id if out and not isinstance(out[0], BaseException) else None
        t0 = time.monotonic()
        while True:  # only the new node holds camera.rear (the dead one may stay listed alive for a while)
            alive = cluster.wait_nodes(2)
            rear_nodes = [n["NodeID"] for n in alive if "camera.rear" in n["Resources"]]
            if len(rear_nodes) == 1 and rear_nodes != [dead]:
                break
            assert time.monotonic() - t0 < 60, "node b did not come back"
            time.sleep(0.3)
        ray.shutdown()


def _policy_config(tmp: pathlib.Path, address: str) -> pathlib.Path:
    """Two cameras on two nodes, the battery policy everywhere, a battery signal on edge-b only."""
    text = f"""
[program]
name = "convnet"
path = {json.dumps(str(MODEL))}

[device.npu0]
kind = "npu_sim"
cores = 2
links = {{ front = 0, rear = 1 }}
time_scale = 0

[[camera]]
name = "front"
source = {{ kind = "synthetic", fps = 50, seed = 1 }}
bind = {{ "npu0.core" = 0 }}
node = "edge-a"

[[camera]]
name = "rear"
source = {{ kind = "synthetic", fps = 50, seed = 2 }}
bind = {{ "npu0.core" = 1 }}
node = "edge-b"

[[policy]]
use = "battery"
params = {{ low = 20, high = 30, low_options = {{ NpuSimBackend = {{ power_mode = "low" }} }}, normal_options = {{ NpuSimBackend = {{ power_mode = "balanced" }} }} }}

[[signal]]
use = "scripted"
node = "edge-b"
params = {{ timeline = [[0, {{ "battery.percent" = 90 }}], [1, {{ "battery.percent" = 15 }}]] }}

[run]
duration_s = 3
engine_period_s = 0.2

[cluster]
address = "{address}"
"""
    path = tmp / "policy.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_policy_acting_on_one_node_only(cluster: RayCluster, tmp_path: pathlib.Path) -> None:
    import urllib.request

    from orchestra._run import RunOptions, cluster_decisions, cluster_summary_dict, render_cluster_summary, run_cluster
    from orchestra.cluster import ClusterStatus

    cfg = load_config(_policy_config(tmp_path, cluster.address))
    assert cfg.signals[0].node == "edge-b" and cfg.policies[0].node is None
    port = free_port()
    scraped: dict[str, str] = {}

    def scrape(status: ClusterStatus) -> None:  # the driver's metrics server, while both cameras run
        if "metrics" not in scraped and status.elapsed_s > 1.5 and all(j.state == "running" for j in status.jobs):
            for path in ("metrics", "status", "readyz"):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/{path}", timeout=5) as resp:
                    scraped[path] = resp.read().decode()

    r = run_cluster(cfg, RunOptions(duration_s=3, metrics_port=port), on_status=scrape)
    assert r.exit_code == 0, r.problems
    front, rear = r.runs
    where = _node_ids(cluster.address)
    assert (front.node_id, rear.node_id) == (where["camera.front"], where["camera.rear"])
    # one metrics endpoint for every node's cameras, each labelled with its node
    assert r.metrics_url == f"http://127.0.0.1:{port}/metrics" and f"metrics: {r.metrics_url}" in render_cluster_summary(r)
    assert cluster_summary_dict(r)["metrics_url"] == r.metrics_url
    m = scraped["metrics"]
    for cam, run_ in (("front", front), ("rear", rear)):
        assert (f'orchestra_camera_node_info{{address="{run_.address}",camera="{cam}",node="{run_.node_id}",'
                f'state="running"}} 1.0') in m
        line = next(x for x in m.splitlines() if x.startswith(f'orchestra_frames_processed_total{{camera="{cam}"}}'))
        assert float(line.split()[-1]) > 0
    assert scraped["readyz"] == "ready\n"
    doc = json.loads(scraped["status"])
    assert doc["ready"] and [(c["name"], c["node"], c["state"]) for c in doc["cameras"]] == [
        ("front", front.node_id, "running"), ("rear", rear.node_id, "running")]
    assert front.summary["signals"] == {} and rear.summary["signals"]["battery.percent"] == 15
    # rear (edge-b) switched to low after its battery dropped at ~1 s; front (edge-a) never did
    rear_modes = [(d["what"], d["previous"], d["value"]) for d in rear.summary["decisions"] if d["source"] == "policy"]
    assert ("NpuSimBackend.power_mode", "balanced", "low") in rear_modes, rear.summary["decisions"]
    switch = next(d for d in rear.summary["decisions"] if d["value"] == "low")
    assert 0.8 <= switch["t_s"] <= 2.5, switch
    assert not any(d["value"] == "low" for d in front.summary["decisions"]), front.summary["decisions"]
    assert front.summary["instances"][0]["options"]["NpuSimBackend"]["power_mode"] == "balanced"
    assert rear.summary["instances"][0]["options"]["NpuSimBackend"]["power_mode"] == "low"
    rear_sets = rear.summary["executions"]["rear"]
    assert any("power_mode=low" in k and n > 0 for k, n in rear_sets.items()), rear_sets
    assert any("power_mode=balanced" in k and n > 0 for k, n in rear_sets.items()), rear_sets
    assert all("power_mode=low" not in k for k in front.summary["executions"]["front"]), front.summary["executions"]
    # the driver gets them, with the node each was taken on
    decs = cluster_decisions(r)
    assert any(d["camera"] == "rear" and d["node_id"] == rear.node_id and d["value"] == "low" for d in decs)
    text = render_cluster_summary(r)
    line = next(x for x in text.splitlines() if "balanced -> low" in x)
    assert line.split()[:2] == ["rear", rear.node_id[:12]], text
    # orchestra run prints them per camera with its node; --summary-json lists them
    summary = tmp_path / "summary.json"
    env = dict(os.environ, RAY_DISABLE_USAGE_STATS="1")
    report = tmp_path / "report.html"
    p = subprocess.run([sys.executable, "-m", "orchestra", "run", str(cfg.path), "--summary-json", str(summary),
                        "--report", str(report)], capture_output=True, text=True, timeout=90, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(x for x in p.stdout.splitlines() if "balanced -> low" in x)
    assert line.split()[:2] == ["rear", rear.node_id[:12]], p.stdout
    doc = json.loads(summary.read_text())
    lows = [d for d in doc["decisions"] if d["value"] == "low"]
    assert lows and all(d["camera"] == "rear" and d["node_id"] == rear.node_id for d in lows), doc["decisions"]
    # --report: every node's cameras over time (labelled CAMERA@NODE), the decisions with their node
    html_ = report.read_text()
    assert f"report: {report}" in p.stderr
    assert "on the Ray cluster at" in html_ and "2 cameras on 2 nodes" in html_
    for cam in ("front", "rear"):
        node = next(c["node_id"] for c in doc["cameras"] if c["camera"] == cam)
        assert f"{cam}@{node[:8]}" in html_ and f"<tr><td>{cam}</td><td>{node[:12]}</td>" in html_
    assert html_.count('<tr class="decision"') == len(doc["decisions"]) and "balanced -&gt; low" in html_
    assert html_.count("<svg") == 3  # frame rate, p50, p95


# -- the live view -----------------------------------------------------------------------------


def _slow_config(tmp: pathlib.Path, address: str) -> pathlib.Path:
    """front: 30 frames at 20 fps (1.5 s); rear: 50 fps until the run ends."""
    text = _config(tmp, extra=f'[cluster]\naddress = "{address}"\n').read_text()
    text = text.replace(f'fps = 300, count = {FRAMES}, seed = 2 }}', 'fps = 50, seed = 2 }')
    text = text.replace(f'fps = 300, count = {FRAMES}, seed = 1 }}', f'fps = 20, count = {FRAMES}, seed = 1 }}')
    path = tmp / "live.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _snap(produced: int, processed: int, failed: int = 0, dropped: dict | None = None, fps: float = 20.0) -> dict:
    return {"produced": produced, "processed": processed, "failed": failed, "dropped": dropped or {},
            "in_fps": fps, "out_fps": fps, "p50_s": 0.004, "p95_s": 0.009, "queue": [0, 4], "state": "running",
            "decisions": 1}


def test_the_cluster_dashboard_adds_up_every_try_and_keeps_camera_and_node() -> None:
    """Without Ray: rows from a status (a lost try's frames in flight count as failed, as in
    the summary) drawn as the local dashboard draws its table; a narrow terminal keeps the
    camera and its node."""
    from orchestra._run import ClusterScreen, _ClusterDashboard, cluster_rows
    from orchestra.cluster import ClusterStatus, JobStatus

    status = ClusterStatus(4.2, 10.0, (
        JobStatus("front", "running", "aaaaaaaa11", "10.0.0.1", 0, 0.0, {"front": _snap(80, 78, dropped={"evicted": 1})}),
        JobStatus("rear", "lost, restarting", "bbbbbbbb22", "10.0.0.2", 1, None, None,
                  ({"rear": _snap(50, 40, 1, {"evicted": 2, "deadline": 0})},)),
        JobStatus("side", "waiting for a node"),
    ))
    front, rear, side = cluster_rows(status)
    assert (front.produced, front.processed, front.failed, dict(front.dropped)) == (80, 78, 0, {"evicted": 1})
    assert (front.input_fps, front.p50, front.decisions) == (20.0, 0.004, 1)
    # rear's lost try: 50 produced = 40 processed + 1 failed + 2 dropped + 7 in flight (failed now)
    assert (rear.produced, rear.processed, rear.failed, dict(rear.dropped)) == (50, 40, 8, {"evicted": 2, "deadline": 0})
    assert rear.input_fps is None and rear.restarts == 1 and rear.node_id == "bbbbbbbb22"
    assert (side.produced, side.node_id, side.state) == (0, None, "waiting for a node")

    screen = ClusterScreen(title="orchestra run c.toml on 10.0.0.1:6379", elapsed=4.2, duration=10.0, state="running",
                           cameras=(), decisions=(), rows=[front, rear, side])
    dash = _ClusterDashboard(io.StringIO())
    text = dash.render_text(screen, width=160, height=20)
    lines = text.splitlines()
    assert lines[0].startswith("orchestra run c.toml on 10.0.0.1:6379    4.2s / 10s  running")
    assert lines[1].split() == ["camera", "node", "address", "state", "in", "fps", "out", "fps", "p50", "ms", "p95",
                                "ms", "produced", "processed", "failed", "drops", "decisions"]
    row = {x.split()[0]: x for x in lines[2:]}
    assert row["front"].split() == ["front", "aaaaaaaa", "10.0.0.1", "running", "20.0", "20.0", "4.0", "9.0", "80", "78",
                                    "0", "evicted", "1", "1"]
    assert row["rear"].split() == ["rear", "bbbbbbbb", "10.0.0.2", "lost,", "restarting", "(1", "restart)", "-", "-",
                                   "-", "-", "50", "40", "8", "evicted", "2", "0"]  # decisions: this try's
    assert row["side"].split()[:5] == ["side", "-", "-", "waiting", "for"]
    assert row["total"].split()[:3] == ["total", "2", "nodes"]
    narrow = dash.render_text(screen, width=40, height=20).splitlines()
    assert narrow[1].split()[:2] == ["camera", "node"] and all(len(x) <= 40 for x in narrow)
    assert narrow[3].split()[:2] == ["front", "aaaaaaaa"], narrow


@needs_ray
def test_the_status_callback_sees_every_camera_on_its_node(cluster: RayCluster, tmp_path: pathlib.Path) -> None:
    """run_cluster's on_status: about once a second, both cameras with their node and counts
    that only grow, the last (done) equal to the summary's; off a terminal a status line."""
    from orchestra._run import RunOptions, cluster_rows, run_cluster

    cfg = load_config(_slow_config(tmp_path, cluster.address))
    statuses: list = []
    out = io.StringIO()
    r = run_cluster(cfg, RunOptions(duration_s=3, status_interval_s=1.0), out=out, on_status=statuses.append)
    assert r.exit_code == 0, r.problems
    where = _node_ids(cluster.address)
    nodes = {"front": where["camera.front"], "rear": where["camera.rear"]}
    assert len(statuses) >= 3 and statuses[-1].done and not any(s.done for s in statuses[:-1])
    seen_running = set()
    rated = set()
    last: dict[str, tuple[int, int, int, int]] = {}
    grew = set()
    for s in statuses:
        assert [j.camera for j in s.jobs] == ["front", "rear"]
        for row in cluster_rows(s):
            if row.state == "running":
                seen_running.add(row.camera)
                assert row.node_id == nodes[row.camera] and row.address, row
                if row.input_fps is not None:  # once its node reported
                    assert row.output_fps is not None and row.p50 is not None
                    rated.add(row.camera)
            counts = (row.produced, row.processed, row.failed, sum(row.dropped.values()))
            before = last.get(row.camera, (0, 0, 0, 0))
            assert all(a >= b for a, b in zip(counts, before)), (row.camera, before, counts)
            if before != (0, 0, 0, 0) and counts != before:
                grew.add(row.camera)
            last[row.camera] = counts
    assert seen_running == rated == {"front", "rear"}
    assert "rear" in grew  # seen part-way, then more
    final = {row.camera: row for row in cluster_rows(statuses[-1])}
    for run_ in r.runs:
        row = final[run_.camera]
        assert row.state == "done" and row.node_id == run_.node_id == nodes[run_.camera]
        assert (row.produced, row.processed, row.failed, sum(row.dropped.values())) == run_.counts
        assert row.processed == run_.summary["cameras"][0]["processed"] >= 1
    assert final["front"].processed == FRAMES
    assert statuses[-1].elapsed_s >= 2.5 and statuses[-1].duration_s == 3
    lines = [x for x in out.getvalue().splitlines() if x.startswith("[")]
    assert any(f"front@{nodes['front'][:8]} " in x and f"rear@{nodes['rear'][:8]} running" in x for x in lines), lines


def _run_in_pty(args: list[str], cols: int = 160, rows: int = 40, timeout: float = 90) -> tuple[int, str]:
    """``args`` with stdout and stderr on a pseudo-terminal of ``cols`` x ``rows``: its exit
    status and everything it wrote, escape sequences removed."""
    import re

    rc, chunks = run_in_pty(args, cols, rows, cwd=ROOT, timeout=timeout, env={"RAY_DISABLE_USAGE_STATS": "1"})
    raw = b"".join(c for _, c in chunks)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07", "", raw.decode("utf-8", "replace"))
    return rc, text.replace("\r", "\n")


@needs_ray
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX ptys")
def test_orchestra_run_on_a_terminal_shows_one_dashboard_of_every_node(cluster: RayCluster,
                                                                        tmp_path: pathlib.Path) -> None:
    path = _slow_config(tmp_path, cluster.address)
    rc, text = _run_in_pty([sys.executable, "-m", "orchestra", "run", str(path), "--duration", "3"])
    assert rc == 0, text[-3000:]
    where = _node_ids(cluster.address)
    summary_at = text.index(f"orchestra run live.toml on the Ray cluster at {cluster.address}")
    live = text[:summary_at]  # the dashboard's frames (the summary names the nodes too)
    assert f"orchestra run live.toml on {cluster.address}" in live, live[-3000:]
    header = next(x for x in live.splitlines() if "processed" in x and "out fps" in x)
    assert header.split()[:3] == ["camera", "node", "address"], header
    for cam in ("front", "rear"):
        node = where[f"camera.{cam}"][:8]
        assert any(x.split()[:2] == [cam, node] and x.split()[3] == "running" for x in live.splitlines()), live[-3000:]
    assert "camera placed" in text  # log lines come out above the live area, not lost


@needs_ray
def test_ctrl_c_stops_a_cluster_run_without_a_duration(cluster: RayCluster, tmp_path: pathlib.Path) -> None:
    """Off a terminal (status lines), a run with no duration ends on SIGINT within a few
    seconds: exit 130, its actors stopped (the next run gets the same cameras)."""
    import signal

    text = _slow_config(tmp_path, cluster.address).read_text().replace("duration_s = 30\n", "")
    path = tmp_path / "forever.toml"
    path.write_text(text, encoding="utf-8")
    env = dict(os.environ, RAY_DISABLE_USAGE_STATS="1")
    p = subprocess.Popen([sys.executable, "-m", "orchestra", "run", str(path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    try:
        t0 = time.monotonic()
        line = ""
        while "rear@" not in line or " running " not in line:  # a status line: both cameras placed
            line = p.stdout.readline()
            assert line or p.poll() is None, p.stderr.read()[-3000:]
            assert time.monotonic() - t0 < 60, "no status line"
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    err = p.stderr.read()
    assert rc == 130, err[-3000:]
    assert "orchestra: interrupted (SIGINT): the cameras' actors were stopped; no summary" in err
    # the cameras' resources are free again: a run with a duration places both
    r = subprocess.run([sys.executable, "-m", "orchestra", "run", str(_slow_config(tmp_path, cluster.address)),
                        "--duration", "1"], capture_output=True, text=True, timeout=90, env=env)
    assert r.returncode == 0, r.stderr[-3000:]


def test_a_node_named_by_its_ray_label() -> None:
    """``node = "NAME"`` matches a node with the custom resource node.NAME or, where no node
    advertises it, the Ray node label orchestra-node=NAME (asked for as a label selector)."""
    from orchestra.cluster import NODE_LABEL, label_selector

    labelled = NodeInfo("cccccccc33", "10.0.0.3", {"CPU": 1.0, "camera.east": 1.0}, {NODE_LABEL: "edge-c"})
    other = NodeInfo("dddddddd44", "10.0.0.4", {"CPU": 1.0, "camera.east": 1.0})
    job = CameraJob("east", camera_resources("east", node="edge-c"), print)
    assert check_placement([job], [other, labelled]) == {"east": "cccccccc33"}
    assert label_selector(job, [other, labelled]) == ({"camera.east": 1.0}, {NODE_LABEL: "edge-c"})
    by_resource = NodeInfo("eeeeeeee55", "10.0.0.5", {"camera.east": 1.0, "node.edge-c": 1.0})
    assert label_selector(job, [labelled, by_resource]) == (dict(job.resources), None)  # the resource wins
    with pytest.raises(PlacementError, match=r"no node advertises node.edge-c .*--labels orchestra-node=edge-c"):
        check_placement([job], [other])


def test_a_cpu_binding_asks_for_the_nodes_cpu_resources_where_nodes_offer_them() -> None:
    """bind = { cpu = [0, 1] } asks Ray for cpu.0 and cpu.1 (one camera per CPU across the
    cluster's cameras on a node) where nodes advertise cpu.N; on a cluster that offers none the
    camera's node pins them itself, as before."""
    from orchestra.cluster import for_nodes

    job = CameraJob("east", camera_resources("east", cpu_set=(0, 1)), print)
    assert job.resources == {"camera.east": 1.0, "cpu.0": 1.0, "cpu.1": 1.0}
    offers = [NodeInfo("aaaaaaaa11", "10.0.0.1", {"camera.east": 1.0, "cpu.0": 1.0, "cpu.1": 1.0, "cpu.2": 1.0})]
    plain = [NodeInfo("bbbbbbbb22", "10.0.0.2", {"camera.east": 1.0, "CPU": 4.0})]
    assert for_nodes(job, offers) is job
    assert for_nodes(job, plain).resources == {"camera.east": 1.0}
    assert check_placement([for_nodes(job, plain)], plain) == {"east": "bbbbbbbb22"}
    two = [job, CameraJob("west", camera_resources("west", cpu_set=(1,)), print)]
    offers2 = [NodeInfo("aaaaaaaa11", "10.0.0.1", {"camera.east": 1.0, "camera.west": 1.0, "cpu.0": 1.0, "cpu.1": 1.0})]
    with pytest.raises(PlacementError, match=r"camera 'west' needs Ray resources camera.west=1, cpu.1=1: no node has "
                                             r"them all free \(taken by camera east\)"):
        check_placement(two, offers2)


@needs_ray
def test_a_camera_runs_on_the_node_labelled_with_its_name(cluster: RayCluster, tmp_path: pathlib.Path) -> None:
    """A third node started with --labels orchestra-node=edge-c (and no node.edge-c resource)
    gets the camera whose config says node = "edge-c"; taken down afterwards."""
    from orchestra._run import RunOptions, run_cluster

    p = cluster.start({"camera.east": 1, "npu0.core.1": 1}, head=False, labels={"orchestra-node": "edge-c"})
    try:
        cluster.wait_resources({"camera.east"})
        labelled = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and "camera.east" in n["Resources"])
        assert ray.nodes() and dict(next(n for n in ray.nodes() if n["NodeID"] == labelled)["Labels"])[
            "orchestra-node"] == "edge-c"
        ray.shutdown()
        text = _config(tmp_path, rear="east", extra=f'[cluster]\naddress = "{cluster.address}"\n')
        text_path = tmp_path / "labels.toml"
        text_path.write_text(text.read_text().replace('name = "east"\n', 'name = "east"\nnode = "edge-c"\n'),
                             encoding="utf-8")
        cfg = load_config(text_path)
        assert [c.node for c in cfg.cameras] == ["edge-a", "edge-c"]
        r = run_cluster(cfg, RunOptions(duration_s=None))
        assert r.exit_code == 0, r.problems
        front, east = r.runs
        assert east.node_id == labelled and front.node_id != labelled
        assert east.resources == {"camera.east": 1.0, "npu0.core.1": 1.0, "node.edge-c": 0.01}
    finally:
        cluster.procs.remove(p)
        cluster.kill(p)
        if ray.is_initialized():
            ray.shutdown()
