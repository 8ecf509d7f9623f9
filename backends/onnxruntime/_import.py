"""``import_onnx``: an ONNX model wrapped as a one-delegate ExecuTorch program."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from orchestra.errors import InvalidArgumentError, ProgramError
from orchestra.program import (
    AllocationDetails,
    BackendDelegate,
    BackendDelegateDataReference,
    BackendDelegateInlineData,
    Chain,
    DataLocation,
    DelegateCall,
    EValue,
    ExecutionPlan,
    Instruction,
    ProgramDef,
    ScalarType,
    Tensor,
    TensorShapeDynamism,
)

from ._aot import ModelSource, _onnx, graph_io, load_onnx
from ._common import BACKEND_ID

__all__ = ["import_onnx"]

_ALIGN = 16

# onnx.TensorProto element types (by name, so this module doesn't import onnx) -> ScalarType.
_SCALAR_TYPES: Mapping[str, ScalarType] = MappingProxyType({
    "FLOAT": ScalarType.FLOAT,
    "DOUBLE": ScalarType.DOUBLE,
    "FLOAT16": ScalarType.HALF,
    "INT8": ScalarType.CHAR,
    "INT16": ScalarType.SHORT,
    "INT32": ScalarType.INT,
    "INT64": ScalarType.LONG,
    "UINT8": ScalarType.BYTE,
    "UINT16": ScalarType.UINT16,
    "UINT32": ScalarType.UINT32,
    "UINT64": ScalarType.UINT64,
    "BOOL": ScalarType.BOOL,
})


def _scalar_type(onnx: Any, vi: Any, kind: str, name: str) -> ScalarType:
    which = vi.type.WhichOneof("value")
    if which != "tensor_type":
        raise ProgramError(f"{name}: model {kind} {vi.name!r} is a {which or 'value of no type'}; only tensors are supported")
    elem = onnx.TensorProto.DataType.Name(vi.type.tensor_type.elem_type)
    st = _SCALAR_TYPES.get(elem)
    if st is None:
        raise ProgramError(f"{name}: model {kind} {vi.name!r} has element type {elem}, which orchestra can't hold "
                           f"(supported: {', '.join(t.lower() for t in _SCALAR_TYPES)})")
    return st


def _declared_dims(vi: Any) -> list[int | None] | None:
    """The declared shape: an int per static dim, None per dynamic one (symbolic, unknown,
    -1 or 0); None when the rank itself is unknown."""
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tt.shape.dim]


def _bound(bounds: Mapping[str, Sequence[int]], kind: str, vname: str, dims: list[int | None] | None, name: str) -> tuple[tuple[int, ...], bool]:
    """``(sizes, dynamic)`` of a tensor from its declared dims and the user's bounds."""
    dynamic = dims is None or None in dims
    given = bounds.get(vname)
    shown = "?" if dims is None else "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"
    if given is None:
        if dynamic:
            which = "has no shape" if dims is None else "dims " + ", ".join(str(k) for k, d in enumerate(dims) if d is None) + " are dynamic"
            raise InvalidArgumentError(
                f"{name}: model {kind} {vname!r} of shape {shown}: {which}; pass their upper bounds, "
                f"e.g. import_onnx(..., dynamic_bounds={{{vname!r}: (max sizes)}})"
            )
        return tuple(dims), False
    try:
        sizes = tuple(int(s) for s in given)
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{name}: dynamic_bounds[{vname!r}] must be a sequence of ints, got {given!r}") from None
    if dims is not None and len(sizes) != len(dims):
        raise InvalidArgumentError(f"{name}: dynamic_bounds[{vname!r}] = {list(sizes)} has rank {len(sizes)}; model {kind} {vname!r} {shown} has rank {len(dims)}")
    for k, s in enumerate(sizes):
        if s < 1:
            raise InvalidArgumentError(f"{name}: dynamic_bounds[{vname!r}] dim {k} must be >= 1, got {s}")
        if dims is not None and dims[k] is not None and dims[k] != s:
            raise InvalidArgumentError(f"{name}: dynamic_bounds[{vname!r}] dim {k} is {s} but model {kind} {vname!r} {shown} fixes it to {dims[k]}")
    return sizes, dynamic


def _inferred_output_dims(onnx: Any, model: Any, sizes: Mapping[str, tuple[int, ...]]) -> dict[str, list[int | None] | None]:
    """Output shapes from ONNX shape inference with every input fixed at its bound."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for vi in fixed.graph.input:
        if vi.name in sizes:
            shape = vi.type.tensor_type.shape
            shape.ClearField("dim")
            for s in sizes[vi.name]:
                shape.dim.add().dim_value = s
    for vi in fixed.graph.output:
        vi.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(fixed)
    except Exception:
        return {}
    return {vi.name: _declared_dims(vi) for vi in inferred.graph.output}


def import_onnx(model: ModelSource, *, dynamic_bounds: Mapping[str, Sequence[int]] | None = None,
                method_name: str = "forward") -> ProgramDef:
    """Wraps an ONNX model as an ExecuTorch program that delegates it whole to onnxruntime.

    The program has one method (``forward``) whose inputs and outputs are the model's (same
    order, dtypes and shapes), planned in one arena (offsets aligned to 16 bytes), and one
    ``DelegateCall`` to ``OnnxRuntimeBackend`` taking the inputs then the outputs; the model
    bytes are embedded inline as the delegate's data. Write it with
    ``orchestra.program.dumps``; load it with ``orchestra.runtime.load_program``.

    Args:
        model: the model: bytes, an ``onnx.ModelProto``, or a path to a ``.onnx`` file.
        dynamic_bounds: upper bounds for tensors with dynamic dims (symbolic, unknown, -1 or
            0 in the model): ``{"input_name": (max sizes...)}``. Such tensors become
            ``DYNAMIC_BOUND`` with the bounds as sizes. Output bounds come from ONNX shape
            inference at the input bounds; give an output's bounds here when inference can't
            tell them.
        method_name: the method's name.

    Raises:
        NotFoundError: the path doesn't exist or can't be read.
        ProgramError: not a valid ONNX model, or it has inputs or outputs orchestra can't
            hold (non-tensors, strings, bfloat16...).
        InvalidArgumentError: a dynamic dim without a bound, or a bound that doesn't fit.
    """
    if not isinstance(method_name, str) or not method_name:
        raise InvalidArgumentError(f"method_name must be a non-empty string, got {method_name!r}")
    onnx = _onnx()
    mp, data, name = load_onnx(model)
    inputs, outputs = graph_io(mp)
    bounds = dict(dynamic_bounds or {})
    known = [vi.name for vi in inputs] + [vi.name for vi in outputs]
    unknown = [k for k in bounds if k not in known]
    if unknown:
        raise InvalidArgumentError(f"{name}: dynamic_bounds names {', '.join(map(repr, unknown))}, which the model "
                                   f"doesn't have (inputs and outputs: {', '.join(known) or 'none'})")
    if len(set(known)) != len(known):
        raise ProgramError(f"{name}: the model's inputs and outputs share names; orchestra needs one tensor per name")

    tensors: list[tuple[ScalarType, tuple[int, ...], bool]] = []
    in_sizes: dict[str, tuple[int, ...]] = {}
    any_dynamic = False
    for vi in inputs:
        st = _scalar_type(onnx, vi, "input", name)
        sizes, dynamic = _bound(bounds, "input", vi.name, _declared_dims(vi), name)
        in_sizes[vi.name] = sizes
        any_dynamic |= dynamic
        tensors.append((st, sizes, dynamic))
    inferred: dict[str, list[int | None] | None] | None = None
    for vi in outputs:
        st = _scalar_type(onnx, vi, "output", name)
        dims = _declared_dims(vi)
        declared_static = dims is not None and None not in dims
        if not declared_static and vi.name not in bounds:
            if inferred is None:
                inferred = _inferred_output_dims(onnx, mp, in_sizes)
            got = inferred.get(vi.name)
            if got is not None and None not in got and (dims is None or len(got) == len(dims)):
                bounds[vi.name] = tuple(got)
        sizes, dynamic = _bound(bounds, "output", vi.name, dims, name)
        # An output inferred static from static inputs is static; any dynamic input may
        # change an output the model doesn't declare static.
        tensors.append((st, sizes, dynamic and (any_dynamic or vi.name in (dynamic_bounds or {}))))

    values = []
    offset = 0
    for st, sizes, dynamic in tensors:
        n = 1
        for s in sizes:
            n *= s
        values.append(EValue(Tensor(
            scalar_type=st, storage_offset=0, sizes=sizes, dim_order=tuple(range(len(sizes))),
            allocation_info=AllocationDetails(1, offset & 0xFFFFFFFF, offset >> 32),
            shape_dynamism=TensorShapeDynamism.DYNAMIC_BOUND if dynamic else TensorShapeDynamism.STATIC,
        )))
        offset += -(-n * st.itemsize // _ALIGN) * _ALIGN
    n_in = len(inputs)
    idx = tuple(range(len(values)))
    plan = ExecutionPlan(
        name=method_name,
        container_meta_type=None,
        values=tuple(values),
        inputs=idx[:n_in],
        outputs=idx[n_in:],
        chains=(Chain(idx[:n_in], idx[n_in:], (Instruction(DelegateCall(0, idx)),)),),
        operators=(),
        delegates=(BackendDelegate(BACKEND_ID, BackendDelegateDataReference(DataLocation.INLINE, 0)),),
        non_const_buffer_sizes=(0, offset),
    )
    return ProgramDef(0, (plan,), backend_delegate_data=(BackendDelegateInlineData(memoryview(data)),))

