#!/usr/bin/env python
"""Export the stateful test fixtures: programs whose methods keep mutable state between executes.

Run from the repository root (needs the ``export`` extra: torch 2.13.0 + executorch 1.5.1)::

    python tools/export_state_fixtures.py [--out tests/fixtures/state]

For every program ``NAME`` this writes ``NAME.pte`` and ``NAME.npz``. A stateful program is
checked by a *sequence* of executes on one loaded instance, so the npz keys carry the step:
``NNN.METHOD.in_K`` / ``NNN.METHOD.out_K`` (``NNN`` = 000, 001, ... in execution order);
``train_step`` also has ``lr`` (the SGD learning rate applied after every step) and
``final.PARAM`` (the parameters after the last update).

Where the outputs come from:

* ``state_shared``, ``kv_cache``: ExecuTorch's runtime (``executorch.runtime.Runtime``), which
  gives the methods of one loaded program one set of host arenas, so state written by one
  method is read by the next; the script also checks them against torch eager.
* ``train_step``: ExecuTorch's training runtime (``executorch.extension.training``:
  ``forward`` of the joint graph, then its ``ExecuTorchSGD`` on the method's live
  parameters), checked against ``torch.optim.SGD`` in eager.
* ``segments_no_header``: ExecuTorch's runtime. Not stateful: a program without weights,
  whose (empty) constant segment ExecuTorch writes without an extended header.
* ``state_counter``: torch eager. Its buffer is exported unplanned and named
  (``alloc_mutable_buffers=False`` + ``emit_mutable_buffer_names=True``): ExecuTorch expects
  the application to supply its memory, and its Python runtime, given none, crashes. The script
  runs it in a subprocess and reports what happened.

``et_test_models/`` holds equivalents of the 16 programs ExecuTorch exports for its own runtime
tests (no npz: the tests compare with ExecuTorch's runtime when it is installed).

The files go in ``tests/fixtures/state/``, apart from the one-execute fixtures that
``tests/test_fixtures.py`` re-runs in ExecuTorch. Everything is seeded; running the script
twice gives byte-identical files.
"""

from __future__ import annotations

import argparse
import io
import math
import pathlib
import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

try:
    import torch
    from torch import nn
except ImportError as exc:  # a script: say what to install rather than a bare traceback
    raise SystemExit(f"{__file__}: needs torch and executorch: pip install 'orchestra[export]' ({exc})") from None

SEED = 20240611
REPO = pathlib.Path(__file__).resolve().parents[1]

# kv_cache sizes: model width, cache length, prompt length.
KV_D, KV_S, KV_P = 16, 16, 4
TRAIN_LR = 0.5


# --------------------------------------------------------------------------------------------
# Models


class NoConstants(nn.Module):
    """No weights: ExecuTorch writes an empty constant segment and no extended header."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x * y + x


class Counter(nn.Module):
    """An int32 counter buffer, incremented by every forward."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(1, dtype=torch.int32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        return x * 2 + self.count


class SharedState(nn.Module):
    """One buffer shared by three methods: forward accumulates, get_state/set_state."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state.add_(x)
        return self.state * 2.0

    def get_state(self) -> torch.Tensor:
        return self.state + 0.0

    def set_state(self, x: torch.Tensor) -> torch.Tensor:
        self.state.copy_(x)
        return x.sum()


class KVCache(nn.Module):
    """Single-head attention with a K/V cache: ``prefill`` writes the prompt's keys and values
    (positions 0..P-1) and attends causally over them; ``decode`` writes one position and
    attends over every position up to it."""

    def __init__(self, gen: torch.Generator) -> None:
        super().__init__()
        self.wq = nn.Linear(KV_D, KV_D, bias=False)
        self.wk = nn.Linear(KV_D, KV_D, bias=False)
        self.wv = nn.Linear(KV_D, KV_D, bias=False)
        with torch.no_grad():
            for lin in (self.wq, self.wk, self.wv):
                lin.weight.copy_(torch.randn(KV_D, KV_D, generator=gen) / math.sqrt(KV_D))
        self.register_buffer("k_cache", torch.zeros(KV_S, KV_D))
        self.register_buffer("v_cache", torch.zeros(KV_S, KV_D))
        self.scale = 1.0 / math.sqrt(KV_D)

    def prefill(self, x: torch.Tensor) -> torch.Tensor:  # x [P, D]
        k, v = self.wk(x), self.wv(x)
        self.k_cache.copy_(torch.cat([k, self.k_cache[KV_P:]]))
        self.v_cache.copy_(torch.cat([v, self.v_cache[KV_P:]]))
        scores = (self.wq(x) @ k.t()) * self.scale
        causal = torch.ones(KV_P, KV_P).tril() > 0
        scores = scores.masked_fill(~causal, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v

    def decode(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # x [1, D], pos int64 [1]
        idx = torch.arange(KV_S)
        hit = (idx == pos).unsqueeze(1)
        self.k_cache.copy_(torch.where(hit, self.wk(x), self.k_cache))
        self.v_cache.copy_(torch.where(hit, self.wv(x), self.v_cache))
        scores = (self.wq(x) @ self.k_cache.t()) * self.scale
        scores = scores.masked_fill((idx > pos).unsqueeze(0), float("-inf"))
        return torch.softmax(scores, dim=-1) @ self.v_cache


class TrainLinear(nn.Module):
    """A linear layer and a cross-entropy loss against soft targets."""

    def __init__(self, gen: torch.Generator) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)
        with torch.no_grad():
            self.linear.weight.copy_(torch.randn(3, 4, generator=gen) * 0.5)
            self.linear.bias.copy_(torch.randn(3, generator=gen) * 0.1)
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.loss(self.linear(x), y)


# --------------------------------------------------------------------------------------------
# Export


def _method_forward(module: nn.Module, name: str) -> Callable[..., Any]:
    return getattr(module, name)


def export_program(module: nn.Module, methods: dict[str, tuple[Any, ...]], *, share: bool = False,
                   named_unplanned: bool = False, joint: bool = False) -> bytes:
    """ExecuTorch's own export flow for stateful programs (as its test/models exporter)."""
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge
    from executorch.exir.capture._capture import patch_forward
    from executorch.exir.passes import MemoryPlanningPass

    eps = {}
    for name, args in methods.items():
        if joint:
            from torch.export._trace import _export
            from torch.export.experimental import _export_forward_backward

            eps[name] = _export_forward_backward(_export(module, args, pre_dispatch=True))
        else:
            with patch_forward(module, _method_forward(module, name)), torch.no_grad():
                eps[name] = torch.export.export(module, args)
    if joint:
        edge = to_edge(eps, compile_config=EdgeCompileConfig(_check_ir_validity=False))
    else:
        with torch.no_grad():
            edge = to_edge(eps, compile_config=EdgeCompileConfig(_check_ir_validity=False))
    planning = MemoryPlanningPass(alloc_mutable_buffers=not named_unplanned, share_mutable_buffers=share)
    config = ExecutorchBackendConfig(memory_planning_pass=planning, emit_mutable_buffer_names=named_unplanned)
    return bytes(edge.to_executorch(config).buffer)


@dataclass
class Fixture:
    name: str
    pte: bytes
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    note: str = ""

    def record(self, step: int, method: str, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        for k, a in enumerate(inputs):
            self.arrays[f"{step:03d}.{method}.in_{k}"] = np.array(a, copy=True)
        for k, a in enumerate(outputs):
            self.arrays[f"{step:03d}.{method}.out_{k}"] = np.array(a, copy=True)


def _np(outs: Any) -> list[np.ndarray]:
    if isinstance(outs, torch.Tensor):
        outs = [outs]
    return [o.detach().numpy().copy() for o in outs]


def _check(name: str, what: str, got: list[np.ndarray], want: list[np.ndarray], tol: float = 1e-5) -> float:
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        if g.shape != w.shape:
            raise SystemExit(f"{name}: {what}: shape {g.shape} != eager {w.shape}")
        if g.size:
            worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))))
    if worst > tol:
        raise SystemExit(f"{name}: {what}: ExecuTorch differs from torch eager by {worst}")
    return worst


def run_sequence_in_executorch(pte: bytes, steps: list[tuple[str, tuple[torch.Tensor, ...]]]) -> list[list[np.ndarray]]:
    """Runs ``steps`` on ONE loaded ExecuTorch program (its methods share host arenas)."""
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(pte)
    return [_np(program.load_method(m).execute(list(args))) for m, args in steps]


def counter() -> Fixture:
    x = torch.arange(4, dtype=torch.int32)
    pte = export_program(Counter(), {"forward": (x,)}, named_unplanned=True)
    fx = Fixture("state_counter", pte)
    eager = Counter()
    gen = torch.Generator().manual_seed(SEED)
    for step in range(4):
        xi = torch.randint(-50, 50, (4,), dtype=torch.int32, generator=gen)
        with torch.no_grad():
            fx.record(step, "forward", [xi.numpy()], _np(eager(xi)))
    fx.note = f"ExecuTorch's Python runtime on it: {_probe_executorch(pte)}"
    return fx


def shared_state() -> Fixture:
    gen = torch.Generator().manual_seed(SEED + 1)
    x = torch.randn(4, generator=gen)
    pte = export_program(SharedState(), {"forward": (x,), "get_state": (), "set_state": (x,)}, share=True)
    steps: list[tuple[str, tuple[torch.Tensor, ...]]] = [
        ("get_state", ()),
        ("forward", (torch.randn(4, generator=gen),)),
        ("forward", (torch.randn(4, generator=gen),)),
        ("get_state", ()),
        ("set_state", (torch.randn(4, generator=gen),)),
        ("get_state", ()),
        ("forward", (torch.randn(4, generator=gen),)),
        ("get_state", ()),
    ]
    fx = Fixture("state_shared", pte)
    eager = SharedState()
    for step, ((m, args), outs) in enumerate(zip(steps, run_sequence_in_executorch(pte, steps), strict=True)):
        with torch.no_grad():
            _check(fx.name, f"step {step} {m}", outs, _np(getattr(eager, m)(*args)))
        fx.record(step, m, [a.numpy() for a in args], outs)
    return fx


def kv_cache() -> Fixture:
    gen = torch.Generator().manual_seed(SEED + 2)
    model = KVCache(gen)
    prompt = torch.randn(KV_P, KV_D, generator=gen)
    tok = torch.randn(1, KV_D, generator=gen)
    pte = export_program(model, {"prefill": (prompt,), "decode": (tok, torch.tensor([KV_P]))}, share=True)
    steps: list[tuple[str, tuple[torch.Tensor, ...]]] = [("prefill", (prompt,))]
    for pos in range(KV_P, KV_P + 4):
        steps.append(("decode", (torch.randn(1, KV_D, generator=gen), torch.tensor([pos]))))
    fx = Fixture("kv_cache", pte)
    eager = KVCache(torch.Generator().manual_seed(SEED + 2))
    worst = 0.0
    for step, ((m, args), outs) in enumerate(zip(steps, run_sequence_in_executorch(pte, steps), strict=True)):
        with torch.no_grad():
            worst = max(worst, _check(fx.name, f"step {step} {m}", outs, _np(getattr(eager, m)(*args))))
        fx.record(step, m, [a.numpy() for a in args], outs)
    fx.note = f"max |ExecuTorch - eager| = {worst:.2e}"
    return fx


def train_step() -> Fixture:
    from executorch.extension.pybindings.portable_lib import _load_for_executorch_from_buffer
    from executorch.extension.training import get_sgd_optimizer

    gen = torch.Generator().manual_seed(SEED + 3)
    model = TrainLinear(gen)
    eager = TrainLinear(torch.Generator().manual_seed(SEED + 3))
    batches = [(torch.randn(2, 4, generator=gen), torch.softmax(torch.randn(2, 3, generator=gen), dim=1)) for _ in range(3)]
    pte = export_program(model, {"forward": batches[0]}, joint=True)
    fx = Fixture("train_step", pte)
    fx.arrays["lr"] = np.array(TRAIN_LR, dtype=np.float32)

    module = _load_for_executorch_from_buffer(pte)
    gi = module.run_method("__et_training_gradients_index_forward", ())[0]
    pi = module.run_method("__et_training_parameters_index_forward", ())[0]
    names = list(module.run_method("__et_training_fqn_forward", ()))
    opt = eager_opt = None
    params: dict[str, torch.Tensor] = {}
    for step, (x, y) in enumerate(batches):
        full = module.run_method("forward", (x, y), clone_outputs=False)
        outs = [o.clone() for o in full]
        if opt is None:
            params = dict(zip(names, full[pi:], strict=True))  # live: the method's own memory
            opt = get_sgd_optimizer(params, TRAIN_LR)
        # Eager reference: loss, then grads (before the update), then parameters.
        eager.zero_grad()
        loss = eager(x, y)
        loss.backward()
        named = dict(eager.named_parameters())
        want = [loss.detach()] + [named[n].grad for n in names] + [named[n].detach() for n in names]
        _check(fx.name, f"step {step}", _np(outs), _np(want))
        fx.record(step, "forward", [x.numpy(), y.numpy()], _np(outs))
        opt.step(dict(zip(names, [g.clone() for g in full[gi:pi]], strict=True)))
        if eager_opt is None:
            eager_opt = torch.optim.SGD(eager.parameters(), lr=TRAIN_LR)
        eager_opt.step()
    for n in names:
        got, want = params[n].detach().numpy().copy(), dict(eager.named_parameters())[n].detach().numpy()
        _check(fx.name, f"final {n}", [got], [want])
        fx.arrays[f"final.{n}"] = got
    return fx


def no_header() -> Fixture:
    from executorch.exir._serialize._program import _get_extended_header

    gen = torch.Generator().manual_seed(SEED + 4)
    args = (torch.randn(2, 3, generator=gen), torch.randn(2, 3, generator=gen))
    pte = export_program(NoConstants(), {"forward": args})
    if _get_extended_header(pte) is not None:
        raise SystemExit("segments_no_header: ExecuTorch wrote an extended header; the fixture no longer covers its case")
    fx = Fixture("segments_no_header", pte)
    for step in range(2):
        xs = args if step == 0 else (torch.randn(2, 3, generator=gen), torch.randn(2, 3, generator=gen))
        fx.record(step, "forward", [a.numpy() for a in xs], run_sequence_in_executorch(pte, [("forward", xs)])[0])
    fx.note = "no extended header"
    return fx


_PROBE = """
import sys, torch
from executorch.runtime import Runtime
m = Runtime.get().load_program(open(sys.argv[1], 'rb').read()).load_method('forward')
print(m.execute([torch.arange(4, dtype=torch.int32)])[0].tolist())
"""


def _probe_executorch(pte: bytes) -> str:
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".pte") as f:
        f.write(pte)
        f.flush()
        r = subprocess.run([sys.executable, "-c", _PROBE, f.name], capture_output=True, text=True, timeout=300)
    if r.returncode < 0:
        return f"killed by signal {-r.returncode}"
    if r.returncode:
        return f"exit {r.returncode}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}"
    return f"ran, forward(arange(4)) = {r.stdout.strip()}"


# Equivalents of the modules ExecuTorch exports for its own runtime tests
# (test/models/export_program.py in its sources), written here.


class EtBasic(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x).max()


class EtIndex(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[1::2, torch.tensor([1, 2])]


class EtIntBool(nn.Module):
    def forward(self, x: torch.Tensor, y: int, z: bool) -> torch.Tensor:
        return x + y + int(z)


class EtNoOp(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (x, y)


class EtAdd(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
        return torch.add(x, y, alpha=alpha)


class EtDynamicCat(nn.Module):
    def forward(self, k: torch.Tensor) -> torch.Tensor:
        return torch.cat((k, torch.ones(1, 4)))


class EtAddMul(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = 3 * torch.ones(2, 2)
        self.b = 2 * torch.ones(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.add(torch.mul(self.a, x), self.b)


class EtMultipleEntry(EtAddMul):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.a

    def forward2(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.a + self.b


class EtLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class EtNoKVCache(EtLinear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.to(torch.float))


class EtKVCache(EtLinear):
    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return (self.linear(x.to(torch.float)).to(torch.long) + pos).to(torch.float)


class EtSimpleTrain(EtLinear):
    def __init__(self) -> None:
        super().__init__()
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.loss(self.linear(x).softmax(dim=0), y)


class EtStateful(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.zeros(1, dtype=torch.int32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.state.add_(1)
        return x + self.state


class EtSharedState(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.ones(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.state.add_(1) + x

    def get_state(self) -> torch.Tensor:
        return self.state

    def set_state(self, x: torch.Tensor) -> None:
        self.state.copy_(x)


def executorch_test_models(out_dir: pathlib.Path) -> list[str]:
    """Writes the 16 programs (``NAME.pte``) with ExecuTorch's test export settings."""
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge
    from executorch.exir.capture._capture import patch_forward
    from executorch.exir.passes import MemoryPlanningPass, ToOutVarPass
    from torch.export import Dim

    f, h = torch.randn(2, 2), torch.randn(2, 2).half()
    specs: dict[str, tuple[type[nn.Module], dict[str, tuple[Any, ...]], dict[str, Any]]] = {
        "Basic": (EtBasic, {"forward": (torch.randn(100),)}, {"ignore": True}),
        "Index": (EtIndex, {"forward": (torch.randn(10, 10, 10),)}, {}),
        "IntBool": (EtIntBool, {"forward": (torch.ones(1), 1, True)}, {}),
        "NoOp": (EtNoOp, {"forward": (f, f)}, {}),
        "Add": (EtAdd, {"forward": (f, f, 1.0)}, {}),
        "AddHalf": (EtAdd, {"forward": (h, h, 1.0)}, {}),
        "DynCat": (EtDynamicCat, {"forward": (torch.randn(3, 4),)},
                   {"dyn": ({0: Dim("d", max=3)},), "unallocated_io": True}),
        "AddMul": (EtAddMul, {"forward": (torch.ones(2, 2),)}, {}),
        "Linear": (EtLinear, {"forward": (torch.randn(3),)}, {}),
        "Multi": (EtMultipleEntry, {"forward": (torch.ones(2, 2),), "forward2": (torch.ones(2, 2),)}, {}),
        "Train": (EtSimpleTrain, {"forward": (torch.randn(3), torch.tensor([1.0, 0, 0]))}, {"joint": True}),
        "Stateful": (EtStateful, {"forward": (torch.ones(1),)}, {"names": True}),
        "KVInputPos": (EtKVCache, {"forward": (torch.randint(100, [1, 3]), torch.tensor([0]))}, {}),
        "KVCachePos": (EtKVCache, {"forward": (torch.randint(100, [1, 3]), torch.arange(3))}, {}),
        "NoKV": (EtNoKVCache, {"forward": (torch.randint(100, [1, 3]),)}, {}),
        "Shared": (EtSharedState, {"forward": (torch.ones(1),), "get_state": (), "set_state": (torch.ones(1),)},
                   {"share": True}),
    }
    for name, (cls, methods, kw) in specs.items():
        torch.manual_seed(0)
        module = cls().eval()
        eps = {}
        for method, args in methods.items():
            if kw.get("joint"):
                from torch.export._trace import _export
                from torch.export.experimental import _export_forward_backward

                eps[method] = _export_forward_backward(_export(module, args, pre_dispatch=True))
            else:
                with patch_forward(module, getattr(module, method)):
                    eps[method] = torch.export.export(module, args, dynamic_shapes=kw.get("dyn"))
        if kw.get("unallocated_io"):
            planning = MemoryPlanningPass(alloc_graph_input=False, alloc_graph_output=False)
        else:
            planning = MemoryPlanningPass(alloc_mutable_buffers=not kw.get("names"),
                                          share_mutable_buffers=kw.get("share", False))
        config = ExecutorchBackendConfig(memory_planning_pass=planning, emit_mutable_buffer_names=kw.get("names", False),
                                         to_out_var_pass=ToOutVarPass(kw.get("ignore", False)))
        edge = to_edge(eps, compile_config=EdgeCompileConfig(_check_ir_validity=False))
        (out_dir / f"{name}.pte").write_bytes(bytes(edge.to_executorch(config).buffer))
    return sorted(specs)


BUILDERS: dict[str, Callable[[], Fixture]] = {
    "state_counter": counter,
    "state_shared": shared_state,
    "kv_cache": kv_cache,
    "train_step": train_step,
    "segments_no_header": no_header,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=REPO / "tests" / "fixtures" / "state",
                        help="output folder (default: tests/fixtures/state of this repository)")
    parser.add_argument("--only", nargs="*", default=None, help="export only these fixtures (default: all)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, build in BUILDERS.items():
        if args.only and name not in args.only:
            continue
        torch.manual_seed(SEED)
        fx = build()
        (args.out / f"{name}.pte").write_bytes(fx.pte)
        buf = io.BytesIO()
        np.savez(buf, **fx.arrays)  # fixed zip timestamps: reproducible bytes
        (args.out / f"{name}.npz").write_bytes(buf.getvalue())
        steps = len({k.split(".")[0] for k in fx.arrays if k[:3].isdigit()})
        print(f"{name:14s} {len(fx.pte):6d} B  {steps} steps  {fx.note}", flush=True)
    if not args.only or "et_test_models" in args.only:
        models = args.out / "et_test_models"
        models.mkdir(exist_ok=True)
        names = executorch_test_models(models)
        total = sum((models / f"{n}.pte").stat().st_size for n in names)
        print(f"et_test_models {total:6d} B  {len(names)} programs: {' '.join(names)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
