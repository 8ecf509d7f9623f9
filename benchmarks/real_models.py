#!/usr/bin/env python3
"""Six real-size model architectures, exported once as portable and XNNPACK-lowered ``.pte``.

The project's own torch definitions (written from the papers' shapes, random seeded weights,
eval mode) of:

==============  ==========================================================================
name            what
==============  ==========================================================================
mobilenet_v3    MobileNetV3-small, 224x224 (depthwise convs, hardswish, squeeze-excite)
efficientnet    EfficientNet-B0, 224x224 (MBConv: depthwise convs, SiLU, squeeze-excite)
regnetx         RegNetX-200MF, 224x224 (group convs of width 8, residual adds)
vit_tiny        ViT-Tiny/16, 224x224 (192 wide, 12 layers, 3 heads, GELU)
bert            BERT-style encoder, 2 layers, 256 wide, 4 heads, 128 tokens
gpt2            GPT-2-style decoder, 4 layers, 256 wide, 4 heads, 128 tokens (causal)
==============  ==========================================================================

Both transformer language models use an 8192-token vocabulary (the embedding/LM-head size
is not what these benchmarks measure). Use from other scripts::

    from benchmarks.real_models import MODELS, export, load_io
    pte = export("mobilenet_v3", kind="portable")   # -> Path of the cached .pte
    inputs, expected = load_io("mobilenet_v3", kind="portable")

``export`` writes, under ``cache_dir`` (default ``~/.cache/orchestra/real_models/``, or
``$ORCHESTRA_REAL_MODELS``), a directory keyed by this module's version and torch's and
executorch's versions holding ``NAME.KIND.pte`` and ``NAME.KIND.npz`` (``forward.in_N`` /
``forward.out_N``: the inputs and ExecuTorch's own runtime outputs for that ``.pte``). Writes
are atomic (temp file + rename), so concurrent processes may share a cache.

Run as a script to compare orchestra with ExecuTorch's runtime (portable and XNNPACK), median
execute latencies measured interleaved in one run::

    python benchmarks/real_models.py [--models a,b] [--seconds 2] [--threads 1]

Importing this module needs only the standard library and numpy; torch and executorch are
imported inside the functions that need them, and a missing one raises a clear ImportError.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "KINDS",
    "MODELS",
    "ModelSpec",
    "build",
    "cache_root",
    "export",
    "load_io",
    "make_inputs",
]

# Bump when a model definition, its seed or its inputs change: it keys the cache.
VERSION = 1

KINDS = ("portable", "xnnpack", "xnnpack_int8")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One architecture: ``name``, a one-line ``description`` and its ``input_shapes``."""

    name: str
    description: str
    input_shapes: tuple[tuple[int, ...], ...]
    input_dtype: str  # "float32" (images) or "int64" (token ids)
    vocab: int = 0  # token-id range for int64 inputs


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("mobilenet_v3", "MobileNetV3-small 224x224 (depthwise, hardswish, SE)",
                  ((1, 3, 224, 224),), "float32"),
        ModelSpec("efficientnet", "EfficientNet-B0 224x224 (depthwise, SiLU, SE)",
                  ((1, 3, 224, 224),), "float32"),
        ModelSpec("regnetx", "RegNetX-200MF 224x224 (group convs)",
                  ((1, 3, 224, 224),), "float32"),
        ModelSpec("vit_tiny", "ViT-Tiny/16 224x224 (12 layers, 192 wide, 3 heads)",
                  ((1, 3, 224, 224),), "float32"),
        ModelSpec("bert", "BERT-style encoder, 2 layers, 256 wide, 128 tokens",
                  ((1, 128),), "int64", vocab=8192),
        ModelSpec("gpt2", "GPT-2-style decoder, 4 layers, 256 wide, 128 tokens",
                  ((1, 128),), "int64", vocab=8192),
    )
}


def _require_torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "benchmarks/real_models.py needs torch (and executorch to export): "
            "install orchestra's 'export' extra"
        ) from exc
    return torch


def _require_executorch() -> None:
    try:
        import executorch.exir  # noqa: F401
        import executorch.runtime  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "benchmarks/real_models.py needs executorch to export .pte files: "
            "install orchestra's 'export' extra"
        ) from exc


# --------------------------------------------------------------------------------------------
# Model definitions (torch is imported inside, so this module imports without it)


def _make_divisible(v: float, divisor: int = 8) -> int:
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new < 0.9 * v:
        new += divisor
    return new


def _cnn_modules(torch: Any) -> dict[str, Callable[[], Any]]:
    nn = torch.nn

    def conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1,
                act: Any = None) -> Any:
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False),
                  nn.BatchNorm2d(cout)]
        if act is not None:
            layers.append(act())
        return nn.Sequential(*layers)

    class SqueezeExcite(nn.Module):
        def __init__(self, channels: int, squeeze: int, act: Any, gate: Any) -> None:
            super().__init__()
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc1 = nn.Conv2d(channels, squeeze, 1)
            self.act = act()
            self.fc2 = nn.Conv2d(squeeze, channels, 1)
            self.gate = gate()

        def forward(self, x: Any) -> Any:
            s = self.gate(self.fc2(self.act(self.fc1(self.pool(x)))))
            return x * s

    # -- MobileNetV3-small (Howard et al. 2019, table 2) --
    class InvertedResidualV3(nn.Module):
        def __init__(self, cin: int, k: int, exp: int, cout: int, se: bool, hs: bool,
                     stride: int) -> None:
            super().__init__()
            act = nn.Hardswish if hs else nn.ReLU
            layers: list[Any] = []
            if exp != cin:
                layers.append(conv_bn(cin, exp, 1, act=act))
            layers.append(conv_bn(exp, exp, k, stride, groups=exp, act=act))
            if se:
                layers.append(SqueezeExcite(exp, _make_divisible(exp / 4), nn.ReLU,
                                            nn.Hardsigmoid))
            layers.append(conv_bn(exp, cout, 1))
            self.block = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x: Any) -> Any:
            y = self.block(x)
            return x + y if self.residual else y

    class MobileNetV3Small(nn.Module):
        # (kernel, expansion, out, SE, hardswish, stride)
        CFG = [(3, 16, 16, True, False, 2), (3, 72, 24, False, False, 2),
               (3, 88, 24, False, False, 1), (5, 96, 40, True, True, 2),
               (5, 240, 40, True, True, 1), (5, 240, 40, True, True, 1),
               (5, 120, 48, True, True, 1), (5, 144, 48, True, True, 1),
               (5, 288, 96, True, True, 2), (5, 576, 96, True, True, 1),
               (5, 576, 96, True, True, 1)]

        def __init__(self) -> None:
            super().__init__()
            layers: list[Any] = [conv_bn(3, 16, 3, 2, act=nn.Hardswish)]
            cin = 16
            for k, exp, cout, se, hs, s in self.CFG:
                layers.append(InvertedResidualV3(cin, k, exp, cout, se, hs, s))
                cin = cout
            layers.append(conv_bn(cin, 576, 1, act=nn.Hardswish))
            self.features = nn.Sequential(*layers)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(),
                                            nn.Dropout(0.2), nn.Linear(1024, 1000))

        def forward(self, x: Any) -> Any:
            return self.classifier(torch.flatten(self.pool(self.features(x)), 1))

    # -- EfficientNet-B0 (Tan & Le 2019, table 1) --
    class MBConv(nn.Module):
        def __init__(self, cin: int, cout: int, k: int, stride: int, expand: int) -> None:
            super().__init__()
            hidden = cin * expand
            layers: list[Any] = []
            if expand != 1:
                layers.append(conv_bn(cin, hidden, 1, act=nn.SiLU))
            layers.append(conv_bn(hidden, hidden, k, stride, groups=hidden, act=nn.SiLU))
            layers.append(SqueezeExcite(hidden, max(1, cin // 4), nn.SiLU, nn.Sigmoid))
            layers.append(conv_bn(hidden, cout, 1))
            self.block = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x: Any) -> Any:
            y = self.block(x)
            return x + y if self.residual else y

    class EfficientNetB0(nn.Module):
        # (expansion, kernel, stride, out, repeats)
        CFG = [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
               (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)]

        def __init__(self) -> None:
            super().__init__()
            layers: list[Any] = [conv_bn(3, 32, 3, 2, act=nn.SiLU)]
            cin = 32
            for e, k, s, cout, n in self.CFG:
                for i in range(n):
                    layers.append(MBConv(cin, cout, k, s if i == 0 else 1, e))
                    cin = cout
            layers.append(conv_bn(cin, 1280, 1, act=nn.SiLU))
            self.features = nn.Sequential(*layers)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, 1000))

        def forward(self, x: Any) -> Any:
            return self.classifier(torch.flatten(self.pool(self.features(x)), 1))

    # -- RegNetX-200MF (Radosavovic et al. 2020): widths 24/56/152/368, depths 1/1/4/7,
    #    group width 8, bottleneck ratio 1 --
    class XBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int, group_width: int) -> None:
            super().__init__()
            self.a = conv_bn(cin, cout, 1, act=nn.ReLU)
            self.b = conv_bn(cout, cout, 3, stride, groups=cout // group_width, act=nn.ReLU)
            self.c = conv_bn(cout, cout, 1)
            self.proj = (conv_bn(cin, cout, 1, stride)
                         if stride != 1 or cin != cout else None)
            self.relu = nn.ReLU()

        def forward(self, x: Any) -> Any:
            short = x if self.proj is None else self.proj(x)
            return self.relu(short + self.c(self.b(self.a(x))))

    class RegNetX200MF(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layers: list[Any] = [conv_bn(3, 32, 3, 2, act=nn.ReLU)]
            cin = 32
            for width, depth in ((24, 1), (56, 1), (152, 4), (368, 7)):
                for i in range(depth):
                    layers.append(XBlock(cin, width, 2 if i == 0 else 1, 8))
                    cin = width
            self.features = nn.Sequential(*layers)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(cin, 1000)

        def forward(self, x: Any) -> Any:
            return self.fc(torch.flatten(self.pool(self.features(x)), 1))

    return {"mobilenet_v3": MobileNetV3Small, "efficientnet": EfficientNetB0,
            "regnetx": RegNetX200MF}


def _transformer_modules(torch: Any) -> dict[str, Callable[[], Any]]:
    nn = torch.nn

    class Attention(nn.Module):
        def __init__(self, dim: int, heads: int, causal_len: int = 0) -> None:
            super().__init__()
            self.heads = heads
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)
            self.scale = (dim // heads) ** -0.5
            if causal_len:
                mask = torch.full((causal_len, causal_len), float("-inf")).triu(1)
                self.register_buffer("mask", mask, persistent=False)
            else:
                self.mask = None

        def forward(self, x: Any) -> Any:
            b, t, d = x.shape
            qkv = self.qkv(x).reshape(b, t, 3, self.heads, d // self.heads)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
            att = (q @ k.transpose(-2, -1)) * self.scale
            if self.mask is not None:
                att = att + self.mask[:t, :t]
            att = att.softmax(dim=-1)
            return self.proj((att @ v).transpose(1, 2).reshape(b, t, d))

    class PreNormBlock(nn.Module):  # ViT and GPT-2: x + attn(ln(x)), x + mlp(ln(x))
        def __init__(self, dim: int, heads: int, hidden: int, causal_len: int = 0) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(dim)
            self.attn = Attention(dim, heads, causal_len)
            self.ln2 = nn.LayerNorm(dim)
            self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

        def forward(self, x: Any) -> Any:
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class PostNormBlock(nn.Module):  # BERT: ln(x + attn(x)), ln(x + mlp(x))
        def __init__(self, dim: int, heads: int, hidden: int) -> None:
            super().__init__()
            self.attn = Attention(dim, heads)
            self.ln1 = nn.LayerNorm(dim)
            self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
            self.ln2 = nn.LayerNorm(dim)

        def forward(self, x: Any) -> Any:
            x = self.ln1(x + self.attn(x))
            return self.ln2(x + self.mlp(x))

    class ViTTiny(nn.Module):
        def __init__(self, dim: int = 192, depth: int = 12, heads: int = 3) -> None:
            super().__init__()
            self.patch = nn.Conv2d(3, dim, 16, 16)
            self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
            self.pos = nn.Parameter(torch.randn(1, 197, dim) * 0.02)
            self.blocks = nn.Sequential(*[PreNormBlock(dim, heads, 4 * dim) for _ in range(depth)])
            self.ln = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, 1000)

        def forward(self, x: Any) -> Any:
            x = self.patch(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
            x = self.ln(self.blocks(x))
            return self.head(x[:, 0])

    class BertEncoder(nn.Module):
        def __init__(self, vocab: int = 8192, dim: int = 256, depth: int = 2, heads: int = 4,
                     seq: int = 128) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab, dim)
            self.pos = nn.Parameter(torch.randn(1, seq, dim) * 0.02)
            self.ln = nn.LayerNorm(dim)
            self.blocks = nn.Sequential(*[PostNormBlock(dim, heads, 4 * dim)
                                          for _ in range(depth)])
            self.pooler = nn.Linear(dim, dim)

        def forward(self, ids: Any) -> Any:
            x = self.blocks(self.ln(self.tok(ids) + self.pos))
            return x, torch.tanh(self.pooler(x[:, 0]))

    class GPT2Decoder(nn.Module):
        def __init__(self, vocab: int = 8192, dim: int = 256, depth: int = 4, heads: int = 4,
                     seq: int = 128) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab, dim)
            self.pos = nn.Parameter(torch.randn(1, seq, dim) * 0.02)
            self.blocks = nn.Sequential(*[PreNormBlock(dim, heads, 4 * dim, causal_len=seq)
                                          for _ in range(depth)])
            self.ln = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, vocab, bias=False)

        def forward(self, ids: Any) -> Any:
            return self.head(self.ln(self.blocks(self.tok(ids) + self.pos)))

    return {"vit_tiny": ViTTiny, "bert": BertEncoder, "gpt2": GPT2Decoder}


def build(name: str) -> Any:
    """The torch module for ``name`` (see :data:`MODELS`), seeded weights, in eval mode."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    torch = _require_torch()
    ctors = {**_cnn_modules(torch), **_transformer_modules(torch)}
    gen_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(1234 + sorted(MODELS).index(name))
        model = ctors[name]()
        # Batch norms with non-trivial statistics, so folding them is actually exercised.
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.data.uniform_(0.5, 1.5)
                m.bias.data.uniform_(-0.1, 0.1)
    finally:
        torch.random.set_rng_state(gen_state)
    return model.eval()


def make_inputs(name: str) -> list[np.ndarray]:
    """Seeded inputs for ``name``: images in N(0, 1), token ids uniform in the vocabulary."""
    spec = MODELS[name]
    rng = np.random.default_rng(99)
    if spec.input_dtype == "int64":
        return [rng.integers(0, spec.vocab, size=s, dtype=np.int64) for s in spec.input_shapes]
    return [rng.standard_normal(s, dtype=np.float32) for s in spec.input_shapes]


# --------------------------------------------------------------------------------------------
# Export + cache


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> pathlib.Path:
    """The versioned cache directory (``cache_dir`` or the default), created if missing."""
    base = pathlib.Path(
        cache_dir
        if cache_dir is not None
        else os.environ.get("ORCHESTRA_REAL_MODELS",
                            pathlib.Path.home() / ".cache" / "orchestra" / "real_models")
    )
    try:
        import executorch.version as etv
        et = getattr(etv, "__version__", "unknown")
    except ImportError:
        et = "none"
    torch = _require_torch()
    root = base / f"v{VERSION}-torch{torch.__version__}-et{et}".replace("+", "_")
    root.mkdir(parents=True, exist_ok=True)
    return root


def _atomic_write(path: pathlib.Path, write: Callable[[Any], None]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise


def _export_bytes(name: str, kind: str) -> bytes:
    torch = _require_torch()
    _require_executorch()
    from executorch.exir import to_edge, to_edge_transform_and_lower

    model = build(name)
    args = tuple(torch.from_numpy(a) for a in make_inputs(name))
    with torch.no_grad():
        ep = torch.export.export(model, args)
    if kind == "xnnpack_int8":
        ep = _quantize_int8(ep, args)
    if kind in ("xnnpack", "xnnpack_int8"):
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        edge = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    else:
        edge = to_edge(ep)
    return bytes(edge.to_executorch().buffer)


def _quantize_int8(ep: Any, args: tuple[Any, ...]) -> Any:
    """PT2E static int8 as ExecuTorch teaches it: XNNPACKQuantizer's symmetric per-channel
    config, calibrated on four seeded batches shaped like the inputs."""
    torch = _require_torch()
    import executorch.kernels.quantized  # noqa: F401  (registers the quantized .out ops)
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    prepared = prepare_pt2e(ep.module(), quantizer)
    gen = torch.Generator().manual_seed(4321)
    with torch.no_grad():
        for _ in range(4):
            prepared(*(torch.randn(a.shape, generator=gen, dtype=a.dtype) for a in args))
    return torch.export.export(convert_pt2e(prepared), args)


def _run_executorch(pte: bytes, inputs: list[np.ndarray]) -> list[np.ndarray]:
    torch = _require_torch()
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(pte)  # must outlive its methods
    method = program.load_method("forward")
    outs = method.execute([torch.from_numpy(a) for a in inputs])
    return [np.array(o.detach().numpy(), copy=True) for o in outs]


def export(name: str, kind: str = "portable",
           cache_dir: str | os.PathLike[str] | None = None) -> pathlib.Path:
    """Export ``name`` as ``kind`` ("portable" or "xnnpack") once; return the cached ``.pte``.

    Next to it, ``NAME.KIND.npz`` holds the inputs (``forward.in_N``) and ExecuTorch's runtime
    outputs for that ``.pte`` (``forward.out_N``); read both with :func:`load_io`.
    """
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {KINDS}")
    root = cache_root(cache_dir)
    pte_path = root / f"{name}.{kind}.pte"
    npz_path = root / f"{name}.{kind}.npz"
    if pte_path.exists() and npz_path.exists():
        return pte_path
    pte = _export_bytes(name, kind)
    inputs = make_inputs(name)
    outputs = _run_executorch(pte, inputs)
    arrays = {f"forward.in_{i}": a for i, a in enumerate(inputs)}
    arrays.update({f"forward.out_{i}": a for i, a in enumerate(outputs)})
    _atomic_write(npz_path, lambda f: np.savez(f, **arrays))
    _atomic_write(pte_path, lambda f: f.write(pte))
    return pte_path


def load_io(name: str, kind: str = "portable",
            cache_dir: str | os.PathLike[str] | None = None
            ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(inputs, ExecuTorch's outputs) for ``name`` exported as ``kind``; exports if needed."""
    pte = export(name, kind, cache_dir)
    with np.load(pte.with_suffix(".npz"), allow_pickle=False) as data:
        ins = [data[f"forward.in_{i}"] for i in range(sum(k.startswith("forward.in_")
                                                          for k in data.files))]
        outs = [data[f"forward.out_{i}"] for i in range(sum(k.startswith("forward.out_")
                                                            for k in data.files))]
    return ins, outs


# --------------------------------------------------------------------------------------------
# Benchmark: orchestra vs ExecuTorch portable vs ExecuTorch+XNNPACK, interleaved


def _time_round_robin(fns: dict[str, Callable[[], object]], seconds: float, min_samples: int = 5
                      ) -> dict[str, float]:
    """Median latency of each fn, calling them in turn so load changes hit all alike."""
    for f in fns.values():
        f()
        f()
    times: dict[str, list[float]] = {k: [] for k in fns}
    end = time.perf_counter() + seconds * len(fns)
    while time.perf_counter() < end or min(len(t) for t in times.values()) < min_samples:
        for k, f in fns.items():
            t = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def _orchestra_load_ms(pte: pathlib.Path, repeats: int = 5) -> float:
    from orchestra.runtime import load_program

    data = pte.read_bytes()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        load_program(data).load_method("forward")
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def _et_load_ms(pte: pathlib.Path, repeats: int = 5) -> float:
    from executorch.runtime import Runtime

    data = pte.read_bytes()
    rt = Runtime.get()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        rt.load_program(data).load_method("forward")
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--seconds", type=float, default=2.0,
                        help="timing budget per runner per model")
    parser.add_argument("--threads", type=int, default=1,
                        help="BLAS threads for orchestra (threadpoolctl, this script only)")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--no-load", action="store_true", help="skip load-time measurement")
    parser.add_argument("--skip-portable", action="store_true",
                        help="don't time ExecuTorch's portable kernels (slow)")
    args = parser.parse_args(argv)

    torch = _require_torch()
    _require_executorch()
    from executorch.runtime import Runtime
    from threadpoolctl import threadpool_limits

    from orchestra.runtime import load_program

    torch.set_num_threads(args.threads)
    try:  # ExecuTorch's own threadpool (XNNPACK's threads): the same count as orchestra's BLAS
        from executorch.extension.pybindings import portable_lib

        if portable_lib._threadpool_get_thread_count() != args.threads:
            portable_lib._unsafe_reset_threadpool(args.threads)
        et_threads = portable_lib._threadpool_get_thread_count()
    except (ImportError, AttributeError):  # pragma: no cover - older executorch
        et_threads = -1
    print(f"threads={args.threads} (ExecuTorch threadpool: {et_threads}; ratios are orchestra / "
          f"ExecuTorch, same run)")
    print(f"{'model':<14}{'orch ms':>9}{'ET port':>9}{'ET xnn':>9}{'/port':>7}{'/xnn':>7}"
          f"{'maxrel':>10}{'load ms':>9}{'ET load':>9}")
    ratios = []
    with threadpool_limits(limits=args.threads):
        for name in args.models.split(","):
            portable = export(name, "portable", args.cache_dir)
            xnn = export(name, "xnnpack", args.cache_dir)
            inputs, expected = load_io(name, "portable", args.cache_dir)
            method = load_program(portable.read_bytes()).load_method("forward")
            got = [np.asarray(o) for o in method.execute(inputs)]
            maxrel = max(float(np.max(np.abs(g - e)) / max(float(np.max(np.abs(e))), 1e-30))
                         for g, e in zip(got, expected))
            tin = [torch.from_numpy(a) for a in inputs]
            # ExecuTorch's Program must outlive its Methods (else execute crashes).
            et_programs = [Runtime.get().load_program(p.read_bytes()) for p in (portable, xnn)]
            et_port, et_xnn = (p.load_method("forward") for p in et_programs)
            # orchestra and XNNPACK interleaved, many samples; ExecuTorch's portable kernels
            # (10-100x slower) on their own, a few samples, so they don't stretch the rounds.
            med = _time_round_robin({
                "orch": lambda: method.execute(inputs),
                "xnn": lambda: et_xnn.execute(tin),
            }, args.seconds, min_samples=20)
            med["port"] = (float("nan") if args.skip_portable
                           else _time_round_robin({"port": lambda: et_port.execute(tin)}, 0.0, 3)["port"])
            load = et_load = float("nan")
            if not args.no_load:
                load = _orchestra_load_ms(portable)
                et_load = _et_load_ms(xnn)
            ratios.append(med["orch"] / med["xnn"])
            print(f"{name:<14}{med['orch'] * 1e3:9.2f}{med['port'] * 1e3:9.2f}"
                  f"{med['xnn'] * 1e3:9.2f}{med['orch'] / med['port']:7.2f}"
                  f"{med['orch'] / med['xnn']:7.2f}{maxrel:10.1e}{load:9.1f}{et_load:9.1f}",
                  flush=True)
    geo = float(np.exp(np.mean(np.log(ratios))))
    print(f"geometric mean orchestra / ExecuTorch+XNNPACK: {geo:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
