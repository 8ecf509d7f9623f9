"""``orchestra bench``: the real command as a subprocess on a tiny committed config, and the
search and its criterion on plain numbers.

The subprocess runs use small targets (1 s per step, a few streams) so each ends in a few
seconds; nothing asserts on wall-clock time, only on what the command printed and its status.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys

import pytest

from orchestra._bench import BenchOptions, Trial, binding_plan, copies_config, judge, search
from orchestra.config import load_config
from orchestra.errors import OrchestraError

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
BENCH = FIXTURES / "bench.toml"
CAMERAS = ROOT / "examples" / "cameras.toml"

posix = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX signals")

_STEP = re.compile(r"^N=(\d+)\s+(held|NOT held)\s+produced\s+(\d+)\s+processed\s+(\d+) \(\s*[\d.]+ %\)\s+"
                   r"dropped\s+(\d+)\s+failed\s+(\d+)\s+p50\s+([\d.]+) ms\s+p99\s+([\d.]+) ms")


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONIOENCODING="utf-8", NO_COLOR="1")


def _bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestra", "bench", *args], capture_output=True, text=True,
                          encoding="utf-8", env=_env(), cwd=ROOT, timeout=timeout)


def _steps(out: str) -> list[dict[str, object]]:
    """The step lines: N, held, the counts (each checked: produced = processed + dropped + failed)."""
    steps = []
    for line in out.splitlines():
        m = _STEP.match(line)
        if m is None:
            continue
        n, held, produced, processed, dropped, failed = m.group(1, 2, 3, 4, 5, 6)
        row = {"n": int(n), "held": held == "held", "produced": int(produced), "processed": int(processed),
               "dropped": int(dropped), "failed": int(failed), "p99": float(m.group(8)), "line": line}
        assert row["produced"] == row["processed"] + row["dropped"] + row["failed"], line
        steps.append(row)
    return steps


def _largest(out: str) -> int:
    m = re.search(r"^largest N held: (\d+) streams", out, re.M)
    assert m is not None, out
    return int(m.group(1))


# -- end to end ---------------------------------------------------------------------------------


def test_bench_finds_the_largest_n_up_to_the_limit() -> None:
    r = _bench(str(BENCH), "--duration", "1", "--max-streams", "4")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stdout.splitlines()
    # bench.toml has no placement key: "auto" runs a CPU program's copies in worker processes
    # when there is more than one CPU
    auto = "process" if len(os.sched_getaffinity(0)) > 1 else "thread"
    assert lines[0].startswith(f"orchestra bench bench.toml: copies of camera 'cam' (auto: {auto} placement) at 30 fps")
    steps = _steps(r.stdout)
    assert [s["n"] for s in steps] == [1, 2, 4], r.stdout  # doubling up to --max-streams
    assert all(s["held"] for s in steps), r.stdout  # a 16x16 conv net at 30 fps: easily held
    for s in steps:  # every copy produced on schedule (about 30 frames each in 1 s)
        assert s["produced"] >= 0.9 * 30 * s["n"], s
    assert _largest(r.stdout) == 4
    assert "stopped at its limit: the most streams asked for (4)" in r.stdout


def test_a_target_not_held_reports_zero_and_why() -> None:
    # a p99 no execute can meet: N=1 already fails, and the search ends there
    r = _bench(str(BENCH), "--duration", "1", "--p99-ms", "0.001")
    assert r.returncode == 0, r.stdout + r.stderr
    steps = _steps(r.stdout)
    assert [(s["n"], s["held"]) for s in steps] == [(1, False)], r.stdout
    assert re.search(r"p99 [\d.]+ ms > 0.001 ms$", steps[0]["line"]), steps[0]["line"]
    assert _largest(r.stdout) == 0


def test_npu_core_bindings_spread_over_the_cores_up_to_their_number() -> None:
    # `left` is bound to npu0.core 2 of an exclusive 4-core device: 4 copies fit, one per
    # core (two on one core would be refused by the orchestrator), and no more are tried
    r = _bench(str(CAMERAS), "--camera", "left", "--duration", "1", "--max-streams", "16")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "up to 4 streams (device npu0 has 4 cores, exclusive (one copy per core))" in r.stdout.splitlines()[0]
    steps = _steps(r.stdout)
    assert [s["n"] for s in steps] == [1, 2, 4] and all(s["held"] for s in steps), r.stdout
    assert _largest(r.stdout) == 4
    assert "the binding allows 4 copies: device npu0 has 4 cores" in r.stdout


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two CPUs to bind")
def test_exclusive_cpu_bindings_spread_over_the_cpus_in_a_real_run(tmp_path: pathlib.Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))[:2]
    path = tmp_path / "cpus.toml"
    path.write_text(f"""
[program]
path = {json.dumps(str(FIXTURES / "convnet.pte"))}

[device.cpu]
kind = "cpu"
cpus = {cpus}

[[camera]]
name = "cam"
source = {{ kind = "synthetic", fps = 30, shape = [1, 3, 16, 16] }}
bind = {{ cpu = {cpus[1]} }}
""", encoding="utf-8")
    r = _bench(str(path), "--duration", "1", "--max-streams", "8")
    assert r.returncode == 0, r.stdout + r.stderr
    steps = _steps(r.stdout)
    # the second copy takes the other CPU (the orchestrator refuses two on one exclusive CPU)
    assert [(s["n"], s["held"]) for s in steps] == [(1, True), (2, True)], r.stdout
    assert "the binding allows 2 copies: device cpu has 2 cpus, 2 slots of cpu" in r.stdout


def test_process_placement() -> None:
    r = _bench(str(BENCH), "--duration", "1", "--max-streams", "2", "--placement", "process")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "(process placement)" in r.stdout.splitlines()[0]
    steps = _steps(r.stdout)
    assert [s["n"] for s in steps] == [1, 2], r.stdout
    assert all(s["processed"] > 0 and s["failed"] == 0 for s in steps), r.stdout
    assert "thread-placed instances" not in r.stderr  # the orchestrator's warning for N > 1 in threads


@pytest.mark.parametrize(("args", "message"), [
    (("--fps", "0"), "argument --fps: must be a frame rate > 0, got '0'"),
    (("--fps", "fast"), "argument --fps: not a frame rate: 'fast'"),
    (("--p99-ms", "-5"), "argument --p99-ms: must be a number of milliseconds > 0"),
    (("--max-streams", "0"), "argument --max-streams: must be a whole number > 0"),
    (("--max-streams", "2.5"), "argument --max-streams: not a whole number: '2.5'"),
    (("--max-streams", "100000"), "argument --max-streams: must be at most 4096, got '100000'"),
    (("--fps", "1e6"), "argument --fps: must be at most 10000, got '1e6'"),
    (("--duration", "soon"), "argument --duration: not a number of seconds: 'soon'"),
    (("--min-processed", "101"), "argument --min-processed: must be a percentage in (0, 100]"),
    (("--placement", "gpu"), "argument --placement: invalid choice: 'gpu'"),
    (("--frobnicate",), "unrecognized arguments: --frobnicate"),
])
def test_bad_arguments_are_one_line_errors(args: tuple[str, ...], message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from orchestra import _cli

    assert _cli.main(["bench", str(BENCH), *args]) == 2  # in-process: refused before anything runs
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("orchestra bench: error: ") and message in lines[0], lines


def test_bad_camera_and_missing_file_are_one_line_errors() -> None:
    r = _bench(str(BENCH), "--camera", "nope")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [f"orchestra: {BENCH}: no camera named 'nope' (cameras: cam)"]
    r = _bench("no/such/file.toml")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == ["no/such/file.toml: no such file"]


ODD_CAMERA = """
import time

import numpy as np

from orchestra.pipeline import Frame


class Camera:
    \"\"\"A source with no fps: it runs at its own rate, so the bench can't pace it.\"\"\"

    def __init__(self, name, count=3):
        self.name, self.count = name, count

    async def frames(self):
        for i in range(self.count):
            yield Frame(self.name, i, np.zeros((1, 3, 16, 16), np.float32), time.monotonic())
"""


def test_a_source_without_fps_is_refused_before_anything_runs(tmp_path: pathlib.Path) -> None:
    (tmp_path / "oddcam_for_bench.py").write_text(ODD_CAMERA, encoding="utf-8")
    path = tmp_path / "odd.toml"
    path.write_text(f"""
[program]
path = {json.dumps(str(FIXTURES / "convnet.pte"))}

[[camera]]
name = "odd"
source = {{ kind = "oddcam_for_bench:Camera", count = 3 }}
""", encoding="utf-8")
    env = dict(_env(), PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "orchestra", "bench", str(path)], capture_output=True, text=True,
                       encoding="utf-8", env=env, cwd=ROOT, timeout=60)
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.splitlines() == [
        f"orchestra: {path}: camera 'odd': bench paces sources at the target fps; source kind "
        "'oddcam_for_bench:Camera' has no fps parameter (use a synthetic or file source, or give it fps)"]


@posix
def test_ctrl_c_ends_with_what_was_found_so_far() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "orchestra", "bench", str(BENCH), "--duration", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, encoding="utf-8",
                            env=_env(), cwd=ROOT, start_new_session=True)
    lines = []
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if line.startswith("N=2 "):  # live progress: a line per step as it ends
                break
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
        rest, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = "".join(lines) + rest
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err and "KeyboardInterrupt" not in out + err, out + err
    steps = _steps(out)
    assert [s["n"] for s in steps][:2] == [1, 2] and steps[0]["held"] and steps[1]["held"], out
    assert re.search(r"^N=\d+\s+interrupted", out, re.M), out
    largest = _largest(out)
    assert largest == max(s["n"] for s in steps if s["held"]) and largest >= 2
    assert f"interrupted (SIGINT): the search ended early; {largest} is what was held so far" in out


# -- the search and its criterion ---------------------------------------------------------------


def _trial(n: int, *, p99_ms: float = 10.0, processed_share: float = 1.0, produced_share: float = 1.0,
           failed: int = 0, problem: str | None = None) -> Trial:
    produced = round(n * 30 * 2.0 * produced_share)
    processed = round(produced * processed_share)
    return Trial(n, 30.0, 2.0, produced, processed - failed, produced - processed, failed, 0.005, p99_ms / 1e3,
                 problem)


@pytest.mark.parametrize("capacity", [0, 1, 5, 8, 13, 64, 100])
def test_search_doubles_then_bisects_to_the_largest_n_held(capacity: int) -> None:
    tried: list[int] = []

    def trial(n: int) -> Trial:
        tried.append(n)
        return _trial(n, p99_ms=50.0 if n <= capacity else 500.0)

    r = search(trial, max_streams=64, p99_ms=100.0, min_rate=0.99)
    assert r.largest == min(capacity, 64)
    assert len(tried) == len(set(tried))  # no N tried twice
    doubling = [n for n in tried if n & (n - 1) == 0][: len(tried)]
    assert tried[: len(doubling)] == [1, 2, 4, 8, 16, 32, 64][: len(doubling)]
    assert r.limit == ("the most streams asked for (64)" if capacity >= 64 else None)
    assert all(s.held == (s.streams <= capacity) for s in r.steps)


def test_search_stops_at_the_bindings_cap_and_says_why() -> None:
    r = search(lambda n: _trial(n), max_streams=64, p99_ms=100.0, min_rate=0.99, cap=6, cap_reason="six cores")
    assert [s.streams for s in r.steps] == [1, 2, 4, 6]
    assert r.largest == 6 and r.limit == "six cores"


@pytest.mark.parametrize(("trial", "reason"), [
    (_trial(4, p99_ms=150.0), "p99 150.0 ms > 100 ms"),
    (_trial(4, processed_share=0.975), "processed 97.5 % of the frames (< 99 %)"),
    (_trial(4, produced_share=0.9), "sources produced 216 of the 240 frames due"),
    (_trial(4, failed=1), "1 frame failed"),
    (_trial(4, problem="cam-1: accounting: lost"), "cam-1: accounting: lost"),
])
def test_judge_names_what_was_not_held(trial: Trial, reason: str) -> None:
    step = judge(trial, p99_ms=100.0, min_rate=0.99)
    assert not step.held and step.reason.startswith(reason), step.reason


def test_judge_holds_at_the_tolerance() -> None:
    assert judge(_trial(4, processed_share=0.995, p99_ms=99.0), p99_ms=100.0, min_rate=0.99).held


# -- copies of a camera -----------------------------------------------------------------------


CPU_CONFIG = """
[program]
path = PTE

[device.cpu]
kind = "cpu"
cpus = [0, 1, 2, 3]
exclusive = EXCLUSIVE

[[camera]]
name = "cam"
source = { kind = "synthetic", fps = 10, shape = [1, 3, 16, 16], seed = 7, count = 5 }
bind = { cpu = BIND }
deadline_ms = 500
queue = 3
"""


def _cpu_config(tmp_path: pathlib.Path, bind: str, exclusive: bool = True):  # type: ignore[no-untyped-def]
    text = (CPU_CONFIG.replace("PTE", json.dumps(str(FIXTURES / "convnet.pte"))).replace("BIND", bind)
            .replace("EXCLUSIVE", "true" if exclusive else "false"))
    path = tmp_path / "cpu.toml"
    path.write_text(text, encoding="utf-8")
    return load_config(path)


def test_cpu_bindings_spread_over_the_cpus(tmp_path: pathlib.Path) -> None:
    cfg = _cpu_config(tmp_path, "2")
    binds, cap, why = binding_plan(cfg, cfg.cameras[0], 6)
    assert [b["cpu"] for b in binds] == [2, 3, 0, 1, 2, 3]  # the camera's own CPU first
    assert cap == 4 and why == "device cpu has 4 cpus, 4 slots of cpu 2, exclusive"
    cfg = _cpu_config(tmp_path, "[2, 3]")
    binds, cap, _ = binding_plan(cfg, cfg.cameras[0], 3)
    assert [b["cpu"] for b in binds] == [(2, 3), (0, 1), (2, 3)] and cap == 2
    cfg = _cpu_config(tmp_path, "1", exclusive=False)  # shared, no capacity: no cap
    binds, cap, why = binding_plan(cfg, cfg.cameras[0], 3)
    assert cap is None and why is None


def test_copies_keep_the_camera_but_name_pace_and_seed(tmp_path: pathlib.Path) -> None:
    cfg = _cpu_config(tmp_path, "0")
    out = copies_config(cfg, 3, BenchOptions(fps=25.0, placement="process"))
    assert [c.name for c in out.cameras] == ["cam-1", "cam-2", "cam-3"]
    for i, c in enumerate(out.cameras):
        assert c.source.kind == "synthetic"
        assert c.source.params["fps"] == 25.0 and c.source.params["seed"] == 7 + i
        assert "count" not in c.source.params  # endless: the step's duration ends it
        assert c.queue == 3 and c.placement == "process" and c.program == cfg.cameras[0].program
        assert c.deadline_s == 0.5 and c.drop == cfg.cameras[0].drop
        assert c.bind["cpu"] == i
    assert out.programs == cfg.programs and out.devices == cfg.devices


def test_a_source_the_bench_cannot_pace_is_refused(tmp_path: pathlib.Path) -> None:
    cfg = _cpu_config(tmp_path, "0")
    cam = cfg.cameras[0]
    from dataclasses import replace

    from orchestra.config import SourceConfig

    odd = replace(cfg, cameras=(replace(cam, source=SourceConfig("mypkg.cams:Thing", {"port": 1})),))
    with pytest.raises(OrchestraError, match=f"{re.escape(str(cfg.path))}: camera 'cam': bench paces sources at the target fps; source kind "
                                             "'mypkg.cams:Thing' has no fps parameter"):
        copies_config(odd, 2, BenchOptions())


def test_bench_options_are_checked() -> None:
    with pytest.raises(OrchestraError, match="fps must be a number > 0"):
        BenchOptions(fps=0)
    with pytest.raises(OrchestraError, match="max_streams must be an integer >= 1"):
        BenchOptions(max_streams=0)
    with pytest.raises(OrchestraError, match='placement must be "thread" or "process"'):
        BenchOptions(placement="gpu")


def _batch_config(tmp_path: pathlib.Path, batch: str) -> pathlib.Path:
    """Two synthetic cameras of ``program`` in one ``[[batch]]`` (plus ``batch``'s keys)."""
    import shutil

    for name in ("dynamic_batch.pte", "mlp.pte"):
        shutil.copy(FIXTURES / name, tmp_path / name)
    program = "mlp.pte" if "static_batch" in batch else "dynamic_batch.pte"
    path = tmp_path / "batch.toml"
    path.write_text(f'[program]\nname = "p"\npath = "{program}"\n'
                    + "".join(f'\n[[camera]]\nname = "{n}"\nsource = {{ kind = "synthetic", fps = 30 }}\n'
                              for n in ("a", "b"))
                    + f'\n[[batch]]\nname = "ab"\ncameras = ["a", "b"]\n{batch}\n', encoding="utf-8")
    return path


def test_batched_copies_share_one_batch_with_the_cameras_settings(tmp_path: pathlib.Path) -> None:
    cfg = load_config(_batch_config(tmp_path, "max_size = 4\nmax_wait_ms = 5"))
    with_batch = copies_config(cfg, 3, BenchOptions(batch=True))
    (b,) = with_batch.batches
    assert (b.name, b.cameras, b.max_size, b.max_wait_s, b.static_batch) == ("ab-bench", ("a-1", "a-2", "a-3"), 4,
                                                                             0.005, None)
    assert all(c.source.params["shape"][0] == 1 for c in with_batch.cameras)  # a frame is one row
    assert copies_config(cfg, 3, BenchOptions()).batches == ()  # dynamic batch: each copy executes alone
    # a fixed batch: without batching each copy is padded alone
    static = load_config(_batch_config(tmp_path, "static_batch = 2"))
    alone = copies_config(static, 2, BenchOptions()).batches
    assert [(g.cameras, g.max_size, g.static_batch) for g in alone] == [(("a-1",), 1, 2), (("a-2",), 1, 2)]
    # a camera in no [[batch]]: refused, naming it
    with pytest.raises(OrchestraError, match=r"camera 'front' is in no \[\[batch\]\]"):
        copies_config(load_config(CAMERAS), 2, BenchOptions(batch=True))


def test_bench_batch_searches_without_and_with_batching(tmp_path: pathlib.Path) -> None:
    path = _batch_config(tmp_path, "max_size = 4\nmax_wait_ms = 5")
    r = _bench(str(path), "--batch", "--max-streams", "4", "--duration", "1", "--p99-ms", "1000",
               "--min-processed", "50")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "without batching (each copy its own executes)" in out
    assert "with batching (the copies in one [[batch]]: max_size 4, max_wait_ms 5)" in out
    found = [int(n) for n in re.findall(r"^largest N held: (\d+) streams", out, re.M)]
    assert len(found) == 2 and all(n >= 1 for n in found), out
    steps = _steps(out)
    assert steps and all(st["failed"] == 0 for st in steps), out
    m = re.search(r"^batching: (\d+) streams held against (\d+) without \(([\d.]+)x\)$", out, re.M)
    assert m is not None and (int(m.group(1)), int(m.group(2))) == (found[1], found[0]), out
    # a camera that is in no [[batch]]: one line, exit 2
    r = _bench(str(CAMERAS), "--batch", "--max-streams", "1", "--duration", "1")
    assert r.returncode == 2 and "is in no [[batch]]" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr