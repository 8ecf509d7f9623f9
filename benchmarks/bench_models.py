#!/usr/bin/env python3
"""orchestra against ExecuTorch on six real architectures, and what the thread budget buys.

The models come from ``benchmarks/real_models.py`` (MobileNetV3-small, EfficientNet-B0,
RegNetX-200MF, ViT-Tiny at 224x224; BERT-style and GPT-2-style at 128 tokens), exported once
(cached) as a portable ``.pte`` and an XNNPACK-lowered ``.pte``. Everything below is measured
in one run; every ratio compares numbers taken in that run.

1. ``models``: median execute latency, per model, at 1 and 2 threads, of orchestra's runtime
   on the portable ``.pte`` (BLAS threads set with threadpoolctl, its compiled kernels' with
   ``kernels.set_threads``; an 'orch np' column runs the same Method with the compiled
   kernels off), ExecuTorch's runtime on
   the portable ``.pte`` (its portable kernels are single-threaded) and on the XNNPACK
   ``.pte`` (XNNPACK's threads set with ExecuTorch's experimental
   ``_unsafe_reset_threadpool``), and, when ``orchestra.backends.xnnpack`` is importable,
   orchestra's own XNNPACK backend on the XNNPACK ``.pte``. Runners are called in turn
   (interleaved rounds), medians. orchestra's outputs are checked against ExecuTorch's.
   At 2 threads OpenBLAS's idle threads keep spinning for a while after each call and take
   CPU from whatever runs next, the other runners included: on a machine with other load,
   read the 2-thread rows as "what 2 BLAS threads cost here", not as a clean comparison.
2. ``scaling``: N = 1, 2, 4 instances of MobileNetV3-small through the orchestrator, thread
   and process placement (unbound: the orchestrator's thread rule applies), each driven by
   two closed-loop callers for ``--scale-seconds``; aggregate executes/s against (a) N bare
   processes running the same orchestra Method with no orchestrator (BLAS threads by the same
   rule) and (b) N bare processes running ExecuTorch+XNNPACK (its threads by the same rule).
   Every runner is started once and stays up (N bare processes, or one process hosting the
   orchestrator and its workers); the four then take turns, one window of ``--scale-seconds``
   each, for ``--scale-rounds`` rounds, so that a slow spell of the machine (a 2-vCPU VM's
   speed moves by 30-50 % over seconds) hits adjacent windows alike. Medians; each ratio is
   the median of the rounds' own ratios, with the quartiles of proc/bare in brackets.
3. ``busy``: latency of one MobileNetV3-small instance alone and while a second, identical
   one is busy on the machine: orchestra (two worker processes in one orchestrator, its
   thread rule), orchestra as it was before the rule (``blas_threads`` = every CPU per
   process, what OpenBLAS does by default), and ExecuTorch+XNNPACK (two bare processes, its
   default threads). Prints each one's degradation (busy p50 / alone p50).
4. ``load``: per model (portable ``.pte``), the time to a runnable Method: orchestra's
   ``load_program(path)`` + first ``load_method`` (a fresh Program each round, so nothing
   compiled by an earlier round is reused), against ExecuTorch's ``Runtime.load_program`` +
   ``load_method`` from the path and from bytes already in memory (the bytes read outside
   the timing), its default verification (InternalConsistency), and against
   ExecuTorch+XNNPACK loading the model's XNNPACK-lowered file from its path ('ETx path',
   'o/ETx': the time to a Method of the speed the execute ratios compare with); then orchestra's first and
   second execute after that load (work moved from load into the first execute shows as a
   first slower than the second) and ExecuTorch's first execute (portable kernels: slow,
   for information only), and a second ``load_method`` on the same program: orchestra makes a new
   independent Method sharing the Program's compiled plan; ExecuTorch's Python ``Program``
   caches the Method it loaded and returns that one again (not like with like). 'no rw':
   orchestra's load with its plan rewrites off (the plan as written: what a load costs
   before the rewrites' analysis, folds and fusions; set here through the runtime's
   internal ``CompiledPlan(optimize=False)``, for information), 'norw/path' over
   ExecuTorch's path load. Rounds
   interleaved (``--load-rounds``), medians; 1 BLAS thread. Then the same for the XNNPACK
   ``.pte`` (when ``orchestra.backends.xnnpack`` is importable): orchestra's XNNPACK backend
   against ExecuTorch+XNNPACK loading the same file, each verifying and compiling every
   delegate blob, and each one's first and second execute after the load (1 thread); the
   int8 files of section 5 too (rows 'NAME int8'). And the first load of each file in a fresh
   process (``--cold-rounds`` children per runtime, each warmed on another model's file):
   orchestra (the portable file, and its XNNPACK backend on the XNNPACK file), ExecuTorch
   (path) and ExecuTorch+XNNPACK (its file), what a deployment starting up pays, fresh memory
   and all.
5. ``int8`` (not in the default sections): MobileNetV3-small, EfficientNet-B0 and RegNetX
   PT2E-quantized to static int8 (XNNPACKQuantizer, per-channel weights) and lowered to
   XNNPACK: orchestra's XNNPACK backend on its compiled kernels and on its numpy int8 path,
   against ExecuTorch+XNNPACK on the same file, with orchestra on the float portable file for
   reference; interleaved, medians, at each ``--threads``; 'exact': orchestra's outputs equal
   ExecuTorch's bit for bit.

    python benchmarks/bench_models.py [--models mobilenet_v3,bert] [--seconds 0.4]
        [--sections models,scaling,busy,load,int8] [--ns 1,2,4] [--scale-seconds 1] [--scale-rounds 9]
        [--busy-seconds 2]
        [--threads 1,2] [--load-rounds 7] [--cold-rounds 5] [--cache-dir DIR]

Needs torch and executorch (the ``export`` extra); exits with a message without them.
Timings on a shared machine are noisy: read the ratios, and run it twice before believing
a small difference. The defaults take about 10 minutes on a 2-vCPU VM at load average 10
(ExecuTorch's portable kernels take seconds per execute of the larger models there); pass
``--sections`` / ``--models`` for less.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import multiprocessing as mp
import os
import pathlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import real_models  # noqa: E402 - benchmarks/ is not a package

CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
SCALE_MODEL = "mobilenet_v3"


def _quiet() -> None:
    """Silences orchestra's structlog output (also the orchestrator's process_initializer)."""
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))


def _et_threads(n: int) -> str:
    """Sets ExecuTorch's (XNNPACK's) thread pool to ``n`` threads; says how."""
    try:
        from executorch.extension.pybindings import portable_lib
    except ImportError:
        return "not settable (no portable_lib)"
    reset = getattr(portable_lib, "_unsafe_reset_threadpool", None)
    if reset is None:
        return "not settable (no _unsafe_reset_threadpool in this ExecuTorch)"
    reset(n)
    get = getattr(portable_lib, "_threadpool_get_thread_count", None)
    return f"{get() if get else n} (_unsafe_reset_threadpool)"


class _EtMethod:
    """An ExecuTorch Method that keeps its Program and the file's bytes alive (a Method whose
    Program was garbage-collected crashes on execute with XNNPACK delegates)."""

    def __init__(self, pte: pathlib.Path) -> None:
        from executorch.runtime import Runtime

        self.data = pte.read_bytes()
        self.program = Runtime.get().load_program(self.data)
        self.method = self.program.load_method("forward")
        self.execute = self.method.execute


def _et_method(pte: pathlib.Path) -> _EtMethod:
    return _EtMethod(pte)


def _orch_xnnpack_available() -> bool:
    try:
        import orchestra.backends.xnnpack  # noqa: F401
    except ImportError:
        return False
    return True


def _median_round_robin(fns: dict[str, Callable[[], object]], seconds: float, min_rounds: int = 3) -> dict[str, float]:
    """Median latency of each fn, called in turn (interleaved) so load changes hit all alike.
    Each turn makes one untimed call first: the turn before was another runtime's, whose idle
    threads may still be spinning (XNNPACK's, orchestra's) and whose own may be asleep; the
    timed call then sees the runtime as a user running it steadily does."""
    for f in fns.values():
        f()
    times: dict[str, list[float]] = {k: [] for k in fns}
    perf = time.perf_counter
    end = perf() + seconds * len(fns)
    while perf() < end or min(len(t) for t in times.values()) < min_rounds:
        for k, f in fns.items():
            f()
            t = perf()
            f()
            times[k].append(perf() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def _maxrel(got: list[Any], expected: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(np.asarray(g, dtype=np.float64) - e))) / max(float(np.max(np.abs(e))), 1e-30)
               for g, e in zip(got, expected))


# -- 1. models ---------------------------------------------------------------------------------
def section_models(args: argparse.Namespace) -> None:
    import torch
    from threadpoolctl import threadpool_limits

    from orchestra.runtime import load_program

    from orchestra.runtime import kernels
    from orchestra.runtime.kernels import _conv, _elementwise, _linalg

    with_xnn = _orch_xnnpack_available()
    with_np = kernels.NATIVE_KERNELS  # orchestra with its numpy kernels only, for comparison

    def numpy_only(fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            saved = _conv._native, _elementwise._native, _linalg._native
            _conv._native = _elementwise._native = _linalg._native = None
            try:
                return fn()
            finally:
                _conv._native, _elementwise._native, _linalg._native = saved
        return run

    print("== models: median execute ms, interleaved; ratios are orchestra / the column's runtime (same run)")
    if with_np:
        print("   'orch np': orchestra with its compiled kernels switched off (numpy paths only); 'np/o' its time over orchestra's")
    else:
        print("   orchestra's compiled kernels are not built here: numpy paths only")
    print(f"   orchestra BLAS threads via threadpoolctl, its compiled kernels' via kernels.set_threads;"
          f" ExecuTorch XNNPACK threads via {_et_threads(1).split(' ', 1)[1]}"
          f"; ExecuTorch portable kernels are single-threaded"
          + ("" if with_xnn else "; orchestra XNNPACK column skipped (orchestra.backends.xnnpack not importable)"))
    head = f"{'model':<13}{'thr':>4}{'orch':>9}" + (f"{'orch np':>9}" if with_np else "") + f"{'ET port':>9}{'ET xnn':>9}"
    if with_xnn:
        head += f"{'orch xnn':>9}"
    head += f"{'o/port':>8}{'o/xnn':>8}" + (f"{'np/o':>7}" if with_np else "") + (f"{'ox/xnn':>8}" if with_xnn else "") + f"{'maxrel':>9}"
    print(head)
    geo: dict[int, list[float]] = {}
    # One thread count at a time, ExecuTorch's pool reset while none of its Methods is alive:
    # resetting it under live XNNPACK Methods aborted the process (pthread_mutex_lock assertion).
    for n in args.threads:
        _et_threads(n)
        for name in args.models:
            portable = real_models.export(name, "portable", args.cache_dir)
            xnn = real_models.export(name, "xnnpack", args.cache_dir)
            inputs, expected = real_models.load_io(name, "portable", args.cache_dir)
            method = load_program(portable).load_method("forward")
            maxrel = _maxrel(list(method.execute(inputs)), expected)
            oxm = load_program(xnn).load_method("forward") if with_xnn else None
            tin = [torch.from_numpy(a) for a in inputs]
            et_port = _et_method(portable)
            et_xnn = _et_method(xnn)
            fns: dict[str, Callable[[], object]] = {
                "orch": lambda: method.execute(inputs),
                "port": lambda: et_port.execute(tin),
                "xnn": lambda: et_xnn.execute(tin),
            }
            if with_np:
                fns["np"] = numpy_only(lambda: method.execute(inputs))
            if oxm is not None:
                fns["oxnn"] = lambda: oxm.execute(inputs)
            # orchestra's rule (orchestrator/_threads.py): the threads go to its compiled kernels
            # and BLAS runs on one (two pools of spinning threads fight over the CPUs); BLAS
            # gets them where the kernels are not built
            kernels.set_threads(n)
            with threadpool_limits(limits=1 if kernels.NATIVE_KERNELS else n):
                med = _median_round_robin(fns, args.seconds)
            kernels.set_threads(1)
            row = f"{name:<13}{n:>4}{med['orch'] * 1e3:9.2f}" + (f"{med['np'] * 1e3:9.2f}" if with_np else "")
            row += f"{med['port'] * 1e3:9.2f}{med['xnn'] * 1e3:9.2f}"
            if oxm is not None:
                row += f"{med['oxnn'] * 1e3:9.2f}"
            row += f"{med['orch'] / med['port']:8.2f}{med['orch'] / med['xnn']:8.2f}"
            if with_np:
                row += f"{med['np'] / med['orch']:7.2f}"
            if oxm is not None:
                row += f"{med['oxnn'] / med['xnn']:8.2f}"
            print(row + f"{maxrel:9.1e}", flush=True)
            geo.setdefault(n, []).append(med["orch"] / med["xnn"])
            method.close()
            if oxm is not None:
                oxm.close()
            del fns, et_port, et_xnn
            gc.collect()
    for n, rs in geo.items():
        print(f"   {n} thread(s): geometric mean orchestra / ExecuTorch+XNNPACK = {float(np.exp(np.mean(np.log(rs)))):.2f}x")
    _et_threads(CPUS)


# -- 5. int8 -------------------------------------------------------------------------------------
INT8_MODELS = ("mobilenet_v3", "efficientnet", "regnetx")


def section_int8(args: argparse.Namespace) -> None:
    """The CNNs PT2E-quantized to int8 and lowered to XNNPACK (as ExecuTorch teaches): orchestra's
    XNNPACK backend with its compiled kernels ('orch'), with them switched off for this
    backend's plans ('orch np', the numpy int8 path), ExecuTorch+XNNPACK on the same file, and
    orchestra on the float portable file for reference."""
    import torch
    from threadpoolctl import threadpool_limits

    from orchestra.runtime import kernels, load_program

    if not _orch_xnnpack_available():
        print("\n== int8: skipped (orchestra.backends.xnnpack not importable)")
        return
    print("\n== int8: XNNPACK-lowered PT2E int8 files, median execute ms, interleaved; 'orch np': the "
          "backend's numpy int8 path (compiled kernels off at load); 'o f32': orchestra on the float portable file")
    print(f"{'model':<13}{'thr':>4}{'orch':>9}{'orch np':>9}{'ET xnn':>9}{'o f32':>9}{'o/xnn':>8}{'np/o':>7}{'exact':>7}")
    real_compiled = kernels.compiled
    for n in args.threads:
        _et_threads(n)
        for name in INT8_MODELS:
            q8 = real_models.export(name, "xnnpack_int8", args.cache_dir)
            inputs, expected = real_models.load_io(name, "xnnpack_int8", args.cache_dir)
            m = load_program(q8).load_method("forward")
            kernels.compiled = lambda: None  # type: ignore[assignment]  # the numpy path's plan
            try:
                mnp = load_program(q8).load_method("forward")
            finally:
                kernels.compiled = real_compiled  # type: ignore[assignment]
            exact = all(np.array_equal(g, w) for g, w in zip(m.execute(inputs), expected))
            f32 = load_program(real_models.export(name, "portable", args.cache_dir)).load_method("forward")
            f32_in, _ = real_models.load_io(name, "portable", args.cache_dir)
            et = _et_method(q8)
            tin = [torch.from_numpy(a) for a in inputs]
            fns: dict[str, Callable[[], object]] = {"orch": lambda: m.execute(inputs), "np": lambda: mnp.execute(inputs),
                                                    "xnn": lambda: et.execute(tin), "f32": lambda: f32.execute(f32_in)}
            kernels.set_threads(n)
            with threadpool_limits(limits=1 if kernels.NATIVE_KERNELS else n):
                med = _median_round_robin(fns, args.seconds)
            kernels.set_threads(1)
            print(f"{name:<13}{n:>4}{med['orch'] * 1e3:9.2f}{med['np'] * 1e3:9.2f}{med['xnn'] * 1e3:9.2f}"
                  f"{med['f32'] * 1e3:9.2f}{med['orch'] / med['xnn']:8.2f}{med['np'] / med['orch']:7.2f}"
                  f"{'yes' if exact else 'NO':>7}", flush=True)
            for meth in (m, mnp, f32):
                meth.close()
            del fns, et
            gc.collect()
    _et_threads(CPUS)


# -- 4. load -------------------------------------------------------------------------------------
@contextlib.contextmanager
def _rewrites_off() -> Iterator[None]:
    """Programs loaded inside compile their plans as written (no rewrites): the runtime's
    internal switch, for the load section's 'no rw' column only."""
    from orchestra.runtime import _method

    compiled = _method.CompiledPlan.__init__
    _method.CompiledPlan.__init__ = functools.partialmethod(compiled, optimize=False)  # type: ignore[method-assign]
    try:
        yield
    finally:
        _method.CompiledPlan.__init__ = compiled  # type: ignore[method-assign]


def section_load(args: argparse.Namespace) -> None:
    import torch
    from executorch.runtime import Runtime
    from threadpoolctl import threadpool_limits

    from orchestra.runtime import load_program

    rt = Runtime.get()
    print("== load: median ms to a runnable Method (load_program + first load_method), and the first execute after it;"
          " interleaved rounds, a fresh program each round; ratios orchestra / ExecuTorch (same run)")
    print("   ('o prog': orchestra's load_program alone, the rest of 'orch' is its first load_method: the plan compiled;"
          " 'ETx path': ExecuTorch+XNNPACK loading the model's XNNPACK-lowered file from its path, the runtime the"
          " execute ratios compare with; 'o/ETx': orchestra's load of the portable file over it)")
    print(f"{'model':<13}{'MB':>6}{'orch':>8}{'o prog':>8}{'ET path':>9}{'ET bytes':>9}{'o/path':>8}{'o/bytes':>8}"
          f"{'ETx path':>9}{'o/ETx':>7}{'o 1st ex':>9}{'o 2nd ex':>9}{'ET 1st ex':>10}{'o 2nd lm':>9}{'ET 2nd (cached)':>16}"
          f"{'no rw':>8}{'norw/path':>10}")
    perf = time.perf_counter
    for name in args.models:
        portable = real_models.export(name, "portable", args.cache_dir)
        xnn = real_models.export(name, "xnnpack", args.cache_dir)
        inputs, _ = real_models.load_io(name, "portable", args.cache_dir)
        tin = [torch.from_numpy(a) for a in inputs]
        data = portable.read_bytes()
        times: dict[str, list[float]] = {
            k: [] for k in ("orch", "prog", "path", "bytes", "xnn", "orch1", "orch2", "et1", "olm2", "elm2", "norw")}

        def orch_no_rewrites() -> None:
            with _rewrites_off():
                t = perf()
                m = load_program(portable).load_method("forward")
                times["norw"].append(perf() - t)
            m.close()

        def orch() -> None:
            t = perf()
            prog = load_program(portable)
            tp = perf()
            m = prog.load_method("forward")
            t1 = perf()
            times["prog"].append(tp - t)
            m.execute(inputs)
            t2 = perf()
            m.execute(inputs)
            times["orch"].append(t1 - t)
            times["orch1"].append(t2 - t1)
            times["orch2"].append(perf() - t2)
            t3 = perf()
            m2 = prog.load_method("forward")
            times["olm2"].append(perf() - t3)
            m2.close()
            m.close()

        def et(kind: str) -> None:
            t = perf()
            prog = rt.load_program(str(xnn) if kind == "xnn" else str(portable) if kind == "path" else data)
            m = prog.load_method("forward")
            t1 = perf()
            times[kind].append(t1 - t)
            if kind == "path":
                m.execute(tin)
                times["et1"].append(perf() - t1)
                t2 = perf()
                prog.load_method("forward")
                times["elm2"].append(perf() - t2)

        with threadpool_limits(limits=1):
            orch(), et("path"), et("bytes"), et("xnn"), orch_no_rewrites()  # warm-up: imports, registries, page cache
            for v in times.values():
                v.clear()
            for _ in range(args.load_rounds):
                orch()
                orch_no_rewrites()
                et("path")
                et("bytes")
                et("xnn")
                gc.collect()
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(f"{name:<13}{len(data) / 1e6:6.1f}{med['orch']:8.2f}{med['prog']:8.2f}{med['path']:9.2f}{med['bytes']:9.2f}"
              f"{med['orch'] / med['path']:8.1f}{med['orch'] / med['bytes']:8.1f}{med['xnn']:9.2f}{med['orch'] / med['xnn']:7.1f}"
              f"{med['orch1']:9.2f}{med['orch2']:9.2f}"
              f"{med['et1']:10.2f}{med['olm2']:9.2f}{med['elm2']:16.2f}{med['norw']:8.2f}{med['norw'] / med['path']:10.1f}",
              flush=True)
    if args.cold_rounds:
        _load_cold(args)
    if _orch_xnnpack_available():
        _load_xnnpack(args, rt)


# One child process of _load_cold: the runtime imported and warmed on another model's file,
# then one timed load of the file under test (ms on stdout).
_COLD_CHILD = r"""
import sys, time
kind, warm, target = sys.argv[1:4]
if kind == "orch":
    from orchestra.runtime import load_program
    def load(path):
        return load_program(path).load_method("forward")
else:
    from executorch.runtime import Runtime
    rt = Runtime.get()
    def load(path):
        return rt.load_program(path).load_method("forward")
load(warm)
t = time.perf_counter()
m = load(target)
print((time.perf_counter() - t) * 1e3)
"""


def _load_cold(args: argparse.Namespace) -> None:
    """The first load of each file in a fresh process: what a deployment starting up pays.
    Each child imports its runtime and loads another model's file of the same kind first
    (imports, registries and one-time initialisation out of the timing), then times
    ``load_program`` + ``load_method`` of the file under test once: its weights' pages, the
    plan's fresh memory and the collector's first pass over the new objects included, which
    the warm rounds above reuse from the round before."""
    print(f"== first load in a fresh process: median ms of {args.cold_rounds} interleaved children per runtime, "
          "each warmed on another model's file; 1 BLAS thread")
    print("   ('orch': orchestra on the portable file; 'o xnn': orchestra's XNNPACK backend on the XNNPACK file,"
          " the same file 'ETx path' loads; 'ox/ETx': that one over ExecuTorch's)")
    print(f"{'model':<13}{'orch':>8}{'ET path':>9}{'o xnn':>8}{'ETx path':>9}{'o/path':>8}{'o/ETx':>7}{'ox/ETx':>8}")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    for name in args.models:
        warm_name = next((m for m in ("bert", *real_models.MODELS) if m != name), name)
        files = {"orch": ("portable", name), "path": ("portable", name), "oxnn": ("xnnpack", name),
                 "xnn": ("xnnpack", name)}
        times: dict[str, list[float]] = {k: [] for k in files}
        for _ in range(args.cold_rounds):
            for kind, (file_kind, model) in files.items():
                warm = real_models.export(warm_name, file_kind, args.cache_dir)
                target = real_models.export(model, file_kind, args.cache_dir)
                r = subprocess.run([sys.executable, "-c", _COLD_CHILD, "orch" if kind in ("orch", "oxnn") else "et", str(warm),
                                    str(target)], capture_output=True, text=True, env=env, timeout=600)
                lines = r.stdout.split()
                if r.returncode != 0 or not lines:
                    raise RuntimeError(f"cold load child ({kind}, {name}) failed: {r.stderr[-2000:]}")
                times[kind].append(float(lines[-1]))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{name:<13}{med['orch']:8.2f}{med['path']:9.2f}{med['oxnn']:8.2f}{med['xnn']:9.2f}"
              f"{med['orch'] / med['path']:8.1f}{med['orch'] / med['xnn']:7.1f}{med['oxnn'] / med['xnn']:8.1f}", flush=True)


def _load_xnnpack(args: argparse.Namespace, rt: Any) -> None:
    """The same for the XNNPACK-lowered .pte: orchestra's XNNPACK backend against ExecuTorch's
    XNNPACK runtime, both verifying and compiling every delegate blob on the same file (the
    files users ship), and the first and second execute after each load."""
    import torch
    from threadpoolctl import threadpool_limits

    from orchestra.runtime import kernels, load_program

    print("== load of the XNNPACK-lowered .pte: median ms to a runnable Method, orchestra's XNNPACK backend vs "
          "ExecuTorch+XNNPACK (path), same file; 1 thread")
    print(f"{'model':<18}{'MB':>6}{'orch':>8}{'ET':>8}{'o/ET':>7}{'o 1st ex':>9}{'o 2nd ex':>9}{'ET 1st ex':>10}"
          f"{'ET 2nd ex':>10}")
    perf = time.perf_counter
    kernels.set_threads(1)
    _et_threads(1)
    files = [(name, "xnnpack") for name in args.models]
    files += [(name, "xnnpack_int8") for name in args.models if name in INT8_MODELS]
    for name, file_kind in files:
        xnn = real_models.export(name, file_kind, args.cache_dir)
        inputs, _ = real_models.load_io(name, "portable" if file_kind == "xnnpack" else file_kind, args.cache_dir)
        tin = [torch.from_numpy(a) for a in inputs]
        times: dict[str, list[float]] = {k: [] for k in ("orch", "et", "o1", "o2", "e1", "e2")}
        label = name if file_kind == "xnnpack" else f"{name} int8"

        def run(kind: str) -> None:
            t = perf()
            if kind == "orch":
                m = load_program(xnn).load_method("forward")
                execute: Callable[[], Any] = lambda: m.execute(inputs)
            else:
                em = rt.load_program(str(xnn)).load_method("forward")
                execute = lambda: em.execute(tin)
            t1 = perf()
            execute()
            t2 = perf()
            execute()
            t3 = perf()
            first, second = ("o1", "o2") if kind == "orch" else ("e1", "e2")
            times[kind].append(t1 - t)
            times[first].append(t2 - t1)
            times[second].append(t3 - t2)
            if kind == "orch":
                m.close()

        with threadpool_limits(limits=1):
            run("orch"), run("et")
            for v in times.values():
                v.clear()
            for _ in range(args.load_rounds):
                run("orch")
                run("et")
                gc.collect()
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(f"{label:<18}{xnn.stat().st_size / 1e6:6.1f}{med['orch']:8.2f}{med['et']:8.2f}{med['orch'] / med['et']:7.1f}"
              f"{med['o1']:9.2f}{med['o2']:9.2f}{med['e1']:10.2f}{med['e2']:10.2f}", flush=True)


# -- bare processes (no orchestrator) ------------------------------------------------------------
def _bare_execute(kind: str, pte: str, cache_dir: str | None, threads: int) -> Callable[[], object]:
    """In a bare process: one Method of ``pte`` ("orchestra": orchestra's runtime with the
    orchestrator's BLAS rule for a worker given ``threads``; else ExecuTorch with ``threads``
    threads) loaded and run twice; returns a call running it once on the model's inputs."""
    _quiet()
    inputs, _ = real_models.load_io(SCALE_MODEL, "portable", cache_dir)
    if kind == "orchestra":
        from orchestra.orchestrator._threads import apply_blas_limit
        from orchestra.runtime import load_program

        apply_blas_limit(threads)
        m = load_program(pte).load_method("forward")
        fn: Callable[[], object] = lambda: m.execute(inputs)  # noqa: E731
    else:
        import torch

        _et_threads(threads)
        em = _et_method(pathlib.Path(pte))
        tin = [torch.from_numpy(a) for a in inputs]
        fn = lambda: em.execute(tin)  # noqa: E731
    fn()
    fn()
    return fn


def _bare(kind: str, pte: str, cache_dir: str | None, threads: int, ready: Any, go: Any, stop: Any, seconds: float,
          results: Any) -> None:
    """A bare process: runs one Method in a closed loop from ``go`` for ``seconds`` (or until
    ``stop``); puts (executes, elapsed s, latencies) on ``results``."""
    fn = _bare_execute(kind, pte, cache_dir, threads)
    ready.set()
    go.wait()
    perf = time.perf_counter
    lat: list[float] = []
    t0 = perf()
    end = t0 + seconds
    while perf() < end and not stop.is_set():
        t = perf()
        fn()
        lat.append(perf() - t)
    results.put((len(lat), perf() - t0, lat))


def _run_bare(kind: str, pte: pathlib.Path, n: int, threads: int, seconds: float, cache_dir: str | None,
              measure_first_only: bool = False, neighbours_busy: bool = True) -> tuple[float, list[float]]:
    """N bare processes started together; returns (aggregate executes/s, the first one's
    latencies). With ``measure_first_only`` the others run until the first one ends (the busy
    neighbours); without ``neighbours_busy`` only the first one runs."""
    ctx = mp.get_context("spawn")
    go, stop = ctx.Event(), ctx.Event()
    results = ctx.Queue()
    count = n if neighbours_busy else 1
    readies = [ctx.Event() for _ in range(count)]
    procs = [ctx.Process(target=_bare, args=(kind, str(pte), cache_dir, threads, readies[k], go, stop,
                                               seconds if (k == 0 or not measure_first_only) else 1e9, results),
                         daemon=True) for k in range(count)]
    for p in procs:
        p.start()
    for r in readies:
        r.wait(300)
    go.set()
    got = [results.get(timeout=seconds + 300)]
    if measure_first_only:
        stop.set()
    got += [results.get(timeout=seconds + 300) for _ in range(count - 1)]
    for p in procs:
        p.join(30)
    total = sum(g[0] for g in got) / max(g[1] for g in got)
    return total, got[0][2]  # measure_first_only: the first to answer is the measured one


# -- the orchestrator -----------------------------------------------------------------------------
async def _orchestrated(pte: pathlib.Path, n: int, placement: str, seconds: float, cache_dir: str | None,
                        drive: int | None = None, blas_threads: int | None = None,
                        per_instance: int = 2) -> tuple[float, list[float], list[str]]:
    """N instances in one orchestrator; the first ``drive`` of them (default all) driven by
    ``per_instance`` closed-loop callers each for ``seconds``. Returns (executes/s, the first
    instance's caller-side latencies, each instance's thread budget)."""
    from orchestra.orchestrator import InstanceSpec, Orchestrator
    from orchestra.runtime import load_program

    inputs, _ = real_models.load_io(SCALE_MODEL, "portable", cache_dir)
    prog = load_program(pte)
    drive = n if drive is None else drive
    async with Orchestrator(period=None, process_initializer=_quiet, blas_threads=blas_threads) as orch:
        p = await orch.load(prog, instances=[InstanceSpec(f"i{k}", placement=placement) for k in range(n)])
        insts = [p[f"i{k}"] for k in range(n)]
        for inst in insts:
            await inst.execute(inputs)
        lat: list[float] = []
        counts = [0] * drive
        perf = time.perf_counter
        end = perf() + seconds

        async def caller(k: int) -> None:
            inst = insts[k]
            while perf() < end:
                t = perf()
                await inst.execute(inputs)
                if k == 0:
                    lat.append(perf() - t)
                counts[k] += 1

        t0 = perf()
        await asyncio.gather(*(caller(k) for k in range(drive) for _ in range(per_instance)))
        elapsed = perf() - t0
        budgets = [i.statistics().threads.format() if i.statistics().threads else "-" for i in insts]
    return sum(counts) / elapsed, lat, budgets


def _orch_run(*a: Any, **kw: Any) -> tuple[float, list[float], list[str]]:
    try:
        import uvloop

        return uvloop.run(_orchestrated(*a, **kw))
    except ImportError:
        return asyncio.run(_orchestrated(*a, **kw))


# -- resident runners (section scaling) --------------------------------------------------------
def _window(fn: Callable[[], object], seconds: float) -> tuple[int, float]:
    """Calls ``fn`` in a closed loop for ``seconds``: (calls, elapsed s)."""
    perf = time.perf_counter
    count = 0
    t0 = perf()
    end = t0 + seconds
    while perf() < end:
        fn()
        count += 1
    return count, perf() - t0


def _resident_bare(kind: str, pte: str, cache_dir: str | None, threads: int, conn: Any) -> None:
    """A bare process (no orchestrator) that stays up between windows: loads and warms one
    Method, says ``ready``, then runs one closed-loop window per number of seconds it gets on
    ``conn`` and answers (executes, elapsed s), until it gets None."""
    fn = _bare_execute(kind, pte, cache_dir, threads)
    conn.send("ready")
    while (seconds := conn.recv()) is not None:
        conn.send(_window(fn, seconds))


def _resident_orchestrator(pte: str, n: int, placement: str, cache_dir: str | None, conn: Any) -> None:
    """A process hosting an Orchestrator with N instances of ``placement`` (unbound), up between
    windows: each window drives every instance with two closed-loop callers for the seconds it
    gets on ``conn`` and answers (executes, elapsed s); ``ready`` carries the instances' thread
    budgets. The orchestrator runs in a process of its own so that its rules (BLAS threads of
    the process, the thread budget) are exactly those of a user's process with these N instances."""
    _quiet()

    async def main() -> None:
        from orchestra.orchestrator import InstanceSpec, Orchestrator
        from orchestra.runtime import load_program

        inputs, _ = real_models.load_io(SCALE_MODEL, "portable", cache_dir)
        async with Orchestrator(period=None, process_initializer=_quiet) as orch:
            p = await orch.load(load_program(pte), instances=[InstanceSpec(f"i{k}", placement=placement)
                                                              for k in range(n)])
            insts = [p[f"i{k}"] for k in range(n)]
            for inst in insts:
                await inst.execute(inputs)
                await inst.execute(inputs)
            conn.send(("ready", [i.statistics().threads.format() if i.statistics().threads else "-" for i in insts]))
            perf = time.perf_counter
            while (seconds := await asyncio.to_thread(conn.recv)) is not None:
                count = 0
                end = perf() + seconds

                async def caller(inst: Any) -> None:
                    nonlocal count
                    while perf() < end:
                        await inst.execute(inputs)
                        count += 1

                t0 = perf()
                await asyncio.gather(*(caller(inst) for inst in insts for _ in range(2)))
                conn.send((count, perf() - t0))

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


class _Residents:
    """One runner of section scaling: a group of resident processes (N bare ones, or one
    hosting an orchestrator) started once and then driven window by window, together."""

    def __init__(self, target: Callable[..., None], args_list: list[tuple[Any, ...]]) -> None:
        ctx = mp.get_context("spawn")
        self.conns = []
        self.procs = []
        self.ready: list[Any] = []
        try:
            for args in args_list:
                parent, child = ctx.Pipe()
                # not daemonic: an orchestrator's host starts worker processes of its own
                p = ctx.Process(target=target, args=(*args, child))
                p.start()
                child.close()
                self.conns.append(parent)
                self.procs.append(p)
            for c in self.conns:
                if not c.poll(600):
                    raise RuntimeError("a resident benchmark process was not ready in 600 s")
                self.ready.append(c.recv())
        except BaseException:
            self.close()
            raise

    def window(self, seconds: float) -> float:
        """Runs one window in every process at once: aggregate executes/s."""
        for c in self.conns:
            c.send(seconds)
        got = [c.recv() for c in self.conns]
        return sum(g[0] for g in got) / max(g[1] for g in got)

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(None)
            except OSError:
                pass
        for p in self.procs:
            p.join(60)
            if p.is_alive():
                p.kill()
                p.join(10)


# -- 2. scaling ---------------------------------------------------------------------------------
def section_scaling(args: argparse.Namespace) -> None:
    portable = real_models.export(SCALE_MODEL, "portable", args.cache_dir)
    xnn = real_models.export(SCALE_MODEL, "xnnpack", args.cache_dir)
    rounds = max(1, args.scale_rounds)
    print(f"\n== scaling: {SCALE_MODEL}, aggregate executes/s, {CPUS} CPUs; orchestrator instances unbound, 2 callers "
          f"each; every runner stays up and the four take turns in windows of {args.scale_seconds:g} s, {rounds} "
          "rounds; medians, each ratio the median of the rounds' own ratios (q1-q3 of those in brackets)")
    print(f"{'N':>3}{'threads':>9}{'process':>9}{'bare orch':>11}{'bare ET xnn':>13}"
          f"{'thr/bare':>10}{'proc/bare':>18}{'proc/ETx':>10}  budget (process placement)")
    med = statistics.median
    for n in args.ns:
        rule = CPUS if n == 1 else 1  # the orchestrator's rule for unbound instances
        runners: dict[str, _Residents] = {}
        try:
            runners["thr"] = _Residents(_resident_orchestrator, [(str(portable), n, "thread", args.cache_dir)])
            runners["proc"] = _Residents(_resident_orchestrator, [(str(portable), n, "process", args.cache_dir)])
            runners["bare"] = _Residents(_resident_bare, [("orchestra", str(portable), args.cache_dir, rule)] * n)
            runners["etx"] = _Residents(_resident_bare, [("executorch", str(xnn), args.cache_dir, rule)] * n)
            got: dict[str, list[float]] = {k: [] for k in runners}
            for _ in range(rounds):  # in turn, so that a slow spell of the machine hits each runner alike
                for k, r in runners.items():
                    got[k].append(r.window(args.scale_seconds))
            budgets = runners["proc"].ready[0][1]
        finally:
            for r in runners.values():
                r.close()

        def ratios(a: str, b: str) -> list[float]:
            return sorted(x / y for x, y in zip(got[a], got[b]))

        pb = ratios("proc", "bare")
        q = statistics.quantiles(pb, n=4) if len(pb) > 1 else [pb[0]] * 3
        print(f"{n:>3}{med(got['thr']):9.1f}{med(got['proc']):9.1f}{med(got['bare']):11.1f}{med(got['etx']):13.1f}"
              f"{med(ratios('thr', 'bare')):10.2f}{med(pb):7.2f} [{q[0]:.2f}-{q[2]:.2f}]"
              f"{med(ratios('proc', 'etx')):10.2f}  {budgets[0]}", flush=True)


# -- 3. busy neighbour ----------------------------------------------------------------------------
def section_busy(args: argparse.Namespace) -> None:
    portable = real_models.export(SCALE_MODEL, "portable", args.cache_dir)
    xnn = real_models.export(SCALE_MODEL, "xnnpack", args.cache_dir)
    s = args.busy_seconds
    print(f"\n== busy: {SCALE_MODEL}, p50 latency ms of one instance alone and while an identical second one is "
          f"busy ({CPUS} CPUs, {s:g} s each)")
    print(f"{'runtime':<44}{'alone':>9}{'busy':>9}{'busy/alone':>12}")
    rows = []
    for label, blas in (("orchestra (thread rule: BLAS 1 per process)", None),
                        (f"orchestra before the rule (BLAS {CPUS} per process)", CPUS)):
        _, alone, budget = _orch_run(portable, 2, "process", s, args.cache_dir, drive=1, blas_threads=blas,
                                     per_instance=1)
        _, busy, _ = _orch_run(portable, 2, "process", s, args.cache_dir, drive=2, blas_threads=blas, per_instance=1)
        rows.append((f"{label}", statistics.median(alone), statistics.median(busy)))
    _, alone = _run_bare("executorch", xnn, 2, CPUS, s, args.cache_dir, measure_first_only=True, neighbours_busy=False)
    _, busy = _run_bare("executorch", xnn, 2, CPUS, s, args.cache_dir, measure_first_only=True)
    rows.append((f"ExecuTorch+XNNPACK (default threads: {CPUS})", statistics.median(alone), statistics.median(busy)))
    for label, a, b in rows:
        print(f"{label:<44}{a * 1e3:9.2f}{b * 1e3:9.2f}{b / a:12.2f}", flush=True)
    print(f"   orchestra's degradation / ExecuTorch+XNNPACK's: {(rows[0][2] / rows[0][1]) / (rows[2][2] / rows[2][1]):.2f}"
          f"; latency before the rule / with it: alone {rows[1][1] / rows[0][1]:.1f}x, busy {rows[1][2] / rows[0][2]:.1f}x"
          " (on a machine with other load, BLAS threads beyond the CPUs one gets hurt even 'alone')")


def _csv_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(real_models.MODELS), help="comma-separated (section models)")
    ap.add_argument("--seconds", type=float, default=0.4, help="timing budget per runner per model and thread count")
    ap.add_argument("--threads", default="1,2", help="thread counts for section models")
    ap.add_argument("--sections", default="models,scaling,busy")
    ap.add_argument("--ns", default="1,2,4", help="instance counts for section scaling")
    ap.add_argument("--scale-seconds", type=float, default=1.0, help="one runner's window in section scaling")
    ap.add_argument("--scale-rounds", type=int, default=9,
                    help="rounds of windows per N for section scaling (medians; a 2-vCPU VM's speed moves by 30-50 %%)")
    ap.add_argument("--busy-seconds", type=float, default=2.0)
    ap.add_argument("--load-rounds", type=int, default=7, help="interleaved rounds for section load")
    ap.add_argument("--cold-rounds", type=int, default=5,
                    help="fresh processes per runtime and model for section load's first loads (0: none)")
    ap.add_argument("--cache-dir", default=None)
    args = ap.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    unknown = [m for m in args.models if m not in real_models.MODELS]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(real_models.MODELS)}")
    args.threads = _csv_ints(args.threads)
    args.ns = _csv_ints(args.ns)
    sections = [s for s in args.sections.split(",") if s]
    bad = [s for s in sections if s not in ("models", "scaling", "busy", "load", "int8")]
    if bad:
        ap.error(f"unknown section(s) {', '.join(bad)}; known: models, scaling, busy, load, int8")
    if args.load_rounds < 1:
        ap.error("--load-rounds must be at least 1")
    if args.cold_rounds < 0:
        ap.error("--cold-rounds must be 0 or more")
    try:
        import executorch  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        print(f"bench_models needs torch and executorch (pip install -e '.[export]'): {exc}", file=sys.stderr)
        return 2
    _quiet()
    print(f"bench_models: {CPUS} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    if "models" in sections:
        section_models(args)
    if "scaling" in sections:
        section_scaling(args)
    if "busy" in sections:
        section_busy(args)
    if "load" in sections:
        section_load(args)
    if "int8" in sections:
        section_int8(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
