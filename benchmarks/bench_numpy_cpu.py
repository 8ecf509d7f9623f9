#!/usr/bin/env python3
"""NumpyCpuBackend: one instance with num_threads=1 vs 2, next to the machine's 2-thread ceiling.

A camera-sized conv net (input 1x16x96x96: five 3x3 convolutions of 32-64 channels with
ReLU, one depthwise, a max-pool and a linear head), built with ProgramBuilder and delegated
whole to NumpyCpuBackend. One Method; its hot option ``num_threads`` is switched between 1
and 2 in interleaved rounds, so both see the same machine load. The same rounds also time

- the undelegated program on orchestra's interpreter (what num_threads=1 must not exceed),
- the same delegate with ``max_tiles=1`` (orchestra's steps inside the delegate, untiled),
- the 2-thread ceiling: two plain Python threads each running the same numpy matmul
  workload, against one thread running it once (throughput ratio, 2.0 = perfect).

    python benchmarks/bench_numpy_cpu.py [--rounds 30] [--max-tiles N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

from orchestra.aot import MethodBuilder, ProgramBuilder, Value, aot_backends, register_aot_backend
from orchestra.backends.numpy_cpu import NumpyCpuBackend, NumpyCpuBackendDetails
from orchestra.runtime import Backend, Method, load_program, register_backend, registered_backends

BACKEND = "NumpyCpuBackend"
SHAPE = (1, 16, 96, 96)
# (out channels, groups, stride) of each 3x3 convolution
LAYERS = [(32, 1, 1), (32, 1, 1), (32, 32, 1), (64, 1, 2), (64, 1, 1), (64, 1, 1)]


def net(f: MethodBuilder, x: Value, seed: int = 0) -> Value:
    rng = np.random.default_rng(seed)
    for co, g, s in LAYERS:
        ci = x.shape[1]
        w = (rng.standard_normal((co, ci // g, 3, 3)) / np.sqrt(9 * ci / g)).astype(np.float32)
        b = (rng.standard_normal(co) * 0.1).astype(np.float32)
        x = f.call("aten::convolution.out", x, w, b, [s, s], [1, 1], [1, 1], False, [0, 0], g)
        x = f.call("aten::relu.out", x)
    x = f.call("aten::max_pool2d_with_indices.out", x, [2, 2], [2, 2])[0]
    x = f.call("aten::view_copy.out", x, [1, -1])
    w = (rng.standard_normal((x.shape[1], 16)) * 0.01).astype(np.float32)
    return f.call("aten::mm.out", x, w)


def build(delegate: bool) -> bytes:
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, SHAPE)
    if delegate:
        sub = ProgramBuilder()
        g = sub.method("forward")
        g.output(net(g, g.input(np.float32, SHAPE)))
        f.output(*f.delegate(BACKEND, sub, [x]))
    else:
        f.output(net(f, x))
    return b.to_bytes()


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def ceiling_workload() -> tuple[Callable[[], None], Callable[[], None]]:
    """(one thread runs W, two threads each run W): W = numpy matmuls of the net's sizes."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 576), dtype=np.float32)
    bm = rng.standard_normal((576, 2304), dtype=np.float32)
    outs = [np.empty((64, 2304), np.float32) for _ in range(2)]

    def work(k: int) -> None:
        for _ in range(8):
            np.matmul(a, bm, out=outs[k])

    def one() -> None:
        work(0)

    def two() -> None:
        t = threading.Thread(target=work, args=(1,))
        t.start()
        work(0)
        t.join()

    return one, two


def blas_threads() -> str:
    """numpy's BLAS and its thread count, as the process has them (read, never changed)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "unknown (threadpoolctl not installed)"
    found = [f"{i.get('internal_api')} {i.get('version')}, {i.get('num_threads')} threads"
             for i in threadpool_info() if i.get("user_api") == "blas"]
    return "; ".join(found) or "none found"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds (default 30)")
    parser.add_argument("--max-tiles", type=int, default=None, help="the backend's init-only max_tiles (default: its own)")
    args = parser.parse_args(argv)

    if BACKEND not in registered_backends():
        register_backend(Backend(BACKEND, NumpyCpuBackend()))
    if BACKEND not in aot_backends():
        register_aot_backend(BACKEND, NumpyCpuBackendDetails)

    x = np.random.default_rng(2).standard_normal(SHAPE, dtype=np.float32)
    plain = load_program(build(False)).load_method()
    opts = {} if args.max_tiles is None else {"max_tiles": args.max_tiles}
    delegated = load_program(build(True))
    method: Method = delegated.load_method(backend_options={BACKEND: opts})
    untiled: Method = delegated.load_method(backend_options={BACKEND: {"max_tiles": 1}})
    one, two = ceiling_workload()

    def at(threads: int) -> Callable[[], object]:
        return lambda: method.execute([x], backend_options={BACKEND: {"num_threads": threads}})

    ref = plain.execute([x])[0]
    r1, r2 = at(1)(), at(2)()
    same = np.array_equal(r1[0], r2[0])
    err = float(np.abs(r1[0] - ref).max())
    for fn in (at(1), at(2), lambda: plain.execute([x]), lambda: untiled.execute([x]), one, two):  # warm up
        fn()

    cases: dict[str, Callable[[], object]] = {
        "interpreter": lambda: plain.execute([x]),
        "untiled": lambda: untiled.execute([x]),
        "threads=1": at(1),
        "threads=2": at(2),
        "ceiling 1 thread": one,
        "ceiling 2 threads": two,
    }
    times: dict[str, list[float]] = {k: [] for k in cases}
    names = list(cases)
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]  # rotate who goes first
        for k in order:
            times[k].append(timed(cases[k]))
    med = {k: statistics.median(v) for k, v in times.items()}

    handle = method._handles[0][1]  # the delegate's handle (introspection for this report)
    stats = handle.statistics()
    print(f"NumpyCpuBackend, conv net {SHAPE[1:]} -> {len(LAYERS)} conv3x3 ({', '.join(str(c) for c, _, _ in LAYERS)} ch), "
          f"{args.rounds} interleaved rounds, max_tiles={method.options()[BACKEND]['max_tiles']}")
    tiled = ", ".join(f"{name.split('::')[1].split('.')[0]} x{t}" for name, t in stats.tiled_ops)
    print(f"  tiled ops (tiles): {tiled}")
    print(f"  numpy BLAS: {blas_threads()} (left as it is: each large product may already use them)")
    print(f"  interpreter (undelegated)   {med['interpreter'] * 1e3:8.2f} ms")
    print(f"  delegated, max_tiles=1      {med['untiled'] * 1e3:8.2f} ms   "
          f"({med['untiled'] / med['interpreter']:.2f}x the interpreter; orchestra's steps, untiled)")
    print(f"  num_threads=1               {med['threads=1'] * 1e3:8.2f} ms   "
          f"({med['threads=1'] / med['interpreter']:.2f}x the interpreter)")
    print(f"  num_threads=2               {med['threads=2'] * 1e3:8.2f} ms")
    speedup = med["threads=1"] / med["threads=2"]
    ceiling = 2 * med["ceiling 1 thread"] / med["ceiling 2 threads"]
    print(f"  speed-up 1 -> 2 threads     {speedup:8.2f}x")
    print(f"  2-thread ceiling (matmul)   {ceiling:8.2f}x   (two threads' throughput over one's; 2.00 = perfect)")
    if ceiling > 1.05:
        print(f"  share of the ceiling        {(speedup - 1) / (ceiling - 1) * 100:8.0f} %   ((speed-up - 1) / (ceiling - 1))")
    else:
        print("  share of the ceiling             n/a   (no 2-thread headroom on this machine right now)")
    print(f"  results: 1 and 2 threads bit-identical: {same}; max |delegated - interpreter| = {err:.2e}")
    for m in (method, untiled, plain):
        m.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
