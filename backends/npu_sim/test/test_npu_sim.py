"""NpuSimBackend on hand-built delegated programs: real core threads, real numpy work.

The programs are built as ProgramDefs (as in tests/test_options.py): an outer ``forward``
whose single DelegateCall goes to NpuSimBackend, whose blob is the ``.pte`` of a subgraph
computing ``relu(x @ W)``. Nothing here asserts on wall-clock time.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from orchestra import BackendError, Error, InvalidArgumentError
from orchestra.backends import npu_sim
from orchestra.backends.npu_sim import (
    DEFAULT_CLOCK_MHZ,
    DEFAULT_JOB_OVERHEAD_CYCLES,
    DEFAULT_POWER_W,
    NpuDevice,
    NpuSimBackend,
    analyze_subgraph,
    devices,
    get_device,
    register_device,
    unregister_device,
)
from orchestra.program import (
    AllocationDetails,
    BackendDelegate,
    BackendDelegateDataReference,
    BackendDelegateInlineData,
    Buffer,
    Chain,
    DataLocation,
    DelegateCall,
    EValue,
    ExecutionPlan,
    Instruction,
    KernelCall,
    Operator,
    ProgramDef,
    ScalarType,
    Tensor,
    dumps,
)
from orchestra.runtime import Backend, load_program, register_backend, registered_backends

if "NpuSimBackend" not in registered_backends():
    register_backend(Backend("NpuSimBackend", NpuSimBackend()))

NPU = "NpuSimBackend"
_names = itertools.count()


# -- programs -----------------------------------------------------------------------------
def _t(shape: tuple[int, ...], offset: int | None = None, buf: int = 0) -> EValue:
    alloc = None if offset is None else AllocationDetails(1, offset)
    return EValue(Tensor(ScalarType.FLOAT, 0, shape, tuple(range(len(shape))), data_buffer_idx=buf, allocation_info=alloc))


def subgraph(w: np.ndarray, m: int) -> ProgramDef:
    """forward(x[m, k]) = relu(x @ w), w[k, n] a constant: M*N*K + M*N MACs."""
    k, n = w.shape
    xb, yb = m * k * 4, m * n * 4
    values = [_t((m, k), 0), _t((k, n), buf=1), _t((m, n), xb), _t((m, n), xb + yb)]
    plan = ExecutionPlan(
        "forward", None, tuple(values), (0,), (3,),
        (Chain((0,), (3,), (Instruction(KernelCall(0, (0, 1, 2, 2))), Instruction(KernelCall(1, (2, 3, 3))))),),
        (Operator("aten::mm", "out"), Operator("aten::relu", "out")), (), (0, xb + 2 * yb))
    return ProgramDef(0, (plan,), constant_buffer=(Buffer(memoryview(b"")), Buffer(memoryview(np.ascontiguousarray(w, np.float32).tobytes()))))


def delegated(w: np.ndarray, m: int) -> bytes:
    """An outer program: forward(x) = NpuSimBackend(subgraph)(x)."""
    k, n = w.shape
    blob = dumps(subgraph(w, m))
    values = [_t((m, k), 0), _t((m, n), m * k * 4)]
    plan = ExecutionPlan(
        "forward", None, tuple(values), (0,), (1,), (Chain((0,), (1,), (Instruction(DelegateCall(0, (0, 1))),)),),
        (), (BackendDelegate(NPU, BackendDelegateDataReference(DataLocation.INLINE, 0)),), (0, m * (k + n) * 4))
    return dumps(ProgramDef(0, (plan,), backend_delegate_data=(BackendDelegateInlineData(memoryview(blob)),)))


M, K, N = 32, 64, 128
W = (np.random.default_rng(0).standard_normal((K, N)) / 8).astype(np.float32)
MACS = M * N * K + M * N  # mm + relu
PROGRAM = delegated(W, M)


def ref(x: np.ndarray) -> np.ndarray:
    return np.maximum(x @ W, 0)


def xs(seed: int, count: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((M, K)).astype(np.float32) for _ in range(count)]


def opts(**kw: object) -> dict:
    return {NPU: kw}


# -- fixtures -----------------------------------------------------------------------------
@pytest.fixture
def make_device() -> Iterator:
    made: list[NpuDevice] = []

    def make(name: str | None = None, **kw: object) -> NpuDevice:
        dev = NpuDevice(name or f"npu-test-{next(_names)}", **kw)
        made.append(dev)
        return register_device(dev)

    yield make
    for dev in made:
        dev.close()


@pytest.fixture
def npu0(make_device) -> NpuDevice:
    """The default device of the backend's ``device`` option: 4 cores, 4 MiB each."""
    return make_device("npu0")


def core_thread(dev: NpuDevice, core: int) -> threading.Thread:
    return next(t for t in threading.enumerate() if t.name == f"npu-sim:{dev.name}:core{core}")


# -- the RFC's camera case ----------------------------------------------------------------
def test_four_cameras_run_in_parallel_each_on_its_own_core(npu0: NpuDevice) -> None:
    prog = load_program(PROGRAM)
    ms = [prog.load_method(backend_options=opts(core=i, label=f"cam{i}")) for i in range(4)]
    runs = 25
    frames = [xs(100 + i, runs) for i in range(4)]
    got: list[list[np.ndarray]] = [[] for _ in range(4)]
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def camera(i: int) -> None:
        try:
            start.wait()
            for x in frames[i]:
                got[i].append(ms[i].execute([x])[0])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=camera, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(4):
        for x, y in zip(frames[i], got[i], strict=True):
            np.testing.assert_allclose(y, ref(x), rtol=1e-5, atol=1e-5)
    stats = npu0.statistics()
    assert stats.jobs == 4 * runs
    for i, core in enumerate(stats.cores):
        assert core.instances == (f"cam{i}",), core.served  # each core served only its camera
        assert core.jobs == runs and core.served[0].jobs == runs and core.failed_jobs == 0
        assert core.last_job is not None and core.last_job.thread_id == core_thread(npu0, i).ident
        assert core.reservations == 1 and core.queue_depth == 0 and core.online
    assert stats.cores[0].links == ("front",) and stats.cores[1].links == ("rear",)
    for m in ms:
        m.close()
    assert all(c.reserved_bytes == 0 for c in npu0.statistics().cores)


def test_modelled_throughput_scales_with_cores(make_device) -> None:
    """The same job mix (4 instances x 20 executes) on 4 cores vs all on one core."""
    def run(dev: NpuDevice, cores: list[int]) -> float:
        """Modelled jobs/s of the device after the mix."""
        prog = load_program(PROGRAM)
        ms = [prog.load_method(backend_options=opts(device=dev.name, core=c, label=f"cam{i}")) for i, c in enumerate(cores)]
        threads = [threading.Thread(target=lambda m=m: [m.execute([x]) for x in xs(7, 20)]) for m in ms]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for m in ms:
            m.close()
        s = dev.statistics()
        assert s.jobs == 80
        return s.throughput_jobs_per_s

    spread, single = make_device(), make_device()
    four = run(spread, [0, 1, 2, 3])
    one = run(single, [0, 0, 0, 0])
    assert four / one == pytest.approx(4.0, rel=1e-9)
    assert one == pytest.approx(1 / single.cost(MACS, "balanced").device_seconds, rel=1e-9)
    assert [c.jobs for c in single.statistics().cores] == [80, 0, 0, 0]
    assert sorted(single.statistics().cores[0].instances) == ["cam0", "cam1", "cam2", "cam3"]


def test_power_modes_give_the_documented_latency_and_energy_ratios(npu0: NpuDevice) -> None:
    m = load_program(PROGRAM).load_method(backend_options=opts(core=1, label="rear"))
    x = xs(1)[0]
    seen = {}
    for mode in ("balanced", "low", "performance"):
        if mode != "balanced":
            m.set_options({NPU: {"power_mode": mode}})  # hot: takes effect next execute
        np.testing.assert_allclose(m.execute([x])[0], ref(x), rtol=1e-5, atol=1e-5)
        job = npu0.statistics().cores[1].last_job
        assert job is not None and job.power_mode == mode
        seen[mode] = job
    perf = seen["performance"]
    latency = {k: j.device_seconds / perf.device_seconds for k, j in seen.items()}
    energy = {k: j.energy_joules / perf.energy_joules for k, j in seen.items()}
    # README: latency low : balanced : performance = 5 : 2 : 1; energy = 0.6 : 0.72 : 1.
    assert latency == pytest.approx({"low": 5.0, "balanced": 2.0, "performance": 1.0})
    assert energy == pytest.approx({"low": 0.6, "balanced": 0.72, "performance": 1.0})
    for k in seen:  # and both follow from the device table
        c = DEFAULT_CLOCK_MHZ
        assert latency[k] == pytest.approx(c["performance"] / c[k])
        assert energy[k] == pytest.approx(c["performance"] / c[k] * DEFAULT_POWER_W[k] / DEFAULT_POWER_W["performance"])
    cycles = -(-MACS // 256) + DEFAULT_JOB_OVERHEAD_CYCLES
    assert perf.cost.cycles == cycles and perf.device_seconds == pytest.approx(cycles / 1e9)
    assert m.statistics().reinits == 0  # hot: no re-init
    by_mode = {u.power_mode: u.jobs for u in npu0.statistics().cores[1].by_mode}
    assert by_mode == {"low": 1, "balanced": 1, "performance": 1}
    # A per-call override is for that call only.
    m.execute([x], backend_options=opts(power_mode="low"))
    assert npu0.statistics().cores[1].last_job.power_mode == "low"
    m.execute([x])
    assert npu0.statistics().cores[1].last_job.power_mode == "performance"
    m.close()


def test_priority_orders_jobs_waiting_on_the_same_core(npu0: NpuDevice) -> None:
    gate, running = threading.Event(), threading.Event()
    blocker = npu0.submit(0, lambda: (running.set(), gate.wait()), cost=npu0.cost(0, "balanced"))
    assert running.wait(10)
    cost = npu0.cost(1000, "balanced")
    jobs = [npu0.submit(0, lambda p=p: p, cost=cost, priority=p) for p in (0, 5, 1, 5)]
    core = npu0.statistics().cores[0]
    assert core.running and core.queue_depth == 4
    gate.set()
    blocker.wait()
    results = [j.wait() for j in jobs]
    order = [value for value, rec in sorted(results, key=lambda r: r[1].seq)]
    seqs = [rec.seq for _, rec in results]
    assert order == [5, 5, 1, 0]  # higher first
    assert seqs[1] < seqs[3]  # equal priorities: submission order
    # The hot option reaches the job.
    m = load_program(PROGRAM).load_method(backend_options=opts(core=0, priority=3))
    m.execute(xs(2))
    assert npu0.statistics().cores[0].last_job.priority == 3
    m.set_options({NPU: {"priority": -2}})
    m.execute(xs(2))
    assert npu0.statistics().cores[0].last_job.priority == -2
    m.close()


# -- memory -------------------------------------------------------------------------------
def test_working_set_beyond_core_memory_fails_init(npu0: NpuDevice) -> None:
    big = np.zeros((1024, 1024), np.float32)  # 4 MiB of constants alone
    prog = load_program(delegated(big, 4))
    ws = analyze_subgraph(subgraph(big, 4)).working_set_bytes
    assert ws > 4 << 20
    with pytest.raises(BackendError) as ei:
        prog.load_method(backend_options=opts(core=2, label="cam2"))
    assert ei.value.code is Error.DelegateMemoryAllocationFailed
    msg = str(ei.value)
    assert f"needs {ws:,} bytes, {4 << 20:,} available" in msg
    assert "npu device 'npu0' core 2" in msg and "label 'cam2'" in msg and "constants 4,194,304" in msg
    assert npu0.statistics().cores[2].reserved_bytes == 0


def test_instances_on_one_core_share_its_memory(make_device) -> None:
    dev = make_device(cores=2, core_memory=64 << 10)
    w = np.ones((64, 160), np.float32)  # 40 KiB of constants: one instance fits a core, two don't
    prog = load_program(delegated(w, 8))
    ws = analyze_subgraph(subgraph(w, 8)).working_set_bytes
    assert ws <= 64 << 10 < 2 * ws
    a = prog.load_method(backend_options=opts(device=dev.name, core=0, label="a"))
    assert dev.statistics().cores[0].reserved_bytes == ws
    with pytest.raises(BackendError, match=rf"needs {ws:,} bytes, {(64 << 10) - ws:,} available .* by 1 other instance") as ei:
        prog.load_method(backend_options=opts(device=dev.name, core=0, label="b"))
    assert ei.value.code is Error.DelegateMemoryAllocationFailed
    b = prog.load_method(backend_options=opts(device=dev.name, core=1, label="b"))  # the other core has room
    a.close()
    assert dev.statistics().cores[0].reserved_bytes == 0
    c = prog.load_method(backend_options=opts(device=dev.name, core=0, label="c"))
    x = np.ones((8, 64), np.float32)
    for m in (b, c):
        np.testing.assert_array_equal(m.execute([x])[0], np.full((8, 160), 64, np.float32))
        m.close()


def test_concurrent_inits_never_over_commit_a_core(make_device) -> None:
    dev = make_device(cores=1, core_memory=64 << 10)
    prog = load_program(delegated(np.ones((64, 160), np.float32), 8))
    made, failed = [], []

    def load() -> None:
        try:
            made.append(prog.load_method(backend_options=opts(device=dev.name)))
        except BackendError as exc:
            failed.append(exc.code)

    threads = [threading.Thread(target=load) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and failed == [Error.DelegateMemoryAllocationFailed] * 7
    made[0].close()


# -- hot-plug -----------------------------------------------------------------------------
def test_offline_core_fails_fast_while_the_others_keep_working(npu0: NpuDevice) -> None:
    prog = load_program(PROGRAM)
    ms = [prog.load_method(backend_options=opts(core=i, label=f"cam{i}")) for i in range(4)]
    x = xs(3)[0]
    for m in ms:
        m.execute([x])
    npu0.set_online(2, False)
    assert npu0.online_cores() == (0, 1, 3) and not npu0.is_online(2)
    with pytest.raises(BackendError, match=r"npu device 'npu0': core 2 is offline \(online cores: 0, 1, 3\); "
                                           r"set_online\(2, True\) brings it back") as ei:
        ms[2].execute([x])
    assert ei.value.code is Error.DelegateInvalidHandle
    for i in (0, 1, 3):
        np.testing.assert_allclose(ms[i].execute([x])[0], ref(x), rtol=1e-5, atol=1e-5)
    stats = npu0.statistics()
    assert [c.jobs for c in stats.cores] == [2, 2, 1, 2] and not stats.cores[2].online
    assert ms[2].statistics().failures == 1
    npu0.set_online(2, True)
    np.testing.assert_allclose(ms[2].execute([x])[0], ref(x), rtol=1e-5, atol=1e-5)
    assert npu0.statistics().cores[2].jobs == 2
    for m in ms:
        m.close()


def test_jobs_queued_or_running_on_a_core_that_goes_offline_fail(npu0: NpuDevice) -> None:
    cam1 = load_program(PROGRAM).load_method(backend_options=opts(core=1, label="cam1"))
    cam0 = load_program(PROGRAM).load_method(backend_options=opts(core=0, label="cam0"))
    gate, running = threading.Event(), threading.Event()
    blocker = npu0.submit(1, lambda: (running.set(), gate.wait()), cost=npu0.cost(0, "balanced"))
    assert running.wait(10)
    queued: list[BaseException] = []

    def execute_cam1() -> None:
        try:
            cam1.execute(xs(4))
        except BackendError as exc:
            queued.append(exc)

    t = threading.Thread(target=execute_cam1)
    t.start()
    deadline = time.monotonic() + 10
    while npu0.statistics().cores[1].queue_depth < 1 and time.monotonic() < deadline:
        time.sleep(0.001)
    npu0.set_online(1, False)
    npu0.set_online(1, True)  # back before the queued job's turn: it still fails (its result was lost)
    gate.set()
    with pytest.raises(BackendError, match="core 1 went offline while this job was running") as ei:
        blocker.wait()
    assert ei.value.code is Error.DelegateInvalidHandle
    t.join()
    assert "npu device 'npu0': core 1 went offline while this job was queued" in str(queued[0])
    assert queued[0].code is Error.DelegateInvalidHandle
    x = xs(5)[0]
    np.testing.assert_allclose(cam1.execute([x])[0], ref(x), rtol=1e-5, atol=1e-5)  # works again
    np.testing.assert_allclose(cam0.execute([x])[0], ref(x), rtol=1e-5, atol=1e-5)
    core1 = npu0.statistics().cores[1]
    assert core1.failed_jobs == 2 and core1.jobs == 1
    cam0.close()
    cam1.close()


@pytest.mark.timeout(30)
def test_going_offline_cuts_a_modelled_sleep_short(make_device) -> None:
    dev = make_device(time_scale=1.0)
    job = dev.submit(3, lambda: None, cost=dev.cost(256 * 10**12, "low"))  # ~5e3 s modelled
    deadline = time.monotonic() + 10
    while not dev.statistics().cores[3].running and time.monotonic() < deadline:
        time.sleep(0.001)
    dev.set_online(3, False)
    with pytest.raises(BackendError, match="core 3 went offline while this job was running"):
        job.wait()


def test_cost_model_follows_the_documented_formula(make_device) -> None:
    dev = make_device(time_scale=1.0, cores=1)
    cost = dev.cost(256 * 200_000 * 20, "low")  # 20 ms at 200 MHz, 256 MACs/cycle (+ 10 µs overhead)
    dev.submit(0, lambda: None, cost=cost).wait()
    assert cost.device_seconds == pytest.approx(0.02001)
    assert dev.statistics().cores[0].busy_seconds == pytest.approx(0.02001)


# -- init-only options ----------------------------------------------------------------------
def test_changing_core_moves_the_instance_at_the_next_execute(npu0: NpuDevice) -> None:
    m = load_program(PROGRAM).load_method(backend_options=opts(core=0, label="cam"))
    ws = analyze_subgraph(subgraph(W, M)).working_set_bytes
    x = xs(6)[0]
    m.execute([x])
    m.set_options({NPU: {"core": 3}})
    reserved = [c.reserved_bytes for c in npu0.statistics().cores]
    assert reserved == [ws, 0, 0, 0]  # nothing moves between executes
    np.testing.assert_allclose(m.execute([x])[0], ref(x), rtol=1e-5, atol=1e-5)
    stats = npu0.statistics()
    assert [c.reserved_bytes for c in stats.cores] == [0, 0, 0, ws]  # old reservation released
    assert [c.jobs for c in stats.cores] == [1, 0, 0, 1]
    assert stats.cores[3].instances == ("cam",) and stats.cores[3].last_job.thread_id == core_thread(npu0, 3).ident
    assert m.statistics().reinits == 1 and m.options()[NPU]["core"] == 3
    m.close()
    assert all(c.reserved_bytes == 0 for c in npu0.statistics().cores)


def test_unknown_device_and_out_of_range_core_name_the_thing(npu0: NpuDevice) -> None:
    prog = load_program(PROGRAM)
    with pytest.raises(BackendError, match=r"npu device 'npu9' is not registered \(registered: npu0\)") as ei:
        prog.load_method(backend_options=opts(device="npu9"))
    assert ei.value.code is Error.NotFound
    with pytest.raises(BackendError, match=r"npu device 'npu0' has no core 4 \(it has 4 cores: 0\.\.3\)") as ei:
        prog.load_method(backend_options=opts(core=4))
    assert ei.value.code is Error.InvalidArgument
    with pytest.raises(InvalidArgumentError, match="option 'core' must be int, got str '1'"):
        prog.load_method(backend_options=opts(core="1"))
    with pytest.raises(InvalidArgumentError, match="option 'power_mode' must be one of 'low', 'balanced', 'performance'; got 'turbo'"):
        prog.load_method(backend_options=opts(power_mode="turbo"))
    # A bad init-only change fails at the next execute and leaves the instance as it was.
    m = prog.load_method()
    x = xs(8)[0]
    m.execute([x])
    m.set_options({NPU: {"core": -1}})
    with pytest.raises(BackendError, match="has no core -1"):
        m.execute([x])
    m.set_options({NPU: {"core": 0}})
    np.testing.assert_allclose(m.execute([x])[0], ref(x), rtol=1e-5, atol=1e-5)
    assert [c.reservations for c in npu0.statistics().cores] == [1, 0, 0, 0]
    m.close()


# -- the device ---------------------------------------------------------------------------
def test_close_joins_the_core_threads_and_fails_what_was_queued() -> None:
    before = threading.active_count()
    dev = register_device(NpuDevice("npu-close", cores=6))
    assert threading.active_count() == before + 6
    m = load_program(PROGRAM).load_method(backend_options=opts(device="npu-close", core=5))
    m.execute(xs(9))
    gate, running = threading.Event(), threading.Event()
    blocker = dev.submit(5, lambda: (running.set(), gate.wait(), "done")[-1], cost=dev.cost(0, "low"))
    assert running.wait(10)
    queued = dev.submit(5, lambda: "never", cost=dev.cost(0, "low"))
    closer = threading.Thread(target=dev.close)
    closer.start()
    deadline = time.monotonic() + 10
    while not dev.closed and time.monotonic() < deadline:
        time.sleep(0.001)
    gate.set()
    closer.join()
    assert blocker.wait()[0] == "done"  # the running job finished
    with pytest.raises(BackendError, match="npu device 'npu-close' is closed") as ei:
        queued.wait()
    assert ei.value.code is Error.InvalidState
    assert threading.active_count() == before  # every core thread joined
    assert "npu-close" not in devices()
    with pytest.raises(BackendError, match="is closed"):
        m.execute(xs(9))
    with pytest.raises(BackendError, match="is closed"):
        dev.submit(0, lambda: None, cost=dev.cost(0, "low"))
    m.close()  # releasing on a closed device is a no-op
    dev.close()  # idempotent
    with NpuDevice("npu-ctx", cores=2) as d2:
        assert threading.active_count() == before + 2 and not d2.closed
    assert threading.active_count() == before


def test_registry(make_device) -> None:
    dev = make_device("npu-reg")
    assert "npu-reg" in devices() and get_device("npu-reg") is dev
    with NpuDevice("npu-reg", cores=1) as other:
        with pytest.raises(InvalidArgumentError, match="an npu device named 'npu-reg' is already registered"):
            register_device(other)
    assert register_device(dev) is dev  # registering the same device again is harmless
    assert unregister_device("npu-reg") is dev and "npu-reg" not in devices()
    with pytest.raises(BackendError, match=r"npu device 'npu-reg' is not registered") as ei:
        get_device("npu-reg")
    assert ei.value.code is Error.NotFound
    with pytest.raises(InvalidArgumentError, match="is closed"):
        d = NpuDevice("npu-closed", cores=1)
        d.close()
        register_device(d)


def test_device_parameters_are_validated() -> None:
    cases = [
        (dict(cores=0), "cores must be an int >= 1"),
        (dict(core_memory=[1, 2]), r"core_memory must be an int >= 0 or one per core \(4\)"),
        (dict(clock_mhz={"low": 0}), r"clock_mhz\['low'\] must be a positive number"),
        (dict(power_w={"low": 1.0}), "clock_mhz and power_w must name the same power modes"),
        (dict(links={"front": 7}), r"link 'front' -> core 7 is not a core of this device \(cores 0..3\)"),
        (dict(time_scale=-1), "time_scale must be a number >= 0"),
        (dict(macs_per_cycle=0), "macs_per_cycle must be an int >= 1"),
    ]
    before = threading.active_count()
    for kw, pattern in cases:
        with pytest.raises(InvalidArgumentError, match=pattern):
            NpuDevice("npu-bad", **kw)
    assert threading.active_count() == before  # nothing started
    with NpuDevice("npu-links", cores=3, core_memory=[1, 2, 3], links={"left": 2, "right": 2}) as d:
        assert d.core_memory == (1, 2, 3) and d.core_for_link("right") == 2
        assert d.statistics().cores[2].links == ("left", "right")
        with pytest.raises(InvalidArgumentError, match=r"no camera link 'front' \(links: left, right\)"):
            d.core_for_link("front")
        with pytest.raises(InvalidArgumentError, match=r"no power mode 'turbo' \(modes: low, balanced, performance\)"):
            d.cost(1, "turbo")


# -- cost model ----------------------------------------------------------------------------
def test_cost_table_for_the_hand_built_subgraph() -> None:
    c = analyze_subgraph(subgraph(W, M))
    assert [(o.operator, o.rule, o.macs) for o in c.ops] == [
        ("aten::mm.out", "mm", M * N * K), ("aten::relu.out", "elementwise", M * N)]
    assert c.macs == MACS and c.constant_bytes == K * N * 4 and c.arena_bytes == (M * K + 2 * M * N) * 4


def test_cost_table_for_conv_linear_addmm_bmm() -> None:
    aot = pytest.importorskip("orchestra.aot")
    b = aot.ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (1, 8, 16, 16))
    y = f.call("aten::convolution.out", x, np.ones((16, 4, 3, 3), np.float32), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 2)
    a = f.input(np.float32, (5, 7))
    z = f.call("aten::linear.out", a, np.ones((3, 7), np.float32), None)
    z2 = f.call("aten::addmm.out", np.ones((3,), np.float32), a, np.ones((7, 3), np.float32))
    z3 = f.call("aten::bmm.out", f.input(np.float32, (2, 5, 7)), np.ones((2, 7, 3), np.float32))
    f.output(y, z, z2, z3)
    ops = {o.rule: o.macs for o in analyze_subgraph(b.build()).ops}
    assert ops == {"conv": 16 * 16 * 16 * (8 // 2) * 3 * 3, "linear": 5 * 3 * 7, "addmm": 5 * 3 * 7, "bmm": 2 * 5 * 3 * 7}


# -- AOT ----------------------------------------------------------------------------------
def test_aot_preprocess_and_program_builder_delegate(npu0: NpuDevice) -> None:
    aot = pytest.importorskip("orchestra.aot")
    details = npu_sim.NpuSimBackendDetails
    if NPU not in aot.aot_backends():
        aot.register_aot_backend(NPU, details)
    sub = aot.ProgramBuilder()
    s = sub.method("forward")
    sx = s.input(np.float32, (M, K))
    s.output(s.call("aten::relu.out", s.call("aten::mm.out", sx, W)))
    outer = aot.ProgramBuilder()
    f = outer.method("forward")
    (y,) = f.delegate(NPU, sub, [f.input(np.float32, (M, K))])
    f.output(y)
    prog = load_program(outer.to_bytes())
    ms = [prog.load_method(backend_options=opts(core=i, label=f"cam{i}")) for i in (0, 3)]
    x = xs(11)[0]
    for m in ms:
        np.testing.assert_allclose(m.execute([x])[0], ref(x), rtol=1e-5, atol=1e-5)
        m.close()
    assert [c.jobs for c in npu0.statistics().cores] == [1, 0, 0, 1]
    assert npu0.statistics().cores[3].last_job.cost.macs == MACS
    with pytest.raises(InvalidArgumentError, match=r"NpuSimBackend takes no compile specs \(got 'core'\)"):
        details.preprocess(sub.build(), (aot.CompileSpec("core", b"1"),))
    with pytest.raises(BackendError, match="lowers orchestra ProgramDefs") as ei:
        details.preprocess(object(), ())
    assert ei.value.code is Error.DelegateInvalidCompatibility
    blob = details.preprocess(sub.build(), ()).processed_bytes
    assert analyze_subgraph(load_program(blob).definition).macs == MACS


def test_a_blob_that_is_not_a_subgraph_is_rejected_at_init(npu0: NpuDevice) -> None:
    values = [_t((4,), 0), _t((4,), 16)]
    plan = ExecutionPlan("forward", None, tuple(values), (0,), (1,), (Chain((0,), (1,), (Instruction(DelegateCall(0, (0, 1))),)),),
                         (), (BackendDelegate(NPU, BackendDelegateDataReference(DataLocation.INLINE, 0)),), (0, 32))
    bad = ProgramDef(0, (plan,), backend_delegate_data=(BackendDelegateInlineData(memoryview(b"not a pte")),))
    with pytest.raises(BackendError, match=r"NpuSimBackend: method 'forward' delegate 0: the processed blob is not a subgraph") as ei:
        load_program(bad).load_method()
    assert ei.value.code is Error.DelegateInvalidCompatibility


def test_public_names_are_importable() -> None:
    for name in npu_sim.__all__:
        assert hasattr(npu_sim, name), name
