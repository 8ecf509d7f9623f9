#!/usr/bin/env python3
"""Many live cameras through orchestra pipelines: accounting, latency, bounded memory.

Default: 64 synthetic cameras at 30 fps for 60 s, ``drop_oldest``, queue 4. Each camera's
executor is a real orchestra Method of ``tests/fixtures/mlp.pte`` (input [2, 16] float32,
~60 µs an execute): ``--workers`` dedicated worker threads (default 2), each owning its own
Method, shared round-robin (camera i → worker i % workers); frames cross to a worker through
a ``queue.SimpleQueue`` and back with one ``loop.call_soon_threadsafe`` per batch of results.
``--executor numpy`` instead runs a small numpy workload inline on the loop per camera
(a [64, 64] frame @ [64, 32] + tanh).

Prints every ``--report`` seconds and at the end: frames produced / processed / failed /
dropped by reason / in flight, the accounting identity check (per camera and in total),
capture→sink latency p50/p95/p99 (recent frames in the reports, all frames at the end; the
sink of every camera logs each latency into one preallocated array), RSS at the start, the
middle and near the end of the run (memory must stay flat; also after shutdown) and the
deepest queue (bounded by ``--queue``). Baselines measured in the same run: the
stream's hand-off against ``asyncio.Queue`` and anyio memory streams, and the process's CPU
per frame against one direct execute. Exits 1 if the accounting doesn't hold.

    python benchmarks/bench_pipelines.py [--cameras 64] [--fps 30] [--seconds 60]
        [--executor method|numpy] [--workers 2] [--queue 4] [--drop drop_oldest] [--loop uvloop|asyncio]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import platform
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np

from orchestra.pipeline import FrameStream, Pipeline, Pipelines, PipelinesStatistics, SyntheticCamera
from orchestra.runtime import load_program

ROOT = pathlib.Path(__file__).resolve().parent.parent
MLP = ROOT / "tests" / "fixtures" / "mlp.pte"


# --- executors ---------------------------------------------------------------------------

def _deliver(batch: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for fut, result, error in batch:
        if fut.done():  # its caller was cancelled
            continue
        if error is None:
            fut.set_result(result)
        else:
            fut.set_exception(error)


class MethodWorker:
    """One dedicated thread owning one Method; requests in via SimpleQueue, results out in
    batches (whatever finished before the queue ran dry) with one call_soon_threadsafe."""

    def __init__(self, method: Any, name: str) -> None:
        self.method = method
        self.name = name
        self.q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        q = self.q
        execute = self.method.execute
        while True:
            item = q.get()
            batch: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
            loop = None
            while True:
                if item is None:
                    if batch and loop is not None:
                        loop.call_soon_threadsafe(_deliver, batch)
                    return
                loop, fut, inputs = item
                try:
                    batch.append((fut, execute(inputs), None))
                except Exception as exc:  # handed to the caller
                    batch.append((fut, None, exc))
                try:
                    item = q.get_nowait()
                except queue.Empty:
                    break
            loop.call_soon_threadsafe(_deliver, batch)

    def close(self) -> None:
        self.q.put(None)
        self.thread.join()


class WorkerHandle:
    """A camera's executor: its share of one MethodWorker."""

    def __init__(self, worker: MethodWorker) -> None:
        self.worker = worker

    async def execute(self, inputs: list[Any]) -> list[Any]:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.worker.q.put((loop, fut, inputs))
        return await fut

    def describe(self) -> dict[str, Any]:
        return {"instance": self.worker.name, "unit": {"thread": self.worker.name}}


class NumpyExecutor:
    """A small numpy workload inline on the loop."""

    def __init__(self, seed: int) -> None:
        self.w = np.random.default_rng(seed).standard_normal((64, 32)).astype(np.float32)

    async def execute(self, inputs: list[Any]) -> list[Any]:
        return [np.tanh(inputs[0] @ self.w)]


# --- measurements ------------------------------------------------------------------------

class LatencyLog:
    """The sink of every camera: each result's capture->sink latency into one preallocated
    array (written once, up front, so filling it doesn't grow RSS)."""

    __slots__ = ("buf", "n")

    def __init__(self, size: int) -> None:
        self.buf = np.full(size, np.nan)
        self.n = 0

    def __call__(self, result: Any) -> None:
        if self.n < self.buf.size:
            self.buf[self.n] = result.t_done - result.frame.t_capture
            self.n += 1

    def percentiles(self) -> tuple[float, float, float, float]:
        data = self.buf[: self.n]
        if not data.size:
            return (0.0, 0.0, 0.0, 0.0)
        p50, p95, p99 = np.percentile(data, (50, 95, 99))
        return float(p50), float(p95), float(p99), float(data.max())


def rss_mib() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def ping_pong(make: Callable[[], tuple[Callable[[Any], Any], Callable[[], Any]]], n: int) -> float:
    """Median seconds of one hand-off there and back between two tasks."""
    put_a, get_a = make()
    put_b, get_b = make()

    async def echo() -> None:
        for _ in range(n):
            await put_b(await get_a())

    async with anyio.create_task_group() as tg:
        tg.start_soon(echo)
        t0 = time.perf_counter()
        for i in range(n):
            await put_a(i)
            await get_b()
        dt = time.perf_counter() - t0
    return dt / n


def frame_stream() -> tuple[Callable[[Any], Any], Callable[[], Any]]:
    s: FrameStream[Any] = FrameStream(8, "drop_oldest")

    async def put(x: Any) -> None:
        s.put_nowait(x)
    return put, s.get


def asyncio_queue() -> tuple[Callable[[Any], Any], Callable[[], Any]]:
    q: asyncio.Queue[Any] = asyncio.Queue(8)
    return q.put, q.get


def anyio_stream() -> tuple[Callable[[Any], Any], Callable[[], Any]]:
    send, receive = anyio.create_memory_object_stream[Any](8)
    return send.send, receive.receive


async def stream_baseline() -> None:
    n = 5000
    res = {}
    for name, make in (("FrameStream", frame_stream), ("asyncio.Queue", asyncio_queue), ("anyio stream", anyio_stream)):
        res[name] = min([await ping_pong(make, n) for _ in range(3)])
    base = res["FrameStream"]
    print("stream hand-off, ping-pong between two tasks (best of 3 x %d):" % n)
    for name, t in res.items():
        print(f"  {name:14s} {t * 1e6:7.2f} µs   {t / base:5.2f}x FrameStream")


def report(label: str, st: PipelinesStatistics, rss: float, cpu_s: float, wall_s: float, queue_cap: int,
           quiet: bool = False) -> None:
    if quiet:
        return
    a = st.accounting
    ok = "ok"
    try:
        a.check()
        for p in st.pipelines:
            p.accounting.check()
    except Exception as exc:  # reported, not hidden
        ok = f"FAILED: {exc}"
    d = a.dropped
    lat = st.latency
    print(f"[{label}] produced {a.produced}  processed {a.processed}  failed {a.failed}  dropped "
          f"{a.dropped_total} (evicted {d['evicted']}, queue_full {d['queue_full']}, deadline {d['deadline']}, "
          f"shutdown {d['shutdown']})  in flight {a.in_flight}")
    print(f"[{label}]   identity produced == processed + failed + dropped + in_flight: {ok}"
          f"{'' if a.running else ' (and in_flight == 0 after the run)'}")
    print(f"[{label}]   latency capture->sink p50 {lat.p50 * 1e3:.2f} ms  p95 {lat.p95 * 1e3:.2f} ms  "
          f"p99 {lat.p99 * 1e3:.2f} ms  max {lat.max * 1e3:.2f} ms  (over {lat.window} frames)")
    print(f"[{label}]   in {st.input_fps:.0f} fps  out {st.output_fps:.0f} fps  max queue depth {st.queue_max}/{queue_cap}"
          f"  RSS {rss:.1f} MiB  CPU {100 * cpu_s / wall_s if wall_s else 0:.0f}% of one core", flush=True)


async def main(args: argparse.Namespace) -> int:
    print(f"bench_pipelines: {args.cameras} cameras x {args.fps:g} fps for {args.seconds:g} s, {args.drop}, "
          f"queue {args.queue}, executor {args.executor}"
          f"{f' ({args.workers} worker threads, round-robin)' if args.executor == 'method' else ''}, loop {args.loop}")
    print(f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}, numpy {np.__version__}")
    await stream_baseline()

    workers: list[MethodWorker] = []
    if args.executor == "method":
        program = load_program(str(MLP))
        info = program.method_meta("forward").inputs[0]
        shape, dtype = info.shape, info.dtype
        workers = [MethodWorker(program.load_method("forward"), f"mlp-{k}") for k in range(args.workers)]
        probe = program.load_method("forward")
        x = np.zeros(shape, dtype)
        direct = statistics.median(_timed(lambda: probe.execute([x])) for _ in range(2000))
        h = WorkerHandle(workers[0])
        hop = []
        for _ in range(2000):
            t = time.perf_counter()
            await h.execute([x])
            hop.append(time.perf_counter() - t)
        print(f"baseline: Method.execute direct {direct * 1e6:.1f} µs; through a worker thread from the loop "
              f"{statistics.median(hop) * 1e6:.1f} µs ({statistics.median(hop) / direct:.2f}x)")
    else:
        shape, dtype = (64, 64), np.float32
        ex0 = NumpyExecutor(0)
        x = np.zeros(shape, dtype)
        direct = statistics.median(_timed(lambda: np.tanh(x @ ex0.w)) for _ in range(2000))
        print(f"baseline: the numpy workload direct {direct * 1e6:.1f} µs")

    group = Pipelines()  # its latency: the last 8192 frames of all cameras (the reports)
    log = LatencyLog(int(args.cameras * args.fps * args.seconds * 1.1) + 4096)  # the whole run
    for i in range(args.cameras):
        name = f"cam{i:02d}"
        ex: Any = WorkerHandle(workers[i % len(workers)]) if workers else NumpyExecutor(i)
        group.add(Pipeline(name, SyntheticCamera(name, args.fps, shape, dtype, seed=i), ex,
                           sink=log, queue=args.queue, drop=args.drop))

    report("warm-up", group.statistics(), rss_mib(), 0.0, 0.0, args.queue, quiet=True)  # lazy imports first
    rss0 = rss_mib()
    rss_mid: float | None = None
    t0 = time.perf_counter()
    c0 = time.process_time()
    print(f"RSS at start {rss0:.1f} MiB", flush=True)

    rss_end: float | None = None
    end_at = args.seconds - min(1.0, args.seconds * 0.05)  # near the end, still running

    async def sample_rss() -> None:
        nonlocal rss_mid, rss_end
        await anyio.sleep(args.seconds / 2 - (time.perf_counter() - t0))
        rss_mid = rss_mib()
        await anyio.sleep(end_at - (time.perf_counter() - t0))
        rss_end = rss_mib()

    async def reporter() -> None:
        next_at = args.report
        while True:
            await anyio.sleep(next_at - (time.perf_counter() - t0))
            elapsed = time.perf_counter() - t0
            rss = rss_mib()
            report(f"{elapsed:5.1f}s", group.statistics(), rss, time.process_time() - c0, elapsed, args.queue)
            next_at += args.report

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(reporter)
            tg.start_soon(sample_rss)
            await group.run(duration_s=args.seconds)
            tg.cancel_scope.cancel()
    finally:
        for w in workers:
            w.close()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    rss1 = rss_mib()
    st = group.statistics()
    print("--- end ---")
    report("end", st, rss1, cpu, wall, args.queue)
    a = st.accounting
    bad = [p.name for p in st.pipelines if p.accounting.in_flight or p.state != "done"]
    rss_mid = rss1 if rss_mid is None else rss_mid
    rss_end = rss1 if rss_end is None else rss_end
    p50, p95, p99, pmax = log.percentiles()
    print(f"latency capture->sink over the whole run ({log.n} frames): p50 {p50 * 1e3:.2f} ms  p95 {p95 * 1e3:.2f} ms  "
          f"p99 {p99 * 1e3:.2f} ms  max {pmax * 1e3:.2f} ms")
    print(f"RSS start {rss0:.1f} MiB  middle {rss_mid:.1f} MiB  end {rss_end:.1f} MiB (at {end_at:.1f} s, still "
          f"running; middle->end {rss_end - rss_mid:+.2f} MiB)  after shutdown {rss1:.1f} MiB")
    print(f"max queue depth {st.queue_max} (capacity {args.queue}): {'bounded' if st.queue_max <= args.queue else 'NOT BOUNDED'}")
    per_frame = cpu / a.processed if a.processed else float("nan")
    print(f"process CPU per processed frame {per_frame * 1e6:.1f} µs (all threads) = {per_frame / direct:.2f}x one "
          f"direct execute ({direct * 1e6:.1f} µs); delivered {a.processed / a.produced:.1%} of produced frames")
    try:
        a.check()
        for p in st.pipelines:
            p.accounting.check()
    except Exception as exc:
        print(f"ACCOUNTING FAILED: {exc}")
        return 1
    if bad:
        print(f"pipelines not finished cleanly: {bad}")
        return 1
    print(f"accounting: exact for all {len(st.pipelines)} cameras, nothing in flight")
    return 0


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cameras", type=int, default=64)
    ap.add_argument("--fps", type=float, default=30.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--executor", choices=("method", "numpy"), default="method")
    ap.add_argument("--workers", type=int, default=2, help="worker threads for --executor method")
    ap.add_argument("--queue", type=int, default=4)
    ap.add_argument("--drop", choices=("drop_oldest", "drop_newest", "block"), default="drop_oldest")
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    ap.add_argument("--report", type=float, default=10.0, help="seconds between reports")
    args = ap.parse_args(argv)
    if args.cameras < 1 or args.fps <= 0 or args.seconds <= 0 or args.workers < 1 or args.queue < 1:
        ap.error("--cameras, --fps, --seconds, --workers and --queue must be positive")
    return args


if __name__ == "__main__":
    ns = parse()
    sys.exit(anyio.run(main, ns, backend="asyncio", backend_options={"use_uvloop": ns.loop == "uvloop"}))
