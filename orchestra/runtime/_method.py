"""One loaded instance of a program method: its arenas, its delegate handles, its steps.

At load time the execution plan is turned into a flat list of pre-bound steps: kernels are
resolved, planned tensors become numpy views into this Method's own arenas (views alias
exactly as the memory plan says), constants are read-only views into the program's bytes.
``execute`` then only copies inputs in, runs the steps and copies outputs out.
"""

from __future__ import annotations

import gc
import math
import operator
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from types import MappingProxyType
from typing import Any

import numpy as np

from ..errors import BackendError, Error, InvalidArgumentError, OperatorMissingError, OrchestraError
from ..program import (
    AllocationDetails,
    Bool,
    BoolList,
    DelegateCall,
    Double,
    DoubleList,
    EValue,
    ExecutionPlan,
    FreeCall,
    Int,
    IntList,
    JumpFalseCall,
    KernelCall,
    MoveCall,
    Null,
    OptionalTensorList,
    ProgramDef,
    ScalarType,
    String,
    Tensor,
    TensorDataLocation,
    TensorList,
    TensorShapeDynamism,
    numpy_dtype,
    tensors_with_extra_info,
)
from ._backend import BackendExecutionContext, BackendInitContext, get_backend_class
from ._optimize import Rewrite, analyse_uses, optimize_steps
from ._options import RuntimeSpecs
from .kernels import get_kernel, nearest_kernel_names

try:  # the per-value loops of CompiledPlan and Method in C (optional: see setup.py)
    from . import _plan
except ImportError:  # pragma: no cover - built without a C compiler
    _plan = None

__all__ = ["Method", "MethodMeta", "MethodStatistics", "TensorInfo", "ValueInfo"]

# The instruction budget of one execute of a method whose plan has a backward JumpFalse (a
# loop): its number of steps times this (a plan without one runs each step at most once).
LOOP_ITERATIONS = 10_000
# Seconds one execute may run, checked between instructions (None: no limit). Set per Method
# with ``Method.time_limit_s``.
DEFAULT_TIME_LIMIT_S: float | None = None


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """An input or output tensor: dtype, shape and how that shape may vary.

    ``shape`` is the static shape, or the upper bound when ``dynamism`` is
    ``DYNAMIC_BOUND`` (each dimension may be smaller at run time).
    """

    dtype: np.dtype | None
    scalar_type: ScalarType
    shape: tuple[int, ...]
    dynamism: TensorShapeDynamism

    @property
    def is_dynamic(self) -> bool:
        return self.dynamism != TensorShapeDynamism.STATIC


@dataclass(frozen=True, slots=True)
class ValueInfo:
    """A non-tensor input or output: ``kind`` is 'int', 'float', 'bool', 'str' or 'none'."""

    kind: str


@dataclass(frozen=True, slots=True)
class MethodMeta:
    """What a method takes and returns, and how much planned memory one instance needs."""

    name: str
    inputs: tuple[TensorInfo | ValueInfo, ...]
    outputs: tuple[TensorInfo | ValueInfo, ...]
    planned_buffer_sizes: tuple[int, ...]  # arena 1..n (index 0 is reserved and omitted)
    num_instructions: int
    operators: tuple[str, ...]
    backends: tuple[str, ...]

    @property
    def planned_bytes(self) -> int:
        return sum(self.planned_buffer_sizes)


@dataclass(frozen=True, slots=True)
class MethodStatistics:
    """Counters of one Method."""

    executions: int
    failures: int
    total_seconds: float
    last_seconds: float
    planned_bytes: int
    delegates: int
    reinits: int  # delegate handles rebuilt because an init-only option changed


def _value_info(plan: ExecutionPlan, i: int) -> TensorInfo | ValueInfo:
    v = plan.values[i].val
    if isinstance(v, Tensor):
        st = ScalarType(v.scalar_type)
        return TensorInfo(numpy_dtype(st), st, tuple(v.sizes), TensorShapeDynamism(v.shape_dynamism))
    kind = {Int: "int", Double: "float", Bool: "bool", String: "str"}.get(type(v), "none")
    return ValueInfo(kind)


def method_meta(program: ProgramDef, plan: ExecutionPlan) -> MethodMeta:
    return MethodMeta(
        name=plan.name,
        inputs=tuple(_value_info(plan, i) for i in plan.inputs),
        outputs=tuple(_value_info(plan, i) for i in plan.outputs),
        planned_buffer_sizes=tuple(plan.non_const_buffer_sizes[1:]),
        num_instructions=sum(len(c.instructions) for c in plan.chains),
        operators=tuple(op.qualified_name for op in plan.operators),
        backends=tuple(dict.fromkeys(d.id for d in plan.delegates)),
    )


def training_info(program: ProgramDef, name: str) -> tuple[list[str], int, int] | None:
    """For a joint (forward + backward) method ``name`` exported by ExecuTorch's training flow:
    (parameter names, index of the first gradient output, index of the first parameter
    output), read from the program's ``__et_training_{fqn,gradients_index,parameters_index}_NAME``
    methods (constant outputs); None when the program has none."""
    plans = {p.name: p for p in program.execution_plan}
    fqn = plans.get(f"__et_training_fqn_{name}")
    grad = plans.get(f"__et_training_gradients_index_{name}")
    par = plans.get(f"__et_training_parameters_index_{name}")
    if fqn is None or grad is None or par is None:
        return None

    def consts(plan: ExecutionPlan, kind: type) -> list[Any]:
        out = []
        for i in plan.outputs:
            v = plan.values[i].val
            if not isinstance(v, kind):
                raise OrchestraError(f"method {plan.name!r}: output values[{i}] is {type(v).__name__}, "
                                     f"expected a constant {kind.__name__}", Error.InvalidProgram)
            out.append(v.string_val if kind is String else v.int_val)
        return out

    names = consts(fqn, String)
    g, p = consts(grad, Int), consts(par, Int)
    if len(g) != 1 or len(p) != 1:
        raise OrchestraError(f"method {grad.name!r} / {par.name!r}: expected one index each", Error.InvalidProgram)
    return names, g[0], p[0]


_IN_ORDER = tuple(tuple(range(n)) for n in range(9))  # the dim order of a contiguous tensor of n dims


def _in_order(dim_order: Sequence[int], ndim: int) -> bool:
    """Whether ``dim_order`` (empty: the default) lays out ``ndim`` dims in their logical
    order, so a view needs no transpose."""
    if not dim_order:
        return True
    if ndim < len(_IN_ORDER) and dim_order == _IN_ORDER[ndim]:
        return True
    return tuple(dim_order) == tuple(range(ndim))


def _strided_view(flat: np.ndarray, sizes: Sequence[int], dim_order: Sequence[int]) -> np.ndarray:
    """A view of ``flat`` laid out in ``dim_order`` (outermost first) with logical ``sizes``."""
    if _in_order(dim_order, len(sizes)):
        return flat.reshape(sizes)
    physical = flat.reshape([sizes[d] for d in dim_order])
    return physical.transpose(np.argsort(dim_order))


# ExecuTorch scalar type (a plain int, as the reader gives it) -> numpy dtype
_NUMPY_DTYPES: Mapping[int, np.dtype] = MappingProxyType(
    {int(k): d for k in ScalarType if (d := numpy_dtype(k)) is not None})
# The same by position (None: unsupported), for _plan.values
_DTYPE_TABLE: tuple[np.dtype | None, ...] = tuple(_NUMPY_DTYPES.get(k) for k in range(max(_NUMPY_DTYPES) + 1))


class _Slot:
    """Where a planned tensor lives (shared by every Method of a program; the arena is not)."""

    __slots__ = ("memory_id", "offset", "dtype", "bound", "dim_order", "dynamic", "capacity", "contiguous")

    def __init__(self, memory_id: int, offset: int, dtype: np.dtype, bound: tuple[int, ...],
                 dim_order: tuple[int, ...], dynamic: bool) -> None:
        self.memory_id = memory_id
        self.offset = offset
        self.dtype = dtype
        self.bound = bound
        self.dim_order = dim_order
        self.dynamic = dynamic
        self.capacity = math.prod(bound)  # elements planned
        self.contiguous = _in_order(dim_order, len(bound))

    def bound_view(self, arenas: list[np.ndarray]) -> np.ndarray:
        """``view(arenas, self.bound)``: made with one numpy call where the layout is
        contiguous (a Method makes one per planned tensor when it is created)."""
        if self.contiguous:
            return np.ndarray(self.bound, self.dtype, arenas[self.memory_id], self.offset)
        return self.view(arenas, self.bound)

    def view(self, arenas: list[np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
        n = 1
        for s in shape:
            n *= s
        flat = arenas[self.memory_id][self.offset : self.offset + n * self.dtype.itemsize].view(self.dtype)
        return _strided_view(flat, shape, self.dim_order)


if _plan is not None:
    _plan.setup((EValue, Tensor, AllocationDetails, Null, Int, Bool, Double, String, IntList, DoubleList, BoolList,
                 TensorList, OptionalTensorList), _Slot, np.ndarray)


def _mutable_data(program: ProgramDef, t: Tensor, nbytes: int) -> memoryview:
    """The initial value of a planned mutable tensor (the reader checked it is in bounds)."""
    mi = t.extra_tensor_info.mutable_data_segments_idx if t.extra_tensor_info is not None else 0
    ms = program.mutable_data_segments[mi]
    start = ms.offsets[t.data_buffer_idx]
    return program.segments[ms.segment_index].data[start : start + nbytes]


_STATE_ALIGNMENT = 16


class StateLayout:
    """Where the program's unplanned named mutable buffers live in a Method's state arena.

    A program exported with ``alloc_mutable_buffers=False`` (and ``emit_mutable_buffer_names``)
    leaves its mutable buffers without planned memory; ExecuTorch expects the application to
    provide it. orchestra gives every Method (or every :class:`ProgramInstance`, shared by its
    methods) one zero-filled arena holding each such buffer, by name, at the offset laid out
    here for the whole program, so the same name is the same bytes in every method.
    """

    __slots__ = ("offsets", "specs", "size")

    def __init__(self, specs: Mapping[str, tuple[np.dtype, tuple[int, ...]]]) -> None:
        self.specs = dict(specs)
        self.offsets: dict[str, int] = {}
        off = 0
        for name, (dtype, sizes) in self.specs.items():
            self.offsets[name] = off
            n = math.prod(sizes) * dtype.itemsize
            off += -(-n // _STATE_ALIGNMENT) * _STATE_ALIGNMENT
        self.size = off

    @staticmethod
    def name_of(plan: ExecutionPlan, i: int) -> str | None:
        """The buffer name of value ``i`` when it is an unplanned named mutable buffer."""
        t = plan.values[i].val
        if not isinstance(t, Tensor) or t.is_constant or t.allocation_info is not None or t.data_buffer_idx > 0:
            return None
        e = t.extra_tensor_info
        if e is None or not e.fully_qualified_name or e.location == TensorDataLocation.EXTERNAL or i in plan.inputs:
            return None
        return e.fully_qualified_name

    @classmethod
    def of(cls, program: ProgramDef, where: str) -> StateLayout:
        specs: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
        for plan in program.execution_plan:
            for i in tensors_with_extra_info(plan):  # (name_of says None for every other value)
                name = cls.name_of(plan, i)
                if name is None:
                    continue
                t = plan.values[i].val
                dtype = numpy_dtype(t.scalar_type)
                if dtype is None:
                    continue  # reported, with its value index, when the method is compiled
                spec = (dtype, tuple(t.sizes))
                if specs.setdefault(name, spec) != spec:
                    have = specs[name]
                    raise OrchestraError(
                        f"{where}: method {plan.name!r} values[{i}]: mutable buffer {name!r} is {spec[0]} "
                        f"{list(spec[1])} but another method has it as {have[0]} {list(have[1])}", Error.InvalidProgram)
        return cls(specs)


Step = Callable[[list[Any], "Method"], "int | None"]


def _at(where: str | tuple[int, int]) -> str:
    """``where`` in an error message: a (chain, index) pair as ``chains[c].instructions[i]``
    (made only when an error needs it: a load checks every instruction)."""
    return where if isinstance(where, str) else f"chains[{where[0]}].instructions[{where[1]}]"


def _named_data_lookup(program: ProgramDef) -> Callable[[str], memoryview]:
    """``program.named_data_bytes`` through an index made once (a delegate asks for hundreds of
    keys: each a scan of the whole table before)."""
    index: dict[str, int] = {}
    for i, nd in enumerate(program.named_data):
        index.setdefault(nd.key, i)  # the first of equal keys, as named_data_bytes

    def lookup(key: str) -> memoryview:
        i = index.get(key)
        if i is None:
            return program.named_data_bytes(key)  # raises NotFoundError naming the keys there are
        return program.segments[program.named_data[i].segment_index].data

    return lookup


class _gc_paused:  # noqa: N801 - used as a function: ``with _gc_paused():``
    """Python's cyclic garbage collector off while a program is decoded, a plan compiled or a
    delegate initialised (an XNNPACK blob compiled): each allocates thousands of small objects
    (values, sets, steps) and none of them in reference cycles the collector would need to
    find, yet the allocations trigger full collections of the whole process's heap (measured:
    80 ms of a 100 ms load_method in a process that had imported torch). Turned back on
    after, if it was on. (A class, not a generator context manager: a load enters it once
    per delegate question, 160 times for ViT's XNNPACK file.)"""

    __slots__ = ("_was",)

    def __enter__(self) -> None:
        self._was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self._was:
            gc.enable()


class _InstructionSteps(Sequence[Step]):
    """``CompiledPlan.instruction_steps``: the step of each instruction as written, a kernel
    call's made when first asked for (once: every caller gets the same step)."""

    __slots__ = ("_built", "_where", "_binds", "_kernel_step")

    def __init__(self, built: dict[int, Step], where: Sequence[tuple[int, int]],
                 binds: Sequence[tuple[str, Any, tuple[int, ...], tuple[int, ...]] | None],
                 kernel_step: weakref.WeakMethod) -> None:
        self._built = built
        self._where = where
        self._binds = binds
        self._kernel_step = kernel_step  # CompiledPlan._kernel_step (weak: the plan holds this)

    def __len__(self) -> int:
        return len(self._binds)

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        n = len(self._binds)
        if not -n <= k < n:
            raise IndexError(f"instruction {k} out of range ({n} instructions)")
        k %= n
        step = self._built.get(k)
        if step is None:
            ci, ii = self._where[k]
            name, kd, params, rets = self._binds[k]  # type: ignore[misc]
            make = self._kernel_step()
            if make is None:
                raise ReferenceError("the compiled plan of these steps is gone")
            where = f"chains[{ci}].instructions[{ii}]"
            step = self._built.setdefault(k, make(kd.fn, params, rets, f"{where} ({name})", f"step[{k}] {name}"))
        return step

    def __iter__(self) -> Iterator[Step]:
        return (self[k] for k in range(len(self._binds)))


class _ListBuilders(dict):
    """CompiledPlan.list_builders: list value -> what builds it (``_list_builder``), each
    made when first asked for. Most list values (a convolution's stride, padding...) are
    built once, directly, when a Method is created and never again: a builder each (a
    closure and its cells, kept for the plan's life) was a fifth of the objects a load left
    for the collector (MobileNetV3: 1,100 of 4,800)."""

    __slots__ = ("_lists",)

    def __init__(self, lists: Mapping[int, tuple[bool, tuple[int, ...]]]) -> None:
        super().__init__()
        self._lists = lists

    def __missing__(self, i: int) -> Callable[[list[Any]], list[Any]]:
        optional, items = self._lists[i]
        b = self[i] = _list_builder(optional, items)
        return b


def _list_builder(optional: bool, items: tuple[int, ...]) -> Callable[[list[Any]], list[Any]]:
    """What builds a list value (IntList, TensorList, OptionalTensorList) from a Method's
    values: a new list each call, ``None`` for an optional list's absent (-1) items."""
    if optional and -1 in items:
        return lambda vals: [None if it == -1 else vals[it] for it in items]
    if not items:
        return lambda vals: []
    if len(items) == 1:
        j = items[0]
        return lambda vals: [vals[j]]
    get = operator.itemgetter(*items)
    return lambda vals: list(get(vals))


class CompiledPlan:
    """A method turned into pre-bound steps, once per Program, shared by its Methods.

    Holds only immutable things: constants (read-only views into the program's bytes),
    where each planned tensor lives, list definitions, and the steps. Each step is a
    function ``step(vals, method)`` over one Method's value list.

    With ``optimize`` (the default) some steps are rewritten when a use analysis shows the
    change can't be observed (straight-line plans only; see ``orchestra/runtime/_optimize.py``):
    a max-pool whose indices nothing reads computes only the values (bit-identical; the
    indices tensor is then left as it was, its contents unspecified), and an inference batch
    norm that alone reads a convolution's output is folded into the convolution's constant
    weight and bias (computed here, once, as new read-only arrays shared by every Method;
    results change by float rounding only; an activation that alone reads it then runs in
    the same step), and a matmul (``mm``, ``bmm``, ``addmm``) whose
    operand is made by permute / view / clone copies nothing else reads takes a strided
    numpy view of their source instead (the copies don't run; a view of a constant is made
    here, a view of a planned tensor once per Method, in ``derived``; results may differ by
    float rounding where BLAS takes another path for a strided operand), and a chain of
    elementwise instructions over one tensor, each intermediate read only by the next, runs
    as one step in place in the last one's output (bit-identical, except sigmoid then mul
    by its input, computed as silu; an exported hardswish, add 3 / clamp 0..6 / mul by the
    input / div 6, runs as one hardswish pass, the same operations in the same order). ``steps`` is what
    runs, ``step_spans`` the instructions each step covers, ``rewrites`` what was changed,
    ``instruction_steps`` one step per instruction as written.
    """

    def __init__(self, program: ProgramDef, plan: ExecutionPlan, where: str, *, optimize: bool = True,
                 state_layout: StateLayout | None = None) -> None:
        self.program = program
        self.plan = plan
        self.where = where
        self.meta = method_meta(program, plan)
        # Named mutable buffers the program leaves unplanned (exported with
        # alloc_mutable_buffers=False): they live in one extra arena, laid out program-wide so
        # the methods of a ProgramInstance can share it.
        self.state_layout = state_layout if state_layout is not None else StateLayout.of(program, where)
        self.state_arena = len(plan.non_const_buffer_sizes) if self.state_layout.size else 0
        self.arena_sizes = tuple(plan.non_const_buffer_sizes[1:]) + ((self.state_layout.size,) if self.state_arena else ())
        # Planned tensors with an initial value (a mutable buffer or a training parameter):
        # (memory id, offset, bytes) copied into a Method's arena when it is created.
        self.initial: list[tuple[int, int, memoryview]] = []
        # BackendInitContext.program_cache: one dict per delegate, shared by every Method.
        self.delegate_caches: tuple[dict[str, Any], ...] = tuple({} for _ in plan.delegates)
        self.named_data = _named_data_lookup(program) if plan.delegates else program.named_data_bytes
        nv = len(plan.values)
        # The constants of a constant segment are views of it (the legacy constant_buffer's,
        # through _tensor_value).
        cs = None if program.constant_buffer else program.constant_segment
        seg = program.segments[cs.segment_index].data if cs is not None else None
        offs = cs.offsets if cs is not None else ()
        if _plan is not None and type(plan.values) is tuple and type(offs) is tuple:
            # The common values in C (the same objects); those it does not vouch for, and
            # so every error, through the Python loop, in order.
            u8 = np.frombuffer(seg, np.uint8) if seg is not None and len(seg) else None
            template, slots, lists, runtime, todo = _plan.values(plan.values, _DTYPE_TABLE, u8, offs,
                                                                 int(TensorShapeDynamism.STATIC))
            if todo:
                self._values(todo, template, slots, lists, runtime, seg, offs)
                runtime.sort()
                if not lists.keys().isdisjoint(todo):
                    lists = dict(sorted(lists.items()))  # in value order, as the Python loop makes it
        else:
            template, slots, lists, runtime = [None] * nv, [None] * nv, {}, []
            self._values(range(nv), template, slots, lists, runtime, seg, offs)
        self.template = template
        self.slots = slots
        # Tensors neither constant nor planned: an input without planned memory, or a view
        # some instruction makes (their memory is known only at run time).
        self.runtime_tensors = tuple(runtime)
        # How a Method views them: (value, shape, dtype, memory id, offset) of those laid out
        # in order (one numpy call each), and the others (a transposed view)
        got = _plan.planned(slots) if _plan is not None else None
        if got is not None:
            self.planned, self.planned_views, self.planned_strided = got
        else:
            self.planned = tuple(i for i, s in enumerate(slots) if s is not None)
            self.planned_views = tuple((i, s.bound, s.dtype, s.memory_id, s.offset)
                                       for i in self.planned if (s := slots[i]).contiguous)  # type: ignore[union-attr]
            self.planned_strided = tuple(i for i in self.planned if not slots[i].contiguous)  # type: ignore[union-attr]
        self.lists = lists
        # per list value, what builds its Python list from a Method's values (C-level item
        # gets: a Method's creation builds every list, some steps rebuild theirs per call)
        self.list_builders: dict[int, Callable[[list[Any]], list[Any]]] = _ListBuilders(lists)
        self.input_idx = tuple(plan.inputs)
        self.output_idx = tuple(plan.outputs)
        self.input_slots = tuple(slots[i] for i in plan.inputs)
        self.input_infos = self.meta.inputs
        instructions: list[Any] = []
        where_of: list[tuple[int, int]] = []
        rets: list[tuple[int, ...] | None] = []
        binds: list[tuple[str, Any, tuple[int, ...], tuple[int, ...]] | None] = []  # _bind_kernel's, reused by instruction_steps
        jumps: list[int] = []
        # (operator index -> its name, kernel and parameter count, once _bind_kernel took a
        # call of it: a call passing more arguments than that is then bound here the same way)
        kernels: dict[int, tuple[str, Any, int]] = {}
        for ci, chain in enumerate(plan.chains):
            for ii, ins in enumerate(chain.instructions):
                a = ins.instr_args
                if isinstance(a, KernelCall):
                    k, args = kernels.get(a.op_index), a.args
                    if k is not None and len(args) > k[2]:
                        n = k[2]
                        b = (k[0], k[1], tuple(args[:n]), tuple(args[n:]))
                    else:
                        b = self._bind_kernel(a, (ci, ii))
                        kernels[a.op_index] = (b[0], b[1], b[1].num_params)
                    rets.append(b[3])
                else:
                    b = None
                    rets.append(None)
                    if isinstance(a, JumpFalseCall):
                        jumps.append(len(instructions))
                instructions.append(a)
                where_of.append((ci, ii))
                binds.append(b)
        # Per delegate: the DelegateCall argument positions its backend writes (the rest it
        # only reads), when the backend says (BackendInterface.delegate_outputs); None: any.
        self.delegate_outputs = tuple(self._delegate_outputs(di) for di in range(len(plan.delegates)))
        self._in_place: dict[int, frozenset[tuple[int, int]]] = {}  # delegate_in_place's answers
        uses = analyse_uses(self, instructions, rets)
        # List values (IntList: stride, padding...; TensorList) whose members no instruction
        # writes hold the same objects for a Method's whole life: built once when the Method
        # is created, never rebuilt before a kernel call (delegates still get fresh lists).
        written = uses.written
        if not uses.straight:
            self.static_lists: frozenset[int] = frozenset()
        elif -1 in written:  # (not from a program the reader took: then items' -1s are not values)
            self.static_lists = frozenset(i for i, (_, items) in lists.items()
                                          if i not in written and not any(j in written for j in items if j >= 0))
        else:
            self.static_lists = frozenset(i for i, (_, items) in lists.items()
                                          if i not in written and written.isdisjoint(items))
        # One step per instruction, as the program is written (executors that replace the
        # steps of single instructions start from these; see step_spans). A kernel call's is
        # checked here and made when first asked for: most are replaced by rewritten steps.
        built: dict[int, Step] = {}
        for pc, b in enumerate(binds):
            if b is None:
                ci, ii = where_of[pc]
                built[pc] = self._step(ci, ii, instructions[pc], pc)
            elif b[1].dtypes is not None:
                self._check_dtypes(b[1], b[2], where_of[pc])
        plain = self.instruction_steps = _InstructionSteps(built, where_of, binds, weakref.WeakMethod(self._kernel_step))
        derived: list[tuple[int, Any]] = []
        if optimize:
            steps, spans, rewrites, derived = optimize_steps(self, instructions, where_of, rets, plain, self._kernel_step, uses)
        else:
            steps, spans, rewrites = list(plain), [(pc,) for pc in range(len(plain))], []
        # Values beyond the plan's that rewritten steps read: constants, and views of planned
        # tensors of static shape made when a Method is created (see optimize_steps).
        self.template.extend(x if src < 0 else None for src, x in derived)
        self.derived: tuple[tuple[int, int, Callable[[np.ndarray], np.ndarray]], ...] = tuple(
            (nv + j, src, fn) for j, (src, fn) in enumerate(derived) if src >= 0)
        # What execute runs: instruction_steps with the rewrites of ._optimize applied.
        self.steps = tuple(steps)
        # The instructions (numbered across chains) that each step runs, in order; a fused
        # step runs in its last instruction's place (the others may be further back: the
        # rewrite checks that running them there, as written, would give the same results).
        self.step_spans = tuple(spans)
        self.rewrites: tuple[Rewrite, ...] = tuple(rewrites)
        # A backward JumpFalse makes a loop: such a plan gets an instruction budget per execute.
        self.loops = any(instructions[pc].destination_instruction <= pc for pc in jumps)
        self.instruction_budget = max(len(self.steps), 1) * LOOP_ITERATIONS if self.loops else len(self.steps)
        # (of the analysis, only what borrowable asks: the steps are built)
        self._uses = uses.firsts()
        self._borrowable: tuple[bool, ...] | None = None

    def _ask_backend(self, di: int, question: str) -> Any:
        """Backend ``question`` (``delegate_outputs`` / ``delegate_in_place``) about delegate
        ``di``; None where there is no answer: a backend missing or unavailable here, or one
        that failed to answer (creating a Method reports those; this is for rewrites only)."""
        d = self.plan.delegates[di]
        try:
            backend = get_backend_class(d.id)
            if not backend.is_available():
                return None
            ctx = BackendInitContext(self.plan.name, di, d.id, self.named_data,
                                     RuntimeSpecs(d.id, tuple(backend.option_specs)), self.delegate_caches[di])
            with _gc_paused():
                return getattr(backend, question)(ctx, self.program.delegate_data(d.processed), d.compile_specs)
        except Exception:  # noqa: BLE001 - an optimisation only: the Method's init reports a bad blob
            return None

    def _delegate_outputs(self, di: int) -> frozenset[int] | None:
        """BackendInterface.delegate_outputs of delegate ``di``, checked (None: unknown)."""
        outs = self._ask_backend(di, "delegate_outputs")
        try:
            outs = None if outs is None else frozenset(outs)
        except TypeError:
            return None
        return outs if outs is not None and all(type(k) is int and k >= 0 for k in outs) else None

    def delegate_in_place(self, di: int) -> frozenset[tuple[int, int]]:
        """BackendInterface.delegate_in_place of delegate ``di`` (asked once, when a rewrite
        needs it; empty when unknown)."""
        known = self._in_place.get(di)
        if known is None:
            got = self._ask_backend(di, "delegate_in_place")
            try:
                known = frozenset((int(a), int(b)) for a, b in got) if got else frozenset()
            except (TypeError, ValueError):
                known = frozenset()
            self._in_place[di] = known
        return known

    @property
    def borrowable(self) -> tuple[bool, ...]:
        """Per input: whether ``execute(borrow_inputs=True)`` may read the caller's array in
        place of a copy in the input's planned memory: a static, contiguous planned tensor that
        no instruction writes, that no list value or derived view holds (those are made when a
        Method is created), and whose bytes no value reads as they were at the start (the
        plan's aliases: a value no instruction writes, read as the bytes another value left
        there, such as a flatten of a pooling's result). Worked out on first use."""
        found = self._borrowable
        if found is None:
            found = self._borrowable = tuple(self._borrowable_input(i, sl)
                                             for i, sl in zip(self.input_idx, self.input_slots))
        return found

    def _borrowable_input(self, i: int, sl: _Slot | None) -> bool:
        uses = self._uses
        if (sl is None or not sl.contiguous or sl.dynamic or not uses.straight or i in uses.first_write
                or any(i in items for _, items in self.lists.values()) or any(src == i for _, src, _ in self.derived)):
            return False

        def span(o: _Slot) -> tuple[int, int]:
            return o.offset, o.offset + o.capacity * o.dtype.itemsize

        lo, hi = span(sl)
        inputs = set(self.input_idx)
        near = [(j, *span(o)) for j in self.planned
                if j not in inputs and (o := self.slots[j]) is not None and o.memory_id == sl.memory_id]
        for j, a, b in near:
            if not (a < hi and lo < b):
                continue
            first_read = uses.first_mention.get(j)
            if first_read is None:
                continue
            first_write = uses.first_write.get(j)
            # (a define is a write: the first write defines j when it is j's first define)
            if first_write is not None and (first_write < first_read or (
                    first_write == first_read and uses.first_define.get(j) == first_read)):
                continue  # written before it is read: its own bytes
            # read as it lies: an alias of what another value wrote over all of its bytes
            # before; with nothing written there, of the input's bytes (its copy at the start)
            if not any(va <= a and b <= vb and uses.first_write.get(v, first_read) < first_read
                       for v, va, vb in near if v != j):
                return False
        return True

    def describe_step(self, k: int) -> str:
        """``instruction 3 (aten::mm.out)`` or, for a fused step,
        ``instructions 0-2 (aten::convolution.out + ...)`` (``instructions 5, 8, 9 (...)``
        when they are not adjacent): for error messages."""
        span = self.step_spans[k]
        name = getattr(self.steps[k], "__qualname__", f"step[{k}]").split(" ", 1)[-1]
        if len(span) == 1:
            return f"instruction {span[0]} ({name})"
        if span[-1] - span[0] == len(span) - 1:
            return f"instructions {span[0]}-{span[-1]} ({name})"
        return f"instructions {', '.join(map(str, span))} ({name})"

    def _values(self, indices: Iterable[int], template: list[Any], slots: list[_Slot | None],
                lists: dict[int, tuple[bool, tuple[int, ...]]], runtime: list[int], seg: memoryview | None,
                offs: Sequence[int]) -> None:
        """The Python loop over the plan's values ``indices`` (in increasing order): fills
        ``template`` (literals, constants), ``slots`` (planned tensors), ``lists`` and
        ``runtime`` (tensors known only at run time), raising at the first bad value. The
        reference for ``_plan.values``, which leaves it the values it does not vouch for."""
        values, nv = self.plan.values, len(self.plan.values)
        # The common tensors inline (the constants of a constant segment, planned tensors
        # without an initial value): a model's values number in the thousands. The others,
        # and every error, through _tensor_value.
        frombuffer, prod, dtypes = np.frombuffer, math.prod, _NUMPY_DTYPES
        static = TensorShapeDynamism.STATIC
        for i in indices:
            v = values[i].val
            if isinstance(v, Tensor):
                sizes, order = v.sizes, v.dim_order
                tuples = type(sizes) is tuple and type(order) is tuple  # (as the reader makes them)
                dtype = dtypes.get(v.scalar_type) if v.extra_tensor_info is None and tuples else None
                a = v.allocation_info
                idx = v.data_buffer_idx
                if dtype is not None and a is None and idx > 0 and seg is not None:
                    # (the reader checked the constant's bytes lie within its part of the segment)
                    template[i] = _strided_view(frombuffer(seg, dtype, prod(sizes), offs[idx]), sizes, order)
                elif dtype is not None and a is not None and idx <= 0:
                    slots[i] = _Slot(a.memory_id, a.offset, dtype, sizes, order, v.shape_dynamism != static)
                else:
                    t, s = template[i], slots[i] = self._tensor_value(i, v)
                    if t is None and s is None:
                        runtime.append(i)
            elif isinstance(v, Int):
                template[i] = v.int_val
            elif isinstance(v, Bool):
                template[i] = v.bool_val
            elif isinstance(v, Double):
                template[i] = v.double_val
            elif isinstance(v, String):
                template[i] = v.string_val
            elif isinstance(v, (IntList, TensorList, OptionalTensorList)):
                optional = isinstance(v, OptionalTensorList)
                items = v.items
                if items and (min(items) < -optional or max(items) >= nv):  # then find the bad one
                    for j, it in enumerate(items):
                        if not (optional and it == -1) and not 0 <= it < nv:
                            raise OrchestraError(f"{self.where}: values[{i}].items[{j}]: value index {it} out of range",
                                                 Error.InvalidProgram)
                lists[i] = (optional, tuple(items))
            elif isinstance(v, (DoubleList, BoolList)):
                template[i] = list(v.items)

    def _tensor_value(self, i: int, t: Tensor) -> tuple[Any, _Slot | None]:
        dtype = numpy_dtype(t.scalar_type)
        if dtype is None:
            raise OrchestraError(f"{self.where}: values[{i}]: scalar type {ScalarType(t.scalar_type).name} is not "
                                 "supported by orchestra's runtime", Error.NotSupported)
        sizes = tuple(t.sizes)
        e = t.extra_tensor_info
        if e is not None and e.location == TensorDataLocation.EXTERNAL:
            raise OrchestraError(f"{self.where}: values[{i}]: tensor data stored outside the program "
                                 f"({e.fully_qualified_name!r}) is not supported yet", Error.NotSupported)
        a = t.allocation_info
        if a is None and t.data_buffer_idx > 0:  # a constant (Tensor.is_constant)
            flat = np.frombuffer(self.program.constant_data(t.data_buffer_idx), dtype=dtype, count=math.prod(sizes))
            return _strided_view(flat, sizes, t.dim_order), None
        if a is not None:
            if t.data_buffer_idx > 0:
                # Like ExecuTorch: the initial value is copied into planned memory at load.
                n = math.prod(sizes) * dtype.itemsize
                self.initial.append((a.memory_id, a.offset, _mutable_data(self.program, t, n)))
            return None, _Slot(a.memory_id, a.offset, dtype, sizes, tuple(t.dim_order),
                               t.shape_dynamism != TensorShapeDynamism.STATIC)
        fqn = self.state_layout.name_of(self.plan, i)
        if fqn is not None:
            return None, _Slot(self.state_arena, self.state_layout.offsets[fqn], dtype, sizes, tuple(t.dim_order),
                               t.shape_dynamism != TensorShapeDynamism.STATIC)
        return None, None  # filled at run time (an input without planned memory, or a view)

    def _bind_kernel(self, a: KernelCall, where: str | tuple[int, int]) -> tuple[str, Any, tuple[int, ...], tuple[int, ...]]:
        """(operator name, kernel, parameter values, result values) of a KernelCall;
        ``where`` names it in errors (``(chain, index)``: ``chains[c].instructions[i]``)."""
        name = self.meta.operators[a.op_index]
        kd = get_kernel(name)
        if kd is None:
            near = nearest_kernel_names(name)
            hint = f" (nearest registered: {', '.join(near)})" if near else ""
            raise OperatorMissingError(f"{self.where}: {_at(where)}: operator {name} has no kernel{hint}")
        n = kd.num_params
        if len(a.args) < n:
            raise OrchestraError(f"{self.where}: {_at(where)}: {name} takes {n} arguments, the program passes {len(a.args)}",
                                 Error.InvalidProgram)
        params, rets = tuple(a.args[:n]), tuple(a.args[n:])
        if not rets:
            # Schemas returning () (split_with_sizes_copy.out, et_copy_index) still
            # produce their result in an argument: send what the kernel returns there.
            names = list(kd.param_names)
            target = "copy_to" if name == "executorch_prim::et_copy_index.tensor" else "out"
            if target in names:
                rets = (params[names.index(target)],)
        return name, kd, params, rets

    def _kernel_step(self, fn: Callable[..., Any], params: tuple[int, ...], rets: tuple[int, ...], what: str, label: str) -> Step:
        """A step calling ``fn(*vals[params])`` and storing its result(s) into ``rets``."""
        n = len(params)
        lists: tuple[int, ...] = ()
        if self.lists and not self.lists.keys().isdisjoint(params):
            static = getattr(self, "static_lists", frozenset())
            lists = tuple(i for i in params if i in self.lists and i not in static)
        # The common steps bind what they read as default arguments rather than capturing it:
        # a closure makes one cell per captured name (and a getter closure of its own), kept
        # for the plan's life and walked by the collector's pass after every load; defaults
        # are one tuple, read as fast locals (executes do not slow down).
        getter = self._getter(params) if n != 1 or len(rets) != 1 or lists else None
        if getter is None:  # one operand, one result: the most common kernel call
            def step(vals: list[Any], m: Method, fn: Callable[..., Any] = fn, p0: int = params[0], r0: int = rets[0],
                     what: str = what) -> None:
                res = fn(vals[p0])
                if res is not vals[r0] and res is not None:
                    m._write(r0, res, what)
        elif len(rets) == 1 and not lists:
            def step(vals: list[Any], m: Method, fn: Callable[..., Any] = fn, getter: Callable[..., Any] = getter,
                     r0: int = rets[0], what: str = what) -> None:
                res = fn(*getter(vals))
                if res is not vals[r0] and res is not None:
                    m._write(r0, res, what)
        else:

            def step(vals: list[Any], m: Method, fn: Callable[..., Any] = fn, getter: Callable[..., Any] = getter,
                     lists: tuple[int, ...] = lists, rets: tuple[int, ...] = rets, what: str = what) -> None:
                if lists:
                    m._refresh_lists(lists)
                res = fn(*getter(vals))
                if res is None or not rets:
                    return
                if len(rets) == 1:
                    if res is not vals[rets[0]]:
                        m._write(rets[0], res, what)
                    return
                if len(res) != len(rets):
                    raise OrchestraError(f"{m._where}: {what}: kernel returned {len(res)} results for {len(rets)} returns", Error.Internal)
                for r, x in zip(rets, res):
                    m._write(r, x, what)

        step.__qualname__ = label
        return step

    @staticmethod
    def _getter(params: tuple[int, ...]) -> Callable[[list[Any]], tuple]:
        """``vals -> tuple(vals[i] for i in params)``, as cheaply as it runs."""
        if len(params) > 1:
            return operator.itemgetter(*params)
        if not params:
            return lambda vals: ()
        p0 = params[0]
        return lambda vals: (vals[p0],)

    def _step(self, ci: int, ii: int, a: Any, pc: int) -> Step:
        """The step of instruction ``a``, other than a kernel call, as written (a kernel
        call's: ``_InstructionSteps``)."""
        plan = self.plan
        where = f"chains[{ci}].instructions[{ii}]"
        if isinstance(a, DelegateCall):
            di = a.delegate_index
            return self.delegate_step(di, tuple(a.args), f"{where} (delegate {di}, {plan.delegates[di].id})",
                                      f"step[{pc}] delegate {plan.delegates[di].id}")
        if isinstance(a, MoveCall):
            src, dst = a.move_from, a.move_to

            def step(vals: list[Any], m: Method) -> None:
                m._write(dst, vals[src], f"{where} (move)")

            return step
        if isinstance(a, JumpFalseCall):
            cond, dest = a.cond_value_index, a.destination_instruction

            def step(vals: list[Any], m: Method) -> int | None:
                c = vals[cond]
                if isinstance(c, np.ndarray):
                    c = bool(c.reshape(-1)[0]) if c.size else False
                return None if c else dest

            return step
        if isinstance(a, FreeCall):
            def step(vals: list[Any], m: Method) -> None:
                return None

            return step
        raise OrchestraError(f"{self.where}: {where}: unknown instruction {type(a).__name__}", Error.InvalidProgram)

    def delegate_step(self, di: int, args_idx: tuple[int, ...], what: str, label: str,
                      views: Mapping[int, tuple[int, Callable[[np.ndarray], np.ndarray]]] | None = None) -> Step:
        """The step calling delegate ``di`` with the values ``args_idx``; argument ``k`` in
        ``views`` is made at each call as ``f(values[source])`` for ``views[k] == (source,
        f)`` (a view of a copy's source the delegate only reads, see ``optimize_steps``).
        Arguments the backend replaced (an output of a new shape) are written back."""
        lists = tuple(i for i in args_idx if i in self.lists)
        fns = tuple((k, src, f) for k, (src, f) in (views or {}).items())

        # defaults, not closure cells (as _kernel_step's): one tuple for the collector to walk
        def step(vals: list[Any], m: Method, lists: tuple[int, ...] = lists, args_idx: tuple[int, ...] = args_idx,
                 fns: tuple[tuple[int, int, Callable[..., Any]], ...] = fns, di: int = di, what: str = what) -> None:
            if lists:
                m._refresh_lists(lists)
            args = [vals[i] for i in args_idx]
            for k, src, f in fns:
                args[k] = f(vals[src])
            before = list(args)
            backend, handle = m._handles[di]
            backend.execute(m._ctx[di], handle, args)
            for i, x, b in zip(args_idx, args, before):
                if x is not b:
                    m._write(i, x, what)

        step.__qualname__ = label
        return step

    def _check_dtypes(self, kd: Any, params: tuple[int, ...], where: str | tuple[int, int]) -> None:
        if kd.dtypes is None:
            return
        for i in params:
            v, slot = self.template[i], self.slots[i]
            if isinstance(v, np.ndarray) or slot is not None:
                dtype = v.dtype if isinstance(v, np.ndarray) else slot.dtype
                if dtype in kd.numpy_dtypes:
                    return
                dt = dtype.name  # numpy computes a dtype's name in Python: only when needed
                if dt not in kd.dtypes and dt != "bool":
                    raise OperatorMissingError(
                        f"{self.where}: {_at(where)}: operator {kd.name} has no kernel for dtype {dt} "
                        f"(supported: {', '.join(sorted(kd.dtypes))})")
                return


class _OptionState:
    """The option values of one Method: an immutable snapshot per backend id, plus a cell
    that may hold delegate handles prepared for this state ahead of time (claimed with an
    atomic ``list.pop`` by whichever thread gets there first)."""

    __slots__ = ("specs", "cell")

    def __init__(self, specs: Mapping[str, RuntimeSpecs]) -> None:
        self.specs = specs
        self.cell: list[dict[int, Any]] = []


class Method:
    """One independent instance of a program method.

    Create with ``Program.load_method(name)``. A Method owns its planned arenas and its
    delegate handles; one thread uses it at a time (a second concurrent ``execute`` raises);
    different Methods run in parallel. Use as a context manager or call :meth:`close`.

    Bounds on one execute (attributes, settable per Method): ``instruction_cap``, the
    instructions it may run (a plan without a backward JumpFalse runs each step at most
    once; one with a loop gets ``LOOP_ITERATIONS`` (10,000) x its steps), and
    ``time_limit_s``, seconds checked between instructions (default None: no limit). Past
    either, execute raises an OrchestraError naming the method and the bound.
    """

    __slots__ = ("_cp", "_program", "_name", "_where", "_meta", "_executions", "_failures", "_total",
                 "_last", "_busy", "_closed", "_handles", "_arenas", "_vals", "_borrowed", "_slots", "_lists",
                 "_backends", "_target", "_active", "_ctx", "_reinits", "_view", "instruction_cap", "time_limit_s",
                 "__weakref__")

    def __init__(self, compiled: CompiledPlan, backend_options: Mapping[str, Mapping[str, Any]] | None = None, *,
                 shared_arenas: Mapping[int, np.ndarray] | None = None, busy: list[bool] | None = None) -> None:
        # shared_arenas (memory id -> arena) and busy (a one-element flag) are given by a
        # ProgramInstance: its methods share those arenas (their mutable state) and one
        # execute-at-a-time flag. A shared arena's initial values are the instance's to load.
        self._cp = compiled
        self._program = compiled.program
        self._name = compiled.plan.name
        self._where = compiled.where
        self._meta = compiled.meta
        self._slots = compiled.slots
        self._lists = compiled.lists
        self._executions = 0
        self._failures = 0
        self._total = 0.0
        self._last = 0.0
        self._busy = busy if busy is not None else [False]
        self._closed = False
        self._handles: list[tuple[Any, Any]] = []  # (backend, handle) per delegate
        self.instruction_cap = compiled.instruction_budget
        self.time_limit_s = DEFAULT_TIME_LIMIT_S
        shared = shared_arenas or {}
        self._arenas = [np.zeros(0, np.uint8)] + [
            shared[m] if m in shared else np.zeros(s, np.uint8) for m, s in enumerate(compiled.arena_sizes, 1)]
        for mid, off, data in compiled.initial:
            if mid not in shared:
                self._arenas[mid][off : off + len(data)] = np.frombuffer(data, np.uint8)
        vals = list(compiled.template)
        arenas, view = self._arenas, np.ndarray
        # (in C where built: one Python step fewer per planned tensor and per list value; the
        # loops here do what it leaves, from where it stopped)
        done = _plan.views(vals, compiled.planned_views, arenas) if _plan is not None else 0
        for i, shape, dtype, mid, offset in islice(compiled.planned_views, done, None):
            vals[i] = view(shape, dtype, arenas[mid], offset)
        for i in compiled.planned_strided:
            vals[i] = compiled.slots[i].bound_view(arenas)
        for i, src, fn in compiled.derived:
            vals[i] = fn(vals[src])
        self._vals = vals
        self._borrowed: list[tuple[int, Any]] = []  # (value, its own array) while an execute reads inputs in place
        get = vals.__getitem__
        done = _plan.lists(vals, compiled.lists) if _plan is not None else 0
        for i, (optional, items) in islice(compiled.lists.items(), done, None):
            vals[i] = [None if j == -1 else vals[j] for j in items] if optional else list(map(get, items))
        self._reinits = 0
        self._view: tuple[_OptionState, Mapping[str, Mapping[str, Any]]] | None = None
        # One backend object per backend id this method delegates to.
        backends: dict[str, Any] = {}
        for di, d in enumerate(compiled.plan.delegates):
            if d.id not in backends:
                b = backends[d.id] = get_backend_class(d.id)
                if not b.is_available():
                    hint = getattr(b, "install_hint", "")
                    raise BackendError(f"{self._where}: delegate {di}: backend {d.id!r} is not available on this machine"
                                       + (f" ({hint})" if hint else ""), Error.DelegateInvalidCompatibility)
        self._backends = backends
        specs = {bid: RuntimeSpecs(bid, tuple(b.option_specs)) for bid, b in backends.items()}
        for bid, values in (backend_options or {}).items():
            self._check_backend(bid)
            specs[bid] = specs[bid].replace(values)
        state = _OptionState(specs)
        self._target = self._active = state
        self._ctx = self._contexts(state)
        try:
            # (one pause for them all: a pause each let the collector pass over the young
            # objects after every delegate, 62 times for ViT's XNNPACK file)
            with _gc_paused():
                for di in range(len(compiled.plan.delegates)):
                    self._handles.append((backends[compiled.plan.delegates[di].id], self._init_delegate(di, state)))
        except BaseException:
            self._destroy_handles()
            raise

    # -- backend options ------------------------------------------------------------------
    def _check_backend(self, backend_id: str) -> str:
        if backend_id not in self._backends:
            have = ", ".join(self._backends) or "no backend"
            raise InvalidArgumentError(f"{self._where}: backend {backend_id!r} is not used by this method (it delegates to: {have})")
        return backend_id

    def _init_delegate(self, di: int, state: _OptionState) -> Any:
        d = self._cp.plan.delegates[di]
        ctx = BackendInitContext(self._name, di, d.id, self._cp.named_data, state.specs[d.id],
                                 self._cp.delegate_caches[di])
        with _gc_paused():
            return self._backends[d.id].init(ctx, self._program.delegate_data(d.processed), d.compile_specs)

    def _contexts(self, state: _OptionState, override: Mapping[str, RuntimeSpecs] | None = None) -> list[BackendExecutionContext]:
        specs = state.specs if not override else {**state.specs, **override}
        old = getattr(self, "_ctx", None)
        return [old[di] if old is not None and old[di].runtime_specs is specs[d.id]
                else BackendExecutionContext(self._name, di, specs[d.id])
                for di, d in enumerate(self._cp.plan.delegates)]

    def _stale(self, state: _OptionState, new: _OptionState) -> list[int]:
        """Delegates whose init-only values differ between two states."""
        a, b = state.specs, new.specs
        changed = [bid for bid in a if a[bid] is not b[bid] and a[bid].init_values() != b[bid].init_values()]
        if not changed:
            return []
        return [di for di, d in enumerate(self._cp.plan.delegates) if d.id in changed]

    def _next_state(self, backend_id: str, values: Mapping[str, Any]) -> tuple[_OptionState, _OptionState]:
        return self._next_states({backend_id: values})

    def _next_states(self, changes: Mapping[str, Mapping[str, Any]]) -> tuple[_OptionState, _OptionState]:
        if not isinstance(changes, Mapping):
            raise InvalidArgumentError(f"{self._where}: options must be a mapping backend -> {{option: value}}, "
                                       f"got {type(changes).__name__}")
        base = self._target
        specs = dict(base.specs)
        for backend_id, values in changes.items():
            self._check_backend(backend_id)
            if not isinstance(values, Mapping):
                raise InvalidArgumentError(f"{self._where}: options of backend {backend_id!r} must be a mapping "
                                           f"option -> value, got {type(values).__name__}")
            specs[backend_id] = specs[backend_id].replace(values)
        return base, _OptionState(specs)

    def _publish(self, base: _OptionState, new: _OptionState) -> None:
        # Handles prepared for the state being replaced: claim them (an atomic pop; the
        # executing thread may claim them first, then they are in use and not ours) and
        # carry them over when still valid, else destroy them here.
        claimed = base.cell.pop() if base.cell else None
        if claimed:
            stale = set(self._stale(base, new))
            keep = {di: h for di, h in claimed.items() if di not in stale}
            for di, h in claimed.items():
                if di not in keep:
                    self._backends[self._cp.plan.delegates[di].id].destroy(h)
            if keep:
                new.cell.append(keep)
        self._target = new  # the one reference assignment an execute boundary picks up

    def set_options(self, options: Mapping[str, Mapping[str, Any]]) -> None:
        """Changes this instance's options: ``{backend: {option: value}}``, every backend's
        values as one snapshot. Returns at once; the new values are in force from the start
        of the next execute (or :meth:`commit_options`), never inside one; :meth:`options`
        shows them from then. Changing an init-only option re-initialises that backend's
        delegates at that boundary (the new handles are built, swapped in, then the old ones
        destroyed). Everything is checked before anything changes.

        Raises:
            InvalidArgumentError: unknown backend or key, wrong type, value outside choices.
        """
        base, new = self._next_states(options)
        self._publish(base, new)

    def options(self) -> Mapping[str, Mapping[str, Any]]:
        """The options in force: backend -> option -> value (a read-only snapshot, as of the
        last execute boundary or :meth:`commit_options`)."""
        v = self._view
        state = self._active
        if v is None or v[0] is not state:  # made once per snapshot: every caller gets the same object
            v = self._view = (state, MappingProxyType({b: MappingProxyType(dict(s)) for b, s in state.specs.items()}))
        return v[1]

    def commit_options(self) -> None:
        """Puts the options set since the last execute in force now instead of at the next
        execute. Call it on the thread that executes, between executes (an orchestrator's
        worker does, when idle). An init-only change re-initialises its delegates here; if
        that fails the Method keeps the options it had and this raises the backend's error."""
        if self._closed:
            raise OrchestraError(f"{self._where}: commit_options on a closed Method", Error.InvalidState)
        busy = self._busy
        if busy[0]:
            raise OrchestraError(f"{self._where}: commit_options while an execute is running", Error.InvalidState)
        target = self._target
        if target is self._active:
            return
        busy[0] = True
        try:
            self._switch(target)
        except BaseException:
            if self._target is target:
                self._target = self._active  # the change failed: keep what is in force
            raise
        finally:
            busy[0] = False

    def set_backend_options(self, backend_id: str, values: Mapping[str, Any]) -> None:
        """Deprecated: ``set_options({backend_id: values})``."""
        warnings.warn("Method.set_backend_options(backend, values) is deprecated; use "
                      "set_options({backend: values})", DeprecationWarning, stacklevel=2)
        self.set_options({backend_id: values})

    def prepare_backend_options(self, backend_id: str, values: Mapping[str, Any]) -> None:
        """Like ``set_options({backend_id: values})``, but builds the re-initialised delegate handles
        now, on the calling thread (any thread, while the Method keeps executing), so the
        swap at the next execute boundary costs nothing."""
        base, new = self._next_state(backend_id, values)
        with _gc_paused():  # one pause for them all, as when the Method was created
            prepared = {di: self._init_delegate(di, new) for di in self._stale(self._active, new)}
        if prepared:
            new.cell.append(prepared)
        self._publish(base, new)

    def backend_options(self, backend_id: str) -> dict[str, Any]:
        """Deprecated: ``dict(options()[backend_id])``."""
        warnings.warn("Method.backend_options(backend) is deprecated; use options()[backend]",
                      DeprecationWarning, stacklevel=2)
        return dict(self._active.specs[self._check_backend(backend_id)])

    def _switch(self, new: _OptionState) -> None:
        """Makes ``new`` the state in force, at an execute boundary."""
        old = self._active
        prepared = new.cell.pop() if new.cell else {}
        stale = self._stale(old, new)
        handles = list(self._handles)
        built: list[int] = []
        try:
            with _gc_paused():  # one pause for them all, as when the Method was created
                for di in stale:
                    h = prepared.pop(di) if di in prepared else self._init_delegate(di, new)
                    built.append(di)
                    handles[di] = (handles[di][0], h)
        except BaseException:
            for di in built:
                handles[di][0].destroy(handles[di][1])
            for di, h in prepared.items():
                self._backends[self._cp.plan.delegates[di].id].destroy(h)
            raise
        for di, h in prepared.items():  # prepared for a delegate that no longer needs it
            self._backends[self._cp.plan.delegates[di].id].destroy(h)
        retired = [self._handles[di] for di in stale]
        self._handles = handles
        self._ctx = self._contexts(new)
        self._active = new
        self._reinits += len(stale)
        for backend, h in retired:
            backend.destroy(h)

    def _write(self, idx: int, value: Any, what: str) -> None:
        """Stores a kernel or delegate result into value ``idx`` (copying into planned memory)."""
        vals = self._vals
        cur = vals[idx]
        if value is cur:
            return
        lst = self._lists.get(idx)
        if lst is not None:
            optional, members = lst
            if len(value) != len(members):
                raise OrchestraError(f"{self._where}: {what}: returned {len(value)} values for a list of {len(members)}", Error.Internal)
            for m, x in zip(members, value):
                if m != -1:
                    self._write(m, x, what)
            return
        slot = self._slots[idx]
        if slot is None:
            vals[idx] = value  # no planned storage: alias (views, scalars, unplanned tensors)
            return
        arr = np.asarray(value)
        if cur.shape != arr.shape:
            if not slot.dynamic or len(arr.shape) != len(slot.bound) or any(s > b for s, b in zip(arr.shape, slot.bound)):
                raise OrchestraError(
                    f"{self._where}: {what}: result of shape {list(arr.shape)} does not fit output values[{idx}] "
                    f"({'bound' if slot.dynamic else 'shape'} {list(slot.bound)})", Error.InvalidState)
            cur = vals[idx] = slot.view(self._arenas, arr.shape)
        np.copyto(cur, arr, casting="unsafe")

    def _refresh_lists(self, idxs: tuple[int, ...]) -> None:
        vals = self._vals
        build = self._cp.list_builders
        for i in idxs:
            vals[i] = build[i](vals)

    # -- public -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def meta(self) -> MethodMeta:
        return self._meta

    def _training(self) -> tuple[list[str], int, int]:
        """(parameter names, first gradient output, first parameter output) of a joint graph."""
        tr = training_info(self._program, self._name)
        if tr is None:
            raise InvalidArgumentError(
                f"{self._where}: not a training method (the program has no __et_training_*_{self._name} "
                "methods; export the joint graph with torch.export.experimental._export_forward_backward)")
        return tr

    def named_parameters(self) -> dict[str, np.ndarray]:
        """A training method's parameters by name (``"linear.weight"``): the live arrays in this
        Method's memory, which start at the exported values. Write to them in place (an
        optimizer step) between executes and the next execute uses the new values, as with
        ExecuTorch's ``TrainingModule::named_parameters``.

        Raises:
            InvalidArgumentError: the method is not a joint (forward + backward) graph.
        """
        names, _, first = self._training()
        return self._outputs_by_name(names, first)

    def named_gradients(self) -> dict[str, np.ndarray]:
        """A training method's gradients from its last execute, by parameter name (views
        into this Method's memory, overwritten by the next execute: copy to keep them)."""
        names, first, _ = self._training()
        return self._outputs_by_name(names, first)

    def _outputs_by_name(self, names: list[str], first: int) -> dict[str, np.ndarray]:
        outs = self._cp.output_idx
        if first < 0 or first + len(names) > len(outs):
            raise OrchestraError(f"{self._where}: training outputs {first}..{first + len(names) - 1} are out of range "
                                 f"({len(outs)} outputs)", Error.InvalidProgram)
        res = {}
        for k, name in enumerate(names):
            v = self._vals[outs[first + k]]
            if not isinstance(v, np.ndarray):
                raise OrchestraError(f"{self._where}: training output {first + k} ({name!r}) is not a tensor", Error.InvalidProgram)
            res[name] = v
        return res

    def _set_inputs(self, inputs: Sequence[Any], borrow: bool = False) -> None:
        """Puts ``inputs`` in the Method's values: tensors copied into their planned memory,
        or with ``borrow`` read in place where ``CompiledPlan.borrowable`` allows (listed in
        ``self._borrowed``, put back by execute when it ends)."""
        cp = self._cp
        infos = cp.input_infos
        if len(inputs) != len(infos):
            raise InvalidArgumentError(f"{self._where}: expected {len(infos)} inputs, got {len(inputs)}")
        vals = self._vals
        borrowable = cp.borrowable if borrow else ()  # (worked out on the first borrowing call)
        for k, (idx, info, slot, x) in enumerate(zip(cp.input_idx, infos, cp.input_slots, inputs)):
            if isinstance(info, TensorInfo):
                if not isinstance(x, np.ndarray):
                    if isinstance(x, (int, float, bool)) and not info.shape:
                        x = np.asarray(x, dtype=info.dtype)
                    else:
                        raise InvalidArgumentError(f"{self._where}: input {k}: expected a numpy array of {info.dtype} {list(info.shape)}, got {type(x).__name__}")
                if x.dtype != info.dtype:
                    raise InvalidArgumentError(f"{self._where}: input {k}: dtype {x.dtype} does not match the program's {info.dtype}")
                shape = x.shape
                if shape != info.shape:
                    if info.dynamism == TensorShapeDynamism.STATIC or len(shape) != len(info.shape) or (
                        info.dynamism == TensorShapeDynamism.DYNAMIC_BOUND and any(s > b for s, b in zip(shape, info.shape))
                    ):
                        kind = "bound" if info.is_dynamic else "shape"
                        raise InvalidArgumentError(f"{self._where}: input {k}: shape {list(shape)} does not fit the program's {kind} {list(info.shape)}")
                    if slot is not None and x.size > slot.capacity:  # DYNAMIC_UNBOUND in planned memory
                        raise InvalidArgumentError(
                            f"{self._where}: input {k}: shape {list(shape)} ({x.size} elements) does not fit the planned "
                            f"memory of this unbound input ({slot.capacity} elements, planned for {list(info.shape)})")
                if slot is None:
                    vals[idx] = x
                elif borrow and borrowable[k] and type(x) is np.ndarray and shape == slot.bound and x.flags.c_contiguous:
                    self._borrowed.append((idx, vals[idx]))
                    vals[idx] = x
                else:
                    cur = vals[idx]
                    if cur.shape != shape:
                        cur = vals[idx] = slot.view(self._arenas, shape)
                    np.copyto(cur, x)
            else:
                want = {"int": int, "float": (int, float), "bool": bool, "str": str}.get(info.kind)
                if want is not None and (not isinstance(x, want) or (info.kind == "int" and isinstance(x, bool))):
                    raise InvalidArgumentError(f"{self._where}: input {k}: expected {info.kind}, got {type(x).__name__}")
                vals[idx] = x

    def execute(self, inputs: Sequence[Any], backend_options: Mapping[str, Mapping[str, Any]] | None = None, *,
                borrow_inputs: bool = False) -> list[Any]:
        """Runs the method once. Returns the outputs (numpy arrays the caller owns).

        Option changes made since the last execute take effect first. ``backend_options``
        overrides hot options for this call only (``{"backend": {"key": value}}``).

        ``borrow_inputs=True``: a tensor input that is a C-contiguous array of its static
        shape is read where it is, for this call, instead of being copied into the Method's
        memory first, wherever the plan allows it (the program never writes that input;
        ``CompiledPlan.borrowable``); the others are copied as usual. The caller must not
        change those arrays until execute returns; the Method keeps no reference to them
        after. It saves one pass over each input (a 602 KB image: 20-70 us), which is how a
        worker process reads the request in its shared memory.

        Raises:
            InvalidArgumentError: wrong input count, dtype or shape (the message names it).
            OrchestraError: the Method is closed or already executing on another thread, or a
                kernel or delegate failed (the message names the instruction).
        """
        if self._closed:
            raise OrchestraError(f"{self._where}: execute on a closed Method", Error.InvalidState)
        busy = self._busy
        if busy[0]:
            raise OrchestraError(f"{self._where}: execute while another execute is running (one thread at a time per "
                                 "Method, and per ProgramInstance for the methods it loaded)", Error.InvalidState)
        busy[0] = True
        t0 = time.perf_counter()
        restore = None
        try:
            target = self._target
            if target is not self._active:
                self._switch(target)
            if backend_options:
                override = {self._check_backend(b): self._active.specs[b].replace(v, hot_only=True)
                            for b, v in backend_options.items()}
                restore, self._ctx = self._ctx, self._contexts(self._active, override)
            self._set_inputs(inputs, borrow_inputs)
            vals = self._vals
            steps = self._cp.steps
            n = len(steps)
            pc = 0
            count = 0
            cap = self.instruction_cap
            limit = self.time_limit_s
            try:
                if not self._cp.loops and limit is None and cap >= n:  # each step runs at most once
                    while pc < n:
                        nxt = steps[pc](vals, self)
                        pc = pc + 1 if nxt is None else nxt
                else:
                    t_end = math.inf if limit is None else t0 + limit
                    while pc < n:
                        nxt = steps[pc](vals, self)
                        pc = pc + 1 if nxt is None else nxt
                        count += 1
                        if count > cap:
                            raise OrchestraError(
                                f"{self._where}: more than {cap} instructions in one execute (its instruction budget: "
                                f"Method.instruction_cap, by default {n} steps x {LOOP_ITERATIONS} for a plan that "
                                f"loops); a JumpFalse loop that never ends?", Error.InvalidState)
                        if not count & 255 and time.perf_counter() > t_end:
                            raise OrchestraError(
                                f"{self._where}: execute ran past its time limit of {limit:g} s (Method.time_limit_s) "
                                f"after {count} instructions", Error.InvalidState)
            except OrchestraError:
                raise
            except Exception as exc:
                raise OrchestraError(f"{self._where}: {self._cp.describe_step(pc)} failed: {type(exc).__name__}: {exc}", Error.Internal) from exc
            out = []
            for i in self._cp.output_idx:
                v = vals[i]
                out.append(np.array(v, copy=True) if isinstance(v, np.ndarray) else v)
        except BaseException:
            self._failures += 1
            raise
        finally:
            if restore is not None:
                self._ctx = restore
            if self._borrowed:  # the Method's own memory back in place of the caller's arrays
                vals = self._vals
                for idx, own in self._borrowed:
                    vals[idx] = own
                self._borrowed.clear()
            busy[0] = False
        dt = time.perf_counter() - t0
        self._executions += 1
        self._total += dt
        self._last = dt
        return out

    def statistics(self) -> MethodStatistics:
        return MethodStatistics(self._executions, self._failures, self._total, self._last,
                                self._meta.planned_bytes, len(self._handles), self._reinits)

    def _destroy_handles(self) -> None:
        handles, self._handles = self._handles, []
        for backend, handle in handles:
            backend.destroy(handle)
        target = getattr(self, "_target", None)
        prepared = target.cell.pop() if target is not None and target.cell else {}
        for di, h in prepared.items():
            self._backends[self._cp.plan.delegates[di].id].destroy(h)

    def close(self) -> None:
        """Destroys the delegate handles and frees the arenas. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._destroy_handles()
        self._arenas = []
        self._vals = []

    def __enter__(self) -> Method:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Method {self._name!r} ({'closed' if self._closed else 'open'})>"
