"""The bridge into ExecuTorch's own lowering: ``to_edge_transform_and_lower`` → orchestra backends.

::

    from executorch.exir import to_edge_transform_and_lower
    from orchestra.aot.executorch import partitioner

    et = to_edge_transform_and_lower(torch.export.export(model, args),
                                     partitioner=[partitioner("NumpyCpuBackend")]).to_executorch()
    program = orchestra.runtime.load_program(et.buffer)   # delegates run on NumpyCpuBackend

Three pieces:

- :func:`partitioner` returns an ExecuTorch ``Partitioner`` that tags the edge nodes orchestra's
  numpy kernels can run (the node's out-variant, found as ExecuTorch's emitter finds it, has
  a kernel in :mod:`orchestra.runtime.kernels`; static shapes; supported dtypes), grouped into
  connected partitions with ExecuTorch's ``CapabilityBasedPartitioner`` utilities, each with
  ``DelegationSpec(backend_name, compile_specs)``.
- ExecuTorch looks a backend's ``preprocess`` up by the *name* of a subclass of its own
  ``BackendDetails``. :func:`executorch_backend_details` creates that subclass (once per
  name, on first use): its ``preprocess`` calls orchestra's
  ``get_aot_backend(name).preprocess(edge_program, compile_specs)`` and wraps the result in
  ExecuTorch's ``PreprocessResult``.
- :func:`to_program_def` converts the lowered edge ``ExportedProgram`` ExecuTorch hands to
  ``preprocess`` into an orchestra :class:`~orchestra.program.ProgramDef` with one method,
  ``forward`` (built with :class:`~orchestra.aot.ProgramBuilder`; parameters, buffers and
  lifted constants become embedded constants; operators whose inputs are all constants,
  such as the transpose of a linear layer's weight, are folded ahead of time).

torch and executorch are imported inside these functions, never at module import: without
them every function raises :class:`~orchestra.errors.OrchestraError` with code NotSupported
saying to install the ``export`` extra.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from ..errors import BackendError, Error, InvalidArgumentError, OrchestraError
from ..program import CompileSpec, ProgramDef
from ..runtime.kernels import get_kernel
from ._backend_details import PreprocessResult, get_aot_backend
from ._builder import MethodBuilder, ProgramBuilder, Value
from ._schema import operator_schema

__all__ = [
    "executorch_backend_details",
    "out_variant_name",
    "partitioner",
    "to_program_def",
    "unsupported_reason",
]

# ExecuTorch-side classes created on first use: BackendDetails subclasses by backend name,
# and the partitioner / operator-support classes (they subclass ExecuTorch's and torch's, so
# they can't exist before those are imported). Registries in DESIGN's sense: filled once
# per name, never changed after.
_ET_DETAILS: dict[str, type] = {}
_ET_CLASSES: dict[str, type] = {}

_INSTALL = "install orchestra's 'export' extra (pip install 'orchestra[export]': torch 2.13.0 + executorch 1.5.1)"

# Arguments of torch schemas that mean nothing to numpy kernels; dropped when orchestra's
# schema doesn't take them.
_PLACEMENT_ARGS = frozenset({"layout", "device", "pin_memory", "non_blocking", "memory_format"})


def _require_executorch() -> Any:
    try:
        import torch
        import executorch.exir  # noqa: F401
    except ImportError as exc:
        raise OrchestraError(f"orchestra.aot.executorch needs torch and executorch: {_INSTALL} ({exc})",
                             Error.NotSupported) from exc
    return torch


def _numpy_dtype(torch: Any, dt: Any) -> np.dtype | None:
    table = {
        torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
        torch.int8: np.int8, torch.int16: np.int16, torch.int32: np.int32, torch.int64: np.int64,
        torch.uint8: np.uint8, torch.bool: np.bool_,
    }
    t = table.get(dt)
    return None if t is None else np.dtype(t)


# ---------------------------------------------------------------------------------------
# Operators


def out_variant_name(target: Any) -> str | None:
    """orchestra's name (``aten::convolution.out``) of the out-variant of an edge or ATen
    operator, found as ExecuTorch's emitter finds it (``to_out_variant``); None when it has
    none."""
    torch = _require_executorch()
    from executorch.exir.operator.convert import to_out_variant

    op = getattr(target, "_op", target)
    if not isinstance(op, torch._ops.OpOverload):
        return None
    try:
        out, _ = to_out_variant(op)
    except Exception:  # no out variant (or a schema torchgen can't parse)
        return None
    overload = out._overloadname
    name = out._schema.name
    return name if overload in ("", "default") else f"{name}.{overload}"


def _fake_tensors(torch: Any, val: Any) -> list[Any] | None:
    """The tensors of a node's ``meta["val"]``: one tensor, or a tuple/list of them."""
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (list, tuple)) and val and all(isinstance(v, torch.Tensor) for v in val):
        return list(val)
    return None


def _static_shape(t: Any) -> tuple[int, ...] | None:
    dims = tuple(t.shape)
    return dims if all(type(s) is int for s in dims) else None  # a SymInt is dynamic


def _node_args(node: Any) -> Iterable[Any]:
    stack = list(node.args) + list(node.kwargs.values())
    while stack:
        v = stack.pop(0)
        if isinstance(v, (list, tuple)):
            stack[:0] = list(v)
        else:
            yield v


def unsupported_reason(node: Any) -> str | None:
    """Why the edge node can't be delegated to an orchestra backend, or None when it can
    (an operator with an orchestra kernel for its out variant, tensor inputs and outputs of
    static shapes and dtypes numpy has; ``getitem`` of such a node)."""
    torch = _require_executorch()
    import torch.fx

    if node.op != "call_function":
        return f"a {node.op} node"
    if node.target is operator.getitem:
        src = node.args[0]
        if not isinstance(src, torch.fx.Node):
            return "getitem of a non-node"
        return unsupported_reason(src)
    name = out_variant_name(node.target)
    if name is None:
        return f"{node.target}: no out variant"
    kd = get_kernel(name)
    if kd is None:
        return f"{name}: no orchestra kernel"
    try:
        schema = operator_schema(name)
    except OrchestraError as exc:
        return exc.message
    if schema.returns not in ("out", "outs", "out_list"):
        return f"{name}: returns {schema.returns}, not out tensors"
    outs = _fake_tensors(torch, node.meta.get("val"))
    if outs is None:
        return f"{name}: its result is not a tensor"
    first_dtype = None
    for t in outs:
        if _static_shape(t) is None:
            return f"{name}: dynamic output shape {list(t.shape)}"
        if _numpy_dtype(torch, t.dtype) is None:
            return f"{name}: output dtype {t.dtype} has no numpy equivalent"
    for v in _node_args(node):
        if isinstance(v, torch.fx.Node):
            ts = _fake_tensors(torch, v.meta.get("val"))
            if ts is None or len(ts) != 1:
                return f"{name}: argument {v.name} is not a tensor"
            t = ts[0]
            if _static_shape(t) is None:
                return f"{name}: argument {v.name} has a dynamic shape {list(t.shape)}"
            dt = _numpy_dtype(torch, t.dtype)
            if dt is None:
                return f"{name}: argument {v.name} has dtype {t.dtype}, which numpy lacks"
            if first_dtype is None:
                first_dtype = dt
        elif isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return f"{name}: a symbolic scalar argument"
    if first_dtype is None:
        first_dtype = _numpy_dtype(torch, outs[0].dtype)
    if kd.dtypes is not None and first_dtype.name not in kd.dtypes and first_dtype.name != "bool":
        return f"{name}: orchestra's kernel has no {first_dtype.name} version (it has {', '.join(sorted(kd.dtypes))})"
    return None


# ---------------------------------------------------------------------------------------
# Edge ExportedProgram -> ProgramDef


class _Converter:
    def __init__(self, torch: Any, ep: Any) -> None:
        self.torch = torch
        self.ep = ep
        self.builder = ProgramBuilder()
        self.f: MethodBuilder = self.builder.method("forward")
        self.env: dict[Any, Any] = {}  # fx node -> Value, np.ndarray (constant) or tuple of those
        self.const_values: dict[int, Value] = {}  # id(constant array) -> its Value

    def fail(self, message: str, node: Any = None) -> OrchestraError:
        where = f"node {node.name!r} ({node.target}): " if node is not None else ""
        return BackendError(f"converting the ExecuTorch edge program: {where}{message}", Error.NotSupported)

    def to_numpy(self, t: Any, what: str) -> np.ndarray:
        torch = self.torch
        if not isinstance(t, torch.Tensor):
            raise self.fail(f"{what} is a {type(t).__name__}, not a tensor")
        dt = _numpy_dtype(torch, t.dtype)
        if dt is None:
            raise self.fail(f"{what} has dtype {t.dtype}, which numpy lacks")
        return np.array(t.detach().cpu().contiguous().numpy(), dtype=dt, copy=True)

    def placeholders(self) -> None:
        from torch.export.graph_signature import InputKind

        ep = self.ep
        specs = {s.arg.name: s for s in ep.graph_signature.input_specs}
        for node in ep.graph_module.graph.nodes:
            if node.op != "placeholder":
                continue
            spec = specs.get(node.name)
            kind = spec.kind if spec is not None else InputKind.USER_INPUT
            if kind == InputKind.USER_INPUT:
                ts = _fake_tensors(self.torch, node.meta.get("val"))
                if ts is None or len(ts) != 1:
                    raise self.fail("user inputs must be tensors", node)
                shape = _static_shape(ts[0])
                dt = _numpy_dtype(self.torch, ts[0].dtype)
                if shape is None:
                    raise self.fail(f"dynamic input shape {list(ts[0].shape)} is not supported", node)
                if dt is None:
                    raise self.fail(f"input dtype {ts[0].dtype} has no numpy equivalent", node)
                self.env[node] = self.f.input(dt, shape)
            elif kind == InputKind.PARAMETER:
                self.env[node] = self.to_numpy(ep.state_dict[spec.target], f"parameter {spec.target!r}")
            elif kind == InputKind.BUFFER:
                src = ep.state_dict if spec.persistent is not False and spec.target in ep.state_dict else ep.constants
                self.env[node] = self.to_numpy(src[spec.target], f"buffer {spec.target!r}")
            elif kind == InputKind.CONSTANT_TENSOR:
                self.env[node] = self.to_numpy(ep.constants[spec.target], f"constant {spec.target!r}")
            else:
                raise self.fail(f"inputs of kind {kind.name} are not supported", node)

    def tensor_value(self, v: Any) -> Any:
        """A constant array becomes a constant Value (once per array)."""
        if isinstance(v, np.ndarray):
            cv = self.const_values.get(id(v))
            if cv is None:
                cv = self.const_values[id(v)] = self.f.constant(v)
            return cv
        return v

    def arg(self, v: Any, node: Any, *, fold: bool) -> Any:
        torch = self.torch
        import torch.fx

        if isinstance(v, torch.fx.Node):
            if v not in self.env:
                raise self.fail(f"argument {v.name!r} is not computed in this subgraph", node)
            x = self.env[v]
            if isinstance(x, tuple):
                raise self.fail(f"argument {v.name!r} is a tuple (use getitem)", node)
            if fold:
                return torch.from_numpy(np.array(x, copy=True)) if isinstance(x, np.ndarray) else x
            return self.tensor_value(x)
        if isinstance(v, (list, tuple)):
            return [self.arg(x, node, fold=fold) for x in v]
        if fold:
            return v
        if isinstance(v, torch.dtype):
            dt = _numpy_dtype(torch, v)
            if dt is None:
                raise self.fail(f"dtype {v} has no numpy equivalent", node)
            return dt
        if isinstance(v, torch.memory_format):
            if v in (torch.contiguous_format, torch.preserve_format):
                return None
            raise self.fail(f"memory format {v} is not supported", node)
        if isinstance(v, (torch.layout, torch.device)):
            return None
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        raise self.fail(f"argument {v!r} ({type(v).__name__}) can't be expressed", node)

    def foldable(self, node: Any, outs: list[Any]) -> bool:
        """All tensor inputs are constants, and the result is no bigger than they are."""
        import torch.fx

        inputs = [v for v in _node_args(node) if isinstance(v, torch.fx.Node)]
        if not inputs or not all(isinstance(self.env.get(v), np.ndarray) for v in inputs):
            return False
        size_in = sum(self.env[v].size for v in inputs)
        return sum(t.numel() for t in outs) <= size_in

    def call(self, node: Any) -> None:
        torch = self.torch
        if node.target is operator.getitem:
            src, idx = node.args
            x = self.env.get(src)
            if not isinstance(x, tuple):
                raise self.fail("getitem of a node with a single result", node)
            self.env[node] = x[idx]
            return
        reason = unsupported_reason(node)
        if reason is not None:
            raise self.fail(reason, node)
        outs = _fake_tensors(torch, node.meta["val"])
        if self.foldable(node, outs):
            args = [self.arg(a, node, fold=True) for a in node.args]
            kwargs = {k: self.arg(v, node, fold=True) for k, v in node.kwargs.items()}
            res = node.target(*args, **kwargs)
            self.env[node] = (tuple(self.to_numpy(r, f"the folded result of {node.name}") for r in res)
                              if isinstance(res, (list, tuple)) else self.to_numpy(res, f"the folded result of {node.name}"))
            return
        name = out_variant_name(node.target)
        op = getattr(node.target, "_op", node.target)
        bound: dict[str, Any] = {}
        torch_args = op._schema.arguments
        for a, v in zip(torch_args, node.args):
            bound[a.name] = v
        bound.update(node.kwargs)
        schema = operator_schema(name)
        accepted = {a.name for a in schema.inputs}
        kwargs: dict[str, Any] = {}
        for k, v in bound.items():
            if k in accepted:
                kwargs[k] = self.arg(v, node, fold=False)
            elif k == "dtype" or (k in _PLACEMENT_ARGS and v is not None) or v is None:
                continue  # the out dtype comes from the node's own meta; placement means nothing here
            else:
                raise self.fail(f"orchestra's {name} takes no argument {k!r} (given {v!r})", node)
        dtypes = [_numpy_dtype(torch, t.dtype) for t in outs]
        out_dtype: Any = dtypes if schema.returns == "outs" else dtypes[0]
        # Positionally, in orchestra's schema order ('self' can't be a keyword of call()).
        positional = []
        for a in schema.inputs:
            if a.name in kwargs:
                positional.append(kwargs[a.name])
            elif a.has_default:
                positional.append(copy.copy(a.default))
            else:
                raise self.fail(f"{name}: the edge node gives no argument {a.name!r}", node)
        try:
            res = self.f.call(name, *positional, out_dtype=out_dtype)
        except OrchestraError as exc:
            raise self.fail(exc.message, node) from exc
        got = list(res) if isinstance(res, tuple) else [res]
        if len(got) != len(outs):
            raise self.fail(f"{name} gives {len(got)} results, the edge program expects {len(outs)}", node)
        for k, (v, t) in enumerate(zip(got, outs)):
            want = _static_shape(t)
            if v.shape != want:
                raise self.fail(f"{name} result {k} has shape {list(v.shape)}, the edge program expects {list(want)}", node)
        self.env[node] = tuple(got) if isinstance(res, tuple) else res

    def outputs(self, node: Any) -> None:
        from torch.export.graph_signature import OutputKind

        kinds = [s.kind for s in self.ep.graph_signature.output_specs]
        bad = [k.name for k in kinds if k != OutputKind.USER_OUTPUT]
        if bad:
            raise self.fail(f"outputs of kind {', '.join(sorted(set(bad)))} (mutations) are not supported")
        results = node.args[0]
        results = list(results) if isinstance(results, (list, tuple)) else [results]
        values = []
        inputs = {v.index for v in self.f.inputs}
        for r in results:
            x = self.env.get(r)
            if x is None or isinstance(x, tuple):
                raise self.fail(f"output {getattr(r, 'name', r)!r} is not a tensor of this subgraph")
            if isinstance(x, np.ndarray) or x.index in inputs:
                # A constant or an input can't be an output as it is: copy it.
                x = self.f.call("aten::clone.out", self.tensor_value(x))
            values.append(x)
        if not values:
            raise self.fail("the subgraph has no outputs")
        self.f.output(*values)

    def run(self) -> ProgramDef:
        self.placeholders()
        for node in self.ep.graph_module.graph.nodes:
            if node.op == "call_function":
                self.call(node)
            elif node.op == "output":
                self.outputs(node)
            elif node.op == "get_attr":
                attr = getattr(self.ep.graph_module, node.target)
                self.env[node] = self.to_numpy(attr, f"attribute {node.target!r}")
            elif node.op != "placeholder":
                raise self.fail(f"{node.op} nodes are not supported", node)
        return self.builder.build()


def to_program_def(edge_program: Any) -> ProgramDef:
    """Converts an ExecuTorch edge ``ExportedProgram`` (the lowered subgraph ExecuTorch hands
    a backend's ``preprocess``) into an orchestra program whose ``forward`` takes the user
    inputs in order and returns the outputs in order.

    Raises:
        OrchestraError: code NotSupported when torch/executorch are missing.
        BackendError: code NotSupported naming the node, for anything that can't be
            expressed (dynamic shapes, dtypes numpy lacks, operators without an orchestra
            kernel, buffer mutations).
    """
    torch = _require_executorch()
    if type(edge_program).__name__ != "ExportedProgram":
        raise InvalidArgumentError(f"to_program_def takes an ExecuTorch edge ExportedProgram, got {type(edge_program).__name__}")
    with torch.no_grad():
        return _Converter(torch, edge_program).run()


# ---------------------------------------------------------------------------------------
# ExecuTorch-side classes


def _et_compile_specs(compile_specs: Iterable[Any]) -> list[Any]:
    from executorch.exir.backend.compile_spec_schema import CompileSpec as EtCompileSpec

    specs = []
    for cs in compile_specs:
        key, value = getattr(cs, "key", None), getattr(cs, "value", None)
        if not isinstance(key, str) or not isinstance(value, (bytes, bytearray, memoryview)):
            raise InvalidArgumentError(f"compile specs must be CompileSpec(key: str, value: bytes), got {cs!r}")
        specs.append(EtCompileSpec(key, bytes(value)))
    return specs


def executorch_backend_details(backend_name: str) -> type:
    """ExecuTorch's ``BackendDetails`` subclass named ``backend_name``, created on first use:
    its ``preprocess`` runs orchestra's AOT backend of that name.

    Raises:
        BackendError: code NotFound when no orchestra AOT backend has that name.
        InvalidArgumentError: ExecuTorch already has a different backend of that name.
        OrchestraError: code NotSupported when torch/executorch are missing.
    """
    _require_executorch()
    get_aot_backend(backend_name)  # fails early, listing the registered names
    cls = _ET_DETAILS.get(backend_name)
    if cls is not None:
        return cls
    from executorch.exir.backend.backend_details import BackendDetails as EtBackendDetails
    from executorch.exir.backend.backend_details import PreprocessResult as EtPreprocessResult

    others = [c for c in EtBackendDetails.__subclasses__() if c.__name__ == backend_name]
    if others:
        raise InvalidArgumentError(
            f"ExecuTorch already has a backend named {backend_name!r} ({others[0].__module__}.{others[0].__qualname__}); "
            "give the orchestra backend another name")

    def preprocess(edge_program: Any, compile_specs: list[Any]) -> Any:
        specs = tuple(CompileSpec(cs.key, bytes(cs.value)) for cs in compile_specs)
        result = get_aot_backend(backend_name).preprocess(edge_program, specs)
        if not isinstance(result, PreprocessResult):
            raise BackendError(f"AOT backend {backend_name!r}: preprocess returned {type(result).__name__}, "
                               "expected a PreprocessResult", Error.Internal)
        return EtPreprocessResult(processed_bytes=bytes(result.processed_bytes),
                                  debug_handle_map=result.debug_handle_map)

    preprocess.__qualname__ = f"{backend_name}.preprocess"
    cls = type(backend_name, (EtBackendDetails,), {
        "__module__": __name__,
        "__qualname__": backend_name,
        "__doc__": f"ExecuTorch's view of orchestra's AOT backend {backend_name!r} (created by orchestra.aot.executorch).",
        "preprocess": staticmethod(preprocess),
    })
    return _ET_DETAILS.setdefault(backend_name, cls)


def _partitioner_class() -> type:
    cls = _ET_CLASSES.get("partitioner")
    if cls is not None:
        return cls
    from executorch.exir.backend.canonical_partitioners.pattern_op_partitioner import (
        generate_partitions_from_list_of_nodes,
    )
    from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
    from executorch.exir.backend.utils import tag_constant_data
    from torch.fx.passes.operator_support import OperatorSupportBase

    class _KernelSupport(OperatorSupportBase):
        """A node is supported when :func:`unsupported_reason` finds nothing against it."""

        def __init__(self, rejected: dict[str, str]) -> None:
            self.rejected = rejected

        def is_node_supported(self, submodules: Any, node: Any) -> bool:
            reason = unsupported_reason(node)
            if reason is not None and node.op == "call_function":
                self.rejected[node.name] = reason
            return reason is None

    class OrchestraPartitioner(Partitioner):
        """Tags the nodes orchestra's kernels support for ``backend_id`` (see
        :func:`orchestra.aot.executorch.partitioner`). After ``partition``, ``rejected``
        maps each node left out to the reason."""

        def __init__(self, backend_id: str, compile_specs: Sequence[Any] = ()) -> None:
            super().__init__()
            self.backend_id = backend_id
            self.delegation_spec = DelegationSpec(backend_id, _et_compile_specs(compile_specs))
            self.rejected: dict[str, str] = {}

        def partition(self, exported_program: Any) -> Any:
            executorch_backend_details(self.backend_id)  # ExecuTorch finds preprocess by this name
            self.rejected = {}
            partitions = generate_partitions_from_list_of_nodes(
                exported_program.graph_module, op_support=_KernelSupport(self.rejected))
            tags: dict[str, Any] = {}
            for p in partitions:
                tag = f"{self.backend_id}_{p.id}"
                for node in p.nodes:
                    node.meta["delegation_tag"] = tag
                tags[tag] = self.delegation_spec
            tag_constant_data(exported_program)
            return PartitionResult(tagged_exported_program=exported_program, partition_tags=tags)

    OrchestraPartitioner.__module__ = __name__
    return _ET_CLASSES.setdefault("partitioner", OrchestraPartitioner)


def partitioner(backend_name: str, compile_specs: Sequence[Any] = ()) -> Any:
    """An ExecuTorch ``Partitioner`` delegating what orchestra's numpy kernels support to the
    orchestra backend ``backend_name`` (registered AOT and runtime under that name), with
    ``compile_specs`` (orchestra or ExecuTorch ``CompileSpec``s) stored next to each blob.

    Raises:
        BackendError: code NotFound when no orchestra AOT backend has that name.
        OrchestraError: code NotSupported when torch/executorch are missing.
    """
    _require_executorch()
    if not isinstance(backend_name, str) or not backend_name:
        raise InvalidArgumentError(f"backend_name must be a non-empty string, got {backend_name!r}")
    executorch_backend_details(backend_name)
    return _partitioner_class()(backend_name, tuple(compile_specs))
