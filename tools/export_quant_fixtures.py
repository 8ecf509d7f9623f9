#!/usr/bin/env python
"""Export the int8 test fixtures: PT2E-quantized ``.pte`` programs plus ``.npz`` references.

Run from the repository root (needs the ``export`` extra: torch 2.13.0 + executorch 1.5.1)::

    python tools/export_quant_fixtures.py [--out tests/fixtures/int8] [--only NAME ...]

Every model is quantized the way users do it: ``prepare_pt2e`` with ExecuTorch's
``XNNPACKQuantizer`` (per-channel symmetric int8 weights; static int8 activations calibrated
on seeded inputs, or dynamic per-tensor activations for the ``dynamic`` variant), calibration,
``convert_pt2e``, then exported twice:

- ``int8_NAME.pte``: portable, no partitioner. The graph keeps
  ``quantized_decomposed::quantize_per_tensor`` / ``dequantize_per_tensor`` /
  ``dequantize_per_channel`` (and ``choose_qparams`` for dynamic activations) around float
  kernels.
- ``xnnpack_int8_NAME.pte``: lowered to XNNPACK (qs8/qc8/qd8 tensors inside the delegate).

The ``.npz`` next to each holds the inputs ``forward.in_N`` and the outputs ``forward.out_N``
that ExecuTorch's own runtime produced for the bytes written. Seeded: two runs write the same
bytes.
"""

from __future__ import annotations

import argparse
import io
import pathlib
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

try:
    import torch
    from torch import nn
except ImportError as exc:  # a script: say what to install rather than a bare traceback
    raise SystemExit(f"{__file__}: needs torch and executorch: pip install 'orchestra[export]' ({exc})") from None

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from export_fixtures import describe, run_in_executorch  # noqa: E402

SEED = 20261123
REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "tests" / "fixtures" / "int8"
CALIBRATION_BATCHES = 8


# --------------------------------------------------------------------------------------------
# Models


class QConvNet(nn.Module):
    """conv + relu, depthwise + relu, pointwise, residual add, relu, max-pool, linear head.

    Input [1, C, S, S]; S=16 for the committed fixture, 224 for the big test model.
    """

    def __init__(self, channels: int = 8, size: int = 16, stride: int = 1) -> None:
        super().__init__()
        c = channels
        self.stem = nn.Conv2d(3, c, 3, stride=stride, padding=1)
        self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.pw = nn.Conv2d(c, c, 1)
        self.pool = nn.MaxPool2d(2)
        side = size // stride // 4
        self.fc = nn.Linear(c * side * side, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        y = self.pw(torch.relu(self.dw(x)))
        x = torch.relu(x + y)
        x = self.pool(self.pool(x))
        return self.fc(torch.flatten(x, 1))


class QBlock(nn.Module):
    """A transformer-style MLP block on [1, SEQ, DIM]: up-projection, ReLU, down-projection,
    residual add, then a linear head to VOCAB logits."""

    SEQ, DIM, HIDDEN, VOCAB = 8, 16, 64, 10

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(self.DIM, self.HIDDEN)
        self.down = nn.Linear(self.HIDDEN, self.DIM)
        self.head = nn.Linear(self.DIM, self.VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.down(torch.relu(self.up(x)))
        return self.head(x)


class QVariety(nn.Module):
    """More int8 node shapes: strided padded conv + ReLU6, grouped conv, depthwise with a
    channel multiplier, padded max-pool, elementwise mul, global average pool, linear without
    bias. Input [1, 4, 12, 12]."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(4, 8, 3, stride=2, padding=1)
        self.act = nn.ReLU6()
        self.grouped = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.dw = nn.Conv2d(8, 16, 3, padding=1, groups=8)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 6, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.stem(x))  # 12 -> 6
        y = torch.relu(self.grouped(x))
        x = self.dw(x * y)
        x = self.pool(x)  # 6 -> 3
        return self.fc(torch.flatten(self.gap(x), 1))


class QWide(nn.Module):
    """Dot products longer than float32 sums hold exactly (over 514 int8 terms: the compiled
    kernels' int8 path splits them into parts), next to the short ones: a 3-channel stem,
    3x3 convolutions over 32 and 64 channels (im2col of 288 and 576 terms), a 1x1 expansion to
    600 channels and its 600-term projection, a 5x5 depthwise and a grouped convolution (groups of 8), an
    elementwise product, global average pooling and 1024-term linear layers. Input [1, 3, 64, 64]."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, stride=2, padding=1)
        self.c288 = nn.Conv2d(32, 64, 3, padding=1)
        self.c576 = nn.Conv2d(64, 64, 3, stride=2, padding=1)
        self.expand = nn.Conv2d(64, 600, 1)
        self.project = nn.Conv2d(600, 96, 1)
        self.dw = nn.Conv2d(96, 96, 5, padding=2, groups=96)
        self.grouped = nn.Conv2d(96, 96, 3, padding=1, groups=12)  # RegNet's groups of 8
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Linear(96, 1024)
        self.fc2 = nn.Linear(1024, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))  # 64 -> 32
        x = torch.relu(self.c576(torch.relu(self.c288(x))))  # 32 -> 16
        x = self.project(torch.relu(self.expand(x)))
        y = torch.relu(self.dw(x))
        x = torch.relu(self.grouped(y)) * y
        x = torch.relu(self.fc1(torch.flatten(self.gap(x), 1)))
        return self.fc2(x)


class QIslands(nn.Module):
    """The float islands PT2E leaves between int8 ops (what the quantizer does not quantize:
    dequantize, float ops, quantize): hardswish, SiLU, lone sigmoids; and islands that stay as
    they are: a SiLU whose float result a float mean also reads, a squeeze-excite gate through
    hardsigmoid (add / clamp / divide by constants the exporter makes the delegate's inputs).
    Two outputs. Input [1, 3, 32, 32]."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.expand = nn.Conv2d(16, 32, 1)
        self.squeeze = nn.Conv2d(32, 8, 1)
        self.excite = nn.Conv2d(8, 32, 1)
        self.gate = nn.Hardsigmoid()
        self.mix = nn.Conv2d(32, 16, 3, padding=1, groups=16)
        self.head = nn.Conv2d(16, 24, 1)
        self.se = nn.Conv2d(24, 24, 1)
        self.out = nn.Conv2d(24, 8, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = nn.functional.hardswish(self.stem(x))
        x = nn.functional.silu(self.expand(x))  # the float mean reads it too
        g = self.gate(self.excite(torch.relu(self.squeeze(x.mean((2, 3), keepdim=True)))))
        x = nn.functional.silu(self.mix(x * g))
        h = torch.sigmoid(self.head(x))
        h = h * torch.sigmoid(self.se(h))
        return self.out(h).mean((2, 3)), h


# --------------------------------------------------------------------------------------------
# Specs


@dataclass(frozen=True)
class QuantSpec:
    """One quantized model; exported as ``int8_NAME`` (portable) and ``xnnpack_int8_NAME``."""

    name: str
    make: Callable[[torch.Generator], nn.Module]
    input_shape: tuple[int, ...]
    dynamic: bool = False
    seed_offset: int = 0
    calibration_batches: int = CALIBRATION_BATCHES


def _conv(gen: torch.Generator) -> nn.Module:
    return QConvNet()


def _block(gen: torch.Generator) -> nn.Module:
    return QBlock()


SPECS: tuple[QuantSpec, ...] = (
    QuantSpec("convnet", _conv, (1, 3, 16, 16), seed_offset=1),
    QuantSpec("block", _block, (1, QBlock.SEQ, QBlock.DIM), seed_offset=2),
    QuantSpec("dynamic_block", _block, (1, QBlock.SEQ, QBlock.DIM), dynamic=True, seed_offset=3),
)


def variety_spec() -> QuantSpec:
    """More int8 node shapes (generated in the tests, not committed)."""
    return QuantSpec("variety", lambda gen: QVariety(), (1, 4, 12, 12), seed_offset=5, calibration_batches=4)


def wide_spec() -> QuantSpec:
    """Long dot products (generated in the tests, not committed)."""
    return QuantSpec("wide", lambda gen: QWide(), (1, 3, 64, 64), seed_offset=6, calibration_batches=4)


def islands_spec() -> QuantSpec:
    """Float islands between int8 ops (generated in the tests, not committed)."""
    return QuantSpec("islands", lambda gen: QIslands(), (1, 3, 32, 32), seed_offset=7, calibration_batches=4)


def big_convnet_spec() -> QuantSpec:
    """A 224x224 int8 conv net (generated in the tests, not committed)."""
    return QuantSpec(
        "convnet224", lambda gen: QConvNet(channels=16, size=224, stride=4), (1, 3, 224, 224),
        seed_offset=4, calibration_batches=2,
    )


# --------------------------------------------------------------------------------------------
# Quantize / export


def quantize(spec: QuantSpec) -> tuple[torch.export.ExportedProgram, torch.Tensor]:
    """PT2E-quantize ``spec``'s model; return the exported quantized graph and a test input."""
    import executorch.kernels.quantized  # noqa: F401  (registers the quantized .out ops)
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(SEED + spec.seed_offset)
    gen = torch.Generator().manual_seed(SEED + 1000 + spec.seed_offset)
    model = spec.make(gen).eval()
    example = (torch.randn(spec.input_shape, generator=gen),)
    captured = torch.export.export(model, example).module()
    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=spec.dynamic)
    prepared = prepare_pt2e(captured, XNNPACKQuantizer().set_global(config))
    with torch.no_grad():
        for _ in range(spec.calibration_batches):
            prepared(torch.randn(spec.input_shape, generator=gen))
    converted = convert_pt2e(prepared)
    test_input = torch.randn(spec.input_shape, generator=gen)
    return torch.export.export(converted, example), test_input


def lower(ep: torch.export.ExportedProgram, xnnpack: bool) -> bytes:
    from executorch.exir import to_edge, to_edge_transform_and_lower

    if xnnpack:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    else:
        edge = to_edge(ep)
    return bytes(edge.to_executorch().buffer)


def export_pair(spec: QuantSpec) -> dict[str, tuple[bytes, dict[str, np.ndarray]]]:
    """``{"int8_NAME": (pte, npz arrays), "xnnpack_int8_NAME": (...)}`` for one spec."""
    ep, x = quantize(spec)
    result = {}
    for prefix, xnnpack in (("int8_", False), ("xnnpack_int8_", True)):
        pte = lower(ep, xnnpack)
        arrays = {"forward.in_0": x.numpy().copy()}
        for i, o in enumerate(run_in_executorch(pte, "forward", [x])):
            arrays[f"forward.out_{i}"] = o
        result[prefix + spec.name] = (pte, arrays)
    return result


def cached_pair(spec: QuantSpec, folder: pathlib.Path) -> dict[str, tuple[pathlib.Path, dict[str, np.ndarray]]]:
    """:func:`export_pair` written to ``folder`` once; later calls (other test files of the same
    session) read the files back. Returns name -> (pte path, npz arrays)."""
    names = ("int8_" + spec.name, "xnnpack_int8_" + spec.name)
    if not all((folder / f"{n}.npz").is_file() for n in names):
        folder.mkdir(parents=True, exist_ok=True)
        for name, (pte, arrays) in export_pair(spec).items():
            (folder / f"{name}.pte").write_bytes(pte)
            (folder / f"{name}.npz.tmp").write_bytes(npz_bytes(arrays))
            (folder / f"{name}.npz.tmp").replace(folder / f"{name}.npz")
    result = {}
    for name in names:
        with np.load(folder / f"{name}.npz") as z:
            result[name] = (folder / f"{name}.pte", {k: z[k] for k in z.files})
    return result


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # fixed zip timestamps: reproducible bytes
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT,
                        help="output folder (default: tests/fixtures/int8 of this repository)")
    parser.add_argument("--only", nargs="*", default=None,
                        help="export only these models (convnet, block, dynamic_block)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    args.out.mkdir(parents=True, exist_ok=True)
    for spec in SPECS:
        if args.only and spec.name not in args.only:
            continue
        for name, (pte, arrays) in export_pair(spec).items():
            (args.out / f"{name}.pte").write_bytes(pte)
            (args.out / f"{name}.npz").write_bytes(npz_bytes(arrays))
            summary = describe(pte)
            ops = sorted({op for o in summary.operators.values() for op in o})
            dels = sorted({d for ds in summary.delegates.values() for d in ds})
            print(f"{name:26s} {len(pte):7d} B  ops={' '.join(ops) or '-'}"
                  + (f"  delegates={','.join(dels)}" if dels else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
