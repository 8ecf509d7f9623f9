"""The graph compiler: a verified :class:`~._blob.XGraph` becomes a :class:`Plan`, a list
of pre-bound numpy steps.

A plan is built once per (Program, delegate) and shared by every Method instance: its steps
hold the constants (zero-copy views of the program's bytes) and the weights re-laid-out for
numpy (prepacked once). Each Method gets its own :class:`Workspace` (activation and scratch
arrays sized from :attr:`Plan.buffers`), so N instances cost N x activations, never N x
weights.

Extending: node types are dispatched through :data:`NODE_BUILDERS` (name -> builder) and
value datatypes through :data:`DATATYPES` (XNNDatatype -> numpy dtype); another module adds
entries with :func:`register_node` / :func:`register_datatype` (e.g. the quantized types).
A builder gets the :class:`Compiler` and the :class:`~._blob.XNode` and returns its steps.
"""

from __future__ import annotations

import heapq
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from operator import itemgetter
from types import MappingProxyType
from typing import Any

import numpy as np

from orchestra.errors import BackendError, Error
from orchestra.program._schema import _fast_init
from orchestra.runtime import kernels

from ._blob import (INVALID_ID, NODE_VALUE_FIELDS, VALUE_FLAG_EXTERNAL_INPUT, VALUE_FLAG_EXTERNAL_OUTPUT, XGraph, XNode, XValue,
                    constant_bytes)

__all__ = [
    "DATATYPES",
    "MAX_WORKSPACE_BYTES",
    "NODE_BUILDERS",
    "Compiler",
    "Plan",
    "Step",
    "TensorInfo",
    "Workspace",
    "compile_graph",
    "register_datatype",
    "register_node",
]

# A step runs one piece of a node on a Method's buffers (the workspace's list of arrays).
Step = Callable[[list[Any]], None]
Builder = Callable[["Compiler", XNode], list[Step]]

# The registries (DESIGN: the only module-level mutable state, filled at import time):
# "datatypes": XNNDatatype -> numpy dtype of the values this backend computes with (one
# place for dtype handling: a datatype missing here is rejected at init, naming the value);
# "nodes": node type name -> builder, filled by _nodes (float32) at import. Extend both with
# register_datatype / register_node; read them through DATATYPES / NODE_BUILDERS.
_REGISTRY: dict[str, dict[Any, Any]] = {
    "datatypes": {
        1: np.dtype(np.float32),  # xnn_datatype_fp32
        12: np.dtype(np.int32),  # xnn_datatype_int32
    },
    "nodes": {},
}
DATATYPES: Mapping[int, np.dtype] = MappingProxyType(_REGISTRY["datatypes"])
NODE_BUILDERS: Mapping[str, Builder] = MappingProxyType(_REGISTRY["nodes"])

# Per-Method activations + scratch of one delegate may not exceed this (a hostile blob
# declaring huge dims must fail at init, not allocate).
MAX_WORKSPACE_BYTES = 2 << 30
# Constants re-laid-out once per Program (transposed filters, ...) may not exceed this.
MAX_PREPACK_BYTES = 4 << 30


def register_node(name: str, builder: Builder) -> None:
    """Makes ``builder`` compile nodes of type ``name`` (e.g. ``"XNNConv2d"``), replacing
    any earlier builder for it."""
    _REGISTRY["nodes"][name] = builder


def register_datatype(datatype: int, dtype: np.dtype) -> None:
    """Lets values of XNNDatatype ``datatype`` exist, held as numpy ``dtype``."""
    _REGISTRY["datatypes"][int(datatype)] = np.dtype(dtype)


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One value as the compiler sees it.

    ``slot`` indexes the workspace's buffer list (-1 for constants, which live in
    ``const``). ``external`` is the DelegateCall argument index, or -1.
    """

    value: XValue
    dtype: np.dtype
    shape: tuple[int, ...]
    slot: int
    external: int = -1
    const: np.ndarray | None = field(default=None, repr=False)

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


_fast_init(TensorInfo)  # one per value of every graph compiled


@dataclass(frozen=True, slots=True)
class Plan:
    """A compiled delegate (shared by every Method of a Program; immutable).

    Attributes:
        steps: the numpy steps, in order; ``step_nodes`` the node index each comes from.
        buffers: (shape, dtype, fill, offset) of each workspace slot: a view at ``offset``
            of the Method's arena (buffers whose lifetimes don't overlap share memory), or
            its own array (offset -1); None for slots bound at execute (external
            inputs/outputs) or by a view step.
        arena_bytes: the size of the shared arena.
        inputs: (argument index, slot, shape, dtype) of each external input, by argument.
        outputs: the same for each external output.
        node_types: the graph's node type per node (for statistics/inspect).
        activation_bytes: bytes of per-Method buffers (what one Method instance costs).
        prepacked_bytes: bytes of weights re-laid-out once per Program.
        in_place: (input argument, output argument) pairs where every step reading the
            input (or a view of it) runs before the first step writing the output (a
            fused epilogue writes at its producer's step): the two may share memory.
    """

    steps: tuple[Step, ...]
    step_nodes: tuple[int, ...]
    buffers: tuple[tuple[tuple[int, ...], np.dtype, float | None, int] | None, ...]
    arena_bytes: int
    inputs: tuple[tuple[int, int, tuple[int, ...], np.dtype], ...]
    outputs: tuple[tuple[int, int, tuple[int, ...], np.dtype], ...]
    node_types: tuple[str, ...]
    activation_bytes: int
    prepacked_bytes: int
    num_args: int
    in_place: frozenset[tuple[int, int]] = frozenset()


_fast_init(Plan)  # one per delegate


class Workspace:
    """One Method's buffers for one plan: the list every step reads and writes."""

    __slots__ = ("bufs", "arena", "nbytes")

    def __init__(self, plan: Plan) -> None:
        self.arena = np.empty(plan.arena_bytes, np.uint8)
        bufs: list[Any] = []
        own = 0
        for b in plan.buffers:
            if b is None:
                bufs.append(None)
            elif b[3] >= 0:
                bufs.append(np.ndarray(b[0], b[1], self.arena, b[3]))
            else:
                a = np.empty(b[0], b[1]) if b[2] is None else np.full(b[0], b[2], b[1])
                own += a.nbytes
                bufs.append(a)
        self.bufs = bufs
        self.nbytes = plan.arena_bytes + own


class _ValuePath:
    """``<where>: XNNGraph.xvalues[i] (id n)``, built only when a message needs it."""

    __slots__ = ("where", "v")

    def __init__(self, where: str, v: XValue) -> None:
        self.where, self.v = where, v

    def __str__(self) -> str:
        return f"{self.where}: XNNGraph.xvalues[{self.v.index}] (id {self.v.id})"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


class Compiler:
    """State while compiling one graph; builders use its helpers.

    ``where`` names the delegate; :meth:`node_where` a node inside it.
    """

    def __init__(self, graph: XGraph, where: str, named_data: Callable[[str], memoryview] | None,
                 input_shapes: Mapping[int, tuple[int, ...]] | None = None,
                 packed: dict[Any, np.ndarray] | None = None, *, lookup: bool = True) -> None:
        self.graph = graph
        self.where = where
        self.named_data = named_data
        # Dynamic shapes: the external inputs' actual dims (by external id); every other
        # value then takes the dims its node computes (the serialized ones are upper bounds).
        self.input_shapes = dict(input_shapes or {})
        self.dynamic = bool(self.input_shapes)
        self.packed = packed if packed is not None else {}
        self.values: dict[int, XValue] = {}
        self.infos: dict[int, TensorInfo] = {}
        self.buffers: list[tuple[tuple[int, ...], np.dtype, float | None] | None] = []
        self.prepacked_bytes = 0
        self.workspace_bytes = 0
        self._node: XNode | None = None
        self._pos = 0  # index of the node being compiled (lifetimes are in node positions)
        self._first: dict[int, int] = {}  # slot -> first node position that touches it
        self._last: dict[int, int] = {}  # slot -> last node position that touches it
        self._alias: dict[int, int] = {}  # view slot -> the slot whose memory it shows
        self._pinned: set[int] = set()  # slots that never share memory
        # orchestra's compiled kernels (channels-last convolutions, linear layers,
        # activations), or None: numpy steps only (not built, or ORCHESTRA_NATIVE_KERNELS=0).
        self.native: Any = kernels.compiled()
        # Fusion (planned by _plan_fusion, compiled kernels only): producer node position ->
        # (activation code, the value id it writes instead of its own output); node positions
        # whose work a producer's epilogue or a fused step does; the position of a Multiply
        # compiled as one SiLU step (SILU_NODE's builder) -> the value id of x.
        self._fused: dict[int, tuple[int, int]] = {}
        self._skipped: set[int] = set()
        self._silu_x: dict[int, int] = {}
        # Float islands of quantized graphs run as one lookup (_plan_lookup): the last
        # Convert's position -> the chain's node positions (first Convert .. last). Off for
        # the graphs that make the tables.
        self.lookup = lookup
        self._lut: dict[int, tuple[int, ...]] = {}

    # -- errors ---------------------------------------------------------------------------
    def node_where(self, node: XNode | None = None) -> str:
        node = node or self._node
        if node is None:
            return self.where
        return f"{self.where}: XNNGraph.xnodes[{node.index}] ({node.type}, debug_handle {node.debug_handle})"

    def fail(self, msg: str, code: Error = Error.InvalidProgram) -> BackendError:
        return BackendError(f"{self.node_where()}: {msg}", code)

    # -- values ---------------------------------------------------------------------------
    def _slot(self, spec: tuple[tuple[int, ...], np.dtype, float | None] | None) -> int:
        if spec is not None:
            nbytes = math.prod(spec[0]) * spec[1].itemsize
            self.workspace_bytes += nbytes
            if self.workspace_bytes > MAX_WORKSPACE_BYTES:
                raise self.fail(f"the delegate's activations would need more than {MAX_WORKSPACE_BYTES} bytes per "
                                "Method (corrupt dims?)", Error.MemoryAllocationFailed)
        self.buffers.append(spec)
        return len(self.buffers) - 1

    def scratch(self, shape: tuple[int, ...], dtype: Any = np.float32, fill: float | None = None) -> int:
        """A per-Method scratch buffer slot for the node being compiled (e.g. an im2col
        matrix, a padded input). Its memory may be shared with buffers of other nodes, so
        its content does not survive to the next execute, except with ``fill``: then every
        element is set once, when the Method's workspace is made (e.g. the border of a
        padded input, which later writes never touch), and the buffer is never shared."""
        slot = self._slot((tuple(int(d) for d in shape), np.dtype(dtype), fill))
        self._touch(slot)
        if fill is not None:
            self._pinned.add(slot)
        return slot

    def rebound(self) -> int:
        """A slot a step rebinds at execute (to a view of some input); it owns no memory."""
        self.buffers.append(None)
        return len(self.buffers) - 1

    def make_view(self, out: TensorInfo, src: TensorInfo) -> bool:
        """Drops ``out``'s own buffer when a step will bind a view of ``src`` in its slot
        instead (reshape of a buffer). False (keep the buffer) for external outputs."""
        if out.external >= 0:
            return False
        spec = self.buffers[out.slot]
        if spec is not None:
            self.workspace_bytes -= math.prod(spec[0]) * spec[1].itemsize
            self.buffers[out.slot] = None
        if src.slot >= 0:
            self._alias[out.slot] = self._alias.get(src.slot, src.slot)
            self._touch(src.slot)
        return True

    def _touch(self, slot: int) -> None:
        slot = self._alias.get(slot, slot)
        self._first.setdefault(slot, self._pos)
        self._last[slot] = self._pos

    def pack(self, key: str, make: Callable[[], np.ndarray]) -> np.ndarray:
        """Weights derived once from constants for the node being compiled (re-laid-out
        filters, ...): ``make()`` runs only when no plan of this delegate (e.g. one
        specialised for other input shapes) made them under (node index, ``key``) before."""
        k = (self._node.index if self._node is not None else -1, key)
        arr = self.packed.get(k)
        if arr is None:
            arr = self.packed.setdefault(k, self.prepacked(make()))
        return arr

    def prepacked(self, array: np.ndarray) -> np.ndarray:
        """Registers ``array`` as weights derived once per Program; returns it read-only."""
        self.prepacked_bytes += array.nbytes
        if self.prepacked_bytes > MAX_PREPACK_BYTES:
            raise self.fail(f"re-laid-out weights exceed {MAX_PREPACK_BYTES} bytes", Error.MemoryAllocationFailed)
        array.setflags(write=False)
        return array

    def _value_error(self, v: XValue, message: str, code: Error) -> BackendError:
        """``<where>: XNNGraph.xvalues[i] (id n): message`` (the path made only for the error)."""
        return BackendError(f"{_ValuePath(self.where, v)}: {message}", code)

    def _define(self, v: XValue) -> None:
        # (one call per value of every graph compiled: attributes read once, the common
        # internal value's slot made inline; the checks and messages are _slot's)
        err = self._value_error
        vid, flags, datatype = v.id, v.flags, v.datatype
        if vid == INVALID_ID:
            raise err(v, "id_out is XNN_INVALID_VALUE_ID", Error.InvalidProgram)
        values = self.values
        if vid in values:
            raise err(v, f"id {vid} is defined twice (also by xvalues[{values[vid].index}])", Error.InvalidProgram)
        dtype = _DATATYPES.get(datatype)
        if dtype is None or (v.quant is not None and datatype in (1, 12)):
            what = f"datatype {v.datatype_name}" + (f" with {v.quant.kind}" if v.quant is not None else "")
            raise err(v, f"{what} is not supported by this backend (supported: "
                         f"{', '.join(sorted(_dt_name(d) for d in DATATYPES))})", Error.NotSupported)
        if v.dq_datatype and v.dq_datatype not in _DATATYPES:
            raise err(v, f"dq_datatype {_dt_name(v.dq_datatype)} (dynamic quantization) is not supported by this "
                         "backend", Error.NotSupported)
        shape = v.dims  # the decoders' tuple of ints
        if type(shape) is not tuple:
            shape = tuple(map(int, shape))
        if flags & VALUE_FLAG_EXTERNAL_INPUT and v.external_id in self.input_shapes:
            given = tuple(map(int, self.input_shapes[v.external_id]))
            if len(given) != len(shape):
                raise err(v, f"external input {v.external_id} has {len(shape)} dims {list(shape)}, got "
                             f"{len(given)} dims {list(given)}", Error.InvalidArgument)
            shape = given
        count = math.prod(shape)
        nbytes = count * dtype.itemsize
        if nbytes > MAX_WORKSPACE_BYTES:
            raise err(v, f"dims {list(shape)} hold more than {MAX_WORKSPACE_BYTES} bytes (corrupt dims?)",
                      Error.MemoryAllocationFailed)
        if flags & ~0x3:
            raise err(v, f"flags {flags:#x} hold bits other than EXTERNAL_INPUT/EXTERNAL_OUTPUT", Error.InvalidProgram)
        cbi = v.constant_buffer_idx
        if flags:
            if v.external_id >= self.graph.num_externs:
                raise err(v, f"external_id {v.external_id} is not below num_externs {self.graph.num_externs}",
                          Error.InvalidProgram)
            if cbi:
                raise err(v, "an external value can't be a constant", Error.InvalidProgram)
            values[vid] = v
            # external values are bound at execute
            self.buffers.append(None)
            info = self.infos[vid] = TensorInfo(v, dtype, shape, len(self.buffers) - 1, v.external_id)
            self._externals.append(info)
            return
        values[vid] = v
        if cbi:
            raw = constant_bytes(self.graph, v, self.named_data, self.where)
            if len(raw) < nbytes:
                raise err(v, f"constant {cbi} holds {len(raw)} bytes, dims {list(shape)} of "
                             f"{v.datatype_name} need {nbytes}", Error.InvalidProgram)
            arr = np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)
            if arr.flags.writeable:
                arr = arr.view()
                arr.flags.writeable = False
            self.infos[vid] = TensorInfo(v, dtype, shape, -1, -1, arr)
            return
        # others get a per-Method buffer
        self.workspace_bytes += nbytes
        if self.workspace_bytes > MAX_WORKSPACE_BYTES:
            raise self.fail(f"the delegate's activations would need more than {MAX_WORKSPACE_BYTES} bytes per "
                            "Method (corrupt dims?)", Error.MemoryAllocationFailed)
        buffers = self.buffers
        buffers.append((shape, dtype, None))
        self.infos[vid] = TensorInfo(v, dtype, shape, len(buffers) - 1, -1)

    def info(self, vid: int, role: str, *, optional: bool = False) -> TensorInfo | None:
        """The value a node field refers to. ``optional``: XNN_INVALID_VALUE_ID gives None."""
        if vid == INVALID_ID and optional:
            return None
        info = self.infos.get(vid)
        if info is None:
            raise self.fail(f"{role} refers to value id {vid}, which no XNNGraph.xvalues entry defines")
        if info.const is None and not info.value.is_input and vid not in self._written:
            raise self.fail(f"{role} reads value id {vid} before any node writes it (nodes must come in "
                            "execution order)")
        if info.slot >= 0:
            self._touch(info.slot)
        return info

    def tensor(self, vid: int, role: str) -> TensorInfo:
        """:meth:`info` of a value the node must have."""
        info = self.infos.get(vid)
        if info is None or (info.const is None and vid not in self._written
                            and not info.value.flags & VALUE_FLAG_EXTERNAL_INPUT):
            got = self.info(vid, role)  # raises naming the reference
            assert got is not None
            return got
        if info.slot >= 0:
            self._touch(info.slot)
        return info

    def output(self, vid: int, role: str = "output_id") -> TensorInfo:
        info = self.infos.get(vid)
        if info is None:
            raise self.fail(f"{role} refers to value id {vid}, which no XNNGraph.xvalues entry defines")
        if info.is_const:
            raise self.fail(f"{role} (value id {vid}) is a constant; a node can't write into it")
        if info.value.is_input:
            raise self.fail(f"{role} (value id {vid}) is an external input; a node can't write into it")
        if vid in self._written:
            raise self.fail(f"{role} (value id {vid}) is already written by XNNGraph.xnodes[{self._written[vid]}]")
        self._written[vid] = self._node.index if self._node is not None else -1
        self._touch(info.slot)
        return info

    def fused_output(self) -> tuple[TensorInfo, int]:
        """The output of the node being compiled and the activation its steps end with
        (after its own output clamp): its ``output_id`` and 0, or, where the activation that
        alone reads that output was fused into it, the activation's output and its code
        (1 relu, 2 hardswish, 3 silu: the compiled kernels' ``act``)."""
        act, vid = self._fused.get(self._pos, (0, -1))
        if act:
            return self.output(vid, "output_id (fused activation's output)"), act
        assert self._node is not None
        return self.output(self._node.fields["output_id"]), 0

    def lookup_chain(self) -> tuple[int, ...]:
        """For the lookup step at a float island's last Convert (LOOKUP_NODE): the island's
        node positions, its first Convert to its last."""
        return self._lut[self._pos]

    def lookup_chains(self) -> tuple[tuple[int, ...], ...]:
        """Every float island run as one lookup in this graph (see :meth:`lookup_chain`), in
        graph order."""
        return tuple(self._lut.values())

    def silu_input(self) -> int:
        """For the SiLU step that replaces a Multiply (SILU_NODE): the value id of x."""
        return self._silu_x[self._pos]

    def check_shape(self, out: TensorInfo, shape: tuple[int, ...], role: str = "output") -> TensorInfo:
        """Checks the dims a node computes against its output value's; with dynamic input
        shapes the value takes the computed dims (same rank). Returns the value's info."""
        if out.shape == shape:  # (the builders' tuples of ints)
            return out
        shape = tuple(int(d) for d in shape)
        if tuple(out.shape) == shape:
            return out
        if not self.dynamic or len(shape) != len(out.shape):
            raise self.fail(f"{role} (value id {out.value.id}) has dims {list(out.shape)}, the node computes "
                            f"{list(shape)}")
        new = TensorInfo(out.value, out.dtype, shape, out.slot, out.external, out.const)
        self.infos[out.value.id] = new
        spec = self.buffers[out.slot]
        if spec is not None:
            self.workspace_bytes -= math.prod(spec[0]) * spec[1].itemsize
            self.buffers[out.slot] = self._checked_spec((shape, spec[1], spec[2]))
        return new

    def _checked_spec(self, spec: tuple[tuple[int, ...], np.dtype, float | None]) -> tuple[tuple[int, ...], np.dtype, float | None]:
        self.workspace_bytes += math.prod(spec[0]) * spec[1].itemsize
        if self.workspace_bytes > MAX_WORKSPACE_BYTES:
            raise self.fail(f"the delegate's activations would need more than {MAX_WORKSPACE_BYTES} bytes per "
                            "Method (corrupt dims?)", Error.MemoryAllocationFailed)
        return spec

    def check_dtype(self, info: TensorInfo, role: str, allowed: tuple[Any, ...] = (np.float32,)) -> None:
        if info.dtype is _F32 and np.float32 in allowed:  # most checks: no dtypes made
            return
        if info.dtype not in [np.dtype(a) for a in allowed]:
            raise self.fail(f"{role} (value id {info.value.id}) is {info.value.datatype_name}; this node supports "
                            f"{', '.join(np.dtype(a).name for a in allowed)}", Error.NotSupported)

    def getter(self, info: TensorInfo) -> Callable[[list[Any]], Any]:
        """A function returning the value's array from the buffers (constants: the array)."""
        if info.const is not None:
            c = info.const
            return lambda b: c
        return itemgetter(info.slot)  # (called in C: no Python frame per read at execute)

    # -- compile --------------------------------------------------------------------------
    def compile(self) -> Plan:
        self._written: dict[int, int] = {}
        self._externals: list[TensorInfo] = []  # the external values' infos, in value order
        define = self._define
        for v in self.graph.values:
            define(v)
        ins: dict[int, TensorInfo] = {}
        outs: dict[int, TensorInfo] = {}
        for info in self._externals:
            flags = info.value.flags
            table = ins if flags & VALUE_FLAG_EXTERNAL_INPUT else outs
            if flags == VALUE_FLAG_EXTERNAL_INPUT | VALUE_FLAG_EXTERNAL_OUTPUT:
                raise BackendError(f"{self.where}: value id {info.value.id} is both an external input and output",
                                   Error.InvalidProgram)
            if info.external in ins or info.external in outs:
                raise BackendError(f"{self.where}: external_id {info.external} is used by two values",
                                   Error.InvalidProgram)
            table[info.external] = info
        if self.native is not None:
            self._plan_fusion()
        steps: list[Step] = []
        step_nodes: list[int] = []
        for pos, node in enumerate(self.graph.nodes):
            self._node, self._pos = node, pos
            if pos in self._skipped:
                continue
            builder = NODE_BUILDERS.get(SILU_NODE if pos in self._silu_x else LOOKUP_NODE if pos in self._lut
                                        else node.type)
            if builder is None:
                raise BackendError(f"{self.where}: XNNGraph.xnodes[{node.index}] has node type {node.type}, which this "
                                   "backend does not implement", Error.NotSupported)
            made = builder(self, node)
            steps.extend(made)
            step_nodes.extend([node.index] * len(made))
        self._node = None
        for ext, info in outs.items():
            if info.value.id not in self._written:
                raise BackendError(f"{self.where}: external output (value id {info.value.id}, external_id {ext}) is "
                                   "written by no node", Error.InvalidProgram)
        layout, arena = self._layout()
        num_args = len(ins) + len(outs)
        if sorted([*ins, *outs]) != list(range(num_args)):
            raise BackendError(f"{self.where}: external ids {sorted([*ins, *outs])} are not 0..{num_args - 1}",
                               Error.InvalidProgram)
        return Plan(
            steps=tuple(steps),
            step_nodes=tuple(step_nodes),
            buffers=tuple(layout),
            arena_bytes=arena,
            inputs=tuple((e, i.slot, i.shape, i.dtype) for e, i in sorted(ins.items())),
            outputs=tuple((e, i.slot, i.shape, i.dtype) for e, i in
                          sorted((e, self.infos[i.value.id]) for e, i in outs.items())),
            node_types=tuple(n.type for n in self.graph.nodes),
            activation_bytes=arena + sum(math.prod(b[0]) * b[1].itemsize for b in layout
                                         if b is not None and b[3] < 0),
            prepacked_bytes=self.prepacked_bytes,
            num_args=num_args,
            in_place=self._in_place(ins, outs),
        )

    def _in_place(self, ins: Mapping[int, TensorInfo], outs: Mapping[int, TensorInfo]) -> frozenset[tuple[int, int]]:
        """Plan.in_place: from the node positions that touch each external buffer (views
        count for the buffer they show; the steps run in node order, each node's at its
        position)."""
        first, last = self._first, self._last
        read_until = {e: last.get(i.slot, -1) for e, i in ins.items()}
        written_from = {e: first.get(self.infos[i.value.id].slot) for e, i in outs.items()}
        return frozenset((a, b) for a, r in read_until.items() for b, w in written_from.items()
                         if w is not None and r < w)


    def _plan_fusion(self) -> None:
        """Finds the activations the compiled kernels can run inside the step before them:
        a SiLU (Sigmoid of x, then Multiply of x by it, the Sigmoid read by nothing else)
        becomes one step, or, with Hardswish, the epilogue of the float32 Conv2d /
        DepthwiseConv2d / FullyConnected that produces x when nothing else reads x and that
        node has no output clamp. Values stay what the graph computes; only the unread
        intermediates are never written."""
        nodes = self.graph.nodes
        types = {n.type for n in nodes}
        if "XNNHardswish" not in types and "XNNSigmoid" not in types and not (self.lookup and "XNNConvert" in types):
            return  # nothing to fuse (most of a transformer's graphs): no reader maps made
        readers: dict[int, list[int]] = {}
        producer: dict[int, int] = {}
        for pos, node in enumerate(nodes):
            f = node.fields
            ins, outs = _value_fields(node)
            for key in outs:
                vid = f.get(key)
                if type(vid) is int:
                    producer.setdefault(vid, pos)
            for key in ins:
                vid = f.get(key)
                if type(vid) is int:
                    readers.setdefault(vid, []).append(pos)

        def f32(vid: int, internal: bool = True) -> bool:
            info = self.infos.get(vid)
            return (info is not None and info.dtype == _F32 and info.const is None and not info.value.is_input
                    and (not internal or info.external < 0))

        def no_clamp(node: XNode) -> bool:
            mm = node.output_min_max
            return mm is None or (mm[0] == -math.inf and mm[1] == math.inf)

        def epilogue(x: int, act: int, out: int, consumers: list[int]) -> bool:
            """Fuses ``act`` into x's producer when it may (then it writes ``out``)."""
            p = producer.get(x)
            if p is None or p in self._fused or sorted(readers.get(x, ())) != sorted(consumers):
                return False
            pn = nodes[p]
            if pn.type not in _EPILOGUE_NODES or not no_clamp(pn) or not f32(x):
                return False
            ins = [pn.fields.get(k) for k in ("input1_id", "filter_id")]
            if not all(type(v) is int and v in self.infos and self.infos[v].dtype == _F32 for v in ins):
                return False
            self._fused[p] = (act, out)
            self._skipped.update(consumers)
            return True

        if self.lookup:
            self._plan_lookup(readers)
        claimed = {p for chain in self._lut.values() for p in chain}
        for pos, node in enumerate(nodes):
            f = node.fields
            if pos in claimed:
                continue
            if node.type == "XNNHardswish":
                x, y = f["input_id"], f["output_id"]
                if f32(x) and f32(y, internal=False):
                    epilogue(x, 2, y, [pos])
            elif node.type == "XNNSigmoid":
                x, s = f["input_id"], f["output_id"]
                use = readers.get(s, [])
                if len(use) != 1 or not f32(x, internal=False) or not f32(s):
                    continue
                m = nodes[use[0]]
                if (m.type != "XNNMultiply" or not no_clamp(m)
                        or sorted((m.fields["input1_id"], m.fields["input2_id"])) != sorted((x, s))
                        or not f32(m.fields["output_id"], internal=False)):
                    continue
                if not epilogue(x, 3, m.fields["output_id"], [pos, use[0]]):
                    self._skipped.add(pos)
                    self._silu_x[use[0]] = x

    def _plan_lookup(self, readers: Mapping[int, list[int]]) -> None:
        """Finds the float islands of quantized graphs: a Convert of an 8-bit per-tensor
        quantized value x to float32, elementwise float32 nodes over it (and scalar
        constants), a Convert of their result back to 8 bits (a hardswish, a SiLU, a sigmoid,
        a hardsigmoid's add / clamp / divide where its 3 and 6 are constants). Each output
        element is then a function of the
        one element of x at its place, which has 256 values: the chain runs as one lookup
        (LOOKUP_NODE's builder at the last Convert; its table made by the chain's own steps
        over the 256 values, so the results are the chain's own). Every value the chain
        makes but the last is read only inside it and is no graph output."""
        nodes = self.graph.nodes

        def q8(vid: int) -> bool:
            info = self.infos.get(vid)
            return (info is not None and info.const is None and info.dtype.itemsize == 1 and info.dtype.kind in "iu"
                    and info.value.quant is not None and info.value.quant.kind == "PerTensorQuant")

        def f32(vid: int) -> bool:
            info = self.infos.get(vid)
            return info is not None and info.dtype == _F32 and info.const is None and info.external < 0

        def scalar(vid: int) -> bool:
            info = self.infos.get(vid)
            return info is not None and info.const is not None and info.const.size == 1

        for pos, node in enumerate(nodes):
            if node.type != "XNNConvert" or not q8(node.fields["input_id"]) or not f32(node.fields["output_id"]):
                continue
            made = {node.fields["output_id"]}  # the chain's float values
            shape = self.infos[node.fields["input_id"]].shape
            chain = [pos]
            # the nodes reading the chain's values, in graph order (only those: linear in the chain)
            todo = [p for p in readers.get(node.fields["output_id"], ()) if p > pos]
            heapq.heapify(todo)
            ended = False
            while todo and not ended:
                p = heapq.heappop(todo)
                if p <= chain[-1]:
                    continue  # (a node reading two of the chain's values comes up twice)
                n = nodes[p]
                ins = [v for v in map(n.fields.get, _value_fields(n)[0]) if type(v) is int]
                out = n.fields.get("output_id")
                if n.type == "XNNConvert":
                    ended = q8(out) and self.infos[out].shape == shape
                    if ended:
                        chain.append(p)
                    break
                if (n.type not in _LOOKUP_ELEMENTWISE or not all(v in made or scalar(v) for v in ins)
                        or not f32(out) or self.infos[out].shape != shape):
                    break
                chain.append(p)
                made.add(out)
                for r in readers.get(out, ()):
                    heapq.heappush(todo, r)
            if not ended or len(chain) < 3:
                continue
            inside = set(chain)
            if any(not set(readers.get(v, ())) <= inside for v in made):
                continue
            self._lut[chain[-1]] = tuple(chain)
            self._skipped.update(chain[:-1])

    def _layout(self) -> tuple[list[tuple[tuple[int, ...], np.dtype, float | None, int] | None], int]:
        """Places every shareable buffer in one arena: two buffers whose lifetimes (first to
        last node touching them, views counted as their source) overlap never overlap in
        memory. Returns (shape, dtype, fill, arena offset or -1 for an own array) per slot
        and the arena's size."""
        buffers, pinned, first = self.buffers, self._pinned, self._first
        shared = [slot for slot, spec in enumerate(buffers) if spec is not None and slot not in pinned and slot in first]
        nbytes = [math.prod(buffers[s][0]) * buffers[s][1].itemsize for s in shared]
        starts, ends = [first[s] for s in shared], [self._last[s] for s in shared]
        place = _place_python if self.native is None else self.native.arena_place
        placed, arena = place(nbytes, starts, ends, _ALIGN)
        offsets = dict(zip(shared, placed))
        layout: list[tuple[tuple[int, ...], np.dtype, float | None, int] | None] = []
        for slot, spec in enumerate(buffers):
            if spec is None:
                layout.append(None)
            elif slot not in first and slot not in pinned:
                layout.append(None)  # never read nor written: no memory
            else:
                layout.append((spec[0], spec[1], spec[2], offsets.get(slot, -1)))
        return layout, arena


def _place_python(nbytes: list[int], first: list[int], last: list[int], align: int) -> tuple[list[int], int]:
    """Offsets in one arena for buffers of ``nbytes`` live from node position ``first[i]`` to
    ``last[i]``: buffers whose lifetimes overlap never overlap in memory. Largest first (ties:
    lower index), each at the lowest multiple of ``align`` that fits between the overlapping
    buffers placed before it. Returns (offsets, arena size). The compiled kernels'
    ``arena_place`` computes the same."""
    offsets = [0] * len(nbytes)
    spans: list[tuple[int, int]] = []  # (offset, end) in placement order
    alive: dict[int, list[int]] = {}  # node position -> the placed buffers live there
    arena = 0
    for neg, i in sorted((-b, i) for i, b in enumerate(nbytes)):
        size = (-neg + align - 1) // align * align
        f, l_ = first[i], last[i]
        # the placed buffers whose lifetimes overlap this one's (most lifetimes are a few nodes)
        near = {j for t in range(f, l_ + 1) for j in alive.get(t, ())}
        off = 0
        for o, e in sorted(spans[j] for j in near):
            if off + size <= o:
                break
            off = max(off, e)
        for t in range(f, l_ + 1):
            alive.setdefault(t, []).append(len(spans))
        spans.append((off, off + size))
        offsets[i] = off
        arena = max(arena, off + size)
    return offsets, arena


_ALIGN = 64
_F32 = np.dtype(np.float32)
_DATATYPES = _REGISTRY["datatypes"]  # (DATATYPES without the read-only proxy's lookups)
# Node types whose float32 builders end with a fused activation (Compiler.fused_output).
_EPILOGUE_NODES = frozenset({"XNNConv2d", "XNNDepthwiseConv2d", "XNNFullyConnected"})
# The builder name of a Sigmoid-then-Multiply SiLU run as one step (at the Multiply).
SILU_NODE = "orchestra.SiLU"
# The builder name of a quantized value's float island run as one table lookup (at its last
# Convert; Compiler._plan_lookup), and the node types such an island may hold: each output
# element a function of the input elements at its place (and of the node's fields).
LOOKUP_NODE = "orchestra.LookupTable"
_LOOKUP_ELEMENTWISE = frozenset({
    "XNNAbs", "XNNNegate", "XNNSquare", "XNNSquareRoot", "XNNFloor", "XNNCeiling", "XNNLog", "XNNExp", "XNNSin",
    "XNNCos", "XNNTanh", "XNNClamp", "XNNCopy", "XNNReciprocalSquareRoot", "XNNSigmoid", "XNNHardswish", "XNNGelu",
    "XNNELU", "XNNLeakyReLU", "XNNAdd", "XNNSubtract", "XNNMultiply", "XNNDiv", "XNNMinimum", "XNNMaximum",
})


def _value_fields(node: XNode) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the value-id fields ``node`` reads, those it writes): its type's from the node table,
    else (a node made by hand) its own fields ending in ``_id``."""
    known = NODE_VALUE_FIELDS.get(node.type)
    if known is not None:
        return known
    ids = [k for k in node.fields if k.endswith("_id")]
    return tuple(k for k in ids if not k.startswith("output")), tuple(k for k in ids if k.startswith("output"))


def _dt_name(d: int) -> str:
    from ._blob import DATATYPE_NAMES

    return DATATYPE_NAMES[d] if 0 <= d < len(DATATYPE_NAMES) else f"<{d}>"


# The module that, imported, has filled the registries (it imports _nodes first).
_BUILDERS_MODULE = f"{__package__}._quantized"


def compile_graph(graph: XGraph, where: str, named_data: Callable[[str], memoryview] | None,
                  input_shapes: Mapping[int, tuple[int, ...]] | None = None,
                  packed: dict[Any, np.ndarray] | None = None) -> Plan:
    """Compiles a verified graph into a :class:`Plan` (see the module docstring).

    ``input_shapes`` (external id -> dims) specialises the plan for inputs whose dims differ
    from the serialized ones (dynamic shapes); ``packed`` is a dict shared by the plans of one
    delegate so that their re-laid-out weights are made once.

    Raises:
        BackendError: an unknown node type or datatype (NotSupported), a bad reference,
            shape or constant (InvalidProgram), naming the node or value and the delegate.
    """
    if _BUILDERS_MODULE not in sys.modules:  # (an import statement per compile cost 7 % of a small graph's)
        from . import _nodes  # noqa: F401  (fills NODE_BUILDERS)
        from . import _quantized  # noqa: F401  (quantized datatypes and int8 node paths)

    return Compiler(graph, where, named_data, input_shapes, packed).compile()


def node_counts(graph: XGraph) -> Mapping[str, int]:
    counts: dict[str, int] = {}
    for n in graph.nodes:
        counts[n.type] = counts.get(n.type, 0) + 1
    return counts
