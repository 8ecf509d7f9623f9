"""Cameras that follow their nodes on a REAL local Ray cluster (``ray start`` on 127.0.0.1):
a node killed mid-run and started again gets its camera back (restarted on the new node id,
frames of both tries counted exactly), and with ``[cluster] wait_for_nodes`` a camera whose
node is not there at the start runs once that node joins.

Skipped when Ray (the ``ray`` extra) is not importable. The module's cluster (a head wired to
camera front, node b to camera rear) is killed at the end."""

from __future__ import annotations

import io
import json
import os
import pathlib
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from _ray_cluster import RayCluster
from orchestra.config import load_config

try:
    import ray
except ImportError:  # the ray extra is not installed
    ray = None

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODEL = ROOT / "examples" / "models" / "convnet_npu.pte"
HEAD = {"camera.front": 1, "npu0.core.0": 1, "node.edge-a": 1}
EDGE_B = {"camera.rear": 1, "npu0.core.1": 1, "node.edge-b": 1}
EDGE_C = {"camera.side": 1, "npu0.core.1": 1}  # joins during the elastic test only

pytestmark = [pytest.mark.timeout(120), pytest.mark.skipif(ray is None, reason="needs Ray (pip install 'orchestra[ray]')")]


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="orc-rayel-", dir="/tmp"))  # Ray's socket paths must stay short
    c = RayCluster(tmp)
    try:
        c.start(HEAD, head=True)
        c.wait_nodes(1)
        c.start(EDGE_B, head=False)
        c.wait_resources(set(EDGE_B))
        ray.shutdown()  # the tests connect as orchestra does
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the jobs' work functions, by value
        yield c
    finally:
        c.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _config(tmp: pathlib.Path, address: str, second: str, *, duration: float, extra: str = "") -> pathlib.Path:
    """front on the head (30 frames at 20 fps), ``second`` on NPU core 1 (50 fps until the run
    ends, its results in SECOND.jsonl)."""
    text = f"""
[program]
name = "convnet"
path = {json.dumps(str(MODEL))}

[device.npu0]
kind = "npu_sim"
cores = 2
links = {{ front = 0, {second} = 1 }}
time_scale = 0

[[camera]]
name = "front"
source = {{ kind = "synthetic", fps = 20, count = 30, seed = 1 }}
bind = {{ "npu0.core" = 0 }}
drop = "block"
node = "edge-a"

[[camera]]
name = "{second}"
source = {{ kind = "synthetic", fps = 50, seed = 2 }}
bind = {{ "npu0.core" = 1 }}
drop = "block"
sink = {{ kind = "jsonl", path = {json.dumps(str(tmp / f"{second}.jsonl"))} }}

[run]
duration_s = {duration}
engine_period_s = 0.2

[cluster]
address = "{address}"
{extra}
"""
    path = tmp / f"{second}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _in_background(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def go() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            out.append(exc)

    t = threading.Thread(target=go)
    t.start()
    return t, out


def _result(t: threading.Thread, out: list[Any], timeout: float) -> Any:
    t.join(timeout)
    assert not t.is_alive(), "the cluster run did not end"
    (r,) = out
    if isinstance(r, BaseException):
        raise r
    return r


def _lines(path: pathlib.Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _holder(address: str, resource: str, not_: str | None = None, timeout: float = 60.0) -> str:
    """The id of the one live node advertising ``resource`` (other than ``not_``: a killed node
    can stay listed alive for a while)."""
    ray.init(address=address, logging_level="ERROR", log_to_driver=False, configure_logging=False)
    try:
        t0 = time.monotonic()
        while True:
            ids = [n["NodeID"] for n in ray.nodes() if n["Alive"] and resource in n["Resources"]]
            if len(ids) == 1 and ids[0] != not_:
                return ids[0]
            assert time.monotonic() - t0 < timeout, f"live nodes with {resource}: {ids}"
            time.sleep(0.3)
    finally:
        ray.shutdown()


def _dies_first(payload: tuple[str, float | None], report: Callable[[Any], None]) -> Any:
    """A job's work: reports, then kills its own actor's process the first time (the marker
    file is not there yet); the next time returns what it was given."""
    marker, seconds = payload
    report({"front": (5, 4, 0, 0)})
    if not os.path.exists(marker):
        open(marker, "w").close()  # noqa: SIM115 - a marker
        time.sleep(0.5)  # the report reaches the driver
        os._exit(1)
    return "second try", seconds


def _always_dies(payload: Any, report: Callable[[Any], None]) -> Any:
    os._exit(1)


def _again(payload: tuple[str, float | None], seconds_left: float | None) -> tuple[str, float | None]:
    return payload[0], seconds_left


def test_a_job_whose_actor_dies_is_started_again_while_the_run_lasts(cluster: RayCluster,
                                                                    tmp_path: pathlib.Path) -> None:
    """run_jobs: an actor that dies is replaced (here on the same live node) with the payload
    its resume gives for the time left; without resume it is not; one that always dies is
    started again until the run ends, then reported with every lost try."""
    from orchestra.cluster import CameraJob, run_jobs

    marker = str(tmp_path / "died")
    jobs = [CameraJob("front", {"camera.front": 1.0}, _dies_first, (marker, 10.0), resume=_again),
            CameraJob("rear", {"camera.rear": 1.0}, _dies_first, (str(tmp_path / "rear-died"), 10.0))]
    front, rear = run_jobs(jobs, cluster.address, duration_s=10)
    assert front.ok and front.restarts == 1, (front.error, front.earlier)
    (lost,) = front.earlier
    assert lost.error.startswith("its actor died") and lost.progress == {"front": (5, 4, 0, 0)}
    assert lost.node_id == front.node_id == _holder(cluster.address, "camera.front")
    assert front.value[0] == "second try" and 0 < front.value[1] < 10  # the time left, not the whole run
    assert front.started_s >= lost.ended_s > 0
    assert not rear.ok and rear.restarts == 0 and rear.error.startswith("its actor died")
    assert rear.progress == {"front": (5, 4, 0, 0)}

    (r,) = run_jobs([CameraJob("front", {"camera.front": 1.0}, _always_dies, ("", None), resume=_again)],
                    cluster.address, duration_s=4)
    assert not r.ok and r.error.startswith("its actor died") and r.restarts >= 1
    assert all(e.error.startswith("its actor died") for e in r.earlier)
    assert r.ended_s is not None and r.ended_s < 4 + 30  # ended after the run's time, not in a loop
    assert not ray.is_initialized()


def test_a_node_that_comes_back_gets_its_camera_again(cluster: RayCluster, tmp_path: pathlib.Path) -> None:
    """Node b is killed while camera rear runs on it and started again at once: rear is
    restarted on the new node (a new node id) for the rest of the run; the frames of its lost
    try (its last reported counts, in flight counted as failed) plus the new try's add up
    exactly, and the new try's policy decisions reach the driver with the new node."""
    import structlog

    from orchestra._run import (
        RunOptions,
        cluster_decisions,
        cluster_rows,
        cluster_summary_dict,
        render_cluster_summary,
        run_cluster,
    )

    extra = """
[[policy]]
use = "battery"
params = { low = 20, high = 30, low_options = { NpuSimBackend = { power_mode = "low" } }, normal_options = { NpuSimBackend = { power_mode = "balanced" } } }

[[signal]]
use = "scripted"
params = { timeline = [[0, { "battery.percent" = 90 }], [0.5, { "battery.percent" = 15 }]] }
"""
    cfg = load_config(_config(tmp_path, cluster.address, "rear", duration=20, extra=extra))
    old = _holder(cluster.address, "camera.rear")
    statuses: list[Any] = []
    with structlog.testing.capture_logs() as logs:
        t, out = _in_background(lambda: run_cluster(cfg, RunOptions(duration_s=20), out=io.StringIO(),
                                                    on_status=statuses.append))
        t0 = time.monotonic()
        while _lines(tmp_path / "rear.jsonl") < 40:  # rear has run on node b for ~0.8 s
            assert time.monotonic() - t0 < 40 and t.is_alive(), f"the rear camera never wrote a result: {out}"
            time.sleep(0.1)
        node_b = cluster.procs[1]
        cluster.kill(node_b)
        cluster.procs.remove(node_b)
        cluster.start(EDGE_B, head=False)
        r = _result(t, out, 60)
    new = _holder(cluster.address, "camera.rear", not_=old)
    front, rear = r.runs
    assert front.error is None and front.restarts == 0 and front.counts == (30, 30, 0, 0)

    assert rear.restarts == 1, (rear.error, rear.earlier)
    (lost,) = rear.earlier
    assert lost.node_id == old and lost.summary is None and lost.error.startswith("its actor died"), lost
    assert lost.lost is not None, "node b never reported its counts"
    p1, done1, failed1, dropped1, flight1 = lost.lost
    assert done1 >= 40 and failed1 == 0 and p1 == done1 + failed1 + dropped1 + flight1
    # the new try: on the new node, for the rest of the run, its own accounting ok
    assert rear.node_id == new != old and rear.error is None, rear.error
    assert rear.started_s is not None and lost.ended_s is not None and rear.started_s >= lost.ended_s
    s = rear.summary
    assert s["ended_by"] != "sources ended" and s["cameras"][0]["accounting"] == "ok", s
    cam = s["cameras"][0]
    p2, done2, failed2, dropped2 = cam["produced"], cam["processed"], cam["failed"], sum(cam["dropped"].values())
    assert done2 >= 1 and failed2 == 0 and p2 == done2 + dropped2
    assert s["instances"][0]["executes"] == done2
    # both tries counted exactly
    assert rear.counts == (p1 + p2, done1 + done2, failed1 + flight1 + failed2, dropped1 + dropped2)
    assert rear.accounting == "ok after 1 restart"
    expected = [f"rear: {flight1} frame{'s' if flight1 != 1 else ''} in flight counted as failed when node "
                f"{old[:8]} was lost at {lost.ended_s:.1f} s (restarted); {done1} processed before"] if flight1 else []
    assert r.problems == expected and r.exit_code == (1 if flight1 else 0)

    # decisions: the new try's policy ran on the new node
    lows = [d for d in cluster_decisions(r) if d["camera"] == "rear" and d["value"] == "low"]
    assert lows and all(d["node_id"] == new for d in lows), cluster_decisions(r)
    assert s["instances"][0]["options"]["NpuSimBackend"]["power_mode"] == "low"

    text = render_cluster_summary(r)
    row = next(x for x in text.splitlines() if x.strip().startswith("rear") and "after 1 restart" in x)
    assert row.split()[1] == new[:12]
    assert row.split()[3:7] == [str(p1 + p2), str(done1 + done2), str(failed1 + flight1 + failed2),
                                str(dropped1 + dropped2)], row
    assert (f"  rear: node {old[:12]} lost at {lost.ended_s:.1f} s ({done1} processed, {flight1} in flight counted "
            f"as failed); restarted on node {new[:12]} at {rear.started_s:.1f} s") in text.splitlines(), text

    # --summary-json: every try of rear, where and when it ran, its frames
    doc = json.loads(json.dumps(cluster_summary_dict(r), allow_nan=False))
    f_doc, r_doc = doc["cameras"]
    assert f_doc["restarts"] == 0 and f_doc["waited_s"] == 0 and len(f_doc["segments"]) == 1
    assert f_doc["segments"][0]["counts"] == {"produced": 30, "processed": 30, "failed": 0, "dropped": 0,
                                              "in_flight_failed": 0}
    assert r_doc["restarts"] == 1 and r_doc["node_id"] == new and r_doc["accounting"] == "ok after 1 restart"
    assert r_doc["counts"] == dict(zip(("produced", "processed", "failed", "dropped"), rear.counts))
    seg1, seg2 = r_doc["segments"]
    assert (seg1["node_id"], seg1["started_s"], seg1["ended_s"]) == (old, lost.started_s, lost.ended_s)
    assert seg1["error"].startswith("its actor died") and seg1["counts"] == {
        "produced": p1, "processed": done1, "failed": failed1 + flight1, "dropped": dropped1, "in_flight_failed": flight1}
    assert (seg2["node_id"], seg2["started_s"], seg2["error"]) == (new, rear.started_s, None)
    assert seg2["counts"] == {"produced": p2, "processed": done2, "failed": failed2, "dropped": dropped2,
                              "in_flight_failed": 0}
    assert seg1["ended_s"] <= seg2["started_s"] < seg2["ended_s"]

    # the live view: rear ran on node b, was seen lost and restarting, then ran on the new node; the
    # last status adds both tries up as the summary does
    rear_states = [(j.state, j.node_id, j.restarts) for s in statuses for j in s.jobs if j.camera == "rear"]
    assert ("running", old, 0) in rear_states and ("running", new, 1) in rear_states, rear_states
    assert any(state == "lost, restarting" for state, _, _ in rear_states), rear_states
    assert rear_states.index(("running", new, 1)) > rear_states.index(("running", old, 0))
    final = {x.camera: x for x in cluster_rows(statuses[-1])}
    assert statuses[-1].done and final["rear"].state == "done" and final["rear"].restarts == 1
    assert (final["rear"].produced, final["rear"].processed, final["rear"].failed,
            sum(final["rear"].dropped.values())) == rear.counts

    restarted = [x for x in logs if x["event"] == "camera restarted"]
    assert [(x["camera"], x["node"], x["lost_node"], x["restarts"]) for x in restarted] == [("rear", new, old, 1)]
    assert any(x["event"].startswith("camera lost its node") and x["camera"] == "rear" and x["node"] == old
               for x in logs), logs


def test_a_camera_waits_for_its_node_to_join(cluster: RayCluster, tmp_path: pathlib.Path) -> None:
    """Camera side's node (camera.side, npu0.core.1) is not in the cluster at the start:
    without wait_for_nodes the run is refused; with it, side waits ("waiting for a node"),
    fails the run if its node never joins, and runs on node c once node c joins."""
    import structlog

    from orchestra._run import RunOptions, render_cluster_summary, run_cluster
    from orchestra.cluster import PlacementError

    with pytest.raises(PlacementError, match=r"camera 'side' needs Ray resources camera.side=1, npu0.core.1=1: no "
                                             r"node advertises camera.side"):
        run_cluster(load_config(_config(tmp_path, cluster.address, "side", duration=3)), RunOptions(duration_s=3))

    # nobody joins: front runs, side never starts and says why
    cfg = load_config(_config(tmp_path, cluster.address, "side", duration=3, extra="wait_for_nodes = true"))
    assert cfg.cluster is not None and cfg.cluster.wait_for_nodes
    with structlog.testing.capture_logs() as logs:
        r = run_cluster(cfg, RunOptions(duration_s=3))
    front, side = r.runs
    assert front.error is None and front.counts == (30, 30, 0, 0)
    assert side.node_id is None and side.summary is None and side.never_started
    assert side.error == "waiting for a node: no live node advertised camera.side within the run's 3 s"
    assert side.counts == (0, 0, 0, 0) and side.accounting == "none (never started)"
    assert r.problems == [f"side: {side.error}"] and r.exit_code == 1
    waiting = [x for x in logs if x["event"] == "camera waiting for a node"]
    assert [(x["camera"], x["missing"]) for x in waiting] == [("side", ["camera.side"])]
    text = render_cluster_summary(r)
    assert "never started" in next(x for x in text.splitlines() if x.strip().startswith("side"))

    # node c joins 2 s into the run: side starts there and runs to the end
    t, out = _in_background(lambda: run_cluster(cfg, RunOptions(duration_s=15)))
    time.sleep(2)
    assert t.is_alive() and not _lines(tmp_path / "side.jsonl")
    cluster.start(EDGE_C, head=False)
    r = _result(t, out, 60)
    node_c = _holder(cluster.address, "camera.side")
    front, side = r.runs
    assert side.node_id == node_c and side.error is None, side.error
    assert side.restarts == 0 and side.started_s is not None and side.started_s >= 2
    cam = side.summary["cameras"][0]
    assert cam["processed"] >= 1 and cam["accounting"] == "ok" and cam["failed"] == 0
    assert side.summary["result"] == "ok" and r.exit_code == 0, r.problems
    # it ran for the time the run had left, not a whole run of its own
    assert side.summary["ended_by"] == "duration" and side.summary["elapsed_s"] < 14, side.summary["elapsed_s"]
    assert front.node_id != node_c and front.counts == (30, 30, 0, 0)
    assert _lines(tmp_path / "side.jsonl") == cam["processed"]
    text = render_cluster_summary(r)
    assert f"  side: waited {side.started_s:.1f} s for a node; started on node {node_c[:12]}" in text.splitlines(), text
