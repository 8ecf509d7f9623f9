#!/usr/bin/env python3
"""orchestra's overhead over onnxruntime, in one run.

One ONNX model (default: an MLP of large MatMuls, a few ms per run; ``--model conv``: a
conv net on 1x32x64x64) run
  1. through orchestra: import_onnx -> .pte bytes -> load_program -> Method.execute
     (OnnxRuntimeBackend; the model bytes in a segment; copies inputs into the Method's
     arena and outputs out of it);
  2. with onnxruntime directly: InferenceSession.run on the Method's own session (the same
     settings and memory placement: what orchestra adds, alone), and on a session made here
     with the same settings (for reference: two sessions of one model differ by a few % on
     their own).
Runs of the three alternate one by one (the order rotating every round) so machine noise hits
them alike; the median per-run time of each is reported, and orchestra's overhead in % and
µs. Goal: <= 5 %.
A tiny model (one Add on 4 floats) measured the same way shows the fixed cost per execute.

    python benchmarks/bench_onnx.py [--model mlp|conv] [--threads 1] [--rounds 15] [--n 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from orchestra.backends.onnxruntime import OnnxRuntimeBackend, import_onnx
from orchestra.program import dumps
from orchestra.runtime import Backend, load_program, register_backend, registered_backends

ID = "OnnxRuntimeBackend"


def _model(nodes, x, y, inits) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "bench", [x], [y], [numpy_helper.from_array(a, n) for n, a in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.checker.check_model(m)
    return m


def mlp(rng: np.random.Generator, batch: int = 64, width: int = 1024, layers: int = 3) -> tuple[onnx.ModelProto, np.ndarray]:
    nodes, inits, prev = [], [], "x"
    for k in range(layers):
        w = (rng.standard_normal((width, width), np.float32) / np.sqrt(width)).astype(np.float32)
        inits += [(f"W{k}", w), (f"b{k}", rng.standard_normal(width, np.float32))]
        nodes += [helper.make_node("MatMul", [prev, f"W{k}"], [f"m{k}"]),
                  helper.make_node("Add", [f"m{k}", f"b{k}"], [f"a{k}"]),
                  helper.make_node("Relu", [f"a{k}"], [f"r{k}" if k < layers - 1 else "y"])]
        prev = f"r{k}"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, width])
    return _model(nodes, x, y, inits), rng.standard_normal((batch, width), np.float32)


def conv(rng: np.random.Generator) -> tuple[onnx.ModelProto, np.ndarray]:
    nodes, inits, prev = [], [], "x"
    for k in range(3):
        w = (rng.standard_normal((32, 32, 3, 3), np.float32) / 17).astype(np.float32)
        inits += [(f"W{k}", w), (f"B{k}", rng.standard_normal(32, np.float32))]
        nodes += [helper.make_node("Conv", [prev, f"W{k}", f"B{k}"], [f"c{k}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{k}"], [f"r{k}" if k < 2 else "y"])]
        prev = f"r{k}"
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 64, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 64, 64])
    return _model(nodes, x, y, inits), rng.standard_normal((1, 32, 64, 64), np.float32)


def tiny(rng: np.random.Generator) -> tuple[onnx.ModelProto, np.ndarray]:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    return _model([helper.make_node("Add", ["x", "one"], ["y"])], x, y, [("one", np.ones(4, np.float32))]), \
        rng.standard_normal(4, np.float32)


def runners(model: onnx.ModelProto, x: np.ndarray, threads: int) -> tuple[list[Callable[[], object]], object]:
    """[orchestra execute, session.run on the Method's own session, session.run on a session
    made here with the same settings], and the Method to close."""
    # The weights go in a segment (as ExecuTorch writes delegate blobs): the reader caps
    # inline flatbuffer data through Limits.max_objects.
    method = load_program(dumps(import_onnx(model), delegate_data="segment")).load_method(
        backend_options={ID: {"intra_op_num_threads": threads, "inter_op_num_threads": threads}})
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = threads
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    own = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    (_, handle), = method._handles  # the delegate's session, to time onnxruntime alone on it
    same = handle.session
    names = [o.name for o in own.get_outputs()]
    inputs = [x]
    feeds = {own.get_inputs()[0].name: x}
    ref = own.run(names, feeds)[0]
    np.testing.assert_allclose(method.execute(inputs)[0], ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(same.run(names, feeds)[0], ref, rtol=1e-5, atol=1e-5)
    return [lambda: method.execute(inputs), lambda: same.run(names, feeds), lambda: own.run(names, feeds)], method


def compare(label: str, model: onnx.ModelProto, x: np.ndarray, threads: int, rounds: int, n: int) -> tuple[float, float]:
    """Median per-run time of each; runs alternate one by one (the order rotating every
    round) so all see the same machine state. Returns (orchestra, onnxruntime on the same
    session) medians."""
    fns, method = runners(model, x, threads)
    for _ in range(max(3, n // 4)):  # warm all: arenas, memory patterns, caches
        for fn in fns:
            fn()
    clock = time.perf_counter
    times: list[list[float]] = [[] for _ in fns]
    for r in range(rounds):
        order = [(r + k) % len(fns) for k in range(len(fns))]
        for _ in range(n):
            for k in order:
                fn = fns[k]
                t0 = clock()
                fn()
                times[k].append(clock() - t0)
    method.close()
    mo, md, mi = (statistics.median(t) for t in times)
    print(f"{label}\n  orchestra Method.execute               {mo * 1e3:9.3f} ms"
          f"\n  onnxruntime session.run, same session  {md * 1e3:9.3f} ms   orchestra overhead "
          f"{(mo - md) / md * 100:+6.2f} % ({(mo - md) * 1e6:+8.1f} µs)"
          f"\n  onnxruntime session.run, own session   {mi * 1e3:9.3f} ms   (another session, same settings: "
          f"{(mo - mi) / mi * 100:+.2f} %; sessions differ by memory placement)")
    return mo, md


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("mlp", "conv"), default="mlp")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--n", type=int, default=20, help="runs per round")
    args = ap.parse_args()
    if ID not in registered_backends():
        register_backend(Backend(ID, OnnxRuntimeBackend()))
    rng = np.random.default_rng(0)
    model, x = (mlp if args.model == "mlp" else conv)(rng)
    what = "MLP 3 x MatMul 64x1024x1024" if args.model == "mlp" else "conv net 3 x Conv3x3 1x32x64x64"
    print(f"onnxruntime {ort.__version__}, {args.threads} thread(s), {args.rounds} rounds x {args.n} runs, medians per run")
    mo, md = compare(what, model, x, args.threads, args.rounds, args.n)
    tiny_model, tx = tiny(rng)
    compare("tiny (Add on 4 floats): fixed cost", tiny_model, tx, args.threads, args.rounds, max(args.n, 2000))
    pct = (mo - md) / md * 100
    print(f"goal <= 5 % overhead on a >= 1 ms model: {'met' if pct <= 5 and md >= 1e-3 else 'NOT met'} ({pct:+.2f} %)")


if __name__ == "__main__":
    main()
