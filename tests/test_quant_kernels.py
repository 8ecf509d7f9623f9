"""The quantization kernels against ExecuTorch's own quantized kernels and torch's reference.

ExecuTorch ships its portable quantized kernels for torch as ``executorch.kernels.quantized``
(the ``.out`` overloads of ``quantized_decomposed::*`` become ExecuTorch's C++ kernels once it
is imported): those are the reference, bit for bit. torch's decomposed reference ops (the
functional overloads) are checked too, on values where the two definitions agree (finite
inputs). Kernels are called exactly as the interpreter calls them: schema order, ``out``
included.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from orchestra.errors import Error, OrchestraError
from orchestra.program import ScalarType
from orchestra.runtime.kernels import get_kernel
from orchestra.runtime.kernels._quant import qparams_from_min_max

torch = pytest.importorskip("torch")
# torch's reference ops (the functional overloads of quantized_decomposed::*).
pytest.importorskip("torch.ao.quantization.fx._decomposed")

_Q = "quantized_decomposed::"
_NP_TO_ST = {
    np.dtype(np.uint8): ScalarType.BYTE,
    np.dtype(np.int8): ScalarType.CHAR,
    np.dtype(np.int16): ScalarType.SHORT,
    np.dtype(np.int32): ScalarType.INT,
    np.dtype(np.uint16): ScalarType.UINT16,
    np.dtype(np.float16): ScalarType.HALF,
    np.dtype(np.float32): ScalarType.FLOAT,
    np.dtype(np.float64): ScalarType.DOUBLE,
}
_NP_TO_TORCH = {
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.int8): torch.int8,
    np.dtype(np.int16): torch.int16,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.uint16): torch.uint16,
    np.dtype(np.float16): torch.float16,
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float64): torch.float64,
}
_QRANGE = {np.dtype(t): (np.iinfo(t).min, np.iinfo(t).max) for t in (np.uint8, np.int8, np.int16)}


@pytest.fixture(scope="module")
def et_ops() -> Any:
    """torch.ops.quantized_decomposed with ExecuTorch's quantized kernels loaded."""
    pytest.importorskip("executorch.kernels.quantized")
    import executorch.kernels.quantized  # noqa: F401

    ops = torch.ops.quantized_decomposed
    if not hasattr(ops.quantize_per_tensor, "out"):
        pytest.skip("ExecuTorch's quantized kernels are not registered with torch")
    return ops


def _call(name: str, *args: Any) -> Any:
    kd = get_kernel(_Q + name)
    assert kd is not None, f"no kernel for {_Q + name}"
    return kd.fn(*args[: kd.num_params])


def _t(a: np.ndarray) -> Any:
    return torch.from_numpy(np.ascontiguousarray(a))


def _edge_floats(scale: float, zp: int, dt: np.dtype, rng: np.random.Generator) -> np.ndarray:
    """Ties at every half step, values just around them, saturation, and random values."""
    qmin, qmax = _QRANGE.get(dt, (-128, 127))
    steps = np.arange(qmin - zp - 4, qmax - zp + 4, 0.5, dtype=np.float64)
    ties = (steps * scale).astype(np.float32)
    near = np.concatenate([np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf)])
    rand = rng.standard_normal(512).astype(np.float32) * (qmax - qmin) * scale / 4
    big = np.array([1e6, -1e6, 3.4e38, -3.4e38, 0.0, -0.0], np.float32)
    return np.concatenate([ties, near, rand, big]).astype(np.float32)


# --------------------------------------------------------------------------- quantize


@pytest.mark.executorch
@pytest.mark.parametrize(
    ("scale", "zp", "dt"),
    [(0.05, 0, np.int8), (0.1, -3, np.int8), (0.02, 128, np.uint8), (1.0, 7, np.int16),
     (0.0123, 0, np.int8), (1 / 3, 5, np.uint8)],
)
def test_quantize_per_tensor_matches_executorch(et_ops: Any, scale: float, zp: int, dt: Any) -> None:
    dt = np.dtype(dt)
    qmin, qmax = _QRANGE[dt]
    x = _edge_floats(scale, zp, dt, np.random.default_rng(0))
    out = np.zeros(x.shape, dt)
    got = _call("quantize_per_tensor.out", x, scale, zp, qmin, qmax, int(_NP_TO_ST[dt]), out)
    assert got is out
    want = torch.empty(x.shape, dtype=_NP_TO_TORCH[dt])
    et_ops.quantize_per_tensor.out(_t(x), scale, zp, qmin, qmax, _NP_TO_TORCH[dt], out=want)
    np.testing.assert_array_equal(got, want.numpy())
    # torch's reference op (round-half-to-even, clamp) agrees wherever the product fits an
    # int64 (beyond that torch saturates to quant_max and ExecuTorch's x86 cast gives
    # quant_min), up to exact ties, which its double-precision reciprocal may round the other
    # way; away from ties it agrees exactly.
    ref = torch.ops.quantized_decomposed.quantize_per_tensor(_t(x), scale, zp, qmin, qmax, _NP_TO_TORCH[dt])
    fits = np.abs(x.astype(np.float64) / scale) < 1e15
    assert not fits.all()
    diff = np.abs(got[fits].astype(int) - ref.numpy()[fits].astype(int))
    assert diff.max() <= 1
    q = x[fits].astype(np.float64) / scale
    away = np.abs(q - np.floor(q) - 0.5) > 1e-3
    assert (diff[away] == 0).all()


@pytest.mark.executorch
def test_quantize_ties_round_half_to_even_and_saturate(et_ops: Any) -> None:
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, 127.5, 200.0, -128.5, -129.5, -1e9], np.float32)
    got = _call("quantize_per_tensor.out", x, 1.0, 0, -128, 127, int(ScalarType.CHAR), np.zeros(x.shape, np.int8))
    np.testing.assert_array_equal(got, [0, 2, 2, 0, -2, -2, 126, 127, 127, -128, -128, -128])
    want = torch.empty(x.shape, dtype=torch.int8)
    et_ops.quantize_per_tensor.out(_t(x), 1.0, 0, -128, 127, torch.int8, out=want)
    np.testing.assert_array_equal(got, want.numpy())
    # quant_min/quant_max narrower than the dtype clamp too (XNNPACK weights use -127).
    got = _call("quantize_per_tensor.out", x, 1.0, 0, -127, 100, int(ScalarType.CHAR), np.zeros(x.shape, np.int8))
    assert got.min() == -127 and got.max() == 100


@pytest.mark.executorch
def test_quantize_nan_and_inf_like_executorch(et_ops: Any) -> None:
    """ExecuTorch's x86 kernel casts a NaN/inf/huge product to int64 (INT64_MIN) and clamps:
    every such element becomes quant_min. The kernel does the same."""
    x = np.array([np.nan, np.inf, -np.inf, 1e30, -1e30, 1.0], np.float32)
    for dt, qmin, qmax in ((np.int8, -128, 127), (np.uint8, 0, 255)):
        code = int(_NP_TO_ST[np.dtype(dt)])
        got = _call("quantize_per_tensor.out", x, 0.5, 3, qmin, qmax, code, np.zeros(x.shape, dt))
        want = torch.empty(x.shape, dtype=_NP_TO_TORCH[np.dtype(dt)])
        et_ops.quantize_per_tensor.out(_t(x), 0.5, 3, qmin, qmax, _NP_TO_TORCH[np.dtype(dt)], out=want)
        np.testing.assert_array_equal(got, want.numpy())
    # A zero scale makes every product inf or NaN.
    got = _call("quantize_per_tensor.out", x[5:], 0.0, 0, -128, 127, int(ScalarType.CHAR), np.zeros(1, np.int8))
    want = torch.empty(1, dtype=torch.int8)
    et_ops.quantize_per_tensor.out(_t(x[5:]), 0.0, 0, -128, 127, torch.int8, out=want)
    np.testing.assert_array_equal(got, want.numpy())


@pytest.mark.executorch
@pytest.mark.parametrize("in_dt", [np.float16, np.float64])
def test_quantize_half_and_double_inputs(et_ops: Any, in_dt: Any) -> None:
    x = _edge_floats(0.037, 2, np.dtype(np.int8), np.random.default_rng(1))
    x = x[np.abs(x) < 6e4].astype(in_dt)  # float16's range
    got = _call("quantize_per_tensor.out", x, 0.037, 2, -128, 127, int(ScalarType.CHAR), np.zeros(x.shape, np.int8))
    want = torch.empty(x.shape, dtype=torch.int8)
    et_ops.quantize_per_tensor.out(_t(x), 0.037, 2, -128, 127, torch.int8, out=want)
    np.testing.assert_array_equal(got, want.numpy())


@pytest.mark.executorch
def test_quantize_per_tensor_tensor_out(et_ops: Any) -> None:
    x = np.random.default_rng(2).standard_normal((3, 17)).astype(np.float32)
    s, zp = np.array([0.013], np.float64), np.array([-7], np.int64)
    got = _call("quantize_per_tensor.Tensor_out", x, s, zp, -128, 127, int(ScalarType.CHAR), np.zeros(x.shape, np.int8))
    want = torch.empty(x.shape, dtype=torch.int8)
    et_ops.quantize_per_tensor.Tensor_out(_t(x), _t(s), _t(zp), -128, 127, torch.int8, out=want)
    np.testing.assert_array_equal(got, want.numpy())
    with pytest.raises(OrchestraError, match="scale must be a float64") as exc:
        _call("quantize_per_tensor.Tensor_out", x, s.astype(np.float32), zp, -128, 127,
              int(ScalarType.CHAR), np.zeros(x.shape, np.int8))
    assert exc.value.code == Error.InvalidArgument
    with pytest.raises(OrchestraError, match="exactly one element"):
        _call("quantize_per_tensor.Tensor_out", x, np.array([0.1, 0.2]), zp, -128, 127,
              int(ScalarType.CHAR), np.zeros(x.shape, np.int8))


@pytest.mark.executorch
@pytest.mark.parametrize("axis", [0, 1, -1, 3])
def test_quantize_per_channel_every_axis(et_ops: Any, axis: int) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 3, 5, 6)).astype(np.float32)
    n = x.shape[axis]
    scales = rng.uniform(0.005, 0.05, n).astype(np.float64)
    zps = rng.integers(-10, 10, n).astype(np.int64)
    # exact ties for channel 0
    x.reshape(-1)[:8] = (np.arange(8) + 0.5) * scales[0] if axis in (0,) else x.reshape(-1)[:8]
    got = _call("quantize_per_channel.out", x, scales, zps, axis, -128, 127, int(ScalarType.CHAR), np.zeros(x.shape, np.int8))
    want = torch.empty(x.shape, dtype=torch.int8)
    et_ops.quantize_per_channel.out(_t(x), _t(scales), _t(zps), axis, -128, 127, torch.int8, out=want)
    np.testing.assert_array_equal(got, want.numpy())
    ax = axis % x.ndim
    # torch's reference divides by the scale where ExecuTorch multiplies by a float32
    # reciprocal: exact ties may round the other way, never further than one step.
    ref = torch.ops.quantized_decomposed.quantize_per_channel(_t(x), _t(scales), _t(zps), ax, -128, 127, torch.int8)
    assert np.abs(got.astype(int) - ref.numpy().astype(int)).max() <= 1


# --------------------------------------------------------------------------- dequantize


@pytest.mark.executorch
@pytest.mark.parametrize(("dt", "zp"), [(np.int8, 0), (np.int8, -5), (np.uint8, 128), (np.int16, 3), (np.int32, 11)])
@pytest.mark.parametrize("out_dt", [np.float32, np.float16, np.float64])
def test_dequantize_per_tensor_matches_executorch(et_ops: Any, dt: Any, zp: int, out_dt: Any) -> None:
    dt = np.dtype(dt)
    info = np.iinfo(dt)
    lo, hi = max(info.min, -40000), min(info.max, 40000)
    q = np.concatenate([np.arange(lo, min(hi, lo + 300)), np.arange(max(lo, hi - 300), hi + 1)]).astype(dt)
    code = int(_NP_TO_ST[dt])
    out_code = int(_NP_TO_ST[np.dtype(out_dt)])
    out = np.zeros(q.shape, out_dt)
    got = _call("dequantize_per_tensor.out", q, 0.0371, zp, int(lo), int(hi), code, out_code, out)
    assert got is out
    want = torch.empty(q.shape, dtype=_NP_TO_TORCH[np.dtype(out_dt)])
    et_ops.dequantize_per_tensor.out(_t(q), 0.0371, zp, int(lo), int(hi), _NP_TO_TORCH[dt],
                                     out_dtype=_NP_TO_TORCH[np.dtype(out_dt)], out=want)
    np.testing.assert_array_equal(got, want.numpy())
    if out_dt is np.float32:
        # out_dtype may be left out: out decides.
        got2 = _call("dequantize_per_tensor.out", q, 0.0371, zp, int(lo), int(hi), code, None, np.zeros(q.shape, np.float32))
        np.testing.assert_array_equal(got2, got)
        ref = torch.ops.quantized_decomposed.dequantize_per_tensor(_t(q), 0.0371, zp, int(lo), int(hi), _NP_TO_TORCH[dt])
        np.testing.assert_allclose(got, ref.numpy(), rtol=1e-6, atol=0)


@pytest.mark.executorch
def test_dequantize_per_tensor_tensor_out(et_ops: Any) -> None:
    q = np.arange(-128, 128, dtype=np.int8).reshape(16, 16)
    s, zp = np.array([0.25], np.float64), np.array([3], np.int64)
    got = _call("dequantize_per_tensor.Tensor_out", q, s, zp, -128, 127, int(ScalarType.CHAR), None, np.zeros(q.shape, np.float32))
    want = torch.empty(q.shape, dtype=torch.float32)
    et_ops.dequantize_per_tensor.Tensor_out(_t(q), _t(s), _t(zp), -128, 127, torch.int8, out=want)
    np.testing.assert_array_equal(got, want.numpy())


@pytest.mark.executorch
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("scale_dt", [np.float64, np.float32])
@pytest.mark.parametrize("with_zp", [True, False])
def test_dequantize_per_channel_matches_executorch(et_ops: Any, axis: int, scale_dt: Any, with_zp: bool) -> None:
    rng = np.random.default_rng(4)
    q = rng.integers(-127, 128, (6, 5, 3, 3)).astype(np.int8)
    n = q.shape[axis]
    scales = rng.uniform(0.001, 0.1, n).astype(scale_dt)
    zps = rng.integers(-3, 3, n).astype(np.int64) if with_zp else None
    out = np.zeros(q.shape, np.float32)
    got = _call("dequantize_per_channel.out", q, scales, zps, axis, -127, 127, int(ScalarType.CHAR), None, out)
    assert got is out
    want = torch.empty(q.shape, dtype=torch.float32)
    et_ops.dequantize_per_channel.out(_t(q), _t(scales), None if zps is None else _t(zps), axis,
                                      -127, 127, torch.int8, out=want)
    np.testing.assert_array_equal(got, want.numpy())


@pytest.mark.executorch
def test_per_token_quantize_and_dequantize(et_ops: Any) -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 8)).astype(np.float32) * 3
    s = np.empty((2, 3, 1), np.float64)
    zp = np.empty((2, 3, 1), np.int64)
    gs, gz = _call("choose_qparams_per_token_asymmetric.out", x, int(ScalarType.CHAR), s, zp)
    ws, wz = torch.empty(2, 3, 1, dtype=torch.float64), torch.empty(2, 3, 1, dtype=torch.int64)
    et_ops.choose_qparams_per_token_asymmetric.out(_t(x), torch.int8, scale_out=ws, zero_point_out=wz)
    np.testing.assert_array_equal(gs, ws.numpy())
    np.testing.assert_array_equal(gz, wz.numpy())
    q = _call("quantize_per_token.out", x, gs, gz, -128, 127, int(ScalarType.CHAR), np.zeros(x.shape, np.int8))
    wq = torch.empty(x.shape, dtype=torch.int8)
    et_ops.quantize_per_token.out(_t(x), ws, wz, -128, 127, torch.int8, out=wq)
    np.testing.assert_array_equal(q, wq.numpy())
    d = _call("dequantize_per_token.out", q, gs, gz, -128, 127, int(ScalarType.CHAR),
              int(ScalarType.FLOAT), np.zeros(x.shape, np.float32))
    wd = torch.empty(x.shape, dtype=torch.float32)
    et_ops.dequantize_per_token.out(wq, ws, wz, -128, 127, torch.int8, torch.float32, out=wd)
    np.testing.assert_array_equal(d, wd.numpy())


# --------------------------------------------------------------------------- choose_qparams


def _choose_cases() -> list[np.ndarray]:
    rng = np.random.default_rng(6)
    return [
        rng.standard_normal(100).astype(np.float32),
        np.abs(rng.standard_normal(50)).astype(np.float32),  # min 0
        -np.abs(rng.standard_normal(50)).astype(np.float32),  # max 0
        np.zeros(10, np.float32),  # zero scale -> 0.1
        (rng.standard_normal(20) * 1e-4).astype(np.float32),  # below the 6.1e-5 scale floor
        np.full(7, 1e-6, np.float32),  # floor, min 0
        np.full(7, -1e-6, np.float32),  # floor, max 0
        np.array([-1.0, 3.0], np.float32),
        np.array([-3e38, 3e38], np.float32),
        (rng.standard_normal(64) * 50 + 20).astype(np.float32),
    ]


@pytest.mark.executorch
@pytest.mark.parametrize("case", range(len(_choose_cases())))
@pytest.mark.parametrize(("qmin", "qmax"), [(-128, 127), (0, 255)])
def test_choose_qparams_matches_executorch(et_ops: Any, case: int, qmin: int, qmax: int) -> None:
    x = _choose_cases()[case]
    s, zp = np.empty(1, np.float64), np.empty(1, np.int64)
    gs, gz = _call("choose_qparams.Tensor_out", x, qmin, qmax, 2**-12, int(ScalarType.CHAR), s, zp)
    assert gs is s and gz is zp
    ws, wz = torch.empty(1, dtype=torch.float64), torch.empty(1, dtype=torch.int64)
    et_ops.choose_qparams.Tensor_out(_t(x), qmin, qmax, 2**-12, torch.int8, scale_out=ws, zero_point_out=wz)
    np.testing.assert_array_equal(gs, ws.numpy())
    np.testing.assert_array_equal(gz, wz.numpy())


def test_qparams_from_min_max_is_elementwise() -> None:
    mins = np.array([-1.0, 0.0, -2.0], np.float32)
    maxs = np.array([1.0, 2.55, 0.0], np.float32)
    s, zp = qparams_from_min_max(mins, maxs, -128, 127)
    for i in range(3):
        s1, zp1 = qparams_from_min_max(mins[i], maxs[i], -128, 127)
        assert s[i] == s1 and zp[i] == zp1
    assert s.dtype == np.float64 and zp.dtype == np.int64
    assert zp[1] == -128 and zp[2] == 127


# --------------------------------------------------------------------------- errors and out handling


def test_wrong_shape_out_returns_a_new_array() -> None:
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    out = np.zeros((8, 4), np.int8)  # an upper-bound dynamic tensor
    got = _call("quantize_per_tensor.out", x, 0.01, 0, -128, 127, int(ScalarType.CHAR), out)
    assert got is not out and got.shape == (3, 4) and got.dtype == np.int8
    d = _call("dequantize_per_tensor.out", got, 0.01, 0, -128, 127, int(ScalarType.CHAR), None, np.zeros((8, 4), np.float32))
    assert d.shape == (3, 4) and d.dtype == np.float32
    np.testing.assert_allclose(d, x, atol=0.005 + 1e-7)


@pytest.mark.parametrize(
    ("name", "args", "match"),
    [
        ("quantize_per_tensor.out", (np.zeros(3, np.int32), 0.1, 0, -128, 127, int(ScalarType.CHAR), np.zeros(3, np.int8)), "float16/float32/float64"),
        ("quantize_per_tensor.out", (np.zeros(3, np.float32), 0.1, 0, -128, 127, int(ScalarType.CHAR), np.zeros(3, np.uint8)), "out has dtype uint8"),
        ("quantize_per_tensor.out", (np.zeros(3, np.float32), 0.1, 0, -129, 127, int(ScalarType.CHAR), np.zeros(3, np.int8)), "quant_min -129"),
        ("quantize_per_tensor.out", (np.zeros(3, np.float32), 0.1, 0, 0, 256, int(ScalarType.BYTE), np.zeros(3, np.uint8)), "quant_max 256"),
        ("quantize_per_tensor.out", (np.zeros(3, np.float32), 0.1, 0, 0, 1, int(ScalarType.FLOAT), np.zeros(3, np.float32)), "not a quantized integer type"),
        ("quantize_per_channel.out", (np.zeros((2, 3), np.float32), np.ones(2), np.zeros(2, np.int64), 1, -128, 127, int(ScalarType.CHAR), np.zeros((2, 3), np.int8)), "scales has 2 elements but input.size\\(1\\) is 3"),
        ("quantize_per_channel.out", (np.zeros((2, 3), np.float32), np.ones(2), np.zeros(2, np.int64), 2, -128, 127, int(ScalarType.CHAR), np.zeros((2, 3), np.int8)), "dim"),
        ("quantize_per_channel.out", (np.zeros((2, 3), np.float32), np.ones(2, np.float32), np.zeros(2, np.int64), 0, -128, 127, int(ScalarType.CHAR), np.zeros((2, 3), np.int8)), "scales must be a float64"),
        ("dequantize_per_tensor.out", (np.zeros(3, np.int8), 0.1, 0, -128, 127, int(ScalarType.BYTE), None, np.zeros(3, np.float32)), "input has dtype int8 but the dtype argument says uint8"),
        ("dequantize_per_tensor.out", (np.zeros(3, np.float32), 0.1, 0, -128, 127, int(ScalarType.CHAR), None, np.zeros(3, np.float32)), "uint8/int8"),
        ("dequantize_per_tensor.out", (np.zeros(3, np.int8), 0.1, 0, 5, 4, int(ScalarType.CHAR), None, np.zeros(3, np.float32)), "greater than quant_max"),
        ("dequantize_per_tensor.out", (np.zeros(3, np.int8), 0.1, 0, -128, 127, int(ScalarType.CHAR), int(ScalarType.DOUBLE), np.zeros(3, np.float32)), "out_dtype says float64"),
        ("dequantize_per_tensor.out", (np.zeros(3, np.int8), 0.1, 0, -128, 127, int(ScalarType.CHAR), None, np.zeros(3, np.int32)), "float16/float32/float64, got int32"),
        ("dequantize_per_channel.out", (np.zeros((2, 3), np.int8), np.ones(3), np.zeros(2, np.int64), 1, -128, 127, int(ScalarType.CHAR), None, np.zeros((2, 3), np.float32)), "zero_points has 2 elements"),
        ("choose_qparams.Tensor_out", (np.zeros(0, np.float32), -128, 127, 1e-5, int(ScalarType.CHAR), np.zeros(1), np.zeros(1, np.int64)), "empty"),
        ("choose_qparams.Tensor_out", (np.zeros(3, np.float32), 5, 5, 1e-5, int(ScalarType.CHAR), np.zeros(1), np.zeros(1, np.int64)), "less than quant_max"),
        ("choose_qparams.Tensor_out", (np.zeros(3, np.float32), -128, 127, 1e-5, int(ScalarType.CHAR), np.zeros(1, np.float32), np.zeros(1, np.int64)), "scale_out must be float64"),
    ],
)
def test_bad_arguments_raise_invalid_argument(name: str, args: tuple, match: str) -> None:
    with pytest.raises(OrchestraError, match=match) as exc:
        _call(name, *args)
    assert exc.value.code == Error.InvalidArgument
    assert _Q + name in str(exc.value)
