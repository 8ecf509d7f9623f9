"""orchestra.pipeline: sources, drop policies, deadlines, failures, exact accounting.

Executors here are real: coroutines that sleep (``anyio.sleep``) or do numpy work, and a
dedicated worker thread running a callable (a real ``orchestra`` Method in one test). Every
test checks the accounting identity of every pipeline it ran.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
import structlog

import orchestra
import orchestra.pipeline as pl
from orchestra.errors import InvalidArgumentError, NotFoundError, OrchestraError
from orchestra.pipeline import (
    Accounting,
    AccountingError,
    CollectSink,
    DropReason,
    Frame,
    FramesFile,
    FrameStream,
    Pipeline,
    Pipelines,
    SourceError,
    SyntheticCamera,
)

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(params=[pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
                        pytest.param("asyncio", id="asyncio")])
def anyio_backend(request: pytest.FixtureRequest) -> Any:
    return request.param


# --- real small executors ----------------------------------------------------------------

class SleepExecutor:
    """Takes ``delay`` seconds per frame (real ``anyio.sleep``); returns the frame's sum."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.calls = 0

    async def execute(self, inputs: list[Any]) -> list[Any]:
        self.calls += 1
        await anyio.sleep(self.delay)
        return [np.asarray(inputs[0]).sum()]


class NumpyExecutor:
    """A small real numpy workload on the loop: data @ W."""

    def __init__(self, n: int) -> None:
        self.w = np.random.default_rng(0).standard_normal((n, 8)).astype(np.float32)

    async def execute(self, inputs: list[Any]) -> list[Any]:
        return [np.tanh(inputs[0].reshape(-1, self.w.shape[0]) @ self.w)]


def _deliver(fut: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if fut.done():  # its caller was cancelled
        return
    if error is None:
        fut.set_result(result)
    else:
        fut.set_exception(error)


class ThreadExecutor:
    """Runs ``fn(inputs)`` on one dedicated, long-lived worker thread (SimpleQueue in,
    ``call_soon_threadsafe`` out), like an orchestrator instance does."""

    def __init__(self, fn: Callable[[list[Any]], list[Any]], name: str = "worker") -> None:
        self.fn = fn
        self.name = name
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (item := self._q.get()) is not None:
            loop, fut, inputs = item
            try:
                out = self.fn(inputs)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                loop.call_soon_threadsafe(_deliver, fut, None, exc)
            else:
                loop.call_soon_threadsafe(_deliver, fut, out, None)

    async def execute(self, inputs: list[Any]) -> list[Any]:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._q.put((loop, fut, inputs))
        return await fut

    def describe(self) -> dict[str, Any]:
        return {"instance": self.name, "unit": {"thread": self._thread.name}, "options": {"threads": 1}}

    def close(self) -> None:
        self._q.put(None)
        self._thread.join()


def check(*pipes: Pipeline | Pipelines) -> None:
    for p in pipes:
        acc = p.accounting()
        acc.check()
        if isinstance(p, Pipelines):
            for q in p:
                q.accounting().check()


def indices(sink: CollectSink) -> list[int]:
    return [r.frame.index for r in sink.results]


# --- the public surface ------------------------------------------------------------------

def test_public_names_importable() -> None:
    for name in pl.__all__:
        assert getattr(pl, name) is not None, name
    assert {"Pipeline", "Pipelines", "SyntheticCamera", "FramesFile", "Frame", "load_source"} <= set(pl.__all__)


def test_accounting_check_catches_lost_and_stuck_frames() -> None:
    d = {r.value: 0 for r in DropReason}
    Accounting("a", 3, 2, 0, {**d, "evicted": 1}, 0, 0, False).check()
    Accounting("a", 3, 1, 0, d, 1, 1, True).check()
    with pytest.raises(AccountingError, match="produced 3"):
        Accounting("a", 3, 1, 0, d, 0, 0, False).check()
    with pytest.raises(AccountingError, match="in flight after the run"):
        Accounting("a", 3, 2, 0, d, 1, 0, False).check()


# --- drop policies -------------------------------------------------------------------------

@pytest.mark.anyio
async def test_drop_oldest_keeps_the_newest_frames_with_a_slow_executor() -> None:
    cam = SyntheticCamera("c", fps=200, shape=(4, 4), seed=1, count=60)
    sink = CollectSink()
    p = Pipeline("c", cam, SleepExecutor(0.02), sink=sink, queue=4, drop="drop_oldest")
    st = await p.run()
    check(p)
    acc = st.accounting
    assert acc.produced == 60 and acc.dropped["evicted"] > 0
    assert acc.dropped["queue_full"] == acc.dropped["deadline"] == acc.dropped["shutdown"] == 0
    assert acc.processed + acc.dropped["evicted"] == 60 and acc.failed == 0
    got = indices(sink)
    assert got == sorted(got) and len(got) == acc.processed
    assert got[-4:] == [56, 57, 58, 59]  # the last queued frames win and are drained at the end
    assert st.queue_max == 4 and st.queue_depth == 0 and st.state == "done"
    assert st.latency.count == acc.processed


@pytest.mark.anyio
async def test_drop_newest_keeps_the_queued_frames_and_drops_arrivals() -> None:
    cam = SyntheticCamera("c", fps=200, shape=(4, 4), seed=1, count=60)
    sink = CollectSink()
    p = Pipeline("c", cam, SleepExecutor(0.02), sink=sink, queue=4, drop="drop_newest")
    st = await p.run()
    check(p)
    acc = st.accounting
    assert acc.dropped["queue_full"] > 0 and acc.dropped["evicted"] == 0
    assert acc.processed + acc.dropped["queue_full"] == 60
    got = indices(sink)
    assert got[:4] == [0, 1, 2, 3] and got == sorted(got)
    assert len(got) < 60  # some arrived at a full queue
    assert st.queue_max == 4


@pytest.mark.anyio
async def test_block_loses_no_frame_and_the_schedule_slips() -> None:
    cam = SyntheticCamera("c", fps=500, shape=(8,), seed=2, count=40)
    sink = CollectSink()
    p = Pipeline("c", cam, SleepExecutor(0.005), sink=sink, queue=2, drop="block")
    st = await p.run()
    check(p)
    acc = st.accounting
    assert acc.produced == acc.processed == 40 and acc.dropped_total == 0
    assert indices(sink) == list(range(40))
    t = [r.frame.t_capture for r in sink.results]
    # the consumer takes ~5 ms a frame, the camera wants 2 ms: its schedule slipped
    assert t[-1] - t[0] > 39 / 500 * 1.5
    assert st.queue_max <= 2


@pytest.mark.anyio
async def test_block_over_a_timed_run_processes_every_produced_frame() -> None:
    cam = SyntheticCamera("c", fps=1000, shape=(8,), seed=2)  # endless, faster than the executor
    sink = CollectSink()
    p = Pipeline("c", cam, SleepExecutor(0.003), sink=sink, queue=3, drop="block")
    st = await p.run(duration_s=0.3)
    check(p)
    acc = st.accounting
    assert acc.produced > 0 and acc.processed == acc.produced and acc.dropped_total == 0
    assert indices(sink) == list(range(acc.produced))


@pytest.mark.anyio
async def test_late_consumer_does_not_slow_a_live_camera() -> None:
    fps = 100
    cam = SyntheticCamera("c", fps=fps, shape=(4,), seed=3, count=30)
    sink = CollectSink()
    p = Pipeline("c", cam, SleepExecutor(0.05), sink=sink, queue=2, drop="drop_oldest")
    await p.run()
    check(p)
    r0 = sink.results[0].frame
    for r in sink.results:  # capture times stay on the schedule t0 + k/fps (no slip piles up;
        # a stamp may be early by up to uvloop's 1 ms timer granularity, never late)
        assert r.frame.t_capture - r0.t_capture == pytest.approx((r.frame.index - r0.index) / fps, abs=1.5e-3)
    assert p.accounting().dropped["evicted"] > 0


# --- deadlines, failures -------------------------------------------------------------------

class AgeExecutor:
    """Gets the Frame itself (via pre) and records its age when execution starts."""

    def __init__(self, delay: float, clock: Callable[[], float]) -> None:
        self.delay = delay
        self.clock = clock
        self.ages: list[float] = []

    async def execute(self, inputs: list[Any]) -> list[Any]:
        frame: Frame = inputs[0]
        self.ages.append(self.clock() - frame.t_capture)
        await anyio.sleep(self.delay)
        return [frame.index]


@pytest.mark.anyio
@pytest.mark.parametrize("drop", ["drop_oldest", "block"])
async def test_frames_older_than_the_deadline_are_dropped_not_executed(drop: str) -> None:
    cam = SyntheticCamera("c", fps=200, shape=(4,), seed=4, count=50)
    ex = AgeExecutor(0.02, cam.clock)
    p = Pipeline("c", cam, ex, pre=lambda f: [f], queue=8, drop=drop, deadline_s=0.03)
    st = await p.run()
    check(p)
    acc = st.accounting
    assert acc.dropped["deadline"] > 0
    assert len(ex.ages) == acc.processed
    assert max(ex.ages) <= 0.03 + 0.005  # checked by the pipeline just before (a few µs earlier)
    assert acc.processed + acc.dropped_total == 50


class FlakyExecutor:
    """Fails on every frame whose index is a multiple of 3."""

    async def execute(self, inputs: list[Any]) -> list[Any]:
        data, index = inputs
        await anyio.lowlevel.checkpoint()
        if index % 3 == 0:
            raise ValueError(f"bad frame {index}")
        return [data.mean()]


@pytest.mark.anyio
async def test_executor_failures_are_counted_logged_and_the_pipeline_goes_on() -> None:
    cam = SyntheticCamera("front", fps=1000, shape=(4,), seed=5, count=30)
    sink = CollectSink()
    p = Pipeline("front-pipe", cam, FlakyExecutor(), pre=lambda f: [f.data, f.index], sink=sink, drop="block")
    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        st = await p.run()
    check(p)
    assert st.accounting.failed == 10 and st.accounting.processed == 20
    assert all(i % 3 for i in indices(sink))
    assert st.last_error == "execute: ValueError: bad frame 27"
    failed = [e for e in logs if e["event"] == "frame failed"]
    assert failed and all(e["camera"] == "front" and e["pipeline"] == "front-pipe" for e in failed)
    assert failed[0]["index"] == 0 and failed[0]["stage"] == "execute"
    assert len(failed) < 10  # repeats are thinned out


@pytest.mark.anyio
async def test_failures_in_pre_post_and_sink_are_counted_per_frame() -> None:
    def pre(f: Frame) -> list[Any]:
        if f.index == 1:
            raise RuntimeError("pre broke")
        return [f.data]

    def post(f: Frame, outputs: list[Any]) -> Any:
        if f.index == 2:
            raise RuntimeError("post broke")
        return outputs[0]

    got: list[int] = []

    async def sink(r: pl.Result) -> None:
        if r.frame.index == 3:
            raise RuntimeError("sink broke")
        got.append(r.frame.index)

    cam = SyntheticCamera("c", fps=1000, shape=(4,), seed=5, count=6)
    p = Pipeline("c", cam, NumpyExecutor(4), pre=pre, post=post, sink=sink, drop="block")
    st = await p.run()
    check(p)
    assert st.accounting.failed == 3 and st.accounting.processed == 3 and got == [0, 4, 5]


# --- stopping ------------------------------------------------------------------------------

@pytest.mark.anyio
async def test_stop_without_drain_accounts_everything_as_shutdown() -> None:
    cam = SyntheticCamera("c", fps=500, shape=(4,), seed=6)
    p = Pipeline("c", cam, SleepExecutor(0.05), queue=8, drop="drop_oldest")
    async with anyio.create_task_group() as tg:
        tg.start_soon(p.run)
        await anyio.sleep(0.1)
        assert p.state == "running"
        p.accounting().check()  # holds while running, with frames in flight
        assert p.accounting().in_flight > 0
        p.stop(drain=False)
    check(p)
    acc = p.accounting()
    assert acc.dropped["shutdown"] > 0 and acc.in_flight == 0 and p.state == "done"


@pytest.mark.anyio
async def test_cancelling_run_loses_no_frame() -> None:
    cam = SyntheticCamera("c", fps=500, shape=(4,), seed=6)
    def slow_double(inputs: list[Any]) -> list[Any]:
        time.sleep(0.01)
        return [inputs[0] * 2]

    ex = ThreadExecutor(slow_double)
    try:
        p = Pipeline("c", cam, ex, queue=8, drop="drop_newest", inflight=2)
        # cancelled once frames were processed and more wait (not after a fixed time: a stalled
        # host once produced a single frame in 0.2 s); the deadline only guards a hung run
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(p.run)
                while p.accounting().processed < 2:
                    await anyio.sleep(0.005)
                await anyio.sleep(0.05)  # the queue fills again (500 fps in, ~200 fps out)
                tg.cancel_scope.cancel()
        check(p)
        acc = p.accounting()
        assert acc.in_flight == 0 and acc.dropped["shutdown"] > 0 and acc.processed > 0
    finally:
        ex.close()


@pytest.mark.anyio
async def test_stop_with_drain_processes_the_queue() -> None:
    cam = SyntheticCamera("c", fps=1000, shape=(4,), seed=6)
    sink = CollectSink()
    p = Pipeline("c", cam, SleepExecutor(0.005), sink=sink, queue=6, drop="drop_oldest")
    async with anyio.create_task_group() as tg:
        tg.start_soon(p.run)
        await anyio.sleep(0.08)
        p.stop()
        assert p.state == "stopping"
    check(p)
    acc = p.accounting()
    assert acc.dropped["shutdown"] == 0 and acc.processed == len(sink)
    assert indices(sink)[-1] == acc.produced - 1  # the newest frame was drained to the sink


@pytest.mark.anyio
async def test_stop_before_run_and_run_once() -> None:
    p = Pipeline("c", SyntheticCamera("c", 30, (2,)), SleepExecutor(0))
    p.stop()
    st = await p.run()
    check(p)
    assert st.accounting.produced == 0 and st.state == "done"
    with pytest.raises(OrchestraError, match="already ran"):
        await p.run()


# --- ordering and concurrency --------------------------------------------------------------

class JitterExecutor:
    """Frame-dependent delays, so that concurrent executes finish out of order."""

    def __init__(self) -> None:
        self.running = 0
        self.peak = 0

    async def execute(self, inputs: list[Any]) -> list[Any]:
        frame: Frame = inputs[0]
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await anyio.sleep((7 * frame.index % 5) * 0.002)
        finally:
            self.running -= 1
        return [frame.index]


@pytest.mark.anyio
async def test_inflight_runs_concurrently_and_delivers_in_order() -> None:
    cam = SyntheticCamera("c", fps=2000, shape=(2,), seed=7, count=80)
    sink = CollectSink()
    ex = JitterExecutor()
    p = Pipeline("c", cam, ex, pre=lambda f: [f], sink=sink, queue=4, drop="block", inflight=4)
    st = await p.run()
    check(p)
    assert st.accounting.processed == 80 and indices(sink) == list(range(80))
    assert [r.outputs[0] for r in sink.results] == list(range(80))
    assert ex.peak > 1


@pytest.mark.anyio
async def test_many_pipelines_at_once() -> None:
    drops = ["drop_oldest", "drop_newest", "block"]
    sinks: dict[str, CollectSink] = {}
    group = Pipelines()
    for i in range(24):
        name = f"cam{i}"
        sinks[name] = CollectSink()
        ex: Any = SleepExecutor(0.004 * (i % 4)) if i % 2 else NumpyExecutor(16)
        group.add(Pipeline(name, SyntheticCamera(name, fps=60 + 10 * i, shape=(4, 4), seed=i), ex,
                           sink=sinks[name], queue=2 + i % 3, drop=drops[i % 3], inflight=1 + i % 2,
                           deadline_s=0.5 if i % 5 == 0 else None))
    with pytest.raises(InvalidArgumentError, match="two pipelines named 'cam0'"):
        group.add(Pipeline("cam0", SyntheticCamera("x", 30, (2,)), SleepExecutor(0)))
    st = await group.run(duration_s=0.4)
    check(group)
    assert len(st.pipelines) == 24 and st.accounting.produced > 0
    assert st.accounting.processed == sum(s.accounting.processed for s in st.pipelines)
    assert st.latency.count == st.accounting.processed
    for s in st.pipelines:
        assert s.state == "done" and s.accounting.produced > 0
        got = indices(sinks[s.name])
        assert got == sorted(got) and len(got) == s.accounting.processed
        assert s.queue_max <= s.queue_capacity
        if s.drop == "block":
            assert s.accounting.processed == s.accounting.produced
    assert group["cam2"].statistics().drop == "block"


class BrokenCamera:
    """Yields a few frames, then fails like an unplugged camera."""

    def __init__(self, name: str, good: int) -> None:
        self.name = name
        self.good = good

    async def frames(self) -> AsyncIterator[Frame]:
        for k in range(self.good):
            await anyio.sleep(0.001)
            yield Frame(self.name, k, np.full((2,), k, np.float32), time.monotonic())
        raise OSError("camera unplugged")


@pytest.mark.anyio
async def test_a_failing_source_stops_its_pipeline_only() -> None:
    bad = Pipeline("bad", BrokenCamera("bad", 5), SleepExecutor(0.01), queue=8, drop="block")
    good = Pipeline("good", SyntheticCamera("good", 200, (2,), count=20), SleepExecutor(0.001), drop="block")
    group = Pipelines([bad, good])
    with pytest.raises(ExceptionGroup) as info:
        await group.run()
    check(group)
    assert [type(e) for e in info.value.exceptions] == [SourceError]
    assert "camera unplugged" in str(info.value.exceptions[0])
    assert bad.state == "failed" and bad.accounting().processed == 5  # accepted frames drained
    assert good.state == "done" and good.accounting().processed == 20
    assert bad.statistics().last_error == "source: OSError: camera unplugged"


# --- statistics ----------------------------------------------------------------------------

@pytest.mark.anyio
async def test_statistics_rates_latency_and_executor_description() -> None:
    cam = SyntheticCamera("c", fps=100, shape=(4, 4), seed=8)
    ex = ThreadExecutor(lambda inputs: [np.linalg.norm(inputs[0])], name="npu0")
    try:
        p = Pipeline("c", cam, ex, queue=4)
        before = p.statistics()
        assert before.state == "idle" and before.input_fps == 0.0
        async with anyio.create_task_group() as tg:
            tg.start_soon(p.run)
            await anyio.sleep(0.5)
            mid = p.statistics()
            mid.accounting.check()
            p.stop()
        check(p)
        st = p.statistics()
    finally:
        ex.close()
    assert mid.state == "running" and 50 < mid.input_fps < 200 and mid.output_fps > 0
    assert st.instance == "npu0" and st.unit == {"thread": "npu0"} and st.options == {"threads": 1}
    assert st.latency.count == st.accounting.processed and 0 < st.latency.p50 <= st.latency.p99
    assert st.failures == 0 and st.dropped["evicted"] == st.accounting.dropped["evicted"]


def test_rate_meter_counts_a_recent_window() -> None:
    m = pl.RateMeter(window_s=1.0, buckets=10)
    for i in range(100):
        m.record(10.0 + i * 0.01)  # 100/s for one second
    assert m.rate(10.995, since=10.0) == pytest.approx(100, rel=0.02)
    assert m.rate(20.0, since=10.0) == 0.0  # old events leave the window


@pytest.mark.anyio
async def test_keyed_routes_through_a_pool_with_a_key() -> None:
    """Two cameras keyed onto a real orchestrator pool of two instances: each camera's frames
    all run on the one instance its key sticks to, and the results are the program's."""
    from orchestra.orchestrator import InstanceSpec, Orchestrator
    from orchestra.runtime import load_program

    program = load_program(Path(__file__).resolve().parent.parent / "examples" / "models" / "convnet.pte")
    ref = program.load_method("forward")
    async with Orchestrator(period=None) as orch:
        pool = await orch.load(program, instances=[InstanceSpec("i0"), InstanceSpec("i1")])
        sinks = {c: CollectSink() for c in ("cam-a", "cam-b")}
        group = Pipelines(Pipeline(c, SyntheticCamera(c, 1000, (1, 3, 16, 16), seed=k, count=6), pl.keyed(pool, c),
                                   sink=sinks[c], drop="block") for k, c in enumerate(sinks))
        await group.run()
        check(group)
        owners = {c: pool.routed_to(c) for c in sinks}
        assert set(owners.values()) <= {"i0", "i1"} and None not in owners.values()
        runs = {n: pool[n].statistics().executes for n in ("i0", "i1")}
        assert sum(runs.values()) == 12
        for n in ("i0", "i1"):  # every frame ran on the instance its camera's key sticks to
            assert runs[n] == 6 * sum(1 for o in owners.values() if o == n)
        for c, sink in sinks.items():
            assert indices(sink) == list(range(6))
            for r in sink.results:
                np.testing.assert_allclose(r.outputs[0], ref.execute([r.frame.data])[0], rtol=1e-6)
        st = group["cam-a"].statistics()
        assert st.executor_info is not None and st.executor_info["key"] == "cam-a"
        for n in ("i0", "i1"):  # each frame's latency reached the instance that ran it (latency_target)
            inst = pool.instances[n]
            assert inst.frame_latency.count == runs[n] and inst.serves_pipeline == (runs[n] > 0)
        assert all(r.options is not None for sink in sinks.values() for r in sink.results)


# --- sources -------------------------------------------------------------------------------

@pytest.mark.anyio
async def test_synthetic_camera_is_deterministic() -> None:
    a = SyntheticCamera("a", 100, (3, 5), seed=42, count=6)
    b = SyntheticCamera("b", 1000, (3, 5), seed=42)
    c = SyntheticCamera("c", 1000, (3, 5), seed=43)
    frames = [f async for f in a.frames()]
    assert [f.index for f in frames] == list(range(6))
    for f in frames:
        assert f.camera == "a" and f.data.shape == (3, 5) and f.data.dtype == np.float32
        np.testing.assert_array_equal(f.data, b.frame_data(f.index))
        assert not np.array_equal(f.data, c.frame_data(f.index))
    assert not np.array_equal(a.frame_data(0), a.frame_data(1))
    assert not np.array_equal(a.frame_data(0), a.frame_data(15))  # same rotation, other offset
    assert [f.t_capture - frames[0].t_capture for f in frames] == pytest.approx([k / 100 for k in range(6)], abs=1.5e-3)
    assert all(f.t_capture <= a.clock() for f in frames)
    u8 = SyntheticCamera("u", 30, (4, 4, 3), dtype=np.uint8, seed=1)
    np.testing.assert_array_equal(u8.frame_data(300), SyntheticCamera("v", 30, (4, 4, 3), np.uint8, 1).frame_data(300))
    assert u8.frame_data(300).dtype == np.uint8
    with pytest.raises(InvalidArgumentError, match="fps"):
        SyntheticCamera("x", 0, (2,))
    with pytest.raises(InvalidArgumentError, match="dtype"):
        SyntheticCamera("x", 30, (2,), dtype=bool)
    with pytest.raises(InvalidArgumentError, match="shape"):
        SyntheticCamera("x", 30, (2, 0))


@pytest.mark.anyio
async def test_the_pipeline_measures_latency_on_the_sources_clock() -> None:
    cam = SyntheticCamera("c", 500, (2,), seed=1, clock=lambda: time.monotonic() + 1000.0, count=10)
    sink = CollectSink()
    p = Pipeline("c", cam, SleepExecutor(0), sink=sink, drop="block")
    st = await p.run()
    check(p)
    assert sink.results[0].frame.t_capture > time.monotonic() + 900
    assert 0 <= st.latency.max < 1.0 and all(0 <= r.latency < 1.0 for r in sink.results)


@pytest.mark.anyio
async def test_frames_file_npy_feeds_a_pipeline(tmp_path: Path) -> None:
    stack = np.arange(5 * 3 * 4, dtype=np.float32).reshape(5, 3, 4)
    path = tmp_path / "clip.npy"
    np.save(path, stack)
    src = FramesFile(path)
    assert (len(src), src.frame_shape, src.dtype, src.name) == (5, (3, 4), np.float32, "clip")
    sink = CollectSink()
    p = Pipeline("clip", src, NumpyExecutor(4), sink=sink, drop="block")
    st = await p.run()
    check(p)
    assert st.accounting.processed == 5 and indices(sink) == list(range(5))
    for r in sink.results:
        np.testing.assert_array_equal(r.frame.data, stack[r.frame.index])
        assert not r.frame.data.flags.writeable  # a read-only view of the mapping

    looped = FramesFile(path, fps=500, loop=True, name="loop")
    sink2 = CollectSink()

    async def stop_at_12(r: pl.Result) -> None:
        await sink2.send(r)
        if r.frame.index == 11:
            p2.stop()

    p2 = Pipeline("loop", looped, SleepExecutor(0), sink=stop_at_12, drop="block")
    await p2.run()
    check(p2)
    assert indices(sink2)[:12] == list(range(12))
    np.testing.assert_array_equal(sink2.results[7].frame.data, stack[2])


@pytest.mark.anyio
async def test_frames_file_raw(tmp_path: Path) -> None:
    frames = np.random.default_rng(0).integers(0, 255, (4, 2, 3), dtype=np.uint8)
    path = tmp_path / "cam.raw"
    path.write_bytes(frames.tobytes())
    src = FramesFile(path, shape=(2, 3), dtype="uint8")
    got = [f async for f in src.frames()]
    assert len(got) == 4
    for f in got:
        np.testing.assert_array_equal(f.data, frames[f.index])
    p = Pipeline("raw", FramesFile(path, shape=(2, 3), dtype=np.uint8), SleepExecutor(0), drop="block")
    assert (await p.run()).accounting.processed == 4
    check(p)


def test_frames_file_errors_name_the_file(tmp_path: Path) -> None:
    def expect(exc: type[OrchestraError], path: Path, match: str, **kw: Any) -> None:
        with pytest.raises(exc, match=match) as info:
            FramesFile(path, **kw)
        assert str(path) in str(info.value)

    expect(NotFoundError, tmp_path / "missing.npy", "no such file")
    garbage = tmp_path / "garbage.npy"
    garbage.write_bytes(b"this is not numpy at all")
    expect(InvalidArgumentError, garbage, "not a readable .npy")
    truncated = tmp_path / "truncated.npy"
    np.save(truncated, np.zeros((10, 64, 64), np.float32))
    truncated.write_bytes(truncated.read_bytes()[:1000])
    expect(InvalidArgumentError, truncated, "not a readable .npy")
    flat = tmp_path / "flat.npy"
    np.save(flat, np.zeros(10, np.float32))
    expect(InvalidArgumentError, flat, "stack of frames")
    empty = tmp_path / "empty.npy"
    np.save(empty, np.zeros((0, 4, 4), np.float32))
    expect(InvalidArgumentError, empty, "no frames")
    objects = tmp_path / "objects.npy"
    np.save(objects, np.array([[1, "a"]], dtype=object), allow_pickle=True)
    expect(InvalidArgumentError, objects, "npy")
    ok = tmp_path / "ok.npy"
    np.save(ok, np.zeros((2, 4, 4), np.float32))
    expect(InvalidArgumentError, ok, "expected \\(4, 5\\)", shape=(4, 5))
    expect(InvalidArgumentError, ok, "expected uint8", dtype=np.uint8)
    raw = tmp_path / "odd.raw"
    raw.write_bytes(b"\0" * 10)
    expect(InvalidArgumentError, raw, "needs shape= .* and dtype=")
    expect(InvalidArgumentError, raw, "not a multiple of one frame", shape=(2, 2), dtype=np.uint8)
    empty_raw = tmp_path / "empty.raw"
    empty_raw.write_bytes(b"")
    expect(InvalidArgumentError, empty_raw, "empty file", shape=(2,), dtype=np.uint8)
    other = tmp_path / "clip.mp4"
    other.write_bytes(b"\0")
    expect(InvalidArgumentError, other, "unsupported file type '.mp4'")
    expect(InvalidArgumentError, tmp_path, "not a regular file")


def test_load_source_by_name_and_module_attr() -> None:
    cam = pl.load_source("synthetic", name="c", fps=30, shape=(2, 2), seed=1)
    assert isinstance(cam, SyntheticCamera) and isinstance(cam, pl.Source)
    cam2 = pl.load_source("orchestra.pipeline:SyntheticCamera", name="d", fps=30, shape=(2,))
    assert cam2.name == "d"
    assert {"synthetic", "file"} <= set(pl.source_names())
    with pytest.raises(NotFoundError, match="'opencv' is not registered"):
        pl.load_source("opencv")
    with pytest.raises(InvalidArgumentError, match="bad parameters"):
        pl.load_source("synthetic", name="c", fps=30, shape=(2,), colour="red")
    with pytest.raises(NotFoundError, match="can't import module"):
        pl.load_source("no_such_module_xyz:Camera")
    with pytest.raises(InvalidArgumentError, match="already registered"):
        pl.register_source("synthetic", SyntheticCamera)


def test_pipeline_rejects_bad_parameters() -> None:
    cam = SyntheticCamera("c", 30, (2,))
    ex = SleepExecutor(0)
    with pytest.raises(InvalidArgumentError, match="drop must be one of"):
        Pipeline("p", cam, ex, drop="drop_random")
    with pytest.raises(InvalidArgumentError, match="queue must be an int >= 1"):
        Pipeline("p", cam, ex, queue=0)
    with pytest.raises(InvalidArgumentError, match="deadline_s"):
        Pipeline("p", cam, ex, deadline_s=-1)
    with pytest.raises(InvalidArgumentError, match="inflight"):
        Pipeline("p", cam, ex, inflight=0)
    with pytest.raises(InvalidArgumentError, match="no execute"):
        Pipeline("p", cam, object())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="no frames"):
        Pipeline("p", object(), ex)


# --- the stream on its own -----------------------------------------------------------------

@pytest.mark.anyio
async def test_frame_stream_policies_and_cancelled_getters() -> None:
    dropped: list[tuple[int, str]] = []
    s: FrameStream[int] = FrameStream(2, "drop_oldest", lambda x, r: dropped.append((x, r)))
    for i in range(4):
        s.put_nowait(i)
    assert list(s.drain()) == [2, 3] and dropped == [(0, "evicted"), (1, "evicted")]
    s2: FrameStream[int] = FrameStream(2, "drop_newest", lambda x, r: dropped.append((x, r)))
    assert [s2.put_nowait(i) for i in range(3)] == [True, True, False] and dropped[-1] == (2, "queue_full")
    s3: FrameStream[int] = FrameStream(1, "block")
    s3.put_nowait(0)
    with pytest.raises(anyio.WouldBlock):
        s3.put_nowait(1)

    # a getter cancelled right after being woken must not strand the item
    s4: FrameStream[int] = FrameStream(4, "drop_oldest")
    got: list[int] = []

    async def getter() -> None:
        got.append(await s4.get())

    async with anyio.create_task_group() as tg:
        with anyio.CancelScope() as first:
            tg.start_soon(getter)
        tg.start_soon(getter)
        await anyio.sleep(0.01)
        s4.put_nowait(7)
        first.cancel()
        await anyio.sleep(0.01)
        s4.put_nowait(8)
        s4.close()
    assert sorted(got + s4.drain()) == [7, 8]
    with pytest.raises(anyio.EndOfStream):
        await s4.get()


# --- a real orchestra Method on a dedicated worker thread ----------------------------------

@pytest.mark.anyio
async def test_real_method_on_a_worker_thread(tmp_path: Path) -> None:
    program = orchestra.load_program(str(FIXTURES / "mlp.pte"))
    info = program.method_meta("forward").inputs[0]
    expected = np.load(FIXTURES / "mlp.npz")
    x = expected["forward.in_0"]
    assert x.shape == info.shape

    method = program.load_method("forward")
    reference = program.load_method("forward")
    ex = ThreadExecutor(method.execute, name="mlp-0")
    np.save(tmp_path / "input.npy", np.stack([x, x * 0.5]))
    try:
        # the fixture's input, from a file: outputs equal ExecuTorch's
        file_sink = CollectSink()
        p1 = Pipeline("file", FramesFile(tmp_path / "input.npy"), ex, sink=file_sink, drop="block")
        # a synthetic camera shaped like the method's input
        cam = SyntheticCamera("cam", fps=300, shape=info.shape, dtype=info.dtype, seed=9, count=40)
        cam_sink = CollectSink()
        p2 = Pipeline("cam", cam, ex, sink=cam_sink, queue=4, drop="drop_oldest")
        group = Pipelines([p1, p2])
        await group.run()
        check(group)
    finally:
        ex.close()
    np.testing.assert_allclose(file_sink.results[0].outputs[0], expected["forward.out_0"], rtol=1e-5, atol=1e-6)
    assert p1.accounting().processed == 2 and p2.accounting().processed > 0
    for r in cam_sink.results:
        np.testing.assert_array_equal(r.outputs[0], reference.execute([cam.frame_data(r.frame.index)])[0])
    assert method.statistics().executions == p1.accounting().processed + p2.accounting().processed
    assert p2.statistics().instance == "mlp-0"


# --- audit regressions: sources that misbehave, cancellation in the sink, module:attr --------

class RaisingFrames:
    """A source whose frames() raises when called (a camera that can't be opened)."""

    name = "cam-raises"

    def frames(self) -> AsyncIterator[Frame]:
        raise OSError("device busy")


class NotAnIterator:
    """A source whose frames() returns something that is not an async iterator."""

    name = "cam-junk"

    def frames(self) -> Any:
        return 5


@pytest.mark.anyio
@pytest.mark.parametrize(("source", "error"), [(RaisingFrames(), "OSError: device busy"),
                                               (NotAnIterator(), "TypeError: frames() returned 5, not an async iterator")])
async def test_a_source_whose_frames_call_fails_is_a_source_error(source: Any, error: str) -> None:
    p = Pipeline("p", source, SleepExecutor(0.0), drop="drop_oldest")
    with pytest.raises(SourceError, match=rf"source '{source.name}' failed: {error.replace('(', '[(]').replace(')', '[)]')}"):
        await p.run()
    check(p)
    assert p.state == "failed" and p.statistics().last_error == f"source: {error}"
    assert p.accounting().produced == 0


class FirstExecuteSeesProduced:
    """Records how many frames the pipeline had produced when the first execute ran, then
    stops the pipeline."""

    def __init__(self) -> None:
        self.pipeline: Pipeline | None = None
        self.produced_at_first: int | None = None

    async def execute(self, inputs: list[Any]) -> list[Any]:
        assert self.pipeline is not None
        if self.produced_at_first is None:
            self.produced_at_first = self.pipeline.accounting().produced
            self.pipeline.stop()
        return [inputs[0]]


@pytest.mark.anyio
@pytest.mark.parametrize("drop", ["drop_oldest", "drop_newest"])
async def test_a_source_faster_than_the_machine_still_yields_to_the_loop(drop: str) -> None:
    # fps 1e9: every frame is already due, the source never sleeps. The workers (and so
    # timers, signal handlers) must still get the loop while it produces: the first execute
    # runs after a handful of frames, not after all of them.
    count = 5000
    ex = FirstExecuteSeesProduced()
    p = Pipeline("fast", SyntheticCamera("fast", 1e9, (2,), count=count), ex, queue=4, drop=drop)
    ex.pipeline = p
    with anyio.fail_after(60):
        await p.run()
    check(p)
    assert ex.produced_at_first is not None and ex.produced_at_first < 100
    assert p.accounting().produced < count  # stop() took effect mid-stream


@pytest.mark.anyio
async def test_cancelling_run_while_an_async_sink_holds_a_frame_counts_it_processed() -> None:
    received: list[int] = []
    in_sink = anyio.Event()

    async def sink(result: Any) -> None:
        received.append(result.frame.index)
        in_sink.set()
        await anyio.sleep_forever()  # a sink stuck on a slow network write

    p = Pipeline("c", SyntheticCamera("c", 1000, (2,), count=10), SleepExecutor(0.0), sink=sink, drop="block")
    async with anyio.create_task_group() as tg:
        tg.start_soon(p.run)
        await in_sink.wait()
        tg.cancel_scope.cancel()
    check(p)
    acc = p.accounting()
    assert received == [0]
    assert acc.processed == 1  # the sink saw it: processed, not dropped (shutdown)
    assert acc.produced == acc.processed + acc.dropped["shutdown"]


def test_module_attr_source_must_be_a_source_class(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with pytest.raises(orchestra.errors.ConfigError, match=r"'os:system' is <built-in function system>, not a class"):
        pl.load_source("os:system", command=f"touch {marker}")
    assert not marker.exists()
    with pytest.raises(orchestra.errors.ConfigError, match="not a source class"):
        pl.load_source("collections:OrderedDict")
