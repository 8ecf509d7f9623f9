#!/usr/bin/env python3
"""orchestra's XNNPACK backend: memory of many instances, and latency against ExecuTorch.

One XNNPACK-lowered program (default: the 224x224 inverted-residual net with squeeze-excite
and hardswish from backends/xnnpack/test/_models.py, exported here with ExecuTorch's
XnnpackPartitioner; ``--pte FILE`` for another, whose method ``forward`` takes float32 inputs)
measured for:

  (a) memory: a fresh process loads the program, then creates and runs N Methods (default
      8) of it; the growth of its resident memory (RSS) is compared with N x the activations
      one instance plans (the Method's planned arena + the backend's per-instance buffers).
      Weights are prepacked once per Program, so the ratio should stay <= 1.1.
  (b) latency: orchestra's XnnpackBackend vs ExecuTorch's own runtime with XNNPACK on the
      same file, in interleaved rounds (the order alternating), median per-execute time of
      each and their ratio; and orchestra as it runs without the layout copies between
      delegates left out (the plan made while the backend's ``delegate_outputs`` answers
      None: every argument possibly written, every copy runs), in the same rounds: the
      steps of each plan and the ratio (on a transformer's file, e.g. ``--pte`` the ViT-tiny
      XNNPACK file that ``bench_models.py`` caches).

Both sides run with ``--threads`` compute threads (default 1): numpy's BLAS pool is limited
with threadpoolctl (when installed), orchestra's compiled kernels get the same count
(``kernels.set_threads``) and ExecuTorch's threadpool is reset to the same size. An
unlimited 2-thread OpenBLAS pool on a loaded 2-core machine made executes ~40x slower here.

Needs torch + executorch (the ``export`` extra) for the default model and for (b).

    python benchmarks/bench_xnnpack.py [--pte FILE] [--instances 8] [--rounds 15] [--n 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def limit_blas(threads: int) -> str:
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return "numpy BLAS threads: not limited (threadpoolctl not installed)"
    threadpool_limits(threads, user_api="blas")
    return f"numpy BLAS threads: {threads}"


def default_pte() -> pathlib.Path:
    """The 224x224 model exported with XnnpackPartitioner (cached in the temp dir)."""
    spec = importlib.util.spec_from_file_location("_xnn_models", REPO / "backends" / "xnnpack" / "test" / "_models.py")
    assert spec is not None and spec.loader is not None
    models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(models)
    path = pathlib.Path(tempfile.gettempdir()) / "orchestra-bench-xnnpack-mobilenet_se_224.pte"
    if not path.exists():
        module, inputs = models.MODELS["mobilenet_se_224"]()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            path.write_bytes(models.export_xnnpack(module, inputs))
    return path


def inputs_for(method) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    out = []
    for t in method.meta.inputs:
        out.append(rng.standard_normal(t.shape).astype(t.dtype))
    return out


# -- (a) memory, in a fresh child process ----------------------------------------------------
def memory_child(pte: str, n: int, threads: int) -> None:
    import gc

    limit_blas(threads)
    from orchestra.backends.xnnpack import XnnpackHandle
    from orchestra.runtime import load_program

    prog = load_program(pte)
    warm = prog.load_method("forward")  # imports, kernels and the shared plan (weights) made once
    x = inputs_for(warm)
    warm.execute(x)
    per_instance = warm.statistics().planned_bytes + sum(
        h.plan.activation_bytes for _, h in warm._handles if isinstance(h, XnnpackHandle))
    prepacked = sum(h.plan.prepacked_bytes for _, h in warm._handles if isinstance(h, XnnpackHandle))
    gc.collect()
    before = rss_bytes()
    methods = []
    for _ in range(n):
        m = prog.load_method("forward")
        m.execute(x)
        methods.append(m)
    gc.collect()
    after = rss_bytes()
    print(json.dumps({"before": before, "after": after, "per_instance": per_instance, "prepacked": prepacked}))


def bench_memory(pte: pathlib.Path, n: int, threads: int) -> None:
    r = subprocess.run([sys.executable, __file__, "--memory-child", str(pte), "--instances", str(n),
                        "--threads", str(threads)],
                       capture_output=True, text=True, check=True)
    facts = json.loads(r.stdout.strip().splitlines()[-1])
    growth = facts["after"] - facts["before"]
    planned = n * facts["per_instance"]
    print(f"(a) memory, fresh process: {n} more instances of {pte.name}")
    print(f"    activations planned per instance {facts['per_instance'] / 2**20:.2f} MiB "
          f"(prepacked weights, shared: {facts['prepacked'] / 2**20:.2f} MiB)")
    print(f"    RSS growth {growth / 2**20:.2f} MiB vs {n} x planned activations {planned / 2**20:.2f} MiB: "
          f"ratio {growth / planned:.2f} (goal <= 1.1)")


# -- (b) latency --------------------------------------------------------------------------------
def bench_latency(pte: pathlib.Path, rounds: int, n: int, threads: int) -> None:
    import torch
    from executorch.extension.pybindings import portable_lib
    from executorch.runtime import Runtime

    from orchestra.runtime import kernels, load_program

    kernels.set_threads(threads)
    print(f"    {limit_blas(threads)}; orchestra's compiled kernels: "
          f"{f'{kernels.threads()} thread(s)' if kernels.NATIVE_KERNELS else 'not built'}; "
          f"ExecuTorch threadpool: {threads}")
    portable_lib._unsafe_reset_threadpool(threads)

    from orchestra.backends.xnnpack import XnnpackBackend

    data = pte.read_bytes()
    ours = load_program(data).load_method("forward")
    x = inputs_for(ours)
    et_method = Runtime.get().load_program(data).load_method("forward")
    tx = [torch.from_numpy(a) for a in x]
    answer = XnnpackBackend.delegate_outputs
    XnnpackBackend.delegate_outputs = lambda self, *a: None  # type: ignore[method-assign]
    try:
        copies = load_program(data).load_method("forward")
    finally:
        XnnpackBackend.delegate_outputs = answer  # type: ignore[method-assign]

    def run_ours() -> None:
        ours.execute(x)

    def run_copies() -> None:
        copies.execute(x)

    def run_et() -> None:
        et_method.execute(tx)

    for f in (run_ours, run_copies, run_et):
        f()
    times: dict[str, list[float]] = {"orchestra": [], "copies": [], "executorch": []}
    for r in range(rounds):
        order = [("orchestra", run_ours), ("copies", run_copies), ("executorch", run_et)]
        if r % 2:
            order.reverse()
        for name, f in order:
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            times[name].append((time.perf_counter() - t0) / n)
    o, e = statistics.median(times["orchestra"]), statistics.median(times["executorch"])
    print(f"(b) latency, {pte.name}, {rounds} interleaved rounds of {n} executes, medians:")
    print(f"    orchestra XnnpackBackend {o * 1e3:.2f} ms, ExecuTorch + XNNPACK {e * 1e3:.2f} ms: "
          f"orchestra takes {o / e:.2f}x ExecuTorch's time")
    c = statistics.median(times["copies"])
    left = sum(len(r.instructions) - 1 for r in ours._cp.rewrites if r.kind == "delegate_views")
    print(f"    copies between delegates left out: {left} ({len(ours._cp.steps)} steps; with every copy "
          f"{len(copies._cp.steps)}, {c * 1e3:.2f} ms): {o / c:.3f}x the time "
          f"(median of the rounds' ratios {statistics.median(a / b for a, b in zip(times['orchestra'], times['copies'])):.3f})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pte", type=pathlib.Path, default=None)
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--n", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--memory-child", metavar="PTE", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.memory_child:
        memory_child(args.memory_child, args.instances, args.threads)
        return 0
    pte = args.pte or default_pte()
    bench_memory(pte, args.instances, args.threads)
    bench_latency(pte, args.rounds, args.n, args.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
