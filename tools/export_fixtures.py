#!/usr/bin/env python
"""Export the real-toolchain test fixtures: small ``.pte`` programs plus ``.npz`` references.

Run from the repository root (needs the ``export`` extra: torch 2.13.0 + executorch 1.5.1)::

    python tools/export_fixtures.py [--out tests/fixtures]

For every program ``NAME`` this writes ``NAME.pte`` and ``NAME.npz``. The npz holds, for every
method of the program, the inputs as ``METHOD.in_N`` and the outputs as ``METHOD.out_N``
(``N`` = positional index). The outputs are computed by ExecuTorch's own runtime
(``executorch.runtime.Runtime``) running the ``.pte`` bytes just written, not by torch eager.

Everything is seeded, so running the script twice produces byte-identical files.
"""

from __future__ import annotations

import argparse
import io
import math
import pathlib
import sys
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

try:
    import torch
    from torch import nn
except ImportError as exc:  # a script: say what to install rather than a bare traceback
    raise SystemExit(f"{__file__}: needs torch and executorch: pip install 'orchestra[export]' ({exc})") from None

SEED = 20240611
REPO = pathlib.Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------
# Models


def _randomize_batch_norm(module: nn.Module, gen: torch.Generator) -> None:
    """Give every BatchNorm non-trivial running stats and affine params (identity BN hides bugs)."""
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(c, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
                m.weight.copy_(torch.rand(c, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(c, generator=gen) * 0.1)


class ConvNet(nn.Module):
    """conv + BN + relu, a residual block, max-pool, linear head. Input [N, 3, 16, 16]."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)) + x)  # residual
        x = self.pool(self.pool(x))  # 16 -> 8 -> 4
        return self.fc(torch.flatten(x, 1))


class DepthwiseSeparable(nn.Module):
    """stem conv, depthwise (groups=C) + pointwise 1x1, ReLU6, avg pools, linear. Input [N,3,16,16]."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pw = nn.Conv2d(8, 16, 1)
        self.act = nn.ReLU6()
        self.avg = nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.stem(x))  # 16 -> 8
        x = self.act(self.dw(x))
        x = self.act(self.pw(x))
        x = self.avg(x)  # 8 -> 4
        x = self.gap(x)  # 4 -> 1
        return self.fc(torch.flatten(x, 1))


class TransformerBlock(nn.Module):
    """Token embedding, pre-LN causal multi-head self-attention (explicit bmm + softmax), GELU MLP.

    Input: int64 token ids [1, SEQ]. Output: logits [1, SEQ, VOCAB].
    """

    VOCAB, SEQ, DIM, HEADS = 32, 8, 16, 2

    def __init__(self) -> None:
        super().__init__()
        d = self.DIM
        self.embed = nn.Embedding(self.VOCAB, d)
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.gelu = nn.GELU()
        self.fc2 = nn.Linear(4 * d, d)
        self.head = nn.Linear(d, self.VOCAB)
        mask = torch.full((self.SEQ, self.SEQ), -1e9).triu(1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        b, s = tokens.shape
        h, d = self.HEADS, self.DIM
        dh = d // h
        x = self.embed(tokens)
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        # [b, s, d] -> [b*h, s, dh]
        q = q.reshape(b, s, h, dh).transpose(1, 2).reshape(b * h, s, dh)
        k = k.reshape(b, s, h, dh).transpose(1, 2).reshape(b * h, s, dh)
        v = v.reshape(b, s, h, dh).transpose(1, 2).reshape(b * h, s, dh)
        scores = torch.bmm(q, k.transpose(1, 2)) * (1.0 / math.sqrt(dh)) + self.mask
        attn = torch.bmm(torch.softmax(scores, dim=-1), v)
        attn = attn.reshape(b, h, s, dh).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(attn)
        x = x + self.fc2(self.gelu(self.fc1(self.ln2(x))))
        return self.head(x)


class SmallConvNet(nn.Module):
    """conv + relu + flatten(batch-dependent reshape) + linear; exported with a dynamic batch."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv(x))
        return self.fc(x.reshape(x.shape[0], -1))


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(12, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


class EncoderWithHead(nn.Module):
    """``forward`` = head(encode(x)); ``encode`` is exported as a second method of the program."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.head(self.encoder(x)))


class TinyLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


# --------------------------------------------------------------------------------------------
# Fixture specs


@dataclass
class MethodSpec:
    module: nn.Module
    export_args: tuple[torch.Tensor, ...]
    # Inputs stored in the npz and run through ExecuTorch (differ from export_args only for
    # dynamic shapes).
    run_args: tuple[torch.Tensor, ...] | None = None
    dynamic_shapes: Any = None


@dataclass
class FixtureSpec:
    name: str
    methods: dict[str, MethodSpec]
    xnnpack: bool = False
    extract_delegate_segments: bool = True


def _seeded(seed_offset: int) -> torch.Generator:
    torch.manual_seed(SEED + seed_offset)
    return torch.Generator().manual_seed(SEED + 1000 + seed_offset)


def _make_convnet() -> tuple[ConvNet, torch.Tensor]:
    gen = _seeded(1)
    model = ConvNet()
    _randomize_batch_norm(model, gen)
    return model.eval(), torch.randn(1, 3, 16, 16, generator=gen)


def build_specs() -> list[FixtureSpec]:
    specs: list[FixtureSpec] = []

    convnet, conv_x = _make_convnet()
    specs.append(FixtureSpec("convnet", {"forward": MethodSpec(convnet, (conv_x,))}))

    gen = _seeded(2)
    dwsep = DepthwiseSeparable().eval()
    specs.append(
        FixtureSpec("dwsep", {"forward": MethodSpec(dwsep, (torch.randn(1, 3, 16, 16, generator=gen),))})
    )

    gen = _seeded(3)
    tf = TransformerBlock().eval()
    tokens = torch.randint(0, TransformerBlock.VOCAB, (1, TransformerBlock.SEQ), generator=gen)
    specs.append(FixtureSpec("transformer", {"forward": MethodSpec(tf, (tokens,))}))

    gen = _seeded(4)
    small = SmallConvNet().eval()
    batch = torch.export.Dim("batch", min=1, max=8)
    specs.append(
        FixtureSpec(
            "dynamic_batch",
            {
                "forward": MethodSpec(
                    small,
                    export_args=(torch.randn(2, 2, 6, 6, generator=gen),),
                    run_args=(torch.randn(3, 2, 6, 6, generator=gen),),
                    dynamic_shapes=({0: batch},),
                )
            },
        )
    )

    gen = _seeded(5)
    two = EncoderWithHead().eval()
    specs.append(
        FixtureSpec(
            "two_methods",
            {
                "forward": MethodSpec(two, (torch.randn(2, 12, generator=gen),)),
                "encode": MethodSpec(two.encoder, (torch.randn(4, 12, generator=gen),)),
            },
        )
    )

    # Same weights and input as ``convnet`` (rebuilt from the same seed).
    convnet2, conv_x2 = _make_convnet()
    specs.append(
        FixtureSpec("xnnpack_convnet", {"forward": MethodSpec(convnet2, (conv_x2,))}, xnnpack=True)
    )

    gen = _seeded(7)
    tiny = TinyLinear().eval()
    specs.append(
        FixtureSpec(
            "xnnpack_inline",
            {"forward": MethodSpec(tiny, (torch.randn(2, 8, generator=gen),))},
            xnnpack=True,
            extract_delegate_segments=False,
        )
    )

    # XNNPACK-lowered twins of the portable fixtures: same seeds, so the same weights and
    # inputs as their portable versions.
    gen = _seeded(2)
    dwsep2 = DepthwiseSeparable().eval()
    specs.append(FixtureSpec(
        "xnnpack_dwsep", {"forward": MethodSpec(dwsep2, (torch.randn(1, 3, 16, 16, generator=gen),))}, xnnpack=True))

    gen = _seeded(3)
    tf2 = TransformerBlock().eval()
    tokens2 = torch.randint(0, TransformerBlock.VOCAB, (1, TransformerBlock.SEQ), generator=gen)
    specs.append(FixtureSpec("xnnpack_transformer", {"forward": MethodSpec(tf2, (tokens2,))}, xnnpack=True))

    gen = _seeded(5)
    two2 = EncoderWithHead().eval()
    specs.append(
        FixtureSpec(
            "xnnpack_two_methods",
            {
                "forward": MethodSpec(two2, (torch.randn(2, 12, generator=gen),)),
                "encode": MethodSpec(two2.encoder, (torch.randn(4, 12, generator=gen),)),
            },
            xnnpack=True,
        )
    )

    gen = _seeded(4)
    small2 = SmallConvNet().eval()
    batch2 = torch.export.Dim("batch", min=1, max=8)
    specs.append(
        FixtureSpec(
            "xnnpack_dynamic_batch",
            {
                "forward": MethodSpec(
                    small2,
                    export_args=(torch.randn(2, 2, 6, 6, generator=gen),),
                    run_args=(torch.randn(3, 2, 6, 6, generator=gen),),
                    dynamic_shapes=({0: batch2},),
                )
            },
            xnnpack=True,
        )
    )
    return specs


# --------------------------------------------------------------------------------------------
# Export / run / describe


def export_program(spec: FixtureSpec) -> bytes:
    from executorch.exir import ExecutorchBackendConfig, to_edge, to_edge_transform_and_lower

    eps = {
        name: torch.export.export(m.module, m.export_args, dynamic_shapes=m.dynamic_shapes)
        for name, m in spec.methods.items()
    }
    if spec.xnnpack:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        edge = to_edge_transform_and_lower(eps, partitioner=[XnnpackPartitioner()])
    else:
        edge = to_edge(eps)
    config = ExecutorchBackendConfig(extract_delegate_segments=spec.extract_delegate_segments)
    return bytes(edge.to_executorch(config).buffer)


def run_in_executorch(pte: bytes, method: str, inputs: list[torch.Tensor]) -> list[np.ndarray]:
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(pte)
    outputs = program.load_method(method).execute(inputs)
    return [np.array(o.detach().numpy(), copy=True) for o in outputs]


@dataclass(frozen=True)
class ProgramSummary:
    methods: tuple[str, ...]
    operators: dict[str, tuple[str, ...]]  # method -> "name.overload", in operator-table order
    delegates: dict[str, tuple[str, ...]]  # method -> "BackendId@inline|segment"
    segments: int
    named_data: int


def describe(pte: bytes) -> ProgramSummary:
    """Summarise a program with ExecuTorch's own flatbuffer reader.

    Reads the raw flatbuffer rather than ``deserialize_pte_binary``'s result, which moves every
    segment-backed delegate blob back inline and so hides where the data lives.
    """
    from executorch.exir._serialize._program import (
        _flatbuffer_to_program,
        _get_extended_header,
    )
    from executorch.exir.schema import DataLocation

    header = _get_extended_header(pte)
    program = _flatbuffer_to_program(pte[: header.program_size] if header else pte)
    ops: dict[str, tuple[str, ...]] = {}
    dels: dict[str, tuple[str, ...]] = {}
    for plan in program.execution_plan:
        ops[plan.name] = tuple(
            f"{op.name}.{op.overload}" if op.overload else op.name for op in plan.operators
        )
        dels[plan.name] = tuple(
            f"{d.id}@{'inline' if d.processed.location == DataLocation.INLINE else 'segment'}"
            for d in plan.delegates
        )
    return ProgramSummary(
        methods=tuple(p.name for p in program.execution_plan),
        operators=ops,
        delegates=dels,
        segments=len(program.segments),
        named_data=len(program.named_data or []),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=REPO / "tests" / "fixtures",
        help="output folder (default: tests/fixtures of this repository)",
    )
    parser.add_argument(
        "--only", nargs="*", default=None, help="export only these fixtures (default: all)"
    )
    parser.add_argument(
        "--verbose", action="store_true", help="also print every method's operator list"
    )
    args = parser.parse_args(argv)
    # torch/executorch internals emit deprecation noise that is not about this script.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    args.out.mkdir(parents=True, exist_ok=True)

    for spec in build_specs():
        if args.only and spec.name not in args.only:
            continue
        pte = export_program(spec)
        arrays: dict[str, np.ndarray] = {}
        for method, m in spec.methods.items():
            run_args = m.run_args if m.run_args is not None else m.export_args
            for i, t in enumerate(run_args):
                arrays[f"{method}.in_{i}"] = t.detach().numpy().copy()
            for i, o in enumerate(run_in_executorch(pte, method, list(run_args))):
                arrays[f"{method}.out_{i}"] = o
        (args.out / f"{spec.name}.pte").write_bytes(pte)
        # np.savez writes zip entries with a fixed timestamp, so the bytes are reproducible.
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        (args.out / f"{spec.name}.npz").write_bytes(buf.getvalue())

        summary = describe(pte)
        all_ops = sorted({op for ops in summary.operators.values() for op in ops})
        all_dels = sorted({d for ds in summary.delegates.values() for d in ds})
        line = (
            f"{spec.name:16s} {len(pte):7d} B  methods={','.join(summary.methods)}  "
            f"ops={' '.join(all_ops) or '-'}"
        )
        if all_dels:
            line += f"  delegates={','.join(all_dels)} named_data={summary.named_data}"
        print(line, flush=True)
        if args.verbose:
            for method, ops in summary.operators.items():
                print(f"    {method}: {' '.join(ops) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
