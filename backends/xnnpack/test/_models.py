"""torch models for the XNNPACK tests and fixtures (imports torch: load only when it is
available). Each covers a set of XNNPACK node types; ``MODELS`` maps a name to a maker
returning (module, example inputs)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MODELS", "export_xnnpack"]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class SqueezeExcite(nn.Module):
    def __init__(self, c: int, r: int = 4) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(c, c // r, 1)
        self.fc2 = nn.Conv2d(c // r, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean((2, 3), keepdim=True)
        s = F.hardsigmoid(self.fc2(F.relu(self.fc1(s))))
        return x * s


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, expand: int, stride: int, se: bool) -> None:
        super().__init__()
        mid = cin * expand
        self.expand = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.Hardswish())
        self.dw = nn.Sequential(nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False), nn.BatchNorm2d(mid),
                                nn.Hardswish())
        self.se = SqueezeExcite(mid) if se else nn.Identity()
        self.project = nn.Sequential(nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.project(self.se(self.dw(self.expand(x))))
        return x + y if self.residual else y


class MobileNetish(nn.Module):
    """Inverted residuals with squeeze-excite and hardswish; input [1, 3, 224, 224]."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish())
        self.blocks = nn.Sequential(
            InvertedResidual(16, 16, 2, 2, True),
            InvertedResidual(16, 24, 3, 2, False),
            InvertedResidual(24, 24, 3, 1, True),
            InvertedResidual(24, 40, 3, 2, True),
            InvertedResidual(40, 40, 3, 1, True),
        )
        self.head = nn.Sequential(nn.Conv2d(40, 96, 1), nn.Hardswish())
        self.fc = nn.Linear(96, 100)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(self.blocks(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.mlp1, self.mlp2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp2(F.gelu(self.mlp1(self.ln2(x))))


class ViTish(nn.Module):
    """Patch embedding + ViT-style blocks with F.scaled_dot_product_attention; 128 tokens."""

    def __init__(self, d: int = 64, depth: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(48, d)
        self.blocks = nn.Sequential(*[Block(d, heads) for _ in range(depth)])
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.embed(x))
        return self.head(x.mean(1))


class DwSepUpsample(nn.Module):
    """Depthwise-separable encoder + bilinear upsampling decoder; input [1, 3, 128, 128]."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, 2, 1)
        self.dw1, self.pw1 = nn.Conv2d(16, 16, 3, 1, 1, groups=16), nn.Conv2d(16, 32, 1)
        self.dw2, self.pw2 = nn.Conv2d(32, 32, 3, 2, 1, groups=32), nn.Conv2d(32, 32, 1)
        self.out = nn.Conv2d(32 + 16, 4, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.relu6(self.stem(x))
        a = F.relu(self.pw1(self.dw1(s)))
        b = F.relu(self.pw2(self.dw2(a)))
        up = F.interpolate(b, scale_factor=2, mode="bilinear", align_corners=False)
        y = self.out(torch.cat([up, s], 1))
        return F.interpolate(y, size=(128, 128), mode="bilinear", align_corners=True)


class OpsZoo(nn.Module):
    """Many small node types at once: conv transpose, grouped conv, pooling, pad, slicing,
    elementwise unary/binary, activations, softmax, bmm, cat, permute."""

    def __init__(self) -> None:
        super().__init__()
        self.deconv = nn.ConvTranspose2d(8, 6, 3, stride=2, padding=1, output_padding=1)
        self.gconv = nn.Conv2d(6, 12, 3, padding=2, dilation=2, groups=3)
        self.dwm = nn.Conv2d(12, 24, 3, padding=1, groups=12)  # depth multiplier 2
        self.prelu = nn.PReLU(24)
        self.fc = nn.Linear(24, 16)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = F.elu(self.deconv(x), alpha=0.7)  # [1, 6, 16, 16]
        h = F.leaky_relu(self.gconv(h), 0.1)
        h = self.prelu(self.dwm(h))
        h = F.max_pool2d(h, 3, 2, 1)  # 8x8
        h = F.avg_pool2d(h, 2)  # 4x4
        h = F.pad(h, (1, 1, 1, 1), value=0.5)
        h = torch.clamp(h, -1.5, 2.0)
        t = h.mean((2, 3), keepdim=True).flatten(1)  # [1, 24]
        z = torch.tanh(self.fc(t))
        w = torch.cat([z, torch.sigmoid(z), torch.abs(z) + 1.0], 1)  # [1, 48]
        u = torch.sqrt(torch.abs(y) + 0.1) * torch.exp(-y) - torch.floor(y) + torch.ceil(y) / 3.0
        u = torch.maximum(torch.minimum(u, y), -torch.abs(y)) + torch.log(torch.abs(y) + 1.0)
        u = u + torch.rsqrt(y * y + 1.0) + torch.square(y) - F.gelu(y) + F.elu(y)
        m = torch.bmm(u, u.transpose(1, 2)) / 4.0  # [2, 5, 5]
        m = torch.softmax(m, -1)
        s = u[:, 1:4, 2:7]
        return w, m, s.permute(0, 2, 1).contiguous()


class EffRegish(nn.Module):
    """EfficientNet- and RegNet-style pieces at 112x112: SiLU after convolutions (fused into
    them by the backend), a SiLU whose input is also read by a residual add (not fused into
    its producer), squeeze-excite with a SiLU linear layer and a sigmoid gate, 5x5 and
    strided depthwise convolutions, grouped convolutions of width 8 with relu, and a
    hardswish after a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 24, 3, 2, 1)
        self.expand = nn.Conv2d(24, 48, 1)
        self.dw5 = nn.Conv2d(48, 48, 5, 1, 2, groups=48)
        self.se1, self.se2 = nn.Linear(48, 12), nn.Linear(12, 48)
        self.project = nn.Conv2d(48, 24, 1)
        self.dw_s2 = nn.Conv2d(24, 24, 3, 2, 1, groups=24)
        self.g1 = nn.Conv2d(24, 24, 3, 1, 1, groups=3)
        self.g2 = nn.Conv2d(24, 48, 3, 2, 1, groups=3)
        self.fc = nn.Linear(48, 32)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.silu(self.stem(x))  # 56x56
        h = F.silu(self.expand(s))
        h = F.silu(self.dw5(h))
        g = h.mean((2, 3), keepdim=True).flatten(1)
        g = torch.sigmoid(self.se2(F.silu(self.se1(g))))
        h = self.project(h * g[:, :, None, None])
        r = s + h
        r = F.silu(r) + r  # the SiLU's input has another reader
        r = self.dw_s2(r)  # 28x28
        r = F.relu(self.g1(r)) + r
        r = F.relu(self.g2(r))  # 14x14
        t = F.hardswish(self.fc(r.mean((2, 3), keepdim=True).flatten(1)))
        return self.head(t)


def _mobilenet() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(1)
    m = MobileNetish().eval()
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            with torch.no_grad():
                mod.running_mean.uniform_(-0.1, 0.1)
                mod.running_var.uniform_(0.5, 1.5)
    return m, (torch.randn(1, 3, 224, 224, generator=_gen(2)),)


class PatchEmbed(nn.Module):
    """ViT's patch embedding (16x16 patches, stride 16) on a 224x224 image, with a relu so the
    convolution's output clamp is exercised, then a head over the mean of the patches."""

    def __init__(self, d: int = 192) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, d, 16, 16)
        self.head = nn.Linear(d, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.patch(x)).flatten(2).mean(2))


def _patch() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(13)
    return PatchEmbed().eval(), (torch.randn(1, 3, 224, 224, generator=_gen(14)),)


def _vit() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(3)
    return ViTish().eval(), (torch.randn(1, 128, 48, generator=_gen(4)),)


def _dwsep() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(5)
    return DwSepUpsample().eval(), (torch.randn(1, 3, 128, 128, generator=_gen(6)),)


def _effreg() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(11)
    return EffRegish().eval(), (torch.randn(1, 3, 112, 112, generator=_gen(12)),)


def _zoo() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(7)
    return OpsZoo().eval(), (torch.randn(1, 8, 8, 8, generator=_gen(8)), torch.randn(2, 5, 8, generator=_gen(9)))


MODELS: dict[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {
    "mobilenet_se_224": _mobilenet,
    "vit_sdpa_128": _vit,
    "dwsep_upsample": _dwsep,
    "ops_zoo": _zoo,
    "effreg_silu_112": _effreg,
    "patch_embed_224": _patch,
}


def export_xnnpack(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> bytes:
    """``module`` lowered the way ExecuTorch teaches for CPU: XnnpackPartitioner, then
    ``to_executorch()``; returns the .pte bytes."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    ep = torch.export.export(module, inputs)
    return to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
