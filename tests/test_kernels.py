"""The numpy kernels against torch eager, called exactly as the interpreter calls them.

Every case passes the schema's arguments positionally, ``out`` included, first with ``out``
arrays of the right shape (the kernel must write into them and return them), then with
wrong-shape ``out`` arrays (like an upper-bound dynamic tensor: the kernel must return a new,
correct array in ``out``'s dtype). The reference is torch's own ``.out`` overload.
"""

from __future__ import annotations

import inspect
import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import orchestra.runtime.kernels as kernels  # noqa: E402
from orchestra.runtime.kernels._elementwise import GELU_TABLE_MAX_SIZE, gelu_fit_f32_into  # noqa: E402
from orchestra.errors import Error, OrchestraError  # noqa: E402
from orchestra.program import ScalarType  # noqa: E402
from orchestra.runtime.kernels import (  # noqa: E402
    KernelDef,
    get_kernel,
    kernel,
    kernel_names,
    nearest_kernel_names,
)

F32 = np.float32
F64 = np.float64
I32 = np.int32
I64 = np.int64
BOOL = np.bool_

_TORCH_DTYPE = {
    np.dtype(np.float16): torch.float16,
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float64): torch.float64,
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.int8): torch.int8,
    np.dtype(np.int16): torch.int16,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.int64): torch.int64,
    np.dtype(np.bool_): torch.bool,
}
_SCALAR_TYPE_TO_TORCH = {
    int(ScalarType.FLOAT): torch.float32,
    int(ScalarType.DOUBLE): torch.float64,
    int(ScalarType.INT): torch.int32,
    int(ScalarType.LONG): torch.int64,
}


# --------------------------------------------------------------------------- helpers


def rnd(shape: tuple[int, ...], dtype: Any = F32, seed: int = 0, lo: float = -3, hi: float = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return rng.uniform(lo, hi, size=shape).astype(dt)
    if dt.kind == "b":
        return rng.random(size=shape) < 0.5
    return rng.integers(int(lo), int(hi) + 1, size=shape).astype(dt)


def pos(shape: tuple[int, ...], dtype: Any = F32, seed: int = 0) -> np.ndarray:
    return rnd(shape, dtype, seed, 0.1, 4)


def strided(a: np.ndarray) -> np.ndarray:
    """The same values as a non-contiguous view (every other element of a bigger array)."""
    big = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    big[..., ::2] = a
    view = big[..., ::2]
    assert not view.flags.c_contiguous or a.size <= 1
    return view


def fortran(a: np.ndarray) -> np.ndarray:
    """The same values in a transposed (Fortran-order) layout."""
    return np.asfortranarray(a)


def torch_op(name: str) -> Any:
    ns, rest = name.split("::")
    opname, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, ns), opname), overload or "default")


def to_torch(v: Any, arg: Any) -> Any:
    if isinstance(v, np.ndarray):
        return torch.from_numpy(np.array(v, copy=True, order="C"))
    if isinstance(v, list) and any(isinstance(t, np.ndarray) for t in v):
        return [None if t is None else to_torch(t, None) for t in v]
    if arg is not None and arg.name == "dtype" and v is not None:
        return _SCALAR_TYPE_TO_TORCH[v]
    return v


def to_numpy(t: Any) -> Any:
    if isinstance(t, torch.Tensor):
        return t.numpy()
    return t


def sentinel_like(e: np.ndarray) -> np.ndarray:
    o = np.empty(e.shape, e.dtype)
    o.fill(np.nan if e.dtype.kind == "f" else 7)
    return o


def wrong_like(e: np.ndarray) -> np.ndarray:
    shape = tuple(s + 1 for s in e.shape) if e.ndim else (1,)
    return sentinel_like(np.empty(shape, e.dtype))


def assert_same(got: Any, exp: np.ndarray, rtol: float, atol: float, what: str) -> None:
    assert isinstance(got, np.ndarray), f"{what}: returned {type(got).__name__}, not an array"
    assert got.dtype == exp.dtype, f"{what}: dtype {got.dtype} != {exp.dtype}"
    assert got.shape == exp.shape, f"{what}: shape {got.shape} != {exp.shape}"
    if exp.dtype.kind == "f":
        np.testing.assert_allclose(got, exp, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(got, exp, err_msg=what)


def snapshot(args: tuple[Any, ...]) -> list[Any]:
    return [a.copy() if isinstance(a, np.ndarray) else [t.copy() if isinstance(t, np.ndarray) else t for t in a] if isinstance(a, list) else a for a in args]


def check(
    name: str,
    *args: Any,
    dts: Any = None,
    n_list: int | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    expected: list[np.ndarray] | None = None,
) -> None:
    """Run kernel ``name`` like the interpreter (positional args + out) against torch."""
    kdef = get_kernel(name)
    assert kdef is not None, f"no kernel {name}"
    op = torch_op(name)
    schema = op._schema
    out_args = [a for a in schema.arguments if a.is_out]
    in_args = schema.arguments[: len(schema.arguments) - len(out_args)]
    assert kdef.num_params == len(schema.arguments), f"{name}: num_params vs {schema}"
    assert len(args) == len(in_args), f"{name}: test passes {len(args)} args for {schema}"

    # Output dtypes: given, or that of the first tensor argument.
    if dts is None:
        first = next(
            a if isinstance(a, np.ndarray) else a[0]
            for a in args
            if isinstance(a, np.ndarray) or (isinstance(a, list) and a and isinstance(a[0], np.ndarray))
        )
        dts = [first.dtype] * len(out_args)
    elif not isinstance(dts, (list, tuple)):
        dts = [dts] * len(out_args)
    dts = [np.dtype(d) for d in dts]

    if expected is None:
        targs, tkw = [], {}
        for a, v in zip(in_args, args):
            tv = to_torch(v, a)
            if a.kwarg_only:
                tkw[a.name] = tv
            else:
                targs.append(tv)
        for a, dt in zip(out_args, dts):
            if str(a.type).startswith("List"):
                tkw[a.name] = [torch.empty(0, dtype=_TORCH_DTYPE[dt]) for _ in range(n_list)]
            else:
                tkw[a.name] = torch.empty(0, dtype=_TORCH_DTYPE[dt])
        op(*targs, **tkw)
        expected = []
        for a in out_args:
            t = tkw[a.name]
            expected.append([to_numpy(x) for x in t] if isinstance(t, list) else to_numpy(t))

    before = snapshot(args)
    for mode in ("fit", "wrong"):
        make = sentinel_like if mode == "fit" else wrong_like
        outs = [[make(x) for x in e] if isinstance(e, list) else make(e) for e in expected]
        res = kdef.fn(*args, *outs)
        results = list(res) if len(outs) > 1 else [res]
        assert len(results) == len(outs), f"{name}: returned {len(results)} results"
        for i, (r, e, o) in enumerate(zip(results, expected, outs)):
            if isinstance(e, list):
                assert isinstance(r, list) and len(r) == len(e), f"{name}: expected a list of {len(e)}"
                for j, (rj, ej, oj) in enumerate(zip(r, e, o)):
                    assert_same(rj, ej, rtol, atol, f"{name} [{mode}] out {i}[{j}]")
                    if mode == "fit":
                        assert rj is oj, f"{name}: out {i}[{j}] of the right shape was not used"
            else:
                assert_same(r, e, rtol, atol, f"{name} [{mode}] out {i}")
                if mode == "fit":
                    assert r is o, f"{name}: out {i} of the right shape was not returned"
    for a, b in zip(args, before):
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b, err_msg=f"{name} modified an input")


def raises(code: Error, fn: Callable[..., Any], *args: Any) -> OrchestraError:
    with pytest.raises(OrchestraError) as info:
        fn(*args)
    assert info.value.code == code, info.value
    return info.value


# --------------------------------------------------------------------------- registry


def test_public_surface() -> None:
    for name in kernels.__all__:
        assert hasattr(kernels, name)
    assert set(kernels.__all__) == {"MAX_THREADS", "NATIVE_KERNELS", "KernelDef", "compiled", "rest", "set_threads", "threads", "get_kernel", "kernel", "kernel_names", "nearest_kernel_names", "permute_geometry"}


def test_compiled_is_the_extension_where_it_is_built() -> None:
    c = kernels.compiled()
    assert (c is not None) == kernels.NATIVE_KERNELS
    if c is not None:  # what the XNNPACK backend binds
        for fn in ("dwconv_nhwc_f32", "gconv_nhwc_f32", "linear_f32", "silu_f32", "gelu_f32", "softmax_f32",
                   "hardswish_f32", "add_f32", "bias_act_f32", "permute_4b"):
            assert callable(getattr(c, fn)), fn


def test_registry_contents() -> None:
    names = kernel_names()
    assert list(names) == sorted(names) and len(set(names)) == len(names)
    required = """aten::convolution.out aten::_native_batch_norm_legit_no_training.out aten::addmm.out
    aten::mm.out aten::bmm.out aten::permute_copy.out aten::view_copy.out aten::expand_copy.out
    aten::clone.out dim_order_ops::_clone_dim_order.out dim_order_ops::_to_dim_order_copy.out
    aten::_to_copy.out aten::relu.out aten::hardtanh.out aten::clamp.out aten::clamp.Tensor_out
    aten::sigmoid.out aten::tanh.out aten::gelu.out aten::leaky_relu.out aten::exp.out aten::abs.out
    aten::add.out aten::add.Scalar_out aten::sub.out aten::sub.Scalar_out aten::mul.out
    aten::mul.Scalar_out aten::div.out aten::div.Scalar_out aten::div.out_mode
    aten::div.Scalar_mode_out aten::_softmax.out aten::_log_softmax.out
    aten::max_pool2d_with_indices.out aten::avg_pool2d.out aten::_adaptive_avg_pool2d.out
    aten::mean.out aten::sum.IntList_out aten::amax.out aten::max.dim_max aten::cat.out
    aten::split_with_sizes_copy.out aten::slice_copy.Tensor_out aten::unsqueeze_copy.out
    aten::squeeze_copy.dims_out aten::squeeze_copy.dim_out aten::squeeze_copy.out
    aten::native_layer_norm.out aten::embedding.out aten::where.self_out aten::eq.Tensor_out
    aten::eq.Scalar_out aten::ne.Scalar_out aten::lt.Tensor_out aten::le.Scalar_out
    aten::gt.Tensor_out aten::ge.Scalar_out aten::upsample_nearest2d.vec_out
    aten::upsample_nearest2d.out aten::sym_size.int aten::sym_numel executorch_prim::add.Scalar
    executorch_prim::sub.Scalar executorch_prim::mul.Scalar executorch_prim::floordiv.Scalar
    executorch_prim::truediv.Scalar executorch_prim::mod.Scalar executorch_prim::eq.Scalar
    executorch_prim::gt.Scalar executorch_prim::lt.Scalar executorch_prim::ge.Scalar
    executorch_prim::le.Scalar executorch_prim::neg.Scalar executorch_prim::sym_float.Scalar
    executorch_prim::et_copy_index.tensor executorch_prim::et_view.default aten::full.out
    aten::full_like.out aten::arange.start_out aten::index.Tensor_out aten::linear.out
    aten::pow.Tensor_Scalar_out aten::sqrt.out aten::rsqrt.out aten::neg.out aten::log.out
    aten::masked_fill.Scalar_out aten::hardswish.out aten::hardsigmoid.out aten::silu.out
    aten::constant_pad_nd.out aten::transpose_copy.int_out aten::select_copy.int_out
    aten::var.correction_out aten::var_mean.correction_out""".split()
    missing = [n for n in required if n not in names]
    assert not missing


def test_registry_kernel_def() -> None:
    k = get_kernel("aten::convolution.out")
    assert isinstance(k, KernelDef)
    assert k.name == "aten::convolution.out"
    assert k.num_params == 10
    assert k.dtypes is not None and "float32" in k.dtypes
    with pytest.raises(AttributeError):
        k.num_params = 3  # type: ignore[misc]
    assert get_kernel("executorch_prim::add.Scalar").num_params == 2
    assert get_kernel("executorch_prim::add.Scalar").dtypes is None
    assert get_kernel("aten::no_such_op.out") is None
    assert get_kernel("aten::add.out").dtypes >= {"float32", "float64", "int32", "int64"}


def test_registry_num_params_match_torch_schemas() -> None:
    """Every aten kernel takes exactly its schema's arguments, in order, out included."""
    for name in kernel_names():
        if not name.startswith("aten::"):
            continue
        schema = torch_op(name)._schema
        kdef = get_kernel(name)
        assert kdef.num_params == len(schema.arguments), (name, str(schema))
        params = list(inspect.signature(kdef.fn).parameters)
        assert params == [a.name for a in schema.arguments], (name, params, str(schema))


def test_registry_executorch_schemas() -> None:
    counts = {
        "dim_order_ops::_to_dim_order_copy.out": 4,
        "dim_order_ops::_clone_dim_order.out": 4,
        "dim_order_ops::_empty_dim_order.out": 3,
        "executorch_prim::et_view.default": 2,
        "executorch_prim::et_copy_index.tensor": 3,
        "executorch_prim::sym_ite.Scalar": 3,
        "executorch_prim::neg.Scalar": 1,
        "executorch_prim::floordiv.Scalar": 2,
        "aten::sym_size.int": 2,
        "aten::sym_numel": 1,
        "aten::_local_scalar_dense": 1,
    }
    for name, n in counts.items():
        assert get_kernel(name).num_params == n, name


def test_registry_duplicate_rejected() -> None:
    before = kernel_names()

    def again(self: np.ndarray, out: np.ndarray) -> np.ndarray:
        return out

    err = raises(Error.InvalidArgument, kernel("aten::relu.out", dtypes=("float32",)), again)
    assert "aten::relu.out" in err.message
    assert get_kernel("aten::relu.out").fn is not again
    assert kernel_names() == before


@pytest.mark.parametrize("bad_name", ["relu.out", "aten::", "aten::relu.out.x", "aten:relu", ""])
def test_registry_invalid_name_rejected(bad_name: str) -> None:
    before = kernel_names()
    raises(Error.InvalidArgument, kernel(bad_name), lambda x: x)
    assert kernel_names() == before


def test_registry_invalid_dtype_rejected() -> None:
    raises(Error.InvalidArgument, kernel("test_ns::never.out", dtypes=("float99",)), lambda x: x)
    assert get_kernel("test_ns::never.out") is None


def test_nearest_kernel_names() -> None:
    assert nearest_kernel_names("aten::convolution.default")[0] == "aten::convolution.out"
    near = nearest_kernel_names("aten::add.Tensor")
    assert set(near[:2]) == {"aten::add.out", "aten::add.Scalar_out"}
    assert nearest_kernel_names("aten::relu.default", n=1) == ["aten::relu.out"]
    assert "aten::sigmoid.out" in nearest_kernel_names("aten::sigmoid_.out")
    assert len(nearest_kernel_names("aten::softmax.out", n=2)) <= 2
    assert nearest_kernel_names("zzzz") == []
    assert nearest_kernel_names("aten::relu.out", n=0) == []


# --------------------------------------------------------------------------- elementwise

A = (3, 4, 5)


@pytest.mark.parametrize(
    "case",
    [
        ("aten::add.out", lambda: (rnd(A), rnd((4, 5), seed=1), 1)),
        ("aten::add.out", lambda: (strided(rnd(A)), fortran(rnd(A, seed=1)), 2.5)),
        ("aten::add.out", lambda: (rnd(A, I32), rnd((5,), I64, seed=1), 2)),
        ("aten::add.out", lambda: (rnd(A, I32), rnd(A, F32, seed=1), 1), F32),
        ("aten::add.out", lambda: (rnd(A, BOOL), rnd(A, BOOL, seed=1), 1)),
        ("aten::add.out", lambda: (rnd(A), np.array(2.0, F64), 1)),
        ("aten::add.Scalar_out", lambda: (rnd(A), 1.5, 2)),
        ("aten::add.Scalar_out", lambda: (rnd(A, I64), 3, 1)),
        ("aten::add.Scalar_out", lambda: (rnd(A, I32), 2.5, 1), F32),
        ("aten::sub.out", lambda: (rnd(A), strided(rnd(A, seed=1)), 0.5)),
        ("aten::sub.out", lambda: (rnd(A, I32), rnd(A, I32, seed=1), 3)),
        ("aten::sub.Scalar_out", lambda: (rnd(A), 0.25, 1)),
        ("aten::rsub.Scalar_out", lambda: (rnd(A), 2.0, 3)),
        ("aten::mul.out", lambda: (rnd(A), rnd((3, 1, 5), seed=1))),
        ("aten::mul.out", lambda: (rnd(A, I64), rnd(A, I64, seed=1))),
        ("aten::mul.Scalar_out", lambda: (rnd(A), -1.5)),
        ("aten::mul.Scalar_out", lambda: (rnd(A, I32), 0.5), F32),
        ("aten::div.out", lambda: (rnd(A), pos(A, seed=1))),
        ("aten::div.out", lambda: (rnd(A, I32), rnd(A, I32, 1, 1, 5)), F32),
        ("aten::div.out_mode", lambda: (rnd(A) * 4, pos(A, seed=1) * np.sign(rnd(A, seed=2)), "trunc")),
        ("aten::div.out_mode", lambda: (rnd(A) * 4, pos(A, seed=1) * np.sign(rnd(A, seed=2)), "floor")),
        ("aten::div.out_mode", lambda: (rnd(A), pos(A, seed=1), None)),
        ("aten::div.out_mode", lambda: (rnd(A, I64, 0, -20, 20), rnd(A, I64, 1, 1, 6) * np.where(rnd(A, BOOL, 3), 1, -1), "trunc")),
        ("aten::div.out_mode", lambda: (rnd(A, I64, 0, -20, 20), rnd(A, I64, 1, 1, 6) * np.where(rnd(A, BOOL, 3), 1, -1), "floor")),
        ("aten::div.Scalar_out", lambda: (rnd(A), 3.0)),
        ("aten::div.Scalar_out", lambda: (rnd(A, I64), 4), F32),
        ("aten::div.Scalar_mode_out", lambda: (rnd(A, I32, 0, -20, 20), -3, "floor")),
        ("aten::div.Scalar_mode_out", lambda: (rnd(A, I32, 0, -20, 20), -3, "trunc")),
        ("aten::div.Scalar_mode_out", lambda: (rnd(A) * 5, 1.5, "floor")),
        ("aten::floor_divide.out", lambda: (rnd(A) * 5, pos(A, seed=1))),
        ("aten::remainder.Tensor_out", lambda: (rnd(A) * 5, pos(A, seed=1) * np.sign(rnd(A, seed=2)))),
        ("aten::remainder.Scalar_out", lambda: (rnd(A, I64, 0, -20, 20), 3)),
        ("aten::fmod.Tensor_out", lambda: (rnd(A) * 5, pos(A, seed=1))),
        ("aten::fmod.Scalar_out", lambda: (rnd(A, I32, 0, -20, 20), 3)),
        ("aten::pow.Tensor_Scalar_out", lambda: (rnd(A), 2)),
        ("aten::pow.Tensor_Scalar_out", lambda: (rnd(A), 3.0)),
        ("aten::pow.Tensor_Scalar_out", lambda: (pos(A), 0.5)),
        ("aten::pow.Tensor_Scalar_out", lambda: (pos(A), -1.5)),
        ("aten::pow.Tensor_Scalar_out", lambda: (rnd(A, I64), 3)),
        ("aten::pow.Tensor_Scalar_out", lambda: (rnd(A, I32), 2.0), F32),
        ("aten::pow.Tensor_Tensor_out", lambda: (pos(A), rnd(A, seed=1))),
        ("aten::pow.Scalar_out", lambda: (2.0, rnd(A))),
        ("aten::maximum.out", lambda: (rnd(A), rnd((5,), seed=1))),
        ("aten::minimum.out", lambda: (rnd(A, I32), rnd(A, I32, seed=1))),
        ("aten::bitwise_and.Tensor_out", lambda: (rnd(A, I32, 0, 0, 100), rnd(A, I32, 1, 0, 100))),
        ("aten::bitwise_or.Tensor_out", lambda: (rnd(A, BOOL), rnd(A, BOOL, seed=1))),
        ("aten::bitwise_xor.Tensor_out", lambda: (rnd(A, I64, 0, 0, 100), rnd(A, I64, 1, 0, 100))),
        ("aten::bitwise_not.out", lambda: (rnd(A, I32),)),
        ("aten::logical_and.out", lambda: (rnd(A), rnd(A, BOOL, seed=1)), BOOL),
        ("aten::logical_or.out", lambda: (rnd(A, BOOL), rnd(A, BOOL, seed=1)), BOOL),
        ("aten::logical_xor.out", lambda: (rnd(A, I32), rnd(A, BOOL, seed=1)), BOOL),
        ("aten::logical_not.out", lambda: (rnd(A, I32, 0, -1, 1),), BOOL),
        ("aten::isnan.out", lambda: (np.array([1.0, np.nan, np.inf, -np.inf], F32),), BOOL),
        ("aten::isinf.out", lambda: (np.array([1.0, np.nan, np.inf, -np.inf], F32),), BOOL),
    ],
    ids=lambda c: c[0],
)
def test_binary(case: tuple[Any, ...]) -> None:
    name, make, *dt = case
    check(name, *make(), dts=dt[0] if dt else None)


@pytest.mark.parametrize("op", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_comparisons(op: str) -> None:
    a = rnd(A, I32, 0, -2, 2).astype(F32)
    b = rnd(A, I32, 1, -2, 2).astype(F32)
    check(f"aten::{op}.Tensor_out", a, b, dts=BOOL)
    check(f"aten::{op}.Tensor_out", strided(a), b[:1], dts=BOOL)
    check(f"aten::{op}.Tensor_out", rnd(A, I32, 0, -2, 2), rnd(A, I64, 1, -2, 2), dts=BOOL)
    check(f"aten::{op}.Scalar_out", a, 1.0, dts=BOOL)
    check(f"aten::{op}.Scalar_out", rnd(A, I64, 0, -2, 2), 0, dts=BOOL)
    check(f"aten::{op}.Scalar_out", rnd(A, I32, 0, -2, 2), 0.5, dts=BOOL)


@pytest.mark.parametrize(
    "name,make",
    [
        ("exp", lambda: rnd(A)),
        ("expm1", lambda: rnd(A)),
        ("log", lambda: pos(A)),
        ("log1p", lambda: pos(A)),
        ("log2", lambda: pos(A)),
        ("log10", lambda: pos(A)),
        ("sqrt", lambda: pos(A)),
        ("rsqrt", lambda: pos(A)),
        ("tanh", lambda: rnd(A)),
        ("sigmoid", lambda: rnd(A, lo=-30, hi=30)),
        ("sin", lambda: rnd(A)),
        ("cos", lambda: rnd(A)),
        ("tan", lambda: rnd(A, lo=-1, hi=1)),
        ("asin", lambda: rnd(A, lo=-1, hi=1)),
        ("acos", lambda: rnd(A, lo=-1, hi=1)),
        ("atan", lambda: rnd(A)),
        ("sinh", lambda: rnd(A)),
        ("cosh", lambda: rnd(A)),
        ("reciprocal", lambda: pos(A)),
        ("erf", lambda: rnd((1000,), lo=-5, hi=5)),
        ("erf", lambda: rnd((1000,), lo=-0.6, hi=0.6)),
        ("abs", lambda: rnd(A)),
        ("abs", lambda: rnd(A, I32)),
        ("neg", lambda: strided(rnd(A))),
        ("neg", lambda: rnd(A, I64)),
        ("sign", lambda: rnd(A, I32, 0, -2, 2).astype(F32)),
        ("floor", lambda: rnd(A)),
        ("floor", lambda: rnd(A, I32)),
        ("ceil", lambda: rnd(A)),
        ("trunc", lambda: rnd(A)),
        ("round", lambda: np.array([0.5, 1.5, 2.5, -0.5, -1.5, 1.2, -2.7], F32)),
        ("relu", lambda: rnd(A)),
        ("relu", lambda: fortran(rnd(A))),
        ("relu", lambda: rnd(A, I64)),
        ("sigmoid", lambda: rnd(A, F64)),
        ("exp", lambda: rnd(A, I32)),
        ("sqrt", lambda: rnd(A, I64, 0, 0, 9)),
        ("hardswish", lambda: rnd(A, lo=-5, hi=5)),
        ("hardsigmoid", lambda: rnd(A, lo=-5, hi=5)),
        ("silu", lambda: rnd(A, lo=-10, hi=10)),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_unary(name: str, make: Callable[[], np.ndarray]) -> None:
    x = make()
    dt = x.dtype if x.dtype.kind == "f" or name in ("abs", "neg", "floor", "relu") else np.dtype(F32)
    check(f"aten::{name}.out", x, dts=dt)


@pytest.mark.parametrize(
    "name,args",
    [
        ("aten::hardtanh.out", lambda: (rnd(A), -1.0, 1.0)),
        ("aten::hardtanh.out", lambda: (rnd(A), 0.0, 6.0)),
        ("aten::clamp.out", lambda: (rnd(A), -0.5, 0.5)),
        ("aten::clamp.out", lambda: (rnd(A), None, 0.5)),
        ("aten::clamp.out", lambda: (strided(rnd(A)), -1, None)),
        ("aten::clamp.out", lambda: (rnd(A), 1.0, -1.0)),
        ("aten::clamp.out", lambda: (rnd(A, I64), -1, 2)),
        ("aten::clamp.Tensor_out", lambda: (rnd(A), rnd((5,), seed=1) - 1, rnd((4, 5), seed=2) + 1)),
        ("aten::clamp.Tensor_out", lambda: (rnd(A), None, rnd((5,), seed=2))),
        ("aten::clamp_min.out", lambda: (rnd(A), 0.1)),
        ("aten::clamp_max.out", lambda: (rnd(A), 0.1)),
        ("aten::gelu.out", lambda: (rnd((4000,), lo=-8, hi=8), "none")),
        ("aten::gelu.out", lambda: (rnd((4000,), lo=-8, hi=8), "tanh")),
        ("aten::gelu.out", lambda: (strided(rnd(A)), "none")),
        ("aten::gelu.out", lambda: (rnd(A, F64), "none")),
        ("aten::gelu.out", lambda: (rnd((40000,), lo=-8, hi=8), "none")),
        ("aten::leaky_relu.out", lambda: (rnd(A), 0.01)),
        ("aten::leaky_relu.out", lambda: (fortran(rnd(A)), 0.2)),
        ("aten::elu.out", lambda: (rnd(A), 1.0, 1.0, 1.0)),
        ("aten::elu.out", lambda: (rnd(A), 0.5, 2.0, 1.5)),
        ("aten::glu.out", lambda: (rnd((3, 4, 6)), -1)),
        ("aten::glu.out", lambda: (rnd((3, 4, 6)), 1)),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_activations(name: str, args: Callable[[], tuple[Any, ...]]) -> None:
    check(name, *args())


SPECIAL = np.array([np.nan, -np.inf, -7.0, -3.0, -0.0, 0.0, 0.5, 3.0, 6.0, 7.0, np.inf], dtype=F32)


@pytest.mark.parametrize(
    "name, extra",
    [
        ("aten::relu.out", ()),
        ("aten::clamp.out", (0, 6)),
        ("aten::clamp.out", (0.0, None)),
        ("aten::clamp.out", (None, -0.5)),
        ("aten::clamp.out", (2, 1)),
        ("aten::hardtanh.out", (-1.0, 1.0)),
        ("aten::hardswish.out", ()),
        ("aten::hardsigmoid.out", ()),
        ("aten::sigmoid.out", ()),
        ("aten::silu.out", ()),
    ],
    ids=str,
)
@pytest.mark.parametrize("dt", [F32, F64], ids=str)
def test_activations_special_values_match_torch_bitwise_where_exact(name: str, extra: tuple[Any, ...], dt: Any) -> None:
    """NaN, infinities and signed zeros (the clip-based fast paths): NaN propagates, -0.0
    keeps its sign where torch's does, and the result lands in ``out``."""
    x = np.concatenate([SPECIAL, np.linspace(-100, 100, 41, dtype=F32)]).astype(dt)
    out = np.full_like(x, 123.0)
    res = get_kernel(name).fn(x, *extra, out)
    assert res is out
    ref = torch_op(name)(torch.from_numpy(x), *extra, out=torch.empty(x.shape, dtype=_TORCH_DTYPE[x.dtype])).numpy()
    np.testing.assert_allclose(res, ref, rtol=1e-6, atol=1e-7, equal_nan=True)
    if name in ("aten::relu.out", "aten::clamp.out", "aten::hardtanh.out"):
        assert np.array_equal(np.signbit(res), np.signbit(ref))


def test_gelu_precision() -> None:
    """gelu(x) = x/2 * erfc(-x/sqrt 2): close to torch everywhere, and relatively accurate in
    the negative tail too (where torch's float32 1 + erf(x) cancels)."""
    x = np.linspace(-10, 10, 20001, dtype=F32)
    got = get_kernel("aten::gelu.out").fn(x, "none", np.empty_like(x))
    exp = torch.nn.functional.gelu(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-6)
    exact = np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in x.astype(F64)])
    np.testing.assert_allclose(got, exact, rtol=2e-5, atol=1e-30)


def _float32_grid(top: float, stride: int) -> np.ndarray:
    """Every ``stride``-th float32 in [-top, top] by bit pattern (all binades, denormals
    included), plus 0 and -0."""
    bits = np.arange(0, int(np.array(top, F32).view(np.int32)) + 1, stride, dtype=np.int32)
    pos_ = bits.view(F32)
    return np.concatenate([pos_, -pos_])


@pytest.mark.parametrize("chunk", [2048, 1 << 16], ids=["table", "fit"])
def test_gelu_dense_float32_grid_against_math_erfc(chunk: int) -> None:
    """Both float32 gelu paths (the table for up to 2048 elements, the float32 fit above)
    over a dense grid of float32 values in [-15, 15] against x/2 * erfc(-x/sqrt 2) in float64
    (math.erfc): relative error within the bounds the code states, in the negative tail too;
    results below float32's smallest normal within 1e-38 absolute."""
    x = _float32_grid(15.0, 4099)
    fn = get_kernel("aten::gelu.out").fn
    got = np.concatenate([fn(x[i:i + chunk], "none", np.empty(len(x[i:i + chunk]), F32))
                          for i in range(0, len(x), chunk)])
    xd = x.astype(np.float64)
    exact = np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in xd.tolist()])
    err = np.abs(got.astype(np.float64) - exact)
    normal = np.abs(exact) >= np.finfo(F32).tiny
    assert np.all(err[~normal] <= 1e-38)
    rel = err[normal] / np.abs(exact[normal])
    ax = np.abs(xd[normal])
    if chunk <= 2048:
        bounds = [(15.0, 5e-7)]
    else:
        bounds = [(2.0, 4e-7), (5.0, 1.2e-6), (10.0, 4.5e-6), (15.0, 1e-5)]
    lo = 0.0
    for hi, bound in bounds:
        sel = (ax >= lo) & (ax <= hi)
        assert sel.any() and float(rel[sel].max()) <= bound, (lo, hi, float(rel[sel].max()))
        lo = hi


@pytest.mark.parametrize("n", [5, 4097], ids=["table", "fit"])
def test_gelu_special_values_and_in_place(n: int) -> None:
    """inf -> inf, -inf and NaN -> NaN (0.5 x (1 + erf(x / sqrt 2))), huge values stay finite,
    tiny ones halve; in place (out is x) and into a strided out give the same results."""
    special = np.array([np.inf, -np.inf, np.nan, 3e38, -3e38, 1e-30, -1e-30, 0.0, 20.0, -20.0], F32)
    x = np.concatenate([special, rnd((n,), lo=-6, hi=6)]).astype(F32)
    fn = get_kernel("aten::gelu.out").fn
    got = fn(x, "none", np.empty_like(x))
    ref = np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) if math.isfinite(v) else v
                    for v in x[:len(special)].astype(np.float64).tolist()])
    ref[1] = np.nan
    np.testing.assert_allclose(got[:len(special)], ref, rtol=1e-6, atol=1e-38, equal_nan=True)
    y = x.copy()
    assert fn(y, "none", y) is y
    np.testing.assert_array_equal(y, got)
    wide = np.zeros(2 * len(x), F32)
    fn(x, "none", wide[::2])
    np.testing.assert_array_equal(wide[::2], got)
    if len(x) > GELU_TABLE_MAX_SIZE:  # the fit in a caller's scratch (the plan's gelu step)
        scratch = np.full(3 * len(x) + 5, np.nan, F32)
        out = np.empty_like(x)
        assert gelu_fit_f32_into(x, out, scratch) is out
        np.testing.assert_array_equal(out, got)
        y = x.copy()
        assert gelu_fit_f32_into(y, y, scratch) is y
        np.testing.assert_array_equal(y, got)


def test_where_and_masked_fill() -> None:
    cond = rnd(A, BOOL)
    check("aten::where.self_out", cond, rnd(A), rnd((4, 5), seed=1), dts=F32)
    check("aten::where.self_out", cond[:, :1], strided(rnd(A)), rnd((5,), seed=1), dts=F32)
    check("aten::where.self_out", cond, rnd(A, I32), rnd(A, F32, seed=1), dts=F32)
    check("aten::where.self_out", cond, rnd(A), np.array(0.0, F32), dts=F32)
    check("aten::masked_fill.Scalar_out", rnd(A), cond, -1e9)
    check("aten::masked_fill.Scalar_out", rnd(A, I64), cond[0], 5)
    check("aten::masked_fill.Scalar_out", strided(rnd(A)), cond[:, :, :1], float("-inf"))


def test_dropout_inference() -> None:
    check("aten::native_dropout.out", rnd(A), 0.5, False, dts=[F32, BOOL])
    fn = get_kernel("aten::native_dropout.out").fn
    raises(Error.NotSupported, fn, rnd(A), 0.5, True, None, None)


def test_noncontiguous_out_is_written() -> None:
    a, b = rnd(A), rnd(A, seed=1)
    out = strided(np.zeros(A, F32))
    assert get_kernel("aten::add.out").fn(a, b, 1, out) is out
    np.testing.assert_allclose(out, a + b, rtol=1e-6)
    out = fortran(np.zeros(A, F32))
    assert get_kernel("aten::sigmoid.out").fn(a, out) is out
    np.testing.assert_allclose(out, 1 / (1 + np.exp(-a)), rtol=1e-5)
    # A non-contiguous out of the right shape still gets the right values from conv.
    x, w = rnd((1, 2, 5, 5)), rnd((3, 2, 3, 3), seed=2)
    out = strided(np.zeros((1, 3, 5, 5), F32))
    res = get_kernel("aten::convolution.out").fn(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, out)
    assert res is out
    ref = torch.ops.aten.convolution(torch.from_numpy(x), torch.from_numpy(w), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    np.testing.assert_allclose(out, ref.numpy(), rtol=1e-4, atol=1e-4)


def test_integer_division_by_zero() -> None:
    fn = get_kernel("aten::div.out_mode").fn
    a = np.array([1, 2, 3], I64)
    b = np.array([1, 0, 3], I64)
    raises(Error.InvalidArgument, fn, a, b, "trunc", np.empty(3, I64))
    # Float division by zero is IEEE (inf/nan), as in torch.
    got = get_kernel("aten::div.out").fn(np.array([1.0, -1.0, 0.0], F32), np.zeros(3, F32), np.empty(3, F32))
    assert got[0] == np.inf and got[1] == -np.inf and np.isnan(got[2])


# --------------------------------------------------------------------------- linalg


def test_matmuls() -> None:
    check("aten::mm.out", rnd((5, 7)), rnd((7, 3), seed=1))
    check("aten::mm.out", fortran(rnd((5, 7))), strided(rnd((7, 3), seed=1)))
    check("aten::mm.out", rnd((5, 7), I64), rnd((7, 3), I64, seed=1))
    check("aten::bmm.out", rnd((2, 5, 7)), rnd((2, 7, 3), seed=1))
    check("aten::bmm.out", rnd((2, 7, 5)).transpose(0, 2, 1), rnd((2, 7, 3), seed=1))
    check("aten::addmm.out", rnd((3,)), rnd((5, 7), seed=1), rnd((7, 3), seed=2), 1, 1)
    check("aten::addmm.out", rnd((5, 3)), rnd((5, 7), seed=1), rnd((3, 7), seed=2).T, 0.5, 2.0)
    check("aten::addmm.out", np.full((5, 3), np.nan, F32), rnd((5, 7), seed=1), rnd((7, 3), seed=2), 0, 1)
    check("aten::linear.out", rnd((2, 4, 7)), rnd((3, 7), seed=1), rnd((3,), seed=2))
    check("aten::linear.out", rnd((4, 7)), rnd((3, 7), seed=1), None)


def test_addmm_linear_fast_path_out_aliasing() -> None:
    """The linear-layer path writes a product of 64 KiB or more straight into out: not when
    out is self (an accumulating addmm), an operand, or not C-contiguous; each gives the
    reference result, as do small products."""
    addmm = get_kernel("aten::addmm.out").fn
    for m, n in ((160, 128), (6, 4)):  # 80 KiB out: written directly; 96 bytes: not
        a, w, bias = rnd((m, 5)), rnd((n, 5), seed=1), rnd((n,), seed=2)
        exp = a @ w.T + bias
        out = np.zeros((m, n), F32)
        assert addmm(bias, a, w.T, 1, 1, out) is out
        np.testing.assert_allclose(out, exp, rtol=1e-5, atol=1e-5)
        acc = rnd((m, n), seed=3)
        exp2 = a @ w.T + acc
        assert addmm(acc, a, w.T, 1, 1, acc) is acc  # out is self
        np.testing.assert_allclose(acc, exp2, rtol=1e-5, atol=1e-5)
        wide = np.zeros((m, 2 * n), F32)
        addmm(bias, a, w.T, 1, 1, wide[:, ::2])
        np.testing.assert_allclose(wide[:, ::2], exp, rtol=1e-5, atol=1e-5)
    sq, bias = rnd((128, 128), seed=4), rnd((128,), seed=5)
    exp3 = sq @ sq + bias
    res = addmm(bias, sq, sq, 1, 1, sq)  # out (64 KiB) is both operands
    np.testing.assert_allclose(res, exp3, rtol=1e-5, atol=1e-4)


def test_matmul_shape_mismatch() -> None:
    raises(Error.InvalidArgument, get_kernel("aten::mm.out").fn, rnd((2, 3)), rnd((4, 5)), np.empty((2, 5), F32))


# --------------------------------------------------------------------------- convolution

CONV_CASES = [
    # input, weight, bias?, stride, padding, dilation, groups
    ((1, 16, 32, 32), (32, 16, 3, 3), True, [1, 1], [1, 1], [1, 1], 1),
    ((2, 3, 17, 15), (8, 3, 3, 3), True, [2, 2], [1, 1], [1, 1], 1),
    ((2, 3, 17, 15), (8, 3, 5, 3), False, [2, 1], [2, 0], [1, 1], 1),
    ((1, 4, 12, 12), (6, 4, 3, 3), True, [1, 1], [2, 2], [2, 2], 1),
    ((1, 4, 12, 13), (6, 4, 3, 2), True, [1, 2], [0, 1], [3, 2], 1),
    ((2, 8, 10, 10), (8, 2, 3, 3), True, [1, 1], [1, 1], [1, 1], 4),
    ((2, 8, 10, 10), (12, 4, 3, 3), True, [2, 2], [1, 1], [1, 1], 2),
    ((1, 8, 9, 9), (8, 1, 3, 3), True, [1, 1], [1, 1], [1, 1], 8),
    ((1, 8, 9, 9), (8, 1, 3, 3), True, [2, 2], [1, 1], [1, 1], 8),
    ((1, 4, 9, 9), (8, 1, 3, 3), False, [1, 1], [1, 1], [2, 2], 4),
    ((2, 6, 7, 7), (5, 6, 1, 1), True, [1, 1], [0, 0], [1, 1], 1),
    ((2, 6, 7, 7), (5, 6, 1, 1), True, [2, 2], [0, 0], [1, 1], 1),
    ((1, 3, 5, 4), (2, 3, 5, 4), True, [1, 1], [0, 0], [1, 1], 1),
    ((1, 3, 4, 3), (2, 3, 3, 3), True, [1, 1], [1, 1], [1, 1], 1),
    ((1, 2, 6, 30), (3, 2, 1, 5), True, [1, 1], [0, 2], [1, 1], 1),
    # Large depthwise (stride-phase im2col) and grouped convolutions, mobile nets' shapes.
    ((1, 16, 56, 56), (16, 1, 3, 3), True, [2, 2], [1, 1], [1, 1], 16),
    ((2, 64, 14, 14), (64, 1, 5, 5), True, [1, 1], [2, 2], [1, 1], 64),
    ((1, 32, 29, 31), (32, 1, 5, 5), False, [2, 2], [2, 2], [1, 1], 32),
    ((1, 24, 30, 33), (48, 1, 3, 5), True, [3, 2], [2, 1], [2, 1], 24),
    ((1, 32, 40, 40), (32, 8, 3, 3), True, [2, 2], [1, 1], [1, 1], 4),
    ((1, 16, 24, 24), (16, 1, 7, 7), True, [1, 1], [3, 6], [1, 2], 16),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"{c[0]}x{c[1]}s{c[3]}p{c[4]}d{c[5]}g{c[6]}")
def test_conv2d(case: tuple[Any, ...]) -> None:
    xs, ws, has_bias, stride, padding, dilation, groups = case
    x, w = rnd(xs), rnd(ws, seed=1)
    b = rnd((ws[0],), seed=2) if has_bias else None
    check("aten::convolution.out", x, w, b, stride, padding, dilation, False, [0, 0], groups, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stride, padding, dilation", [(1, 1, 1), (2, 2, 1), (1, 2, 2), (3, 0, 1)])
def test_depthwise_conv_in_channel_blocks(monkeypatch: pytest.MonkeyPatch, stride: int, padding: int, dilation: int) -> None:
    """A block budget of a few channels: the blocked im2col + GEMM covers every channel once."""
    from orchestra.runtime.kernels import _conv

    monkeypatch.setattr(_conv, "_DW_BLOCK_BYTES", 3 * 9 * 30 * 30 * 4)
    monkeypatch.setattr(_conv, "_native", None)  # the numpy path (float32 otherwise runs compiled)
    x, w, b = rnd((2, 20, 30, 30)), rnd((20, 1, 3, 3), seed=1), rnd((20,), seed=2)
    check("aten::convolution.out", x, w, b, [stride] * 2, [padding] * 2, [dilation] * 2, False, [0, 0], 20,
          rtol=1e-4, atol=1e-4)
    check("aten::convolution.out", x, w, None, [stride] * 2, [padding] * 2, [dilation] * 2, False, [0, 0], 20,
          rtol=1e-4, atol=1e-4)


def test_conv2d_noncontiguous_and_float64() -> None:
    x = strided(rnd((2, 4, 9, 9)))
    w = fortran(rnd((6, 4, 3, 3), seed=1))
    check("aten::convolution.out", x, w, rnd((6,), seed=2), [1, 1], [1, 1], [1, 1], False, [0, 0], 1, rtol=1e-4, atol=1e-4)
    x = rnd((1, 4, 9, 9)).transpose(0, 1, 3, 2)  # channels-last-like strides
    check("aten::convolution.out", x, rnd((6, 2, 3, 3), seed=1), None, [2, 2], [1, 1], [1, 1], False, [0, 0], 2, rtol=1e-4, atol=1e-4)
    check("aten::convolution.out", rnd((1, 3, 8, 8), F64), rnd((4, 3, 3, 3), F64, 1), rnd((4,), F64, 2), [1, 1], [1, 1], [1, 1], False, [0, 0], 1)


@pytest.mark.parametrize(
    "case",
    [
        ((2, 4, 20), (6, 4, 3), True, [1], [1], [1], 1),
        ((2, 4, 20), (6, 4, 5), False, [2], [2], [1], 1),
        ((1, 4, 20), (8, 2, 3), True, [1], [2], [2], 2),
        ((1, 4, 20), (4, 1, 3), True, [3], [1], [1], 4),
    ],
    ids=str,
)
def test_conv1d(case: tuple[Any, ...]) -> None:
    xs, ws, has_bias, stride, padding, dilation, groups = case
    b = rnd((ws[0],), seed=2) if has_bias else None
    check("aten::convolution.out", rnd(xs), rnd(ws, seed=1), b, stride, padding, dilation, False, [0], groups, rtol=1e-4, atol=1e-4)


def test_conv_errors() -> None:
    fn = get_kernel("aten::convolution.out").fn
    x, w = rnd((1, 4, 8, 8)), rnd((4, 4, 3, 3))
    err = raises(Error.NotSupported, fn, x, w, None, [1, 1], [0, 0], [1, 1], True, [0, 0], 1, np.empty((1, 4, 10, 10), F32))
    assert "transposed" in err.message and "aten::convolution.out" in err.message
    raises(Error.InvalidArgument, fn, x, rnd((4, 3, 3, 3)), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, None)
    raises(Error.InvalidArgument, fn, rnd((1, 4, 2, 2)), w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, None)
    raises(Error.NotSupported, fn, rnd((1, 4, 4, 4, 4)), rnd((2, 4, 1, 1, 1)), None, [1] * 3, [0] * 3, [1] * 3, False, [0] * 3, 1, None)


# --------------------------------------------------------------------------- normalisation


@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (4, 3, 7), (5, 3)], ids=str)
def test_batch_norm(shape: tuple[int, ...]) -> None:
    c = shape[1]
    x = rnd(shape)
    mean, var = rnd((c,), seed=1), pos((c,), seed=2)
    check(
        "aten::_native_batch_norm_legit_no_training.out",
        x, rnd((c,), seed=3), rnd((c,), seed=4), mean, var, 0.1, 1e-5, dts=[F32, F32, F32],
    )
    check(
        "aten::_native_batch_norm_legit_no_training.out",
        strided(x), None, None, mean, var, 0.1, 1e-3, dts=[F32, F32, F32],
    )


def test_layer_norm() -> None:
    x = rnd((2, 5, 8))
    check("aten::native_layer_norm.out", x, [8], rnd((8,), seed=1), rnd((8,), seed=2), 1e-5, dts=[F32] * 3)
    check("aten::native_layer_norm.out", strided(x), [5, 8], rnd((5, 8), seed=1), None, 1e-3, dts=[F32] * 3)
    check("aten::native_layer_norm.out", x, [8], None, None, 1e-5, dts=[F32] * 3)
    raises(Error.InvalidArgument, get_kernel("aten::native_layer_norm.out").fn, x, [7], None, None, 1e-5, None, None, None)


def test_group_norm() -> None:
    x = rnd((2, 6, 4, 3))
    check("aten::native_group_norm.out", x, rnd((6,), seed=1), rnd((6,), seed=2), 2, 6, 12, 3, 1e-5, dts=[F32] * 3)
    check("aten::native_group_norm.out", x, None, None, 2, 6, 12, 6, 1e-5, dts=[F32] * 3)


# --------------------------------------------------------------------------- reductions

R = (3, 4, 5, 6)


@pytest.mark.parametrize(
    "name,args,dt",
    [
        ("aten::mean.out", lambda: (rnd(R), [2, 3], True, None), None),
        ("aten::mean.out", lambda: (rnd(R), [-1], False, None), None),
        ("aten::mean.out", lambda: (strided(rnd(R)), [0, 2], False, None), None),
        ("aten::mean.out", lambda: (rnd(R), None, False, None), None),
        ("aten::mean.out", lambda: (rnd(R), [], True, None), None),
        ("aten::mean.out", lambda: (rnd(R), [1], False, int(ScalarType.DOUBLE)), F64),
        ("aten::mean.out", lambda: (rnd(R, I32), [1], False, int(ScalarType.FLOAT)), F32),
        ("aten::mean.dtype_out", lambda: (rnd(R), None), None),
        ("aten::sum.IntList_out", lambda: (rnd(R), [1, -1], False, None), None),
        ("aten::sum.IntList_out", lambda: (rnd(R), None, True, None), None),
        ("aten::sum.IntList_out", lambda: (rnd(R, I32), [0], False, None), I64),
        ("aten::sum.IntList_out", lambda: (rnd(R, BOOL), [3], True, None), I64),
        ("aten::sum.IntList_out", lambda: (rnd(R), [2], False, int(ScalarType.DOUBLE)), F64),
        ("aten::sum.out", lambda: (rnd(R, I64), None), I64),
        ("aten::prod.int_out", lambda: (rnd(R, lo=0.5, hi=1.5), 2, False, None), None),
        ("aten::prod.out", lambda: (rnd((5,), I32), None), I64),
        ("aten::amax.out", lambda: (rnd(R), [1, 2], False), None),
        ("aten::amax.out", lambda: (rnd(R, I32), [], True), None),
        ("aten::amin.out", lambda: (strided(rnd(R)), [-1], True), None),
        ("aten::max.unary_out", lambda: (rnd(R),), None),
        ("aten::min.unary_out", lambda: (rnd(R, I64),), None),
        ("aten::argmax.out", lambda: (rnd(R), 1, False), I64),
        ("aten::argmax.out", lambda: (rnd(R), None, False), I64),
        ("aten::argmin.out", lambda: (rnd(R, I32, 0, 0, 3), -1, True), I64),
        ("aten::any.dims_out", lambda: (rnd(R, BOOL), [1], False), BOOL),
        ("aten::all.dims_out", lambda: (rnd(R, I32, 0, 0, 3), None, True), BOOL),
        ("aten::any.out", lambda: (rnd(R, BOOL), 2, True), BOOL),
        ("aten::all.out", lambda: (rnd(R, BOOL), 0, False), BOOL),
        ("aten::any.all_out", lambda: (rnd(R, BOOL),), BOOL),
        ("aten::all.all_out", lambda: (np.ones(R, BOOL),), BOOL),
        ("aten::var.correction_out", lambda: (rnd(R), [1, 2], 1, False), None),
        ("aten::var.correction_out", lambda: (rnd(R), None, 0, True), None),
        ("aten::var.correction_out", lambda: (strided(rnd(R)), [-1], None, False), None),
        ("aten::var.out", lambda: (rnd(R), [3], False, True), None),
        ("aten::std.correction_out", lambda: (rnd(R), [0, 3], 1, False), None),
        ("aten::std.out", lambda: (rnd(R), [2], True, True), None),
        ("aten::logsumexp.out", lambda: (rnd(R), [1, 3], False), None),
        ("aten::logsumexp.out", lambda: (rnd(R) * 50, [-1], True), None),
        ("aten::cumsum.out", lambda: (rnd(R), 2, None), None),
        ("aten::cumsum.out", lambda: (rnd(R, I32), -1, None), I64),
        ("aten::cumsum.out", lambda: (rnd(R), 0, int(ScalarType.DOUBLE)), F64),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_reductions(name: str, args: Callable[[], tuple[Any, ...]], dt: Any) -> None:
    check(name, *args(), dts=dt)


def test_var_mean() -> None:
    check("aten::var_mean.correction_out", rnd(R), [1, 3], 1, True, dts=[F32, F32])
    check("aten::var_mean.correction_out", rnd(R), None, 0, False, dts=[F32, F32])


def test_max_min_dim() -> None:
    x = rnd(R, I32, 0, -3, 3).astype(F32)  # ties: torch and numpy both pick the first
    check("aten::max.dim_max", x, 1, False, dts=[F32, I64])
    check("aten::max.dim_max", strided(x), -1, True, dts=[F32, I64])
    check("aten::min.dim_min", x, 0, True, dts=[F32, I64])
    check("aten::max.dim_max", rnd(R, I64), 2, False, dts=[I64, I64])


@pytest.mark.parametrize("log", [False, True])
def test_softmax(log: bool) -> None:
    name = "aten::_log_softmax.out" if log else "aten::_softmax.out"
    x = rnd(R) * 10
    for dim in (-1, 0, 1, 3):
        check(name, x, dim, False)
    check(name, strided(x), -1, False)
    check(name, rnd(R, F64), 2, False)
    y = x.copy()
    y[0, 0, 0, :3] = -np.inf
    check(name, y, -1, False)
    check(name, np.array(2.0, F32), 0, False)
    name2 = "aten::log_softmax.int_out" if log else "aten::softmax.int_out"
    check(name2, x, 1, None)
    check(name2, x, 1, int(ScalarType.DOUBLE), dts=F64)


# --------------------------------------------------------------------------- pooling


@pytest.mark.parametrize(
    "shape,k,s,p,d,ceil",
    [
        ((1, 3, 8, 8), [2, 2], [2, 2], [0, 0], [1, 1], False),
        ((2, 3, 9, 11), [3, 3], [2, 2], [1, 1], [1, 1], False),
        ((2, 3, 9, 11), [3, 3], [2, 2], [1, 1], [1, 1], True),
        ((1, 2, 10, 10), [3, 2], [], [1, 0], [1, 1], True),
        ((1, 2, 13, 12), [3, 3], [1, 2], [1, 1], [2, 2], False),
        ((3, 7, 7), [2, 2], [1, 1], [1, 1], [1, 1], False),
        ((1, 1, 5, 5), [2, 2], [2, 2], [0, 0], [1, 1], True),
        # no padding: the vectorised path (windows inside the input)
        ((2, 3, 8, 8), [2, 2], [2, 2], [0, 0], [1, 1], True),
        ((1, 2, 9, 9), [3, 3], [1, 1], [0, 0], [1, 1], False),
        ((1, 2, 11, 11), [3, 2], [2, 1], [0, 0], [2, 1], False),
        ((2, 4, 7, 9), [2, 3], [], [0, 0], [1, 1], False),
        ((3, 8, 8), [2, 2], [2, 2], [0, 0], [1, 1], False),
        ((1, 1, 6, 6), [1, 1], [1, 1], [0, 0], [1, 1], False),
    ],
)
def test_max_pool2d(shape: tuple[int, ...], k: list[int], s: list[int], p: list[int], d: list[int], ceil: bool) -> None:
    check("aten::max_pool2d_with_indices.out", rnd(shape), k, s, p, d, ceil, dts=[F32, I64])
    ties = rnd(shape, I32, 0, 0, 2).astype(F32)  # many ties: first index wins, as in torch
    check("aten::max_pool2d_with_indices.out", strided(ties), k, s, p, d, ceil, dts=[F32, I64])
    check("aten::max_pool2d_with_indices.out", rnd(shape, I64, 0, -5, 5), k, s, p, d, ceil, dts=[I64, I64])


def test_max_pool2d_neg_inf_and_nan() -> None:
    x = np.full((1, 1, 4, 4), -np.inf, F32)
    check("aten::max_pool2d_with_indices.out", x, [3, 3], [2, 2], [1, 1], [1, 1], False, dts=[F32, I64])
    check("aten::max_pool2d_with_indices.out", x, [2, 2], [2, 2], [0, 0], [1, 1], False, dts=[F32, I64])
    x = rnd((1, 1, 6, 6))
    x[0, 0, 1, 1] = np.nan
    check("aten::max_pool2d_with_indices.out", x, [2, 2], [2, 2], [0, 0], [1, 1], False, dts=[F32, I64])
    # Two NaNs in one window: torch reports the last one.
    x[0, 0, 0, 1] = np.nan
    x[0, 0, 4:, 4:] = -np.inf
    check("aten::max_pool2d_with_indices.out", x, [2, 2], [2, 2], [0, 0], [1, 1], False, dts=[F32, I64])
    check("aten::max_pool2d_with_indices.out", x, [3, 3], [1, 1], [0, 0], [1, 1], False, dts=[F32, I64])


@pytest.mark.parametrize(
    "shape,k,s,p,ceil,cip,div",
    [
        ((1, 3, 8, 8), [2, 2], [2, 2], [0, 0], False, True, None),
        ((2, 3, 9, 11), [3, 3], [2, 2], [1, 1], False, True, None),
        ((2, 3, 9, 11), [3, 3], [2, 2], [1, 1], False, False, None),
        ((2, 3, 9, 11), [3, 3], [2, 2], [1, 1], True, True, None),
        ((2, 3, 9, 11), [3, 3], [2, 2], [1, 1], True, False, None),
        ((1, 2, 10, 10), [3, 2], [], [1, 1], True, True, 5),
        ((3, 7, 6), [2, 3], [1, 2], [1, 0], False, False, None),
    ],
)
def test_avg_pool2d(shape: tuple[int, ...], k: list[int], s: list[int], p: list[int], ceil: bool, cip: bool, div: int | None) -> None:
    check("aten::avg_pool2d.out", rnd(shape), k, s, p, ceil, cip, div)
    check("aten::avg_pool2d.out", strided(rnd(shape)), k, s, p, ceil, cip, div)


@pytest.mark.parametrize(
    "shape,size", [((2, 3, 8, 8), [1, 1]), ((2, 3, 8, 12), [4, 3]), ((1, 2, 7, 10), [3, 4]), ((3, 9, 5), [2, 5]), ((1, 2, 5, 5), [7, 7])]
)
def test_adaptive_avg_pool2d(shape: tuple[int, ...], size: list[int]) -> None:
    check("aten::_adaptive_avg_pool2d.out", rnd(shape), size)
    check("aten::adaptive_avg_pool2d.out", strided(rnd(shape)), size)


@pytest.mark.parametrize(
    "shape,size,scales",
    [
        ((1, 3, 4, 5), [8, 10], None),
        ((1, 3, 4, 5), [12, 5], None),
        ((2, 2, 5, 7), [3, 11], None),
        ((2, 2, 5, 7), None, [2.0, 2.0]),
        ((2, 2, 5, 7), None, [1.5, 2.5]),
        ((2, 2, 6, 6), None, [0.5, 0.7]),
    ],
)
def test_upsample_nearest2d(shape: tuple[int, ...], size: list[int] | None, scales: list[float] | None) -> None:
    check("aten::upsample_nearest2d.vec_out", rnd(shape), size, scales)
    check("aten::upsample_nearest2d.vec_out", strided(rnd(shape, np.uint8, 0, 0, 200)), size, scales)
    if size is not None:
        check("aten::upsample_nearest2d.out", rnd(shape), size, None, None)
    else:
        h, w = shape[-2:]
        osize = [int(math.floor(h * scales[0])), int(math.floor(w * scales[1]))]
        check("aten::upsample_nearest2d.out", rnd(shape), osize, scales[0], scales[1])


@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize(
    "shape,size,scales",
    [((1, 3, 4, 5), [8, 10], None), ((2, 2, 5, 7), [3, 11], None), ((2, 2, 5, 7), None, [1.5, 2.5]), ((1, 1, 4, 4), [1, 1], None)],
)
def test_upsample_bilinear2d(shape: tuple[int, ...], size: list[int] | None, scales: list[float] | None, align: bool) -> None:
    check("aten::upsample_bilinear2d.vec_out", rnd(shape), size, align, scales)
    if size is not None:
        check("aten::upsample_bilinear2d.out", strided(rnd(shape)), size, align, None, None)


# --------------------------------------------------------------------------- shape ops

S = (2, 3, 4)


@pytest.mark.parametrize(
    "name,args,dt",
    [
        ("aten::view_copy.out", lambda: (rnd(S), [6, 4]), None),
        ("aten::view_copy.out", lambda: (strided(rnd(S)), [-1, 2]), None),
        ("aten::view_copy.out", lambda: (fortran(rnd(S, I64)), [24]), None),
        ("aten::_unsafe_view.out", lambda: (rnd(S), [4, -1]), None),
        ("aten::permute_copy.out", lambda: (rnd(S), [2, 0, 1]), None),
        ("aten::permute_copy.out", lambda: (strided(rnd(S)), [-1, 1, 0]), None),
        ("aten::transpose_copy.int_out", lambda: (rnd(S), 0, -1), None),
        ("aten::t_copy.out", lambda: (rnd((3, 5)),), None),
        ("aten::expand_copy.out", lambda: (rnd((3, 1)), [2, 3, 4], False), None),
        ("aten::expand_copy.out", lambda: (rnd((3, 1)), [-1, 5], False), None),
        ("aten::clone.out", lambda: (strided(rnd(S)), None), None),
        ("aten::alias_copy.out", lambda: (rnd(S),), None),
        ("aten::_to_copy.out", lambda: (rnd(S) * 10, False, None), I32),
        ("aten::_to_copy.out", lambda: (rnd(S), False, None), F64),
        ("aten::_to_copy.out", lambda: (rnd(S, I64), False, None), F32),
        ("aten::_to_copy.out", lambda: (rnd(S, I32, 0, -1, 1), False, None), BOOL),
        ("aten::copy.out", lambda: (rnd(S), rnd((4,), seed=1), False), None),
        ("aten::select_copy.int_out", lambda: (rnd(S), 1, -1), None),
        ("aten::select_copy.int_out", lambda: (strided(rnd(S)), 2, 3), None),
        ("aten::slice_copy.Tensor_out", lambda: (rnd(S), 2, 1, 3, 1), None),
        ("aten::slice_copy.Tensor_out", lambda: (rnd(S), -1, None, None, 2), None),
        ("aten::slice_copy.Tensor_out", lambda: (rnd(S), 1, -2, 2**63 - 1, 1), None),
        ("aten::slice_copy.Tensor_out", lambda: (rnd(S), 0, 5, 10, 1), None),
        ("aten::slice_copy.Tensor_out", lambda: (strided(rnd(S)), 2, -100, -1, 1), None),
        ("aten::unsqueeze_copy.out", lambda: (rnd(S), -1), None),
        ("aten::unsqueeze_copy.out", lambda: (rnd(S), 0), None),
        ("aten::squeeze_copy.dims_out", lambda: (rnd((1, 3, 1, 4)), [0, 1, -2]), None),
        ("aten::squeeze_copy.dim_out", lambda: (rnd((1, 3, 1, 4)), 2), None),
        ("aten::squeeze_copy.dim_out", lambda: (rnd((1, 3, 1, 4)), 1), None),
        ("aten::squeeze_copy.out", lambda: (rnd((1, 3, 1, 4)),), None),
        ("aten::index_select.out", lambda: (rnd(S), 1, np.array([2, 0, 2], I64)), None),
        ("aten::gather.out", lambda: (rnd(S), 2, rnd((2, 2, 3), I64, 1, 0, 3), False), None),
        ("aten::embedding.out", lambda: (rnd((10, 4)), rnd((2, 5), I64, 1, 0, 9), -1, False, False), None),
        ("aten::embedding.out", lambda: (rnd((10, 4)), rnd((7,), I32, 1, 0, 9), -1, False, False), None),
        ("aten::constant_pad_nd.out", lambda: (rnd(S), [1, 2], 0.0), None),
        ("aten::constant_pad_nd.out", lambda: (rnd(S), [1, 1, 2, 0, 0, 1], -1.5), None),
        ("aten::constant_pad_nd.out", lambda: (strided(rnd(S)), [-1, 2, 1, -1], 3.0), None),
        ("aten::constant_pad_nd.out", lambda: (rnd(S, I64), [2, 2], 7), None),
        ("aten::repeat.out", lambda: (rnd(S), [1, 2, 1, 3]), None),
        ("aten::flip.out", lambda: (rnd(S), [0, -1]), None),
        ("aten::roll.out", lambda: (rnd(S), [1, -2], [0, 2]), None),
        ("aten::roll.out", lambda: (rnd(S), [5], []), None),
        ("aten::tril.out", lambda: (rnd((2, 4, 5)), 1), None),
        ("aten::triu.out", lambda: (rnd((4, 5)), -1), None),
        ("aten::pixel_shuffle.out", lambda: (rnd((1, 8, 3, 2)), 2), None),
        ("aten::pixel_unshuffle.out", lambda: (rnd((1, 2, 4, 6)), 2), None),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_shape_ops(name: str, args: Callable[[], tuple[Any, ...]], dt: Any) -> None:
    check(name, *args(), dts=dt)


def test_cat_stack() -> None:
    a, b = rnd((2, 3, 4)), rnd((2, 5, 4), seed=1)
    check("aten::cat.out", [a, strided(b)], 1)
    check("aten::cat.out", [a, a, a], -1)
    check("aten::cat.out", [a, np.zeros((0,), F32), a], 0)
    check("aten::cat.out", [rnd((3,), I32), rnd((2,), I64)], 0, dts=I64)
    check("aten::stack.out", [a, a * 2], 1)
    check("aten::stack.out", [a, strided(a)], -1)


def test_split() -> None:
    x = rnd((6, 5))

    def pieces(parts: Any) -> list[list[np.ndarray]]:
        return [[p.numpy().copy() for p in parts]]

    t = torch.from_numpy(x)
    check("aten::split_with_sizes_copy.out", x, [2, 1, 3], 0, expected=pieces(torch.split(t, [2, 1, 3], 0)))
    check("aten::split_with_sizes_copy.out", strided(x), [4, 1], -1, expected=pieces(torch.split(t, [4, 1], -1)))
    check("aten::split_copy.Tensor_out", x, 4, 0, expected=pieces(torch.split(t, 4, 0)))
    check("aten::split_copy.Tensor_out", x, 2, 1, expected=pieces(torch.split(t, 2, 1)))
    check("aten::unbind_copy.int_out", x, 1, expected=pieces(torch.unbind(t, 1)))
    raises(Error.InvalidArgument, get_kernel("aten::split_with_sizes_copy.out").fn, x, [2, 2], 0, [None, None])


def test_index_tensor() -> None:
    x = rnd((4, 5, 6))
    check("aten::index.Tensor_out", x, [np.array([0, 3, 3], I64)])
    check("aten::index.Tensor_out", x, [None, np.array([[1, 2], [4, 0]], I64)])
    check("aten::index.Tensor_out", x, [np.array([0, 1], I64), None, np.array([5, 2], I64)])
    check("aten::index.Tensor_out", strided(x), [np.array([1, 2], I32), np.array([0, -1], I64)])
    check("aten::index.Tensor_out", x, [x[:, 0, 0] > 0])
    raises(Error.InvalidArgument, get_kernel("aten::index.Tensor_out").fn, x, [np.array([9], I64)], None)


def test_shape_errors() -> None:
    x = rnd(S)
    raises(Error.InvalidArgument, get_kernel("aten::view_copy.out").fn, x, [5, -1], None)
    raises(Error.InvalidArgument, get_kernel("aten::select_copy.int_out").fn, x, 1, 3, None)
    raises(Error.InvalidArgument, get_kernel("aten::permute_copy.out").fn, x, [0, 0, 1], None)
    raises(Error.InvalidArgument, get_kernel("aten::unsqueeze_copy.out").fn, x, 4, None)
    raises(Error.InvalidArgument, get_kernel("aten::embedding.out").fn, rnd((3, 2)), np.array([3], I64), -1, False, False, None)


# --------------------------------------------------------------------------- creation


def test_creation() -> None:
    check("aten::full.out", [2, 3], 1.5, dts=F32)
    check("aten::full.out", [4], 7, dts=I64)
    check("aten::full_like.out", rnd(S), -2.0, None)
    check("aten::zeros.out", [3, 2], dts=F32)
    check("aten::ones.out", [3, 2], dts=I32)
    check("aten::zeros_like.out", rnd(S, I64), None)
    check("aten::ones_like.out", strided(rnd(S)), None)
    check("aten::fill.Scalar_out", rnd(S), 3.25)
    check("aten::fill.Tensor_out", rnd(S), np.array(2.5, F32))
    check("aten::scalar_tensor.out", 3.5, dts=F32)
    check("aten::arange.start_out", 0, 10, 3, dts=I64)
    check("aten::arange.start_out", 10, -3, -2, dts=I64)
    check("aten::arange.start_out", 0.0, 1.0, 0.1, dts=F32)
    check("aten::arange.start_out", -1.5, 2.25, 0.25, dts=F64)
    check("aten::arange.out", 7, dts=I64)
    check("aten::arange.out", 5, dts=F32)
    empty = get_kernel("aten::empty.out").fn
    o = np.empty((2, 3), F32)
    assert empty([2, 3], None, o) is o
    assert empty([4], None, o).shape == (4,)
    raises(Error.InvalidArgument, get_kernel("aten::arange.start_out").fn, 0, 5, 0, None)


# --------------------------------------------------------------------------- executorch ops


def test_dim_order_ops() -> None:
    x = strided(rnd(S))
    for name in ("dim_order_ops::_to_dim_order_copy.out", "dim_order_ops::_clone_dim_order.out"):
        fn = get_kernel(name).fn
        o = np.empty(S, F32)
        assert fn(x, False, [0, 1, 2], o) is o
        np.testing.assert_array_equal(o, x)
        r = fn(x, False, None, np.empty((1,), F32))
        assert r.shape == S and r.dtype == F32
        np.testing.assert_array_equal(r, x)
    conv = get_kernel("dim_order_ops::_to_dim_order_copy.out").fn
    o = np.empty(S, I32)
    assert conv(x * 10, False, None, o) is o
    np.testing.assert_array_equal(o, (x * 10).astype(I32))
    r = conv(x, False, None, np.empty((0,), F64))
    assert r.dtype == F64 and r.shape == S
    empty = get_kernel("dim_order_ops::_empty_dim_order.out").fn
    o = np.empty(S, F32)
    assert empty(list(S), [0, 1, 2], o) is o


def test_sym_ops() -> None:
    x = rnd((2, 3, 5))
    assert get_kernel("aten::sym_size.int").fn(x, 1) == 3
    assert get_kernel("aten::sym_size.int").fn(x, -1) == 5
    assert type(get_kernel("aten::sym_size.int").fn(x, 0)) is int
    assert get_kernel("aten::sym_numel").fn(x) == 30
    dense = get_kernel("aten::_local_scalar_dense").fn
    assert dense(np.array([2.5], F32)) == 2.5 and type(dense(np.array([2.5], F32))) is float
    assert dense(np.array(7, I64)) == 7 and type(dense(np.array(7, I64))) is int
    raises(Error.InvalidArgument, get_kernel("aten::sym_size.int").fn, x, 3)


@pytest.mark.parametrize(
    "name,args,expected",
    [
        ("add", (3, 4), 7),
        ("add", (3, 0.5), 3.5),
        ("sub", (3, 5), -2),
        ("mul", (3, 2.5), 7.5),
        ("floordiv", (7, 2), 3),
        ("floordiv", (-7, 2), -4),
        ("floordiv", (7.5, 2), 3.0),
        ("floordiv", (-7.5, 2.0), -4.0),
        ("floordiv", (1.0, 0.0), math.inf),
        ("floordiv", (-1.0, 0.0), -math.inf),
        ("truediv", (7, 2), 3.5),
        ("truediv", (1, 0), math.inf),
        ("mod", (7, 3), 1),
        ("mod", (-7, 3), 2),
        ("eq", (3, 3), True),
        ("eq", (3, 3.5), False),
        ("gt", (3, 2), True),
        ("lt", (3, 2), False),
        ("ge", (2, 2), True),
        ("le", (2.5, 2), False),
        ("neg", (3,), -3),
        ("sym_float", (3,), 3.0),
        ("sym_int", (3.7,), 3),
        ("ceil", (2.1,), 3),
        ("round", (2.5,), 2),
        ("round", (3.5,), 4),
        ("trunc", (-2.7,), -2),
        ("sym_max", (2, 5), 5),
        ("sym_min", (2, 5), 2),
        ("sym_not", (True,), False),
        ("sym_ite", (False, 1, 2), 2),
    ],
)
def test_executorch_prim_scalar_ops(name: str, args: tuple[Any, ...], expected: Any) -> None:
    k = get_kernel(f"executorch_prim::{name}.Scalar")
    assert k.num_params == len(args)
    got = k.fn(*args)
    assert got == expected and type(got) is type(expected), (got, expected)


def test_executorch_prim_errors_and_int_overloads() -> None:
    raises(Error.InvalidArgument, get_kernel("executorch_prim::floordiv.Scalar").fn, 1, 0)
    raises(Error.InvalidArgument, get_kernel("executorch_prim::mod.Scalar").fn, 1, 0)
    assert get_kernel("executorch_prim::floordiv.int").fn(9, 4) == 2
    assert get_kernel("executorch_prim::mod.int").fn(9, 4) == 1
    # The interpreter serialises prim ops as [a, b, result]: num_params excludes the result.
    values = [6, 4, None]
    k = get_kernel("executorch_prim::sub.Scalar")
    assert k.fn(*values[: k.num_params]) == 2


def test_et_view() -> None:
    x = rnd((2, 6))
    v = get_kernel("executorch_prim::et_view.default").fn(x, [3, -1])
    assert v.shape == (3, 4) and np.shares_memory(v, x)
    raises(Error.InvalidArgument, get_kernel("executorch_prim::et_view.default").fn, x, [5, 5])


def test_et_copy_index() -> None:
    fn = get_kernel("executorch_prim::et_copy_index.tensor").fn
    acc = np.zeros((3, 2, 2), F32)
    r = fn(acc, np.ones((2, 2), F32), 1)
    assert r is acc and acc[1].sum() == 4 and acc[0].sum() == 0
    # Growing a dynamic tensor: the result holds the old rows and the new one.
    cur = np.arange(4, dtype=F32).reshape(1, 2, 2)
    r = fn(cur, np.full((2, 2), 9, F32), 1)
    assert r.shape == (2, 2, 2)
    np.testing.assert_array_equal(r[0], cur[0])
    np.testing.assert_array_equal(r[1], np.full((2, 2), 9, F32))
    r = fn(np.zeros((0, 3), F32), np.ones((3,), F32), 0)
    assert r.shape == (1, 3)


def test_copy_in_place_and_alias() -> None:
    dst = np.zeros(S, F32)
    src = rnd((4,))
    assert get_kernel("aten::copy_").fn(dst, src, False) is dst
    np.testing.assert_array_equal(dst, np.broadcast_to(src, S))
    x = rnd(S)
    assert get_kernel("aten::alias").fn(x) is x


# --------------------------------------------------------------------------- concurrency


def test_kernels_are_thread_safe() -> None:
    conv = get_kernel("aten::convolution.out").fn
    soft = get_kernel("aten::_softmax.out").fn
    gelu = get_kernel("aten::gelu.out").fn
    inputs = [rnd((1, 8, 16, 16), seed=i) for i in range(4)]
    w = rnd((8, 8, 3, 3), seed=99)
    expected = [soft(gelu(conv(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, None), "none", None), 1, False, None) for x in inputs]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(30):
                out = np.empty((1, 8, 16, 16), F32)
                y = conv(inputs[i], w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, out)
                y = gelu(y, "none", np.empty_like(y))
                y = soft(y, 1, False, np.empty_like(y))
                np.testing.assert_array_equal(y, expected[i])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


# --------------------------------------------------------------------------- fast paths
# Kernels check the common case first (same dtypes, an ``out`` of the result's shape) and
# fall back to their general path otherwise; these cover the edges of those checks.


def readonly(shape: tuple[int, ...], dtype: Any = F32) -> np.ndarray:
    a = np.zeros(shape, dtype)
    a.flags.writeable = False
    return a


def test_fast_paths_do_not_broadcast_into_a_bigger_out() -> None:
    a, b = rnd((4, 5)), rnd((4, 5), seed=1)
    for name, args, exp in (
        ("aten::add.out", (a, b, 1), a + b),
        ("aten::mul.out", (a, b), a * b),
        ("aten::sub.Scalar_out", (a, 2.0, 1), a - 2),
        ("aten::lt.Tensor_out", (a, b), a < b),
        ("aten::relu.out", (a,), np.maximum(a, 0)),
    ):
        big = np.zeros((2, 4, 5), exp.dtype)
        res = get_kernel(name).fn(*args, big)
        assert res is not big and res.shape == (4, 5), name
        np.testing.assert_allclose(res, exp, rtol=1e-6, err_msg=name)
        assert not big.any(), name
    mm = get_kernel("aten::mm.out").fn
    res = mm(rnd((5, 7)), rnd((7, 3), seed=1), np.zeros((2, 5, 3), F32))
    assert res.shape == (5, 3)


def test_fast_paths_with_readonly_or_noncontiguous_outs() -> None:
    a, b = rnd((4, 5)), rnd((4, 5), seed=1)
    for name, args, exp in (
        ("aten::add.out", (a, b, 1), a + b),
        ("aten::permute_copy.out", (a, [1, 0]), a.T),
        ("aten::view_copy.out", (a, [5, 4]), a.reshape(5, 4)),
        ("aten::clone.out", (a, None), a),
        ("aten::tanh.out", (a,), np.tanh(a)),
        ("aten::sigmoid.out", (a,), 1 / (1 + np.exp(-a))),
        ("aten::hardtanh.out", (a, -1.0, 1.0), np.clip(a, -1, 1)),
        ("aten::mm.out", (a, b.T), a @ b.T),
        ("aten::addmm.out", (rnd((4,), seed=2), a, b.T, 1, 1), a @ b.T + rnd((4,), seed=2)),
        ("aten::linear.out", (a, b, None), a @ b.T),
        ("aten::_softmax.out", (a, -1, False), torch.softmax(torch.from_numpy(a), -1).numpy()),
        ("aten::mean.out", (a, [-1], True, None), a.mean(-1, keepdims=True)),
    ):
        res = get_kernel(name).fn(*args, readonly(exp.shape))
        np.testing.assert_allclose(res, exp, rtol=1e-5, atol=1e-6, err_msg=name)
        out = fortran(np.zeros(exp.shape, F32))  # np.dot refuses such an out: the general path
        res = get_kernel(name).fn(*args, out)
        assert res is out, name
        np.testing.assert_allclose(out, exp, rtol=1e-5, atol=1e-6, err_msg=name)
    x = rnd((2, 3, 8))
    w, bias = rnd((8,), seed=1), rnd((8,), seed=2)
    ref = [t.numpy() for t in torch.native_layer_norm(torch.from_numpy(x), [8], torch.from_numpy(w), torch.from_numpy(bias), 1e-5)]
    outs = (np.zeros(x.shape, F32), np.zeros((2, 3, 2), F32)[..., :1], np.zeros((2, 3, 2), F32)[..., 1:])
    assert not outs[1].flags.c_contiguous
    res = get_kernel("aten::native_layer_norm.out").fn(x, [8], w, bias, 1e-5, *outs)
    for r, e in zip(res, ref):
        np.testing.assert_allclose(r, e, rtol=1e-5, atol=1e-5)
    bn = get_kernel("aten::_native_batch_norm_legit_no_training.out").fn
    x = rnd((1, 3, 4, 4))
    v = [rnd((3,), seed=i, lo=0.5, hi=2) for i in range(4)]
    exp = (x - v[2].reshape(3, 1, 1)) / np.sqrt(v[3].reshape(3, 1, 1) + 1e-5) * v[0].reshape(3, 1, 1) + v[1].reshape(3, 1, 1)
    res = bn(x, *v, 0.1, 1e-5, readonly(x.shape), np.empty((0,), F32), np.empty((0,), F32))
    np.testing.assert_allclose(res[0], exp, rtol=1e-5, atol=1e-5)


def test_fast_paths_in_place() -> None:
    """An out that is also an input (numpy copies overlapping operands)."""
    x, y = rnd(A), rnd(A, seed=1)
    exp = x + y
    assert get_kernel("aten::add.out").fn(x, y, 1, x) is x
    np.testing.assert_allclose(x, exp, rtol=1e-6)
    a = rnd((4, 4))
    exp = a @ a
    assert get_kernel("aten::mm.out").fn(a, a, a) is a
    np.testing.assert_allclose(a, exp, rtol=1e-5)
    a = rnd((4, 4))
    exp = torch.softmax(torch.from_numpy(a), -1).numpy()
    assert get_kernel("aten::_softmax.out").fn(a, -1, False, a) is a
    np.testing.assert_allclose(a, exp, rtol=1e-5)
    a = rnd((4, 4))
    exp = a.T.copy()
    assert get_kernel("aten::permute_copy.out").fn(a, [1, 0], a) is a
    np.testing.assert_array_equal(a, exp)


def test_softmax_non_finite_rows_and_many_rows() -> None:
    y = rnd((4, 6)) * 10
    y[0] = -np.inf  # all -inf: NaN row
    y[1, 2] = np.inf  # +inf: NaN row
    y[2, 0] = np.nan
    y[3, :2] = -np.inf
    for name in ("aten::_softmax.out", "aten::_log_softmax.out"):
        check(name, y, -1, False)
        check(name, y, 0, False)
        with np.errstate(all="raise"):  # no floating-point warnings escape the kernel
            get_kernel(name).fn(y, -1, False, np.empty_like(y))
        check(name, rnd((100, 7)), -1, False)  # many rows
        check(name, rnd((100, 7)), 0, False)


@pytest.mark.parametrize("dt", [F32, np.float64], ids=str)
def test_mean_over_trailing_dims_by_product(dt: Any) -> None:
    """A global average pool (trailing dims of a C-contiguous x, kept or not, in either
    order) sums by one product; leading dims, a strided x or out, a 1-element reduction and
    NaN / inf take or give what torch does."""
    mean = get_kernel("aten::mean.out").fn
    x = rnd((2, 5, 7, 9), dt, lo=-4, hi=4)
    x[1, 3, 2, 2] = np.nan
    x[0, 1, 0, 0] = np.inf
    x[0, 2, 0, 0], x[0, 2, 1, 1] = np.inf, -np.inf
    tx = torch.from_numpy(x)
    tol = dict(rtol=1e-6 if dt == F32 else 1e-13, atol=1e-6 if dt == F32 else 1e-13, equal_nan=True)
    for dims, keep in (([-1, -2], True), ([2, 3], False), ([3], True), ([1, 2, 3], False), ([0, 1], True),
                       ([1, 3], True)):
        exp = torch.mean(tx, dims, keepdim=keep).numpy()
        out = np.full(exp.shape, 123, dt)
        assert mean(x, dims, keep, None, out) is out
        np.testing.assert_allclose(out, exp, **tol, err_msg=str(dims))
        wide = np.zeros(exp.shape + (2,), dt)
        mean(x, dims, keep, None, wide[..., 0])
        np.testing.assert_allclose(wide[..., 0], exp, **tol)
        strided_x = np.zeros(x.shape + (2,), dt)
        strided_x[..., 0] = x
        np.testing.assert_allclose(mean(strided_x[..., 0], dims, keep, None, np.empty_like(exp)), exp, **tol)
    one = rnd((3, 4, 1, 1), dt)
    np.testing.assert_array_equal(mean(one, [2, 3], True, None, np.empty_like(one)), one)


@pytest.mark.parametrize("dt", [F32, np.float64], ids=str)
def test_softmax_large_inputs_in_and_out_of_exp_range(dt: Any) -> None:
    """Over 4096 elements along the last dim: within +-60 (600 for float64) exp needs no shift
    by the row maxima; a value past it, -inf (a mask), inf or NaN anywhere takes the shifted
    path; each matches torch, in place and into a strided out too, with no FP warnings."""
    lim, span = (60.0, 85.0) if dt == F32 else (600.0, 700.0)
    base = rnd((2, 3, 40, 41), dt, lo=-1, hi=1)
    near = (span - math.log(41)) / 2 * 0.99
    cases = {"in_range": base * near, "wide_span": base * near * 1.1, "past_the_limit": base * lim * 1.5}
    shifted = (base + 1) * (lim * 0.99) - lim * 0.99 * 0.02  # in (-lim, lim), span ~2 lim: the slow path
    cases["offset"] = (base * 20 + (lim - 21)).astype(dt)  # near +lim: fast
    for v in (-np.inf, np.inf, np.nan, -1e9):
        y = base * 10
        y[1, 2, 3, :5] = v
        cases[f"with_{v}"] = y
    from orchestra.runtime.kernels import _reduce
    from orchestra.runtime.kernels._reduce import _in_exp_range
    assert [k for k, x in cases.items() if _in_exp_range(x)] == ["in_range", "offset"]
    assert not _in_exp_range(shifted)
    compiled = _reduce._native
    for native in {compiled, None}:  # the compiled softmax (float32) where built, and numpy's paths
        _reduce._native = native
        try:
            for what, x in cases.items():
                exp = torch.softmax(torch.from_numpy(x), -1).numpy()
                with np.errstate(all="raise", under="ignore"):  # underflow: numpy's default, ignored
                    got = get_kernel("aten::_softmax.out").fn(x, -1, False, np.empty_like(x))
                # torch (and the shifted paths) subtract the row max in float32: x - max rounds,
                # ~1e-6 relative for results 40 below the max.
                np.testing.assert_allclose(got, exp, rtol=1e-5 if dt == F32 else 1e-12, atol=1e-30, equal_nan=True,
                                           err_msg=what)
                if dt == F32 and _in_exp_range(x) and native is None:  # the unshifted path: a few ulp of exact
                    ref = torch.softmax(torch.from_numpy(x.astype(np.float64)), -1).numpy()
                    np.testing.assert_allclose(got, ref, rtol=6e-7, atol=1e-37, err_msg=what)
                y = x.copy()
                assert get_kernel("aten::_softmax.out").fn(y, -1, False, y) is y
                np.testing.assert_array_equal(y, got, err_msg=what)
                wide = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), dt)
                get_kernel("aten::_softmax.out").fn(x, -1, False, wide[..., ::2])
                np.testing.assert_array_equal(wide[..., ::2], got)
        finally:
            _reduce._native = compiled
    check("aten::_softmax.out", base * 50, 2, False)  # another dim: the shifted path


def test_softmax_small_inputs() -> None:
    """Small values (exp needs no max subtraction) in every layout the kernel sees."""
    for name in ("aten::_softmax.out", "aten::_log_softmax.out"):
        for dim in (-1, 0, 1):
            check(name, rnd((2, 8, 8)), dim, False)
        check(name, rnd((1, 10), F64), -1, False)
        check(name, strided(rnd((3, 5))), -1, False)
        check(name, np.array([[63.0, -63.0, 0.0]], F32), -1, False)


def test_fast_path_errors_with_outs() -> None:
    x = rnd(S)
    raises(Error.InvalidArgument, get_kernel("aten::permute_copy.out").fn, x, [0, 0, 1], np.empty((2, 2, 3), F32))
    raises(Error.InvalidArgument, get_kernel("aten::permute_copy.out").fn, x, [0, 1, 3], np.empty(S, F32))
    raises(Error.InvalidArgument, get_kernel("aten::mean.out").fn, x, [1, 1], False, None, np.empty((2, 4), F32))
    raises(Error.InvalidArgument, get_kernel("aten::mean.out").fn, x, [3], False, None, np.empty((2, 3), F32))
    emb = get_kernel("aten::embedding.out").fn
    for bad_index in (-1, 3):
        raises(Error.InvalidArgument, emb, rnd((3, 2)), np.array([0, bad_index], I64), -1, False, False, np.empty((2, 2), F32))
        raises(Error.InvalidArgument, emb, rnd((3, 2)), np.array([bad_index], I32), -1, False, False, np.empty((1, 2), F32))
    mm = get_kernel("aten::mm.out").fn
    raises(Error.InvalidArgument, mm, rnd((2, 3)), rnd((4, 2)), np.empty((2, 2), F32))


def test_conv2d_fast_path_shapes() -> None:
    # No padding on a strided input (as_strided windows), and a larger stride-1 input
    # (whole padded rows gathered).
    x = strided(rnd((1, 3, 8, 8)))
    check("aten::convolution.out", x, rnd((4, 3, 3, 3), seed=1), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, rtol=1e-4, atol=1e-4)
    check("aten::convolution.out", rnd((1, 8, 32, 32)), rnd((4, 8, 3, 3), seed=1), rnd((4,), seed=2), [1, 1], [1, 1], [1, 1], False, [0, 0], 1, rtol=1e-4, atol=1e-4)
    check("aten::convolution.out", rnd((2, 8, 32, 32)), rnd((4, 8, 3, 3), seed=1), None, [1, 1], [2, 2], [2, 2], False, [0, 0], 1, rtol=1e-4, atol=1e-4)


def test_sigmoid_extremes_without_warnings() -> None:
    import warnings

    for dt in (F32, F64):
        x = np.array([-1000, -750, -90, -80.5, -20, 0, 20, 90, np.inf, -np.inf, np.nan], dt)
        for xs in (x, np.tile(x, 10)):  # a few elements (checked in Python) and more
            check("aten::sigmoid.out", xs)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                get_kernel("aten::sigmoid.out").fn(xs, np.empty_like(xs))


def test_registry_kernel_def_keeps_parameter_names_and_dtype_objects() -> None:
    # Plan compilation reads these instead of inspect.signature and dtype.name per instruction.
    for name in kernel_names():
        k = get_kernel(name)
        assert k.param_names == tuple(inspect.signature(k.fn).parameters)[: k.num_params], name
        if k.dtypes is None:
            assert k.numpy_dtypes is None
        else:
            assert k.numpy_dtypes == frozenset(np.dtype(d) for d in k.dtypes), name
            assert {d.name for d in k.numpy_dtypes} == k.dtypes
