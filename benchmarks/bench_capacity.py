#!/usr/bin/env python3
"""How many MobileNetV3-small (224x224) cameras at 30 fps one machine holds: orchestra against
the loop a user would write by hand, in one run, under one criterion.

A step runs N cameras for ``--duration`` seconds, every camera's frame k due at
t0 + k / fps (all cameras in phase, the worst case for bursts). It is *held* when no frame
failed, the frames came on schedule, >= 99 % of them were processed and the p99 latency
(frame due -> result) is <= ``--p99-ms`` (``orchestra._bench.judge``: the same function
``orchestra bench`` uses). N doubles from 1, then bisects (``orchestra._bench.search``).

Runners (``--runners``, default all):

- ``orchestra-default`` / ``orchestra-thread`` / ``orchestra-process``: ``orchestra bench``'s
  own search (``orchestra._bench.bench``) on a config of one synthetic camera, default
  settings (queue 8, drop_oldest), no ``placement`` key (the default, ``"auto"``: process
  placement for a CPU program on a machine with more than one CPU) or ``placement =
  "thread"`` or ``"process"``, for each ``.pte`` in
  ``--pte`` (``portable``: orchestra's numpy kernels; ``xnnpack``: the XNNPACK-lowered file
  through orchestra's XNNPACK backend);
- ``executorch``: one Python thread per camera, each with its own ``Method`` of ExecuTorch's
  runtime (``executorch.runtime``) on the XNNPACK-lowered ``.pte``, default threadpool;
- ``onnxruntime``: one thread per camera calling one shared ``InferenceSession`` (thread-safe
  ``run``; default session options) on the same model exported to ONNX (torch's exporter).

A hand-written camera loop keeps only the newest frame: when a thread is late, the frames
that came due meanwhile are skipped (counted as dropped) and it takes the latest. Each
thread loads its model before the clock starts; nothing is warmed up (orchestra isn't either).

The models come from ``benchmarks/real_models.py`` (exported once, cached; the ONNX file is
cached next to the ``.pte`` files). Prints a line per step, then the largest N each runner
held and the ratios to the ExecuTorch baseline. On a shared machine the counts move with the
load: run it twice before believing a difference of one or two cameras. About 3-5 minutes
with the defaults on a 2-vCPU VM.

    python benchmarks/bench_capacity.py [--duration 5] [--fps 30] [--p99-ms 100]
        [--max-streams 48] [--runners orchestra-default,orchestra-thread,orchestra-process,executorch,onnxruntime]
        [--pte portable,xnnpack] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import pathlib
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import real_models  # noqa: E402 - benchmarks/ is not a package

from orchestra._bench import BenchOptions, Step, Trial, bench, render_step, search  # noqa: E402
from orchestra.config import load_config  # noqa: E402

MODEL = "mobilenet_v3"
RUNNERS = ("orchestra-default", "orchestra-thread", "orchestra-process", "executorch", "onnxruntime")
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _quiet() -> None:
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))


# ---------------------------------------------------------------------------------------
# The hand-written baseline: a thread per camera, the newest frame wins


def _paced_threads(n: int, fps: float, duration_s: float, make: Callable[[], Callable[[], Any]]) -> Trial:
    """N threads, each with its own ``make()`` runner, each camera's frame k due at
    t0 + k / fps for ``duration_s``; a late thread skips to the newest due frame."""
    frames = math.ceil(duration_s * fps)  # due in [t0, t0 + duration)
    ready = threading.Barrier(n + 1)  # every camera loaded its model
    go = threading.Event()  # t0 is set
    start: list[float] = []
    lat: list[list[float]] = [[] for _ in range(n)]
    dropped = [0] * n
    errors: list[BaseException] = []

    def camera(i: int) -> None:
        try:
            run = make()
        except BaseException as exc:  # noqa: BLE001 - reported by the step
            errors.append(exc)
            ready.abort()
            return
        try:
            ready.wait()
        except threading.BrokenBarrierError:
            return
        go.wait()
        t0 = start[0]
        k = 0
        clock = time.monotonic
        while k < frames:
            due = t0 + k / fps
            now = clock()
            if now < due:
                time.sleep(due - now)
                now = clock()
            newest = min(int((now - t0) * fps), frames - 1)
            if newest > k:  # late: what came due meanwhile is skipped
                dropped[i] += newest - k
                k = newest
                due = t0 + k / fps
            try:
                run()
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)
                return
            lat[i].append(clock() - due)
            k += 1

    threads = [threading.Thread(target=camera, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    try:
        ready.wait()
    except threading.BrokenBarrierError:
        pass
    # The collector's first full pass in this process (which imported torch: ~400,000
    # objects, a few hundred ms) before the frames, as orchestra's run makes it for its cameras
    gc.collect()
    start.append(time.monotonic() + 0.05)
    go.set()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start[0]
    all_lat = np.array([x for li in lat for x in li])
    processed = int(all_lat.size)
    p50, p99 = (float(v) for v in np.percentile(all_lat, (50, 99))) if processed else (None, None)
    problem = f"{type(errors[0]).__name__}: {errors[0]}" if errors else None
    produced = n * frames
    return Trial(n, fps, min(elapsed, duration_s), produced, processed, sum(dropped),
                 produced - processed - sum(dropped), p50, p99, problem)


def _executorch_runner(pte: pathlib.Path, image: np.ndarray) -> Callable[[], Callable[[], Any]]:
    import torch
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(pte.read_bytes())  # outlives its methods
    x = torch.from_numpy(image)

    def make() -> Callable[[], Any]:
        method = program.load_method("forward")  # one per camera: a Method runs one call at a time
        return lambda: method.execute([x])

    make.program = program  # type: ignore[attr-defined]
    return make


def _onnx_file(cache_dir: str | None) -> pathlib.Path:
    path = real_models.cache_root(cache_dir) / f"{MODEL}.onnx"
    if not path.exists():
        import torch

        model = real_models.build(MODEL)
        x = torch.from_numpy(real_models.make_inputs(MODEL)[0])
        with torch.no_grad():
            real_models._atomic_write(path, lambda f: torch.onnx.export(model, (x,), f, dynamo=False,
                                                                        opset_version=17))
    return path


def _onnxruntime_runner(path: pathlib.Path, image: np.ndarray) -> Callable[[], Callable[[], Any]]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name

    def make() -> Callable[[], Any]:
        return lambda: session.run(None, {name: image})

    return make


# ---------------------------------------------------------------------------------------
# orchestra: `orchestra bench`'s own search on a one-camera config


CONFIG = """
[program]
name = "{model}"
path = "{pte}"

[[camera]]
name = "cam"
source = {{ kind = "synthetic", fps = {fps}, shape = [1, 3, 224, 224], dtype = "float32", seed = 1 }}
{placement}
"""


def _orchestra(pte: pathlib.Path, placement: str, args: argparse.Namespace, on_step: Callable[[Step], None],
               tmp: pathlib.Path) -> int:
    cfg_path = tmp / f"{pte.stem}.{placement}.toml"
    line = "" if placement == "default" else f'placement = "{placement}"'  # default: no key, what users get
    cfg_path.write_text(CONFIG.format(model=MODEL, pte=pte.as_posix(), fps=args.fps, placement=line),
                        encoding="utf-8")
    config = load_config(cfg_path)
    result = bench(config, BenchOptions(fps=args.fps, p99_ms=args.p99_ms, duration_s=args.duration,
                                        max_streams=args.max_streams), on_step=on_step)
    return result.largest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=5.0, help="seconds per step (default 5)")
    p.add_argument("--fps", type=float, default=30.0)
    p.add_argument("--p99-ms", type=float, default=100.0)
    p.add_argument("--max-streams", type=int, default=48)
    p.add_argument("--runners", default=",".join(RUNNERS))
    p.add_argument("--pte", default="portable,xnnpack", help="the .pte kinds orchestra runs (default both)")
    p.add_argument("--cache-dir", default=None)
    args = p.parse_args(argv)
    runners = [r for r in args.runners.split(",") if r]
    unknown = [r for r in runners if r not in RUNNERS]
    if unknown:
        p.error(f"unknown runner(s) {unknown}; known: {', '.join(RUNNERS)}")
    try:
        real_models._require_torch()
        real_models._require_executorch()
    except ImportError as exc:
        print(f"bench_capacity: needs torch and executorch (the export extra): {exc}")
        return 0
    _quiet()
    kinds = [k for k in args.pte.split(",") if k]
    ptes = {k: real_models.export(MODEL, k, args.cache_dir) for k in set(kinds) | {"xnnpack"}}
    image = real_models.make_inputs(MODEL)[0]
    print(f"{MODEL} 224x224 cameras at {args.fps:g} fps on {CPUS} CPUs, load average "
          f"{os.getloadavg()[0]:.1f}: held = p99 <= {args.p99_ms:g} ms and >= 99 % of frames processed, "
          f"{args.duration:g} s per step, N up to {args.max_streams}", flush=True)
    found: dict[str, int] = {}
    t_start = time.monotonic()

    def printer(label: str) -> Callable[[Step], None]:
        def show(step: Step) -> None:
            print(f"  {label:<28s} {render_step(step)}", flush=True)
        return show

    def baseline(label: str, make: Callable[[], Callable[[], Any]]) -> None:
        r = search(lambda n: _paced_threads(n, args.fps, args.duration, make), max_streams=args.max_streams,
                   p99_ms=args.p99_ms, min_rate=0.99, on_step=printer(label))
        found[label] = r.largest

    with tempfile.TemporaryDirectory(prefix="bench_capacity.") as tmp:
        for r in runners:
            if r.startswith("orchestra-"):
                placement = r.split("-", 1)[1]
                for kind in kinds:
                    label = f"orchestra {placement} ({kind})"
                    found[label] = _orchestra(ptes[kind], placement, args, printer(label), pathlib.Path(tmp))
            elif r == "executorch":
                from executorch.extension.pybindings import portable_lib

                label = f"ExecuTorch+XNNPACK threads (pool {portable_lib._threadpool_get_thread_count()})"
                baseline(label, _executorch_runner(ptes["xnnpack"], image))
            elif r == "onnxruntime":
                try:
                    import onnxruntime  # noqa: F401
                except ImportError:
                    print("  onnxruntime: not installed, skipped")
                    continue
                baseline("onnxruntime threads", _onnxruntime_runner(_onnx_file(args.cache_dir), image))
    print(f"\nlargest N held ({time.monotonic() - t_start:.0f} s in all, same run):")
    ref_label = next((k for k in found if k.startswith("ExecuTorch")), None)
    ref = found.get(ref_label) if ref_label else None
    for label, n in found.items():
        ratio = f"  {n / ref:5.2f}x ExecuTorch's" if ref else ""
        print(f"  {label:<42s} {n:4d}{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
