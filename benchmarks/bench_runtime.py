#!/usr/bin/env python3
"""orchestra's runtime against ExecuTorch's, on the same .pte files, in one run.

Per fixture: median execute latency for orchestra and for ExecuTorch's Python runtime
(portable kernels, or XNNPACK for the lowered fixtures) when the export extra is installed,
their ratio, and aggregate throughput of 2 threads (each with its own Method) over 1 thread.

    python benchmarks/bench_runtime.py [--seconds 1.0] [--fixtures DIR]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

from orchestra import OrchestraError
from orchestra.runtime import load_program

ROOT = pathlib.Path(__file__).resolve().parent.parent


def median_latency(fn: Callable[[], object], seconds: float) -> float:
    for _ in range(3):
        fn()
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 20:
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def throughput(make: Callable[[], Callable[[], object]], threads: int, seconds: float) -> float:
    """Executions per second over ``threads`` threads, each with its own instance."""
    fns = [make() for _ in range(threads)]
    for f in fns:
        f()
    counts = [0] * threads
    start = threading.Barrier(threads + 1)
    stop = threading.Event()

    def run(k: int) -> None:
        f = fns[k]
        start.wait()
        n = 0
        while not stop.is_set():
            f()
            n += 1
        counts[k] = n

    ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in ts:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    ap.add_argument("--fixtures", default=str(ROOT / "tests" / "fixtures"))
    args = ap.parse_args(argv)

    try:
        import torch
        from executorch.runtime import Runtime

        et_runtime = Runtime.get()
    except Exception:  # the export extra is optional
        torch = None
        et_runtime = None

    rows = []
    for pte in sorted(pathlib.Path(args.fixtures).glob("*.pte")):
        npz = np.load(pte.with_suffix(".npz"))
        data = pte.read_bytes()
        n_in = sum(k.startswith("forward.in_") for k in npz.files)
        if not n_in:
            continue
        inputs = [np.array(npz[f"forward.in_{i}"]) for i in range(n_in)]
        row: dict[str, object] = {"fixture": pte.stem}
        prog = load_program(data)

        def make_orchestra() -> Callable[[], object]:
            m = prog.load_method("forward")
            return lambda: m.execute(inputs)

        try:
            f = make_orchestra()
            row["orch_us"] = median_latency(f, args.seconds) * 1e6
            row["orch_x2"] = throughput(make_orchestra, 2, args.seconds) / throughput(make_orchestra, 1, args.seconds)
        except OrchestraError as exc:
            msg = str(exc)
            row["orch_note"] = msg[msg.find("backend '"):].split(" (")[0] if "backend '" in msg else msg[-70:]
        if et_runtime is not None:
            et_prog = et_runtime.load_program(data)
            t_inputs = [torch.from_numpy(x) for x in inputs]

            def make_et() -> Callable[[], object]:
                m = et_prog.load_method("forward")
                return lambda: m.execute(t_inputs)

            f = make_et()
            row["et_us"] = median_latency(f, args.seconds) * 1e6
            row["et_x2"] = throughput(make_et, 2, args.seconds) / throughput(make_et, 1, args.seconds)
        rows.append(row)

    def fmt(v: object, spec: str) -> str:
        return "-" if v is None else format(v, spec)

    print(f"orchestra vs ExecuTorch {'(not installed)' if et_runtime is None else ''} — median execute latency, "
          f"{args.seconds:.1f}s per measurement, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    head = f"{'fixture':<18}{'orchestra µs':>14}{'ExecuTorch µs':>15}{'ET/orch':>9}{'orch 2T/1T':>12}{'ET 2T/1T':>10}  note"
    print(head)
    print("-" * len(head))
    for r in rows:
        ratio = r["et_us"] / r["orch_us"] if "et_us" in r and "orch_us" in r else None
        print(f"{r['fixture']:<18}{fmt(r.get('orch_us'), ',.1f'):>14}{fmt(r.get('et_us'), ',.1f'):>15}"
              f"{fmt(ratio, '.2f'):>9}{fmt(r.get('orch_x2'), '.2f'):>12}{fmt(r.get('et_x2'), '.2f'):>10}  {r.get('orch_note', '')}")
    print("ET/orch > 1 means orchestra is faster; 2T/1T is aggregate throughput of two threads over one.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
