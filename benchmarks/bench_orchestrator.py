#!/usr/bin/env python3
"""What the orchestrator costs per execute, and how close its instances get to the machine.

1. Per-execute overhead on a trivial program (one kernel on 4 floats), on asyncio and on
   uvloop: latency of ``await instance.execute(x)`` minus a direct ``Method.execute(x)``,
   p50 and p99, next to two references measured in the same run and doing the same work:
   ``asyncio.to_thread(method.execute, x)`` and a bare thread round trip (a dedicated thread,
   ``queue.SimpleQueue`` in, ``loop.call_soon_threadsafe`` out). Rounds of each are
   interleaved so machine noise hits them alike. Also the amortised cost with 8 executes in
   flight (the worker batches results while executes are short).
   Goal: orchestrator p50 overhead within 1.2x of the bare round trip, under half of
   ``asyncio.to_thread``'s.
2. Aggregate throughput of N = 1, 2, 4 instances of the conv-net fixture
   (``tests/fixtures/convnet.pte``) on worker threads and on worker processes, against the machine's ceiling measured
   in the same run: N separate processes running the same Method workload with no
   orchestrator (multiprocessing), both for the same wall-clock window, interleaved, medians
   of ``--repeats``. Prints the fraction of the ceiling, the orchestrating process's own
   CPU time per execute, and a "bare pipes" reference: the same worker processes driven by
   a tight ``select`` loop with no orchestrator (the floor of the cross-process hop). On a machine with no more CPUs than N, that CPU comes out of the
   instances' share (the ceiling has no parent), so the fraction there is bounded by it.
3. Fault isolation (``--faults``, run by default, ``--no-faults`` skips it, ``--only-faults``
   runs only it): 3 healthy instances + 1 faulty instance of the same small program (a test
   backend registered here doing ~0.2-0.5 ms of numpy work per execute), each driven by its
   own closed loop on uvloop, in one run: phase A0 the 4th instance is loaded but idle (its
   driver waits: no executes); phase A all four healthy and driven; phase B the 4th
   instance's backend raises on every execute (it restarts per its RestartPolicy, with
   backoff); phase C it hangs far past its ``deadline_s`` (quarantined and replaced, again
   and again). Prints the 3 healthy instances' executes/s per phase and its ratio to A0 and
   to A. A faulty instance burns almost no CPU (it waits in backoff, or its thread is
   blocked), so against A the healthy three look *faster* (> 1 on a 2-vCPU machine, where
   four busy instances compete for 2 CPUs): that is CPU freed, not isolation. A0 has the
   same CPU competition as B and C with none of the fault handling, so the ratio to A0 is
   the isolation measure. ``--fault-rounds`` rounds of A0, A, B, C; per phase the medians
   (ratios taken within a round, then the median).
   Goal: the others' throughput stays within 10 % of A0 in B and C (ratio to A0 >= 0.90).

    python benchmarks/bench_orchestrator.py [--rounds 7] [--n 2000] [--seconds 1] [--repeats 5]
        [--sections 1,2,3] [--ns 1,2,4] [--in-flight 2]
        [--no-faults | --only-faults] [--fault-seconds 2] [--fault-rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import pathlib
import queue
import statistics
import sys
import threading
import time
from typing import Any

import numpy as np
import structlog

from orchestra import OrchestraError
from orchestra.aot import BackendDetails, PreprocessResult, ProgramBuilder, aot_backends, register_aot_backend
from orchestra.orchestrator import InstanceSpec, Orchestrator, RestartPolicy
from orchestra.runtime import (
    Backend,
    BackendInterface,
    Method,
    OptionSpec,
    Program,
    load_program,
    register_backend,
    registered_backends,
)

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONVNET = ROOT / "tests" / "fixtures" / "convnet.pte"
CONVNET_IN = ROOT / "tests" / "fixtures" / "convnet.npz"


def trivial_program() -> Program:
    b = ProgramBuilder()
    f = b.method("forward")
    f.output(f.call("aten::add.Scalar_out", f.input(np.float32, (4,)), 1.0))
    return load_program(b.to_bytes())


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


# -- 1. per-execute overhead ----------------------------------------------------------------
class BareWorker:
    """The reference: a dedicated thread, SimpleQueue in, call_soon_threadsafe out."""

    def __init__(self, method: Method) -> None:
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.method = method
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self) -> None:
        get, execute = self.q.get, self.method.execute
        while True:
            item = get()
            if item is None:
                return
            loop, fut, x = item
            out = execute(x)
            loop.call_soon_threadsafe(_set, fut, out)

    async def call(self, x: Any) -> Any:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.q.put((loop, fut, x))
        return await fut

    def close(self) -> None:
        self.q.put(None)
        self.t.join()


def _set(fut: asyncio.Future, value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


async def overhead_run(rounds: int, n: int) -> dict[str, dict[str, float]]:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))  # quiet
    prog = trivial_program()
    x = [np.arange(4, dtype=np.float32)]
    direct_m = prog.load_method()
    thread_m = prog.load_method()
    bare_m = prog.load_method()
    bare = BareWorker(bare_m)
    samples: dict[str, list[float]] = {k: [] for k in ("direct", "orchestrator", "bare", "to_thread")}
    piped: dict[str, list[float]] = {"orchestrator": [], "bare": []}
    perf = time.perf_counter
    async with Orchestrator(period=None) as orch:
        p = await orch.load(prog, instances=[InstanceSpec("bench")])
        inst = p["bench"]
        for _ in range(200):  # warm up
            await inst.execute(x)
            await bare.call(x)
            await asyncio.to_thread(thread_m.execute, x)
        for _ in range(rounds):
            s = samples["direct"]
            for _ in range(n):
                t0 = perf()
                direct_m.execute(x)
                s.append(perf() - t0)
            s = samples["orchestrator"]
            for _ in range(n):
                t0 = perf()
                await inst.execute(x)
                s.append(perf() - t0)
            s = samples["bare"]
            for _ in range(n):
                t0 = perf()
                await bare.call(x)
                s.append(perf() - t0)
            s = samples["to_thread"]
            for _ in range(n // 2):
                t0 = perf()
                await asyncio.to_thread(thread_m.execute, x)
                s.append(perf() - t0)
            for name, call in (("orchestrator", inst.execute), ("bare", bare.call)):
                t0 = perf()
                for _ in range(n // 8):
                    await asyncio.gather(*(call(x) for _ in range(8)))
                piped[name].append((perf() - t0) / (n // 8 * 8))
    bare.close()
    d50, d99 = pct(samples["direct"], 50), pct(samples["direct"], 99)
    out: dict[str, dict[str, float]] = {"direct": {"p50": d50, "p99": d99, "ovh50": 0.0, "ovh99": 0.0}}
    for k in ("orchestrator", "bare", "to_thread"):
        p50, p99 = pct(samples[k], 50), pct(samples[k], 99)
        out[k] = {"p50": p50, "p99": p99, "ovh50": p50 - d50, "ovh99": p99 - d99}
    for k, v in piped.items():
        out[k]["piped"] = statistics.median(v) - d50
    return out


def run_overhead(use_uvloop: bool, rounds: int, n: int) -> dict[str, dict[str, float]]:
    if use_uvloop:
        import uvloop

        return uvloop.run(overhead_run(rounds, n))
    return asyncio.run(overhead_run(rounds, n))


# -- 2. throughput against the machine's ceiling --------------------------------------------
def _ceiling_proc(ready: Any, stop: Any, out: Any) -> None:
    """One process of the ceiling: the same Method workload, no orchestrator."""
    prog = load_program(str(CONVNET))
    x = [np.load(CONVNET_IN)["forward.in_0"]]
    m = prog.load_method()
    for _ in range(20):
        m.execute(x)
    ready.wait()  # every process is warm: go
    n = 0
    is_set = stop.is_set
    while not is_set():
        m.execute(x)
        n += 1
    out.put(n)


def ceiling(n_procs: int, seconds: float) -> float:
    """Executes per second of ``n_procs`` processes running concurrently for ``seconds``."""
    ctx = mp.get_context("spawn")
    ready, stop, out = ctx.Barrier(n_procs + 1), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_ceiling_proc, args=(ready, stop, out)) for _ in range(n_procs)]
    for p in procs:
        p.start()
    ready.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    total = sum(out.get() for _ in procs)
    elapsed = time.perf_counter() - t0
    for p in procs:
        p.join()
    return total / elapsed


async def orchestrated(n_inst: int, seconds: float, in_flight: int, placement: str) -> tuple[float, float]:
    """Executes per second of ``n_inst`` instances, each kept ``in_flight`` deep by its own
    closed-loop tasks, over ``seconds`` after a warm-up; and the CPU time this (parent)
    process spent per execute in that window (event loop, worker threads)."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    prog = load_program(str(CONVNET))
    x = [np.load(CONVNET_IN)["forward.in_0"]]
    async with Orchestrator(period=None) as orch:
        p = await orch.load(prog, instances=[InstanceSpec(f"c{i}", placement=placement) for i in range(n_inst)])
        for inst in p:
            for _ in range(20):
                await inst.execute(x)
        count = 0
        stop = False

        async def drive(inst: Any) -> None:
            nonlocal count
            while not stop:
                await inst.execute(x)
                count += 1

        tasks = [asyncio.create_task(drive(inst)) for inst in p for _ in range(in_flight)]
        await asyncio.sleep(min(0.2, seconds / 4))  # every instance busy before the window opens
        c0, cpu0, t0 = count, time.process_time(), time.perf_counter()
        await asyncio.sleep(seconds)
        c1, cpu1, t1 = count, time.process_time(), time.perf_counter()
        stop = True
        await asyncio.gather(*tasks)
        return (c1 - c0) / (t1 - t0), (cpu1 - cpu0) / max(c1 - c0, 1)


def bare_pipes(n_inst: int, seconds: float, in_flight: int) -> float:
    """The floor of process placement: ``n_inst`` worker processes (the orchestrator's own
    WorkerProcess: same wire format, same shared-memory slots) driven by a tight
    ``select`` loop in this thread, no event loop, no futures, no orchestrator. Executes/s."""
    import select
    from collections import deque

    from orchestra.orchestrator._process import PIPELINE_DEPTH, WorkerProcess

    prog = load_program(str(CONVNET))
    x = [np.load(CONVNET_IN)["forward.in_0"]]
    procs = [WorkerProcess(prog, "forward", {}, None, None, f"bare {i}") for i in range(n_inst)]
    try:
        by_fd = {p.fd: (p, deque()) for p in procs}
        for p, q in by_fd.values():
            for s in range(min(in_flight, PIPELINE_DEPTH)):
                p.send_execute(s, x, None)
                q.append(s)
        perf = time.perf_counter
        t_start = perf()
        t0 = t_start + min(0.2, seconds / 4)  # warm-up, as for the orchestrated runs
        t_end = t0 + seconds
        count = 0
        counting = False
        while True:
            ready, _, _ = select.select(list(by_fd), [], [])
            now = perf()
            if not counting and now >= t0:
                counting, count, t0 = True, 0, now
            if now >= t_end:
                return count / (now - t0)
            for fd in ready:
                p, q = by_fd[fd]
                for _ in p.read() or ():
                    s = q.popleft()
                    p.static_outputs(s)
                    count += 1
                    p.send_execute(s, x, None)
                    q.append(s)
    finally:
        for p in procs:
            p.close()


def run_orchestrated(n_inst: int, seconds: float, placement: str, in_flight: int = 2) -> tuple[float, float]:
    import uvloop

    return uvloop.run(orchestrated(n_inst, seconds, in_flight, placement))


# -- 3. fault isolation ---------------------------------------------------------------------
FAULT_BACKEND = "BenchFaulty"
FAULT_SHAPE = (32, 1024)
# label -> "ok" | "raise" | "hang"; read by every execute of the handle with that label
FAULT_MODE: dict[str, str] = {}
FAULT_RELEASE = threading.Event()  # set at the end: hanging executes return, their threads exit
FAULT_HUNG: list[threading.Thread] = []  # threads that hung, joined at the end


class FaultyWork(BackendInterface):
    """sin() over 32K floats (a few hundred microseconds of real numpy work); per its label's
    mode it raises, or hangs until FAULT_RELEASE (far past any deadline)."""

    option_specs = (OptionSpec("label", str, ""),)

    def init(self, context, processed, compile_specs):
        return {"label": context.runtime_specs["label"]}

    def execute(self, context, handle, args):
        mode = FAULT_MODE.get(handle["label"], "ok")
        if mode == "raise":
            raise RuntimeError(f"injected fault in {handle['label']}")
        if mode == "hang":
            FAULT_HUNG.append(threading.current_thread())
            FAULT_RELEASE.wait(60)
        np.sin(args[0], out=args[1])

    def destroy(self, handle) -> None:
        pass


class _NoBlob(BackendDetails):
    @staticmethod
    def preprocess(program, compile_specs):
        return PreprocessResult(b"\0")


def fault_program() -> Program:
    if FAULT_BACKEND not in registered_backends():
        register_backend(Backend(FAULT_BACKEND, FaultyWork()))
    if FAULT_BACKEND not in aot_backends():
        register_aot_backend(FAULT_BACKEND, _NoBlob)
    sub = ProgramBuilder()
    s = sub.method("forward")
    s.output(s.call("aten::add.Scalar_out", s.input(np.float32, FAULT_SHAPE), 0.0))
    b = ProgramBuilder()
    f = b.method("forward")
    (z,) = f.delegate(FAULT_BACKEND, sub, [f.input(np.float32, FAULT_SHAPE)])
    f.output(z)
    return load_program(b.to_bytes())


async def faults_run(seconds: float, rounds: int) -> list[dict[str, Any]]:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(50))  # quiet: faults log errors
    prog = fault_program()
    x = [np.random.default_rng(0).standard_normal(FAULT_SHAPE).astype(np.float32)]
    healthy = ("h0", "h1", "h2")
    # many restarts allowed so it keeps restarting (with growing backoff) for all of phase B
    restart = RestartPolicy(max_restarts=10_000, backoff_s=0.005, backoff_factor=1.25)
    specs = [InstanceSpec(n, backend_options={FAULT_BACKEND: {"label": n}}) for n in healthy]
    specs.append(InstanceSpec("faulty", backend_options={FAULT_BACKEND: {"label": "faulty"}},
                              restart=restart, deadline_s=0.2))
    FAULT_MODE.clear()
    rows: list[dict[str, Any]] = []
    phases = (("A0: 4th idle", "ok", False), ("A: all healthy", "ok", True), ("B: 4th raises", "raise", True),
              ("C: 4th hangs", "hang", True))
    async with Orchestrator(period=None) as orch:
        p = await orch.load(prog, instances=specs)
        for inst in p:
            for _ in range(20):
                await inst.execute(x)
        counts = {n: 0 for n in (*healthy, "faulty")}
        errors = 0
        stop = False
        driving = {n: asyncio.Event() for n in counts}  # cleared: that instance's loop waits (idle)
        for ev in driving.values():
            ev.set()

        async def drive(name: str) -> None:
            nonlocal errors
            inst = p[name]
            while not stop:
                if not driving[name].is_set():
                    await driving[name].wait()
                    continue
                try:
                    await inst.execute(x)
                except (OrchestraError, TimeoutError):
                    errors += 1
                    await asyncio.sleep(0)
                    continue
                counts[name] += 1

        tasks = [asyncio.create_task(drive(n)) for n in counts]
        await asyncio.sleep(0.2)  # settle
        for rnd, (phase, mode, drive_4th) in ((r, ph) for r in range(rounds) for ph in phases):
            FAULT_MODE["faulty"] = mode
            if drive_4th:
                driving["faulty"].set()
            else:
                driving["faulty"].clear()
                # an execute still hung from phase C hits its deadline and is replaced first
                await asyncio.sleep(0.3)
            st0 = p["faulty"].statistics()
            c0, f0, e0, t0 = sum(counts[n] for n in healthy), counts["faulty"], errors, time.perf_counter()
            await asyncio.sleep(seconds)
            c1, f1, e1, t1 = sum(counts[n] for n in healthy), counts["faulty"], errors, time.perf_counter()
            st1 = p["faulty"].statistics()
            rows.append({"round": rnd, "phase": phase, "rate": (c1 - c0) / (t1 - t0),
                         "rate_4th": (f1 - f0) / (t1 - t0), "errors": e1 - e0, "restarts": st1.restarts - st0.restarts,
                         "replacements": st1.replacements - st0.replacements, "state": st1.state})
        FAULT_MODE["faulty"] = "ok"
        driving["faulty"].set()
        stop = True
        FAULT_RELEASE.set()  # anything still hanging returns now
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
    FAULT_RELEASE.set()
    for t in FAULT_HUNG:  # abandoned worker threads close their Methods and exit
        t.join(5)
    rows.append({"alive": sum(t.is_alive() for t in FAULT_HUNG), "hung": len(FAULT_HUNG)})
    return rows


def run_faults(seconds: float, rounds: int) -> None:
    import uvloop

    print(f"3. fault isolation: 3 healthy + 1 faulty instance of one program (sin over {FAULT_SHAPE[0]}x"
          f"{FAULT_SHAPE[1]} floats per execute), thread placement, uvloop, 1 closed loop per instance, "
          f"{rounds} round(s) of 4 phases, {seconds:g} s per phase")
    try:
        rows = uvloop.run(faults_run(seconds, rounds))
    finally:
        FAULT_RELEASE.set()
    tail = rows.pop()
    print("  healthy: executes/s of the 3 healthy instances together; 4th: the faulty instance's successful")
    print("  executes/s, errors, restarts and replacements per phase. A0 (4th loaded, not driven) is the fair")
    print("  baseline: a raising or hanging 4th burns almost no CPU, like an idle one, so B and C compete for")
    print("  the CPUs as A0 does; against A (4th busy too) the healthy three also gain the CPU the 4th gave")
    print("  back (> 1 when 4 busy instances share fewer CPUs). The goal is judged on the ratio to A0.")
    print(f"  medians over {rounds} round(s); ratios are taken within each round")
    print(f"  {'phase':<16}{'healthy':>12}{'to A0':>8}{'to A':>7}{'4th ok':>10}{'errors':>8}{'restarts':>10}"
          f"{'replacements':>14}  goal: to A0 >= 0.90")
    by_round = {(r["round"], r["phase"]): r for r in rows}
    names = list(dict.fromkeys(r["phase"] for r in rows))
    idle_name, busy_name = names[0], names[1]  # A0, A
    for k, name in enumerate(names):
        mine = [r for r in rows if r["phase"] == name]
        to_idle = statistics.median(r["rate"] / by_round[(r["round"], idle_name)]["rate"] for r in mine)
        to_busy = statistics.median(r["rate"] / by_round[(r["round"], busy_name)]["rate"] for r in mine)
        med = {key: statistics.median(r[key] for r in mine) for key in ("rate", "rate_4th")}
        low = {key: statistics.median_low([r[key] for r in mine]) for key in ("errors", "restarts", "replacements")}
        goal = "(baseline)" if k == 0 else "-" if k == 1 else ("met" if to_idle >= 0.90 else "MISSED")
        print(f"  {name:<16}{med['rate']:>10.0f}/s{to_idle:>8.3f}{to_busy:>7.3f}{med['rate_4th']:>8.0f}/s"
              f"{low['errors']:>8}{low['restarts']:>10}{low['replacements']:>14}  {goal}")
    print(f"  (4th instance ends '{rows[-1]['state']}'; {tail['hung']} hung executes released at the end, "
          f"{tail['alive']} abandoned worker threads still alive after join)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sections", default="1,2,3", help="which sections to run, comma-separated")
    ap.add_argument("--ns", default="1,2,4", help="instance counts of section 2, comma-separated")
    ap.add_argument("--in-flight", type=int, default=2, help="executes in flight per instance in section 2")
    ap.add_argument("--faults", dest="faults", action="store_true", default=True,
                    help="run the fault-isolation section (the default)")
    ap.add_argument("--no-faults", dest="faults", action="store_false", help="skip the fault-isolation section")
    ap.add_argument("--only-faults", action="store_true", help="run only the fault-isolation section")
    ap.add_argument("--fault-seconds", type=float, default=2.0, help="seconds per fault phase")
    ap.add_argument("--fault-rounds", type=int, default=3, help="rounds of the 4 fault phases (medians)")
    args = ap.parse_args()
    if args.fault_rounds < 1:
        ap.error("--fault-rounds must be >= 1")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"python {sys.version.split()[0]}, {cpus} CPUs, numpy {np.__version__}")
    print()
    sections = {s.strip() for s in args.sections.split(",")}
    if args.only_faults:
        sections = {"3"}
    elif not args.faults:
        sections.discard("3")
    if "1" in sections:
        section_1(args)
    if "2" in sections:
        section_2(args)
    if "3" in sections:
        run_faults(args.fault_seconds, args.fault_rounds)


def section_1(args: argparse.Namespace) -> None:
    print("1. per-execute overhead over a direct Method.execute (trivial program), microseconds")
    us = 1e6
    results = {}
    for name, uv in (("uvloop", True), ("asyncio", False)):
        results[name] = r = run_overhead(uv, args.rounds, args.n)
        print(f"\n  {name}: direct Method.execute p50 {r['direct']['p50'] * us:.1f}  p99 {r['direct']['p99'] * us:.1f}")
        print(f"  {'mechanism':<34}{'p50':>8}{'p99':>8}{'8 in flight':>13}")
        for k, label in (("orchestrator", "await instance.execute"), ("bare", "bare thread round trip"),
                         ("to_thread", "asyncio.to_thread(method.execute)")):
            piped = f"{r[k]['piped'] * us:>13.1f}" if "piped" in r[k] else f"{'':>13}"
            print(f"  {label:<34}{r[k]['ovh50'] * us:>8.1f}{r[k]['ovh99'] * us:>8.1f}{piped}")
        o, b, t = r["orchestrator"]["ovh50"], r["bare"]["ovh50"], r["to_thread"]["ovh50"]
        ok1, ok2 = o <= 1.2 * b, o < 0.5 * t
        print(f"  orchestrator / bare round trip: {o / b:.2f}x (goal <= 1.2x: {'met' if ok1 else 'MISSED'}); "
              f"/ asyncio.to_thread: {o / t:.2f}x (goal < 0.5x: {'met' if ok2 else 'MISSED'})")
    print()


def section_2(args: argparse.Namespace) -> None:
    ns = [int(v) for v in args.ns.split(",")]
    print(f"2. conv-net throughput (tests/fixtures/convnet.pte), {args.seconds:g} s per point, uvloop, "
          f"{args.in_flight} executes in flight per instance, medians of {args.repeats} interleaved repeats")
    print(f"  {'N':>3}{'ceiling: N processes':>22}{'N threads':>12}{'fraction':>10}{'N processes':>14}{'fraction':>10}"
          f"{'parent CPU/execute':>20}{'bare pipes':>13}{'fraction':>10}")
    for n in ns:
        ceils, threads, procs, bares = [], [], [], []
        for _ in range(args.repeats):  # interleaved, medians
            ceils.append(ceiling(n, args.seconds))
            threads.append(run_orchestrated(n, args.seconds, "thread", args.in_flight))
            procs.append(run_orchestrated(n, args.seconds, "process", args.in_flight))
            bares.append(bare_pipes(n, args.seconds, args.in_flight))
        ceil = statistics.median(ceils)
        th = statistics.median(v for v, _ in threads)
        pr, pr_cpu = (statistics.median(v) for v in zip(*procs))
        bare = statistics.median(bares)
        print(f"  {n:>3}{ceil:>19.0f}/s{th:>10.0f}/s{th / ceil:>10.2f}{pr:>12.0f}/s{pr / ceil:>10.2f}"
              f"{pr_cpu * 1e6:>17.0f} us{bare:>11.0f}/s{bare / ceil:>10.2f}")
    print("  (placement='thread': worker threads in this process, one GIL; placement='process': a worker process")
    print("   per instance, driven from the event loop, tensors through shared memory; ceiling: bare processes, no")
    print("   orchestrator. Parent CPU/execute: with placement='process', the CPU time this process spends per")
    print("   execute (event loop, pipes, copies), taken from the instances' share when N >= the CPU count.")
    print("   Bare pipes: the same worker processes driven by a select loop with no orchestrator: what the")
    print("   cross-process hop itself costs, the floor for placement='process')")
    print()


if __name__ == "__main__":
    main()
