#!/usr/bin/env python3
"""orchestra's numpy kernels against torch's same operators, one call each, in one run.

Per case: median µs of one kernel call the way the interpreter makes it (every schema
argument positionally, ``out`` preallocated with the result's shape), next to torch's own
``.out`` overload with preallocated outputs when torch is installed, and their ratio. The
small cases are the shapes of the fixture programs (``tests/fixtures``), where per-call
overhead dominates; a few larger ones show the arithmetic throughput.

    python benchmarks/bench_kernels.py [--seconds 0.2] [--only SUBSTRING ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from orchestra.runtime.kernels import get_kernel

F32 = np.float32


def rnd(*shape: int, seed: int = 0, lo: float = -3.0, hi: float = 3.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(lo, hi, size=shape).astype(F32)


def const(a: np.ndarray) -> np.ndarray:
    """A read-only array, like a program constant."""
    a = np.array(a, copy=True)
    a.flags.writeable = False
    return a


@dataclass(frozen=True)
class Case:
    label: str  # what the shape is
    op: str  # full operator name
    make: Callable[[], tuple[Any, ...]]  # the non-out arguments, in schema order
    out_dtypes: tuple[Any, ...] = ()  # dtype of each out argument; default: float32


def _conv(
    x: tuple[int, ...], o: int, k: int, stride: int = 1, pad: int = 1, groups: int = 1
) -> Callable[[], tuple[Any, ...]]:
    def make() -> tuple[Any, ...]:
        w = const(rnd(o, x[1] // groups, k, k, seed=1))
        b = const(rnd(o, seed=2))
        return (rnd(*x), w, b, [stride, stride], [pad, pad], [1, 1], False, [0, 0], groups)

    return make


POOL_OUT = (F32, np.int64)

CASES: list[Case] = [
    # fixture shapes
    Case("[5,144] -> [144,5]", "aten::permute_copy.out", lambda: (const(rnd(5, 144)), [1, 0])),
    Case("[1,8,2,8] (0,2,1,3)", "aten::permute_copy.out", lambda: (rnd(1, 8, 2, 8), [0, 2, 1, 3])),
    Case("[8,32] -> [1,8,32]", "aten::view_copy.out", lambda: (rnd(8, 32), [1, 8, 32])),
    Case("[1,8,2,8]", "dim_order_ops::_clone_dim_order.out", lambda: (rnd(1, 8, 2, 8), False, [0, 1, 2, 3])),
    Case("[1,16]x[16,8]", "aten::addmm.out", lambda: (const(rnd(8)), rnd(1, 16), rnd(16, 8, seed=1), 1, 1)),
    Case("[8,16]x[16,48]", "aten::addmm.out", lambda: (const(rnd(48)), rnd(8, 16), rnd(16, 48, seed=1), 1, 1)),
    Case("[2,8,8]x[2,8,8]", "aten::bmm.out", lambda: (rnd(2, 8, 8), rnd(2, 8, 8, seed=1))),
    Case("[2,32]", "aten::relu.out", lambda: (rnd(2, 32),)),
    Case("[4,8]", "aten::tanh.out", lambda: (rnd(4, 8),)),
    Case("[2,3]", "aten::sigmoid.out", lambda: (rnd(2, 3),)),
    Case("[1,8,8,8] (0, 6)", "aten::hardtanh.out", lambda: (rnd(1, 8, 8, 8), 0.0, 6.0)),
    Case("[1,8,16,16] + same", "aten::add.out", lambda: (rnd(1, 8, 16, 16), rnd(1, 8, 16, 16, seed=1), 1)),
    Case("[2,8,8] + [8,8]", "aten::add.out", lambda: (rnd(2, 8, 8), const(rnd(8, 8, seed=1)), 1)),
    Case("[2,8,8] * 0-d", "aten::mul.out", lambda: (rnd(2, 8, 8), const(np.array(0.35, F32)))),
    Case("[1,10]", "aten::_softmax.out", lambda: (rnd(1, 10), -1, False)),
    Case("[2,8,8]", "aten::_softmax.out", lambda: (rnd(2, 8, 8), -1, False)),
    Case("[1,8,16]", "aten::native_layer_norm.out",
         lambda: (rnd(1, 8, 16), [16], const(rnd(16, seed=1)), const(rnd(16, seed=2)), 1e-5)),
    Case("[1,8,64] none", "aten::gelu.out", lambda: (rnd(1, 8, 64), "none")),
    Case("[1,8,64] tanh", "aten::gelu.out", lambda: (rnd(1, 8, 64), "tanh")),
    Case("[1,8,16,16]", "aten::_native_batch_norm_legit_no_training.out",
         lambda: (rnd(1, 8, 16, 16), const(rnd(8, seed=1)), const(rnd(8, seed=2)), const(rnd(8, seed=3)),
                  const(rnd(8, seed=4, lo=0.5, hi=2)), 0.1, 1e-5)),
    Case("1x8x16x16 k2 s2", "aten::max_pool2d_with_indices.out",
         lambda: (rnd(1, 8, 16, 16), [2, 2], [2, 2], [0, 0], [1, 1], False), POOL_OUT),
    Case("1x8x8x8 k2 s2", "aten::max_pool2d_with_indices.out",
         lambda: (rnd(1, 8, 8, 8), [2, 2], [2, 2], [0, 0], [1, 1], False), POOL_OUT),
    Case("1x16x8x8 k3 s2 p1", "aten::avg_pool2d.out",
         lambda: (rnd(1, 16, 8, 8), [3, 3], [2, 2], [1, 1], False, False, None)),
    Case("1x8x32x32 dims [2,3]", "aten::mean.out", lambda: (rnd(1, 8, 32, 32), [2, 3], False, None)),
    Case("1x3x16x16 -> 8, 3x3 p1", "aten::convolution.out", _conv((1, 3, 16, 16), 8, 3)),
    Case("1x8x16x16 -> 8, 3x3 p1", "aten::convolution.out", _conv((1, 8, 16, 16), 8, 3)),
    Case("1x3x16x16 -> 8, 3x3 s2 p1", "aten::convolution.out", _conv((1, 3, 16, 16), 8, 3, stride=2)),
    Case("1x8x8x8 dw 3x3 p1 g8", "aten::convolution.out", _conv((1, 8, 8, 8), 8, 3, groups=8)),
    Case("1x8x8x8 -> 16, 1x1", "aten::convolution.out", _conv((1, 8, 8, 8), 16, 1, pad=0)),
    Case("[1,8] ids, [32,16] table", "aten::embedding.out",
         lambda: (const(rnd(32, 16)), np.arange(8, dtype=np.int64).reshape(1, 8) * 3 % 32, -1, False, False)),
    # larger shapes
    Case("1x16x64x64 -> 32, 3x3 p1", "aten::convolution.out", _conv((1, 16, 64, 64), 32, 3)),
    Case("1x32x64x64 k2 s2", "aten::max_pool2d_with_indices.out",
         lambda: (rnd(1, 32, 64, 64), [2, 2], [2, 2], [0, 0], [1, 1], False), POOL_OUT),
    Case("1x32x64x64 k3 s2 p1", "aten::max_pool2d_with_indices.out",
         lambda: (rnd(1, 32, 64, 64), [3, 3], [2, 2], [1, 1], [1, 1], False), POOL_OUT),
    Case("[256,768] none", "aten::gelu.out", lambda: (rnd(256, 768), "none")),
    Case("[128,768]", "aten::native_layer_norm.out",
         lambda: (rnd(128, 768), [768], const(rnd(768, seed=1)), const(rnd(768, seed=2)), 1e-5)),
    Case("[16,128,128]", "aten::_softmax.out", lambda: (rnd(16, 128, 128), -1, False)),
    Case("[128,768]x[768,768]", "aten::addmm.out",
         lambda: (const(rnd(768)), rnd(128, 768), rnd(768, 768, seed=1), 1, 1)),
]


def median_us(fn: Callable[[], object], seconds: float) -> float:
    """Median µs of one call, timing batches of calls so the timer's cost vanishes."""
    fn()
    t = time.perf_counter()
    fn()
    once = time.perf_counter() - t
    batch = max(1, min(1000, int(2e-4 / max(once, 1e-9))))
    samples = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(samples) < 7:
        t = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - t) / batch)
    return statistics.median(samples) * 1e6


def outs_for(fn: Callable[..., Any], args: tuple[Any, ...], num_params: int, dtypes: tuple[Any, ...] = ()) -> list[Any]:
    """Out arguments of the result's shapes (found by one call with empty placeholders)."""
    n_out = num_params - len(args)
    dts = list(dtypes) + [F32] * (n_out - len(dtypes))
    res = fn(*args, *[np.empty((0,), dt) for dt in dts])
    res = list(res) if n_out > 1 else [res]
    return [[np.empty_like(x) for x in r] if isinstance(r, list) else np.empty_like(r) for r in res]


def orchestra_call(op: str, args: tuple[Any, ...], out_dtypes: tuple[Any, ...] = ()) -> Callable[[], object]:
    kd = get_kernel(op)
    if kd is None:
        raise SystemExit(f"no kernel for {op}")
    outs = outs_for(kd.fn, args, kd.num_params, out_dtypes)
    fn = kd.fn
    return lambda: fn(*args, *outs)


# ExecuTorch-only operators and the torch operator that computes the same thing.
TORCH_EQUIVALENT = {"dim_order_ops::_clone_dim_order.out": "aten::clone.out"}


def torch_call(torch: Any, op: str, args: tuple[Any, ...], outs: list[Any]) -> Callable[[], object] | None:
    if op in TORCH_EQUIVALENT:
        op = TORCH_EQUIVALENT[op]
        args = (args[0], None)  # clone(self, memory_format)
    ns, rest = op.split("::")
    name, _, overload = rest.partition(".")
    try:
        top = getattr(getattr(getattr(torch.ops, ns), name), overload or "default")
    except AttributeError:
        return None
    schema = top._schema
    out_args = [a for a in schema.arguments if a.is_out]
    in_args = schema.arguments[: len(schema.arguments) - len(out_args)]

    def conv(v: Any) -> Any:
        if isinstance(v, np.ndarray):
            return torch.from_numpy(np.array(v, copy=True))
        if isinstance(v, list) and v and isinstance(v[0], np.ndarray):
            return [conv(t) for t in v]
        return v

    targs, tkw = [], {}
    for a, v in zip(in_args, args):
        if a.kwarg_only:
            tkw[a.name] = conv(v)
        else:
            targs.append(conv(v))
    for a, o in zip(out_args, outs):
        tkw[a.name] = conv(o)
    try:
        top(*targs, **tkw)
    except Exception:  # noqa: BLE001 - an op torch cannot run this way is just skipped
        return None
    return lambda: top(*targs, **tkw)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=0.2, help="time per measurement")
    ap.add_argument("--only", nargs="*", default=[], help="run cases whose op or label contains one of these")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        torch = None

    print(f"orchestra kernels vs torch — median µs per call, {os.cpu_count()} CPUs, "
          f"Python {sys.version.split()[0]}, numpy {np.__version__}"
          + (f", torch {torch.__version__} ({torch.get_num_threads()} threads)" if torch else ", torch not installed"))
    head = f"{'op':<48} {'shape':<28} {'orchestra':>10} {'torch':>9} {'torch/orch':>10}"
    print(head)
    print("-" * len(head))
    for case in CASES:
        if args.only and not any(s in case.op or s in case.label for s in args.only):
            continue
        a = case.make()
        ours = orchestra_call(case.op, a, case.out_dtypes)
        t_ours = median_us(ours, args.seconds)
        t_torch = None
        if torch is not None:
            kd = get_kernel(case.op)
            tc = torch_call(torch, case.op, a, outs_for(kd.fn, a, kd.num_params, case.out_dtypes))
            if tc is not None:
                t_torch = median_us(tc, args.seconds)
        ratio = f"{t_torch / t_ours:10.2f}" if t_torch else f"{'-':>10}"
        tt = f"{t_torch:9.1f}" if t_torch else f"{'-':>9}"
        print(f"{case.op.split('::')[1]:<48} {case.label:<28} {t_ours:10.1f} {tt} {ratio}")
    print("torch/orch > 1 means orchestra's kernel is faster.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
