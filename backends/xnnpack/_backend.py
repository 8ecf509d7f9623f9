"""``XnnpackBackend``: runs ExecuTorch's XNNPACK delegates (the blob ``XnnpackPartitioner``
writes) with numpy.

``init`` verifies the blob and compiles its graph into a :class:`~._compile.Plan` once per
(Program, delegate), kept in ``BackendInitContext.program_cache`` so that every Method
instance shares the weights; each handle owns only its :class:`~._compile.Workspace`
(activations and scratch). ``execute`` binds the DelegateCall's arrays to the plan's
external values (by ``external_id``) and runs the steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from orchestra.errors import BackendError, Error
from orchestra.program import CompileSpec
from orchestra.runtime import BackendExecutionContext, BackendInitContext, BackendInterface, OptionSpec

from ._blob import VALUE_FLAG_EXTERNAL_INPUT, VALUE_FLAG_EXTERNAL_OUTPUT, parse_blob
from ._compile import Plan, Workspace, compile_graph
from ._summary import summarize

__all__ = ["BACKEND_ID", "XnnpackBackend", "XnnpackHandle", "XnnpackStatistics"]

BACKEND_ID = "XnnpackBackend"
_CACHE_KEY = "xnnpack.plan"
_PACKED_KEY = "xnnpack.packed"
_GRAPH_KEY = "xnnpack.graph"
# Plans specialised for other input dims (dynamic shapes) a handle keeps, most recent first.
MAX_SHAPE_PLANS = 8


@dataclass(frozen=True, slots=True)
class XnnpackStatistics:
    """Counters of one handle (one delegate of one Method instance).

    Attributes:
        executions: executes run.
        steps: numpy steps per execute.
        node_types: the graph's node types with counts.
        activation_bytes: this handle's own buffers (activations + scratch).
        prepacked_bytes: weights re-laid-out for numpy, shared by every Method of the
            Program when ``weight_cache_enabled`` (else owned by this handle).
        shared_plan: True when the plan came from (or went into) the Program's cache.
    """

    executions: int
    steps: int
    node_types: tuple[tuple[str, int], ...]
    activation_bytes: int
    prepacked_bytes: int
    shared_plan: bool


class XnnpackHandle:
    """One XNNPACK delegate in one Method: the shared plan plus this Method's workspace."""

    __slots__ = ("plan", "workspace", "where", "executions", "shared", "graph", "named_data", "packed",
                 "by_shape", "__weakref__")

    def __init__(self, plan: Plan, where: str, shared: bool, graph: Any, named_data: Any,
                 packed: dict[Any, np.ndarray]) -> None:
        self.plan = plan
        self.workspace: Workspace | None = Workspace(plan)
        self.where = where
        self.executions = 0
        self.shared = shared
        self.graph = graph  # the verified XGraph, to specialise plans for other input dims
        self.named_data = named_data
        self.packed = packed  # re-laid-out weights, shared by every plan of the delegate
        # input dims -> (plan, workspace) for dynamic shapes (the serialized dims use .plan)
        self.by_shape: dict[tuple[tuple[int, ...], ...], tuple[Plan, Workspace]] = {}

    def statistics(self) -> XnnpackStatistics:
        counts: dict[str, int] = {}
        for t in self.plan.node_types:
            counts[t] = counts.get(t, 0) + 1
        return XnnpackStatistics(self.executions, len(self.plan.steps), tuple(sorted(counts.items())),
                                 self.plan.activation_bytes, self.plan.prepacked_bytes, self.shared)

    def __repr__(self) -> str:
        state = "destroyed" if self.workspace is None else "live"
        return f"<XnnpackHandle {self.where} nodes={len(self.plan.node_types)} {state}>"


def _where(context: BackendInitContext) -> str:
    """How errors name the delegate being initialised."""
    return f"method {context.method_name!r}: delegate {context.delegate_index} ({context.backend_id or BACKEND_ID})"


def _values(specs: Mapping[str, Any], option_specs: tuple[OptionSpec, ...]) -> dict[str, Any]:
    values = {s.name: s.default for s in option_specs}
    values.update(specs)
    return values


class XnnpackBackend(BackendInterface):
    """Executes XNNPACK delegate blobs (``XH00`` header + ``XNNGraph`` flatbuffer +
    constants) with numpy, float32. See ``backends/xnnpack/README.md``."""

    option_specs = (
        OptionSpec("num_threads", int, 1, hot=True,
                   doc="threads for one execute; this backend runs each execute on the calling thread, so 1 is the "
                       "only effective value (numpy's BLAS pool is governed by orchestra's thread control)"),
        OptionSpec("weight_cache_enabled", bool, True,
                   doc="share the re-laid-out weights (the compiled plan) between every Method instance of a Program "
                       "(ExecuTorch's XNNPACK weight cache); False: each Method compiles and holds its own copy"),
        OptionSpec("workspace_sharing_mode", int, 0, choices=(0, 1, 2),
                   doc="ExecuTorch's workspace sharing between delegate instances (0 Disabled, 1 PerModel, "
                       "2 Global). Instances here may run in parallel, so each always owns its workspace (within "
                       "it, activations and scratch share one arena by lifetime); 1 and 2 are accepted so "
                       "configurations written for ExecuTorch validate, and behave as 0"),
    )

    def init(self, context: BackendInitContext, processed: memoryview, compile_specs: tuple[CompileSpec, ...]) -> XnnpackHandle:
        where = _where(context)
        values = _values(context.runtime_specs, self.option_specs)
        if values["num_threads"] < 1:
            raise BackendError(f"{where}: backend {BACKEND_ID!r} option 'num_threads' must be >= 1, got "
                               f"{values['num_threads']}", Error.InvalidArgument)
        shared = context.program_cache
        cache = shared if values["weight_cache_enabled"] else None
        plan = cache.get(_CACHE_KEY) if cache is not None else None
        if plan is None:
            graph = shared.get(_GRAPH_KEY) if shared is not None else None  # parsed by delegate_outputs
            if graph is None:
                graph = parse_blob(processed, where)
            packed: dict[Any, np.ndarray] = {}
            plan = compile_graph(graph, where, context.named_data, packed=packed)
            if cache is not None:
                graph = cache.setdefault(_GRAPH_KEY, graph)
                packed = cache.setdefault(_PACKED_KEY, packed)
                plan = cache.setdefault(_CACHE_KEY, plan)
        else:
            graph, packed = cache[_GRAPH_KEY], cache[_PACKED_KEY]
        return XnnpackHandle(plan, where, cache is not None, graph, context.named_data, packed)

    def delegate_outputs(self, context: BackendInitContext, processed: memoryview,
                         compile_specs: tuple[CompileSpec, ...]) -> frozenset[int] | None:
        """The graph's external outputs (their ``external_id``: the DelegateCall argument
        each is), which every execute writes whole; its external inputs it only reads (a
        node writing one is refused at init). The parsed graph is kept in the program cache
        for ``init``. None when the blob does not parse or its external ids are not one
        input or output each."""
        shared = context.program_cache
        graph = shared.get(_GRAPH_KEY) if shared is not None else None
        if graph is None:
            try:
                graph = parse_blob(processed, f"delegate {context.delegate_index}")
            except BackendError:
                return None  # init reports it, naming the method
            if shared is not None:
                graph = shared.setdefault(_GRAPH_KEY, graph)
        ins: list[int] = []
        outs: list[int] = []
        for v in graph.values:
            if v.flags & VALUE_FLAG_EXTERNAL_INPUT:
                ins.append(v.external_id)
            if v.flags & VALUE_FLAG_EXTERNAL_OUTPUT:
                outs.append(v.external_id)
        if sorted(ins + outs) != list(range(graph.num_externs)):
            return None
        return frozenset(outs)

    def delegate_in_place(self, context: BackendInitContext, processed: memoryview,
                          compile_specs: tuple[CompileSpec, ...]) -> frozenset[tuple[int, int]]:
        """The compiled plan's ``in_place`` pairs: an input every step has read before the
        first step writing an output (external buffers are bound as given, never copied).
        Compiles the graph as ``init`` would (its result kept in the program cache, so the
        first ``init`` with the weight cache on takes it as it is); empty when it does not
        compile."""
        cache = context.program_cache
        if cache is None:
            return frozenset()
        plan = cache.get(_CACHE_KEY)
        if plan is None:
            graph = cache.get(_GRAPH_KEY)
            where = _where(context)
            try:
                if graph is None:
                    graph = cache.setdefault(_GRAPH_KEY, parse_blob(processed, where))
                packed: dict[Any, np.ndarray] = {}
                plan = compile_graph(graph, where, context.named_data, packed=packed)
            except BackendError:
                return frozenset()  # init reports it
            cache.setdefault(_PACKED_KEY, packed)
            plan = cache.setdefault(_CACHE_KEY, plan)
        return plan.in_place

    def _specialised(self, handle: XnnpackHandle, args: list[Any]) -> tuple[Plan, Workspace]:
        """The plan and workspace for the input dims of ``args`` (dynamic shapes)."""
        shapes = []
        for e, _slot, shape, dtype in handle.plan.inputs:
            a = args[e]
            if not isinstance(a, np.ndarray) or a.dtype != dtype or a.ndim != len(shape):
                raise BackendError(
                    f"{handle.where}: argument {e} (external input) must be a {dtype} tensor with {len(shape)} dims "
                    f"(serialized dims {list(shape)}), got {_describe(a)}", Error.InvalidArgument)
            shapes.append(tuple(a.shape))
        key = tuple(shapes)
        hit = handle.by_shape.get(key)
        if hit is None:
            ins = {e: s for (e, _, _, _), s in zip(handle.plan.inputs, shapes)}
            plan = compile_graph(handle.graph, handle.where, handle.named_data, input_shapes=ins, packed=handle.packed)
            hit = (plan, Workspace(plan))
            if len(handle.by_shape) >= MAX_SHAPE_PLANS:
                handle.by_shape.pop(next(iter(handle.by_shape)))
        else:
            handle.by_shape.pop(key)
        handle.by_shape[key] = hit  # most recent last
        return hit

    def execute(self, context: BackendExecutionContext, handle: XnnpackHandle, args: list[Any]) -> None:
        ws = handle.workspace
        if ws is None:
            raise BackendError(f"{handle.where}: execute on a destroyed handle", Error.DelegateInvalidHandle)
        plan = handle.plan
        if len(args) != plan.num_args:
            raise BackendError(f"{handle.where}: the DelegateCall passes {len(args)} arguments, the XNNPACK graph "
                               f"has {plan.num_args} external values", Error.InvalidArgument)
        for e, _slot, shape, dtype in plan.inputs:
            a = args[e]
            if not isinstance(a, np.ndarray) or a.dtype != dtype or (
                    a.shape != shape and (a.ndim == len(shape) or a.size != ws_size(shape))):
                plan, ws = self._specialised(handle, args)
                break
        bufs = ws.bufs
        for e, slot, shape, dtype in plan.inputs:
            a = args[e]
            if not a.flags.c_contiguous:
                a = np.ascontiguousarray(a)
            bufs[slot] = a if a.shape == shape else a.reshape(shape)  # e.g. a 0-dim tensor for dims [1]
        for e, slot, shape, dtype in plan.outputs:
            a = args[e]
            if isinstance(a, np.ndarray) and a.dtype == dtype and a.size == ws_size(shape) and a.flags.c_contiguous \
                    and a.flags.writeable:
                bufs[slot] = a.reshape(shape)
            else:
                new = np.empty(shape, dtype)
                args[e] = new
                bufs[slot] = new
        try:
            with np.errstate(all="ignore"):
                for step in plan.steps:
                    step(bufs)
        except Exception as exc:  # a numpy failure the checks at init did not foresee
            k = next((i for i, st in enumerate(plan.steps) if st is step), -1)  # noqa: B023
            node = plan.step_nodes[k] if k >= 0 else -1
            raise BackendError(f"{handle.where}: XNNGraph.xnodes[{node}] ({plan.node_types[node]}) failed: "
                               f"{type(exc).__name__}: {exc}", Error.Internal) from exc
        handle.executions += 1

    def destroy(self, handle: XnnpackHandle) -> None:
        handle.workspace = None
        handle.by_shape.clear()

    def describe_delegate(self, blob: memoryview, named_data: Any = None) -> dict[str, Any]:
        """What ``orchestra inspect`` shows for one delegate (see :func:`~._summary.summarize`):
        a one-line ``summary`` plus node types with counts, tensor count, constant bytes and
        where the constants live. Raises BackendError for an invalid blob."""
        s = summarize(blob, named_data)
        return {"summary": s.line(), "identifier": s.identifier, "node_types": dict(s.node_types),
                "tensors": s.tensors, "constants": s.constants, "constant_bytes": s.constant_bytes,
                "constants_in": s.constants_in, "datatypes": list(s.datatypes)}


def ws_size(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _describe(a: Any) -> str:
    if isinstance(a, np.ndarray):
        return f"{a.dtype} {list(a.shape)}"
    return type(a).__name__
