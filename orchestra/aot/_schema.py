"""Operator schemas without torch: argument names, order, types, defaults and outputs.

A schema comes from orchestra's kernel registry: each kernel's Python signature lists the
operator's schema arguments in order, by name, ``out`` arguments included, and its
annotations say each argument's type. What a signature can't say is kept in three small
tables below, checked against torch's own schemas by ``tests/test_aot.py`` when torch is
installed: schema defaults, the out arguments of ops whose outs are not named ``out`` /
``outN``, and the few arguments whose annotation is looser than the schema type.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..errors import OperatorMissingError
from ..runtime.kernels import KernelDef, get_kernel, nearest_kernel_names

__all__ = ["REQUIRED", "OperatorSchema", "SchemaArgument", "operator_schema"]


class _Required:
    """The default of an argument that has none."""

    _instance: _Required | None = None

    def __new__(cls) -> _Required:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()

# Schema defaults (torch's ``default_value``) of every registered operator that has some.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "aten::_to_copy.out": {"non_blocking": False, "memory_format": None},
    "aten::add.Scalar_out": {"alpha": 1},
    "aten::add.out": {"alpha": 1},
    "aten::addmm.out": {"beta": 1, "alpha": 1},
    "aten::all.dims_out": {"dim": None, "keepdim": False},
    "aten::all.out": {"keepdim": False},
    "aten::amax.out": {"dim": [], "keepdim": False},
    "aten::amin.out": {"dim": [], "keepdim": False},
    "aten::any.dims_out": {"dim": None, "keepdim": False},
    "aten::any.out": {"keepdim": False},
    "aten::arange.start_out": {"step": 1},
    "aten::argmax.out": {"dim": None, "keepdim": False},
    "aten::argmin.out": {"dim": None, "keepdim": False},
    "aten::avg_pool2d.out": {"stride": [], "padding": [0, 0], "ceil_mode": False,
                             "count_include_pad": True, "divisor_override": None},
    "aten::cat.out": {"dim": 0},
    "aten::clamp.Tensor_out": {"min": None, "max": None},
    "aten::clamp.out": {"min": None, "max": None},
    "aten::clone.out": {"memory_format": None},
    "aten::constant_pad_nd.out": {"value": 0},
    "aten::copy.out": {"non_blocking": False},
    "aten::copy_": {"non_blocking": False},
    "aten::cumsum.out": {"dtype": None},
    "aten::elu.out": {"alpha": 1, "scale": 1, "input_scale": 1},
    "aten::embedding.out": {"padding_idx": -1, "scale_grad_by_freq": False, "sparse": False},
    "aten::empty.out": {"memory_format": None},
    "aten::expand_copy.out": {"implicit": False},
    "aten::full_like.out": {"memory_format": None},
    "aten::gather.out": {"sparse_grad": False},
    "aten::gelu.out": {"approximate": "none"},
    "aten::glu.out": {"dim": -1},
    "aten::hardtanh.out": {"min_val": -1, "max_val": 1},
    "aten::leaky_relu.out": {"negative_slope": 0.01},
    "aten::linear.out": {"bias": None},
    "aten::log_softmax.int_out": {"dtype": None},
    "aten::logsumexp.out": {"keepdim": False},
    "aten::max.dim_max": {"keepdim": False},
    "aten::max_pool2d_with_indices.out": {"stride": [], "padding": [0, 0], "dilation": [1, 1],
                                          "ceil_mode": False},
    "aten::mean.dtype_out": {"dtype": None},
    "aten::mean.out": {"keepdim": False, "dtype": None},
    "aten::min.dim_min": {"keepdim": False},
    "aten::ones_like.out": {"memory_format": None},
    "aten::prod.int_out": {"keepdim": False, "dtype": None},
    "aten::prod.out": {"dtype": None},
    "aten::roll.out": {"dims": []},
    "aten::rsub.Scalar_out": {"alpha": 1},
    "aten::slice_copy.Tensor_out": {"dim": 0, "start": None, "end": None, "step": 1},
    "aten::softmax.int_out": {"dtype": None},
    "aten::split_copy.Tensor_out": {"dim": 0},
    "aten::split_with_sizes_copy.out": {"dim": 0},
    "aten::stack.out": {"dim": 0},
    "aten::std.correction_out": {"dim": None, "correction": None, "keepdim": False},
    "aten::std.out": {"unbiased": True, "keepdim": False},
    "aten::sub.Scalar_out": {"alpha": 1},
    "aten::sub.out": {"alpha": 1},
    "aten::sum.IntList_out": {"keepdim": False, "dtype": None},
    "aten::sum.out": {"dtype": None},
    "aten::tril.out": {"diagonal": 0},
    "aten::triu.out": {"diagonal": 0},
    "aten::unbind_copy.int_out": {"dim": 0},
    "aten::upsample_bilinear2d.out": {"scales_h": None, "scales_w": None},
    "aten::upsample_nearest2d.out": {"scales_h": None, "scales_w": None},
    "aten::var.correction_out": {"dim": None, "correction": None, "keepdim": False},
    "aten::var.out": {"unbiased": True, "keepdim": False},
    "aten::var_mean.correction_out": {"dim": None, "correction": None, "keepdim": False},
    "aten::zeros_like.out": {"memory_format": None},
    "dim_order_ops::_clone_dim_order.out": {"non_blocking": False, "dim_order": None},
    "dim_order_ops::_empty_dim_order.out": {"dim_order": None},
    "dim_order_ops::_to_dim_order_copy.out": {"non_blocking": False, "dim_order": None},
    "quantized_decomposed::dequantize_per_channel.out": {"out_dtype": None},
    "quantized_decomposed::dequantize_per_tensor.Tensor_out": {"out_dtype": None},
    "quantized_decomposed::dequantize_per_tensor.out": {"out_dtype": None},
}

# Out arguments of ops whose outs are not called ``out`` / ``out0``, ``out1``, ...
_OUTPUT_NAMES: dict[str, tuple[str, ...]] = {
    "aten::max_pool2d_with_indices.out": ("out", "indices"),
    "aten::max.dim_max": ("max", "max_values"),
    "aten::min.dim_min": ("min", "min_indices"),
    "quantized_decomposed::choose_qparams.Tensor_out": ("scale_out", "zero_point_out"),
    "quantized_decomposed::choose_qparams_per_token_asymmetric.out": ("scale_out", "zero_point_out"),
}

# Arguments whose kernel annotation is looser than the schema type.
_TYPE_OVERRIDES: dict[tuple[str, str], str] = {
    ("aten::eq.Tensor_out", "other"): "Tensor",
    ("aten::ne.Tensor_out", "other"): "Tensor",
    ("aten::lt.Tensor_out", "other"): "Tensor",
    ("aten::le.Tensor_out", "other"): "Tensor",
    ("aten::gt.Tensor_out", "other"): "Tensor",
    ("aten::ge.Tensor_out", "other"): "Tensor",
    ("aten::logical_and.out", "other"): "Tensor",
    ("aten::logical_or.out", "other"): "Tensor",
    ("aten::logical_xor.out", "other"): "Tensor",
    ("aten::clamp.out", "min"): "Scalar?",
    ("aten::clamp.out", "max"): "Scalar?",
    ("aten::std.correction_out", "correction"): "Scalar?",
    ("aten::var.correction_out", "correction"): "Scalar?",
    ("aten::var_mean.correction_out", "correction"): "Scalar?",
}

# Kernel annotation -> schema type (torch's spelling without sizes and alias annotations).
_ANNOTATIONS: dict[str, str] = {
    "np.ndarray": "Tensor",
    "np.ndarray | None": "Tensor?",
    "list[np.ndarray]": "Tensor[]",
    "list[np.ndarray | None]": "Tensor?[]",
    "int": "int",
    "int | None": "int?",
    "float": "float",
    "float | None": "float?",
    "bool": "bool",
    "bool | None": "bool?",
    "str": "str",
    "str | None": "str?",
    "list[int]": "int[]",
    "list[int] | None": "int[]?",
    "list[float]": "float[]",
    "list[float] | None": "float[]?",
    "list[bool]": "bool[]",
    "Any": "Scalar",
    "Number": "Scalar",
}

_RETURNS: dict[str, str] = {"int": "int", "float": "float", "bool": "bool", "Number": "scalar", "Any": "scalar"}

_OUT_NAME = re.compile(r"^out[0-9]*$")


@dataclass(frozen=True, slots=True)
class SchemaArgument:
    """One schema argument.

    Attributes:
        name: the schema name (what ``MethodBuilder.call`` takes as a keyword).
        type: the schema type in torch's spelling without sizes or alias annotations:
            ``Tensor``, ``Tensor?``, ``Tensor[]``, ``Tensor?[]``, ``int``, ``int?``, ``float``,
            ``float?``, ``bool``, ``bool?``, ``str``, ``str?``, ``int[]``, ``int[]?``,
            ``float[]``, ``float[]?``, ``bool[]``, ``Scalar``, ``Scalar?``, ``ScalarType?``,
            ``MemoryFormat?``, or ``any`` when the kernel does not say.
        default: the schema default, or :data:`REQUIRED`.
        is_out: True for the tensors the op writes (planned by the builder, never passed).
    """

    name: str
    type: str
    default: Any = REQUIRED
    is_out: bool = False

    @property
    def has_default(self) -> bool:
        return self.default is not REQUIRED

    @property
    def optional(self) -> bool:
        """True when ``None`` is a valid value."""
        return self.type.endswith("?")


@dataclass(frozen=True, slots=True)
class OperatorSchema:
    """An operator's schema, as the builder encodes a call of it.

    Attributes:
        name: ``namespace::name.overload``.
        arguments: every schema argument in order, outs included.
        returns: how the call's result is encoded after the arguments: ``"out"`` (the single
            ``out`` value again), ``"outs"`` (one TensorList of the out tensors), ``"out_list"``
            (a new TensorList of the tensors of the ``Tensor[] out`` argument), ``"int"``,
            ``"float"``, ``"bool"`` or ``"scalar"`` (a new scalar value), or ``"tensor"`` (a
            non-out op returning a tensor, e.g. a view).
        kernel: orchestra's kernel for the operator.
    """

    name: str
    arguments: tuple[SchemaArgument, ...]
    returns: str
    kernel: KernelDef

    @property
    def inputs(self) -> tuple[SchemaArgument, ...]:
        """The arguments a caller passes (everything but the outs)."""
        return tuple(a for a in self.arguments if not a.is_out)

    @property
    def outputs(self) -> tuple[SchemaArgument, ...]:
        """The out arguments, in schema order."""
        return tuple(a for a in self.arguments if a.is_out)

    def __str__(self) -> str:
        def one(a: SchemaArgument) -> str:
            t = f"{a.type} {a.name}"
            if a.is_out:
                return f"{t} (out)"
            return f"{t}={a.default!r}" if a.has_default else t

        return f"{self.name}({', '.join(one(a) for a in self.arguments)}) -> {self.returns}"


def _annotation(p: Any) -> str:
    a = p if isinstance(p, str) else inspect.formatannotation(p)
    return a.replace("numpy.", "np.").replace("typing.", "")


def _argument_type(op: str, name: str, annotation: Any) -> str:
    override = _TYPE_OVERRIDES.get((op, name))
    if override is not None:
        return override
    t = _ANNOTATIONS.get(_annotation(annotation), "any")
    if t in ("int", "int?") and name in ("dtype", "out_dtype", "output_dtype"):  # a ScalarType (an Int in the program)
        return "ScalarType" + t[3:]
    if t == "int?" and name == "memory_format":
        return "MemoryFormat?"
    return t


@lru_cache(maxsize=None)
def _schema(name: str, kernel: KernelDef) -> OperatorSchema:
    sig = inspect.signature(kernel.fn)
    params = [p for p in sig.parameters.values()
              if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params = params[: kernel.num_params]
    defaults = _DEFAULTS.get(name, {})
    types = [_argument_type(name, p.name, p.annotation) for p in params]
    out_names = _OUTPUT_NAMES.get(name)
    if out_names is None:
        out_names = tuple(p.name for p, t in zip(params, types)
                          if _OUT_NAME.match(p.name) and t in ("Tensor", "Tensor[]"))
    args = []
    for p, t in zip(params, types):
        if p.name in defaults:
            default = defaults[p.name]
        elif p.default is not inspect.Parameter.empty:
            default = p.default
        else:
            default = REQUIRED
        args.append(SchemaArgument(p.name, t, default, p.name in out_names))
    outs = [a for a in args if a.is_out]
    if len(outs) > 1:
        returns = "outs"
    elif outs:
        returns = "out_list" if outs[0].type == "Tensor[]" else "out"
    else:
        ret = _annotation(sig.return_annotation) if sig.return_annotation is not inspect.Signature.empty else ""
        returns = _RETURNS.get(ret, "tensor" if ret.startswith("np.ndarray") else "scalar")
    return OperatorSchema(name, tuple(args), returns, kernel)


def operator_schema(name: str) -> OperatorSchema:
    """The schema of operator ``name`` (``namespace::name.overload``) as orchestra knows it.

    Raises:
        OperatorMissingError: orchestra has no kernel for ``name`` (the message names the
            nearest registered operators).
    """
    kd = get_kernel(name) if isinstance(name, str) else None
    if kd is None:
        near = nearest_kernel_names(name) if isinstance(name, str) else []
        hint = f" (nearest: {', '.join(near)})" if near else ""
        raise OperatorMissingError(f"operator {name!r} has no kernel in orchestra{hint}")
    return _schema(name, kd)
