"""``orchestra run --metrics-port``: scraped over real HTTP while real cameras run, parsed by
``prometheus_client``'s own parser (histograms included); /healthz, /readyz, /status."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

ROOT = pathlib.Path(__file__).resolve().parent.parent
CAMERAS = ROOT / "examples" / "cameras.toml"
MODEL = ROOT / "examples" / "models" / "convnet_npu.pte"
NAMES = ("front", "rear", "left", "right")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals")


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONIOENCODING="utf-8", NO_COLOR="1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode("utf-8")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode("utf-8")


def _families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_metrics_parse_with_prometheus_client_histograms_included() -> None:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "orchestra", "run", str(CAMERAS), "--duration", "4", "--no-dashboard",
                             "--metrics-port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            encoding="utf-8", env=_env(), cwd=ROOT)
    text = status = None
    health = None
    ctype = ""
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                code, ctype, body = _get(f"{base}/metrics")
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
                continue
            fams = _families(body)
            fam = fams.get("orchestra_frame_latency_seconds")
            counts = {s.labels["camera"]: s.value for s in fam.samples if s.name.endswith("_count")} if fam else {}
            if code == 200 and len(counts) == 4 and all(v >= 5 for v in counts.values()):
                text = body
                health = _get(f"{base}/healthz")[0]
                status = json.loads(_get(f"{base}/status")[2])
                missing = _get(f"{base}/nope")[0]
                break
            time.sleep(0.2)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out + err
    assert text is not None, "never scraped histograms with frames on every camera"
    assert ctype.startswith("text/plain; version=")
    assert health == 200 and missing == 404
    fams = _families(text)
    assert fams["orchestra_frames_processed"].type == "counter"
    processed = {s.labels["camera"]: s.value for s in fams["orchestra_frames_processed"].samples
                 if s.name == "orchestra_frames_processed_total"}
    assert set(processed) == set(NAMES) and all(v > 0 for v in processed.values())
    for name, label in (("orchestra_frame_latency_seconds", "camera"), ("orchestra_execute_latency_seconds", "instance")):
        fam = fams[name]
        assert fam.type == "histogram", name
        for cam in NAMES:
            samples = [s for s in fam.samples if s.labels.get(label) == cam]
            buckets = [(float(s.labels["le"]), s.value) for s in samples if s.name == name + "_bucket"]
            count = next(s.value for s in samples if s.name == name + "_count")
            total = next(s.value for s in samples if s.name == name + "_sum")
            les = [le for le, _ in buckets]
            assert les == sorted(les) and les[-1] == float("inf"), les
            values = [v for _, v in buckets]
            assert values == sorted(values), values  # cumulative
            assert values[-1] == count > 0 and total > 0
            assert 0 < total / count < 5.0  # seconds: a mean latency, not milliseconds
    # no quantile gauges any more
    assert not any("quantile" in s.labels for f in fams.values() for s in f.samples)  # type: ignore[attr-defined]
    # energy per camera and power mode (npu_sim model)
    # caller mistakes are counted apart from failures (none here)
    for name in ("orchestra_instance_failures", "orchestra_instance_rejected"):
        assert fams[name].type == "counter"
        assert {x.labels["instance"]: x.value for x in fams[name].samples if x.name == name + "_total"} == \
            dict.fromkeys(NAMES, 0.0), name
    energy = [s for s in fams["orchestra_energy_joules"].samples if s.name == "orchestra_energy_joules_total"]
    assert {s.labels["camera"] for s in energy} == set(NAMES)
    assert all(s.value > 0 and s.labels["power_mode"] in ("balanced", "low") for s in energy)
    info = [s for s in fams["orchestra_backend_option_info"].samples if s.labels["option"] == "power_mode"]
    assert {s.labels["instance"] for s in info} == set(NAMES)
    # /status: what the summary shows
    assert status is not None and status["ready"] is True and status["state"] == "running"
    assert [c["name"] for c in status["cameras"]] == list(NAMES)
    assert all(c["processed"] > 0 and c["energy_joules"] > 0 for c in status["cameras"])
    assert set(status["executions"]) == set(NAMES)
    assert f"metrics: http://127.0.0.1:{port}/metrics" in out


SLOW = """
[program]
name = "convnet"
path = MODEL

[device.npu0]
kind = "npu_sim"
cores = 1
links = { a = 0 }
time_scale = 40000.0        # a job holds the core ~0.2 s: draining a full queue takes seconds

[[camera]]
name = "a"
source = { kind = "synthetic", fps = 50, shape = [1, 3, 16, 16], seed = 1 }
bind = { camera_link = "npu0" }
queue = 8
drop = "block"
"""


def test_readyz_flips_to_503_when_the_run_stops(tmp_path: pathlib.Path) -> None:
    """ready while the cameras run; 503 ("stopping") while a Ctrl-C drains the queues;
    /healthz stays 200 throughout."""
    cfg = tmp_path / "slow.toml"
    cfg.write_text(SLOW.replace("MODEL", json.dumps(str(MODEL))), encoding="utf-8")
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    summary = tmp_path / "summary.json"
    proc = subprocess.Popen([sys.executable, "-m", "orchestra", "run", str(cfg), "--duration", "60", "--no-dashboard",
                             "--metrics-port", str(port), "--summary-json", str(summary)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            encoding="utf-8", env=_env(), cwd=ROOT)
    seen: list[tuple[int, str]] = []
    health: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                code, _, body = _get(f"{base}/readyz")
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.05)
                continue
            seen.append((code, body.strip()))
            if code == 200:
                break
            time.sleep(0.05)
        assert seen and seen[-1][0] == 200, seen
        time.sleep(1.0)  # the queue fills up
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                code, _, body = _get(f"{base}/readyz")
                health.append(_get(f"{base}/healthz")[0])
            except (urllib.error.URLError, ConnectionError):
                break  # the run ended and the server with it
            seen.append((code, body.strip()))
            if code == 503:
                break
            time.sleep(0.05)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    before = [s for s in seen if s[0] != 200][:1]
    assert all(code == 503 and body.startswith("not ready: ") for code, body in before), seen  # loading, if caught
    assert seen[-1] == (503, "not ready: stopping"), seen
    assert health and set(health) == {200}
    # the JSON summary is written after an interrupted run too
    doc = json.loads(summary.read_text(encoding="utf-8"))
    assert (doc["result"], doc["interrupted_by"], doc["drained"], doc["exit_code"]) == ("interrupted", "SIGINT", True, 130)
    assert doc["cameras"][0]["accounting"] == "ok" and doc["cameras"][0]["dropped"]["shutdown"] == 0


def test_a_server_without_a_snapshot_is_alive_but_not_ready() -> None:
    from orchestra._metrics_http import MetricsServer, new_registry

    registry, collector = new_registry()
    with MetricsServer(registry, collector) as server:
        base = f"http://127.0.0.1:{server.port}"
        assert _get(f"{base}/healthz")[:1] == (200,)
        assert _get(f"{base}/readyz")[0::2] == (503, "not ready: loading\n")
        assert json.loads(_get(f"{base}/status")[2]) == {"ready": False, "state": "loading"}
        assert _get(f"{base}/metrics")[2] == ""  # nothing published yet
        req = urllib.request.Request(f"{base}/metrics", data=b"x", method="POST")
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(req, timeout=5)
        assert exc.value.code == 405
    # its own registry: nothing of orchestra's in the process-global one
    from prometheus_client import REGISTRY, generate_latest

    assert b"orchestra_" not in generate_latest(REGISTRY)


def test_histogram_exposition_counts_by_le() -> None:
    """A published snapshot is rendered from the server's own thread (no event loop here at
    all): buckets are cumulative and ``le`` is an upper bound."""
    from orchestra._metrics_http import MetricsServer, MetricsSnapshot, new_registry
    from orchestra.telemetry import Histogram

    registry, collector = new_registry()
    h = Histogram()
    for v in (0.002, 0.004, 0.2):
        h.observe(v)
    collector.publish(MetricsSnapshot(uptime_s=1.0, ready=True, not_ready_reason="", frame_latency={"cam": h.snapshot()}))
    with MetricsServer(registry, collector) as server:
        code, _, text = _get(f"http://127.0.0.1:{server.port}/metrics")
    assert code == 200
    fam = _families(text)["orchestra_frame_latency_seconds"]
    count = next(s.value for s in fam.samples if s.name.endswith("_count"))
    le_5ms = next(s.value for s in fam.samples if s.name.endswith("_bucket") and s.labels["le"] == "0.005")
    assert (count, le_5ms) == (3, 2)
