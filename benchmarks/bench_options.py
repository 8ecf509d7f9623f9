#!/usr/bin/env python3
"""What runtime options cost per execute, in one run.

A trivial program (one delegate adding a constant to 4 floats) executed
  1. with a backend that declares no options,
  2. with a backend that declares options but none are set,
  3. with hot options changed (set_options) before every execute,
  4. with a per-call override on every execute,
  5. with an init-only option changed before every execute (re-init each time).
Rounds of each are interleaved so machine noise hits them alike. Goal: 1 and 2 within
1 µs of each other per execute.

    python benchmarks/bench_options.py [--rounds 15] [--n 20000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from orchestra.program import (
    AllocationDetails,
    BackendDelegate,
    BackendDelegateDataReference,
    BackendDelegateInlineData,
    Chain,
    DataLocation,
    DelegateCall,
    EValue,
    ExecutionPlan,
    Instruction,
    ProgramDef,
    ScalarType,
    Tensor,
)
from orchestra.runtime import Backend, BackendInterface, OptionSpec, load_program, register_backend


class NoOptions(BackendInterface):
    def init(self, context, processed, compile_specs):
        return float(np.frombuffer(processed, np.float32)[0])

    def execute(self, context, handle, args):
        np.add(args[0], handle, out=args[1])


class WithOptions(NoOptions):
    option_specs = (
        OptionSpec("threads", int, 1, hot=True),
        OptionSpec("power_mode", str, "balanced", choices=("low", "balanced", "performance"), hot=True),
        OptionSpec("core", int, 0),
    )


def program(backend: str) -> ProgramDef:
    def t(offset: int) -> EValue:
        return EValue(Tensor(ScalarType.FLOAT, 0, (4,), (0,), allocation_info=AllocationDetails(1, offset)))

    plan = ExecutionPlan("forward", None, (t(0), t(16)), (0,), (1,),
                         (Chain((0,), (1,), (Instruction(DelegateCall(0, (0, 1))),)),), (),
                         (BackendDelegate(backend, BackendDelegateDataReference(DataLocation.INLINE, 0)),), (0, 32))
    return ProgramDef(0, (plan,), backend_delegate_data=(BackendDelegateInlineData(memoryview(np.float32(1).tobytes())),))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--n", type=int, default=20_000, help="executes per round")
    args = ap.parse_args(argv)
    register_backend(Backend("BenchNoOptions", NoOptions()))
    register_backend(Backend("BenchWithOptions", WithOptions()))
    x = np.arange(4, dtype=np.float32)
    plain = load_program(program("BenchNoOptions")).load_method()
    declared = load_program(program("BenchWithOptions")).load_method()
    hot = load_program(program("BenchWithOptions")).load_method()
    per_call = load_program(program("BenchWithOptions")).load_method()
    reinit = load_program(program("BenchWithOptions")).load_method()
    modes = ("low", "balanced", "performance")
    override = {"BenchWithOptions": {"threads": 2}}

    def run_plain(n: int) -> None:
        ex = plain.execute
        for _ in range(n):
            ex([x])

    def run_declared(n: int) -> None:
        ex = declared.execute
        for _ in range(n):
            ex([x])

    def run_hot(n: int) -> None:
        ex, st = hot.execute, hot.set_options
        for i in range(n):
            st({"BenchWithOptions": {"threads": 1 + (i & 3), "power_mode": modes[i % 3]}})
            ex([x])

    def run_per_call(n: int) -> None:
        ex = per_call.execute
        for _ in range(n):
            ex([x], backend_options=override)

    def run_reinit(n: int) -> None:
        ex, st = reinit.execute, reinit.set_options
        for i in range(n):
            st({"BenchWithOptions": {"core": i & 1}})
            ex([x])

    cases = [("no options declared", run_plain), ("options declared, unset", run_declared),
             ("hot options changed before every execute", run_hot),
             ("per-call override on every execute", run_per_call),
             ("init-only option changed before every execute", run_reinit)]
    times: dict[str, list[float]] = {name: [] for name, _ in cases}
    for fn in (f for _, f in cases):
        fn(1000)  # warm up
    for _ in range(args.rounds):
        for name, fn in cases:
            n = args.n if "init-only" not in name else args.n // 4
            t0 = time.perf_counter()
            fn(n)
            times[name].append((time.perf_counter() - t0) / n * 1e6)
    base = statistics.median(times[cases[0][0]])
    print(f"per-execute time, median of {args.rounds} interleaved rounds of {args.n:,} executes")
    print(f"{'case':<48}{'µs/execute':>12}{'vs no options':>16}")
    for name, _ in cases:
        med = statistics.median(times[name])
        print(f"{name:<48}{med:>12.2f}{med - base:>+14.2f} µs")
    diff = statistics.median(times[cases[1][0]]) - base
    print(f"declared-but-unset vs none: {diff:+.2f} µs per execute (goal: within ±1 µs) -> {'met' if abs(diff) <= 1 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
