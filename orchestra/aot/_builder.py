"""``ProgramBuilder``: author ExecuTorch ``.pte`` programs from numpy, without torch.

Operator calls are encoded exactly as ExecuTorch's emitter encodes them (see
``exir/emit/_emitter.py``): a KernelCall's args are every schema argument in schema order,
defaults filled in and outs included, followed by the return value(s): the ``out`` value
again for single-output ``.out`` ops, one TensorList of the outs for multi-output ops, a new
TensorList of the pieces for ``Tensor[] out`` ops, and a new ``Int(0)`` placeholder for scalar
ops (whatever their result type, as ExecuTorch does).
``int[]`` arguments are IntLists of Int value indices (one Int per element, so a symbolic
size from ``aten::sym_size.int`` can stand in a list); ``float[]``/``bool[]`` are inline
literals; absent optionals are ``Null``; ScalarType arguments are Int codes.

Output shapes and dtypes come from running orchestra's numpy kernel on sample arrays (zeros
of the input shapes, upper bounds for dynamic inputs) with 0-size ``out`` arrays of the
expected dtype: the kernel then returns new arrays of the right shape.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import keyword
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ..errors import BackendError, Error, InvalidArgumentError, OrchestraError
from ..program import (
    AllocationDetails,
    BackendDelegate,
    BackendDelegateDataReference,
    BackendDelegateInlineData,
    Bool,
    BoolList,
    Chain,
    CompileSpec,
    ContainerMetadata,
    DataLocation,
    DataSegment,
    DelegateCall,
    Double,
    DoubleList,
    EValue,
    ExecutionPlan,
    Instruction,
    Int,
    IntList,
    KernelCall,
    Null,
    Operator,
    OptionalTensorList,
    ProgramDef,
    ScalarType,
    String,
    SubsegmentOffsets,
    Tensor,
    TensorList,
    TensorShapeDynamism,
    dumps,
    numpy_dtype,
    scalar_type_of,
)
from ._backend_details import PreprocessResult, get_aot_backend
from ._planner import plan_memory
from ._schema import OperatorSchema, SchemaArgument, operator_schema

__all__ = ["MethodBuilder", "ProgramBuilder", "Value"]

ALIGNMENT = 16  # planned tensors and constants start at multiples of this

_METHOD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_F32 = np.dtype(np.float32)
_I64 = np.dtype(np.int64)
_BOOL = np.dtype(np.bool_)

# ---------------------------------------------------------------------------------------
# Output dtypes (torch's rules for the registered operators)

_BOOL_OUT = frozenset({
    "aten::eq.Scalar_out", "aten::eq.Tensor_out", "aten::ne.Scalar_out", "aten::ne.Tensor_out",
    "aten::lt.Scalar_out", "aten::lt.Tensor_out", "aten::le.Scalar_out", "aten::le.Tensor_out",
    "aten::gt.Scalar_out", "aten::gt.Tensor_out", "aten::ge.Scalar_out", "aten::ge.Tensor_out",
    "aten::isnan.out", "aten::isinf.out", "aten::logical_and.out", "aten::logical_or.out",
    "aten::logical_xor.out", "aten::logical_not.out", "aten::all.all_out", "aten::all.dims_out",
    "aten::all.out", "aten::any.all_out", "aten::any.dims_out", "aten::any.out",
})
_INDEX_OUT = frozenset({
    ("aten::argmax.out", "out"), ("aten::argmin.out", "out"),
    ("aten::max_pool2d_with_indices.out", "indices"), ("aten::max.dim_max", "max_values"),
    ("aten::min.dim_min", "min_indices"),
})
# Ops whose result is floating point even for integer inputs.
_FLOAT_OUT = frozenset({
    "aten::acos.out", "aten::asin.out", "aten::atan.out", "aten::cos.out", "aten::cosh.out",
    "aten::erf.out", "aten::exp.out", "aten::expm1.out", "aten::log.out", "aten::log10.out",
    "aten::log1p.out", "aten::log2.out", "aten::reciprocal.out", "aten::rsqrt.out",
    "aten::sigmoid.out", "aten::sin.out", "aten::sinh.out", "aten::sqrt.out", "aten::tan.out",
    "aten::tanh.out", "aten::div.out", "aten::div.Scalar_out", "aten::mean.out",
    "aten::mean.dtype_out", "aten::std.out", "aten::std.correction_out", "aten::var.out",
    "aten::var.correction_out", "aten::var_mean.correction_out", "aten::_softmax.out",
    "aten::softmax.int_out", "aten::_log_softmax.out", "aten::log_softmax.int_out",
    "aten::scalar_tensor.out",
})
# Integer reductions accumulate in int64 (torch's rule for sum/prod/cumsum).
_INT64_REDUCE = frozenset({
    "aten::sum.out", "aten::sum.IntList_out", "aten::prod.out", "aten::prod.int_out",
    "aten::cumsum.out",
})
_QUANT_NS = "quantized_decomposed::"
# Ops whose kernel wants its outs at their shape (one element), not resizes empty ones.
_OUT_SHAPES: dict[str, tuple[int, ...]] = {_QUANT_NS + "choose_qparams.Tensor_out": (1,)}


def _quant_out_dtypes(name: str, samples: dict[str, Any], outs: Sequence[SchemaArgument]) -> dict[str, np.dtype] | None:
    """The out dtypes of a quantized_decomposed op, by out name: a quantize writes its
    ``dtype`` argument's type, a dequantize float32 unless ``out_dtype`` / ``output_dtype``
    says otherwise, choose_qparams a float64 scale and an int64 zero point."""
    op = name[len(_QUANT_NS):]
    dt: np.dtype | None = None
    if op.startswith("quantize_per"):
        dt = numpy_dtype(samples.get("dtype"))
    elif op.startswith("dequantize_per"):
        code = samples.get("out_dtype", samples.get("output_dtype"))
        dt = (numpy_dtype(code) if code is not None else None) or _F32
    elif op.startswith("choose_qparams"):
        return {a.name: _I64 if a.name == "zero_point_out" else np.dtype(np.float64) for a in outs}
    return None if dt is None else {a.name: dt for a in outs}


# Ops whose result dtype is that of particular arguments (not all of them).
_DTYPE_FROM: dict[str, tuple[str, ...]] = {
    "aten::embedding.out": ("weight",),
    "aten::gather.out": ("self",),
    "aten::index_select.out": ("self",),
    "aten::index.Tensor_out": ("self",),
    "aten::masked_fill.Scalar_out": ("self",),
    "aten::where.self_out": ("self", "other"),
    "aten::copy.out": ("self",),
    "aten::fill.Scalar_out": ("self",),
    "aten::fill.Tensor_out": ("self",),
    "aten::full_like.out": ("self",),
    "aten::zeros_like.out": ("self",),
    "aten::ones_like.out": ("self",),
    "aten::constant_pad_nd.out": ("self",),
    "aten::_to_copy.out": ("self",),
    "dim_order_ops::_to_dim_order_copy.out": ("self",),
}


def _count_split(a: dict[str, Any]) -> int:
    n, s = a["self"].shape[_wrap(a["dim"], a["self"].ndim)], int(a["split_size"])
    return max(1, math.ceil(n / s)) if s > 0 else 1


def _wrap(dim: int, ndim: int) -> int:
    dim = int(dim)
    return dim + max(ndim, 1) if dim < 0 else dim


# How many tensors a ``Tensor[] out`` argument holds.
_LIST_OUT_COUNT: dict[str, Callable[[dict[str, Any]], int]] = {
    "aten::split_with_sizes_copy.out": lambda a: len(a["split_sizes"]),
    "aten::split_copy.Tensor_out": _count_split,
    "aten::unbind_copy.int_out": lambda a: a["self"].shape[_wrap(a["dim"], a["self"].ndim)],
}


def _category(dt: np.dtype) -> int:
    return {"b": 0, "i": 1, "u": 1, "f": 2}.get(dt.kind, 3)


def _promote(a: np.dtype | None, b: np.dtype | None) -> np.dtype | None:
    if a is None:
        return b
    if b is None or a == b:
        return a
    ca, cb = _category(a), _category(b)
    if ca != cb:
        return a if ca > cb else b
    return np.promote_types(a, b)


def _result_dtype(operands: Iterable[Any]) -> np.dtype:
    """torch's result type: tensors with dims, then 0-d tensors, then Python scalars; a
    lower tier only matters when it is of a higher category (float scalar, int tensor)."""
    tiers: list[np.dtype | None] = [None, None, None]
    for v in operands:
        if isinstance(v, np.ndarray):
            tiers[0 if v.ndim else 1] = _promote(tiers[0 if v.ndim else 1], v.dtype)
        elif isinstance(v, (bool, np.bool_)):
            tiers[2] = _promote(tiers[2], _BOOL)
        elif isinstance(v, (int, np.integer)):
            tiers[2] = _promote(tiers[2], _I64)
        elif isinstance(v, (float, np.floating)):
            tiers[2] = _promote(tiers[2], _F32)
    result: np.dtype | None = None
    for t in tiers:
        if result is None:
            result = t
        elif t is not None and _category(t) > _category(result):
            result = _promote(result, t)
    return _F32 if result is None else result


def _flatten(v: Any) -> list[Any]:
    return [x for item in v for x in _flatten(item)] if isinstance(v, (list, tuple)) else [v]


# ---------------------------------------------------------------------------------------
# Values


@dataclass(frozen=True, eq=False, slots=True)
class Value:
    """A value of a method being built: an input, a constant, or what a call produced.

    Attributes:
        method: the method's name.
        index: the value's index in the method's execution plan.
        kind: ``"tensor"``, ``"int"``, ``"float"`` or ``"bool"``.
        dtype: the tensor's numpy dtype (None for scalars).
        shape: the tensor's shape; upper bounds when ``dynamic`` (``()`` for scalars).
        dynamic: True when the shape (or scalar) depends on a dynamic input.
    """

    method: str
    index: int
    kind: str
    dtype: np.dtype | None
    shape: tuple[int, ...]
    dynamic: bool
    _owner: MethodBuilder = field(repr=False)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor (at its upper-bound shape); 0 for scalars."""
        if self.dtype is None:
            return 0
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


@dataclass(slots=True)
class _TensorRec:
    dtype: np.dtype
    shape: tuple[int, ...]
    dynamic: bool
    role: str  # "input", "constant" or "planned"
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class _Instr:
    kind: str  # "kernel" or "delegate"
    target: int  # operator index or delegate index (within the method)
    args: tuple[int, ...]
    touches: tuple[int, ...]  # tensor value indices read or written (lists expanded)


class _Staging:
    """New values of one call, committed only when the whole call is valid."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.records: list[Any] = []
        self.samples: list[Any] = []

    def add(self, record: Any, sample: Any) -> int:
        self.records.append(record)
        self.samples.append(sample)
        return self.base + len(self.records) - 1


# ---------------------------------------------------------------------------------------
# MethodBuilder


class MethodBuilder:
    """Builds one method. Get one from :meth:`ProgramBuilder.method`."""

    def __init__(self, program: ProgramBuilder, name: str) -> None:
        self._program = program
        self._name = name
        self._records: list[Any] = []  # _TensorRec or a program-schema value (Int, IntList, ...)
        self._samples: list[Any] = []
        self._dynamic: list[bool] = []
        self._values: list[Value | None] = []
        self._inputs: list[int] = []
        self._outputs: list[int] = []
        self._instrs: list[_Instr] = []
        self._operators: list[str] = []
        self._delegates: list[tuple[str, bytes, tuple[CompileSpec, ...]]] = []

    @property
    def name(self) -> str:
        return self._name

    @property
    def inputs(self) -> tuple[Value, ...]:
        """The method's inputs, in order."""
        return tuple(self._value(i) for i in self._inputs)

    @property
    def outputs(self) -> tuple[Value, ...]:
        """The method's outputs so far, in order."""
        return tuple(self._value(i) for i in self._outputs)

    def __repr__(self) -> str:
        return (f"<MethodBuilder {self._name!r} inputs={len(self._inputs)} "
                f"instructions={len(self._instrs)} outputs={len(self._outputs)}>")

    # -- values -------------------------------------------------------------------------
    def _where(self, what: str = "") -> str:
        return f"method {self._name!r}" + (f": {what}" if what else "")

    def _commit(self, st: _Staging, dynamic: bool) -> None:
        assert st.base == len(self._records)
        self._records.extend(st.records)
        self._samples.extend(st.samples)
        self._dynamic.extend([dynamic] * len(st.records))
        self._values.extend([None] * len(st.records))

    def _value(self, i: int) -> Value:
        v = self._values[i]
        if v is None:
            rec = self._records[i]
            if isinstance(rec, _TensorRec):
                v = Value(self._name, i, "tensor", rec.dtype, rec.shape, rec.dynamic, self)
            else:
                # A scalar op's result: its kind is that of the kernel's result on the samples.
                sample = self._samples[i]
                kind = ("bool" if isinstance(sample, (bool, np.bool_))
                        else "float" if isinstance(sample, (float, np.floating)) else "int")
                v = Value(self._name, i, kind, None, (), self._dynamic[i], self)
            self._values[i] = v
        return v

    def _own(self, v: Value, what: str) -> None:
        if v._owner is not self:
            if v._owner._program is self._program:
                raise InvalidArgumentError(
                    f"{self._where(what)}: the value belongs to method {v.method!r}, not to this method"
                )
            raise InvalidArgumentError(
                f"{self._where(what)}: the value belongs to another ProgramBuilder (its method {v.method!r})"
            )

    @staticmethod
    def _check_dtype(dtype: Any, what: str) -> tuple[np.dtype, ScalarType]:
        try:
            dt = np.dtype(dtype)
        except TypeError as exc:
            raise InvalidArgumentError(f"{what}: {dtype!r} is not a dtype") from exc
        st = scalar_type_of(dt)
        if st is None:
            raise InvalidArgumentError(f"{what}: dtype {dt} has no ExecuTorch scalar type")
        return dt, st

    def input(self, dtype: Any, shape: Sequence[int], *, dynamic: bool = False) -> Value:
        """Adds an input tensor (memory-planned). With ``dynamic=True`` the sizes are upper
        bounds (``DYNAMIC_BOUND``): the method accepts any shape of the same rank within them.
        """
        where = self._where(f"input {len(self._inputs)}")
        dt, _ = self._check_dtype(dtype, where)
        try:
            dims = tuple(int(s) for s in shape)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"{where}: shape must be a sequence of ints, got {shape!r}") from exc
        if any(d < 0 for d in dims):
            raise InvalidArgumentError(f"{where}: shape {list(dims)} has a negative size")
        st = _Staging(len(self._records))
        i = st.add(_TensorRec(dt, dims, bool(dynamic), "input"), np.zeros(dims, dt))
        self._commit(st, bool(dynamic))
        self._inputs.append(i)
        return self._value(i)

    def constant(self, array: Any) -> Value:
        """Adds a constant tensor, stored in the program's constant segment (identical
        constants are stored once per program)."""
        i = self._stage_constant(_Staging(len(self._records)), array, self._where("constant"), commit=True)
        return self._value(i)

    def _stage_constant(self, st: _Staging, array: Any, where: str, commit: bool = False) -> int:
        arr = np.ascontiguousarray(np.asarray(array))
        dt, _ = self._check_dtype(arr.dtype, where)
        arr = arr.astype(dt, copy=False)
        i = st.add(_TensorRec(dt, tuple(arr.shape), False, "constant", arr.tobytes()), arr)
        if commit:
            self._commit(st, False)
        return i

    def output(self, *values: Value) -> None:
        """Appends ``values`` to the method's outputs (each must be a value of this method;
        constants can't be outputs: copy them first, e.g. with ``aten::clone.out``)."""
        for k, v in enumerate(values):
            what = f"output {len(self._outputs) + k}"
            if not isinstance(v, Value):
                raise InvalidArgumentError(f"{self._where(what)}: expected a Value, got {type(v).__name__}")
            self._own(v, what)
            rec = self._records[v.index]
            if isinstance(rec, _TensorRec) and rec.role == "constant":
                raise InvalidArgumentError(
                    f"{self._where(what)}: a constant can't be a method output (copy it with aten::clone.out first)"
                )
        self._outputs.extend(v.index for v in values)

    # -- operator calls -----------------------------------------------------------------
    def call(self, op: str, *args: Any, out_dtype: Any = None, **kwargs: Any) -> Value | tuple[Value, ...]:
        """Calls operator ``op`` (``namespace::name.overload``, e.g. ``aten::mm.out``).

        Arguments are the schema's non-out arguments, positionally in schema order or by
        schema name; defaults fill the rest. Tensors are Values of this method (numpy arrays
        become constants); ``int[]`` items may be int Values (``aten::sym_size.int``);
        ScalarType arguments take numpy dtypes. ``out_dtype`` overrides the dtype of the out
        tensor(s) (one dtype, or one per out argument).

        Returns:
            one Value for single-output and scalar ops, a tuple of Values for multi-output
            ops (in out-argument order) and for ``Tensor[] out`` ops (one per piece).

        Raises:
            OperatorMissingError: orchestra has no kernel for ``op``.
            InvalidArgumentError: a missing, unknown or ill-typed argument, an unsupported
                dtype, or arguments the kernel rejects (the message names the method, the
                operator and the argument).
        """
        schema = operator_schema(op)
        where = self._where(op)
        if schema.returns == "tensor":
            raise InvalidArgumentError(
                f"{where}: view and in-place operators are not supported by ProgramBuilder; "
                "use an out-variant (e.g. aten::view_copy.out, aten::copy.out)"
            )
        bound = self._bind(schema, args, kwargs, where)
        st = _Staging(len(self._records))
        enc: dict[str, tuple[int, Any]] = {}
        dynamic = False
        for a in schema.inputs:
            idx, sample, dyn = self._encode(st, a, bound[a.name], f"{where}: argument {a.name!r} ({a.type})")
            enc[a.name] = (idx, sample)
            dynamic = dynamic or dyn
        samples = {name: s for name, (_, s) in enc.items()}
        out_dts = self._out_dtypes(schema, samples, out_dtype, where)
        counts: dict[str, int] = {}
        call_args: list[Any] = []
        for a in schema.arguments:
            if not a.is_out:
                call_args.append(enc[a.name][1])
            elif a.type == "Tensor[]":
                count = _LIST_OUT_COUNT.get(schema.name)
                if count is None:
                    raise InvalidArgumentError(f"{where}: ProgramBuilder can't tell how many tensors {a.name!r} holds")
                try:
                    counts[a.name] = int(count(samples))
                except Exception as exc:
                    raise InvalidArgumentError(f"{where}: invalid arguments: {exc}") from exc
                call_args.append([np.empty((0,), out_dts[a.name]) for _ in range(counts[a.name])])
            else:
                call_args.append(np.empty(_OUT_SHAPES.get(schema.name, (0,)), out_dts[a.name]))
        self._check_kernel_dtype(schema, call_args, where)
        try:
            result = schema.kernel.fn(*call_args)
        except OrchestraError as exc:
            raise InvalidArgumentError(f"{where}: {exc.message}") from exc
        except Exception as exc:
            raise InvalidArgumentError(f"{where}: the kernel rejected the arguments: {type(exc).__name__}: {exc}") from exc

        outs = schema.outputs
        ret_values: list[int] = []
        arg_idx: dict[str, int] = {name: idx for name, (idx, _) in enc.items()}
        if schema.returns in ("out", "outs", "out_list"):
            results = [result] if schema.returns == "out" else list(result)
            if schema.returns == "out_list":
                items = []
                for arr in results:
                    items.append(self._stage_out(st, arr, out_dts[outs[0].name], dynamic, where))
                arg_idx[outs[0].name] = st.add(TensorList(tuple(items)), None)
                ret_values = items
                ret = st.add(TensorList(tuple(items)), None)
            else:
                if len(results) != len(outs):
                    raise InvalidArgumentError(f"{where}: the kernel returned {len(results)} results for {len(outs)} outs")
                for a, arr in zip(outs, results):
                    arg_idx[a.name] = self._stage_out(st, arr, out_dts[a.name], dynamic, where)
                ret_values = [arg_idx[a.name] for a in outs]
                ret = ret_values[0] if schema.returns == "out" else st.add(TensorList(tuple(ret_values)), None)
        else:
            # ExecuTorch's emitter writes Int(0) for every scalar result, bool and float ones
            # included: the runtime replaces the whole value when the op runs.
            sample = result.item() if isinstance(result, np.generic) else result
            if not isinstance(sample, (bool, int, float)):
                raise InvalidArgumentError(f"{where}: the kernel returned {type(result).__name__}, expected a scalar")
            ret = st.add(Int(0), sample)
            ret_values = [ret]
        kernel_args = tuple(arg_idx[a.name] for a in schema.arguments) + (ret,)
        self._commit(st, dynamic)
        if schema.name not in self._operators:
            self._operators.append(schema.name)
        self._record(_Instr("kernel", self._operators.index(schema.name), kernel_args, ()))
        values = tuple(self._value(i) for i in ret_values)
        if schema.returns in ("outs", "out_list"):
            return values
        return values[0]

    def _record(self, ins: _Instr) -> None:
        touched: list[int] = []
        for i in ins.args:
            rec = self._records[i]
            if isinstance(rec, _TensorRec):
                touched.append(i)
            elif isinstance(rec, (TensorList, OptionalTensorList)):
                touched.extend(j for j in rec.items if j >= 0)
        self._instrs.append(_Instr(ins.kind, ins.target, ins.args, tuple(dict.fromkeys(touched))))

    def _stage_out(self, st: _Staging, arr: Any, dtype: np.dtype, dynamic: bool, where: str) -> int:
        if not isinstance(arr, np.ndarray):
            raise InvalidArgumentError(f"{where}: the kernel returned {type(arr).__name__} for an out tensor")
        return st.add(_TensorRec(dtype, tuple(arr.shape), dynamic, "planned"), arr.astype(dtype, copy=False))

    @staticmethod
    def _bind(schema: OperatorSchema, args: tuple[Any, ...], kwargs: dict[str, Any], where: str) -> dict[str, Any]:
        inputs = schema.inputs
        names = ", ".join(a.name for a in inputs) or "none"
        if len(args) > len(inputs):
            raise InvalidArgumentError(
                f"{where}: takes at most {len(inputs)} arguments ({names}), got {len(args)}"
            )
        bound = {a.name: v for a, v in zip(inputs, args)}
        by_name = {a.name: a for a in schema.arguments}
        for k, v in kwargs.items():
            a = by_name.get(k)
            if a is None:
                raise InvalidArgumentError(f"{where}: no argument named {k!r} (arguments: {names})")
            if a.is_out:
                raise InvalidArgumentError(f"{where}: {k!r} is an out argument; ProgramBuilder plans it")
            if k in bound:
                raise InvalidArgumentError(f"{where}: argument {k!r} given twice")
            bound[k] = v
        for a in inputs:
            if a.name not in bound:
                if not a.has_default:
                    raise InvalidArgumentError(f"{where}: missing argument {a.name!r} ({a.type})")
                bound[a.name] = copy.copy(a.default)
        return bound

    # -- argument encoding --------------------------------------------------------------
    def _encode(self, st: _Staging, a: SchemaArgument, v: Any, where: str) -> tuple[int, Any, bool]:
        """Stages ``v`` as argument ``a``; returns (value index, kernel sample, dynamic)."""
        t = a.type
        if t == "any":
            t = self._infer_type(v)
        if t.endswith("?"):
            if v is None:
                return st.add(Null(), None), None, False
            t = t[:-1]
        if v is None:
            raise InvalidArgumentError(f"{where}: None is not allowed")
        if t == "Tensor":
            return self._tensor(st, v, where)
        if t in ("Tensor[]", "Tensor?[]"):
            if not isinstance(v, (list, tuple)):
                raise InvalidArgumentError(f"{where}: expected a list of tensors, got {type(v).__name__}")
            items, samples, dyn = [], [], False
            for k, x in enumerate(v):
                if x is None and t == "Tensor?[]":
                    items.append(-1)
                    samples.append(None)
                    continue
                i, s, d = self._tensor(st, x, f"{where}[{k}]")
                items.append(i)
                samples.append(s)
                dyn = dyn or d
            rec = TensorList(tuple(items)) if t == "Tensor[]" else OptionalTensorList(tuple(items))
            return st.add(rec, None), samples, dyn
        if t == "int[]":
            if not isinstance(v, (list, tuple)):
                raise InvalidArgumentError(f"{where}: expected a list of ints, got {v!r}")
            items, samples, dyn = [], [], False
            for k, x in enumerate(v):
                i, s, d = self._int(st, x, f"{where}[{k}]")
                items.append(i)
                samples.append(s)
                dyn = dyn or d
            return st.add(IntList(tuple(items)), None), samples, dyn
        if t in ("float[]", "bool[]"):
            if not isinstance(v, (list, tuple)):
                raise InvalidArgumentError(f"{where}: expected a list, got {v!r}")
            if t == "float[]":
                if not all(isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_)) for x in v):
                    raise InvalidArgumentError(f"{where}: expected a list of floats, got {v!r}")
                lit = tuple(float(x) for x in v)
                return st.add(DoubleList(lit), None), list(lit), False
            if not all(isinstance(x, (bool, np.bool_)) for x in v):
                raise InvalidArgumentError(f"{where}: expected a list of bools, got {v!r}")
            blit = tuple(bool(x) for x in v)
            return st.add(BoolList(blit), None), list(blit), False
        if t in ("int", "MemoryFormat"):
            return self._int(st, v, where)
        if t == "ScalarType":
            code = self._scalar_type(v, where)
            return st.add(Int(code), code), code, False
        if t == "float":
            if isinstance(v, Value):
                self._own(v, where)
                if v.kind != "float":
                    raise InvalidArgumentError(f"{where}: expected a float value, got a {v.kind} value")
                return v.index, self._samples[v.index], v.dynamic
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
                raise InvalidArgumentError(f"{where}: expected a float, got {v!r}")
            return st.add(Double(float(v)), float(v)), float(v), False
        if t == "bool":
            if isinstance(v, Value):
                self._own(v, where)
                if v.kind != "bool":
                    raise InvalidArgumentError(f"{where}: expected a bool value, got a {v.kind} value")
                return v.index, self._samples[v.index], v.dynamic
            if not isinstance(v, (bool, np.bool_)):
                raise InvalidArgumentError(f"{where}: expected a bool, got {v!r}")
            return st.add(Bool(bool(v)), bool(v)), bool(v), False
        if t == "str":
            if not isinstance(v, str):
                raise InvalidArgumentError(f"{where}: expected a string, got {v!r}")
            return st.add(String(v), v), v, False
        if t == "Scalar":
            if isinstance(v, Value):
                self._own(v, where)
                if v.kind == "tensor":
                    raise InvalidArgumentError(f"{where}: expected a scalar, got a tensor")
                return v.index, self._samples[v.index], v.dynamic
            if isinstance(v, (bool, np.bool_)):
                return st.add(Bool(bool(v)), bool(v)), bool(v), False
            if isinstance(v, (int, np.integer)):
                return st.add(Int(int(v)), int(v)), int(v), False
            if isinstance(v, (float, np.floating)):
                return st.add(Double(float(v)), float(v)), float(v), False
            raise InvalidArgumentError(f"{where}: expected a number, got {v!r}")
        raise InvalidArgumentError(f"{where}: ProgramBuilder can't encode a {t} argument")

    @staticmethod
    def _infer_type(v: Any) -> str:
        if v is None:
            return "Tensor?"
        if isinstance(v, Value):
            return "Tensor" if v.kind == "tensor" else "Scalar"
        if isinstance(v, np.ndarray):
            return "Tensor"
        if isinstance(v, str):
            return "str"
        if isinstance(v, (list, tuple)):
            if v and all(isinstance(x, Value) and x.kind == "tensor" or x is None for x in v):
                return "Tensor?[]" if any(x is None for x in v) else "Tensor[]"
            if all(isinstance(x, (bool, np.bool_)) for x in v) and v:
                return "bool[]"
            if any(isinstance(x, (float, np.floating)) for x in v):
                return "float[]"
            return "int[]"
        return "Scalar"

    def _tensor(self, st: _Staging, v: Any, where: str) -> tuple[int, Any, bool]:
        if isinstance(v, Value):
            self._own(v, where)
            if v.kind != "tensor":
                raise InvalidArgumentError(f"{where}: expected a tensor, got a {v.kind} value")
            return v.index, self._samples[v.index], v.dynamic
        if isinstance(v, (np.ndarray, np.generic)):
            i = self._stage_constant(st, v, where)
            return i, st.samples[i - st.base], False
        raise InvalidArgumentError(f"{where}: expected a tensor Value (or a numpy array), got {type(v).__name__}")

    def _int(self, st: _Staging, v: Any, where: str) -> tuple[int, Any, bool]:
        if isinstance(v, Value):
            self._own(v, where)
            if v.kind != "int":
                raise InvalidArgumentError(f"{where}: expected an int value, got a {v.kind} value")
            return v.index, self._samples[v.index], v.dynamic
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise InvalidArgumentError(f"{where}: expected an int, got {v!r}")
        return st.add(Int(int(v)), int(v)), int(v), False

    @staticmethod
    def _scalar_type(v: Any, where: str) -> int:
        if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
            try:
                return int(ScalarType(int(v)))
            except ValueError:
                raise InvalidArgumentError(f"{where}: {v} is not a scalar type code") from None
        try:
            st = scalar_type_of(np.dtype(v))
        except TypeError:
            st = None
        if st is None:
            raise InvalidArgumentError(f"{where}: expected a dtype or a ScalarType, got {v!r}")
        return int(st)

    # -- dtypes -------------------------------------------------------------------------
    @staticmethod
    def _out_dtypes(schema: OperatorSchema, samples: dict[str, Any], out_dtype: Any, where: str) -> dict[str, np.dtype]:
        outs = schema.outputs
        if out_dtype is not None:
            given = list(out_dtype) if isinstance(out_dtype, (list, tuple)) else [out_dtype] * len(outs)
            if len(given) != len(outs):
                raise InvalidArgumentError(f"{where}: out_dtype gives {len(given)} dtypes for {len(outs)} outs")
            result = {}
            for a, d in zip(outs, given):
                dt, _ = MethodBuilder._check_dtype(d, f"{where}: out_dtype for {a.name!r}")
                result[a.name] = dt
            return result
        name = schema.name
        if name.startswith(_QUANT_NS):
            found = _quant_out_dtypes(name, samples, outs)
            if found is not None:
                return found
        from_args = _DTYPE_FROM.get(name)
        operands: list[Any] = []
        for a in schema.inputs:
            if from_args is not None and a.name not in from_args:
                continue
            if from_args is None and a.type not in ("Tensor", "Tensor?", "Tensor[]", "Tensor?[]", "Scalar", "Scalar?", "any"):
                continue
            s = samples[a.name]
            operands.extend(x for x in _flatten(s) if x is not None and not isinstance(x, str))
        dt = _result_dtype(operands)
        requested = samples.get("dtype") if any(a.name == "dtype" and a.type == "ScalarType?" for a in schema.inputs) else None
        if requested is not None:
            dt = numpy_dtype(requested) or dt
        elif name in _FLOAT_OUT and dt.kind != "f":
            dt = _F32
        elif name in _INT64_REDUCE and dt.kind in "biu":
            dt = _I64
        result = {}
        for a in outs:
            if name in _BOOL_OUT:
                result[a.name] = _BOOL
            elif (name, a.name) in _INDEX_OUT:
                result[a.name] = _I64
            else:
                result[a.name] = dt
        return result

    @staticmethod
    def _check_kernel_dtype(schema: OperatorSchema, call_args: list[Any], where: str) -> None:
        # The interpreter checks the first tensor argument against the kernel's dtypes.
        dtypes = schema.kernel.dtypes
        if dtypes is None:
            return
        for a, v in zip(schema.arguments, call_args):
            if isinstance(v, np.ndarray):
                if v.dtype.name not in dtypes and v.dtype.name != "bool":
                    raise InvalidArgumentError(
                        f"{where}: argument {a.name!r} has dtype {v.dtype.name}, which orchestra's "
                        f"{schema.name} kernel does not support (supported: {', '.join(sorted(dtypes))})"
                    )
                return

    # -- delegates ----------------------------------------------------------------------
    def delegate(
        self,
        backend: str,
        subgraph: ProgramBuilder | ProgramDef,
        inputs: Sequence[Value],
        compile_specs: Sequence[CompileSpec] = (),
    ) -> tuple[Value, ...]:
        """Lowers ``subgraph``'s ``forward`` to AOT backend ``backend`` and calls it.

        The subgraph is built, handed to the backend's ``preprocess`` with
        ``compile_specs``, and the processed blob is stored inline in the program; a
        DelegateCall passes ``inputs`` then the planned outputs (shaped as the subgraph's
        outputs, which must be static).

        Raises:
            BackendError: no AOT backend ``backend`` (code NotFound), or its preprocess failed.
            InvalidArgumentError: the inputs don't match the subgraph's.
        """
        where = self._where(f"delegate to {backend!r}")
        if isinstance(subgraph, ProgramBuilder):
            sub = subgraph.build()
        elif isinstance(subgraph, ProgramDef):
            sub = subgraph
        else:
            raise InvalidArgumentError(f"{where}: subgraph must be a ProgramBuilder or a ProgramDef, got {type(subgraph).__name__}")
        plans = {p.name: p for p in sub.execution_plan}
        if "forward" not in plans:
            raise InvalidArgumentError(f"{where}: the subgraph has no 'forward' method (methods: {', '.join(plans) or 'none'})")
        plan = plans["forward"]
        if len(plans) > 1:
            sub = dataclasses.replace(sub, execution_plan=(plan,))  # preprocess sees forward only
        inputs = list(inputs)
        if len(inputs) != len(plan.inputs):
            raise InvalidArgumentError(f"{where}: the subgraph takes {len(plan.inputs)} inputs, got {len(inputs)}")
        in_idx = []
        dynamic = False
        for k, (v, vi) in enumerate(zip(inputs, plan.inputs)):
            w = f"{where}: input {k}"
            if not isinstance(v, Value):
                raise InvalidArgumentError(f"{w}: expected a Value, got {type(v).__name__}")
            self._own(v, w)
            t = plan.values[vi].val
            if v.kind != "tensor" or not isinstance(t, Tensor):
                raise InvalidArgumentError(f"{w}: delegate inputs must be tensors")
            if scalar_type_of(v.dtype) != t.scalar_type:
                raise InvalidArgumentError(f"{w}: dtype {v.dtype} but the subgraph takes {numpy_dtype(t.scalar_type)}")
            sizes = tuple(t.sizes)
            ok = v.shape == sizes if t.shape_dynamism == TensorShapeDynamism.STATIC else (
                len(v.shape) == len(sizes) and all(a <= b for a, b in zip(v.shape, sizes)))
            if not ok:
                raise InvalidArgumentError(f"{w}: shape {list(v.shape)} but the subgraph takes {list(sizes)}")
            in_idx.append(v.index)
            dynamic = dynamic or v.dynamic
        out_specs = []
        for k, vi in enumerate(plan.outputs):
            t = plan.values[vi].val
            w = f"{where}: subgraph output {k}"
            if not isinstance(t, Tensor):
                raise InvalidArgumentError(f"{w}: delegate outputs must be tensors")
            if t.shape_dynamism != TensorShapeDynamism.STATIC:
                raise InvalidArgumentError(f"{w}: delegate outputs must have static shapes")
            dt = numpy_dtype(t.scalar_type)
            if dt is None:
                raise InvalidArgumentError(f"{w}: scalar type {t.scalar_type} has no numpy dtype")
            out_specs.append((dt, tuple(t.sizes)))
        specs = []
        for cs in compile_specs:
            if not isinstance(cs, CompileSpec) or not isinstance(cs.key, str):
                raise InvalidArgumentError(f"{where}: compile specs must be CompileSpec(key: str, value: bytes), got {cs!r}")
            specs.append(CompileSpec(cs.key, bytes(cs.value)))
        details = get_aot_backend(backend)
        try:
            result = details.preprocess(sub, tuple(specs))
        except OrchestraError:
            raise
        except Exception as exc:
            raise BackendError(f"{where}: preprocess failed: {type(exc).__name__}: {exc}", Error.Internal) from exc
        if not isinstance(result, PreprocessResult) or not isinstance(result.processed_bytes, (bytes, bytearray, memoryview)):
            raise BackendError(
                f"{where}: preprocess returned {type(result).__name__}, expected a PreprocessResult with processed_bytes",
                Error.Internal,
            )
        st = _Staging(len(self._records))
        out_idx = [st.add(_TensorRec(dt, shape, False, "planned"), np.zeros(shape, dt)) for dt, shape in out_specs]
        self._commit(st, False)
        self._delegates.append((backend, bytes(result.processed_bytes), tuple(specs)))
        self._record(_Instr("delegate", len(self._delegates) - 1, tuple(in_idx + out_idx), ()))
        return tuple(self._value(i) for i in out_idx)

    # -- building -----------------------------------------------------------------------
    def _build(self, constants: _Blobs, blobs: _Blobs) -> ExecutionPlan:
        if not self._outputs:
            raise InvalidArgumentError(f"{self._where()}: no outputs (call output())")
        planned = [i for i, r in enumerate(self._records) if isinstance(r, _TensorRec) and r.role != "constant"]
        pinned_set = set(self._inputs) | set(self._outputs)
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for k, ins in enumerate(self._instrs):
            for i in ins.touches:
                first.setdefault(i, k)
                last[i] = k
        n = len(self._instrs)
        sizes = []
        for i in planned:
            r = self._records[i]
            sizes.append(int(np.prod(r.shape, dtype=np.int64)) * r.dtype.itemsize)
        mp = plan_memory(
            sizes,
            [(first.get(i, 0), last.get(i, n)) for i in planned],
            [i in pinned_set for i in planned],
            ALIGNMENT,
        )
        offset = dict(zip(planned, mp.offsets))
        values = []
        for i, r in enumerate(self._records):
            if isinstance(r, _TensorRec):
                st = scalar_type_of(r.dtype)
                assert st is not None
                common = dict(
                    scalar_type=int(st), storage_offset=0, sizes=r.shape, dim_order=tuple(range(len(r.shape))),
                    shape_dynamism=TensorShapeDynamism.DYNAMIC_BOUND if r.dynamic else TensorShapeDynamism.STATIC,
                )
                if r.role == "constant":
                    values.append(EValue(Tensor(**common, data_buffer_idx=constants.add(r.data))))
                else:
                    off = offset[i]
                    values.append(EValue(Tensor(**common, allocation_info=AllocationDetails(1, off & 0xFFFFFFFF, off >> 32))))
            else:
                values.append(EValue(r))
        operators = tuple(Operator(*(name.split(".", 1) if "." in name else (name, ""))) for name in self._operators)
        delegates = tuple(
            BackendDelegate(backend, BackendDelegateDataReference(DataLocation.INLINE, blobs.add(data)), specs)
            for backend, data, specs in self._delegates
        )
        instructions = tuple(
            Instruction(KernelCall(ins.target, ins.args) if ins.kind == "kernel" else DelegateCall(ins.target, ins.args))
            for ins in self._instrs
        )
        return ExecutionPlan(
            name=self._name,
            container_meta_type=ContainerMetadata(_inputs_spec(len(self._inputs)), _outputs_spec(len(self._outputs))),
            values=tuple(values),
            inputs=tuple(self._inputs),
            outputs=tuple(self._outputs),
            chains=(Chain(inputs=(), outputs=(), instructions=instructions),),
            operators=operators,
            delegates=delegates,
            non_const_buffer_sizes=(0, mp.size),
        )


_LEAF = {"type": None, "context": None, "children_spec": []}


def _inputs_spec(n: int) -> str:
    # torch.export's pytree spec of ((x0, ..., xn-1), {}), as ExecuTorch writes it.
    spec = {"type": "builtins.tuple", "context": "null", "children_spec": [
        {"type": "builtins.tuple", "context": "null", "children_spec": [_LEAF] * n},
        {"type": "builtins.dict", "context": "[]", "children_spec": []},
    ]}
    return json.dumps([1, spec])


def _outputs_spec(n: int) -> str:
    spec = _LEAF if n == 1 else {"type": "builtins.tuple", "context": "null", "children_spec": [_LEAF] * n}
    return json.dumps([1, spec])


class _Blobs:
    """Byte blobs stored once each; indices start at ``first``."""

    def __init__(self, first: int) -> None:
        self.first = first
        self.items: list[bytes] = []
        self._index: dict[bytes, int] = {}

    def add(self, data: bytes) -> int:
        key = hashlib.sha256(data).digest() + len(data).to_bytes(8, "little")
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = self.first + len(self.items)
            self.items.append(data)
        return i


# ---------------------------------------------------------------------------------------
# ProgramBuilder


class ProgramBuilder:
    """Builds a whole program (one or more methods) as a :class:`~orchestra.program.ProgramDef`.

    Example::

        b = ProgramBuilder()
        f = b.method("forward")
        x = f.input(np.float32, (2, 3))
        w = f.constant(np.ones((3, 4), np.float32))
        f.output(f.call("aten::relu.out", f.call("aten::mm.out", x, w)))
        data = b.to_bytes()
    """

    def __init__(self) -> None:
        self._methods: dict[str, MethodBuilder] = {}

    @property
    def methods(self) -> tuple[MethodBuilder, ...]:
        return tuple(self._methods.values())

    def method(self, name: str = "forward") -> MethodBuilder:
        """Starts a new method called ``name`` (a C identifier, unique in the program)."""
        if not isinstance(name, str) or not _METHOD_NAME.match(name) or keyword.iskeyword(name):
            raise InvalidArgumentError(f"method name must be an identifier, got {name!r}")
        if name in self._methods:
            raise InvalidArgumentError(f"method {name!r} already exists")
        m = self._methods[name] = MethodBuilder(self, name)
        return m

    def build(self) -> ProgramDef:
        """The program: each method's values, memory plan and instructions; constants in one
        constant segment (``offsets[0]`` reserved; present even when empty, which ExecuTorch's
        runtime requires); delegate blobs inline. Calling it again builds the same program.

        Mistakes in calls, outputs and delegates are reported where they are made (by
        :meth:`MethodBuilder.call`, :meth:`~MethodBuilder.output`,
        :meth:`~MethodBuilder.delegate`), so a built program is always well-formed.

        Raises:
            InvalidArgumentError: no methods, or a method without outputs.
        """
        if not self._methods:
            raise InvalidArgumentError("the program has no methods (call method())")
        constants = _Blobs(1)
        blobs = _Blobs(0)
        plans = tuple(m._build(constants, blobs) for m in self._methods.values())
        data = bytearray()
        offsets = [0]
        for c in constants.items:
            data.extend(b"\0" * (-len(data) % ALIGNMENT))
            offsets.append(len(data))
            data.extend(c)
        seg = bytes(data)
        return ProgramDef(
            version=0,
            execution_plan=plans,
            backend_delegate_data=tuple(BackendDelegateInlineData(memoryview(b)) for b in blobs.items),
            segments=(DataSegment(0, len(seg), memoryview(seg)),),
            constant_segment=SubsegmentOffsets(0, tuple(offsets)),
        )

    def to_bytes(self, *, delegate_data: Literal["keep", "inline", "segment"] = "keep") -> bytes:
        """The program as ``.pte`` bytes (``orchestra.program.dumps(self.build())``).
        ``delegate_data="segment"`` moves delegate blobs into segments."""
        return dumps(self.build(), delegate_data=delegate_data)
