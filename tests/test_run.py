"""``orchestra run``: the real command as a subprocess (and once under a pseudo-terminal).

Every test runs real cameras on a simulated NPU for a few seconds; none asserts on
wall-clock time beyond "it ended".
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
CAMERAS = EXAMPLES / "cameras.toml"
MODEL = EXAMPLES / "models" / "convnet_npu.pte"
NAMES = ("front", "rear", "left", "right")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals and ptys")


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONIOENCODING="utf-8", NO_COLOR="1")


def _orchestra(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestra", *args], capture_output=True, text=True,
                          encoding="utf-8", env=_env(), cwd=ROOT, timeout=timeout)


def _cameras_table(out: str) -> dict[str, dict[str, object]]:
    """The summary's camera table: name -> produced, processed, dropped (by reason), failed, accounting."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("camera") and "produced" in line)
    head = re.split(r"\s{2,}", lines[start].strip())
    rows = {}
    for line in lines[start + 1:]:
        if not line.strip():
            break
        cells = dict(zip(head, re.split(r"\s{2,}", line.strip())))
        if cells["camera"] == "total":
            continue
        dropped = {} if cells["dropped"] == "0" else {
            k: int(v) for k, v in (part.rsplit(" ", 1) for part in cells["dropped"].split(", "))}
        rows[cells["camera"]] = {"produced": int(cells["produced"]), "processed": int(cells["processed"]),
                                 "failed": int(cells["failed"]), "dropped": dropped,
                                 "accounting": line.split()[-1]}
    return rows


def _executions(out: str) -> dict[str, dict[str, int]]:
    """The summary's "executions per option set": camera -> option set -> executes."""
    lines = out.splitlines()
    start = lines.index("executions per option set")
    found = {}
    for line in lines[start + 1:]:
        if not line.strip():
            break
        cam, rest = line.strip().split(None, 1)
        found[cam] = {label: int(n) for label, n in re.findall(r"([^,]+?): (\d+)(?:, |$)", rest)}
    return found


def _check_accounting(out: str, names: tuple[str, ...] = NAMES) -> dict[str, dict[str, object]]:
    table = _cameras_table(out)
    assert set(table) == set(names), table
    for cam, row in table.items():
        dropped = sum(row["dropped"].values())  # type: ignore[union-attr]
        assert row["produced"] == row["processed"] + row["failed"] + dropped, (cam, row)
        assert row["accounting"] == "ok", (cam, row)
    assert "accounting: produced = processed + dropped + failed for every camera" in out
    return table


def _instance_rows(out: str) -> dict[str, dict[str, str]]:
    """The summary's "instances" table: instance name -> {column header: cell}."""
    lines = out.splitlines()
    start = lines.index("instances")
    head = re.split(r"\s{2,}", lines[start + 1].strip())
    rows = {}
    for line in lines[start + 2:]:
        if not line.strip():
            break
        cells = dict(zip(head, re.split(r"\s{2,}", line.strip())))
        rows[cells["instance"]] = cells
    return rows


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(tmp_path: pathlib.Path, text: str) -> pathlib.Path:
    path = tmp_path / "run.toml"
    path.write_text(text.replace("MODEL", json.dumps(str(MODEL))), encoding="utf-8")
    return path


# -- the example: the battery switch shows in the summary ------------------------------------


def test_cameras_example_switches_power_mode_mid_run() -> None:
    r = _orchestra("run", str(CAMERAS), "--duration", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    out = r.stdout
    table = _check_accounting(out)
    assert all(row["processed"] > 0 for row in table.values())
    executions = _executions(out)
    assert set(executions) == set(NAMES)
    for cam, sets in executions.items():
        # the options each execute ran with: balanced before the battery dropped, low after
        assert sets.get("power_mode=balanced", 0) > 0, (cam, sets)
        assert sets.get("power_mode=low", 0) > 0, (cam, sets)
        assert sum(sets.values()) == table[cam]["processed"], (cam, sets, table[cam])
    # the decisions, with the policy and its reason
    decisions = [line for line in out.splitlines() if "NpuSimBackend.power_mode" in line]
    assert len(decisions) == 4
    assert all("balanced -> low" in d and "battery" in d and "battery.percent=15" in d for d in decisions)
    assert {n for d in decisions for n in NAMES if f" {n} " in d} == set(NAMES)
    assert "instances" in out and "restarts" in out
    assert out.rstrip().endswith("result: ok")
    # not a terminal: a status line instead of the dashboard, no ANSI codes
    assert "\x1b[" not in out
    # a status line every 2 s: its stamp is the run's elapsed time when it printed (>= 2.0 s;
    # how much later depends on the machine's load)
    stamps = [float(m) for m in re.findall(r"^\[\s*(\d+\.\d)s\] front ", out, re.M)]
    assert stamps and all(t >= 2.0 for t in stamps), stamps
    # logs went to stderr as console lines
    assert "backend option changed" in r.stderr


def test_the_main_job_runs_real_video_through_a_real_size_model_into_jsonl(tmp_path: pathlib.Path) -> None:
    """The README's main job (examples/street.toml): decoded video, pre-processed to 224x224,
    a 1000-class MobileNet-style program on the NPU cores, top-3 of every frame in one JSONL
    file the summary names; the battery policy's switch shows in the options of the lines."""
    pytest.importorskip("av", reason="the main job decodes video: the video extra (PyAV)")
    import shutil

    shutil.copytree(EXAMPLES, tmp_path / "examples")  # its results go to the copy's out/
    out_file = tmp_path / "examples" / "out" / "detections.jsonl"
    out_file.unlink(missing_ok=True)
    summary = tmp_path / "summary.json"
    r = _orchestra("run", str(tmp_path / "examples" / "street.toml"), "--duration", "4", "--summary-json", str(summary))
    assert r.returncode == 0, r.stdout + r.stderr
    table = _check_accounting(r.stdout)
    assert all(row["processed"] > 0 for row in table.values()), table
    assert f"{out_file} (jsonl): front, rear, left, right" in r.stdout
    lines = [json.loads(line) for line in out_file.read_text(encoding="utf-8").splitlines()]
    # one line per processed frame, none missing, none twice
    assert len(lines) == sum(row["processed"] for row in table.values())
    by_cam: dict[str, list[dict[str, object]]] = {}
    for rec in lines:
        by_cam.setdefault(rec["camera"], []).append(rec)
    for cam, recs in by_cam.items():
        assert len(recs) == table[cam]["processed"], cam
        assert len({rec["index"] for rec in recs}) == len(recs), cam
        pts = [rec["pts"] for rec in recs]
        assert all(b > a for a, b in zip(pts, pts[1:])), (cam, pts[:10])  # the video's own pts, across loops
        modes = [rec["options"]["NpuSimBackend"]["power_mode"] for rec in recs]
        # balanced before the battery dropped, low after: the option each frame really ran with
        assert modes[0] == "balanced" and modes[-1] == "low", (cam, modes)
        assert modes == sorted(modes, key=lambda m: m == "low"), cam
        for rec in recs:
            top = rec["value"]
            assert len(top) == 3 and all(0 <= t["index"] < 1000 for t in top), top
            assert top[0]["score"] >= top[1]["score"] >= top[2]["score"] > 0, top
    # front/rear at the file's 30 fps, left/right paced at 15 fps: twice as many frames
    assert table["front"]["produced"] > 1.5 * table["left"]["produced"], table
    data = json.loads(summary.read_text(encoding="utf-8"))
    assert data["result"] == "ok"


# (the dashboard in a pseudo-terminal: tests/test_dashboard.py)


# -- logs -------------------------------------------------------------------------------------


def test_json_logs_go_to_the_log_file(tmp_path: pathlib.Path) -> None:
    log = tmp_path / "run.jsonl"
    r = _orchestra("run", str(CAMERAS), "--duration", "3", "--no-dashboard", "--log-format", "json",
                   "--log-file", str(log))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr == ""  # everything went to the file
    events = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert events
    assert all({"event", "level", "timestamp"} <= set(e) for e in events)
    import datetime

    for e in events:  # timezone-aware ISO-8601 (with the UTC offset)
        stamp = datetime.datetime.fromisoformat(e["timestamp"])
        assert stamp.tzinfo is not None and stamp.utcoffset() is not None, e["timestamp"]
        assert re.search(r"[+-]\d\d:\d\d$", e["timestamp"]), e["timestamp"]
    names = [e["event"] for e in events]
    assert "orchestrator started" in names and "cameras running" in names and "orchestrator closed" in names
    changed = [e for e in events if e["event"] == "backend option changed"]
    assert {e["instance"] for e in changed} == set(NAMES)
    assert all(e["option"] == "power_mode" and e["value"] == "low" and e["policy"] == "battery" for e in changed)


# -- metrics ----------------------------------------------------------------------------------


# (the metrics endpoint, parsed by prometheus_client: tests/test_metrics.py)


# -- block mode loses nothing -------------------------------------------------------------------


BLOCK = """
[program]
name = "convnet"
path = MODEL

[device.npu0]
kind = "npu_sim"
cores = 2
links = { a = 0, b = 1 }
time_scale = 1.0

[[camera]]
name = "a"
source = { kind = "synthetic", fps = 250, shape = [1, 3, 16, 16], seed = 1 }
bind = { camera_link = "npu0" }
queue = 2
drop = "block"

[[camera]]
name = "b"
source = { kind = "synthetic", fps = 250, shape = [1, 3, 16, 16], seed = 2 }
bind = { "npu0.core" = 1 }
backend_options = { NpuSimBackend = { power_mode = "low" } }
queue = 2
drop = "block"

[run]
duration_s = 2
"""


def test_block_mode_loses_no_frame(tmp_path: pathlib.Path) -> None:
    r = _orchestra("run", str(_config(tmp_path, BLOCK)), "--no-dashboard")
    assert r.returncode == 0, r.stdout + r.stderr
    table = _check_accounting(r.stdout, ("a", "b"))
    for cam, row in table.items():
        assert row["processed"] == row["produced"] > 0, (cam, row)
        assert row["dropped"] == {} and row["failed"] == 0, (cam, row)


def test_metrics_scrapes_back_to_back_share_renders_and_lose_no_frame(tmp_path: pathlib.Path) -> None:
    """Four clients scraping /metrics as fast as they can: every scrape is answered (from the
    server's own thread, over the snapshots the run publishes twice a second whatever the
    scrapes), and block mode still loses nothing."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "orchestra", "run", str(_config(tmp_path, BLOCK)), "--no-dashboard",
                             "--metrics-port", str(port), "--duration", "3"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, encoding="utf-8", env=_env(), cwd=ROOT)
    answered = [0] * 4
    stop = threading.Event()

    def scrape(i: int) -> None:
        while not stop.is_set() and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                    if resp.status == 200 and b"orchestra_frames_processed_total" in resp.read():
                        answered[i] += 1
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.05)  # not listening yet, or going away

    threads = [threading.Thread(target=scrape, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
    for t in threads:
        t.join(10)
    assert proc.returncode == 0, out + err
    table = _check_accounting(out, ("a", "b"))
    for cam, row in table.items():
        assert row["processed"] == row["produced"] > 0 and row["dropped"] == {}, (cam, row)
    m = re.search(r"^metrics: \S+ \((\d+) scrapes?, (\d+) snapshots?\)$", out, re.M)
    assert m, out
    scrapes, snapshots = int(m.group(1)), int(m.group(2))
    elapsed = float(re.search(r"^orchestra run \S+: (\d+\.\d) s", out, re.M).group(1))  # type: ignore[union-attr]
    assert scrapes > 20 and sum(answered) > 20, (scrapes, answered)
    assert 1 <= snapshots <= 2 * elapsed + 3 < scrapes, (snapshots, scrapes, elapsed)


PROCESS = """
[program]
name = "convnet"
path = PLAIN

[[camera]]
name = "a"
source = { kind = "synthetic", fps = 200, shape = [1, 3, 16, 16], seed = 1, count = 60 }
drop = "block"
placement = "process"

[[camera]]
name = "b"
source = { kind = "synthetic", fps = 200, shape = [1, 3, 16, 16], seed = 2, count = 60 }
drop = "block"
placement = "process"
"""


def test_process_placement_from_the_config_runs_every_frame(tmp_path: pathlib.Path) -> None:
    cfg = _config(tmp_path, PROCESS.replace("PLAIN", json.dumps(str(EXAMPLES / "models" / "convnet.pte"))))
    r = _orchestra("run", str(cfg), "--no-dashboard")
    assert r.returncode == 0, r.stdout + r.stderr
    table = _check_accounting(r.stdout, ("a", "b"))
    for cam, row in table.items():
        assert row["processed"] == row["produced"] == 60 and row["failed"] == 0, (cam, row)


PROCESS_ENDLESS = """
[program]
name = "convnet"
path = PLAIN

[[camera]]
name = "a"
source = { kind = "synthetic", fps = 100, shape = [1, 3, 16, 16], seed = 1 }
placement = "process"

[[camera]]
name = "b"
source = { kind = "synthetic", fps = 100, shape = [1, 3, 16, 16], seed = 2 }
placement = "process"
"""


@pytest.mark.parametrize("when", ["running", "starting"])
def test_ctrl_c_on_the_process_group_reaches_only_the_parent(tmp_path: pathlib.Path, when: str) -> None:
    """The terminal sends Ctrl-C's SIGINT to the whole foreground process group, worker
    processes included: they must leave it to the parent (which drains, then closes them),
    neither failing frames with KeyboardInterrupt nor dying during start-up."""
    cfg = _config(tmp_path, PROCESS_ENDLESS.replace("PLAIN", json.dumps(str(EXAMPLES / "models" / "convnet.pte"))))
    proc = subprocess.Popen([sys.executable, "-m", "orchestra", "run", str(cfg), "--no-dashboard", "--duration", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="utf-8", env=_env(),
                            cwd=ROOT, start_new_session=True)  # its own process group, as a shell job is
    err_lines: list[str] = []
    seen = threading.Event()
    marker = "cameras running" if when == "running" else "orchestrator started"  # then workers spawn

    def read_err() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            err_lines.append(line)
            if marker in line or "cameras running" in line:
                seen.set()

    reader = threading.Thread(target=read_err, daemon=True)
    reader.start()
    try:
        if when == "running":
            assert seen.wait(60), "".join(err_lines)
            time.sleep(0.5)  # frames flowing through the worker processes
        else:
            assert seen.wait(60), "".join(err_lines)
            time.sleep(0.3)  # the worker processes are starting (importing, loading)
        os.killpg(proc.pid, signal.SIGINT)
        out = proc.stdout.read()  # type: ignore[union-attr]
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    reader.join(10)
    err = "".join(err_lines)
    assert rc == 130, out + err
    assert "Traceback" not in err and "KeyboardInterrupt" not in out + err, out + err
    table = _check_accounting(out, ("a", "b"))
    assert all(row["failed"] == 0 for row in table.values()), table
    assert "result: interrupted (SIGINT); queues drained" in out
    inst = _instance_rows(out)
    assert set(inst) == {"a", "b"}, out
    assert all(row["placement"] == "process" for row in inst.values()), inst
    assert all(row["failures"] == "0" and row["restarts"] == "0" for row in inst.values()), inst
    if when == "running":
        assert all(int(row["executes"]) > 0 for row in inst.values()), inst


# -- failures make the exit status 1 -----------------------------------------------------------


BADCAM = """
import time

import anyio
import numpy as np

from orchestra.pipeline import Frame


class BadCamera:
    \"\"\"Every third frame has the wrong shape: its execute fails (and is not retried).\"\"\"

    def __init__(self, name, fps=50.0, count=30):
        self.name, self.fps, self.count = name, fps, count

    async def frames(self):
        for i in range(self.count):
            shape = (1, 3, 8, 8) if i % 3 == 2 else (1, 3, 16, 16)
            yield Frame(self.name, i, np.zeros(shape, np.float32), time.monotonic())
            await anyio.sleep(1 / self.fps)
"""

FAILING = """
[program]
name = "convnet"
path = MODEL

[device.npu0]
kind = "npu_sim"
cores = 1
links = { a = 0 }

[[camera]]
name = "a"
source = { kind = "badcam_for_test_run:BadCamera", fps = 50, count = 30 }
bind = { "npu0.core" = 0 }
drop = "block"
"""


def test_frames_the_instance_rejects_are_noted_not_failures(tmp_path: pathlib.Path) -> None:
    """A camera whose every third frame has the wrong shape: the instance refuses those
    inputs (ExecuteRejectedError, the caller's mistake); the run says so and exits 0."""
    (tmp_path / "badcam_for_test_run.py").write_text(BADCAM, encoding="utf-8")
    path = _config(tmp_path, FAILING)
    env = dict(_env(), PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "orchestra", "run", str(path), "--no-dashboard"], capture_output=True,
                       text=True, encoding="utf-8", env=env, cwd=ROOT, timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    table = _check_accounting(r.stdout, ("a",))  # the source ended: every frame accounted for
    assert table["a"]["produced"] == 30 and table["a"]["processed"] == 20 and table["a"]["accounting"] == "ok"
    # counted apart from failures: dropped as "rejected" where the pipeline can drop a frame, else failed
    assert table["a"]["dropped"] == {"rejected": 10} or table["a"]["failed"] == 10, table["a"]
    # the summary's first line (status lines may come before it on a slow machine)
    assert any(line.startswith("orchestra run") and "(sources ended)" in line for line in r.stdout.splitlines())
    assert "result: ok" in r.stdout and "result: FAILED" not in r.stdout
    assert "note: a: 10 frames rejected by the instance, not a failure (last: " in r.stdout
    assert "does not fit" in r.stdout or "expected" in r.stdout
    inst = _instance_rows(r.stdout)["a"]
    assert inst["state"] in ("running", "paused") and inst["failures"] == "0", inst  # the instance: no failures


BROKEN_BACKEND = """
from orchestra.runtime import BackendInterface


class BrokenBackend(BackendInterface):
    \"\"\"Loads fine; every execute raises (a delegate whose hardware went away).\"\"\"

    def init(self, context, processed, compile_specs):
        return None

    def execute(self, context, handle, args):
        raise RuntimeError("accelerator lost")
"""

BROKEN = """
[program]
path = PTE

[[camera]]
name = "a"
source = { kind = "synthetic", fps = 100, shape = [3], dtype = "float32", count = 30 }
drop = "block"
"""


def test_an_instance_that_fails_permanently_exits_1(tmp_path: pathlib.Path) -> None:
    """A backend plugin (a real installed entry point) whose every execute raises: after
    RestartPolicy.unhealthy_after (5) failed executes in a row the instance restarts; after
    max_restarts (3) restarts it fails for good; the run says so, exits 1."""
    try:  # tests/ may or may not be a package
        from .test_interpreter import delegated
    except ImportError:
        from test_interpreter import delegated  # type: ignore[no-redef]
    from orchestra.program import dumps

    (tmp_path / "brokenbackend_for_test_run.py").write_text(BROKEN_BACKEND, encoding="utf-8")
    dist = tmp_path / "brokenbackend_for_test_run-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenbackend-for-test-run\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[orchestra.backends]\nBrokenBackend = brokenbackend_for_test_run:BrokenBackend\n")
    pte = tmp_path / "broken.pte"
    pte.write_bytes(dumps(delegated("BrokenBackend")))
    path = tmp_path / "run.toml"
    path.write_text(BROKEN.replace("PTE", json.dumps(str(pte))), encoding="utf-8")
    env = dict(_env(), PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "orchestra", "run", str(path), "--no-dashboard"], capture_output=True,
                       text=True, encoding="utf-8", env=env, cwd=ROOT, timeout=90)
    assert r.returncode == 1, r.stdout + r.stderr
    table = _check_accounting(r.stdout, ("a",))
    assert table["a"]["produced"] == 30 and table["a"]["processed"] == 0 and table["a"]["failed"] == 30, table
    inst = _instance_rows(r.stdout).get("a")
    assert inst is not None and inst["pool"] == "broken", r.stdout
    # state, executes, failures (5 per Method: 4 Methods), restarts (max_restarts 3)
    assert [inst[k] for k in ("state", "executes", "failures", "restarts")] == ["failed", "0", "20", "3"], inst
    assert "result: FAILED" in r.stdout
    assert re.search(r"^  instance a failed permanently: .*accelerator lost", r.stdout, re.M), r.stdout


FLOOD = """
import time

import numpy as np

from orchestra.pipeline import Frame


class Flood:
    \"\"\"A camera that never waits: every frame is ready at once (an fps no machine reaches).\"\"\"

    def __init__(self, name):
        self.name = name

    async def frames(self):
        data = np.zeros((1, 3, 16, 16), np.float32)
        i = 0
        while True:
            yield Frame(self.name, i, data, time.monotonic())
            i += 1
"""


@pytest.mark.parametrize("drop", ["drop_oldest"])  # both drop modes: tests/test_pipeline.py
def test_a_source_that_never_waits_still_lets_duration_end_the_run(tmp_path: pathlib.Path, drop: str) -> None:
    (tmp_path / "flood_for_test_run.py").write_text(FLOOD, encoding="utf-8")
    path = _config(tmp_path, PLAIN_CAMERA.replace("PLAIN", json.dumps(str(EXAMPLES / "models" / "convnet.pte")))
                   .replace("SOURCE", '{ kind = "flood_for_test_run:Flood" }').replace("DROP", drop))
    env = dict(_env(), PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "orchestra", "run", str(path), "--no-dashboard", "--duration", "1"],
                       capture_output=True, text=True, encoding="utf-8", env=env, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^orchestra run run\.toml: \d+\.\d s \(duration\)", r.stdout, re.M), r.stdout
    table = _check_accounting(r.stdout, ("a",))
    assert table["a"]["processed"] > 0 and sum(table["a"]["dropped"].values()) > 0, table


PLAIN_CAMERA = """
[program]
name = "convnet"
path = PLAIN

[[camera]]
name = "a"
source = SOURCE
drop = "DROP"
queue = 4
"""


# -- bad input ----------------------------------------------------------------------------------


BAD = """
[program]
path = MODEL

[device.npu0]
kind = "npu_sim"
cores = 2

[[camera]]
name = "front"
source = { kind = "synthetic", fps = 30 }
bind = { "npu0.core" = 7 }
drop = "sometimes"
"""


def test_invalid_config_exits_2_one_line_per_error(tmp_path: pathlib.Path) -> None:
    path = _config(tmp_path, BAD)
    r = _orchestra("run", str(path))
    assert r.returncode == 2
    assert r.stdout == ""
    assert "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 2, lines
    assert all(line.startswith(f"{path}: camera[0].") for line in lines), lines
    assert any("bind" in line and "core 7" in line for line in lines)
    assert any("drop" in line and "sometimes" in line for line in lines)
    # the same lines as `orchestra validate`
    assert _orchestra("validate", str(path)).stderr == r.stderr


@pytest.mark.parametrize("args", [("--duration", "0"), ("--duration", "soon"), ("--metrics-port", "70000"),
                                  ("--log-format", "xml")])
def test_bad_arguments_exit_2(args: tuple[str, ...]) -> None:
    from orchestra import _cli

    assert _cli.main(["run", str(CAMERAS), *args]) == 2


def test_missing_config_exits_2() -> None:
    r = _orchestra("run", "no/such/file.toml")
    assert r.returncode == 2
    assert r.stderr.splitlines() == ["no/such/file.toml: no such file"]


# -- Ctrl-C -------------------------------------------------------------------------------------


def test_ctrl_c_drains_and_exits_130() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "orchestra", "run", str(CAMERAS), "--duration", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="utf-8",
                            env=_env(), cwd=ROOT)
    t0 = time.monotonic()
    err_lines: list[str] = []
    running = threading.Event()

    def read_err() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            err_lines.append(line)
            if "cameras running" in line:
                running.set()

    reader = threading.Thread(target=read_err, daemon=True)
    reader.start()
    try:
        assert running.wait(60), "".join(err_lines)
        time.sleep(max(1.5 - (time.monotonic() - t0), 0.5))
        proc.send_signal(signal.SIGINT)
        out = proc.stdout.read()  # type: ignore[union-attr]
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    err = "".join(err_lines)
    assert rc == 130, out + err
    assert "Traceback" not in err
    assert "interrupted" in err
    assert "(interrupted)" in out.splitlines()[0]
    table = _check_accounting(out)
    assert all(row["processed"] > 0 for row in table.values())
    assert all(row["dropped"].get("shutdown", 0) == 0 for row in table.values())  # drained, not dropped
    assert "result: interrupted (SIGINT); queues drained" in out


# -- embedding ----------------------------------------------------------------------------------


def test_embed_example_runs() -> None:
    r = subprocess.run([sys.executable, str(EXAMPLES / "embed.py")], capture_output=True, text=True,
                       encoding="utf-8", env=_env(), cwd=ROOT, timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    for cam in ("front", "rear"):
        line = next(line for line in r.stdout.splitlines() if line.startswith(cam + " "))
        assert "npu0.core" in line and "balanced:" in line and "low:" in line, line
    assert "power_mode = 'low' <- battery" in r.stdout


# -- in-process, on plain asyncio -----------------------------------------------------------------


def test_run_in_process_on_plain_asyncio() -> None:
    import io

    from orchestra._run import RunOptions, render_summary, run
    from orchestra.config import load_config

    out = io.StringIO()
    result = run(load_config(CAMERAS), RunOptions(duration_s=1.0, use_uvloop=False, status_interval_s=0.4), out=out)
    assert result.loop == "asyncio"
    assert result.exit_code == 0, result.problems
    assert result.ended_by == "duration"
    assert [c.name for c in result.cameras] == list(NAMES)
    assert all(c.processed > 0 and c.produced == c.processed + c.failed + sum(c.dropped.values())
               for c in result.cameras)
    assert out.getvalue().startswith("[")  # status lines
    summary = render_summary(result)
    assert "executions per option set" in summary and summary.rstrip().endswith("result: ok")
    _check_accounting(summary)


FIRST_FRAME = """
import time

import numpy as np

from orchestra.pipeline import Frame

FIRST = []  # when the first frame was made (time.perf_counter)


class Paced:
    \"\"\"A camera at 50 fps that notes when its first frame was made.\"\"\"

    def __init__(self, name):
        self.name = name

    async def frames(self):
        import anyio

        data = np.zeros((1, 3, 16, 16), np.float32)
        i = 0
        while True:
            if not FIRST:
                FIRST.append(time.perf_counter())
            yield Frame(self.name, i, data, time.monotonic())
            i += 1
            await anyio.sleep(0.02)
"""


def test_the_collector_makes_its_full_pass_after_loading_before_the_first_frame(
        tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector's first full pass weighs the whole heap (200-450 ms with torch imported):
    the run makes it once the instances are loaded and before the first frame, not the
    collector in the middle of the cameras' first seconds."""
    import gc
    import importlib
    import io

    from orchestra._run import RunOptions, run
    from orchestra.config import load_config
    from orchestra.orchestrator import Orchestrator

    (tmp_path / "first_frame_for_test_run.py").write_text(FIRST_FRAME, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    source = importlib.import_module("first_frame_for_test_run")
    loaded: list[float] = []
    load = Orchestrator.load

    async def noted_load(self: Orchestrator, *args: object, **kwargs: object) -> object:
        pool = await load(self, *args, **kwargs)
        loaded.append(time.perf_counter())
        return pool

    monkeypatch.setattr(Orchestrator, "load", noted_load)
    full: list[float] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 2:
            full.append(time.perf_counter())

    path = _config(tmp_path, PLAIN_CAMERA.replace("PLAIN", json.dumps(str(EXAMPLES / "models" / "convnet.pte")))
                   .replace("SOURCE", '{ kind = "first_frame_for_test_run:Paced" }').replace("DROP", "drop_oldest"))
    gc.callbacks.append(note)
    try:
        result = run(load_config(path), RunOptions(duration_s=0.5, use_uvloop=False), out=io.StringIO())
    finally:
        gc.callbacks.remove(note)
    assert result.exit_code == 0, result.problems
    assert loaded and source.FIRST, (loaded, source.FIRST)
    assert any(loaded[-1] <= t <= source.FIRST[0] for t in full), (loaded, full, source.FIRST)


# -- names from a program (not a validated config) are escaped on the terminal ------------------


def test_the_live_view_escapes_control_characters_in_names() -> None:
    import io

    from orchestra._dashboard import CameraRow, Dashboard, Decision, Screen, StatusLine

    evil = "cam\x1b[2J\x00\nx"
    row = CameraRow(name=evil, state="running", drop="drop_oldest", input_fps=30.0, output_fps=30.0, p50=0.001,
                    p95=0.002, p99=0.003, produced=10, processed=10, failed=0, dropped={}, queue_depth=0,
                    queue_capacity=8, unit="unbound", options="")
    decision = Decision(0.5, time.time(), evil, "NpuSimBackend.power_mode", "low", "balanced", "battery", "low")
    screen = Screen(title="t", elapsed=1.0, duration=None, state="running", cameras=[row], decisions=[decision],
                    signals={}, info="")
    line = StatusLine.line(screen)
    assert "\x1b" not in line and "\n" not in line and "\x00" not in line
    assert "cam\\x1b[2J\\x00\\nx" in line
    out = io.StringIO()
    text = Dashboard(out).render_text(screen, 160, 40)
    assert "\x1b" not in text and "\x00" not in text
    assert text.count("cam\\x1b[2J\\x00\\nx") == 2  # the camera table and the decisions
    from orchestra._run import RunResult, render_summary
    from orchestra.config import load_config

    summary = render_summary(RunResult(load_config(CAMERAS), cameras=[row], executions={evil: [("(defaults)", 10)]},
                                       accounting={evil: "ok"}))
    assert "\x1b" not in summary and "\x00" not in summary
    assert summary.count("cam\\x1b[2J\\x00\\nx") == 2  # the camera table and the executions


@pytest.mark.parametrize("flag", ["--summary-json", "--report"])
def test_an_unwritable_output_path_exits_2_before_running(flag: str, tmp_path: pathlib.Path) -> None:
    r = _orchestra("run", str(CAMERAS), flag, str(tmp_path / "no" / "such" / "dir" / "out"), "--no-dashboard")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith(f"orchestra: {flag} ") and "no such directory" in r.stderr
    assert "cameras running" not in r.stderr  # refused before the cameras started
