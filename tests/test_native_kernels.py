"""orchestra's compiled kernels (orchestra/runtime/kernels/_native.c, built by setup.py).

Each compiled kernel is checked against the numpy path it replaces (computed in float64),
on mobile nets' real shapes and on the corner cases of its tiling (widths that are not a
multiple of the 8-column tile, strides 1-3, dilation, padding wider than the kernel reach,
batches), and the extension's own checks of the buffers it is given are exercised directly.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import threading
from typing import Any

import numpy as np
import pytest

from orchestra.errors import OrchestraError
from orchestra.runtime import kernels
from orchestra.runtime.kernels import _conv

native = _conv._native
needs_native = pytest.mark.skipif(native is None, reason="orchestra's compiled kernels are not built here")


def test_built_wherever_a_compiler_is() -> None:
    """setup.py builds the extension when the interpreter's C compiler exists (CI has one):
    a build that silently broke would otherwise only show as a slower runtime."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        pytest.skip(f"no C compiler ({cc}) here")
    if os.environ.get("ORCHESTRA_NATIVE_KERNELS") == "0":
        pytest.skip("ORCHESTRA_NATIVE_KERNELS=0 is set")
    assert native is not None, "orchestra.runtime.kernels._native was not built (pip install -e . rebuilds it)"
    assert kernels.NATIVE_KERNELS is True


def test_orchestra_native_kernels_0_turns_them_off() -> None:
    code = "import orchestra.runtime.kernels as k, orchestra.runtime.kernels._conv as c; print(k.NATIVE_KERNELS, c._native)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, ORCHESTRA_NATIVE_KERNELS="0"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "None"]


@needs_native
@pytest.mark.parametrize("isa", ["v3", "baseline"])
def test_the_copies_this_cpu_would_not_pick(isa: str) -> None:
    """The products, silu and gelu have one copy per instruction set (AVX-512, AVX2+FMA,
    baseline), picked at load; ORCHESTRA_NATIVE_ISA lowers the pick, so the copies CI's CPU
    would not use run their tests too (in a child process, which picks again)."""
    if native.ISA_LEVEL == 0 and isa == "v3":
        pytest.skip("this CPU has no AVX2 + FMA")
    tests = ("products or silu or activations or gelu or grouped or same_bits or squeeze or layer_norm"
             " or compiled_add or compiled_softmax or int8_gemm or int8_depthwise or int8_lookup or int8_kernels_check")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", tests],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, ORCHESTRA_NATIVE_ISA=isa))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and " failed" not in r.stdout


def test_the_isa_override_lowers_the_pick() -> None:
    code = "import orchestra.runtime.kernels._native as n; print(n.ISA_LEVEL, n.GEMM_COLUMNS)"
    if native is None:
        pytest.skip("orchestra's compiled kernels are not built here")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, ORCHESTRA_NATIVE_ISA="baseline"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "16"]


@needs_native
def test_gelu_matches_the_numpy_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled gelu computes the numpy path's float32 fit (its exp within an ulp or two):
    the same NaN/inf/zero results, within 2e-6 relative for |x| <= 5 and 1.2e-5 beyond while
    the result is a normal float (the fit's own error against erf is up to 8e-6 there; the
    dense check against erf is tests/test_kernels.py's), in place and into a separate out."""
    from orchestra.runtime.kernels import _elementwise as ew

    x = np.concatenate([SPECIAL, np.array([-14.5, -15.0, -20.0, 3e38, -3e38], np.float32),
                        np.linspace(-16, 16, 200_001, dtype=np.float32),
                        np.random.default_rng(3).standard_normal(1 << 16).astype(np.float32)])
    got = ew.gelu_fit_f32_into(x, np.full_like(x, 7.0))
    inplace = x.copy()
    assert ew.gelu_fit_f32_into(inplace, inplace) is inplace
    monkeypatch.setattr(ew, "_native", None)
    ref = ew.gelu_fit_f32_into(x, np.empty_like(x))
    assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.array_equal(inplace, got, equal_nan=True)
    assert np.array_equal(got[np.isinf(ref)], ref[np.isinf(ref)])
    normal = np.abs(ref) >= np.finfo(np.float32).tiny
    near = normal & (np.abs(x) <= 5)  # far out, exp's large argument carries float32's rounding
    np.testing.assert_allclose(got[near], ref[near], rtol=2e-6)
    np.testing.assert_allclose(got[normal], ref[normal], rtol=1.2e-5)
    np.testing.assert_allclose(got[~normal], ref[~normal], rtol=0, atol=1e-43)


def _out_size(h: int, k: int, s: int, p: int, d: int) -> int:
    return (h + 2 * p - d * (k - 1) - 1) // s + 1


DW_CASES = [
    # N, C, H, W, kh, kw, stride, padding, dilation, bias
    (1, 16, 112, 112, 3, 3, (2, 2), (1, 1), (1, 1), True),  # MobileNetV3-small's first depthwise
    (1, 72, 56, 56, 3, 3, (2, 2), (1, 1), (1, 1), True),
    (1, 96, 28, 28, 5, 5, (2, 2), (2, 2), (1, 1), True),
    (1, 240, 14, 14, 5, 5, (1, 1), (2, 2), (1, 1), True),
    (1, 576, 7, 7, 5, 5, (1, 1), (2, 2), (1, 1), True),
    (1, 32, 112, 112, 3, 3, (1, 1), (1, 1), (1, 1), False),  # EfficientNet-B0's first
    (2, 8, 9, 9, 3, 3, (1, 1), (1, 1), (1, 1), True),
    (1, 5, 17, 13, 3, 5, (2, 1), (1, 2), (1, 1), True),
    (1, 4, 19, 23, 5, 3, (3, 3), (2, 1), (1, 1), False),
    (1, 3, 20, 21, 3, 3, (1, 2), (2, 2), (2, 2), True),
    (2, 6, 11, 31, 7, 7, (1, 1), (3, 6), (1, 2), True),
    (1, 4, 6, 6, 3, 3, (1, 1), (4, 4), (1, 1), True),  # padding past the kernel's reach
    (1, 2, 1, 1, 1, 1, (1, 1), (0, 0), (1, 1), True),
    (1, 3, 8, 9, 2, 2, (2, 2), (0, 0), (1, 1), True),
    (1, 7, 15, 1, 3, 1, (1, 1), (1, 0), (1, 1), True),
    # the compiled kernel works on blocks of 16 channels (8 where at most 8 are left), a strip
    # of rows of at most 24 Ki floats of padded input at a time, pixels flat over the strip
    (1, 20, 9, 10, 3, 3, (1, 1), (1, 1), (1, 1), True),  # 16 + 4
    (1, 24, 7, 7, 5, 5, (1, 1), (2, 2), (1, 1), True),  # 16 + 8
    (2, 17, 5, 6, 3, 3, (2, 2), (1, 1), (1, 1), True),  # 16 + 1, blocks per image
    (1, 40, 1, 30, 1, 5, (1, 1), (0, 2), (1, 1), True),  # 1xN planes, 16 + 16 + 8
    (3, 33, 30, 1, 5, 1, (3, 1), (2, 0), (1, 1), False),  # Nx1 planes, stride 3
    (1, 18, 40, 200, 3, 3, (1, 1), (1, 1), (1, 1), True),  # several strips
    (1, 18, 40, 201, 3, 3, (1, 1), (1, 1), (1, 1), True),  # several strips, pixels not a multiple of 4
    (2, 9, 23, 190, 3, 3, (2, 1), (3, 3), (2, 2), True),  # strips with dilation, padding past the reach
    (1, 16, 30, 300, 3, 3, (1, 1), (5, 5), (1, 1), True),  # padding rows inside later strips
    (1, 3, 5, 1600, 3, 3, (1, 1), (1, 1), (1, 1), True),  # a row wider than a strip: strips of 1 row
    (1, 19, 12, 13, 7, 7, (3, 3), (3, 3), (1, 1), True),  # stride 3, 7x7
]


@pytest.mark.parametrize("path", ["native", "numpy"])
@pytest.mark.parametrize("case", DW_CASES, ids=lambda c: "x".join(map(str, c[:4])) + f"k{c[4]}{c[5]}s{c[6]}p{c[7]}d{c[8]}")
def test_depthwise_matches_the_numpy_path(case: tuple, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """float32 through the compiled kernel (and, for comparison, through the numpy path)
    against the numpy path in float64."""
    if path == "native" and native is None:
        pytest.skip("orchestra's compiled kernels are not built here")
    if path == "numpy":
        monkeypatch.setattr(_conv, "_native", None)
    n, c, h, w, kh, kw, stride, padding, dilation, has_bias = case
    rng = np.random.default_rng(hash(case) % 2**32)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((c, 1, kh, kw)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32) if has_bias else None
    got = _conv.conv2d(x, wt, b, stride, padding, dilation, c, None)
    ref = _conv.conv2d(x.astype(np.float64), wt.astype(np.float64), None if b is None else b.astype(np.float64),
                       stride, padding, dilation, c, None)
    assert got.dtype == np.float32
    assert got.shape == (n, c, _out_size(h, kh, stride[0], padding[0], dilation[0]),
                         _out_size(w, kw, stride[1], padding[1], dilation[1]))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))


GROUPED_CASES = [
    # N, C, O, H, W, groups, kh, kw, stride, padding, dilation, bias
    (1, 368, 368, 7, 7, 46, 3, 3, (1, 1), (1, 1), (1, 1), True),  # RegNetX-200MF's last stage
    (1, 24, 24, 112, 112, 3, 3, 3, (2, 2), (1, 1), (1, 1), True),  # and its first grouped conv
    (1, 56, 56, 56, 56, 7, 3, 3, (2, 2), (1, 1), (1, 1), False),
    (2, 12, 18, 13, 11, 3, 3, 5, (1, 2), (2, 1), (1, 1), True),  # 4 in, 6 out per group
    (1, 8, 20, 9, 17, 4, 3, 3, (3, 1), (1, 3), (2, 1), True),  # 2 in, 5 out per group
    (1, 16, 16, 10, 10, 2, 1, 1, (1, 1), (0, 0), (1, 1), True),  # 1x1, 8 per group
    (1, 6, 3, 8, 8, 3, 3, 3, (1, 1), (1, 1), (1, 1), True),  # 2 in, 1 out per group
    (1, 4, 12, 9, 9, 4, 3, 3, (1, 1), (1, 1), (1, 1), True),  # depthwise with multiplier 3
    (1, 3, 16, 224, 224, 1, 3, 3, (2, 2), (1, 1), (1, 1), True),  # MobileNetV3's first (RGB) convolution
    (2, 8, 10, 15, 14, 1, 5, 5, (1, 1), (2, 2), (1, 1), False),  # one group of 8
    # rows wide enough for the product tiles, a last tile of part width, 5 outputs per group
    (1, 6, 10, 30, 48, 2, 3, 3, (1, 1), (1, 1), (1, 1), True),
    (2, 3, 8, 61, 64, 1, 3, 3, (2, 2), (1, 1), (1, 1), False),  # two images of a stem
]


@pytest.mark.parametrize("path", ["native", "numpy"])
@pytest.mark.parametrize("case", GROUPED_CASES, ids=lambda c: "x".join(map(str, c[:5])) + f"g{c[5]}k{c[6]}{c[7]}s{c[8]}")
def test_grouped_matches_the_numpy_path(case: tuple, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if path == "native" and native is None:
        pytest.skip("orchestra's compiled kernels are not built here")
    if path == "numpy":
        monkeypatch.setattr(_conv, "_native", None)
    n, c, o, h, w, groups, kh, kw, stride, padding, dilation, has_bias = case
    rng = np.random.default_rng(hash(case) % 2**32)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((o, c // groups, kh, kw)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32) if has_bias else None
    got = _conv.conv2d(x, wt, b, stride, padding, dilation, groups, None)
    ref = _conv.conv2d(x.astype(np.float64), wt.astype(np.float64), None if b is None else b.astype(np.float64),
                       stride, padding, dilation, groups, None)
    assert got.dtype == np.float32 and got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))


@needs_native
def test_depthwise_into_out_non_contiguous_input_and_aliasing(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 24, 30, 30)).astype(np.float32)
    wt = rng.standard_normal((24, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    monkeypatch.setattr(_conv, "_native", None)
    ref = _conv.conv2d(x, wt, b, (1, 1), (1, 1), (1, 1), 24, None)
    monkeypatch.setattr(_conv, "_native", native)
    out = np.empty_like(ref)
    assert _conv.conv2d(x, wt, b, (1, 1), (1, 1), (1, 1), 24, out) is out
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    big = np.zeros((1, 24, 30, 60), np.float32)
    big[..., ::2] = x
    np.testing.assert_allclose(_conv.conv2d(big[..., ::2], wt, b, (1, 1), (1, 1), (1, 1), 24, None), ref, rtol=1e-5, atol=1e-5)
    inplace = x.copy()  # out is the input itself (same shape at stride 1, padding 1)
    assert _conv.conv2d(inplace, wt, b, (1, 1), (1, 1), (1, 1), 24, inplace) is inplace
    np.testing.assert_allclose(inplace, ref, rtol=1e-5, atol=1e-5)


@needs_native
@pytest.mark.parametrize("act", [None, "relu", "hardswish", "silu"])
@pytest.mark.parametrize("shape", [(2, 40, 7, 7, 5, 1), (1, 24, 13, 11, 3, 2), (1, 20, 30, 200, 3, 1)],
                         ids=lambda s: "x".join(map(str, s[:4])) + f"k{s[4]}s{s[5]}")
def test_depthwise_bits_do_not_depend_on_a_channels_block(shape: tuple, act: str | None) -> None:
    """The compiled depthwise kernel computes up to 16 channels side by side: each channel's
    result (activation included) is bit for bit the one it gets computed alone."""
    n, c, h, w, k, s = shape
    rng = np.random.default_rng(17)
    x = (rng.standard_normal((n, c, h, w)) * 3).astype(np.float32)
    wt = rng.standard_normal((c, 1, k, k)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    whole = _conv.conv2d(x, wt, b, (s, s), (k // 2, k // 2), (1, 1), c, None, act=act)
    for ch in range(c):
        alone = _conv.conv2d(x[:, ch:ch + 1].copy(), wt[ch:ch + 1], b[ch:ch + 1], (s, s), (k // 2, k // 2), (1, 1), 1,
                             None, act=act)
        assert np.array_equal(whole[:, ch:ch + 1], alone, equal_nan=True), ch


@needs_native
def test_the_extension_checks_the_buffers_it_is_given() -> None:
    x = np.zeros((1, 4, 8, 8), np.float32)
    w = np.zeros((4, 1, 3, 3), np.float32)
    out = np.zeros((1, 4, 8, 8), np.float32)
    native.conv_f32(x, w, None, out, 1, 4, 8, 8, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 8, 8)
    with pytest.raises(ValueError, match="x holds 1024 bytes"):
        native.conv_f32(x, w, None, out, 1, 5, 8, 8, 5, 5, 3, 3, 1, 1, 1, 1, 1, 1, 8, 8)
    with pytest.raises(ValueError, match="out holds"):
        native.conv_f32(x, w, None, out[:, :2], 1, 4, 8, 8, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 8, 8)
    with pytest.raises(ValueError, match="bias holds"):
        native.conv_f32(x, w, np.zeros(3, np.float32), out, 1, 4, 8, 8, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 8, 8)
    with pytest.raises(ValueError, match="inconsistent sizes"):  # 9 output rows from 8 input rows
        native.conv_f32(x, w, None, np.zeros((1, 4, 9, 8), np.float32), 1, 4, 8, 8, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 9, 8)
    with pytest.raises(ValueError, match="inconsistent sizes"):
        native.conv_f32(x, w, None, out, 1, 4, 8, 8, 4, 4, 3, 3, 0, 1, 1, 1, 1, 1, 8, 8)
    with pytest.raises(ValueError, match="inconsistent sizes"):  # sizes whose product wraps around
        native.conv_f32(x, w, None, out, 2**40, 2**40, 8, 8, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 8, 8)
    with pytest.raises(TypeError):  # a read-only out
        native.conv_f32(x, w, None, bytes(1024), 1, 4, 8, 8, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 8, 8)
    # an out on the input it reads late (a depthwise call reads strips as it writes), on the
    # weight or on the bias: refused, naming what
    with pytest.raises(ValueError, match="out overlaps"):
        native.conv_f32(x, w, None, x, 1, 4, 8, 8, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 8, 8)
    wide = np.zeros(1024, np.float32)
    with pytest.raises(ValueError, match="out overlaps"):
        native.conv_f32(x, wide[:36].reshape(4, 1, 3, 3), None, wide[:256], 1, 4, 8, 8, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 8, 8)
    with pytest.raises(ValueError, match="out overlaps"):
        native.conv_f32(x, w, wide[:4], wide[:256], 1, 4, 8, 8, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1, 8, 8)


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", ["stem", "two images", "two groups"])
def test_a_direct_convolution_whose_out_lies_on_its_input(case: str, threads: int) -> None:
    """A plan may put a convolution's result on its input's memory (EfficientNet's stem: the
    SiLU's output reuses the image's bytes). One image of one group is read whole before any
    output is written, so the kernel runs in place there (no copy of the input aside, a 602 KB
    copy per execute on EfficientNet); where it is not, the planned step copies the input
    first. Either way the result is that of separate arrays, bit for bit."""
    rng = np.random.default_rng(7)
    n, c, o, g = {"stem": (1, 3, 32, 1), "two images": (2, 3, 32, 1), "two groups": (1, 8, 16, 2)}[case]
    h = 64
    x = rng.standard_normal((n, c, h, h)).astype(np.float32)
    wt = rng.standard_normal((o, c // g, 3, 3)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    args = ((2, 2), (1, 1), (1, 1), g)
    kernels.set_threads(threads)
    try:
        run = _conv.plan_conv2d(x.shape, x.dtype, wt, b, *args, "silu")
        assert run is not None
        want = np.empty((n, o, h // 2, h // 2), np.float32)
        assert run(x, want) is want
        assert np.array_equal(want, _conv.conv2d(x, wt, b, *args, None, act="silu"))
        # the result's bytes start inside the input's: the first output rows overwrite input rows
        buf = np.zeros(x.size + want.size, np.float32)
        xin = buf[: x.size].reshape(x.shape)
        xin[...] = x
        out = buf[x.size // 2: x.size // 2 + want.size].reshape(want.shape)
        assert run(xin, out) is out
        assert np.array_equal(out, want)
        assert _conv.conv_reads_input_first(n, g, c // g, o // g) == (case == "stem")
    finally:
        kernels.set_threads(1)


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", [(1, 32, 24, 112, 112, (2, 2)), (2, 24, 56, 57, 55, (2, 2)), (1, 152, 368, 14, 14, (2, 2)),
                                  (1, 16, 40, 30, 31, (3, 3)), (1, 8, 12, 20, 21, (2, 1))],
                         ids=lambda c: f"{c[1]}to{c[2]}_{c[3]}x{c[4]}_s{c[5][0]}{c[5][1]}")
def test_a_strided_1x1_convolution_is_planned(case: tuple, threads: int) -> None:
    """A 1x1 convolution with a stride (a residual block's downsampling shortcut, RegNetX's and
    ResNet's) is planned: the pixels it reads gathered, then the 1x1 product. The bits of
    conv2d's own path, within float32 rounding of float64, its out may lie on its input."""
    n, c, o, h, w, stride = case
    rng = np.random.default_rng(c * o + h)
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = (rng.standard_normal((o, c, 1, 1)) / c**0.5).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    args = (stride, (0, 0), (1, 1), 1)
    ho, wo = (h - 1) // stride[0] + 1, (w - 1) // stride[1] + 1
    kernels.set_threads(threads)
    try:
        run = _conv.plan_conv2d(x.shape, x.dtype, wt, b, *args, "relu")
        assert run is not None and run.__name__ == "run_1x1_strided"
        out = np.empty((n, o, ho, wo), np.float32)
        assert run(x, out) is out
        assert np.array_equal(out, _conv.conv2d(x, wt, b, *args, None, act="relu"))
        x64 = x[:, :, :: stride[0], :: stride[1]].astype(np.float64)
        want = np.maximum(np.einsum("nchw,oc->nohw", x64, wt[:, :, 0, 0].astype(np.float64)) + b[:, None, None], 0)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
        buf = np.zeros(max(x.size, out.size) * 2, np.float32)
        xin = buf[: x.size].reshape(x.shape)
        xin[...] = x
        on = buf[x.size // 3: x.size // 3 + out.size].reshape(out.shape)  # out on x's bytes
        assert run(xin, on) is on and np.array_equal(on, out)
        assert run(x[:, :, :-1], out) is None  # another shape: conv2d then
    finally:
        kernels.set_threads(1)


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(1, 3, 224, 192, 16), (2, 3, 60, 24, 14), (1, 4, 30, 8, 10)])
def test_a_patch_embedding_is_a_product_of_its_patches(shape: tuple, threads: int) -> None:
    """A convolution whose stride is its kernel (ViT's 16x16 patches, input sides that leave a
    remainder too) is planned as the product of its gathered patches by the filter: within
    float32 rounding of float64, with bias and activation, its out may lie on its input."""
    n, c, h, o, k = shape
    rng = np.random.default_rng(k)
    x = rng.standard_normal((n, c, h, h)).astype(np.float32)
    wt = (rng.standard_normal((o, c, k, k)) / k).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    args = ((k, k), (0, 0), (1, 1), 1)
    ho = h // k
    kernels.set_threads(threads)
    try:
        run = _conv.plan_conv2d(x.shape, x.dtype, wt, b, *args, "relu")
        assert run is not None and run.__name__ == "run_patches"
        out = np.empty((n, o, ho, ho), np.float32)
        assert run(x, out) is out
        x64 = x[:, :, : ho * k, : ho * k].astype(np.float64).reshape(n, c, ho, k, ho, k)
        want = np.maximum(np.einsum("ncyixj,ocij->noyx", x64, wt.astype(np.float64)) + b[:, None, None], 0)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out, _conv.conv2d(x, wt, b, *args, None, act="relu"), rtol=1e-5, atol=1e-5)
        buf = np.zeros(x.size + out.size, np.float32)
        xin = buf[: x.size].reshape(x.shape)
        xin[...] = x
        on = buf[x.size // 3: x.size // 3 + out.size].reshape(out.shape)
        assert run(xin, on) is on and np.array_equal(on, out)
        assert run(x[:, :, :-1], out) is None  # another shape: conv2d then
    finally:
        kernels.set_threads(1)
    # small patches stay direct convolutions (faster there), 1x1 convolutions 1x1 products
    assert _conv.plan_conv2d((1, 3, 224, 224), x.dtype, np.zeros((64, 3, 4, 4), np.float32), None,
                             (4, 4), (0, 0), (1, 1), 1, None).__name__ == "run_direct"
    assert _conv.plan_conv2d((1, 368, 7, 7), x.dtype, np.zeros((368, 368, 1, 1), np.float32), None,
                             (1, 1), (0, 0), (1, 1), 1, None).__name__ == "run_1x1"


@needs_native
@pytest.mark.parametrize("case", ["1x1", "1x1 strided", "1x1 two pixels", "3x3", "1x1 dilated strided"])
def test_a_planned_convolution_applies_a_scale_per_output_channel(case: str) -> None:
    """plan_conv2d's ``scale`` (a folded batch norm's): the 1x1 products that scales_in_product
    names apply it to their sums (within a rounding of the scaled weight's result); every other
    path plans the scaled weight's copy, the bits of planning that copy."""
    rng = np.random.default_rng(21)
    k, stride, dil, hw, c, o = {"1x1": (1, 1, 1, 28, 48, 72), "1x1 strided": (1, 2, 1, 28, 48, 72),
                                "1x1 two pixels": (1, 1, 1, 1, 48, 72), "3x3": (3, 1, 1, 28, 16, 24),
                                "1x1 dilated strided": (1, 2, 2, 28, 48, 72)}[case]
    x = rng.standard_normal((1, c, hw, 2 * hw)).astype(np.float32)
    wt = rng.standard_normal((o, c, k, k)).astype(np.float32)
    b, s = rng.standard_normal(o).astype(np.float32), (rng.random(o) + 0.5).astype(np.float32)
    args = ((stride, stride), (k // 2, k // 2), (dil, dil), 1)
    in_product = case in ("1x1", "1x1 strided")
    assert _conv.scales_in_product(x.shape, wt.shape, *args) == in_product
    run = _conv.plan_conv2d(x.shape, x.dtype, wt, b, *args, "relu", s)
    folded = _conv.plan_conv2d(x.shape, x.dtype, _conv.scale_weight(wt, s), b, *args, "relu")
    if run is None:  # no planned path (the dilated strided 1x1): conv2d every time, as without the scale
        assert folded is None and not in_product
        return
    got, want = np.empty_like(ref := _conv.conv2d(x, wt, b, *args, None)), np.empty_like(ref)
    assert run(x, got) is got and folded(x, want) is want
    if in_product:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert not np.array_equal(got, want)  # the sums are scaled, not the weight
    else:
        assert np.array_equal(got, want)


@needs_native
def test_depthwise_runs_on_several_threads_at_once() -> None:
    """The GIL is released while it computes: concurrent calls on distinct outputs stay exact."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 64, 56, 56)).astype(np.float32)
    wt = rng.standard_normal((64, 1, 3, 3)).astype(np.float32)
    ref = _conv.conv2d(x, wt, None, (1, 1), (1, 1), (1, 1), 64, None)
    errors: list[float] = []

    def work() -> None:
        for _ in range(20):
            errors.append(float(np.abs(_conv.conv2d(x, wt, None, (1, 1), (1, 1), (1, 1), 64, None) - ref).max()))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 80 and max(errors) == 0.0


SPECIAL = np.array([np.nan, -np.inf, np.inf, -0.0, 0.0, -1e-30, 1e-30, -3.0, 3.0, -88.8, -88.0, 88.0, 100.0, -100.0],
                   np.float32)


@needs_native
@pytest.mark.parametrize("kernel", ["silu", "hardswish"])
def test_activations_match_the_numpy_path(kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled silu / hardswish against the numpy path: NaN and infinities as torch has
    them, within 3e-7 relative elsewhere (silu's exp is a polynomial), in place and into a
    separate out."""
    from orchestra.runtime.kernels import _elementwise as ew

    fn = {"silu": ew.silu_out, "hardswish": ew.hardswish_out}[kernel]
    x = np.concatenate([SPECIAL, np.linspace(-120, 120, 240_002, dtype=np.float32),
                        np.random.default_rng(1).standard_normal(1 << 16).astype(np.float32)]).reshape(4, -1)
    got = fn(x, np.full_like(x, 7.0))
    inplace = x.copy()
    assert fn(inplace, inplace) is inplace
    monkeypatch.setattr(ew, "_native", None)
    with np.errstate(all="ignore"):
        ref = fn(x, np.empty_like(x))
    assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.array_equal(inplace, got, equal_nan=True)
    assert np.array_equal(got[np.isinf(ref)], ref[np.isinf(ref)])
    np.testing.assert_allclose(got, ref, rtol=3e-7, atol=1e-44)
    if kernel == "hardswish":  # the same operations in the same order: bit for bit
        assert np.array_equal(got, ref, equal_nan=True)


@needs_native
def test_silu_of_an_element_does_not_depend_on_where_it_sits() -> None:
    """The compiled silu runs 16 elements at a time and its tail through the same vector
    code: each value gets the same bits at every offset and in every length."""
    vals = np.concatenate([SPECIAL, np.linspace(-20, 20, 50, dtype=np.float32)])
    alone = np.array([native_silu(np.array([v], np.float32))[0] for v in vals])
    for length in (1, 15, 16, 17, 33, 64):
        for start in range(0, len(vals), 7):
            part = vals[start:start + length]
            assert np.array_equal(native_silu(part), alone[start:start + length], equal_nan=True)


@needs_native
@pytest.mark.parametrize("kernel", ["silu_f32", "gelu_f32"])
def test_activations_give_the_same_bits_with_avx512_as_with_avx2(kernel: str, tmp_path: Any) -> None:
    """The AVX-512 silu and gelu (max / min, scalef and a masked multiply in place of the
    portable code's selects and exponent bits) compute the same operations: every value, the
    clamps' edges, silu's overflow at -88.72, gelu's subnormal tail, NaN and infinities
    included, has the bits the AVX2 copy gives (a child process with ORCHESTRA_NATIVE_ISA=v3)."""
    if native.ISA_LEVEL < 4:
        pytest.skip("this CPU has no AVX-512")
    rng = np.random.default_rng(11)
    edges = np.array([-88.7228394, -88.72284, -87.0, 87.0, 86.99999, 87.00001, 103.9, -103.9, -13.0, -14.5, -20.0],
                     np.float32)
    x = np.concatenate([SPECIAL, edges, np.nextafter(edges, np.float32(np.inf)), np.nextafter(edges, np.float32(-np.inf)),
                        np.linspace(-120, 120, 1_000_003, dtype=np.float32),
                        rng.standard_normal(1 << 18).astype(np.float32) * 10,
                        rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32).view(np.float32)])
    src, dst = tmp_path / "x.npy", tmp_path / "v3.npy"
    np.save(src, x)
    code = ("import sys, numpy as np, orchestra.runtime.kernels._native as n; x = np.load(sys.argv[1]); "
            f"o = np.empty_like(x); n.{kernel}(x, o, x.size); np.save(sys.argv[2], o); print(n.ISA_LEVEL)")
    r = subprocess.run([sys.executable, "-c", code, str(src), str(dst)], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, ORCHESTRA_NATIVE_ISA="v3"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["3"]
    want = np.load(dst)
    got = np.empty_like(x)
    getattr(native, kernel)(x, got, x.size)
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{(~same).sum()} values differ, first x = {x[~same][:5]}"


def native_silu(x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    native.silu_f32(np.ascontiguousarray(x), out, x.size)
    return out


@needs_native
def test_activations_refuse_a_partly_overlapping_out() -> None:
    x = np.arange(64, dtype=np.float32)
    with pytest.raises(ValueError, match="overlaps x without being x"):
        native.silu_f32(x[:32], x[16:48], 32)
    with pytest.raises(ValueError, match="out holds"):
        native.hardswish_f32(x, np.empty(8, np.float32), 64)
    from orchestra.runtime.kernels import _elementwise as ew

    a = np.linspace(-5, 5, 64, dtype=np.float32)
    want = ew.silu_out(a.copy(), np.empty_like(a))
    shifted = np.zeros(80, np.float32)
    shifted[:64] = a
    res = ew.silu_out(shifted[:64], shifted[8:72])  # the kernel falls back to numpy
    np.testing.assert_allclose(res, want, rtol=3e-7)


def test_set_threads_checks_its_argument() -> None:
    from orchestra import InvalidArgumentError

    for bad in (0, 17, 2.0, True, "2"):
        with pytest.raises(InvalidArgumentError, match="set_threads"):
            kernels.set_threads(bad)  # type: ignore[arg-type]
    assert kernels.threads() == 1  # the default, unchanged


@needs_native
@pytest.mark.parametrize("threads", [2, 3])
def test_a_call_split_over_threads_gives_the_same_bits(threads: int) -> None:
    """Each plane (and each run of activations) is computed by one thread the same way, so
    the result does not depend on the thread count."""
    from orchestra.runtime.kernels import _elementwise as ew

    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 64, 112, 112)).astype(np.float32)  # large enough to be split (2^23 work)
    dw = rng.standard_normal((64, 1, 5, 5)).astype(np.float32)
    grouped = rng.standard_normal((64, 8, 3, 3)).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    rgb = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
    stem = rng.standard_normal((30, 3, 3, 3)).astype(np.float32)  # 30: the last share is 2 channels
    runs = []
    for n in (1, threads):
        kernels.set_threads(n)
        try:
            runs.append((_conv.conv2d(x, dw, b, (1, 1), (2, 2), (1, 1), 64, None),
                         _conv.conv2d(x, grouped, b, (1, 1), (1, 1), (1, 1), 8, None, act="silu"),
                         # one image, one group (a stem): split over output rows
                         _conv.conv2d(rgb, stem, b[:30], (2, 2), (1, 1), (1, 1), 1, None, act="hardswish"),
                         ew.silu_out(x, np.empty_like(x)), ew.hardswish_out(x, np.empty_like(x))))
        finally:
            kernels.set_threads(1)
    for a, c in zip(*runs):
        assert np.array_equal(a, c)


# one image of one group, rows wide enough for the product tiles: split by output rows, each
# part padding the input rows it reads (N, C, O, H, W, kh, kw, stride, padding, dilation)
BAND_CASES = [
    (3, 16, 224, 224, 3, 3, (2, 2), (1, 1), (1, 1)),  # MobileNetV3's stem
    (3, 8, 37, 61, 3, 3, (2, 2), (1, 1), (1, 1)),  # odd sides: rows not a multiple of the parts
    (8, 40, 60, 70, 5, 5, (1, 1), (2, 2), (1, 1)),
    (4, 16, 90, 100, 3, 3, (3, 3), (1, 1), (1, 1)),  # stride 3: three column phases
    (6, 16, 64, 64, 3, 3, (1, 1), (2, 2), (2, 2)),  # dilated
    (3, 16, 65, 67, 7, 7, (2, 2), (3, 3), (1, 1)),  # bands of padding rows at both ends
    (5, 33, 48, 96, 3, 1, (1, 1), (1, 0), (1, 1)),
    (3, 16, 100, 128, 3, 3, (2, 1), (0, 1), (1, 1)),  # no padding rows
]


@needs_native
@pytest.mark.parametrize("case", BAND_CASES, ids=lambda c: f"{c[0]}to{c[1]}_{c[2]}x{c[3]}_k{c[4]}{c[5]}_s{c[6][0]}{c[6][1]}")
def test_a_convolution_split_by_rows_pads_its_own_rows(case: tuple) -> None:
    """Split over threads, each part pads the input rows its outputs read (in parallel, on the
    core that reads them): the bits of the one-thread call, which pads the whole planes first,
    for every activation, with and without a bias; and where out lies on x, the same bits too
    (the planes are then padded whole, before any part writes)."""
    c, o, h, w, kh, kw, stride, padding, dilation = case
    rng = np.random.default_rng(h * w + o)
    x = rng.standard_normal((1, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((o, c, kh, kw)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    ho = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    geo = (1, c, h, w, o, 1, kh, kw, *stride, *padding, *dilation, ho, wo)
    for act in range(4):
        for bias in (b, None):
            runs = []
            for n in (1, 2, 5):
                kernels.set_threads(n)
                try:
                    out = np.full((1, o, ho, wo), np.nan, np.float32)
                    native.conv_f32(x, wt, bias, out, *geo, act)
                    runs.append(out)
                    if n == 2:  # out on x's bytes
                        buf = np.zeros(max(x.size, o * ho * wo), np.float32)
                        buf[: x.size] = x.reshape(-1)
                        on = buf[: o * ho * wo].reshape(1, o, ho, wo)
                        native.conv_f32(buf[: x.size].reshape(x.shape), wt, bias, on, *geo, act)
                        assert np.array_equal(on.view(np.uint32), out.view(np.uint32))
                finally:
                    kernels.set_threads(1)
            assert all(np.array_equal(r.view(np.uint32), runs[0].view(np.uint32)) for r in runs[1:]), act
    # and they are the convolution, within float32 rounding of float64
    ref = _conv.conv2d(x.astype(np.float64), wt.astype(np.float64), b.astype(np.float64), stride, padding, dilation, 1,
                       None)
    kernels.set_threads(2)
    try:
        got = np.empty((1, o, ho, wo), np.float32)
        native.conv_f32(x, wt, b, got, *geo, 0)
    finally:
        kernels.set_threads(1)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))


@needs_native
def test_rested_pool_threads_take_the_next_calls_parts() -> None:
    """kernels.rest() between calls (as a worker process does after each execute), also
    from another Python thread while calls run: every later split call still gets all its
    parts done, with the bits of a one-thread call, and nothing hangs."""
    from orchestra.runtime.kernels import _elementwise as ew

    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 64, 112, 112)).astype(np.float32)
    dw = rng.standard_normal((64, 1, 3, 3)).astype(np.float32)
    want = (_conv.conv2d(x, dw, None, (1, 1), (1, 1), (1, 1), 64, None), ew.silu_out(x, np.empty_like(x)))
    kernels.set_threads(2)
    stop = threading.Event()

    def rester() -> None:
        while not stop.is_set():
            kernels.rest()

    t = threading.Thread(target=rester)
    try:
        for _ in range(5):
            kernels.rest()
            got = (_conv.conv2d(x, dw, None, (1, 1), (1, 1), (1, 1), 64, None), ew.silu_out(x, np.empty_like(x)))
            assert all(np.array_equal(a, b) for a, b in zip(got, want))
        t.start()
        for _ in range(5):
            got = (_conv.conv2d(x, dw, None, (1, 1), (1, 1), (1, 1), 64, None), ew.silu_out(x, np.empty_like(x)))
            assert all(np.array_equal(a, b) for a, b in zip(got, want))
    finally:
        stop.set()
        if t.is_alive():
            t.join()
        kernels.set_threads(1)


def _silu64(v: np.ndarray) -> np.ndarray:
    return v / (1 + np.exp(-v))


ACT_REF = {0: lambda v: v, 1: lambda v: np.maximum(v, 0), 2: lambda v: v * np.clip(v + 3, 0, 6) / 6, 3: _silu64}


@needs_native
@pytest.mark.parametrize("act", [0, 1, 2, 3])
@pytest.mark.parametrize("case", [(1, 16, 12544, 96), (2, 5, 49, 3), (1, 1152, 49, 192), (3, 7, 33, 13), (1, 3, 1, 1),
                                  (2, 152, 196, 152), (1, 368, 144, 40)],  # 196 = 6 x 32 + 4: 4 gemv columns;
                         # 49 = 48 + 1 and 144 = 3 x 48: 48-column tiles where the CPU has AVX-512
                         ids=lambda c: "x".join(map(str, c)))
def test_the_compiled_1x1_product_matches_float64(case: tuple, act: int) -> None:
    """conv1x1_f32 (N images, K input channels, P pixels, M output channels): every tile edge
    (P and M not multiples of the tile, a single pixel, several images) against float64."""
    n, k, p, m = case
    rng = np.random.default_rng(17)
    x = rng.standard_normal((n, k, p)).astype(np.float32)
    w = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    s = (rng.standard_normal(m) * 3).astype(np.float32)  # a folded batch norm's scale, signs included
    for bias in (b, None):
        for scale in (None, s):
            out = np.full((n, m, p), np.nan, np.float32)
            native.conv1x1_f32(x, w, bias, out, n, k, p, m, act, scale)
            ref = np.einsum("mk,nkp->nmp", w.astype(np.float64), x.astype(np.float64))
            if scale is not None:
                ref *= s[:, None]
            if bias is not None:
                ref += b[:, None]
            ref = ACT_REF[act](ref)
            atol = 2e-5 * np.sqrt(k) * (1 if scale is None else float(np.abs(s).max()))
            np.testing.assert_allclose(out, ref, rtol=2e-5, atol=atol)
        # a scale of ones: the sums times 1 are the sums, so the bits of the call without one
        ones, plain = np.empty((n, m, p), np.float32), np.empty((n, m, p), np.float32)
        native.conv1x1_f32(x, w, bias, ones, n, k, p, m, act, np.ones(m, np.float32))
        native.conv1x1_f32(x, w, bias, plain, n, k, p, m, act)
        assert np.array_equal(ones, plain)


@needs_native
@pytest.mark.parametrize("case", [(1, 128, 256, 1000, False), (1, 197, 192, 576, False), (3, 9, 64, 197, True),
                                  (1, 8, 7, 3, False), (2, 70, 33, 40, False), (1, 1, 1024, 1000, False),
                                  (1, 3, 70, 1100, False), (2, 2, 9, 5, True), (1, 9, 20, 45, False)],
                         ids=lambda c: "x".join(map(str, c[:4])) + ("b" if c[4] else ""))
def test_the_compiled_linear_products_match_float64(case: tuple) -> None:
    """linear_f32 (B products of T x K by K x N, the right operand shared or one per product,
    given as rows or transposed) against float64, with and without a bias over the columns."""
    nb, t, k, n, batched = case
    rng = np.random.default_rng(19)
    x = rng.standard_normal((nb, t, k)).astype(np.float32)
    wt = rng.standard_normal((nb, k, n) if batched else (k, n)).astype(np.float32)
    w = np.ascontiguousarray(wt.swapaxes(-1, -2))  # the same B given transposed: (N, K) rows
    b = rng.standard_normal(n).astype(np.float32)
    for bias in (b, None):
        ref = np.matmul(x.astype(np.float64), wt.astype(np.float64))
        if bias is not None:
            ref += b
        for trans in (False, True):
            out = np.full((nb, t, n), np.nan, np.float32)
            native.linear_f32(x, w if trans else wt, bias, out, nb, t, k, n, batched, 0, trans)
            np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5 * np.sqrt(k))


@needs_native
def test_products_run_where_the_runtime_multiplies(monkeypatch: pytest.MonkeyPatch) -> None:
    """addmm / mm / bmm of float32 go through the compiled products (same results as the
    numpy/BLAS path within float32 rounding), a transposed right operand read as it is; a
    product under 2^16 multiply-adds, of fewer than 4 rows on one thread, or of another dtype
    stays with numpy."""
    from orchestra.runtime.kernels import _linalg

    calls: list[str] = []
    real = _linalg._native

    class Spy:
        def __getattr__(self, name: str) -> object:
            if name != "get_threads":
                calls.append(name)
            return getattr(real, name)

    rng = np.random.default_rng(23)
    x = rng.standard_normal((64, 96)).astype(np.float32)
    w = rng.standard_normal((96, 40)).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    addmm = get_kernel_fn("aten::addmm.out")
    mm = get_kernel_fn("aten::mm.out")
    want = x.astype(np.float64) @ w + b
    monkeypatch.setattr(_linalg, "_native", Spy())
    np.testing.assert_allclose(addmm(b, x, w, 1, 1, np.empty((64, 40), np.float32)), want, rtol=1e-5, atol=1e-4)
    assert calls == ["linear_f32"]
    calls.clear()
    wview = np.ascontiguousarray(w.T).T  # a linear layer's W.T: a transposed view, read as it is
    np.testing.assert_allclose(addmm(b, x, wview, 1, 1, np.empty((64, 40), np.float32)), want, rtol=1e-5, atol=1e-4)
    assert calls == ["linear_f32"]
    calls.clear()
    row = rng.standard_normal((2, 512)).astype(np.float32)
    wide = rng.standard_normal((512, 100)).astype(np.float32)
    mm(row, wide, np.empty((2, 100), np.float32))  # 2 rows on 1 thread: BLAS
    mm(x.astype(np.float64), w, np.empty((64, 40)))  # float64: BLAS
    mm(x[:16], w, np.empty((16, 40), np.float32))  # 61,440 multiply-adds: BLAS
    assert calls == []
    xb = rng.standard_normal((3, 32, 64)).astype(np.float32)
    yb = rng.standard_normal((3, 64, 48)).astype(np.float32)
    got = get_kernel_fn("aten::bmm.out")(xb, yb.transpose(0, 2, 1).copy().transpose(0, 2, 1), np.empty((3, 32, 48), np.float32))
    np.testing.assert_allclose(got, np.matmul(xb.astype(np.float64), yb), rtol=1e-5, atol=1e-4)
    assert calls == ["linear_f32"]
    calls.clear()
    kernels.set_threads(2)
    try:  # a matrix-vector product goes to the compiled kernel where it can split
        got = mm(row, wide, np.empty((2, 100), np.float32))
    finally:
        kernels.set_threads(1)
    np.testing.assert_allclose(got, row.astype(np.float64) @ wide, rtol=1e-5, atol=1e-4)
    assert calls == ["linear_f32"]


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
def test_squeeze_and_excite_steps(threads: int) -> None:
    """A float32 global average pool and the excitation's per-plane scale run compiled: the
    scale bit for bit numpy's products (either operand order, in place too), the pool within
    float32 rounding of float64, on 1 and 2 threads; other shapes and dtypes keep numpy's path."""
    mean = get_kernel_fn("aten::mean.out")
    mul = get_kernel_fn("aten::mul.out")
    rng = np.random.default_rng(37)
    kernels.set_threads(threads)
    try:
        for c, hw in ((32, 112), (672, 14), (1152, 7), (5, 3)):
            x = rng.standard_normal((1, c, hw, hw)).astype(np.float32)
            s = rng.standard_normal((1, c, 1, 1)).astype(np.float32)
            got = mean(x, [-1, -2], True, None, np.empty((1, c, 1, 1), np.float32))
            np.testing.assert_allclose(got, x.astype(np.float64).mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)
            want = x * s
            assert np.array_equal(mul(x, s, np.empty_like(x)), want)
            assert np.array_equal(mul(s, x, np.empty_like(x)), want)
            y = x.copy()
            assert mul(y, s, y) is y and np.array_equal(y, want)
        x64 = rng.standard_normal((1, 64, 16, 16))
        s64 = rng.standard_normal((1, 64, 1, 1))
        assert np.array_equal(mul(x64, s64, np.empty_like(x64)), x64 * s64)  # float64: numpy
    finally:
        kernels.set_threads(1)


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
def test_scale_planes_says_whether_every_product_is_finite(threads: int) -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((96, 3, 3, 40)).astype(np.float32)  # large enough to split
    s = rng.standard_normal(96).astype(np.float32)
    kernels.set_threads(threads)
    try:
        out = np.empty_like(x)
        assert native.scale_planes_f32(x, s, out, 96, x.size // 96) is True
        assert np.array_equal(out, x * s[:, None, None, None])
        for value, scale in ((np.inf, 1.0), (np.nan, 1.0), (3e38, 10.0), (1.0, np.inf), (0.0, np.inf)):
            y, t = x.copy(), s.copy()
            y[95, 2, 2, 39], t[95] = value, scale  # the last element: the last part's
            assert native.scale_planes_f32(y, t, out, 96, x.size // 96) is False, (value, scale)
            y[95, 2, 2, 39], t[95] = x[95, 2, 2, 39], s[95]
            y[0, 0, 0, 0] = value if np.isfinite(scale) else y[0, 0, 0, 0]
            t[0] = scale
            assert native.scale_planes_f32(y, t, out, 96, x.size // 96) is False, (value, scale)
    finally:
        kernels.set_threads(1)


@needs_native
def test_the_plane_kernels_check_the_buffers_they_are_given() -> None:
    x = np.zeros((4, 8), np.float32)
    s = np.zeros(4, np.float32)
    native.scale_planes_f32(x, s, x, 4, 8)  # in place: allowed
    with pytest.raises(ValueError, match="s holds"):
        native.scale_planes_f32(x, s[:3], np.empty_like(x), 4, 8)
    with pytest.raises(ValueError, match="out holds"):
        native.scale_planes_f32(x, s, np.empty(16, np.float32), 4, 8)
    with pytest.raises(ValueError, match="overlaps"):
        native.scale_planes_f32(x.ravel()[:24], s, x.ravel()[8:], 3, 8)
    with pytest.raises(ValueError, match="x holds"):
        native.plane_sums_f32(x, np.empty(5, np.float32), 5, 8)
    with pytest.raises(ValueError, match="inconsistent sizes"):
        native.plane_sums_f32(x, np.empty(4, np.float32), 2**41, 8)


def get_kernel_fn(name: str):  # type: ignore[no-untyped-def]
    from orchestra.runtime.kernels import get_kernel

    kd = get_kernel(name)
    assert kd is not None
    return kd.fn


@needs_native
def test_the_products_check_the_buffers_they_are_given() -> None:
    x = np.zeros((4, 8), np.float32)
    w = np.zeros((6, 4), np.float32)
    out = np.zeros((6, 8), np.float32)
    native.conv1x1_f32(x, w, None, out, 1, 4, 8, 6)
    with pytest.raises(ValueError, match="x holds 128 bytes"):
        native.conv1x1_f32(x, w, None, out, 1, 5, 8, 6)
    with pytest.raises(ValueError, match="out holds"):
        native.conv1x1_f32(x, w, None, out[:2], 1, 4, 8, 6)
    with pytest.raises(ValueError, match="bias holds"):
        native.conv1x1_f32(x, w, np.zeros(5, np.float32), out, 1, 4, 8, 6)
    with pytest.raises(ValueError, match="inconsistent sizes"):
        native.conv1x1_f32(x, w, None, out, 2**40, 2**40, 8, 6)
    with pytest.raises(ValueError, match="inconsistent sizes or unknown activation"):
        native.conv1x1_f32(x, w, None, out, 1, 4, 8, 6, 9)
    with pytest.raises(ValueError, match="scale holds"):
        native.conv1x1_f32(x, w, None, out, 1, 4, 8, 6, 0, np.ones(5, np.float32))
    with pytest.raises(ValueError, match="overlaps"):
        native.conv1x1_f32(x, w, None, out, 1, 4, 8, 6, 0, out.reshape(-1)[:6])
    shared = np.zeros(64, np.float32)
    with pytest.raises(ValueError, match="overlaps"):
        native.conv1x1_f32(shared[:32], w, None, shared[16:], 1, 4, 8, 6)
    wt = np.zeros((8, 6), np.float32)
    o2 = np.zeros((4, 6), np.float32)
    native.linear_f32(x, wt, None, o2, 1, 4, 8, 6)
    with pytest.raises(ValueError, match="weight holds"):
        native.linear_f32(x, wt, None, o2, 2, 2, 8, 6, True)
    with pytest.raises(ValueError, match="overlaps"):
        native.linear_f32(x, wt, None, x, 1, 4, 8, 1)
    with pytest.raises(TypeError):  # a read-only out
        native.linear_f32(x, wt, None, bytes(96), 1, 4, 8, 6)


_AT_A_PAGE_END = """
import ctypes, mmap, sys
import numpy as np
from orchestra.runtime.kernels import _conv

native = _conv._native
page = mmap.PAGESIZE


def at_page_end(a):
    # a copy of a whose last byte is the last readable one: the next page is PROT_NONE
    pages = -(-a.nbytes // page)
    buf = mmap.mmap(-1, (pages + 1) * page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    assert ctypes.CDLL(None).mprotect(ctypes.c_void_p(base + pages * page), page, 0) == 0
    out = np.frombuffer(buf, a.dtype, count=a.size, offset=pages * page - a.nbytes).reshape(a.shape)
    out[...] = a
    return out


rng = np.random.default_rng(1)
for t in (1, 2, 3, 5, 6, 7, 9, 70):  # rows of the product: the last tile short of 4 rows
    x = at_page_end(rng.standard_normal((t, 40)).astype(np.float32))
    wt = rng.standard_normal((40, 37)).astype(np.float32)
    out = np.empty((t, 37), np.float32)
    native.linear_f32(x, wt, None, out, 1, t, 40, 37)
    assert np.allclose(out, x.astype(np.float64) @ wt, rtol=1e-5, atol=1e-4)
    w = at_page_end(rng.standard_normal((t, 40)).astype(np.float32))  # t output channels
    xs = rng.standard_normal((40, 50)).astype(np.float32)
    o2 = np.empty((t, 50), np.float32)
    native.conv1x1_f32(xs, w, None, o2, 1, 40, 50, t)
    assert np.allclose(o2, w.astype(np.float64) @ xs, rtol=1e-5, atol=1e-4)


def pack(w):  # qs8_gemm's filter layout
    n, k = w.shape
    p = np.zeros((-(-n // 16) * 16, -(-k // 4) * 4), np.int8)
    p[:n, :k] = w
    return p.reshape(-1, 16, p.shape[1] // 4, 4).transpose(0, 2, 1, 3).copy()


def i8(*shape):
    return rng.integers(-128, 128, size=shape).astype(np.int8)


# the int8 kernels: rows short of a tile, channels short of a vector, an odd count of groups of 8
corr, sc = np.zeros(64, np.int32), np.full(64, 1e-3, np.float32)
XU = native.QS8_GEMM_XU_BYTES  # scratch bytes per row value
for t in (1, 3, 5, 7):
    k = 37
    x, xu = at_page_end(i8(t, k)), at_page_end(np.zeros(t * 40 * XU, np.uint8))
    native.qs8_gemm(x, xu, at_page_end(pack(i8(21, k))), corr, sc, np.empty((t, 21), np.int8), t, k, 21, -128.0, 127.0, 0)
for nn, k in ((21, 37), (16, 4), (3, 2)):  # the packer: the filter, bias and outputs each end at a page
    native.qs8_pack_gemm(at_page_end(i8(nn, k)), nn, k, at_page_end(np.zeros(nn, np.int32)), -128,
                         at_page_end(np.empty((-(-nn // 16), -(-k // 4), 16, 4), np.int8)),
                         at_page_end(np.empty(nn, np.int32)))
for groups in (1, 3, 5):  # 9x9 image of groups * 8 channels, 3x3, padding 1
    c = 8 * groups
    x, xu = at_page_end(i8(1, 9, 9, c)), at_page_end(np.zeros(81 * 9 * c * XU, np.uint8))
    native.qs8_gconv(x, xu, at_page_end(pack(i8(c, 72))), corr, sc, np.empty((1, 9, 9, c), np.int8), 1, 9, 9, c, 3, 3,
                     1, 1, 1, 1, 1, 1, 9, 9, groups, 8, 0, -128.0, 127.0, 0)
x3 = at_page_end(i8(1, 15, 15, 3))
native.qs8_conv(x3, at_page_end(np.zeros(49 * 28 * XU, np.uint8)), at_page_end(pack(i8(16, 27))), corr, sc,
                np.empty((1, 7, 7, 16), np.int8), 1, 15, 15, 3, 3, 3, 2, 2, 0, 0, 1, 1, 7, 7, 16, 0, -128.0, 127.0, 0)
for c in (7, 24, 40):
    x = at_page_end(i8(1, 13, 13, c))
    native.dwconv_qs8(x, at_page_end(np.ones((3, 3, c), np.float32)), None, sc, np.empty((1, 13, 13, c), np.int8), 1,
                      13, 13, c, 3, 3, 1, 1, 1, 1, 1, 1, 13, 13, 0, -128.0, 127.0, 0)
for n in (1, 63, 65, 1000):
    x = at_page_end(rng.integers(0, 256, n).astype(np.uint8))
    native.lut_u8(x, np.empty(n, np.uint8), n, at_page_end(np.arange(256, dtype=np.uint8)))
    a, b = at_page_end(i8(1, 1, n)), at_page_end(i8(1, 1, n))
    native.mul_qs8(a, 0, b, 0, np.empty(n, np.int8), 1, 1, n, 1, 1e-3, -128.0, 127.0, 0)
print("ok")
"""


@needs_native
def test_products_read_no_row_past_their_operand() -> None:
    """A tile computes 4 rows; the last one of a product whose rows are not a multiple of 4
    reads only the rows there are (and the int8 kernels' last vectors only the channels, bytes
    and groups there are): operands that end where the next page is unreadable (a read past
    them would kill the child process)."""
    r = subprocess.run([sys.executable, "-c", _AT_A_PAGE_END], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])


@needs_native
@pytest.mark.parametrize("threads", [2, 3])
def test_products_split_over_threads_give_the_same_bits(threads: int) -> None:
    """Each tile of a product is computed whole by one thread, so the bits don't depend on
    the thread count (work of 2^18 multiply-adds and more is split)."""
    rng = np.random.default_rng(29)
    x = rng.standard_normal((2, 24, 3136)).astype(np.float32)
    w = rng.standard_normal((144, 24)).astype(np.float32)
    a = rng.standard_normal((197, 192)).astype(np.float32)
    wt = rng.standard_normal((192, 768)).astype(np.float32)
    row = rng.standard_normal((1, 1536)).astype(np.float32)
    wide = rng.standard_normal((1536, 768)).astype(np.float32)
    b = rng.standard_normal(768).astype(np.float32)
    runs = []
    for n in (1, threads):
        kernels.set_threads(n)
        try:
            o1 = np.empty((2, 144, 3136), np.float32)
            native.conv1x1_f32(x, w, b[:144], o1, 2, 24, 3136, 144, 3)
            o2 = np.empty((197, 768), np.float32)
            native.linear_f32(a, wt, b, o2, 1, 197, 192, 768)
            o3 = np.empty((1, 768), np.float32)  # a matrix-vector product: column blocks
            native.linear_f32(row, wide, b, o3, 1, 1, 1536, 768)
            o4 = np.empty((1, 152, 196), np.float32)  # a last block of 4 columns: gemvs
            native.conv1x1_f32(wide[:152, :196].copy(), wide[200:352, :152].copy(), b[:152], o4, 1, 152, 196, 152, 3)
            o5 = np.empty((1, 368, 49), np.float32)  # 7x7: 48 columns (AVX-512) and one gemv
            native.conv1x1_f32(wide[:368, :49].copy(), wide[400:768, :368].copy(), b[:368], o5, 1, 368, 49, 368, 2)
            runs.append((o1, o2, o3, o4, o5))
        finally:
            kernels.set_threads(1)
    for p, q in zip(*runs):
        assert np.array_equal(p, q)


@needs_native
@pytest.mark.parametrize("trans", [False, True], ids=["w_kn", "w_nk"])
def test_products_with_narrow_column_blocks_give_the_full_tiles_bits(trans: bool) -> None:
    """A column block at most half the tile wide (16 outputs, the last 8 of 72) goes through
    a half-width tile: every output gets the bits the full tile gives it in a wider product
    (the same weights with more outputs after them), bias and activation included."""
    rng = np.random.default_rng(31)
    nr = native.GEMM_COLUMNS
    for t, k, n in [(3136, 16, 16), (197, 37, 8), (50, 72, 40), (9, 5, 1), (64, 24, 72), (7, 96, nr // 2 + 1)]:
        wide_n = -(-n // nr) * nr + nr  # every block of the reference a full tile
        x = rng.standard_normal((t, k)).astype(np.float32)
        w_full = rng.standard_normal((wide_n, k)).astype(np.float32)  # (outputs, k)
        b_full = rng.standard_normal(wide_n).astype(np.float32)
        for act in (0, 2):
            got = np.empty((t, n), np.float32)
            ref = np.empty((t, wide_n), np.float32)
            if trans:
                native.linear_f32(x, np.ascontiguousarray(w_full[:n]), b_full[:n].copy(), got, 1, t, k, n, False, act,
                                  True)
                native.linear_f32(x, w_full, b_full, ref, 1, t, k, wide_n, False, act, True)
            else:
                native.linear_f32(x, np.ascontiguousarray(w_full[:n].T), b_full[:n].copy(), got, 1, t, k, n, False,
                                  act)
                native.linear_f32(x, np.ascontiguousarray(w_full.T), b_full, ref, 1, t, k, wide_n, False, act)
            assert np.array_equal(got, ref[:, :n]), (t, k, n, act)
            want = x.astype(np.float64) @ w_full[:n].T.astype(np.float64) + b_full[:n]
            if act == 0:
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@needs_native
@pytest.mark.parametrize("trans", [False, True], ids=["w_kn", "w_nk"])
def test_products_give_each_row_the_same_bits_in_any_tile(trans: bool) -> None:
    """With AVX-512 the products take 8 rows per tile (16 sums in registers), the rows past
    the last multiple of 8 4 at a time: every row gets the bits it gets computed 4 rows at a
    time (products of 4 rows), full and half-width column blocks, bias and activation
    included; and conv1x1_f32 (8 output channels per tile) the bits of 4 at a time."""
    rng = np.random.default_rng(41)
    for t, k, n in [(3136, 16, 16), (197, 192, 72), (84, 24, 40), (13, 96, 8), (20, 5, 33)]:
        x = rng.standard_normal((t, k)).astype(np.float32)
        w = rng.standard_normal((n, k)).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        wk = w if trans else np.ascontiguousarray(w.T)
        for act in (0, 2):
            got = np.empty((t, n), np.float32)
            native.linear_f32(x, wk, b, got, 1, t, k, n, False, act, trans)
            for r0 in range(0, t, 4):
                r0 = min(r0, t - 4)  # (fewer than 4 rows are a matrix-vector product per row)
                four = np.empty((4, n), np.float32)
                native.linear_f32(np.ascontiguousarray(x[r0:r0 + 4]), wk, b, four, 1, 4, k, n, False, act, trans)
                assert np.array_equal(got[r0:r0 + 4], four), (t, k, n, act, r0)
    for m, k, p in [(72, 16, 3136), (20, 40, 196), (12, 24, 49)]:
        x = rng.standard_normal((1, k, p)).astype(np.float32)
        w = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal(m).astype(np.float32)
        got = np.empty((1, m, p), np.float32)
        native.conv1x1_f32(x, w, b, got, 1, k, p, m, 2)
        for o0 in range(0, m, 4):
            four = np.empty((1, min(4, m - o0), p), np.float32)
            native.conv1x1_f32(x, np.ascontiguousarray(w[o0:o0 + 4]), b[o0:o0 + 4].copy(), four, 1, k, p, four.shape[1], 2)
            assert np.array_equal(got[:, o0:o0 + 4], four), (m, k, p, o0)


@needs_native
def test_convolutions_give_each_output_channel_the_same_bits_in_any_tile() -> None:
    """conv_f32's im2col convolutions (taps read in place, in row tiles or over the flattened
    padded map) take 8 output channels per tile with AVX-512: each channel gets the bits it
    gets 4 at a time (the same convolution with 4 of the filters)."""
    rng = np.random.default_rng(43)
    #         C, H, W, O, k, s, p
    for c, h, w, o, k, s, p in [(3, 224, 224, 16, 3, 2, 1), (3, 20, 20, 24, 3, 1, 1), (8, 40, 40, 12, 3, 1, 1),
                                (16, 9, 9, 20, 5, 2, 2), (4, 64, 6, 8, 3, 1, 0)]:
        x = rng.standard_normal((1, c, h, w)).astype(np.float32)
        wt = rng.standard_normal((o, c, k, k)).astype(np.float32)
        b = rng.standard_normal(o).astype(np.float32)
        ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        got = np.empty((1, o, ho, wo), np.float32)
        native.conv_f32(x, wt, b, got, 1, c, h, w, o, 1, k, k, s, s, p, p, 1, 1, ho, wo, 2)
        for o0 in range(0, o, 4):
            four = np.empty((1, 4, ho, wo), np.float32)
            native.conv_f32(x, np.ascontiguousarray(wt[o0:o0 + 4]), b[o0:o0 + 4].copy(), four, 1, c, h, w, 4, 1, k, k,
                            s, s, p, p, 1, 1, ho, wo, 2)
            assert np.array_equal(got[:, o0:o0 + 4], four), (c, h, w, o, k, s, p, o0)


@needs_native
@pytest.mark.parametrize("k, n", [(576, 1024), (1024, 1000), (1280, 1000), (96, 24)])
def test_products_of_one_row_against_large_weights(k: int, n: int) -> None:
    """A classifier's x @ W.T (W read in place as its rows, which the kernel fetches ahead
    when they are 1 MB and more): the float64 result within float32 rounding, and the same
    bits whichever thread sums a column."""
    rng = np.random.default_rng(37)
    x = rng.standard_normal((1, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    runs = []
    for threads in (1, 2):
        kernels.set_threads(threads)
        try:
            out = np.full((1, n), np.nan, np.float32)
            native.linear_f32(x, w, b, out, 1, 1, k, n, False, 0, True)
            runs.append(out)
        finally:
            kernels.set_threads(1)
    assert np.array_equal(runs[0], runs[1])
    want = x.astype(np.float64) @ w.T.astype(np.float64) + b
    np.testing.assert_allclose(runs[0], want, rtol=2e-5, atol=2e-4 * np.sqrt(k))


@needs_native
def test_the_thread_pool_works_in_a_forked_child() -> None:
    """The pool's threads don't survive a fork: a child forked after the parent used them
    builds its own and computes the same bits."""
    import multiprocessing

    rng = np.random.default_rng(31)
    a = rng.standard_normal((256, 256)).astype(np.float32)
    wt = rng.standard_normal((256, 512)).astype(np.float32)
    kernels.set_threads(2)
    try:
        want = np.empty((256, 512), np.float32)
        native.linear_f32(a, wt, None, want, 1, 256, 256, 512)
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(1) as pool:
            got = pool.apply(_product_in_child, (a, wt))
    finally:
        kernels.set_threads(1)
    assert np.array_equal(got, want)


def _product_in_child(a: np.ndarray, wt: np.ndarray) -> np.ndarray:
    assert kernels.threads() == 2  # inherited; the pool itself is rebuilt here
    out = np.empty((a.shape[0], wt.shape[1]), np.float32)
    native.linear_f32(a, wt, None, out, 1, a.shape[0], a.shape[1], wt.shape[1])
    return out


@pytest.mark.parametrize("path", ["native", "numpy"])
@pytest.mark.parametrize("act", ["relu", "hardswish", "silu"])
@pytest.mark.parametrize("shape", ["depthwise", "grouped", "1x1", "dense3x3"])
def test_a_convolution_ending_in_an_activation(shape: str, act: str, path: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """conv2d(..., act=) gives what the activation kernel gives run on conv2d's result:
    bit for bit for relu and hardswish (the same float32 operations), within silu's
    polynomial for silu; on every path (compiled direct, BLAS + one compiled bias/activation
    pass, numpy only)."""
    from orchestra.runtime.kernels import _elementwise as ew

    if path == "native" and native is None:
        pytest.skip("orchestra's compiled kernels are not built here")
    if path == "numpy":
        monkeypatch.setattr(_conv, "_native", None)
        monkeypatch.setattr(ew, "_native", None)
    c, o, groups, k = {"depthwise": (24, 24, 24, 3), "grouped": (32, 32, 4, 3), "1x1": (24, 40, 1, 1),
                       "dense3x3": (24, 16, 1, 3)}[shape]
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((1, c, 28, 28)) * 3).astype(np.float32)
    wt = rng.standard_normal((o, c // groups, k, k)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    fn = {"relu": ew.relu_out, "hardswish": ew.hardswish_out, "silu": ew.silu_out}[act]
    plain = _conv.conv2d(x, wt, b, (1, 1), (k // 2, k // 2), (1, 1), groups, None)
    want = fn(plain, np.empty_like(plain))
    out = np.empty_like(plain)
    got = _conv.conv2d(x, wt, b, (1, 1), (k // 2, k // 2), (1, 1), groups, out, act=act)
    assert got is out
    if act == "silu":
        np.testing.assert_allclose(got, want, rtol=3e-7, atol=1e-6)
    else:
        assert np.array_equal(got, want)
    with pytest.raises(OrchestraError, match="unknown activation 'gelu'"):
        _conv.conv2d(x, wt, b, (1, 1), (k // 2, k // 2), (1, 1), groups, None, act="gelu")


@needs_native
@pytest.mark.parametrize("kind", ["direct", "1x1"])
def test_a_planned_convolution_gives_conv2ds_bits_and_declines_what_it_was_not_planned_for(
        kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(13)
    c, o, k, groups = (16, 16, 3, 16) if kind == "direct" else (24, 40, 1, 1)
    x = rng.standard_normal((1, c, 14, 14)).astype(np.float32)
    wt = rng.standard_normal((o, c // groups, k, k)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    args = ((1, 1), (k // 2, k // 2), (1, 1), groups)
    run = _conv.plan_conv2d(x.shape, x.dtype, wt, b, *args, "hardswish")
    assert run is not None
    out = np.empty((1, o, 14, 14), np.float32)
    assert run(x, out) is out
    assert np.array_equal(out, _conv.conv2d(x, wt, b, *args, None, act="hardswish"))
    assert run(x[:, :, :13], out) is None  # another shape
    assert run(x.astype(np.float64), out) is None
    assert run(np.asfortranarray(x), out) is None
    assert run(x, out[:, :, :, :13]) is None
    assert run(x, np.empty((1, o, 14, 14), np.float64)) is None
    ro = np.empty_like(out)
    ro.flags.writeable = False
    assert run(x, ro) is None
    # the pair last checked is remembered (weakly): the same arrays again, then arrays sharing
    # memory (checked again: the input is copied aside), then the first ones
    want = out.copy()
    assert run(x, out) is out and np.array_equal(out, want)
    if c == o:
        inplace = x.copy()
        assert run(inplace, inplace) is inplace and np.array_equal(inplace, want)
    out.fill(np.nan)
    assert run(x, out) is out and np.array_equal(out, want)
    import gc
    import weakref
    x2, out2 = x.copy(), np.empty_like(out)
    alive = weakref.ref(x2)
    assert run(x2, out2) is out2
    del x2, out2
    gc.collect()
    assert alive() is None  # not kept alive by the plan
    monkeypatch.setattr(_conv, "_native", None)  # switched off after planning: conv2d's numpy path then
    assert run(x, out) is None
    # no plan for what the compiled kernels don't cover, or for invalid arguments
    assert _conv.plan_conv2d(x.shape, np.dtype(np.float64), wt, b, *args, None) is None
    assert _conv.plan_conv2d((1, c + 1, 14, 14), x.dtype, wt, b, *args, None) is None


def test_a_convolution_step_is_planned_per_input_shape() -> None:
    """dynamic_batch.pte's convolution sees several batch sizes: each gets its own plan, and
    the results match the plan as written, bit for bit."""
    import pathlib

    from orchestra.runtime import load_program
    from orchestra.runtime._method import CompiledPlan, Method

    prog = load_program(pathlib.Path(__file__).parent / "fixtures" / "dynamic_batch.pte")
    with prog.load_method() as m:
        assert [r.kind for r in m._cp.rewrites] == ["conv_planned"]
        plain = Method(CompiledPlan(prog.definition, prog.definition.plan("forward"), "plain", optimize=False))
        for batch in (1, 8, 3, 1):
            x = np.random.default_rng(batch).standard_normal((batch, 2, 6, 6)).astype(np.float32)
            for got, want in zip(m.execute([x]), plain.execute([x]), strict=True):
                assert np.array_equal(got, want)
        plain.close()


# -- squeeze-and-excite in one call -----------------------------------------------------------
def _se_reference(x: np.ndarray, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray, act: str,
                  gate: str) -> list[np.ndarray]:
    """s, t1, t2, t3, g, out in float64."""
    x64 = x.astype(np.float64)
    s = x64.mean(axis=(2, 3))
    t1 = s @ w1.T.astype(np.float64) + b1
    t2 = np.maximum(t1, 0) if act == "relu" else t1 / (1 + np.exp(-t1))
    t3 = t2 @ w2.T.astype(np.float64) + b2
    g = np.clip(t3 + 3, 0, 6) / 6 if gate == "hardsigmoid" else 1 / (1 + np.exp(-t3))
    return [s, t1, t2, t3, g, x64 * g[:, :, None, None]]


_SE_OPS = {"relu": [(4, 0, np.nan)], "silu": [(5, 0, 0), (6, 0, 0)], "sigmoid": [(5, 0, 0)],
           "hardsigmoid": [(1, 3, 0), (4, 0, np.nan), (4, np.nan, 6), (3, 6, 0)]}


@needs_native
@pytest.mark.parametrize("act,gate", [("relu", "hardsigmoid"), ("silu", "sigmoid")])
@pytest.mark.parametrize("shape", [(1, 16, 56, 56), (2, 96, 7, 7), (1, 576, 7, 7)])
def test_squeeze_excite_matches_float64(shape: tuple[int, ...], act: str, gate: str) -> None:
    from orchestra.runtime.kernels._fused import squeeze_excite_into

    n, c, h, w = shape
    r = max(c // 4, 8)
    rng = np.random.default_rng(c)
    x = rng.standard_normal(shape).astype(np.float32)
    w1, b1 = (rng.standard_normal((r, c)) * 0.3).astype(np.float32), rng.standard_normal(r).astype(np.float32)
    w2, b2 = (rng.standard_normal((c, r)) * 0.3).astype(np.float32), rng.standard_normal(c).astype(np.float32)
    ops1, ops2 = (np.array(_SE_OPS[k], np.float32).reshape(-1) for k in (act, gate))
    vecs = [np.full((n, k, 1, 1), np.nan, np.float32) for k in (c, r, r, c, c)]
    ref = _se_reference(x, w1, b1, w2, b2, act, gate)
    for inplace in (False, True):
        xin = x.copy()
        out = xin if inplace else np.empty_like(x)
        assert squeeze_excite_into(xin, out, *vecs, w1, b1, w2, b2, ops1, ops2)
        for got, want in zip([*vecs, out], ref, strict=True):
            np.testing.assert_allclose(got.reshape(want.shape), want, rtol=2e-5, atol=2e-6)


@needs_native
def test_squeeze_excite_writes_in_order_and_checks_its_operands() -> None:
    """Each value is written in the six steps' order (g lying on s's memory holds g; x read
    again after g: a g on x's memory scales what is there then), and what doesn't fit is
    refused before anything is written."""
    from orchestra.runtime.kernels._fused import squeeze_excite_into

    n, c, r = 1, 8, 8
    rng = np.random.default_rng(5)
    x = rng.standard_normal((n, c, 4, 4)).astype(np.float32)
    w1, w2 = (rng.standard_normal((r, c)) * 0.3).astype(np.float32), (rng.standard_normal((c, r)) * 0.3).astype(np.float32)
    b1, b2 = np.zeros(r, np.float32), np.zeros(c, np.float32)
    ops1, ops2 = np.array(_SE_OPS["relu"], np.float32).ravel(), np.array(_SE_OPS["sigmoid"], np.float32).ravel()
    ref = _se_reference(x, w1, b1, w2, b2, "relu", "sigmoid")
    s = np.empty((n, c, 1, 1), np.float32)
    t1, t2, t3 = (np.empty((n, k, 1, 1), np.float32) for k in (r, r, c))
    out = np.empty_like(x)
    assert squeeze_excite_into(x, out, s, t1, t2, t3, s, w1, b1, w2, b2, ops1, ops2)  # g on s's memory
    np.testing.assert_allclose(s.reshape(n, c), ref[4], rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(out, ref[5], rtol=2e-5, atol=2e-6)
    xg = x.copy()
    g_on_x = xg.reshape(-1)[:c].reshape(n, c, 1, 1)  # g written over x's first elements
    assert squeeze_excite_into(xg, out, s, t1, t2, t3, g_on_x, w1, b1, w2, b2, ops1, ops2)
    changed = x.copy()
    changed.reshape(-1)[:c] = ref[4].reshape(-1)
    np.testing.assert_allclose(out, changed.astype(np.float64) * ref[4][:, :, None, None], rtol=2e-5, atol=2e-6)
    before = out.copy()
    shifted = np.empty(x.size + 4, np.float32)
    refusals = [
        (shifted[:-4].reshape(x.shape), shifted[4:].reshape(x.shape), s, t1, t2, t3, s, w1, b1, w2, b2, ops1, ops2),  # out on x, shifted
        (x, out, s, t1, t2, t3, s, w1, b1, w2, b2, np.array([7, 0, 0], np.float32), ops2),  # an unknown op
        (x, out, s, t1, t2, t3, s, w1, b1, w2, b2, np.array([1, 3], np.float32), ops2),  # not triples
        (x, out, s, t1[:, :4], t2, t3, s, w1, b1, w2, b2, ops1, ops2),  # t1 too small
        (x.astype(np.float64), out, s, t1, t2, t3, s, w1, b1, w2, b2, ops1, ops2),  # not float32
    ]
    for args in refusals:
        shifted[4:] = x.reshape(-1)
        assert not squeeze_excite_into(*args)
    np.testing.assert_array_equal(out, before)
    with pytest.raises(ValueError, match="overlaps x"):
        native.se_f32(shifted[:-4], shifted[4:], s, t1, t2, t3, s, w1, b1, w2, b2, ops1, ops2, n, c, r, 16)


@needs_native
@pytest.mark.parametrize("threads", [2, 3])
def test_squeeze_excite_split_over_threads_gives_the_same_bits(threads: int) -> None:
    from orchestra.runtime.kernels._fused import squeeze_excite_into

    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 96, 56, 56)).astype(np.float32)  # large enough to be split
    w1, b1 = (rng.standard_normal((24, 96)) * 0.3).astype(np.float32), rng.standard_normal(24).astype(np.float32)
    w2, b2 = (rng.standard_normal((96, 24)) * 0.3).astype(np.float32), rng.standard_normal(96).astype(np.float32)
    ops1, ops2 = (np.array(_SE_OPS[k], np.float32).reshape(-1) for k in ("silu", "sigmoid"))
    runs = []
    for n in (1, threads):
        kernels.set_threads(n)
        try:
            vecs = [np.empty((2, k, 1, 1), np.float32) for k in (96, 24, 24, 96, 96)]
            out = np.empty_like(x)
            assert squeeze_excite_into(x, out, *vecs, w1, b1, w2, b2, ops1, ops2)
            runs.append([*vecs, out])
        finally:
            kernels.set_threads(1)
    for a, b in zip(*runs, strict=True):
        assert np.array_equal(a, b)


@needs_native
def test_a_product_whose_out_lies_on_its_input_copies_the_input_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan may put a linear layer's result on its input's memory (a rewrite reads the input
    in place of a copy of it): the compiled product copies the input aside and runs, rather
    than leaving it to numpy (one thread); the result is that of separate arrays."""
    from orchestra.runtime.kernels import _linalg

    rng = np.random.default_rng(31)
    x = rng.standard_normal((1, 1280)).astype(np.float32)
    w = rng.standard_normal((1000, 1280)).astype(np.float32)
    b = rng.standard_normal(1000).astype(np.float32)
    want = x.astype(np.float64) @ w.T.astype(np.float64) + b
    calls: list[str] = []

    class Spy:
        def __getattr__(self, name: str) -> Any:
            calls.append(name)
            return getattr(native, name)

    monkeypatch.setattr(_linalg, "_native", Spy())
    kernels.set_threads(2)
    try:
        buf = np.zeros(1280, np.float32)
        a = buf.reshape(1, 1280)
        a[...] = x
        out = buf[:1000].reshape(1, 1000)  # the result on the input's first 1000 elements
        assert _linalg.addmm_out(b, a, w.T, 1, 1, out) is out
    finally:
        kernels.set_threads(1)
    assert "linear_f32" in calls
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-4)


@needs_native
@pytest.mark.parametrize("relu", [False, True])
def test_the_compiled_add_gives_numpys_bits(relu: bool) -> None:
    """add_f32 (a residual connection, with its relu): numpy's float32 sum and relu_out's
    clip bit for bit (NaN, inf, -0.0 included), in place into either operand, on 1 and 2
    threads; an out overlapping an operand otherwise is refused."""
    from orchestra.runtime.kernels import _elementwise as ew

    rng = np.random.default_rng(41)
    n = 3 * 2**15 + 5  # split on 2 threads, and a tail
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    a[:6] = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0]
    b[:6] = [1.0, -np.inf, 1.0, -0.0, -0.0, -1.0]
    with np.errstate(invalid="ignore"):  # inf + -inf: NaN, as the kernel gives it
        want = np.add(a, b)
    if relu:
        want = ew.relu_out(want, np.empty_like(want))
    for threads in (1, 2):
        kernels.set_threads(threads)
        try:
            out = np.empty_like(a)
            native.add_f32(a, b, out, n, relu)
            assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
            for into in ("a", "b"):
                x, y = a.copy(), b.copy()
                target = x if into == "a" else y
                native.add_f32(x, y, target, n, relu)
                assert np.array_equal(target.view(np.uint32), want.view(np.uint32))
        finally:
            kernels.set_threads(1)
    buf = np.zeros(n + 4, np.float32)
    with pytest.raises(ValueError, match="overlaps"):
        native.add_f32(buf[:n], b, buf[4:], n, relu)
    # the add kernel takes it only with several threads, same shapes, float32, large enough
    kernels.set_threads(2)
    try:
        x = a.reshape(1, 1, 1, n)
        assert ew.add_f32_into(x, b.reshape(x.shape), np.empty_like(x))
        assert not ew.add_f32_into(x, b[:1].reshape(1, 1, 1, 1), np.empty_like(x))  # broadcasting
        assert not ew.add_f32_into(x[..., :100], x[..., :100], np.empty((1, 1, 1, 100), np.float32))  # small
    finally:
        kernels.set_threads(1)
    assert not ew.add_f32_into(x, b.reshape(x.shape), np.empty_like(x))  # one thread: numpy's add


@needs_native
@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
@pytest.mark.parametrize("shape", [(1, 197, 192), (2, 128, 256), (3, 5, 13)])
def test_the_compiled_layer_norm_matches_float64(shape: tuple[int, ...], affine: str) -> None:
    """The layer norm kernel's float32 layer norm (and its mean and rstd outputs) against
    float64, with and without weight and bias, in place or not, the same bits on 1 and 2
    threads; an output on an operand's memory goes back to the numpy path."""
    from orchestra.runtime.kernels import _norm

    rng = np.random.default_rng(43)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    d = shape[-1]
    w = rng.standard_normal(d).astype(np.float32) if affine in ("both", "weight") else None
    b = rng.standard_normal(d).astype(np.float32) if affine in ("both", "bias") else None
    x64 = x.astype(np.float64)
    mean = x64.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(((x64 - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
    want = (x64 - mean) * rstd * (1 if w is None else w) + (0 if b is None else b)
    runs = []
    for threads in (1, 2):
        kernels.set_threads(threads)
        try:
            outs = (np.empty_like(x), np.empty(shape[:-1] + (1,), np.float32), np.empty(shape[:-1] + (1,), np.float32))
            assert _norm._layer_norm_native(x, w, b, 1e-5, *outs)
            runs.append(outs)
        finally:
            kernels.set_threads(1)
    for p, q in zip(*runs, strict=True):
        assert np.array_equal(p, q)
    out, m, r = runs[0]
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(m, mean, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(r, rstd, rtol=2e-6)
    inplace = x.copy()
    assert _norm._layer_norm_native(inplace, w, b, 1e-5, inplace, m, r)
    assert np.array_equal(inplace, out)
    assert not _norm._layer_norm_native(x, w, b, 1e-5, out, x.reshape(-1)[: m.size].reshape(m.shape), r)  # mean on x
    assert not _norm._layer_norm_native(x.astype(np.float64), w, b, 1e-5, out, m, r)
    got = _norm.native_layer_norm_out(x, [d], w, b, 1e-5, np.empty_like(x), np.empty_like(m), np.empty_like(r))
    assert np.array_equal(got[0], out)  # the kernel takes this path


@needs_native
def test_the_compiled_softmax() -> None:
    """softmax_f32 over rows: within 2e-6 of float64 for ordinary rows (a tail past the
    8-float vectors included), a -inf mask exactly 0, a row with NaN or +inf all NaN (as the
    shifted formula gives), in place, the same bits on 1 and 2 threads."""
    rng = np.random.default_rng(47)
    rows, d = 3 * 197, 197
    x = (rng.standard_normal((rows, d)) * 4).astype(np.float32)
    x[1, :50] = -np.inf
    x[2, 7] = np.nan
    x[3, 9] = np.inf
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        e = np.exp(x64 - x64.max(-1, keepdims=True))
        want = e / e.sum(-1, keepdims=True)
    runs = []
    for threads in (1, 2):
        kernels.set_threads(threads)
        try:
            out = np.empty_like(x)
            native.softmax_f32(x, out, rows, d)
            runs.append(out)
        finally:
            kernels.set_threads(1)
    assert np.array_equal(runs[0], runs[1], equal_nan=True)
    got = runs[0]
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-30)
    assert np.all(got[1, :50] == 0)
    assert np.isnan(got[2]).all() and np.isnan(got[3]).all()
    y = x.copy()
    native.softmax_f32(y, y, rows, d)
    assert np.array_equal(y, got, equal_nan=True)
    with pytest.raises(ValueError, match="overlaps"):
        native.softmax_f32(x.reshape(-1)[: -d], x.reshape(-1)[d:], rows - 1, d)


def _requant_reference(acc: np.ndarray, bias: np.ndarray | None, scale: np.ndarray, lo: float, hi: float,
                       zp: int) -> np.ndarray:
    """XNNPACK's fp32 requantization: (float) of the exact int32 sum, times the scale, clamped,
    rounded half to even, plus the zero point."""
    total = acc.astype(np.float64).sum(axis=0) + (0 if bias is None else bias.astype(np.float64))
    v = np.multiply(total.astype(np.float32), scale, dtype=np.float32)
    return (np.rint(np.clip(v, np.float32(lo), np.float32(hi))) + zp).astype(np.int8)


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
def test_the_int8_kernels_compute_xnnpacks_requantization_and_converts(threads: int) -> None:
    rng = np.random.default_rng(7)
    kernels.set_threads(threads)
    try:
        for parts, rows, n, with_bias in [(1, 3136, 24, True), (2, 49, 600, True), (3, 1, 1000, False),
                                          (1, 5, 300, False)]:
            acc = rng.integers(-(1 << 23), 1 << 23, size=(parts, rows, n)).astype(np.float32)
            bias = rng.integers(-(1 << 26), 1 << 26, size=n).astype(np.int32) if with_bias else None
            scale = (rng.random(n) * 3e-6).astype(np.float32)
            acc[0, 0, :4] = [0.5 / scale[0], 1.5 / scale[1], -2.5 / scale[2], 1e7]  # near ties, and saturation
            zp = int(rng.integers(-20, 20))
            lo, hi = float(-128 - zp), float(100 - zp)  # a fused activation's upper bound
            out = np.empty((rows, n), np.int8)
            native.requant_qs8(acc, bias, scale, out, parts, rows, n, lo, hi, zp)
            np.testing.assert_array_equal(out, _requant_reference(acc, bias, scale, lo, hi, zp))
    finally:
        kernels.set_threads(1)
        for rows, k, n in [(1, 1024, 1000), (3, 70_000 // 100, 33), (7, 16, 5)]:  # the few-rows dot product
            xq = rng.integers(-128, 128, size=(rows, k)).astype(np.int8)
            wq = rng.integers(-128, 128, size=(n, k)).astype(np.int8)
            bias = rng.integers(-(1 << 20), 1 << 20, size=n).astype(np.int32)
            scale = (rng.random(n) * 1e-5).astype(np.float32)
            zx, zp = int(rng.integers(-128, 128)), int(rng.integers(-20, 20))
            lo, hi = float(-128 - zp), float(127 - zp)
            out = np.empty((rows, n), np.int8)
            native.qs8_rows_dot(xq, zx, wq, bias, scale, out, rows, k, n, lo, hi, zp)
            acc = ((xq.astype(np.int64) - zx) @ wq.astype(np.int64).T).astype(np.float32)[None]
            np.testing.assert_array_equal(out, _requant_reference(acc, bias, scale, lo, hi, zp))
    x = (rng.standard_normal(100_003) * 4).astype(np.float32)
    x[:6] = [0.5, 1.5, 2.5, -0.5, 1e30, -1e30]
    scale, zp = np.float32(1.0), 3  # x itself rounded: ties
    inv = np.float32(1) / scale
    q = np.empty(x.size, np.int8)
    native.quantize_qs8(x, q, x.size, float(inv), float(-128 - zp), float(127 - zp), zp)
    want = (np.rint(np.clip(x * inv, np.float32(-128 - zp), np.float32(127 - zp))) + zp).astype(np.int8)
    np.testing.assert_array_equal(q, want)
    assert list(q[:6]) == [3, 5, 5, 3, 127, -128]  # half to even, then the zero point; saturated
    d = np.empty(x.size, np.float32)
    native.dequantize_qs8(q, d, q.size, zp, float(scale))
    np.testing.assert_array_equal(d, (q.astype(np.int32) - zp).astype(np.float32) * scale)


def _gemm_filter(w: np.ndarray) -> np.ndarray:
    """(n, k) int8 as qs8_gemm reads it: element [b, q, l, t] is w[16 b + l, 4 q + t], 0 past the ends."""
    n, k = w.shape
    nb, k4 = -(-n // 16), -(-k // 4)
    packed = np.zeros((nb, k4, 16, 4), np.int8)
    for b in range(nb):
        for l in range(min(16, n - 16 * b)):
            row = np.zeros(4 * k4, np.int8)
            row[:k] = w[16 * b + l]
            packed[b, :, l, :] = row.reshape(k4, 4)
    return packed


def _gemm_correction(w: np.ndarray, zx: int, bias: np.ndarray | None) -> np.ndarray:
    corr = -(128 + zx) * w.astype(np.int64).sum(axis=1) + (0 if bias is None else bias.astype(np.int64))
    return ((corr + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)  # modulo 2^32, as the kernel sums



@pytest.mark.parametrize("n, k", [(1, 1), (17, 5), (16, 4), (56, 24), (33, 151), (368, 368)])
def test_qs8_pack_gemm_packs_the_filter_and_sums_its_rows_as_the_reference(n: int, k: int) -> None:
    rng = np.random.default_rng(n * 1000 + k)
    w = rng.integers(-128, 128, (n, k), dtype=np.int8)
    w[0] = -128  # the extreme row sum
    for zx, bias in ((-128, None), (0, rng.integers(-2**31, 2**31, n, dtype=np.int64).astype(np.int32)),
                     (127, np.full(n, 2**31 - 1, np.int32))):  # the last two wrap modulo 2^32
        packed = np.full((-(-n // 16), -(-k // 4), 16, 4), 7, np.int8)  # the padding must be written as 0
        corr = np.full(n, 7, np.int32)
        native.qs8_pack_gemm(w, n, k, bias, -(128 + zx), packed, corr)
        np.testing.assert_array_equal(packed, _gemm_filter(w))
        np.testing.assert_array_equal(corr, _gemm_correction(w, zx, bias))


def test_qs8_pack_gemm_refuses_short_or_overlapping_buffers() -> None:
    w = np.ones((20, 9), np.int8)
    packed, corr = np.empty((2, 3, 16, 4), np.int8), np.empty(20, np.int32)
    with pytest.raises(ValueError, match="packed holds"):
        native.qs8_pack_gemm(w, 20, 9, None, -128, packed[:1], corr)
    with pytest.raises(ValueError, match="corr holds"):
        native.qs8_pack_gemm(w, 20, 9, None, -128, packed, corr[:19])
    with pytest.raises(ValueError, match="bias holds"):
        native.qs8_pack_gemm(w, 20, 9, np.zeros(19, np.int32), -128, packed, corr)
    with pytest.raises(ValueError, match="w holds"):
        native.qs8_pack_gemm(w, 20, 10, None, -128, np.empty((2, 3, 16, 4), np.int8), corr)
    with pytest.raises(ValueError, match="out of range"):
        native.qs8_pack_gemm(w, 20, 9, None, 1, packed, corr)
    with pytest.raises(ValueError, match="overlaps"):
        native.qs8_pack_gemm(packed.reshape(-1)[:180], 20, 9, None, -128, packed, corr)

def _int8_conv_sums(xq: np.ndarray, wq: np.ndarray, zx: int, groups: int, stride: tuple[int, int],
                    pad: tuple[int, int, int, int], dil: tuple[int, int]) -> np.ndarray:
    """Exact int64 sums of an NHWC int8 convolution: x (N, H, W, C) less zx, zero-padded by pad
    (top, bottom, left, right), w (cout, kh, kw, C / groups); (N Ho Wo, cout)."""
    (sh, sw), (pt, pb, pl, pr), (dh, dw) = stride, pad, dil
    cout, kh, kw, gic = wq.shape
    goc = cout // groups
    xc = np.pad(xq.astype(np.int64) - zx, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    ho = (xc.shape[1] - dh * (kh - 1) - 1) // sh + 1
    wo = (xc.shape[2] - dw * (kw - 1) - 1) // sw + 1
    acc = np.zeros((xq.shape[0], ho, wo, cout), np.int64)
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                tap = xc[:, i * dh:i * dh + (ho - 1) * sh + 1:sh, j * dw:j * dw + (wo - 1) * sw + 1:sw,
                         g * gic:(g + 1) * gic]
                acc[..., g * goc:(g + 1) * goc] += tap @ wq[g * goc:(g + 1) * goc, i, j, :].astype(np.int64).T
    return acc.reshape(-1, cout)


def _int8_requant_case(rng: np.random.Generator, acc: np.ndarray, with_bias: bool = True, top: int = 127
                       ) -> tuple[np.ndarray | None, np.ndarray, int, float, float, np.ndarray]:
    """(bias, scale, zp, lo, hi, expected int8) for the sums ``acc`` (rows, n): bias and scale
    sized to the sums' spread so the results cover the range, not all saturated (checked)."""
    n = acc.shape[1]
    spread = float(acc.std()) + 1
    bias = rng.integers(-spread, spread, size=n).astype(np.int32) if with_bias else None
    scale = (rng.random(n) * 60 / spread).astype(np.float32)
    zp = int(rng.integers(-20, 20))
    lo, hi = float(-128 - zp), float(top - zp)
    want = _requant_reference(acc.astype(np.float64)[None], bias, scale, lo, hi, zp)
    if want.size > 200:
        assert ((want > -128) & (want < top)).mean() > 0.5 and len(np.unique(want)) > 20
    return bias, scale, zp, lo, hi, want


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
def test_the_int8_gemm_sums_int8_rows_exactly(threads: int) -> None:
    """qs8_gemm: requantized bias + sum (x - zx) * w over int8 rows, exact int32 sums through the
    uint8 rows and the per-channel correction (which itself leaves int32 for the widest rows);
    every tail of rows (4), channels (16) and k (4); the VNNI copy where the CPU has it and the
    plain one (ORCHESTRA_NATIVE_ISA, test_the_copies_this_cpu_would_not_pick)."""
    rng = np.random.default_rng(11)
    kernels.set_threads(threads)
    try:
        for rows, k, n, with_bias in [(1, 1, 1, False), (5, 3, 17, True), (3136, 16, 16, True), (784, 96, 24, True),
                                      (49, 576, 1000, True), (13, 1001, 33, False), (9, 65536, 20, True)]:
            xq = rng.integers(-128, 128, size=(rows, k)).astype(np.int8)
            wq = rng.integers(-128, 128, size=(n, k)).astype(np.int8)
            if k == 65536:  # the extreme sums: every term 255 * 128 in a row, the correction past int32
                xq[0], wq[0], wq[1] = 127, -128, 127
            zx = -128 if k == 65536 else int(rng.integers(-128, 128))
            acc = ((xq.astype(np.int64) - zx) @ wq.astype(np.int64).T)
            spread = float(np.abs(acc).std()) + 1
            bias = rng.integers(-spread, spread, size=n).astype(np.int32) if with_bias else None
            if k == 65536 and bias is not None:
                bias[:2] = 0  # those two sums are the extremes that fit int32 (the caller's bound)
            scale = (rng.random(n) * 60 / spread).astype(np.float32)
            zp = int(rng.integers(-20, 20))
            lo, hi = float(-128 - zp), float(100 - zp)  # a fused activation's upper bound
            want = _requant_reference(acc.astype(np.float64)[None], bias, scale, lo, hi, zp)
            out = np.empty((rows, n), np.int8)
            xu = np.empty(rows * 4 * -(-k // 4) * native.QS8_GEMM_XU_BYTES, np.uint8)
            native.qs8_gemm(xq, xu, _gemm_filter(wq), _gemm_correction(wq, zx, bias), scale, out, rows, k, n, lo, hi, zp)
            np.testing.assert_array_equal(out, want)
            if want.size > 200:  # results across the range, not all saturated
                assert ((want > -128) & (want < 100)).mean() > 0.5 and len(np.unique(want)) > 20
    finally:
        kernels.set_threads(1)


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
def test_the_int8_gemm_over_a_convolutions_patches(threads: int) -> None:
    """qs8_conv: qs8_gemm whose rows are the patches of an NHWC convolution, gathered in the
    kernel, taps outside the image read as the input's zero point (so they add nothing): the
    RGB stem (3 channels, stride 2), padding on every side, dilation, a strided 1x1, 2 images."""
    rng = np.random.default_rng(12)
    kernels.set_threads(threads)
    try:
        for nimg, h, w, ch, kh, kw, sh, sw, pt, pb, pl, pr, dh, dw, cout in [
                (1, 224, 224, 3, 3, 3, 2, 2, 0, 1, 0, 1, 1, 1, 16), (2, 9, 11, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 20),
                (1, 14, 14, 24, 5, 5, 2, 2, 2, 2, 2, 2, 1, 1, 40), (1, 12, 10, 5, 3, 3, 1, 1, 2, 2, 2, 2, 2, 2, 7),
                (1, 28, 28, 32, 1, 1, 2, 2, 0, 0, 0, 0, 1, 1, 48), (1, 6, 7, 4, 3, 2, 3, 1, 0, 2, 1, 0, 1, 3, 3)]:
            k = kh * kw * ch
            xq = rng.integers(-128, 128, size=(nimg, h, w, ch)).astype(np.int8)
            wq = rng.integers(-128, 128, size=(cout, kh, kw, ch)).astype(np.int8)
            zx = int(rng.integers(-128, 128))
            acc = _int8_conv_sums(xq, wq, zx, 1, (sh, sw), (pt, pb, pl, pr), (dh, dw))
            ho = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
            wo = acc.shape[0] // (nimg * ho)
            bias, scale, zp, lo, hi, want = _int8_requant_case(rng, acc)
            out = np.empty((nimg, ho, wo, cout), np.int8)
            xu = np.empty(nimg * ho * wo * 4 * -(-k // 4) * native.QS8_GEMM_XU_BYTES, np.uint8)
            native.qs8_conv(xq, xu, _gemm_filter(wq.reshape(cout, k)), _gemm_correction(wq.reshape(cout, k), zx, bias),
                            scale, out, nimg, h, w, ch, kh, kw, sh, sw, pt, pl, dh, dw, ho, wo, cout, zx, lo, hi, zp)
            np.testing.assert_array_equal(out.reshape(-1, cout), want)
    finally:
        kernels.set_threads(1)


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
def test_the_int8_gemm_over_a_grouped_convolutions_patches(threads: int) -> None:
    """qs8_gconv: each output channel sums over its own group's patch (two groups of 8 per
    vector, or a group over whole vectors), the rest as qs8_conv: RegNet's 8-wide groups at
    strides 1 and 2, 16- and 32-wide groups, padding on every side, 2 images."""
    rng = np.random.default_rng(15)
    kernels.set_threads(threads)
    try:
        for nimg, h, w, groups, gic, goc, kh, kw, sh, sw, pt, pb, pl, pr in [
                (1, 56, 56, 7, 8, 8, 3, 3, 2, 2, 1, 1, 1, 1), (2, 9, 11, 3, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1),
                (1, 14, 14, 5, 4, 16, 3, 3, 1, 1, 1, 1, 1, 1), (1, 10, 12, 2, 12, 32, 5, 5, 2, 2, 2, 1, 2, 1),
                (1, 7, 7, 46, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1)]:
            ch, cout = groups * gic, groups * goc
            xq = rng.integers(-128, 128, size=(nimg, h, w, ch)).astype(np.int8)
            wq = rng.integers(-128, 128, size=(cout, kh, kw, gic)).astype(np.int8)
            zx = int(rng.integers(-128, 128))
            acc = _int8_conv_sums(xq, wq, zx, groups, (sh, sw), (pt, pb, pl, pr), (1, 1))
            ho = (h + pt + pb - kh) // sh + 1
            wo = acc.shape[0] // (nimg * ho)
            bias, scale, zp, lo, hi, want = _int8_requant_case(rng, acc)
            out = np.empty((nimg, ho, wo, cout), np.int8)
            xu = np.empty(nimg * ho * wo * kh * kw * ch * native.QS8_GEMM_XU_BYTES, np.uint8)
            w2 = wq.reshape(cout, kh * kw * gic)
            native.qs8_gconv(xq, xu, _gemm_filter(w2), _gemm_correction(w2, zx, bias), scale, out, nimg, h, w, ch, kh,
                             kw, sh, sw, pt, pl, 1, 1, ho, wo, groups, goc, zx, lo, hi, zp)
            np.testing.assert_array_equal(out.reshape(-1, cout), want)
        with pytest.raises(ValueError, match="per group a multiple of 4"):
            native.qs8_gconv(xq, xu, _gemm_filter(w2), _gemm_correction(w2, zx, bias), scale, out, nimg, h, w, ch, kh,
                             kw, sh, sw, pt, pl, 1, 1, ho, wo, groups, 24, zx, lo, hi, zp)
    finally:
        kernels.set_threads(1)


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
def test_the_int8_depthwise_convolution_in_one_pass(threads: int) -> None:
    """dwconv_qs8: requantized bias + sum over the taps inside of (x - zx) * w, int8 in and out,
    against exact integer sums: the 3x3 and 5x5 kernels at strides 1 and 2 (blocks of four
    pixels sharing their input columns), dilation, uneven padding, channel counts off the
    vector width, 2 images, rows narrower than a block."""
    rng = np.random.default_rng(13)
    kernels.set_threads(threads)
    try:
        for nimg, h, w, ch, kh, kw, sh, sw, pt, pb, pl, pr, dh, dw in [
                (1, 56, 56, 72, 3, 3, 2, 2, 0, 1, 0, 1, 1, 1), (1, 28, 30, 40, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),
                (2, 14, 14, 100, 5, 5, 1, 1, 2, 2, 2, 2, 1, 1), (1, 15, 17, 16, 5, 5, 2, 2, 1, 2, 2, 1, 1, 1),
                (1, 12, 13, 7, 3, 3, 1, 1, 2, 2, 2, 2, 2, 2), (1, 3, 3, 33, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1),
                (1, 9, 20, 24, 3, 2, 1, 3, 0, 0, 1, 0, 1, 1)]:
            xq = rng.integers(-128, 128, size=(nimg, h, w, ch)).astype(np.int8)
            wq = rng.integers(-128, 128, size=(kh, kw, ch)).astype(np.int8)
            zx = int(rng.integers(-128, 128))
            acc = _int8_conv_sums(xq, wq.transpose(2, 0, 1)[..., None], zx, ch, (sh, sw), (pt, pb, pl, pr), (dh, dw))
            ho = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
            wo = acc.shape[0] // (nimg * ho)
            bias, scale, zp, lo, hi, want = _int8_requant_case(rng, acc, with_bias=ch != 7, top=110)
            out = np.empty((nimg, ho, wo, ch), np.int8)
            native.dwconv_qs8(xq, wq.astype(np.float32), bias, scale, out, nimg, h, w, ch, kh, kw, sh, sw, pt, pl, dh, dw,
                              ho, wo, zx, lo, hi, zp)
            np.testing.assert_array_equal(out.reshape(-1, ch), want)
    finally:
        kernels.set_threads(1)


@needs_native
@pytest.mark.parametrize("threads", [1, 2])
def test_the_int8_lookup_maps_every_byte(threads: int) -> None:
    """lut_u8: out[i] = table[x[i]] over every byte value, each tail of a 64-byte vector, in
    place, split over threads."""
    rng = np.random.default_rng(14)
    kernels.set_threads(threads)
    try:
        table = rng.permutation(256).astype(np.uint8)
        for n in (1, 63, 64, 65, 256, 1000, 300_001):
            x = rng.integers(0, 256, size=n).astype(np.uint8)
            x[: min(n, 256)] = np.arange(min(n, 256))
            out = np.empty(n, np.uint8)
            native.lut_u8(x, out, n, table)
            np.testing.assert_array_equal(out, table[x])
            y = x.copy()
            native.lut_u8(y, y, n, table)
            np.testing.assert_array_equal(y, table[x])
        with pytest.raises(ValueError, match="table holds"):
            native.lut_u8(x, out, n, table[:255])
        with pytest.raises(ValueError, match="out holds"):
            native.lut_u8(x, out[:-1], n, table)
        with pytest.raises(ValueError, match="overlaps"):
            native.lut_u8(x, x[1:], n - 1, table)
    finally:
        kernels.set_threads(1)


@needs_native
def test_the_int8_kernels_check_the_buffers_they_are_given() -> None:
    acc, scale = np.zeros((2, 4, 8), np.float32), np.ones(8, np.float32)
    out = np.empty((4, 8), np.int8)
    with pytest.raises(ValueError, match="acc holds"):
        native.requant_qs8(acc[:1], None, scale, out, 2, 4, 8, -128.0, 127.0, 0)
    with pytest.raises(ValueError, match="out holds"):
        native.requant_qs8(acc, None, scale, out[:3], 2, 4, 8, -128.0, 127.0, 0)
    with pytest.raises(ValueError, match="bias holds"):
        native.requant_qs8(acc, np.zeros(7, np.int32), scale, out, 2, 4, 8, -128.0, 127.0, 0)
    with pytest.raises(ValueError, match="scale holds"):
        native.requant_qs8(acc, None, scale[:7], out, 2, 4, 8, -128.0, 127.0, 0)
    with pytest.raises(ValueError, match="inconsistent"):
        native.requant_qs8(acc, None, scale, out, 2, 4, 8, 1.0, -1.0, 0)
    with pytest.raises(ValueError, match="inconsistent"):
        native.requant_qs8(acc, None, scale, out, 2, 4, 8, -128.0, 127.0, 200)
    xq, wq, oq = np.zeros((2, 8), np.int8), np.zeros((3, 8), np.int8), np.empty((2, 3), np.int8)
    native.qs8_rows_dot(xq, 0, wq, None, scale, oq, 2, 8, 3, -128.0, 127.0, 0)
    with pytest.raises(ValueError, match="fewer int8"):
        native.qs8_rows_dot(xq, 0, wq[:2], None, scale, oq, 2, 8, 3, -128.0, 127.0, 0)
    with pytest.raises(ValueError, match="inconsistent"):
        native.qs8_rows_dot(xq, 0, wq, None, scale, oq, 2, 70_000, 3, -128.0, 127.0, 0)  # int32 sums could overflow
    with pytest.raises(ValueError, match="overlaps"):
        native.qs8_rows_dot(xq, 0, wq, None, scale, xq, 2, 8, 3, -128.0, 127.0, 0)
    wp, corr, xu = np.zeros((1, 2, 16, 4), np.int8), np.zeros(3, np.int32), np.empty(16 * native.QS8_GEMM_XU_BYTES, np.uint8)
    native.qs8_gemm(xq, xu, wp, corr, scale, oq, 2, 8, 3, -128.0, 127.0, 0)
    with pytest.raises(ValueError, match="w holds"):
        native.qs8_gemm(xq, xu, wp[:, :1], corr, scale, oq, 2, 8, 3, -128.0, 127.0, 0)
    with pytest.raises(ValueError, match="xu holds"):
        native.qs8_gemm(xq, xu[:-1], wp, corr, scale, oq, 2, 8, 3, -128.0, 127.0, 0)
    with pytest.raises(ValueError, match="corr holds"):
        native.qs8_gemm(xq, xu, wp, corr[:2], scale, oq, 2, 8, 3, -128.0, 127.0, 0)
    with pytest.raises(ValueError, match="inconsistent"):
        native.qs8_gemm(xq, xu, wp, corr, scale, oq, 2, 70_000, 3, -128.0, 127.0, 0)  # int32 sums could overflow
    with pytest.raises(ValueError, match="overlaps"):
        native.qs8_gemm(xq, xq.view(np.uint8).ravel(), wp, corr, scale, oq, 1, 8, 3, -128.0, 127.0, 0)
    with pytest.raises(ValueError, match="overlaps"):
        native.qs8_gemm(xq, xu, wp, corr, scale, xq, 2, 8, 3, -128.0, 127.0, 0)
    x4, w4, o4 = np.zeros((1, 4, 4, 8), np.int8), np.zeros((3, 3, 8), np.float32), np.empty((1, 4, 4, 8), np.int8)
    dgeo = (1, 4, 4, 8, 3, 3, 1, 1, 1, 1, 1, 1, 4, 4, 0)
    native.dwconv_qs8(x4, w4, None, scale, o4, *dgeo, -128.0, 127.0, 0)
    with pytest.raises(ValueError, match="x holds"):
        native.dwconv_qs8(x4.ravel()[:-1], w4, None, scale, o4, *dgeo, -128.0, 127.0, 0)
    with pytest.raises(ValueError, match="w holds"):
        native.dwconv_qs8(x4, w4[:2], None, scale, o4, *dgeo, -128.0, 127.0, 0)
    with pytest.raises(ValueError, match="out holds"):
        native.dwconv_qs8(x4, w4, None, scale, o4.ravel()[:-1], *dgeo, -128.0, 127.0, 0)
    with pytest.raises(ValueError, match="bias holds"):
        native.dwconv_qs8(x4, w4, np.zeros(7, np.int32), scale, o4, *dgeo, -128.0, 127.0, 0)
    with pytest.raises(ValueError, match="overlaps"):
        native.dwconv_qs8(x4, w4, None, scale, x4, *dgeo, -128.0, 127.0, 0)
    with pytest.raises(ValueError, match="inconsistent"):  # more taps than float32 sums stay exact for
        native.dwconv_qs8(x4, np.zeros(23 * 23 * 8, np.float32), None, scale, o4, 1, 4, 4, 8, 23, 23, *dgeo[6:],
                          -128.0, 127.0, 0)
    geo = (1, 2, 2, 2, 1, 2, 1, 1, 0, 0, 1, 1, 2, 1)  # a 2x2x2 image, a 1x2 kernel: 2 pixels of 4 values
    native.qs8_conv(xq, xu, wp, corr, scale, oq, *geo, 3, 0, -128.0, 127.0, 0)
    with pytest.raises(ValueError, match="x holds"):
        native.qs8_conv(xq[:1, :7], xu, wp, corr, scale, oq, *geo, 3, 0, -128.0, 127.0, 0)
    with pytest.raises(ValueError, match="out holds"):
        native.qs8_conv(xq, xu, wp, corr, scale, oq, *geo[:-2], 3, 1, 3, 0, -128.0, 127.0, 0)  # 3 pixels
    with pytest.raises(ValueError, match="inconsistent geometry"):
        native.qs8_conv(xq, xu, wp, corr, scale, oq, *geo[:6], 0, *geo[7:], 3, 0, -128.0, 127.0, 0)  # stride 0
    with pytest.raises(ValueError, match="inconsistent geometry"):
        native.qs8_conv(xq, xu, wp, corr, scale, oq, *geo[:8], -1, *geo[9:], 3, 0, -128.0, 127.0, 0)  # padding < 0
    with pytest.raises(ValueError, match="overlaps"):
        native.quantize_qs8(acc.ravel(), acc.view(np.int8).ravel(), 8, 1.0, -128.0, 127.0, 0)
    with pytest.raises(ValueError, match="out holds"):
        native.quantize_qs8(acc.ravel(), np.empty(7, np.int8), 8, 1.0, -128.0, 127.0, 0)
    with pytest.raises(ValueError, match="q holds"):
        native.dequantize_qs8(np.empty(7, np.int8), np.empty(8, np.float32), 8, 0, 1.0)
    with pytest.raises(ValueError, match="out holds"):
        native.dequantize_qs8(np.empty(8, np.int8), np.empty(7, np.float32), 8, 0, 1.0)


# -- permuted copies (the XNNPACK backend's transposes) -------------------------------------
_PERMUTES = [
    ((1, 3, 224, 224), (0, 2, 3, 1)),  # an RGB image, NCHW -> NHWC
    ((1, 72, 56, 56), (0, 2, 3, 1)),
    ((1, 56, 56, 72), (0, 3, 1, 2)),  # NHWC -> NCHW
    ((1, 3, 197, 64), (0, 1, 3, 2)),  # attention keys transposed (ViT)
    ((1, 3, 197, 64), (0, 2, 1, 3)),  # heads split
    ((1, 197, 3, 3, 64), (2, 0, 3, 1, 4)),  # q, k, v out of one product
    ((1, 128, 3, 4, 64), (2, 0, 3, 1, 4)),
    ((1, 1, 1, 576), (0, 3, 1, 2)),  # only size-1 dims move: one run
    ((5, 7, 2, 3), (3, 1, 0, 2)),
]


@needs_native
def test_permute_4b_copies_what_numpy_copies_bit_for_bit() -> None:
    """Every 4-byte pattern (NaN payloads included) lands where numpy's copy of the
    transposed view puts it: the models' transposes (the runs, the 16 x 16 tiles with their
    ragged edges, the 2-4 wide interleave of an image's channels) and random shapes."""
    rng = np.random.default_rng(7)
    cases = list(_PERMUTES)
    for nd in range(1, 7):
        for _ in range(40):
            shape = tuple(int(s) for s in rng.integers(1, 7, nd))
            cases.append((shape, tuple(int(p) for p in rng.permutation(nd))))
    done = 0
    for shape, perm in cases:
        x = rng.integers(0, 2**32, size=shape, dtype=np.uint32).view(np.float32)
        geo = kernels.permute_geometry(shape, perm)
        if geo is None:
            assert x.size < 64, (shape, perm)
            continue
        out = np.full(tuple(shape[p] for p in perm), -1, np.int32)
        native.permute_4b(x, out, geo)
        assert np.array_equal(out.view(np.uint32), x.view(np.uint32).transpose(perm)), (shape, perm)
        done += 1
    assert done > 100
    # merged: an image's NCHW -> NHWC is one 2-d transpose, size-1 dims left out
    assert kernels.permute_geometry((1, 3, 224, 224), (0, 2, 3, 1)).tolist() == [224 * 224, 3, 1, 224 * 224]
    assert kernels.permute_geometry((1, 1, 1, 576), (0, 3, 1, 2)).tolist() == [576, 1]
    assert kernels.permute_geometry((4, 4), (0, 0)) is None  # not a permutation


@needs_native
def test_permute_4b_checks_its_buffers_before_writing() -> None:
    x = np.arange(24 * 5, dtype=np.float32).reshape(4, 6, 5)
    geo = kernels.permute_geometry(x.shape, (2, 0, 1))
    out = np.zeros((5, 4, 6), np.float32)
    with pytest.raises(ValueError, match="out holds"):
        native.permute_4b(x, out.ravel()[:-1], geo)
    with pytest.raises(ValueError, match="reach"):
        native.permute_4b(x.ravel()[:-1], out, geo)
    with pytest.raises(ValueError, match="overlaps"):
        native.permute_4b(x, x.reshape(out.shape), geo)
    for bad_geo in (np.array([5, 4], np.int64)[:1], np.array([0, 1], np.int64), np.array([120, -1], np.int64),
                    np.zeros(18, np.int64), np.array([1 << 41, 1], np.int64),
                    np.array([2, 2, 1 << 39, 1 << 39], np.int64),  # reaches past 2^40 elements
                    np.array([1 << 40, 1 << 40], np.int64)):  # a reach that overflows 64 bits
        with pytest.raises(ValueError, match="geometry"):
            native.permute_4b(x, out, bad_geo)
    with pytest.raises((ValueError, BufferError), match="contiguous"):  # a strided view is no buffer
        native.permute_4b(x.transpose(1, 0, 2), out, geo)
    assert not out.any()
