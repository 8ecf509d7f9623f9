"""orchestra owns every compute thread: BLAS/OpenMP limits set through threadpoolctl.

Real worker processes (spawned) and real thread-placed instances of the conv-net fixture;
each worker process records what ``threadpoolctl.threadpool_info()`` shows there (through the
orchestrator's ``process_initializer``, which runs after the limit is set), and the tests
compare it with the binding and with ``statistics().threads``. Nothing here is timed.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import anyio
import numpy as np
import pytest
import threadpoolctl

from orchestra import InvalidArgumentError
from orchestra.orchestrator import CpuResource, InstanceSpec, Orchestrator, ThreadBudget
from orchestra.orchestrator._threads import worker_blas_env
from orchestra.runtime import kernels, load_program

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
ENV_VARS = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")
CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def _blas(info: list[dict[str, Any]]) -> int:
    counts = [i["num_threads"] for i in info if i.get("user_api") == "blas"]
    assert counts, f"no BLAS library loaded: {info}"
    return max(counts)


BLAS_AT_START = _blas(threadpoolctl.threadpool_info())
needs_2_cpus = pytest.mark.skipif(len(CPUS) < 2 or BLAS_AT_START < 2,
                                  reason="needs 2 CPUs and a BLAS that starts more than one thread")


@pytest.fixture
def anyio_backend() -> tuple[str, dict]:
    return "asyncio", {"use_uvloop": True}


@pytest.fixture(autouse=True)
def _no_user_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def record_blas(folder: str) -> None:
    """process_initializer: writes this worker process's threadpool_info() to <folder>/<pid>.json,
    with the threads of orchestra's compiled kernels as one more entry."""
    from orchestra.runtime import kernels

    info = threadpoolctl.threadpool_info() + [{"user_api": "orchestra kernels", "num_threads": kernels.threads()}]
    # written whole, then renamed over the last one: the test reads it while record_blas_live
    # rewrites it every 20 ms (a read between truncate and write saw an empty file)
    tmp = pathlib.Path(folder, f"{os.getpid()}.json.tmp")
    tmp.write_text(json.dumps(info))
    os.replace(tmp, pathlib.Path(folder, f"{os.getpid()}.json"))


def record_blas_live(folder: str) -> None:
    """process_initializer: like :func:`record_blas`, then again every 20 ms from a daemon
    thread (to see a limit changed later)."""
    import threading
    import time

    def loop() -> None:
        while True:
            record_blas(folder)
            time.sleep(0.02)

    record_blas(folder)
    threading.Thread(target=loop, daemon=True).start()


def _seen_blas(folder: pathlib.Path, pid: int | None) -> int:
    return _blas(json.loads((folder / f"{pid}.json").read_text()))


def _seen(folder: pathlib.Path, pid: int | None) -> int:
    """The compute threads a worker process got: its compiled kernels' where they are built
    (its BLAS pools then run 1 unless the user set them), else its BLAS pools'."""
    return _seen_kernels(folder, pid) if kernels.NATIVE_KERNELS else _seen_blas(folder, pid)


def _seen_kernels(folder: pathlib.Path, pid: int | None) -> int:
    (n,) = [i["num_threads"] for i in json.loads((folder / f"{pid}.json").read_text())
            if i["user_api"] == "orchestra kernels"]
    return n


def _inputs() -> list[np.ndarray]:
    return [np.load(FIXTURES / "convnet.npz")["forward.in_0"]]


async def _run(orch: Orchestrator, specs: list[InstanceSpec]) -> dict[str, tuple[ThreadBudget, int | None]]:
    """Loads the conv net as ``specs``, executes each once; per instance its ThreadBudget and
    its worker process's pid (None for a thread)."""
    p = await orch.load(load_program(FIXTURES / "convnet.pte"), instances=specs)
    x = _inputs()
    out = {}
    for s in specs:
        await p[s.name].execute(x)
        st = p[s.name].statistics()
        assert st.threads is not None
        w = p[s.name]._worker
        out[s.name] = (st.threads, getattr(w.method, "pid", None) if s.placement == "process" else None)
    return out


@needs_2_cpus
@pytest.mark.anyio
async def test_a_worker_process_limits_its_blas_threads_to_the_cpus_it_is_bound_to(tmp_path: pathlib.Path) -> None:
    two = tuple(CPUS[:2])
    async with Orchestrator(resources=[CpuResource(exclusive=False)], period=None,
                            process_initializer=functools.partial(record_blas, str(tmp_path))) as orch:
        got = await _run(orch, [InstanceSpec("one", bind={"cpu": CPUS[0]}, placement="process"),
                                InstanceSpec("two", bind={"cpu": two}, placement="process")])
    # bound to 1 CPU: 1 thread, although the library started BLAS_AT_START (>= 2) there
    assert _seen(tmp_path, got["one"][1]) == 1
    assert got["one"][0] == ThreadBudget("process", 1, "orchestra", {})
    assert _seen(tmp_path, got["two"][1]) == 2
    assert got["two"][0].blas == 2 and got["two"][0].blas_source == "orchestra"
    # the 2 threads go to orchestra's compiled kernels where built, the BLAS pools run 1
    # (their idle threads spin and would take the kernels' CPUs); else to the BLAS pools
    assert _seen_blas(tmp_path, got["two"][1]) == (1 if kernels.NATIVE_KERNELS else 2)
    if kernels.NATIVE_KERNELS:
        assert (_seen_kernels(tmp_path, got["one"][1]), _seen_kernels(tmp_path, got["two"][1])) == (1, 2)


@needs_2_cpus
@pytest.mark.anyio
async def test_moving_a_worker_process_to_more_cpus_raises_its_blas_limit(tmp_path: pathlib.Path) -> None:
    async with Orchestrator(resources=[CpuResource()], period=None,
                            process_initializer=functools.partial(record_blas_live, str(tmp_path))) as orch:
        got = await _run(orch, [InstanceSpec("m", bind={"cpu": CPUS[0]}, placement="process")])
        pid = got["m"][1]
        assert _seen(tmp_path, pid) == 1
        p = orch.pool("convnet")  # the default pool name: the program file's stem
        assert await p.move("m", {"cpu": tuple(CPUS[:2])})
        await p["m"].execute(_inputs())
        assert p["m"].statistics().threads.blas == 2  # type: ignore[union-attr]
        with anyio.fail_after(30):  # the process applies it before its next execute; its recorder sees it soon after
            while True:
                try:
                    if _seen(tmp_path, pid) == 2:
                        break
                except (ValueError, OSError):  # caught mid-write
                    pass
                await anyio.sleep(0.02)


@needs_2_cpus
@pytest.mark.anyio
async def test_unbound_worker_processes_run_one_blas_thread_when_they_share_the_machine(tmp_path: pathlib.Path) -> None:
    init = functools.partial(record_blas, str(tmp_path))
    async with Orchestrator(period=None, process_initializer=init) as orch:
        alone = await _run(orch, [InstanceSpec("alone", placement="process")])
    assert _seen(tmp_path, alone["alone"][1]) == len(CPUS) == alone["alone"][0].blas
    async with Orchestrator(period=None, process_initializer=init) as orch:
        got = await _run(orch, [InstanceSpec("a", placement="process"), InstanceSpec("b", placement="process")])
    for name in ("a", "b"):
        assert _seen(tmp_path, got[name][1]) == 1 == got[name][0].blas


@needs_2_cpus
@pytest.mark.anyio
async def test_thread_placement_runs_blas_single_threaded_and_restores_it_on_close() -> None:
    before = _blas(threadpoolctl.threadpool_info())
    kernels.set_threads(2)  # what this process had: put back on close
    async with Orchestrator(resources=[CpuResource()], period=None) as orch:
        got = await _run(orch, [InstanceSpec("t", bind={"cpu": tuple(CPUS[:2])})])
        assert _blas(threadpoolctl.threadpool_info()) == 1
        assert kernels.threads() == 1
        budget = got["t"][0]
        assert (budget.placement, budget.blas, budget.blas_source) == ("thread", 1, "orchestra")
        assert "blas 1 (orchestra)" in budget.format()
    assert _blas(threadpoolctl.threadpool_info()) == before
    assert kernels.threads() == (2 if kernels.NATIVE_KERNELS else 1)
    kernels.set_threads(1)


@needs_2_cpus
@pytest.mark.anyio
async def test_a_lone_unbound_thread_placed_instance_gets_every_cpu_and_shares_once_another_joins() -> None:
    # The compiled kernels' pool is the process's: alone, the instance splits its calls over
    # every CPU (as a lone worker process would); with a second instance each runs on its own
    # thread; when the second goes, every CPU again. BLAS stays at 1 throughout.
    want = len(CPUS) if kernels.NATIVE_KERNELS else 1
    async with Orchestrator(period=None) as orch:
        got = await _run(orch, [InstanceSpec("first")])
        assert (got["first"][0].placement, got["first"][0].blas, got["first"][0].blas_source) == \
            ("thread", want, "orchestra")
        assert kernels.threads() == want and _blas(threadpoolctl.threadpool_info()) == 1
        p = orch.pool("convnet")
        await p.add(InstanceSpec("second"))
        assert kernels.threads() == 1
        for name in ("first", "second"):
            await p[name].execute(_inputs())
            assert p[name].statistics().threads.blas == 1  # type: ignore[union-attr]
        await p.remove("second")
        assert kernels.threads() == want
        await p["first"].execute(_inputs())
        assert p["first"].statistics().threads.blas == want  # type: ignore[union-attr]
    assert kernels.threads() == 1  # put back on close
    assert _blas(threadpoolctl.threadpool_info()) == BLAS_AT_START


@needs_2_cpus
@pytest.mark.anyio
async def test_a_thread_placed_instance_moved_onto_cpus_and_off_them_follows_the_rule() -> None:
    # Alone and unbound the kernels take every CPU; moved onto one CPU (a policy's move) the
    # instance is bound: 1; moved off it again: every CPU again.
    want = len(CPUS) if kernels.NATIVE_KERNELS else 1
    async with Orchestrator(resources=[CpuResource()], period=None) as orch:
        await _run(orch, [InstanceSpec("t")])
        p = orch.pool("convnet")
        assert kernels.threads() == want
        assert await p.move("t", {"cpu": CPUS[0]})
        await p["t"].execute(_inputs())
        assert kernels.threads() == 1 and p["t"].statistics().threads.blas == 1  # type: ignore[union-attr]
        assert await p.move("t", {})
        await p["t"].execute(_inputs())
        assert kernels.threads() == want and p["t"].statistics().threads.blas == want  # type: ignore[union-attr]


@needs_2_cpus
@pytest.mark.anyio
async def test_a_users_environment_variable_wins_and_is_reported(tmp_path: pathlib.Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # The worker process's OpenBLAS reads the variable when it loads; orchestra leaves it in
    # force although the binding (1 CPU) would have given 1.
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    before = _blas(threadpoolctl.threadpool_info())
    async with Orchestrator(resources=[CpuResource()], period=None,
                            process_initializer=functools.partial(record_blas, str(tmp_path))) as orch:
        got = await _run(orch, [InstanceSpec("p", bind={"cpu": CPUS[0]}, placement="process"),
                                InstanceSpec("t")])
        # thread placement: this process's limit is left as the user had it
        assert _blas(threadpoolctl.threadpool_info()) == before
    assert _seen(tmp_path, got["p"][1]) == 2 == _seen_blas(tmp_path, got["p"][1])
    assert got["p"][0] == ThreadBudget("process", 2, "OPENBLAS_NUM_THREADS", {})
    assert (got["t"][0].blas, got["t"][0].blas_source) == (before, "OPENBLAS_NUM_THREADS")


@needs_2_cpus
@pytest.mark.anyio
async def test_the_blas_threads_option_wins_over_the_binding(tmp_path: pathlib.Path) -> None:
    async with Orchestrator(resources=[CpuResource()], period=None, blas_threads=2,
                            process_initializer=functools.partial(record_blas, str(tmp_path))) as orch:
        got = await _run(orch, [InstanceSpec("p", bind={"cpu": CPUS[0]}, placement="process")])
    assert _seen(tmp_path, got["p"][1]) == 2
    assert got["p"][0] == ThreadBudget("process", 2, "blas_threads option", {})


def test_blas_threads_must_be_a_positive_integer() -> None:
    for bad in (0, -1, 2.0, True, "2"):
        with pytest.raises(InvalidArgumentError, match="blas_threads"):
            Orchestrator(blas_threads=bad)  # type: ignore[arg-type]


def _numpy_cpu_program() -> bytes:
    """One matmul delegated to NumpyCpuBackend (its ``num_threads`` comes from a CPU binding)."""
    from orchestra.aot import ProgramBuilder, aot_backends, register_aot_backend
    from orchestra.backends.numpy_cpu import NumpyCpuBackendDetails

    if "NumpyCpuBackend" not in aot_backends():
        register_aot_backend("NumpyCpuBackend", NumpyCpuBackendDetails)
    sub = ProgramBuilder()
    g = sub.method("forward")
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    g.output(g.call("aten::mm.out", g.input(np.float32, (8, 64)), w))
    b = ProgramBuilder()
    f = b.method("forward")
    f.output(*f.delegate("NumpyCpuBackend", sub, [f.input(np.float32, (8, 64))]))
    return b.to_bytes()


@needs_2_cpus
@pytest.mark.anyio
async def test_the_budget_reports_the_backend_threads_of_orchestras_own_tiling() -> None:
    async with Orchestrator(resources=[CpuResource()], period=None) as orch:
        p = await orch.load(load_program(_numpy_cpu_program()), instances=[
            InstanceSpec("t", bind={"cpu": tuple(CPUS[:2])})])
        await p["t"].execute([np.ones((8, 64), np.float32)])
        budget = p["t"].statistics().threads
    assert budget == ThreadBudget("thread", 1, "orchestra", {"NumpyCpuBackend": 2})
    assert budget.format() == "blas 1 (orchestra), NumpyCpuBackend 2"


def test_orchestra_runs_summary_shows_each_instances_thread_budget() -> None:
    """The real command on the CPU-cameras example (two unbound worker processes)."""
    root = pathlib.Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    r = subprocess.run([sys.executable, "-m", "orchestra", "run", str(root / "examples" / "cpu_cameras.toml"),
                        "--duration", "1"], capture_output=True, text=True, encoding="utf-8",
                       env=dict(env, NO_COLOR="1"), cwd=root, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    head = lines.index("instances") + 1
    assert "threads" in lines[head]
    rows = [line for line in lines[head + 1:head + 3]]
    assert len(rows) == 2 and all("blas 1 (orchestra)" in row for row in rows), r.stdout


@needs_2_cpus
@pytest.mark.anyio
async def test_an_unbound_worker_process_started_alone_shares_while_another_runs(tmp_path: pathlib.Path) -> None:
    async with Orchestrator(period=None, process_initializer=functools.partial(record_blas_live, str(tmp_path))) as orch:
        got = await _run(orch, [InstanceSpec("first", placement="process")])
        pid = got["first"][1]
        assert _seen(tmp_path, pid) == len(CPUS)
        p = orch.pool("convnet")  # the default pool name: the program file's stem
        await p.add(InstanceSpec("second", placement="process"))
        await p["first"].execute(_inputs())
        assert p["first"].statistics().threads.blas == 1  # type: ignore[union-attr]
        await _until_seen(tmp_path, pid, 1)
        await p.remove("second")  # alone again: every CPU
        await p["first"].execute(_inputs())
        assert p["first"].statistics().threads.blas == len(CPUS)  # type: ignore[union-attr]
        await _until_seen(tmp_path, pid, len(CPUS))


async def _until_seen(folder: pathlib.Path, pid: int | None, n: int) -> None:
    """Waits (30 s at most) until the worker process ``pid`` records ``n`` compute threads."""
    with anyio.fail_after(30):
        while True:
            try:
                if _seen(folder, pid) == n:
                    return
            except (ValueError, OSError):  # caught mid-write
                pass
            await anyio.sleep(0.02)


# -- BLAS kernels of worker processes -------------------------------------------------------

_HASWELL = [{"internal_api": "openblas", "architecture": "Haswell"}]
_AVX512 = {"fpu", "avx2", "fma", "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}


def test_workers_get_openblas_avx512_kernels_only_where_openblas_fell_back_and_the_cpu_has_them() -> None:
    assert worker_blas_env({}, _AVX512, _HASWELL) == {"OPENBLAS_CORETYPE": "SkylakeX"}
    assert worker_blas_env({"OPENBLAS_CORETYPE": "Haswell"}, _AVX512, _HASWELL) == {}  # the user's choice wins
    assert worker_blas_env({}, _AVX512 - {"avx512vl"}, _HASWELL) == {}  # a subset the kernels use is missing
    assert worker_blas_env({}, _AVX512, [{"internal_api": "openblas", "architecture": "SkylakeX"}]) == {}
    assert worker_blas_env({}, _AVX512, [{"internal_api": "openblas", "architecture": "Cooperlake"}]) == {}
    assert worker_blas_env({}, _AVX512, [{"internal_api": "mkl", "architecture": None}]) == {}  # not OpenBLAS


def record_arch(folder: str) -> None:
    """process_initializer: writes the worker's OpenBLAS architecture to FOLDER/arch-PID."""
    import threadpoolctl

    arch = next((i.get("architecture") for i in threadpoolctl.threadpool_info() if i.get("internal_api") == "openblas"), None)
    (pathlib.Path(folder) / f"arch-{os.getpid()}").write_text(str(arch), encoding="utf-8")


@pytest.mark.anyio
async def test_a_worker_process_loads_the_kernels_worker_blas_env_chose(tmp_path: pathlib.Path) -> None:
    want = worker_blas_env().get("OPENBLAS_CORETYPE")
    before = os.environ.get("OPENBLAS_CORETYPE")
    async with Orchestrator(period=None, process_initializer=functools.partial(record_arch, str(tmp_path))) as orch:
        got = await _run(orch, [InstanceSpec("w", placement="process")])
    arch = (tmp_path / f"arch-{got['w'][1]}").read_text(encoding="utf-8")
    if want is None:  # this OpenBLAS recognised the CPU (or the user chose): the worker's kernels are this process's
        import threadpoolctl

        mine = next((i.get("architecture") for i in threadpoolctl.threadpool_info() if i.get("internal_api") == "openblas"), None)
        assert arch == str(mine)
    else:
        assert arch == want
    assert os.environ.get("OPENBLAS_CORETYPE") == before  # this process's environment is left as it was
