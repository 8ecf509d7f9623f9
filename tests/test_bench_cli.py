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
    assert lines[0].startswith("orchestra bench bench.toml: copies of camera 'cam' (thread placement) at 30 fps")
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
    with pytest.raises(OrchestraError, match="camera 'cam': bench paces sources at the target fps; source kind "
                                             "'mypkg.cams:Thing' has no fps parameter"):
        copies_config(odd, 2, BenchOptions())


def test_bench_options_are_checked() -> None:
    with pytest.raises(OrchestraError, match="fps must be a number > 0"):
        BenchOptions(fps=0)
    with pytest.raises(OrchestraError, match="max_streams must be an integer >= 1"):
        BenchOptions(max_streams=0)
    with pytest.raises(OrchestraError, match='placement must be "thread" or "process"'):
        BenchOptions(placement="gpu")
