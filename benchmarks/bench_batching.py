#!/usr/bin/env python3
"""Cross-camera batching: N live cameras on one MobileNetV3-small, with and without batching.

The model is ``benchmarks/real_models.py``'s MobileNetV3-small (224x224, seeded weights),
exported here once with a dynamic batch dimension (1..8, portable ops, run by orchestra's own
runtime) and cached next to the other real models. Checked first against ExecuTorch's own
runtime at batch 1 and at batch ``--max-size``.

Each run: ``--cameras`` synthetic cameras at ``--fps`` (live: ``drop_oldest``, queue 2), for
``--seconds``, on one orchestrator pool of ``--instances`` instances (``--placement``):

- **unbatched**: every camera's frames go to the pool one by one (``keyed(pool, camera)``:
  sticky routing), what a user writes without batching;
- **batched**: every camera is a member of one ``Batcher(pool, max_size, max_wait)``, each
  batch one execute of the pool (least-loaded instance).

Both modes run the same cameras, model and pool size; the table prints, per mode, frames
processed per second (throughput), frames dropped (the cameras' rate the box couldn't keep
up with), capture→sink latency p50 / p99 (per-camera latency includes the batching wait),
the batch-size distribution, and the ratios batched / unbatched measured in the same run.
The accounting identity is checked for every camera (exit 1 if it doesn't hold).

    python benchmarks/bench_batching.py [--cameras 8] [--fps 30] [--seconds 20] [--max-size 4]
        [--max-wait-ms 20] [--instances 1] [--placement thread|process] [--loop uvloop|asyncio]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from typing import Any

import anyio
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import real_models  # noqa: E402
from orchestra.pipeline import Batcher, Pipeline, Pipelines, SyntheticCamera, keyed  # noqa: E402

MAX_BATCH = 8


def export_dynamic_batch(cache_dir: str | None = None) -> pathlib.Path:
    """MobileNetV3-small with a dynamic batch dimension (1..8), exported once and cached."""
    path = real_models.cache_root(cache_dir) / "mobilenet_v3.portable.batch1-8.pte"
    if path.exists():
        return path
    torch = real_models._require_torch()
    real_models._require_executorch()
    from executorch.exir import to_edge

    model = real_models.build("mobilenet_v3")
    (x,) = real_models.make_inputs("mobilenet_v3")
    example = torch.from_numpy(np.concatenate([x, x]))
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    with torch.no_grad():
        ep = torch.export.export(model, (example,), dynamic_shapes=({0: batch},))
    pte = bytes(to_edge(ep).to_executorch().buffer)
    real_models._atomic_write(path, lambda f: f.write(pte))
    return path


def check_against_executorch(pte: pathlib.Path, sizes: tuple[int, ...]) -> None:
    from orchestra.runtime import load_program

    method = load_program(pte).load_method("forward")
    rng = np.random.default_rng(7)
    for n in sizes:
        x = rng.standard_normal((n, 3, 224, 224), dtype=np.float32)
        (want,) = real_models._run_executorch(pte.read_bytes(), [x])
        (got,) = method.execute([x])
        err = float(np.max(np.abs(got - want)))
        if not np.allclose(got, want, rtol=1e-3, atol=1e-3):
            raise SystemExit(f"orchestra and ExecuTorch disagree at batch {n}: max abs diff {err:.3g}")
        print(f"  batch {n}: orchestra == ExecuTorch runtime (max abs diff {err:.2g})")


def pre(frame: Any) -> list[Any]:
    return [frame.data[None]]


async def run_mode(args: argparse.Namespace, program: Any, batched: bool) -> dict[str, Any]:
    from orchestra.orchestrator import InstanceSpec, Orchestrator

    async with Orchestrator(period=None) as orch:
        pool = await orch.load(program, instances=[InstanceSpec(f"i{k}", placement=args.placement)
                                                   for k in range(args.instances)])
        batcher = None
        if batched:
            batcher = Batcher(pool, max_size=args.max_size, max_wait_s=args.max_wait_ms / 1000.0)
        group = Pipelines(latency_window=1 << 16)
        for k in range(args.cameras):
            name = f"cam{k}"
            executor = batcher.member(name) if batcher is not None else keyed(pool, name)
            group.add(Pipeline(name, SyntheticCamera(name, args.fps, (3, 224, 224), seed=k), executor,
                               pre=pre, queue=2, drop="drop_oldest"))
        # warm-up: one execute per instance at the sizes each mode uses
        x = np.zeros((args.max_size if batched else 1, 3, 224, 224), np.float32)
        for name in pool.instances:
            await pool[name].execute([x])
        warm = pool.statistics().executes
        t0 = time.perf_counter()
        stats = await group.run(args.seconds)
        elapsed = time.perf_counter() - t0
        executes = pool.statistics().executes - warm
    for p in group:
        p.accounting().check()
    acc = stats.accounting
    return {
        "mode": "batched" if batched else "unbatched",
        "processed": acc.processed,
        "fps": acc.processed / elapsed,
        "produced": acc.produced,
        "dropped": acc.dropped_total,
        "failed": acc.failed,
        "p50": stats.latency.p50,
        "p99": stats.latency.p99,
        "executes": executes,
        "sizes": batcher.statistics().format_sizes() if batcher is not None else "1 per execute",
        "wait": batcher.statistics().mean_wait_s if batcher is not None else 0.0,
    }


async def main(args: argparse.Namespace) -> int:
    from orchestra.runtime import load_program

    print(f"exporting / loading MobileNetV3-small with a dynamic batch (1..{MAX_BATCH}) ...")
    pte = export_dynamic_batch(args.cache_dir)
    print(f"  {pte}")
    check_against_executorch(pte, (1, args.max_size))
    program = load_program(pte)
    rows = []
    for batched in (False, True):
        print(f"running {'batched' if batched else 'unbatched'}: {args.cameras} cameras x {args.fps:g} fps, "
              f"{args.seconds:g} s, {args.instances} {args.placement} instance(s)"
              + (f", max_size {args.max_size}, max_wait {args.max_wait_ms:g} ms" if batched else ""))
        rows.append(await run_mode(args, program, batched))
    print()
    head = f"{'mode':<10} {'frames/s':>9} {'processed':>9} {'dropped':>8} {'failed':>6} {'p50 ms':>8} " \
           f"{'p99 ms':>8} {'executes':>8} {'wait ms':>7}  batch sizes (size x count)"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['mode']:<10} {r['fps']:>9.1f} {r['processed']:>9} {r['dropped']:>8} {r['failed']:>6} "
              f"{r['p50'] * 1e3:>8.1f} {r['p99'] * 1e3:>8.1f} {r['executes']:>8} {r['wait'] * 1e3:>7.1f}  {r['sizes']}")
    base, bat = rows
    print()
    print(f"throughput batched / unbatched: {bat['fps'] / base['fps']:.2f}x   "
          f"p99 batched / unbatched: {bat['p99'] / base['p99']:.2f}x   (same run, same machine)")
    print("accounting: exact for every camera in both modes")
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cameras", type=int, default=8)
    ap.add_argument("--fps", type=float, default=30.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--max-size", type=int, default=4)
    ap.add_argument("--max-wait-ms", type=float, default=20.0)
    ap.add_argument("--instances", type=int, default=1)
    ap.add_argument("--placement", choices=("thread", "process"), default="thread")
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    ap.add_argument("--cache-dir", default=None, help="real_models cache (default ~/.cache/orchestra/real_models)")
    args = ap.parse_args(argv)
    if not 1 <= args.max_size <= MAX_BATCH:
        ap.error(f"--max-size must be 1..{MAX_BATCH}")
    return args


if __name__ == "__main__":
    a = parse()
    sys.exit(anyio.run(main, a, backend="asyncio", backend_options={"use_uvloop": a.loop == "uvloop"}))
