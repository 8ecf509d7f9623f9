"""orchestra's compiled channels-last convolutions: dwconv_nhwc_f32 (depthwise) and
gconv_nhwc_f32 (grouped) in orchestra/runtime/kernels/_native.c.

Each is checked against a float64 numpy reference written here (a loop over the taps of a
zero-padded array) on many seeded random shapes (strides 1-3, dilation, asymmetric padding,
kernels 1x1 to 7x3, channel counts off the vectors' widths, batches, every activation and
clamp), on realistic sizes at 1 and 2 threads (where the work is split: the result must not
depend on the split), on NaN inputs, and on the copies for the instruction sets this CPU would
not pick (in a child process); and each one's own checks of the buffers and sizes it is given
are exercised directly (a bad call raises ValueError, never crashes).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from orchestra.runtime.kernels._util import load_native

native = load_native()
pytestmark = pytest.mark.skipif(native is None, reason="orchestra's compiled kernels are not built here")

INF = math.inf
CLAMPS = [(-INF, INF), (0.0, 6.0), (0.0, INF), (-1.5, 0.5)]


@pytest.fixture(autouse=True)
def _one_thread():
    """Every test starts and ends at the module's default of one thread."""
    if native is not None:
        native.set_threads(1)
    yield
    if native is not None:
        native.set_threads(1)


def out_size(n: int, k: int, s: int, p0: int, p1: int, d: int) -> int:
    return (n + p0 + p1 - d * (k - 1) - 1) // s + 1


def reference(x, w, bias, groups, kh, kw, sh, sw, pt, pl, dh, dw, ho, wo, lo, hi, act):
    """out[n, oy, ox, g goc + o] = act(clamp(bias + sum over the taps inside the image of
    x[n, iy, ix, g gic + ic] w[g, i, j, ic, o])) in float64; x (N, H, W, groups gic), w (groups,
    kh, kw, gic, goc). Also the magnitudes (|bias| + sum |x w|) the float32 rounding scales with."""
    n_, h, wd, cx = x.shape
    gic, goc = w.shape[3], w.shape[4]
    # zero padding: pt / pl above and left, and below and right as far as the last output reads
    pb = max(0, (ho - 1) * sh + (kh - 1) * dh + 1 - (h + pt))
    pr = max(0, (wo - 1) * sw + (kw - 1) * dw + 1 - (wd + pl))
    xp = np.zeros((n_, pt + h + pb, pl + wd + pr, cx))
    xp[:, pt:pt + h, pl:pl + wd] = x
    xp = xp.reshape(n_, pt + h + pb, pl + wd + pr, groups, gic)
    w64 = w.astype(np.float64)
    acc = np.zeros((n_, ho, wo, groups, goc))
    mag = np.zeros_like(acc)
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(kh):
            for j in range(kw):
                tap = xp[:, i * dh:i * dh + (ho - 1) * sh + 1:sh, j * dw:j * dw + (wo - 1) * sw + 1:sw]
                acc += np.einsum("nyxgc,gco->nyxgo", tap, w64[:, i, j])
                mag += np.einsum("nyxgc,gco->nyxgo", np.abs(tap), np.abs(w64[:, i, j]))
        acc = acc.reshape(n_, ho, wo, groups * goc)
        mag = mag.reshape(n_, ho, wo, groups * goc)
        if bias is not None:
            acc = acc + bias.astype(np.float64)
            mag = mag + np.abs(bias.astype(np.float64))
        v = np.where(acc < lo, lo, np.where(acc > hi, hi, acc))  # NaN passes
        if act == 1:
            v = np.where(v < 0, 0.0, v)
        elif act == 2:
            v = v * np.clip(v + 3.0, 0.0, 6.0) / 6.0
        elif act == 3:
            v = v / (1.0 + np.exp(-v))
    return v, mag


def assert_close(out, ref, mag):
    """float32 against the float64 reference: within 1e-5 relative, plus 1e-5 of the sum of
    the terms' magnitudes (the rounding of a float32 sum); NaN exactly where the reference's."""
    out64 = out.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(out64), np.isnan(ref))
    ok = ~np.isnan(ref)
    err = np.abs(out64[ok] - ref[ok])
    tol = 1e-5 * np.abs(ref[ok]) + 1e-5 * (mag[ok] + 1.0)
    assert np.all(err <= tol), f"max error {np.max(err - tol) if err.size else 0} past tolerance"


def run_dw(x, w, bias, k, s, pads, d, ho, wo, lo=-INF, hi=INF, act=0):
    (kh, kw), (sh, sw), (pt, pl), (dh, dw) = k, s, pads, d
    n_, h, wd, c = x.shape
    out = np.full((n_, ho, wo, c), np.float32(-7.25), np.float32)
    native.dwconv_nhwc_f32(x, w, bias, out, n_, h, wd, c, kh, kw, sh, sw, pt, pl, dh, dw, ho, wo, lo, hi, act)
    return out


def run_gconv(x, w, bias, k, s, pads, d, ho, wo, lo=-INF, hi=INF, act=0):
    (kh, kw), (sh, sw), (pt, pl), (dh, dw) = k, s, pads, d
    n_, h, wd, _ = x.shape
    groups, gic, goc = w.shape[0], w.shape[3], w.shape[4]
    out = np.full((n_, ho, wo, groups * goc), np.float32(-7.25), np.float32)
    native.gconv_nhwc_f32(x, w, bias, out, n_, h, wd, groups, gic, goc, kh, kw, sh, sw, pt, pl, dh, dw, ho, wo, lo,
                          hi, act)
    return out


def dw_as_grouped(w):
    """A depthwise weight (kh, kw, C) as the reference's (C, kh, kw, 1, 1)."""
    return np.ascontiguousarray(w.transpose(2, 0, 1))[:, :, :, None, None]


def random_case(rng, grouped: bool):
    kh, kw = [(1, 1), (3, 3), (5, 5), (7, 3), (3, 5), (2, 2)][rng.integers(6)]
    sh, sw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    dh, dw = int(rng.choice([1, 1, 2])), int(rng.choice([1, 1, 2]))
    pt, pl = int(rng.integers(0, kh + 1)), int(rng.integers(0, kw + 1))  # pt != pl often
    pb, pr = int(rng.integers(0, kh + 1)), int(rng.integers(0, kw + 1))
    n_ = int(rng.integers(1, 3))
    h = int(rng.integers(max(1, dh * (kh - 1) + 1 - pt - pb), 21))
    wd = int(rng.integers(max(1, dw * (kw - 1) + 1 - pl - pr), 27))
    ho, wo = out_size(h, kh, sh, pt, pb, dh), out_size(wd, kw, sw, pl, pr, dw)
    if grouped:
        groups = int(rng.choice([1, 2, 3, 5]))
        gic, goc = int(rng.choice([1, 3, 8, 12, 16])), int(rng.choice([1, 3, 8, 12, 16, 24]))
        shape_w = (groups, kh, kw, gic, goc)
        cx, cy = groups * gic, groups * goc
    else:
        cx = cy = int(rng.choice([1, 3, 7, 13, 16, 24, 40, 72, 128]))
        shape_w = (kh, kw, cx)
    x = rng.standard_normal((n_, h, wd, cx), dtype=np.float32)
    w = rng.standard_normal(shape_w, dtype=np.float32)
    bias = rng.standard_normal(cy, dtype=np.float32) if rng.integers(2) else None
    lo, hi = CLAMPS[rng.integers(len(CLAMPS))]
    act = int(rng.integers(4))
    return x, w, bias, (kh, kw), (sh, sw), (pt, pl), (dh, dw), ho, wo, lo, hi, act


@pytest.mark.parametrize("seed", range(80))
def test_depthwise_random_shapes(seed: int) -> None:
    rng = np.random.default_rng(1000 + seed)
    x, w, bias, k, s, pads, d, ho, wo, lo, hi, act = random_case(rng, grouped=False)
    out = run_dw(x, w, bias, k, s, pads, d, ho, wo, lo, hi, act)
    ref, mag = reference(x, dw_as_grouped(w), bias, x.shape[3], *k, *s, *pads, *d, ho, wo, lo, hi, act)
    assert_close(out, ref, mag)


@pytest.mark.parametrize("seed", range(80))
def test_grouped_random_shapes(seed: int) -> None:
    rng = np.random.default_rng(5000 + seed)
    x, w, bias, k, s, pads, d, ho, wo, lo, hi, act = random_case(rng, grouped=True)
    out = run_gconv(x, w, bias, k, s, pads, d, ho, wo, lo, hi, act)
    ref, mag = reference(x, w, bias, w.shape[0], *k, *s, *pads, *d, ho, wo, lo, hi, act)
    assert_close(out, ref, mag)


# (C, H, W, k, stride, (pt, pl), dilation): channel counts off and on the vectors' widths (the
# blocks of 16 / 8, the last one overlapping, C < 16 padded, C a multiple of 128 through the
# ring), maps narrower than a tile, asymmetric padding, dilation
DW_CASES = [
    (1, 9, 11, 3, 1, (1, 1), 1), (3, 10, 13, 3, 2, (1, 0), 1), (7, 12, 9, 5, 1, (2, 2), 1),
    (13, 8, 17, 3, 1, (0, 2), 2), (24, 15, 15, 5, 2, (2, 1), 1), (72, 14, 14, 3, 1, (1, 1), 1),
    (128, 7, 7, 5, 1, (2, 2), 1), (1152, 7, 7, 5, 1, (2, 2), 1), (40, 5, 30, 7, 3, (3, 0), 1),
    (17, 3, 3, 3, 1, (1, 1), 1), (33, 20, 6, 3, 3, (0, 1), 2), (256, 6, 9, 3, 2, (1, 1), 1),
]


@pytest.mark.parametrize("act", [0, 1, 2, 3])
@pytest.mark.parametrize("case", DW_CASES, ids=lambda c: f"C{c[0]}_{c[1]}x{c[2]}_k{c[3]}s{c[4]}")
def test_depthwise_each_activation(case, act: int) -> None:
    c, h, wd, k, s, (pt, pl), d = case
    rng = np.random.default_rng(c * 31 + h)
    ho, wo = out_size(h, k, s, pt, pt, d), out_size(wd, k, s, pl, pl + 1, d)
    x = rng.standard_normal((2, h, wd, c), dtype=np.float32) * 2
    w = rng.standard_normal((k, k, c), dtype=np.float32)
    for bias in (None, rng.standard_normal(c, dtype=np.float32)):
        for lo, hi in CLAMPS:
            out = run_dw(x, w, bias, (k, k), (s, s), (pt, pl), (d, d), ho, wo, lo, hi, act)
            ref, mag = reference(x, dw_as_grouped(w), bias, c, k, k, s, s, pt, pl, d, d, ho, wo, lo, hi, act)
            assert_close(out, ref, mag)


# (groups, gic, goc, H, W, k, stride, (pt, pl), dilation): RegNetX's group width 8, output
# channels off the 8-wide vectors (tails 1, 3, 12), 16 and 24 (two vectors a group), one group
GC_CASES = [
    (3, 8, 8, 9, 11, 3, 1, (1, 1), 1), (7, 8, 8, 8, 8, 3, 2, (1, 1), 1), (4, 16, 16, 7, 9, 3, 1, (1, 0), 1),
    (2, 3, 12, 10, 10, 5, 2, (2, 2), 1), (5, 1, 1, 6, 13, 3, 1, (0, 2), 2), (1, 3, 16, 13, 13, 3, 2, (1, 1), 1),
    (3, 12, 3, 5, 20, 7, 3, (3, 1), 1), (2, 24, 24, 6, 6, 3, 1, (1, 1), 1), (19, 8, 8, 4, 4, 3, 1, (1, 1), 1),
]


@pytest.mark.parametrize("act", [0, 1, 2, 3])
@pytest.mark.parametrize("case", GC_CASES, ids=lambda c: f"g{c[0]}x{c[1]}to{c[2]}_{c[3]}x{c[4]}_k{c[5]}s{c[6]}")
def test_grouped_each_activation(case, act: int) -> None:
    groups, gic, goc, h, wd, k, s, (pt, pl), d = case
    rng = np.random.default_rng(groups * 97 + gic * 7 + goc)
    ho, wo = out_size(h, k, s, pt, pt + 1, d), out_size(wd, k, s, pl, pl, d)
    x = rng.standard_normal((2, h, wd, groups * gic), dtype=np.float32)
    w = rng.standard_normal((groups, k, k, gic, goc), dtype=np.float32) * 0.5
    for bias in (None, rng.standard_normal(groups * goc, dtype=np.float32)):
        for lo, hi in CLAMPS:
            out = run_gconv(x, w, bias, (k, k), (s, s), (pt, pl), (d, d), ho, wo, lo, hi, act)
            ref, mag = reference(x, w, bias, groups, k, k, s, s, pt, pl, d, d, ho, wo, lo, hi, act)
            assert_close(out, ref, mag)


def test_outputs_past_the_image_are_bias_alone() -> None:
    """Ho / Wo are the caller's: output pixels whose taps all fall in the padding (here the
    padding is wider than the kernel's reach) read zeros and are the bias, activated."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 4, 5, 20), dtype=np.float32)
    w = rng.standard_normal((3, 3, 20), dtype=np.float32)
    b = rng.standard_normal(20, dtype=np.float32)
    out = run_dw(x, w, b, (3, 3), (1, 1), (6, 7), (1, 1), 10, 12, act=1)
    ref, mag = reference(x, dw_as_grouped(w), b, 20, 3, 3, 1, 1, 6, 7, 1, 1, 10, 12, -INF, INF, 1)
    assert_close(out, ref, mag)
    np.testing.assert_array_equal(out[0, 0, 0], np.maximum(b, 0))
    wg = rng.standard_normal((4, 3, 3, 5, 8), dtype=np.float32)
    out = run_gconv(x, wg, None, (3, 3), (2, 1), (5, 4), (1, 1), 7, 11)
    ref, mag = reference(x, wg, None, 4, 3, 3, 2, 1, 5, 4, 1, 1, 7, 11, -INF, INF, 0)
    assert_close(out, ref, mag)


@pytest.mark.parametrize("act", [0, 1, 2, 3])
def test_nan_in_the_input_reaches_exactly_the_outputs_reading_it(act: int) -> None:
    rng = np.random.default_rng(11 + act)
    for c in (5, 24, 128):
        x = rng.standard_normal((1, 9, 10, c), dtype=np.float32)
        x[0, 0, 0, 0] = np.nan
        x[0, 4, 7, c - 1] = np.nan
        x[0, 8, 9, c // 2] = np.nan
        w = rng.standard_normal((3, 3, c), dtype=np.float32)
        for lo, hi in CLAMPS:
            out = run_dw(x, w, None, (3, 3), (1, 1), (1, 1), (1, 1), 9, 10, lo, hi, act)
            ref, mag = reference(x, dw_as_grouped(w), None, c, 3, 3, 1, 1, 1, 1, 1, 1, 9, 10, lo, hi, act)
            assert_close(out, ref, mag)
            assert np.isnan(out).sum() == 4 + 9 + 4  # (the corners' 2 x 2 outputs, the inner pixel's 3 x 3)
    x = rng.standard_normal((1, 8, 8, 24), dtype=np.float32)
    x[0, 3, 3, 9] = np.nan  # group 1 of 3 (gic 8): its 8 outputs at the 9 pixels reading it
    w = rng.standard_normal((3, 3, 3, 8, 8), dtype=np.float32)
    out = run_gconv(x, w, None, (3, 3), (1, 1), (1, 1), (1, 1), 8, 8, 0.0, 6.0, act)
    ref, mag = reference(x, w, None, 3, 3, 3, 1, 1, 1, 1, 1, 1, 8, 8, 0.0, 6.0, act)
    assert_close(out, ref, mag)
    assert np.isnan(out).sum() == 9 * 8 and np.isnan(out[..., 8:16]).sum() == 9 * 8


# realistic sizes, big enough that 2 threads split them (by rows, or by channels / groups
# where the rows are few)
REAL_DW = [(1, 112, 112, 16, 3, 2, 1), (1, 56, 56, 72, 3, 1, 1), (1, 28, 28, 96, 5, 2, 2), (1, 14, 14, 576, 5, 1, 2),
           (1, 7, 7, 1152, 5, 1, 2), (2, 14, 14, 480, 3, 1, 1)]
REAL_GC = [(1, 56, 56, 3, 8, 8, 3, 1, 1), (1, 112, 112, 3, 8, 8, 3, 2, 1), (1, 7, 7, 46, 8, 8, 3, 1, 1),
           (1, 28, 28, 8, 16, 16, 3, 1, 1), (2, 14, 14, 19, 8, 8, 3, 2, 1)]


@pytest.mark.parametrize("case", REAL_DW, ids=lambda c: f"{c[1]}x{c[2]}x{c[3]}_k{c[4]}s{c[5]}")
def test_depthwise_realistic_sizes_one_and_two_threads(case) -> None:
    n_, h, wd, c, k, s, p = case
    rng = np.random.default_rng(h * c)
    ho, wo = out_size(h, k, s, p, p, 1), out_size(wd, k, s, p, p, 1)
    x = rng.standard_normal((n_, h, wd, c), dtype=np.float32)
    w = rng.standard_normal((k, k, c), dtype=np.float32)
    b = rng.standard_normal(c, dtype=np.float32)
    ref, mag = reference(x, dw_as_grouped(w), b, c, k, k, s, s, p, p, 1, 1, ho, wo, 0.0, 6.0, 2)
    outs = []
    for threads in (1, 2):
        native.set_threads(threads)
        outs.append(run_dw(x, w, b, (k, k), (s, s), (p, p), (1, 1), ho, wo, 0.0, 6.0, 2))
        assert_close(outs[-1], ref, mag)
    np.testing.assert_array_equal(outs[0], outs[1])  # the split changes nothing


@pytest.mark.parametrize("case", REAL_GC, ids=lambda c: f"{c[1]}x{c[2]}_g{c[3]}x{c[4]}_s{c[7]}")
def test_grouped_realistic_sizes_one_and_two_threads(case) -> None:
    n_, h, wd, groups, gic, goc, k, s, p = case
    rng = np.random.default_rng(h * groups)
    ho, wo = out_size(h, k, s, p, p, 1), out_size(wd, k, s, p, p, 1)
    x = rng.standard_normal((n_, h, wd, groups * gic), dtype=np.float32)
    w = rng.standard_normal((groups, k, k, gic, goc), dtype=np.float32) * 0.3
    b = rng.standard_normal(groups * goc, dtype=np.float32)
    ref, mag = reference(x, w, b, groups, k, k, s, s, p, p, 1, 1, ho, wo, -INF, INF, 1)
    outs = []
    for threads in (1, 2):
        native.set_threads(threads)
        outs.append(run_gconv(x, w, b, (k, k), (s, s), (p, p), (1, 1), ho, wo, -INF, INF, 1))
        assert_close(outs[-1], ref, mag)
    np.testing.assert_array_equal(outs[0], outs[1])


def test_silu_is_the_modules_silu() -> None:
    """act 3 is silu_f32's silu, bit for bit (the same vector code), applied after the clamp."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 6, 7, 40), dtype=np.float32) * 4
    w = np.zeros((1, 1, 40), np.float32)
    w[0, 0] = 1.0
    pre = run_dw(x, w, None, (1, 1), (1, 1), (0, 0), (1, 1), 6, 7, -2.0, 3.0, 0)
    got = run_dw(x, w, None, (1, 1), (1, 1), (0, 0), (1, 1), 6, 7, -2.0, 3.0, 3)
    want = np.empty_like(pre)
    native.silu_f32(pre, want, pre.size)
    np.testing.assert_array_equal(got, want)
    wg = np.zeros((5, 1, 1, 8, 8), np.float32)
    for g in range(5):
        wg[g, 0, 0] = np.eye(8, dtype=np.float32)
    got = run_gconv(x, wg, None, (1, 1), (1, 1), (0, 0), (1, 1), 6, 7, -2.0, 3.0, 3)
    np.testing.assert_array_equal(got, want)


def test_zero_images_or_outputs_do_nothing() -> None:
    x = np.ones((0, 4, 4, 8), np.float32)
    out = np.zeros((0, 4, 4, 8), np.float32)
    native.dwconv_nhwc_f32(x, np.ones((3, 3, 8), np.float32), None, out, 0, 4, 4, 8, 3, 3, 1, 1, 1, 1, 1, 1, 4, 4,
                           -INF, INF, 0)
    native.gconv_nhwc_f32(x, np.ones((2, 3, 3, 4, 4), np.float32), None, out, 0, 4, 4, 2, 4, 4, 3, 3, 1, 1, 1, 1, 1, 1,
                          4, 4, -INF, INF, 0)


# ---- the kernels' own checks: a bad call raises ValueError, never touches memory it lacks ----

def dw_args(**kw):
    a = dict(x=np.ones((2, 6, 7, 20), np.float32), w=np.ones((3, 3, 20), np.float32), b=np.ones(20, np.float32),
             out=np.zeros((2, 6, 7, 20), np.float32), N=2, H=6, W=7, C=20, kh=3, kw=3, sh=1, sw=1, pt=1, pl=1, dh=1,
             dw=1, Ho=6, Wo=7, lo=-INF, hi=INF, act=0)
    a.update(kw)
    return [a[k] for k in ("x", "w", "b", "out", "N", "H", "W", "C", "kh", "kw", "sh", "sw", "pt", "pl", "dh", "dw",
                           "Ho", "Wo", "lo", "hi", "act")]


def gc_args(**kw):
    a = dict(x=np.ones((2, 6, 7, 24), np.float32), w=np.ones((3, 3, 3, 8, 4), np.float32), b=np.ones(12, np.float32),
             out=np.zeros((2, 6, 7, 12), np.float32), N=2, H=6, W=7, G=3, gic=8, goc=4, kh=3, kw=3, sh=1, sw=1, pt=1,
             pl=1, dh=1, dw=1, Ho=6, Wo=7, lo=-INF, hi=INF, act=0)
    a.update(kw)
    return [a[k] for k in ("x", "w", "b", "out", "N", "H", "W", "G", "gic", "goc", "kh", "kw", "sh", "sw", "pt", "pl",
                           "dh", "dw", "Ho", "Wo", "lo", "hi", "act")]


def test_the_argument_helpers_make_good_calls() -> None:
    native.dwconv_nhwc_f32(*dw_args())
    native.gconv_nhwc_f32(*gc_args())


BAD_SIZES = [dict(kh=0), dict(kw=-1), dict(sh=0), dict(sw=-2), dict(dh=0), dict(dw=-1), dict(pt=-1), dict(pl=-3),
             dict(H=0), dict(W=-1), dict(N=-1), dict(Ho=-1), dict(Wo=-2), dict(H=1 << 25), dict(N=1 << 30),
             dict(kh=1 << 25), dict(sh=1 << 40), dict(pt=1 << 25), dict(Ho=1 << 20, Wo=1 << 20)]


@pytest.mark.parametrize("bad", BAD_SIZES, ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
def test_bad_sizes_raise(bad) -> None:
    with pytest.raises(ValueError):
        native.dwconv_nhwc_f32(*dw_args(**bad))
    with pytest.raises(ValueError):
        native.gconv_nhwc_f32(*gc_args(**bad))


@pytest.mark.parametrize("bad", [dict(C=0), dict(C=-4)])
def test_bad_depthwise_channels_raise(bad) -> None:
    with pytest.raises(ValueError):
        native.dwconv_nhwc_f32(*dw_args(**bad))


@pytest.mark.parametrize("bad", [dict(G=0), dict(gic=0), dict(goc=-1), dict(G=1 << 25), dict(gic=1 << 13, G=1 << 12)])
def test_bad_group_sizes_raise(bad) -> None:
    with pytest.raises(ValueError):
        native.gconv_nhwc_f32(*gc_args(**bad))


@pytest.mark.parametrize("act", [-1, 4, 99])
def test_unknown_activation_raises(act: int) -> None:
    with pytest.raises(ValueError, match="activation"):
        native.dwconv_nhwc_f32(*dw_args(act=act))
    with pytest.raises(ValueError, match="activation"):
        native.gconv_nhwc_f32(*gc_args(act=act))


def test_too_small_buffers_raise() -> None:
    """Each buffer one float short of what the sizes reach (or sizes past the buffers)."""
    f = np.float32
    short_dw = [dict(x=np.ones(2 * 6 * 7 * 20 - 1, f)), dict(w=np.ones(3 * 3 * 20 - 1, f)), dict(b=np.ones(19, f)),
                dict(out=np.zeros(2 * 6 * 7 * 20 - 1, f)), dict(Ho=7), dict(Wo=8), dict(N=3), dict(H=7), dict(C=21),
                dict(kh=5, pt=2, x=np.ones(10, f)), dict(kw=4)]
    for bad in short_dw:
        with pytest.raises(ValueError):
            native.dwconv_nhwc_f32(*dw_args(**bad))
    short_gc = [dict(x=np.ones(2 * 6 * 7 * 24 - 1, f)), dict(w=np.ones(3 * 9 * 8 * 4 - 1, f)), dict(b=np.ones(11, f)),
                dict(out=np.zeros(2 * 6 * 7 * 12 - 1, f)), dict(goc=5), dict(gic=9), dict(G=4), dict(Wo=8), dict(kh=4)]
    for bad in short_gc:
        with pytest.raises(ValueError):
            native.gconv_nhwc_f32(*gc_args(**bad))


def test_out_overlapping_an_operand_raises() -> None:
    buf = np.ones(2 * 6 * 7 * 20 + 100, np.float32)
    x, out = buf[:2 * 6 * 7 * 20], buf[100:]
    with pytest.raises(ValueError, match="overlaps"):
        native.dwconv_nhwc_f32(*dw_args(x=x, out=out))
    with pytest.raises(ValueError, match="overlaps"):
        native.dwconv_nhwc_f32(*dw_args(x=x, out=x))
    w = np.ones(2 * 6 * 7 * 20, np.float32)
    with pytest.raises(ValueError, match="overlaps"):
        native.dwconv_nhwc_f32(*dw_args(w=w, out=w))
    b = np.ones(2 * 6 * 7 * 20, np.float32)
    with pytest.raises(ValueError, match="overlaps"):
        native.dwconv_nhwc_f32(*dw_args(b=b, out=b))
    gbuf = np.ones(2 * 6 * 7 * 24, np.float32)
    with pytest.raises(ValueError, match="overlaps"):
        native.gconv_nhwc_f32(*gc_args(x=gbuf, out=gbuf[:2 * 6 * 7 * 12]))
    wbuf = np.ones(3 * 9 * 8 * 4 + 2 * 6 * 7 * 12, np.float32)
    with pytest.raises(ValueError, match="overlaps"):
        native.gconv_nhwc_f32(*gc_args(w=wbuf, out=wbuf[3 * 9 * 8 * 4 - 1:-1]))


def test_buffers_of_the_wrong_kind_raise() -> None:
    with pytest.raises((TypeError, ValueError, BufferError)):
        native.dwconv_nhwc_f32(*dw_args(out=np.zeros((2, 6, 7, 20), np.float32)[:, ::-1]))  # not contiguous
    with pytest.raises((TypeError, ValueError, BufferError)):
        native.dwconv_nhwc_f32(*dw_args(b=[1.0] * 20))
    ro = np.zeros((2, 6, 7, 20), np.float32)
    ro.flags.writeable = False
    with pytest.raises((TypeError, ValueError, BufferError)):
        native.dwconv_nhwc_f32(*dw_args(out=ro))


@pytest.mark.parametrize("isa", ["v3", "baseline"])
def test_the_copies_this_cpu_would_not_pick(isa: str) -> None:
    """The kernels have one copy per instruction set (AVX-512, AVX2 + FMA, baseline), picked at
    load; ORCHESTRA_NATIVE_ISA lowers the pick, so the copies this CPU would not use run the
    shape tests too (in a child process, which picks again)."""
    if native.ISA_LEVEL == 0:
        pytest.skip("this CPU runs the baseline copy already")
    if native.ISA_LEVEL == 3 and isa == "v3":
        pytest.skip("this CPU runs the AVX2 copy already")
    tests = "random_shapes or each_activation or realistic or nan or silu or past_the_image"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", tests],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ, ORCHESTRA_NATIVE_ISA=isa))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


# -- mul_rows_f32: channels-last data scaled per image and channel (squeeze-and-excite) --------
@pytest.mark.parametrize("shape", [(1, 56 * 56, 72), (2, 14 * 14, 120), (1, 7 * 7, 576), (3, 5, 13), (1, 1, 1)])
@pytest.mark.parametrize("threads", [1, 2])
def test_mul_rows_is_numpys_product(shape: tuple[int, int, int], threads: int) -> None:
    """The same bits as numpy's broadcast multiply (one float32 rounding per element), into
    another buffer and in place, at 1 and 2 threads; NaN and inf pass as numpy's do."""
    native.set_threads(threads)
    n, p, c = shape
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    x.flat[:: max(1, x.size // 7)] = np.nan
    s = rng.standard_normal((n, 1, c)).astype(np.float32)
    s.flat[0] = np.inf
    want = x * s
    out = np.full_like(x, 7.0)
    native.mul_rows_f32(x, s, out, n, p, c)
    np.testing.assert_array_equal(out, want)
    native.mul_rows_f32(x, s, x, n, p, c)
    np.testing.assert_array_equal(x, want)


def test_mul_rows_checks_its_buffers() -> None:
    x = np.ones((2, 6, 4), np.float32)
    s = np.ones((2, 4), np.float32)
    out = np.empty_like(x)
    for bad in ((x, s, out, 2, 7, 4), (x, s[:1], out, 2, 6, 4), (x, s, out[:1], 2, 6, 4), (x, s, out, 0, 6, 4),
                (x, s, out, 2, -1, 4), (x, s, out, 1 << 31, 1 << 31, 1 << 31)):
        with pytest.raises(ValueError):
            native.mul_rows_f32(*bad)
    with pytest.raises(ValueError, match="overlaps"):
        native.mul_rows_f32(x, s, x.reshape(-1)[4:], 2, 5, 4)  # out on x, shifted
    with pytest.raises(ValueError, match="overlaps"):
        native.mul_rows_f32(x, x.reshape(-1)[:8], x, 2, 6, 4)  # s on out
    with pytest.raises(TypeError):
        native.mul_rows_f32(x, s, bytes(x.nbytes), 2, 6, 4)  # a read-only out
