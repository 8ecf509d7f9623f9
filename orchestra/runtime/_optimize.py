"""Compile-time rewrites of a method's steps (run once per Program, by ``CompiledPlan``).

``CompiledPlan`` first binds one step per instruction, exactly as written in the program,
then :func:`optimize_steps` replaces some of them, when a use analysis of the plan shows
the change can't be observed:

- **Max-pool without indices.** ``aten::max_pool2d_with_indices.out`` whose ``indices``
  output no instruction names and that isn't a method output runs a values-only variant of
  the kernel (bit-identical values, NaN propagation included; about 4x less work on small
  inputs). The indices tensor is then left untouched: its contents are unspecified, as
  nothing reads them.
- **Batch norm folded into the convolution.** ``aten::convolution.out`` (constant weight,
  constant or no bias, not transposed) immediately followed by
  ``aten::_native_batch_norm_legit_no_training.out`` (constant weight / bias / running
  statistics, a literal eps) that is the only reader of the convolution's output, whose
  ``save_mean`` / ``save_invstd`` outputs nothing reads: one step runs the convolution with
  ``W' = W * s`` and ``b' = (b - mean) * s + beta``, ``s = gamma / sqrt(var + eps)`` per
  output channel, straight into the batch norm's output. The folded constants are computed
  once per CompiledPlan (``s`` and ``b'`` in float64, rounded to the weight's dtype; ``W'``
  as ``W`` times the rounded ``s`` in the weight's dtype), and are read-only arrays of
  their own, shared by every Method (the program's constant bytes are never touched; the
  cost is one copy of the folded convolutions' weights per Program, at most
  ``FOLD_BUDGET_BYTES`` (16 MiB) per method: past it batch norms stay separate steps). Results differ from
  the unfused pair by float rounding only. Not folded when a folded value would not be
  finite (a zero ``var + eps``, say): inf/NaN would not propagate as in the unfused pair.
  A float32 1x1 convolution that ``plan_conv2d`` runs as the compiled product
  (``scales_in_product``) keeps ``W`` itself (a view of the file, no copy: those copies' fresh
  pages were most of a large model's fold) and the product computes ``s * (W . x) + b'``
  per output; only ``s`` and ``b'`` count against the budget, and only they must be finite
  (a non-finite weight propagates as in the unfused pair's reassociated operations).
  Where the plan puts the step's result on the convolution input's memory (the input is
  dead after it) and the result is no larger than the input, the step computes into the
  convolution's own output, which the fold leaves out, and copies the result over, rather
  than copying the input aside first (only where no other step runs inside its span).
- **Convolutions planned once.** A 2-d convolution with a constant (or folded) weight and
  bias and literal stride / padding / dilation / groups checks its arguments and picks its
  path once per input shape (``plan_conv2d``: the compiled direct convolution, or a 1x1's
  GEMM plus one compiled bias/activation pass); each execute then only confirms the input
  and output are what was planned for (else it runs the kernel as written). The same
  computation, the same bits; a plain one is recorded as ``conv_planned``.
- **Activation fused into a folded convolution.** A float32 folded convolution whose batch
  norm output is read only by the activation after it (``relu``; an exported hardswish
  chain, ``add 3 / clamp 0 / clamp 6 / mul by it / div 6``, folded constant copies in
  between; ``sigmoid`` then ``mul`` by it, silu) runs as one step writing the activation's
  output (``conv2d(..., act=)``: applied to each group's planes while they are in cache by
  the compiled convolution, or with the bias in one compiled pass over a GEMM's output);
  the batch norm's output is never written (checked like every left-out write). The same
  bits as the activation kernel on the folded convolution's result.
- **Matmul operands as views.** An operand of ``aten::mm.out`` / ``aten::bmm.out`` /
  ``aten::addmm.out`` (``mat1`` / ``mat2``) made by a chain of copies that only rearrange
  (``permute_copy``, ``transpose_copy``, ``t_copy``, ``view_copy``, ``_unsafe_view``,
  ``clone``, ``alias_copy``, ``_clone_dim_order``, ``squeeze_copy`` / ``unsqueeze_copy``,
  ``slice_copy`` (a basic slice), ``expand_copy`` to its own sizes; same dtype, static
  shapes, literal arguments), each read only by the next, is read as a numpy view of the chain's source
  (``transpose`` / ``reshape``): the copies don't run. numpy's matmul takes strided operands
  (BLAS with its transpose flags); a reshape numpy can't express as a view of a transposed
  source copies, once, inside the step. A view of a constant is made here, once per
  CompiledPlan (it shares the program's bytes); a view of a planned tensor of static shape
  once per Method (``CompiledPlan.derived``: a Method never rebinds such a tensor, so the
  view follows its every write); anything else (an input without planned memory) at each
  execute. The source must not be written between the first copy and the matmul (no
  instruction in between writes it or memory it shares), nor any copy's result before the
  next one reads it. The kernels are the plain ones, given a strided operand: results
  equal the copies' up to float rounding where BLAS takes another path for a transposed
  operand (bit-identical on the fixtures; the tests allow 1e-6 relative). On the
  transformer fixture: 29 steps -> 20, about 20 µs (1.06x) per execute against the plan
  without rewrites in the same run (two of its head permutes stay: the plan reuses their
  sources' memory before the matmul). Plans where an instruction names a tensor that has
  neither planned memory nor constant data and isn't an input (a view op's result,
  ``et_view``) are left alone: such a tensor may share memory with anything.
- **Delegate arguments as views.** The same, for an argument of a ``DelegateCall`` that its
  backend only reads: where the backend says which arguments it writes
  (``BackendInterface.delegate_outputs``: the XNNPACK backend's graph outputs), the rest
  are reads, and a chain of layout copies feeding one (the XNNPACK exporter's
  ``expand_copy`` to the same shape and ``squeeze_copy`` between two delegates of a
  transformer) is left out: the delegate gets the view of the chain's source, made once per
  Method. The checks are the matmul's, plus one of the delegate's own: an output it writes
  may lie on the source (the plan reuses a source's memory once its copy has read it) only
  where the backend reads the whole argument before it writes that output
  (``BackendInterface.delegate_in_place``). A delegate's arguments are judged together: a
  source that another argument's left-out copy would have overwritten stays valid while
  that copy stays out (re-checked whenever a chain is cut). The same bytes reach the
  delegate: bit-identical results. The XNNPACK-lowered transformers here: ViT-tiny 173 ->
  112 steps, BERT 33 -> 23, GPT-2 64 -> 32 (every copy), 0.97-0.99x per execute.

- **Elementwise chains.** Consecutive elementwise instructions (``relu``, ``clamp``,
  ``hardtanh``, ``sigmoid``, ``silu``, ``hardswish``, ``hardsigmoid``; ``add`` / ``sub``
  (alpha 1), ``mul``, ``div`` of the running value and a tensor of the same dtype that
  broadcasts to it) over one float32/float64 tensor of static shape, each intermediate read
  only by the next, run as one step computing in place in the last one's output: the
  intermediates are never written (MobileNetV3's hardswish ``add, clamp, clamp, mul, div``;
  EfficientNet's ``sigmoid, mul``, SiLU). Independent ``_to_dim_order_copy`` /
  ``_to_copy`` instructions in between (the exporter's scalar constants) still run at
  their place. The chain's own input and the other operands are read where the last
  instruction was (checked: nothing in between writes them or memory they share), and the
  output must share no memory with those read after the first operation (it is written
  from the first operation on).
  The operations are the kernels' own numpy ufunc calls in the same order and dtype:
  results are bit-identical to the unfused steps. ``sigmoid`` then ``mul`` by the
  sigmoid's input is computed as ``silu`` (``x / (1 + exp(-x))``, one pass fewer; float
  rounding only); an ``add`` of a same-shape float32 tensor then ``relu`` (a residual
  connection) runs as one compiled pass split over the kernels' threads where they have
  several (``add_f32_into``: the same bits).
- **Constant copies folded.** ``_to_dim_order_copy`` / ``_to_copy`` of a constant (literal
  arguments, the identity dim order or none) into a planned static tensor of at most
  ``_CONST_COPY_MAX_SIZE`` elements that only it writes, not a method output, read
  afterwards only by kernel calls naming it directly, or by delegates whose backend only
  reads it (``delegate_outputs``: the XNNPACK exporter passes hardsigmoid's 3 and 6 to the
  delegate as inputs, 18 copies in MobileNetV3-small's lowered file): the copy is computed
  once here (the kernel's own conversion, a read-only array) and doesn't run; its readers
  read that constant (plain kernel and delegate steps rebound, or an elementwise chain's
  other operand). Its write
  is left out under the same memory checks as the rewrites above, and an elementwise chain
  may extend over it: MobileNetV3's 56 scalar conversions go, and each hardswish's division
  joins its chain (the copy of 6 no longer overwrites the chain's input). A readers'
  instruction another rewrite covers keeps the copy. Results are bit-identical.
- **Gelu with scratch.** ``aten::gelu.out`` (literal ``approximate="none"``) of a float32
  tensor of static shape with more than ``GELU_TABLE_MAX_SIZE`` elements, into its planned
  out of the same shape, runs the kernel's own float32 fit (same results) in a scratch
  buffer the Method owns (``CompiledPlan.derived``: one per Method, ``3 x`` the largest such
  gelu's elements, shared by its gelu steps, which never run at once) instead of three fresh
  temporaries per execute: temporaries of a transformer's size (hundreds of KB) come from
  fresh pages whenever malloc has handed the last ones back to the system (~550 page faults,
  ~1 ms, per ViT-tiny gelu measured), a cost planned memory never pays. Nothing is left
  out, so no use analysis is involved.

- **Squeeze-and-excite in one step.** Six consecutive steps (after the rewrites above) of
  a squeeze-and-excite block: ``aten::mean.out`` of x (N, C, H, W) over its last two dims
  (keepdim) into s, a planned 1x1 convolution into t1 (N, R, 1, 1), an activation (``relu``,
  ``sigmoid``, ``silu``, or an elementwise chain of those, ``clamp`` and scalar float32
  constants: the exported silu), a planned 1x1 convolution into t3 (N, C, 1, 1), a gate
  (``sigmoid``, or such a chain: the exported hardsigmoid ``add 3 / clamp 0 / clamp 6 /
  div 6``) into g, and ``mul`` of x and g, every value float32, static and planned: one
  step calls the compiled ``squeeze_excite_into``, which writes every value the six steps
  wrote, in their order, and reads x for the product after writing g. It is the six steps
  run at once, whatever memory the plan gave the values, so nothing is left out and no
  use analysis is needed. Float rounding only (the mean's and the products' sums, expf);
  where the compiled call declines (kernels not built, an operand that doesn't fit) the
  step runs the six steps. MobileNetV3-small: 99 steps -> 54, 0.91x (1 thread) / 0.89x
  (2 threads) per execute; EfficientNet-B0: 156 -> 76, 0.96x / 0.94x (same-process A/B).

Not done: fusing a following ``aten::relu.out`` into the convolution step (in place). It saves
only one step's dispatch, about 1 µs, lost in the noise on the fixtures (measured on
convnet, cnn and dynamic_batch), so it is not worth a rewrite. Nor does a kernel write
straight into the ``view_copy`` that follows it (the transformer's last ``addmm`` ->
``view_copy`` -> output): leaving that step out altogether saves at most ~5 µs of ~315
(measured by skipping it), not worth another kind of step.

Use analysis: for every value, the instructions that name it (as an argument, or as a
member of a list argument), those that may write it (kernel results, every delegate
argument, unless its backend says which it writes: ``BackendInterface.delegate_outputs``;
move targets, freed values; method inputs count as written) and those that define it
(write all of it without reading it: a kernel's out, a delegate's output named once in its
call). Anything not understood
counts as a read and a write. A value "only read by" an instruction is named by no other
instruction (before or after it, which also covers state carried between executes) and is
not a method output. Plans with control flow (``JumpFalseCall``) are left as they are:
their steps are not straight-line.

Values also share memory: the memory plan reuses an arena region for values whose
lifetimes don't overlap, and a view op removed at export leaves two values on the same
bytes (the transformer's ``(1, 2, 8, 8)`` attention scores are read as ``(2, 8, 8)``). So
every write a rewrite leaves out (the indices, the convolution output and the batch
norm's saved statistics, a copy's result) is also checked on memory: each read of a byte
of it, through any value (the caller's read of the outputs and reads in the next execute
included), must come after a write of all the bytes it reads, since the write left out,
by an instruction (or input copy) that still runs. The rewrites are checked together, each
assuming the others' writes left out, dropping any that fails until none does.

Fused steps cover several instructions; ``CompiledPlan.step_spans`` says which, so error
messages name them all. A fused step runs in its last instruction's place; a matmul step's
copies come earlier, not always adjacent (running them there instead, as written, gives
the same results: nothing in between writes their data).
"""

from __future__ import annotations

import bisect
import functools
import math
import operator
import re
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import OrchestraError
from ..program import (
    Bool,
    DelegateCall,
    Double,
    FreeCall,
    Int,
    JumpFalseCall,
    KernelCall,
    MoveCall,
    Null,
    ScalarType,
    String,
    Tensor,
    numpy_dtype,
)
from .kernels import get_kernel
from .kernels._conv import convolution_act, plan_conv2d, scale_weight, scales_in_product
from .kernels._elementwise import GELU_TABLE_MAX_SIZE, add_f32_into, bn_fold_f32, clip_ufunc, gelu_fit_f32_into, hardsigmoid_out, hardswish_out, scale_rows_into, silu_out
from .kernels._fused import SE_ADD, SE_CLAMP, SE_DIV, SE_MUL, SE_MULX, SE_SIGMOID, squeeze_excite_available, squeeze_excite_into
from .kernels._pool import max_pool2d_values_out

try:  # the use analysis' loop and _Storage's, compiled (optional, like the kernels: see setup.py)
    from . import _uses
except ImportError:  # pragma: no cover - built without a C compiler
    _uses = None
# _Matcher's tables made in C (the same module; None: its Python code answers everything, as
# without the extension; tests and benchmarks switch it off alone).
_match = _uses
# Its tables of the folds (convolutions with their batch norms, constant copies), on only where
# _match is too: a switch of their own for tests and benchmarks.
_match_folds = _uses
# The chain walks in C, on only where _match is too (they walk its tables): an elementwise
# chain's (_Matcher.ew_chain) and a layout chain's (producer's table, layout_chain, chain_sources).
# A switch of their own for tests and benchmarks.
_match_chains = _uses
# _ew_static_ok's memory checks in C (asked of every elementwise chain found, and again of each
# shorter prefix): a switch of its own for tests and benchmarks.
_match_static = _uses
# optimize_steps keeps _simplify's, _view_fn's and _stays_a_view's answers per plan (each block of
# a transformer asks the same): a switch for tests and benchmarks (False: each asked afresh).
_memo_views = True
# A matcher's answer the C table leaves to the Python code.
_ASK = object()


def _answer(table: Sequence[Any], pc: int) -> Any:
    """A per-instruction C table's answer for instruction ``pc``: _ASK where the table has none
    (not built, declined, or left to the Python code)."""
    return table[pc] if 0 <= pc < len(table) else _ASK

if TYPE_CHECKING:
    from ._method import CompiledPlan, Method, Step

__all__ = ["FirstUses", "PlanUses", "Rewrite", "analyse_uses", "optimize_steps"]

_CONV = "aten::convolution.out"
_BN = "aten::_native_batch_norm_legit_no_training.out"
_MAXPOOL = "aten::max_pool2d_with_indices.out"
_GELU = "aten::gelu.out"
_DELEGATE = "delegate"  # _Chains.name of a DelegateCall's arguments read as views
_FOLD_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
# At most this many bytes of folded conv weights per compiled method (each fold copies one
# convolution's weights; past the budget batch norms stay separate steps).
FOLD_BUDGET_BYTES = 16 << 20
# Matrix products whose tensor operands may be strided views: name -> (parameters, operands).
_MATMULS = MappingProxyType({
    "aten::mm.out": (3, (0, 1)),
    "aten::bmm.out": (3, (0, 1)),
    "aten::addmm.out": (6, (1, 2)),
})
# Instructions that only rearrange one tensor into their out (the last parameter).
_LAYOUT_OPS = MappingProxyType({
    "aten::permute_copy.out": 3,
    "aten::transpose_copy.int_out": 4,
    "aten::t_copy.out": 2,
    "aten::view_copy.out": 3,
    "aten::_unsafe_view.out": 3,
    "aten::clone.out": 3,
    "aten::alias_copy.out": 2,
    "dim_order_ops::_clone_dim_order.out": 4,
    "aten::squeeze_copy.dims_out": 3,
    "aten::squeeze_copy.dim_out": 3,
    "aten::unsqueeze_copy.out": 3,
    "aten::expand_copy.out": 4,  # only when it expands nothing
    "aten::slice_copy.Tensor_out": 6,
})
# Each layout operator's kind, as _uses.layout_links numbers them.
_LAYOUT_KINDS = MappingProxyType({
    "aten::permute_copy.out": 1,
    "aten::transpose_copy.int_out": 2,
    "aten::t_copy.out": 3,
    "aten::view_copy.out": 4,
    "aten::_unsafe_view.out": 4,
    "aten::clone.out": 5,
    "aten::alias_copy.out": 5,
    "dim_order_ops::_clone_dim_order.out": 5,
    "aten::squeeze_copy.dims_out": 6,
    "aten::squeeze_copy.dim_out": 6,
    "aten::unsqueeze_copy.out": 6,
    "aten::expand_copy.out": 7,
    "aten::slice_copy.Tensor_out": 8,
})
# scalar type -> numpy dtype, as numpy_dtype answers for an int (read-only; the C tables take a
# dict: each _Matcher hands them its own copy, _Matcher.to_numpy).
_NUMPY_OF = MappingProxyType({int(t): dt for t in ScalarType if (dt := numpy_dtype(t)) is not None})
_MAX_LINKS = 8  # copies followed back from one matmul operand
# Elementwise operators an elementwise chain may hold: name -> parameters (out last).
_EW_UNARY = MappingProxyType({
    "aten::relu.out": 2,
    "aten::sigmoid.out": 2,
    "aten::silu.out": 2,
    "aten::hardswish.out": 2,
    "aten::hardsigmoid.out": 2,
    "aten::clamp.out": 4,
    "aten::hardtanh.out": 4,
})
_EW_BINARY = MappingProxyType({
    "aten::add.out": 4,  # self, other, alpha, out
    "aten::sub.out": 4,
    "aten::mul.out": 3,
    "aten::div.out": 3,
})
# Binary operators whose operands may not swap (the running value on the left only, at first).
_EW_ORDERED = frozenset({"aten::sub.out", "aten::div.out"})
# Instructions an elementwise chain may step over (they run at their own place): the
# exporter's scalar constants between the operations of a hardswish.
_EW_SKIPPABLE = frozenset({"dim_order_ops::_to_dim_order_copy.out", "aten::_to_copy.out"})
_MAX_SKIPS = 2  # consecutive instructions stepped over inside a chain


@dataclass(frozen=True, slots=True)
class PlanUses:
    """Which instructions name each value, in one plan (instructions numbered across chains).

    Attributes (read-only, sets included):
        mentions: value index -> instructions whose arguments name it, directly or as a
            member of a list value (TensorList, OptionalTensorList, IntList).
        written: values some instruction may write, plus the method's inputs.
        outputs: the method's outputs (list members included).
        straight: False when the plan has control flow (or an instruction not understood).
        writers: value index -> instructions that may write it (as ``written``, without the
            method's inputs).
        defines: value index -> instructions that write all of it without reading it: a
            kernel's result (of an operator with returns) that its parameters name once, as
            an out parameter, or not at all.
        first_mention, first_write, first_define: value index -> the first instruction of
            ``mentions`` / ``writers`` / ``defines`` (plain ints: what a compiled plan keeps
            of the analysis once its steps are built, see ``FirstUses``).
    """

    mentions: Mapping[int, AbstractSet[int]]
    written: frozenset[int]
    outputs: frozenset[int]
    straight: bool
    writers: Mapping[int, AbstractSet[int]] = field(default_factory=dict)
    defines: Mapping[int, AbstractSet[int]] = field(default_factory=dict)
    first_mention: Mapping[int, int] = field(default_factory=dict)
    first_write: Mapping[int, int] = field(default_factory=dict)
    first_define: Mapping[int, int] = field(default_factory=dict)

    def firsts(self) -> FirstUses:
        """What a compiled plan keeps of this analysis after its steps are built."""
        return FirstUses(self.straight, self.first_mention, self.first_write, self.first_define)

    def only_named_by(self, value: int, pcs: Sequence[int]) -> bool:
        """True when ``value`` is not a method output and no instruction outside ``pcs``
        names it."""
        return value not in self.outputs and self.mentions.get(value, frozenset()) <= frozenset(pcs)

    def written_between(self, value: int, start: int, stop: int) -> bool:
        """True when an instruction strictly between ``start`` and ``stop`` may write ``value``
        (the value itself: see ``_Storage`` for values sharing its memory)."""
        return any(start < pc < stop for pc in self.writers.get(value, ()))

    def reads(self, value: int) -> frozenset[int]:
        """The instructions that may read ``value``: those naming it, except where it is
        only defined."""
        return self.mentions.get(value, frozenset()) - self.defines.get(value, frozenset())


@dataclass(frozen=True, slots=True)
class FirstUses:
    """The first instruction naming, writing and defining each value (``PlanUses.firsts``).

    A compiled plan keeps these plain ints rather than the whole analysis: its thousands of
    sets, alive as long as the plan, were a quarter of the objects the garbage collector
    walked after each load."""

    straight: bool
    first_mention: Mapping[int, int]
    first_write: Mapping[int, int]
    first_define: Mapping[int, int]


@dataclass(frozen=True, slots=True)
class Rewrite:
    """One rewrite applied to a plan: its kind, the instructions its step covers, and the
    constants it computed (``conv_bn``: the folded weight and bias, or the file's weight, the
    folded bias and the scale its 1x1 product applies; ``matmul_views``: the operands that are
    views of constants), read-only."""

    kind: str  # "maxpool_values", "conv_bn", "conv_activation", "conv_planned", "matmul_views",
    # "delegate_views", "elementwise_chain", "gelu_scratch", "constant_copy", "squeeze_excite"
    instructions: tuple[int, ...]
    constants: tuple[np.ndarray, ...] = field(default=(), compare=False, repr=False)


def _expand(args: Sequence[int], lists: dict[int, tuple[bool, tuple[int, ...]]]) -> list[int]:
    """``args`` with the members of list values after each list."""
    out: list[int] = []
    for i in args:
        out.append(i)
        lst = lists.get(i)
        if lst is not None:
            out.extend(j for j in lst[1] if j >= 0)
    return out


# Out parameters not named out / out0 / out1 ...
_OTHER_OUTS = MappingProxyType({
    "aten::max_pool2d_with_indices.out": ("indices",),
    "aten::max.dim_max": ("max", "max_values"),
    "aten::min.dim_min": ("min", "min_indices"),
})


def _out_params(name: str) -> frozenset[int]:
    """Positions of the out parameters of operator ``name``'s kernel."""
    kd = get_kernel(name)
    if kd is None:
        return frozenset()
    names = kd.param_names
    other = _OTHER_OUTS.get(name, ())
    return frozenset(p for p, n in enumerate(names) if re.fullmatch(r"out\d*", n) or n in other)


def analyse_uses(cp: CompiledPlan, instructions: Sequence[Any], rets: Sequence[tuple[int, ...] | None]) -> PlanUses:
    """The use analysis of ``cp``'s plan. ``rets[pc]`` is what a KernelCall writes (its
    results, as the step binds them), None for other instructions."""
    lists = cp.lists
    mentions: dict[int, set[int]] = {}
    writers: dict[int, set[int]] = {}
    defines: dict[int, set[int]] = {}
    first_mention: dict[int, int] = {}
    first_write: dict[int, int] = {}
    first_define: dict[int, int] = {}
    # Per operator (index): its kernel's parameter count and out parameters, once.
    ops: dict[int, tuple[int, frozenset[int]] | None] = {}
    operators = cp.plan.operators
    no_list = lists.keys().isdisjoint
    delegate_outputs: Sequence[frozenset[int] | None] = getattr(cp, "delegate_outputs", ())
    straight = True

    def op_of(k: int) -> tuple[int, frozenset[int]] | None:
        op = ops.get(k, False)
        if op is False:
            name = operators[k].qualified_name
            kd = get_kernel(name)
            op = ops[k] = None if kd is None else (kd.num_params, _out_params(name))
        return op

    def define(i: int, pc: int) -> None:
        defines.setdefault(i, set()).add(pc)
        if first_define.get(i, pc) >= pc:
            first_define[i] = pc

    pcs: Iterable[int] = range(len(instructions))
    if _uses is not None and type(instructions) is list and type(rets) is list:
        # The kernel calls, moves and frees in C (the same sets); the rest below.
        mentions, writers, defines, first_mention, first_write, first_define, pcs = _uses.scan(
            instructions, rets, lists, [op_of(k) for k in range(len(operators))], KernelCall, MoveCall, FreeCall)
    for pc in pcs:
        a = instructions[pc]
        wrote: list[int] = []
        if isinstance(a, KernelCall):
            args = a.args
            out = rets[pc] or args
            # Most instructions name no list value: no members to add.
            named = _expand(args, lists) if lists and not no_list(args) else list(args)
            wrote = _expand(out, lists) if lists and not no_list(out) else list(out)
            op = op_of(a.op_index)
            if op is not None and len(args) > op[0] and (not lists or no_list(args[: op[0]])):
                # The parameters name no list: where a value is named is where it appears.
                outs = op[1]
                params = args[: op[0]]
                for i in wrote:
                    c = params.count(i)
                    if i not in lists and (not c or (c == 1 and params.index(i) in outs)):
                        define(i, pc)
            elif op is not None and len(args) > op[0]:
                # Where each result is named among the parameters: directly, or as a member
                # of a list parameter (once per occurrence).
                outs = op[1]
                params = args[: op[0]]
                members = [(p, lists[j][1]) for p, j in enumerate(params) if j in lists]
                for i in wrote:
                    if i in lists:
                        continue
                    at = [p for p, j in enumerate(params) if j == i]
                    for p, items in members:
                        at.extend([p] * items.count(i))
                    if not at or (len(at) == 1 and at[0] in outs):
                        define(i, pc)
        elif isinstance(a, DelegateCall):
            args = a.args
            outs = delegate_outputs[a.delegate_index] if a.delegate_index < len(delegate_outputs) else None
            if outs is None or not outs <= set(range(len(args))) or (lists and not no_list(args)):
                named = wrote = _expand(args, lists)
            else:
                # The backend writes its outputs (each whole, not read) and only reads the
                # rest: a value named once, as an output, is defined here.
                named = list(args)
                wrote = [i for k, i in enumerate(args) if k in outs]
                for i in wrote:
                    if args.count(i) == 1:
                        define(i, pc)
        elif isinstance(a, MoveCall):
            named = wrote = _expand((a.move_from, a.move_to), lists)
        elif isinstance(a, FreeCall):
            named = wrote = _expand((a.value_index,), lists)
        elif isinstance(a, JumpFalseCall):
            named = _expand((a.cond_value_index,), lists)
            straight = False
        else:
            named = []
            straight = False
        for i in named:
            ms = mentions.get(i)
            if ms is None:
                mentions[i] = {pc}
                first_mention[i] = pc
            else:
                ms.add(pc)
                if first_mention[i] > pc:
                    first_mention[i] = pc
        for i in wrote:
            ws = writers.get(i)
            if ws is None:
                writers[i] = {pc}
                first_write[i] = pc
            else:
                ws.add(pc)
                if first_write[i] > pc:
                    first_write[i] = pc
    written = set(writers) | set(_expand(cp.input_idx, lists))
    # (the sets as they are: nothing changes them from here on, and a copy of each as a
    # frozenset took 2 % of a load)
    return PlanUses(
        mentions=mentions,
        written=frozenset(written),
        outputs=frozenset(_expand(cp.output_idx, lists)),
        straight=straight,
        writers=writers,
        defines=defines,
        first_mention=first_mention,
        first_write=first_write,
        first_define=first_define,
    )


_Region = tuple[int, int, int]  # memory id, first byte, end byte


class _Storage:
    """Which planned values share memory, and where a straight-line plan reads and fully
    writes it.

    Positions: -1 is the copy of the inputs into their planned memory at the start of an
    execute, 0..n-1 the instructions, n the caller reading the outputs at its end. Executes
    repeat them in that order, so an interval between two positions may wrap around (a read
    early in the plan sees what the previous execute wrote last).

    Its hot loops run in C where ``orchestra.runtime._uses`` is built (the same answers; the
    Python code below is what runs without it, and where an input is of a shape the C code
    leaves to it).
    """

    def __init__(self, cp: CompiledPlan, uses: PlanUses, n: int) -> None:
        self.cp = cp
        self.uses = uses
        self.n = n
        self.inputs = frozenset(_expand(cp.input_idx, cp.lists))
        laid = None if _uses is None else _uses.layout(cp.slots)
        if laid is not None:
            regions, by_mem = laid
        else:
            regions = {}
            by_mem = {}
            for i, slot in enumerate(cp.slots):
                if slot is None:
                    continue
                size = slot.dtype.itemsize * slot.capacity
                regions[i] = (slot.memory_id, slot.offset, slot.offset + size)
                if size > 0:
                    by_mem.setdefault(slot.memory_id, []).append((slot.offset, slot.offset + size, i))
        self.regions: dict[int, _Region] = regions
        self.by_mem: dict[int, list[tuple[int, int, int]]] = by_mem
        # A tensor that is neither constant, planned nor an input holds whatever array an
        # instruction gave it (a view op's result, say): it may share memory with anything.
        mentions = uses.mentions
        self.opaque = any(i in mentions and i not in self.inputs for i in cp.runtime_tensors)
        self._overlapping: dict[int, list[int]] = {}
        self._same_bytes: dict[int, list[int]] | None = None
        self._whole_writes: dict[int, list[tuple[int, int, int]]] = {}
        # memory id -> its whole writes (position, first byte, end byte; index by (position,
        # value)) and which of them a dropped set leaves out (see _defs).
        # drop_unobserved tests values in a memory of more than this many values with numpy.
        self.numpy_from = 32
        self._reads: tuple[Mapping[int, AbstractSet[int]], int, dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]]] | None = None
        self._own: tuple[Mapping[int, AbstractSet[int]], int, set[tuple[int, int]], int, dict[int, tuple[np.ndarray, np.ndarray]]] | None = None
        self._mem_writes: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, dict[tuple[int, int], int], dict[int, Any]]] = {}
        self._mem_arrays: dict[int, tuple[np.ndarray, np.ndarray, list[int]]] = {}
        # (memory, first byte, end byte, position) found covered by prefetch_covered, for
        # the reads dict and dropped set it was given (their identities and sizes).
        self._covered_known: tuple[Any, int, Any, int, set[tuple[int, int, int, int]]] | None = None
        writes_at = None if _uses is None else _uses.writes_at(uses.writers, n)
        if writes_at is None:
            writes_at = [[] for _ in range(n)]
            for i, pcs in uses.writers.items():
                for pc in pcs:
                    writes_at[pc].append(i)
        self.writes_at: list[list[int]] = writes_at

    def static(self, i: int) -> bool:
        """A planned tensor of static shape (a write of it writes all its bytes)."""
        slot = self.cp.slots[i]
        return slot is not None and not slot.dynamic

    def overlap(self, i: int, j: int) -> bool:
        a, b = self.regions.get(i), self.regions.get(j)
        return a is not None and b is not None and a[0] == b[0] and a[1] < b[2] and b[1] < a[2]

    def overlapping(self, i: int) -> list[int]:
        """The planned values sharing a byte with planned value ``i`` (``i`` included)."""
        found = self._overlapping.get(i)
        if found is not None:
            return found
        r = self.regions.get(i)
        if r is None or r[2] <= r[1]:
            found = []
        else:
            m, a, b = r
            arrays = self._mem_arrays.get(m)
            if arrays is None:
                entries = self.by_mem.get(m, [])
                arrays = self._mem_arrays[m] = (
                    np.array([e[0] for e in entries], np.int64),
                    np.array([e[1] for e in entries], np.int64),
                    [e[2] for e in entries],
                )
            starts, ends, ids = arrays
            found = [ids[k] for k in np.flatnonzero((starts < b) & (ends > a)).tolist()]
        self._overlapping[i] = found
        return found

    def same_bytes(self) -> dict[int, list[int]]:
        """value -> its group (itself included) of values with the same bytes, dtype and
        element count, all static and laid out contiguously; only values in a group of two or
        more. Made once per plan."""
        found = self._same_bytes
        if found is None and _match is not None:  # (the loop below in C: 3 % of a transformer's load)
            found = self._same_bytes = _match.same_bytes(self.regions, self.cp.slots)
        if found is None:
            # (region, dtype) -> the plain values there.
            groups: dict[tuple[_Region, np.dtype], list[int]] = {}
            for j, r in self.regions.items():
                if r[2] > r[1] and self._plain(j):
                    groups.setdefault((r, self.cp.slots[j].dtype), []).append(j)  # type: ignore[union-attr]
            found = self._same_bytes = {j: g for g in groups.values() if len(g) > 1 for j in g}
        return found

    def aliases(self, i: int) -> list[int]:
        """Other values that are ``i`` seen with another shape (see same_bytes)."""
        group = self.same_bytes().get(i)
        return [] if group is None else [j for j in group if j != i]

    def whole_writes(self, d: int) -> list[tuple[int, int, int]]:
        """(position, first byte, end byte) of each write of all of value ``d``'s bytes: the
        instructions defining it and the copy-in (-1) of an input; none unless ``d`` is a
        static planned tensor."""
        found = self._whole_writes.get(d)
        if found is None:
            found = []
            if self.static(d):
                _, lo, hi = self.regions[d]
                found = [(w, lo, hi) for w in (*self.uses.defines.get(d, ()), *((-1,) if d in self.inputs else ()))]
            self._whole_writes[d] = found
        return found

    def _plain(self, i: int) -> bool:
        slot = self.cp.slots[i]
        return slot is not None and not slot.dynamic and (not slot.dim_order or slot.dim_order == tuple(range(len(slot.bound))))

    def written_between(self, i: int, start: int, stop: int, skip: frozenset[int] = frozenset()) -> bool:
        """True when an instruction strictly between ``start`` and ``stop`` (not in ``skip``)
        may write ``i`` or memory ``i`` shares."""
        for pc in range(start + 1, stop):
            if pc in skip:
                continue
            for w in self.writes_at[pc]:
                if w == i or self.overlap(w, i):
                    return True
        return False

    def _between(self, w: int, a: int, r: int) -> bool:
        """Whether position ``w`` comes strictly after ``a`` and strictly before ``r``,
        going forward from ``a`` (wrapping around the end of the execute)."""
        size = self.n + 2
        kw, kr = (w - a) % size, (r - a) % size
        return 0 < kw < (kr or size)

    def reads(self) -> dict[int, frozenset[int]]:
        """value -> positions that may read it, as the plan is written."""
        if _uses is not None:
            found = _uses.reads(self.uses.mentions, self.uses.defines, self.uses.outputs, self.n)
            if found is not None:
                return found
        defines = self.uses.defines
        out = {i: ms - defines[i] if i in defines else ms for i, ms in self.uses.mentions.items()}  # PlanUses.reads
        end = frozenset((self.n,))
        for i in self.uses.outputs:
            out[i] = out.get(i, frozenset()) | end
        return out

    def drop_unobserved(self, value: int, pc: int, reads: Mapping[int, AbstractSet[int]], dropped: set[tuple[int, int]]) -> bool:
        """Whether instruction ``pc`` may leave out its write of ``value`` without a read
        (``reads``: value -> positions) seeing a difference: every read of a byte of that
        memory is preceded, since ``pc``, by a write of all the bytes it reads (an
        instruction defining a static planned value, or the copy-in of a static planned
        input) that is not itself left out (``dropped``: (position, value))."""
        r = self.regions.get(value)
        if r is None:  # not planned: a Python reference of its own, named by index only
            return all(any(self._between(w, pc, p) and (w, value) not in dropped
                           for w in self.uses.defines.get(value, ()))
                       for p in reads.get(value, ()))
        m, lo_r, hi_r = r
        if hi_r <= lo_r:
            return True
        # A memory holding many values is tested with numpy (the same answers; the plain
        # test below is for small ones, and for a matrix _covered finds too large).
        if len(self.by_mem.get(m, ())) > self.numpy_from:
            known = self._covered_known
            if (known is not None and known[0] is reads and known[1] == len(reads) and known[2] is dropped
                    and known[3] == len(dropped) and (m, lo_r, hi_r, pc) in known[4]):
                return True
            covered = self._covered(m, lo_r, hi_r, pc, reads, dropped)
            if covered is not None:
                return covered
        near = self.overlapping(value)
        size = self.n + 2
        # The writes of whole values that still run, nearest after pc first: a read at p is
        # covered when the first of them (going forward from pc) that covers its bytes
        # comes before p (the same test as _between, in one pass).
        defs = sorted(((w - pc) % size, lo, hi) for d in near for w, lo, hi in self.whole_writes(d)
                      if (w, d) not in dropped)
        for a in near:
            _, a_lo, a_hi = self.regions[a]
            lo, hi = max(lo_r, a_lo), min(hi_r, a_hi)
            for p in reads.get(a, ()):
                kr = (p - pc) % size or size
                for kw, d_lo, d_hi in defs:
                    if kw >= kr:
                        return False
                    if kw > 0 and d_lo <= lo and hi <= d_hi:
                        break
                else:
                    return False
        return True

    def prefetch_covered(self, queries: Iterable[tuple[int, int]], reads: Mapping[int, AbstractSet[int]],
                         dropped: set[tuple[int, int]]) -> None:
        """Runs the first tests of ``_covered`` (no read of the bytes, or each read's own last
        write comes between) for many ``(value, pc)`` questions of drop_unobserved at once, one
        array expression per memory instead of a dozen small ones per question, and keeps
        those found covered for drop_unobserved (with these ``reads`` and ``dropped``; it asks
        ``_covered`` about the others, as before)."""
        by_m: dict[int, list[tuple[int, int, int]]] | None = None
        if _uses is not None and type(queries) is list:
            by_m = _uses.group(queries, self.regions, self.by_mem, self.numpy_from)
        if by_m is None:
            by_m = {}
            for value, pc in queries:
                r = self.regions.get(value)
                if r is None or r[2] <= r[1] or len(self.by_mem.get(r[0], ())) <= self.numpy_from:
                    continue  # drop_unobserved does not ask _covered about it
                by_m.setdefault(r[0], []).append((r[1], r[2], pc))
        known: set[tuple[int, int, int, int]] = set()
        size = self.n + 2
        for m, qs in by_m.items():
            rp, rlo, rhi, _ = self._mem_reads(m, reads)
            own, has_own = self._own_writes(m, reads, dropped)
            if _uses is not None and _uses.cover(known, m, qs, rp, rlo, rhi, own, has_own, size):
                continue  # (the same test, one query and one read at a time, in C)
            q = np.array(qs, np.int64).reshape(-1, 3)
            lo, hi, pc = q[:, 0:1], q[:, 1:2], q[:, 2:3]
            sel = (rlo < hi) & (rhi > lo)
            kr = (rp - (pc + 1)) % size + 1  # as _covered: distance from pc, 1..size
            ko = (own - pc) % size
            rest = sel & ~(has_own & (ko > 0) & (ko < kr))
            for k in (~rest.any(axis=1)).nonzero()[0].tolist():
                known.add((m, *qs[k]))
        self._covered_known = (reads, len(reads), dropped, len(dropped), known)

    def _covered(self, m: int, lo_r: int, hi_r: int, pc: int, reads: Mapping[int, AbstractSet[int]],
                 dropped: set[tuple[int, int]]) -> bool | None:
        """drop_unobserved's test for bytes [lo_r, hi_r) of memory ``m`` with numpy, for a
        value sharing memory with many: a read is covered when some write of a whole value
        that still runs covers its bytes and comes strictly after ``pc`` and strictly before
        it (forward from ``pc``, wrapping). None when the matrix would be too large."""
        size = self.n + 2
        rp, rlo, rhi, _ = self._mem_reads(m, reads)
        sel = ((rlo < hi_r) & (rhi > lo_r)).nonzero()[0]
        if not len(sel):
            return True
        # Most reads are covered by a write of all the bytes of the value they read (its
        # own, or a view's of it) between pc and them: a 1-D test against the last such
        # write before each read. Only the other reads (of values live across pc, typically
        # none) go through the test against every write.
        own, has_own = self._own_writes(m, reads, dropped)
        kr = (rp[sel] - (pc + 1)) % size + 1  # distance from pc, 1..size (0 is size)
        ko = (own[sel] - pc) % size
        rest = (~(has_own[sel] & (ko > 0) & (ko < kr))).nonzero()[0]
        if not len(rest):
            return True
        sel, kr = sel[rest], kr[rest]
        kw, dlo, dhi = self._defs(m, lo_r, hi_r, pc, dropped)
        if not len(kw):
            return False
        if len(sel) * len(kw) > 1 << 20:
            return None
        lo = np.maximum(rlo[sel], lo_r)[:, None]
        hi = np.minimum(rhi[sel], hi_r)[:, None]
        cover = (kw > 0) & (kw < kr[:, None]) & (dlo <= lo) & (hi <= dhi)
        return bool(cover.any(axis=1).all())

    def _mem_reads(self, m: int, reads: Mapping[int, AbstractSet[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
        """The reads (``reads``: value -> positions) of planned values of memory ``m`` as
        arrays (not to be written: shared by the callers): position, first and end byte of the
        value read, and (a list) the value read; once per ``reads`` dict (a caller changing a
        dict between calls must change its size)."""
        cached = self._reads
        if cached is None or cached[0] is not reads or cached[1] != len(reads):
            cached = self._reads = (reads, len(reads), {})
        found = cached[2].get(m)
        got = None if found is not None or _uses is None else _uses.mem_reads(self.by_mem.get(m, []), reads)
        if got is not None:
            found = cached[2][m] = (np.frombuffer(got[0], np.int64), np.frombuffer(got[1], np.int64),
                                    np.frombuffer(got[2], np.int64), got[3])
        if found is None:
            pos: list[int] = []
            lo: list[int] = []
            hi: list[int] = []
            val: list[int] = []
            for _, _, a in self.by_mem.get(m, []):
                ps = reads.get(a)
                if ps:
                    _, a_lo, a_hi = self.regions[a]
                    pos.extend(ps)
                    lo.extend((a_lo,) * len(ps))
                    hi.extend((a_hi,) * len(ps))
                    val.extend((a,) * len(ps))
            found = cached[2][m] = (np.array(pos, np.int64), np.array(lo, np.int64), np.array(hi, np.int64), val)
        return found

    def _own_writes(self, m: int, reads: Mapping[int, AbstractSet[int]], dropped: set[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
        """Per read of ``_mem_reads(m, reads)``: the position of the last write before it
        (going back from the read, wrapping around the execute) of all the bytes of the
        value it reads, by that value or by another with exactly its bytes (a view of it),
        not in ``dropped``; and whether there is one (arrays). Some such write comes
        strictly between a position and the read exactly when that last one does. Once per
        ``reads`` dict and ``dropped`` set (callers change their sizes between changes, as
        for _mem_reads and _defs)."""
        cached = self._own
        if (cached is None or cached[0] is not reads or cached[1] != len(reads) or cached[2] is not dropped
                or cached[3] != len(dropped)):
            cached = self._own = (reads, len(reads), dropped, len(dropped), {})
        found = cached[4].get(m)
        if found is None and _uses is not None:
            rp, rlo, rhi, _ = self._mem_reads(m, reads)
            # (rlo, rhi: each read value's bytes, regions[a][1:] below)
            got = _uses.own_writes(self.by_mem.get(m, []), rp, rlo, rhi, self.cp.slots, self.uses.defines, self.inputs,
                                   dropped)
            if got is not None:
                found = cached[4][m] = (np.frombuffer(got[0], np.int64), np.frombuffer(got[1], bool))
        if found is None:
            rp, _, _, val = self._mem_reads(m, reads)
            by_region: dict[tuple[int, int], set[int]] = {}
            for _, _, d in self.by_mem.get(m, []):
                for w, lo, hi in self.whole_writes(d):
                    if (w, d) not in dropped:
                        by_region.setdefault((lo, hi), set()).add(w)
            sorted_writes = {r: sorted(ws) for r, ws in by_region.items()}
            regions = self.regions
            own: list[int] = []
            has: list[bool] = []
            for a, p in zip(val, rp.tolist()):
                ws = sorted_writes.get(regions[a][1:])
                w = None
                if ws:
                    k = bisect.bisect_left(ws, p)
                    if k:
                        w = ws[k - 1]  # the last one before p
                    elif ws[-1] != p:
                        w = ws[-1]  # none before p: the last one of the previous execute
                own.append(-2 if w is None else w)
                has.append(w is not None)
            found = cached[4][m] = (np.array(own, np.int64), np.array(has, bool))
        return found

    def _defs(self, m: int, lo_r: int, hi_r: int, pc: int, dropped: set[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Distance from pc, first byte and end byte (arrays) of the writes of whole values
        in memory ``m`` that overlap bytes [lo_r, hi_r) and are not in ``dropped``. Which
        writes ``dropped`` leaves out is worked out once per set (a caller changing a set
        between calls must change its size)."""
        arrays = self._mem_writes.get(m)
        if arrays is None:
            entries = [(w, lo, hi, d) for _, _, d in self.by_mem.get(m, []) for w, lo, hi in self.whole_writes(d)]
            index = {(e[0], e[3]): k for k, e in enumerate(entries)}
            arrays = self._mem_writes[m] = (np.array([e[0] for e in entries], np.int64).reshape(-1),
                                            np.array([e[1] for e in entries], np.int64).reshape(-1),
                                            np.array([e[2] for e in entries], np.int64).reshape(-1), index, {})
        ws, los, his, index, gone = arrays
        mask = gone.get(id(dropped))
        if mask is None or mask[0] is not dropped or mask[2] != len(dropped):
            keep = np.ones(len(ws), bool)
            for key in dropped:
                k = index.get(key)
                if k is not None:
                    keep[k] = False
            gone.clear()
            mask = gone[id(dropped)] = (dropped, keep, len(dropped))
        sel = (mask[1] & (los < hi_r) & (his > lo_r)).nonzero()[0]
        return (ws[sel] - pc) % (self.n + 2), los[sel], his[sel]


@dataclass(frozen=True, slots=True)
class _Link:
    """One layout instruction (permute, view, clone...) in a chain feeding a matmul operand:
    instruction ``pc`` writes ``out`` from ``src``; instruction ``reader`` reads it as
    ``read`` (``out`` or a value sharing its memory), and ``ops`` turn ``src`` into
    ``read`` (("T", axes): transpose; ("R", shape): reshape; ("S", (dim, start, end, step)):
    basic slice)."""

    pc: int
    src: int
    out: int
    reader: int
    read: int
    ops: tuple[tuple[str, tuple[int, ...]], ...]


class _Matcher:
    """Pattern matching over one straight-line plan."""

    def __init__(self, cp: CompiledPlan, instructions: Sequence[Any], rets: Sequence[tuple[int, ...] | None],
                 uses: PlanUses) -> None:
        self.cp = cp
        self.plan = cp.plan
        self.values = cp.plan.values
        self.instructions = instructions
        self.rets = rets
        self.uses = uses
        self.storage = _Storage(cp, uses, len(instructions))
        self.op_names = cp.meta.operators  # qualified operator names, by index
        # constant copies' values by what they copy and how (an exporter copies the same few
        # scalars, a hardswish's 3 and 6, once per use): each computed once per plan
        self.copied: dict[tuple[Any, ...], np.ndarray | None] = {}
        self._group_defs: dict[int, list[tuple[int, int, int]]] = {}  # see producer
        # _conv_static's answer per convolution (asked when a fold is matched and again when
        # its step is built)
        self.conv_statics: dict[tuple[int, ...], Any] = {}
        # _NUMPY_OF as the plain dict the C tables take (the module's is read-only)
        self.to_numpy: dict[int, np.dtype] = dict(_NUMPY_OF)
        # layout_link's answer per instruction made in C on the first question (_ASK: the
        # Python code's to give), [] without it
        self._links: list[Any] | None = None
        self._ew_ops: list[Any] | None = None  # ew_op's, the same way
        # conv_folds' tables (conv, _read_conv_static, batch_norm_fold's checks), the same way
        self._folds: tuple[list[Any], list[Any], list[Any]] | None = None
        self._copies: list[Any] | None = None  # const_copies', the same way
        self._ew_ctx: tuple[Any, ...] | None = None  # ew_chain's inputs to the C walk, () without it
        # producer's sorted defines of each same-bytes group asked about, made in C by
        # _uses.layout_chain (value -> int64 pairs; one bytes object per group)
        self._chain_defs: dict[int, bytes] = {}

    # -- helpers ----------------------------------------------------------------------------
    def kernel_call(self, pc: int, name: str, nparams: int) -> tuple[tuple[int, ...], set[int]] | None:
        """(params, results) when instruction ``pc`` calls ``name`` with ``nparams``
        parameters; a result that is a list value counts as its members."""
        if pc >= len(self.instructions):
            return None
        a = self.instructions[pc]
        if not isinstance(a, KernelCall) or self.op_names[a.op_index] != name:
            return None
        kd = get_kernel(name)
        if kd is None or kd.num_params != nparams or len(a.args) < nparams:
            return None
        results: set[int] = set()
        for r in self.rets[pc] or ():
            lst = self.cp.lists.get(r)
            results.update((j for j in lst[1] if j >= 0) if lst is not None else (r,))
        return tuple(a.args[:nparams]), results

    def named_in(self, pc: int) -> list[int]:
        return _expand(self.instructions[pc].args, self.cp.lists)

    def tensor_meta(self, i: int) -> tuple[Any, ...] | None:
        v = self.values[i].val
        if not isinstance(v, Tensor):
            return None
        return (v.scalar_type, tuple(v.sizes), tuple(v.dim_order), v.shape_dynamism)

    def dtype(self, i: int) -> np.dtype | None:
        v = self.values[i].val
        return numpy_dtype(v.scalar_type) if isinstance(v, Tensor) else None

    def planned(self, i: int) -> bool:
        return self.cp.slots[i] is not None

    def constant(self, i: int) -> np.ndarray | None:
        """The constant tensor of value ``i`` (no instruction writes it), else None."""
        t = self.cp.template[i]
        if isinstance(t, np.ndarray) and self.cp.slots[i] is None and i not in self.uses.written:
            return t
        return None

    def is_none(self, i: int) -> bool:
        return isinstance(self.values[i].val, Null) and i not in self.uses.written

    def literal(self, i: int, kinds: tuple[type, ...]) -> Any:
        """The literal scalar of value ``i`` (no instruction writes it), else None."""
        v = self.values[i].val
        if isinstance(v, kinds) and i not in self.uses.written:
            return self.cp.template[i]
        return None

    def optional_int(self, i: int) -> int | None | bool:
        """A literal int, None for a literal None, else False."""
        if self.is_none(i):
            return None
        v = self.literal(i, (Int,))
        if v is None or isinstance(v, bool):
            return False
        return v

    # -- patterns ---------------------------------------------------------------------------
    def maxpool_values(self, pc: int) -> tuple[tuple[int, ...], int] | None:
        """(values-only params, out) when instruction ``pc`` is a max-pool whose indices are
        never read."""
        call = self.kernel_call(pc, _MAXPOOL, 8)
        if call is None:
            return None
        params, results = call
        out, ind = params[6], params[7]
        if out == ind or not results <= {out, ind} or ind in _expand(params[:7], self.cp.lists):
            return None
        if not self.uses.only_named_by(ind, (pc,)):
            return None
        # The values-only kernel takes the path the full kernel takes given an int64
        # indices array of out's shape; a planned indices tensor of out's sizes is one (the
        # interpreter resizes both together).
        im, om = self.tensor_meta(ind), self.tensor_meta(out)
        if (im is None or om is None or not self.planned(ind) or self.dtype(ind) != np.dtype(np.int64)
                or im[1] != om[1] or im[3] != om[3]):
            return None
        return params[:7], out

    def ew_op(self, pc: int) -> tuple[str, tuple[int, ...], int] | None:
        """(name, params, out) when instruction ``pc`` is an elementwise operation a chain
        may hold, writing only its planned out of static shape and float32/64 dtype.

        Answered for every instruction at once in C where it is built (``ew_ops``: a chain
        asks of each instruction two or three times)."""
        found = self._ew_ops
        if found is None:
            found = self._ew_ops = self.ew_ops()
        op = _answer(found, pc)
        return op if op is not _ASK else self.ew_op_py(pc)

    def ew_ops(self) -> list[Any]:
        """ew_op's answers made in C, per instruction (_ASK where the C code leaves the
        answer to the Python code); [] where the C code isn't built or declines the plan."""
        if _match is None or type(self.instructions) is not list or type(self.rets) is not list:
            return []
        params = []
        for name in self.op_names:
            nparams = _EW_UNARY.get(name) or _EW_BINARY.get(name)
            kd = None if nparams is None else get_kernel(name)
            params.append(None if kd is None or kd.num_params != nparams else (name, nparams))
        found = _match.ew_ops(self.instructions, self.rets, self.cp.lists, self.values, self.cp.template,
                              self.uses.written, self.cp.slots, params, self.to_numpy, _FOLD_DTYPES, KernelCall, Tensor, Int,
                              Null, _ASK)
        return [] if found is None else found

    def ew_op_py(self, pc: int) -> tuple[str, tuple[int, ...], int] | None:
        """ew_op's Python code."""
        if pc >= len(self.instructions):
            return None
        a = self.instructions[pc]
        if not isinstance(a, KernelCall):
            return None
        name = self.op_names[a.op_index]
        nparams = _EW_UNARY.get(name) or _EW_BINARY.get(name)
        if nparams is None:
            return None
        call = self.kernel_call(pc, name, nparams)
        if call is None:
            return None
        params, results = call
        out = params[-1]
        if results != {out} or out in _expand(params[:-1], self.cp.lists) or not self.storage.static(out):
            return None
        meta = self.static_tensor(out)
        if meta is None or meta[0] not in _FOLD_DTYPES:
            return None
        return name, params, out

    def ew_operand(self, i: int, dt: np.dtype, shape: tuple[int, ...]) -> bool:
        """Whether tensor value ``i`` may be an elementwise chain's other operand: ``dt``,
        static, broadcasting to ``shape``, constant or planned (memory known)."""
        meta = self.static_tensor(i)
        if meta is None or meta[0] != dt or len(meta[1]) > len(shape):
            return False
        # np.broadcast_shapes(meta[1], shape) == shape, without numpy: each of i's dims
        # (aligned from the right) is 1 or shape's.
        if not all(m == d or m == 1 for m, d in zip(reversed(meta[1]), reversed(shape))):
            return False
        return self.constant(i) is not None or self.storage.static(i)

    def ew_chain(self, pc: int, taken: set[int]) -> _EwChain | None:
        """The longest elementwise chain starting at instruction ``pc`` (at least two
        operations), or None. ``taken``: instructions other rewrites already cover.

        Walked in C where it is built (``_uses.ew_chain``: asked of nearly every instruction,
        a dozen Python calls each here); ``ew_chain_py`` answers what it leaves."""
        ctx = self._ew_ctx
        if ctx is None:
            ctx = self._ew_ctx = self.ew_context()
        if ctx:
            table = ctx[8]
            if 0 <= pc < len(table) and table[pc] is None:
                return None  # not an elementwise operation (most instructions): no C call
            found = _match_chains.ew_chain(ctx, pc, taken)  # type: ignore[union-attr]
            if found is not _ASK:
                return None if found is None else _EwChain(*found)
        return self.ew_chain_py(pc, taken)

    def ew_context(self) -> tuple[Any, ...]:
        """What ``_uses.ew_chain`` reads of this plan (ew_ops' table included), or () where
        the C code isn't built, is switched off or declined the table."""
        if _match is None or _match_chains is None:
            return ()
        table = self._ew_ops
        if table is None:
            table = self._ew_ops = self.ew_ops()
        if not table:
            return ()
        return (self.instructions, self.cp.lists, self.values, self.cp.template, self.uses.written, self.cp.slots,
                self.uses.mentions, self.uses.outputs, table, self.op_names, frozenset(_EW_UNARY),
                _EW_ORDERED, _EW_SKIPPABLE, _MAX_SKIPS, self.to_numpy, np.ndarray, KernelCall, Tensor, Int, Null,
                Double, _ASK)

    def ew_chain_py(self, pc: int, taken: set[int]) -> _EwChain | None:
        """ew_chain's Python code."""
        first = self.ew_op(pc)
        if first is None or pc in taken:
            return None
        name, params, out = first
        dt, shape = self.static_tensor(out)  # type: ignore[misc]
        # The running value enters as the first tensor operand of out's dtype and shape.
        if name in _EW_UNARY:
            x = params[0]
        else:
            cands = [k for k in (0, 1) if self.static_tensor(params[k]) == (dt, shape)]
            if not cands or (cands[0] == 1 and name in _EW_ORDERED):
                return None
            x = params[cands[0]]
        if self.static_tensor(x) != (dt, shape) or not (self.constant(x) is not None or self.storage.static(x)):
            return None
        ops: list[tuple[int, str, tuple[Any, ...], int]] = []
        cur, cur_pc = x, -1
        p = pc
        skips = 0
        while p < len(self.instructions):
            op = self.ew_op(p) if p not in taken else None
            spec = None if op is None else self.ew_spec(op, cur, cur_pc, x, dt, shape)
            if spec is None:
                if ops and skips < _MAX_SKIPS and self.ew_skippable(p, {x, cur}):
                    skips += 1
                    p += 1
                    continue
                break
            if cur_pc >= 0 and not self.uses.only_named_by(cur, (cur_pc, p)):
                break
            ops.append((p, op[0], spec, op[2]))  # type: ignore[index]
            cur, cur_pc = op[2], p  # type: ignore[index]
            skips = 0
            p += 1
        if len(ops) < 2:
            return None
        return _EwChain(x, tuple(ops), dt)

    def ew_skippable(self, pc: int, chain_values: set[int]) -> bool:
        a = self.instructions[pc]
        if not isinstance(a, KernelCall) or self.op_names[a.op_index] not in _EW_SKIPPABLE:
            return False
        return not (set(self.named_in(pc)) & chain_values)

    def ew_spec(self, op: tuple[str, tuple[int, ...], int], cur: int, cur_pc: int, x: int, dt: np.dtype,
                shape: tuple[int, ...]) -> tuple[Any, ...] | None:
        """How operation ``op`` applies to the running value ``cur`` (("u", name, lo, hi) or
        ("b", name, other value, cur is the right operand)), or None when it can't join."""
        name, params, out = op
        if self.static_tensor(out) != (dt, shape):
            return None
        named = _expand(params[:-1], self.cp.lists)
        if cur_pc >= 0 and named.count(cur) != 1:
            return None
        if name in _EW_UNARY:
            if params[0] != cur:
                return None
            lo = hi = None
            if len(params) == 4:
                lo, hi = self.ew_bound(params[1]), self.ew_bound(params[2])
                if lo is False or hi is False or (lo is None and hi is None):
                    return None
            return ("u", name, lo, hi)
        if len(params) == 4:
            alpha = self.literal(params[2], (Int, Double))
            if alpha is None or isinstance(alpha, bool) or alpha != 1:
                return None
        a, b = params[0], params[1]
        if cur_pc < 0:  # the first operation: the running value is x
            right = b == x and a != x
        else:
            right = b == cur
            if (a == cur) == right:
                return None
        other = a if right else b
        if right and name in _EW_ORDERED and cur_pc < 0:
            return None
        if other != x and not self.ew_operand(other, dt, shape):
            return None
        if other == x and cur_pc < 0:
            return None  # x op x
        return ("b", name, other, right)

    def ew_bound(self, i: int) -> float | int | None | bool:
        """A clamp bound: a literal number (not NaN), None for a literal None, else False."""
        if self.is_none(i):
            return None
        v = self.literal(i, (Int, Double))
        if v is None or isinstance(v, bool) or v != v:
            return False
        return v

    def conv(self, pc: int) -> tuple[tuple[int, ...], int] | None:
        """(params, out) when instruction ``pc`` is a convolution writing only its planned out.

        Answered for every instruction at once in C where it is built (``conv_folds``: asked
        of every instruction, twice)."""
        found = _answer(self._conv_tables()[0], pc)
        return found if found is not _ASK else self.conv_py(pc)

    def _conv_tables(self) -> tuple[list[Any], list[Any], list[Any]]:
        found = self._folds
        if found is None:
            found = self._folds = self.conv_folds()
            # _conv_static's answers, for the convolutions the table answers
            for conv, static in zip(found[0], found[1]):
                if conv is not None and conv is not _ASK and static is not _ASK:
                    self.conv_statics[conv[0]] = static
        return found

    def conv_folds(self) -> tuple[list[Any], list[Any], list[Any]]:
        """(conv's answers, _read_conv_static's for those convolutions' params, batch_norm_fold's
        checks (``bn_fold_checks``) of the next instruction with them), made in C, per
        instruction (_ASK where the C code leaves the answer to the Python code; None where
        there is no convolution); ([], [], []) where the C code isn't built or declines the plan."""
        if (_match is None or _match_folds is None or type(self.instructions) is not list
                or type(self.rets) is not list):
            return [], [], []
        codes = []
        for name in self.op_names:
            code = 1 if name == _CONV else 2 if name == _BN else None
            kd = None if code is None else get_kernel(name)
            codes.append(None if kd is None or kd.num_params != 10 else code)
        found = _match_folds.conv_folds(self.instructions, self.rets, self.cp.lists, self.values, self.cp.template,
                                        self.uses.written, self.cp.slots, self.uses.mentions, self.uses.outputs, codes,
                                        _FOLD_DTYPES, self.to_numpy, np.ndarray, KernelCall, Tensor, Int, Null, Bool, Double,
                                        _ASK)
        return ([], [], []) if found is None else found

    def copy_checks(self, pc: int) -> tuple[Any, ...] | None:
        """What _constant_copy checks before it computes the copy's value: (operator name, the
        constant, non_blocking's literal, the dim order (None or a list), out, out's dtype and
        sizes, the instructions reading out), or None.

        Answered for every instruction at once in C where it is built (``const_copies``)."""
        found = self._copies
        if found is None:
            found = self._copies = self.const_copies()
        c = _answer(found, pc)
        return c if c is not _ASK else _copy_checks_py(self, pc)

    def copy_candidates(self) -> Iterable[int]:
        """The instructions copy_checks may pass (all where the C table is not built)."""
        found = self._copies
        if found is None:
            found = self._copies = self.const_copies()
        if not found:
            return range(len(self.instructions))
        return [pc for pc, c in enumerate(found) if c is not None]

    def const_copies(self) -> list[Any]:
        """copy_checks' answers made in C, per instruction (_ASK where the C code leaves the
        answer to the Python code); [] where the C code isn't built or declines the plan."""
        if (_match is None or _match_folds is None or type(self.instructions) is not list
                or type(self.rets) is not list):
            return []
        copy_ops: list[tuple[str, bool] | None] = []
        nparams: list[int | None] = []
        for name in self.op_names:
            kd = get_kernel(name)
            nparams.append(None if kd is None else kd.num_params)
            ok = name in _CONST_COPIES and kd is not None and kd.num_params == 4
            copy_ops.append((name, name == "aten::_to_copy.out") if ok else None)
        uses = self.uses
        found = _match_folds.const_copies(self.instructions, self.rets, self.cp.lists, self.values, self.cp.template,
                                          uses.written, self.cp.slots, uses.mentions, uses.writers, uses.outputs,
                                          self.storage.inputs, copy_ops, nparams, self.to_numpy, np.ndarray, KernelCall,
                                          DelegateCall, Tensor, Int, Null, Bool, _ASK)
        return [] if found is None else found

    def conv_py(self, pc: int) -> tuple[tuple[int, ...], int] | None:
        """conv's Python code."""
        call = self.kernel_call(pc, _CONV, 10)
        if call is None:
            return None
        params, results = call
        out = params[9]
        if not results <= {out} or out in _expand(params[:9], self.cp.lists) or not self.planned(out):
            return None
        if self.tensor_meta(out) is None:
            return None
        return params, out

    def batch_norm_fold(self, pc: int, conv_params: tuple[int, ...],
                        y: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray | None] | None:
        """(out0, W', b', None) when instruction ``pc`` is an inference batch norm of the
        convolution output ``y`` (written by instruction ``pc - 1``) that can be folded;
        (out0, W, b', scale) where the planned convolution applies the scale to its sums
        (``scales_in_product``: W is the file's weight, not copied)."""
        checked = self.bn_fold_checks(pc, conv_params, y)
        if checked is None:
            return None
        o0, w, b, gamma, beta, mean, var, eps, x_sizes = checked
        static = _conv_static(self, conv_params)
        copy = not (w.dtype == np.float32 and static is not None and scales_in_product(x_sizes, w.shape, *static))
        folded = fold_batch_norm(w, b, gamma, beta, mean, var, float(eps), copy)
        return None if folded is None else (o0, *folded)

    def bn_fold_checks(self, pc: int, conv_params: tuple[int, ...], y: int) -> tuple[Any, ...] | None:
        """What batch_norm_fold checks before its arithmetic: (out0, W, b, gamma, beta, mean,
        var, eps, the convolution input's sizes) (constants, None for an absent vector), or None.

        From conv_folds' table where it answers for convolution ``pc - 1`` with these params."""
        convs, _, folds = self._conv_tables()
        if 1 <= pc <= len(convs):
            conv = convs[pc - 1]
            if conv is not None and conv is not _ASK and conv[0] == conv_params and conv[1] == y:
                found = folds[pc - 1]
                if found is not _ASK:
                    return found
        return self.bn_fold_checks_py(pc, conv_params, y)

    def bn_fold_checks_py(self, pc: int, conv_params: tuple[int, ...], y: int) -> tuple[Any, ...] | None:
        """bn_fold_checks' Python code."""
        call = self.kernel_call(pc, _BN, 10)
        if call is None:
            return None
        params, results = call
        x, gamma_i, beta_i, mean_i, var_i, _momentum, eps_i, o0, o1, o2 = params
        if x != y or self.named_in(pc).count(y) != 1 or not self.uses.only_named_by(y, (pc - 1, pc)):
            return None
        if len({o0, o1, o2}) != 3 or not results <= {o0, o1, o2} or y in (o0, o1, o2):
            return None
        reads = _expand(params[:7], self.cp.lists)
        if o0 in reads or o1 in reads or o2 in reads or pc - 1 in self.uses.mentions.get(o0, ()):
            return None
        if not (self.uses.only_named_by(o1, (pc,)) and self.uses.only_named_by(o2, (pc,))):
            return None
        if not self.planned(o0) or self.tensor_meta(o0) != self.tensor_meta(y):
            return None
        # The convolution's constants.
        w = self.constant(conv_params[1])
        if w is None or w.dtype not in _FOLD_DTYPES or w.ndim < 3 or not w.shape[0]:
            return None
        dt = w.dtype
        oc = w.shape[0]
        if self.dtype(conv_params[0]) != dt or self.dtype(y) != dt:
            return None
        sizes = self.tensor_meta(y)[1]  # type: ignore[index]
        if len(sizes) != w.ndim or sizes[1] != oc:
            return None
        if self.literal(conv_params[6], (Bool,)) is not False:
            return None  # transposed, or not a literal

        def vec(i: int, optional: bool) -> np.ndarray | None | bool:
            if optional and self.is_none(i):
                return None
            c = self.constant(i)
            if c is None or c.dtype != dt or c.shape != (oc,):
                return False
            return c

        b, gamma, beta = vec(conv_params[2], True), vec(gamma_i, True), vec(beta_i, True)
        mean, var = vec(mean_i, False), vec(var_i, False)
        if any(v is False for v in (b, gamma, beta, mean, var)):
            return None
        eps = self.literal(eps_i, (Double, Int))
        if eps is None or isinstance(eps, bool):
            return None
        x_meta = self.tensor_meta(conv_params[0])  # (a tensor: its dtype is dt)
        return o0, w, b, gamma, beta, mean, var, eps, x_meta[1]  # type: ignore[index]

    # -- layout chains into matmuls ---------------------------------------------------------
    def int_list(self, i: int) -> list[int] | None:
        """The literal ints of IntList value ``i`` (no instruction writes it or a member)."""
        lst = self.cp.lists.get(i)
        if lst is None or lst[0] or i in self.uses.written:
            return None
        out = []
        for j in lst[1]:
            v = self.literal(j, (Int,)) if j >= 0 else None
            if v is None or isinstance(v, bool):
                return None
            out.append(int(v))
        return out

    def static_tensor(self, i: int) -> tuple[np.dtype, tuple[int, ...]] | None:
        """(dtype, sizes) of a tensor value of static shape."""
        v = self.values[i].val
        if not isinstance(v, Tensor) or v.shape_dynamism != 0:
            return None
        dt = numpy_dtype(v.scalar_type)
        return None if dt is None else (dt, tuple(v.sizes))

    def layout_link(self, pc: int) -> tuple[int, int, tuple[tuple[str, tuple[int, ...]], ...]] | None:
        """(src, out, ops) when instruction ``pc`` only rearranges ``src`` into its planned
        ``out`` (same dtype, static shapes, literal arguments): ``ops`` turn src into out.

        Answered for every instruction at once in C where it is built (``layout_links``:
        a transformer asks a few hundred times, each a dozen Python calls here)."""
        links = self._links
        if links is None:
            links = self._links = self.layout_links()
        found = _answer(links, pc)
        return found if found is not _ASK else self.layout_link_py(pc)

    def layout_links(self) -> list[Any]:
        """layout_link's answers made in C, per instruction (_ASK where the C code leaves the
        answer to the Python code); [] where the C code isn't built or declines the plan."""
        if _match is None or type(self.instructions) is not list or type(self.rets) is not list:
            return []
        kinds = []
        for name in self.op_names:
            nparams = _LAYOUT_OPS.get(name)
            kd = None if nparams is None else get_kernel(name)
            kinds.append(None if kd is None or kd.num_params != nparams else (_LAYOUT_KINDS[name], nparams))
        found = _match.layout_links(self.instructions, self.rets, self.cp.lists, self.values, self.cp.template,
                                    self.uses.written, self.storage.regions, kinds, self.to_numpy, KernelCall, Tensor, Int,
                                    Null, _ASK)
        return [] if found is None else found

    def layout_link_py(self, pc: int) -> tuple[int, int, tuple[tuple[str, tuple[int, ...]], ...]] | None:
        """layout_link's Python code."""
        a = self.instructions[pc] if pc < len(self.instructions) else None
        if not isinstance(a, KernelCall):
            return None
        name = self.op_names[a.op_index]
        nparams = _LAYOUT_OPS.get(name)
        call = None if nparams is None else self.kernel_call(pc, name, nparams)
        if call is None:
            return None
        params, results = call
        src, out = params[0], params[-1]
        if results != {out} or out in _expand(params[:-1], self.cp.lists) or out not in self.storage.regions:
            return None
        sm, om = self.static_tensor(src), self.static_tensor(out)
        if sm is None or om is None or sm[0] != om[0] or self.storage.overlap(src, out):
            return None
        shape, ndim = sm[1], len(sm[1])
        ops: tuple[tuple[str, tuple[int, ...]], ...] = ()
        if name == "aten::permute_copy.out":
            dims = self.int_list(params[1])
            if dims is None or len(dims) != ndim or not all(-ndim <= d < ndim for d in dims):
                return None
            axes = tuple(d % ndim for d in dims)
            if sorted(axes) != list(range(ndim)):
                return None
            ops = (("T", axes),)
        elif name == "aten::transpose_copy.int_out":
            d0, d1 = self.literal(params[1], (Int,)), self.literal(params[2], (Int,))
            if d0 is None or d1 is None or isinstance(d0, bool) or isinstance(d1, bool):
                return None
            if ndim:
                if not (-ndim <= d0 < ndim and -ndim <= d1 < ndim):
                    return None
                axes_l = list(range(ndim))
                axes_l[d0 % ndim], axes_l[d1 % ndim] = axes_l[d1 % ndim], axes_l[d0 % ndim]
                ops = (("T", tuple(axes_l)),)
        elif name == "aten::t_copy.out":
            if ndim > 2:
                return None
            ops = (("T", tuple(reversed(range(ndim)))),)
        elif name in ("aten::squeeze_copy.dims_out", "aten::squeeze_copy.dim_out", "aten::unsqueeze_copy.out"):
            # Only size-1 dims come or go: a reshape to out's (static) sizes.
            if [d for d in shape if d != 1] != [d for d in om[1] if d != 1]:
                return None
            ops = (("R", tuple(om[1])),)
        elif name == "aten::expand_copy.out":
            if tuple(om[1]) != tuple(shape) or self.int_list(params[1]) is None:
                return None
        elif name == "aten::slice_copy.Tensor_out":
            dim, step = self.literal(params[1], (Int,)), self.literal(params[4], (Int,))
            start, end = self.optional_int(params[2]), self.optional_int(params[3])
            if (dim is None or step is None or start is False or end is False or isinstance(dim, bool)
                    or isinstance(step, bool) or step <= 0 or not ndim or not -ndim <= dim < ndim):
                return None
            ops = (("S", (dim % ndim, start, end, step)),)
        elif name in ("aten::view_copy.out", "aten::_unsafe_view.out"):
            size = self.int_list(params[1])
            n = math.prod(shape)
            if size is None or size.count(-1) > 1 or any(d < -1 for d in size):
                return None
            known = math.prod([d for d in size if d != -1])
            if -1 in size:
                if known == 0 or n % known:
                    return None
                size = [n // known if d == -1 else d for d in size]
            ops = (("R", tuple(size)),)
        if _apply_shape(shape, ops) != om[1]:
            return None
        return src, out, ops

    def producer(self, value: int, reader: int) -> tuple[int, int] | None:
        """(pc, defined value) of the last instruction before ``reader`` defining ``value``
        or a value that is it seen with another shape (``_Storage.aliases``)."""
        st = self.storage
        group = st.same_bytes().get(value)
        if group is None:
            ws = [w for w in self.uses.defines.get(value, ()) if w < reader]
            return (max(ws), value) if ws else None
        # The defines of the group's values, sorted by (position, place in the group): the
        # last one before reader, the value itself first among several at one position,
        # else the first in the group's order (as a scan of value then its aliases finds).
        defs = self._group_defs.get(id(group))
        if defs is None:
            defs = sorted((w, k, x) for k, x in enumerate(group) for w in self.uses.defines.get(x, ()))
            self._group_defs[id(group)] = defs
        k = bisect.bisect_left(defs, (reader,))
        if not k:
            return None
        w = defs[k - 1][0]
        first = k - 1
        while first and defs[first - 1][0] == w:
            first -= 1
        run = defs[first:k]
        return (w, value) if any(x == value for _, _, x in run) else (w, run[0][2])

    def layout_chain(self, pc: int, k: int) -> list[_Link]:
        """The layout instructions producing operand ``k`` of instruction ``pc``, nearest
        first, each read only through the next (checked later).

        Walked in C where it is built (a transformer asks a few hundred times, each a few
        producer and layout_link questions here); layout_chain_py is the same walk."""
        links = self._links
        if links is None:
            links = self._links = self.layout_links()
        if links and _match is not None and _match_chains is not None:
            found = _match_chains.layout_chain(self.instructions[pc].args[k], pc, _MAX_LINKS, links,
                                               self.storage.same_bytes(), self._chain_defs, self.uses.defines,
                                               self.values, self.cp.template, self.to_numpy, Tensor, _Link, _ASK)
            if found is not None and found is not _ASK:
                return found
        return self.layout_chain_py(pc, k)

    def layout_chain_py(self, pc: int, k: int) -> list[_Link]:
        """layout_chain's Python code."""
        a = self.instructions[pc]
        links: list[_Link] = []
        cur, reader = a.args[k], pc
        while len(links) < _MAX_LINKS:
            prod = self.producer(cur, reader)
            if prod is None:
                break
            link = self.layout_link(prod[0])
            if link is None or link[1] != prod[1]:
                break
            src, out, ops = link
            if out != cur:
                ops = (*ops, ("R", self.static_tensor(cur)[1]))  # type: ignore[index]
            links.append(_Link(prod[0], src, out, reader, cur, ops))
            cur, reader = src, prod[0]
        return links

    def chain_sources(self, links: Sequence[_Link], pc: int, skip: AbstractSet[int] = frozenset()) -> tuple[int, ...]:
        """The lengths m for which the reader at ``pc`` (a matmul, a delegate) can read the
        source of ``links[:m]`` in place of their result: a constant, or a planned tensor or
        an input nothing writes in between (each link read once by the next, not a plan
        output, its result not written again before its reader reads it). ``skip``: layout
        copies of the reader's other operands that are left out too (their writes don't run).

        Answered in C where it is built (grow and rejoin ask for every chain again each time
        another operand's length changes); chain_sources_py is the same checks."""
        if links and _match is not None and _match_chains is not None:
            st = self.storage
            found = _match_chains.chain_sources(links, pc, skip, _Link, self.instructions, self.cp.lists, self.values,
                                                self.cp.template, self.uses.written, self.cp.slots, self.uses.outputs,
                                                st.inputs, st.regions, st.writes_at, self.to_numpy, Tensor, np.ndarray,
                                                _ASK)
            if found is not None and found is not _ASK:
                return found
        return self.chain_sources_py(links, pc, skip)

    def chain_sources_py(self, links: Sequence[_Link], pc: int, skip: AbstractSet[int] = frozenset()) -> tuple[int, ...]:
        """chain_sources' Python code."""
        st = self.storage
        valid: list[int] = []
        pcs: set[int] = set(skip)
        for m, ln in enumerate(links, 1):
            if (self.named_in(ln.reader).count(ln.read) != 1 or ln.out in self.uses.outputs
                    or st.written_between(ln.out, ln.pc, ln.reader)):
                break  # every longer prefix holds this link too
            pcs.add(ln.pc)
            src = ln.src
            if self.constant(src) is not None:
                valid.append(m)
            elif (self.static_tensor(src) is not None and (src in st.regions or src in st.inputs)
                  and not st.written_between(src, ln.pc, pc, frozenset(pcs))):
                valid.append(m)
        return tuple(valid)


def fold_batch_norm(
    w: np.ndarray,
    b: np.ndarray | None,
    gamma: np.ndarray | None,
    beta: np.ndarray | None,
    mean: np.ndarray,
    var: np.ndarray,
    eps: float,
    copy: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
    """(W', b', None): the convolution weight and bias with inference batch norm folded in,
    read-only, C-contiguous, new arrays of ``w``'s dtype. The per-channel scale and shift are
    computed in float64 and rounded once to ``w``'s dtype; the weight is multiplied by the
    rounded scale in ``w``'s dtype (as PyTorch's own conv-bn fusion does: within one rounding
    of the float64 product, and a third of its time on a large model's weights). None when a
    folded value is not finite (inf/NaN would not propagate as in the unfused pair).

    Without ``copy``: (``w`` itself, b', the rounded scale), for a convolution that applies
    the scale to its sums (``plan_conv2d``'s 1x1 products): no copy of the weight is made
    (its pages are a large model's load time) and the convolution computes the unfused pair's
    operations reassociated, so a non-finite weight propagates as there; None when the scale
    or the shift is not finite."""
    # float32 vectors: the compiled kernel computes the same float64 operations in one call
    folded = bn_fold_f32(var, mean, gamma, beta, b, eps) if w.dtype == np.float32 else None
    if folded is not None:
        s_w, b2, vectors_finite = folded
    else:
        f64 = np.float64
        with np.errstate(all="ignore"):
            scale = 1.0 / np.sqrt(var.astype(f64) + eps)
            if gamma is not None:
                scale = gamma.astype(f64) * scale
            shift = -mean.astype(f64) if b is None else b.astype(f64) - mean.astype(f64)
            shift = shift * scale
            if beta is not None:
                shift = shift + beta.astype(f64)
            s_w = scale.astype(w.dtype)
            b2 = np.ascontiguousarray(shift.astype(w.dtype))
        vectors_finite = bool(np.isfinite(b2).all() and np.isfinite(s_w).all())
    # (a scale that is not finite makes its row of W' not finite either: inf, or NaN times 0)
    if not vectors_finite:
        return None
    s_w.setflags(write=False)
    b2.setflags(write=False)
    if not copy:
        return w, b2, s_w
    w2 = np.empty(w.shape, w.dtype)
    # The compiled kernel multiplies and checks in one pass over its threads (a large
    # model's fresh weight pages are most of the fold's time); numpy otherwise.
    finite = scale_rows_into(w, s_w, w2)
    if finite is None:
        with np.errstate(all="ignore"):
            np.multiply(w, s_w.reshape((-1,) + (1,) * (w.ndim - 1)), out=w2)
    # A non-finite element of w makes its product non-finite too (inf * 0 is NaN), so
    # checking w2 checks w.
    if finite is False or (finite is None and not np.isfinite(w2).all()):
        return None
    w2.setflags(write=False)
    return w2, b2, None


def _conv_bn_step(cp: CompiledPlan, params: tuple[int, ...], out: int, w: np.ndarray, b: np.ndarray | None,
                  what: str, label: str, act: str | None = None,
                  static: tuple[tuple[int, int], tuple[int, int], tuple[int, int], int] | None = None,
                  spare: int | None = None, scale: np.ndarray | None = None) -> Step:
    """One step running ``aten::convolution.out`` with the (folded) constant weight ``w`` and
    bias ``b`` into value ``out`` (the batch norm's output, or with ``act`` the output of the
    activation that alone reads it). ``static``: the literal (stride, padding, dilation,
    groups) of a 2-d convolution: the step then plans the call once per input shape
    (``plan_conv2d``: checks and choices made once, a few numpy calls per execute).
    ``spare``: a planned value of ``out``'s shape and dtype that no read observes after this
    step (the convolution's own output, left out by the fold): where ``out`` shares memory
    with the input (the plan reuses the input's memory for a later result) and is no larger
    than it, the planned call writes there and the result is copied to ``out``, rather than
    copying the whole input aside first (a fresh array every execute). ``scale``: the
    weight's per-output-channel scale, which the planned 1x1 product applies to its sums
    (``w`` then the file's weight, not a copy); the unplanned kernel gets a scaled copy of
    ``w``, made the first time it runs."""
    conv = convolution_act  # aten::convolution.out's kernel, with conv2d's activation
    x = params[0]
    lists = tuple(i for i in params if i in cp.lists)
    planned: dict[tuple[int, ...], Any] = {}  # input shape -> plan_conv2d's run (False: none)
    may_share = np.may_share_memory
    copyto = np.copyto
    # (x, out, whether the spare is used) last decided, as weak references (the same arrays
    # every execute of a Method; a closed Method's are not kept alive); one tuple, replaced whole
    last: list[Any] = [None]
    scaled: list[np.ndarray] = []  # w times scale, for the unplanned kernel (made once)

    # Everything the step reads is bound as a default argument, not captured: a closure
    # makes one cell per captured name (22 here), kept for the plan's life and walked by the
    # collector's pass after every load; defaults are one tuple, and read as fast locals.
    def step(vals: list[Any], m: Method, out: int = out, x: int = x, static: Any = static, planned: dict = planned,
             w: np.ndarray = w, b: Any = b, act: Any = act, scale: Any = scale, spare: Any = spare,
             lists: tuple[int, ...] = lists, last: list[Any] = last, scaled: list[np.ndarray] = scaled,
             what: str = what, params: tuple[int, ...] = params, conv: Any = conv, may_share: Any = may_share,
             copyto: Any = copyto, ref: Any = weakref.ref, nd: type = np.ndarray) -> None:
        o = vals[out]
        xv = vals[x]
        if static is not None and type(xv) is nd:
            run = planned.get(xv.shape)
            if run is None:
                run = planned[xv.shape] = plan_conv2d(xv.shape, xv.dtype, w, b, *static, act, scale) or False
            if run:
                if spare is not None:  # whether out shares the input's memory (see last)
                    p = last[0]
                    if p is not None and p[0]() is xv and p[1]() is o:
                        use = p[2]
                    else:
                        use = type(o) is nd and o.nbytes <= xv.nbytes and bool(may_share(xv, o))
                        last[0] = (ref(xv), ref(o), use) if type(o) is nd else None
                    if use:
                        t = vals[spare]
                        if not may_share(xv, t) and run(xv, t) is not None:
                            copyto(o, t)
                            return
                if run(xv, o) is not None:
                    return
        if lists:
            m._refresh_lists(lists)
        if scale is not None and not scaled:
            scaled.append(scale_weight(w, scale))
        _, _, _, st, pd, dl, tr, op, g, _ = params
        res = conv(xv, scaled[0] if scaled else w, b, vals[st], vals[pd], vals[dl], vals[tr], vals[op], vals[g], o,
                   act)
        if res is not o:
            m._write(out, res, what)

    step.__qualname__ = label
    return step


def _conv_static(mt: _Matcher, params: tuple[int, ...]) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int], int] | None:
    """The literal (stride, padding, dilation, groups) of 2-d convolution ``params`` (not
    transposed), else None."""
    known = mt.conv_statics.get(params, False)
    if known is not False:
        return known
    found = mt.conv_statics[params] = _read_conv_static(mt, params)
    return found


def _read_conv_static(mt: _Matcher, params: tuple[int, ...]) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int], int] | None:
    _, w, _, st, pd, dl, tr, _, g, _ = params
    meta = mt.static_tensor(w)
    if meta is None or len(meta[1]) != 4 or mt.literal(tr, (Bool,)) is not False:
        return None
    lists = [mt.int_list(i) for i in (st, pd, dl)]
    groups = mt.literal(g, (Int,))
    if any(v is None or len(v) != 2 for v in lists) or groups is None or isinstance(groups, bool):
        return None
    (s0, s1), (p0, p1), (d0, d1) = lists  # type: ignore[misc]
    return (s0, s1), (p0, p1), (d0, d1), int(groups)


def _apply_shape(shape: tuple[int, ...], ops: Sequence[tuple[str, tuple[int, ...]]]) -> tuple[int, ...] | None:
    """The shape ``ops`` turn ``shape`` into, or None when one of them doesn't apply."""
    for kind, arg in ops:
        if kind == "T":
            if sorted(arg) != list(range(len(shape))):
                return None
            shape = tuple(shape[d] for d in arg)
        elif kind == "S":
            dim = arg[0]
            if dim >= len(shape):
                return None
            n = len(range(*slice(*arg[1:]).indices(shape[dim])))
            shape = shape[:dim] + (n,) + shape[dim + 1:]
        else:
            if math.prod(arg) != math.prod(shape):
                return None
            shape = tuple(arg)
    return shape


def _simplify(shape: tuple[int, ...], ops: Sequence[tuple[str, tuple[int, ...]]]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """``ops`` with consecutive transposes composed, consecutive reshapes merged and the
    ones that change nothing left out."""
    out: list[tuple[str, tuple[int, ...]]] = []
    for kind, arg in ops:
        if out and out[-1][0] == kind and kind != "S":
            prev = out.pop()[1]
            arg = tuple(prev[d] for d in arg) if kind == "T" else arg
        out.append((kind, arg))
    simple: list[tuple[str, tuple[int, ...]]] = []
    for kind, arg in out:
        if kind == "T" and arg == tuple(range(len(arg))):
            continue
        if kind == "R" and arg == shape:
            continue
        simple.append((kind, arg))
        shape = _apply_shape(shape, [(kind, arg)])  # type: ignore[assignment]
    return tuple(simple)


def _view_fn(ops: Sequence[tuple[str, tuple[int, ...]]]) -> Callable[[np.ndarray], np.ndarray]:
    """x -> ``ops`` applied to x: numpy views (a reshape of a transposed view copies when
    numpy can't express it as a view)."""
    fns = [operator.itemgetter((slice(None),) * arg[0] + (slice(*arg[1:]),)) if kind == "S"
           else operator.methodcaller("transpose" if kind == "T" else "reshape", arg) for kind, arg in ops]
    if not fns:
        return lambda x: x
    if len(fns) == 1:
        return fns[0]

    def apply(x: np.ndarray) -> np.ndarray:
        for f in fns:
            x = f(x)
        return x

    return apply


def _views_step(cp: CompiledPlan, fn: Callable[..., Any], params: tuple[int, ...], out: int,
                views: dict[int, tuple[int, Callable[[np.ndarray], np.ndarray]]], what: str, label: str) -> Step:
    """A step calling the matmul kernel ``fn`` on ``params``, each operand ``k`` in
    ``views`` read as ``f(values[source])`` for ``views[k] == (source, f)``: sources whose
    view can't be made once per Method (an input, or a view numpy can only make by copying)."""
    static = getattr(cp, "static_lists", frozenset())
    lists = tuple(i for i in params if i in cp.lists and i not in static)
    getter = operator.itemgetter(*(views[k][0] if k in views else p for k, p in enumerate(params)))
    fns = tuple((k, f) for k, (_, f) in views.items())

    # Bound as default arguments, not captured (as _conv_bn_step: one tuple instead of a
    # cell per name for the collector to walk after every load; read as fast locals).
    def step(vals: list[Any], m: Method, lists: tuple[int, ...] = lists, getter: Callable[..., Any] = getter,
             fns: tuple[tuple[int, Callable[..., Any]], ...] = fns, fn: Callable[..., Any] = fn, out: int = out,
             what: str = what) -> None:
        if lists:
            m._refresh_lists(lists)
        a = list(getter(vals))
        for k, f in fns:
            a[k] = f(a[k])
        res = fn(*a)
        if res is not vals[out] and res is not None:
            m._write(out, res, what)

    step.__qualname__ = label
    return step


def _stays_a_view(cp: CompiledPlan, src: int, fn: Callable[[np.ndarray], np.ndarray]) -> bool:
    """Whether ``fn`` of planned tensor ``src`` of static shape is a view of its memory
    (then made once per Method, it follows every write of ``src``)."""
    from ._method import _strided_view

    slot = cp.slots[src]
    if slot is None or slot.dynamic:
        return False
    flat = np.empty(math.prod(slot.bound), slot.dtype)
    return bool(flat.size) and np.shares_memory(fn(_strided_view(flat, slot.bound, slot.dim_order)), flat)


class _Views:
    """The views of one plan's layout chains' sources, each answer kept by what it depends on
    alone (a source's shape and the chain's ops; for _stays_a_view also its slot's layout and
    dtype): a transformer's blocks read the same views, each made once (``_memo_views``)."""

    def __init__(self, cp: CompiledPlan) -> None:
        self.cp = cp
        self.memo: dict[tuple[Any, ...], Any] = {}

    def of(self, shape: tuple[int, ...], raw: tuple[tuple[str, tuple[int, ...]], ...],
           ) -> tuple[tuple[tuple[str, tuple[int, ...]], ...], Callable[[np.ndarray], np.ndarray]]:
        """_simplify(shape, raw) and _view_fn of it (one function per ops: it holds no state)."""
        if not _memo_views:
            ops = _simplify(shape, raw)
            return ops, _view_fn(ops)
        key = ("ops", shape, raw)
        found = self.memo.get(key)
        if found is None:
            ops = _simplify(shape, raw)
            fn = self.memo.get(("fn", ops))
            if fn is None:
                fn = self.memo[("fn", ops)] = _view_fn(ops)
            found = self.memo[key] = (ops, fn)
        return found

    def stays(self, src: int, ops: tuple[tuple[str, tuple[int, ...]], ...], fn: Callable[[np.ndarray], np.ndarray]) -> bool:
        """_stays_a_view(cp, src, fn), ``fn`` being _view_fn(ops)."""
        slot = self.cp.slots[src]
        if not _memo_views or slot is None or slot.dynamic:
            return _stays_a_view(self.cp, src, fn)
        key = ("view", tuple(slot.bound), tuple(slot.dim_order), slot.dtype, ops)
        found = self.memo.get(key)
        if found is None:
            found = self.memo[key] = _stays_a_view(self.cp, src, fn)
        return found


@dataclass(frozen=True, slots=True)
class _EwChain:
    """An elementwise chain: input ``x``; ``ops`` in order."""

    x: int
    ops: tuple[tuple[int, str, tuple[Any, ...], int], ...]  # (pc, operator, spec, out)
    dtype: np.dtype

    @property
    def out(self) -> int:
        return self.ops[-1][3]

    @property
    def pcs(self) -> tuple[int, ...]:
        return tuple(op[0] for op in self.ops)

    def reads(self) -> list[tuple[int, int]]:
        """(value, pc): the chain's input and other operands, where they are read as written."""
        found = [(self.x, self.ops[0][0])]
        found += [(spec[2], pc) for pc, _, spec, _ in self.ops if spec[0] == "b"]
        return found


_UFUNCS = MappingProxyType({
    "aten::add.out": np.add,
    "aten::sub.out": np.subtract,
    "aten::mul.out": np.multiply,
    "aten::div.out": np.true_divide,
})


def _ew_fn(name: str, spec: tuple[Any, ...], dt: np.dtype) -> Callable[[np.ndarray, np.ndarray, list[Any]], None]:
    """``f(src, buf, vals)``: one chain operation from ``src`` into ``buf`` (may be src)."""
    if spec[0] == "b":
        _, _, other, right = spec
        uf = _UFUNCS[name]
        if name == "aten::div.out":
            def div(src: np.ndarray, buf: np.ndarray, vals: list[Any]) -> None:
                with np.errstate(divide="ignore", invalid="ignore"):
                    if right:
                        np.true_divide(vals[other], src, out=buf)
                    else:
                        np.true_divide(src, vals[other], out=buf)
            return div
        if right:
            return lambda src, buf, vals: uf(vals[other], src, out=buf)
        return lambda src, buf, vals: uf(src, vals[other], out=buf)
    _, _, lo, hi = spec
    if name in ("aten::relu.out", "aten::clamp.out", "aten::hardtanh.out"):
        a = np.array(0 if name == "aten::relu.out" else (-np.inf if lo is None else lo), dt)
        b = np.array(np.inf if hi is None else hi, dt)
        return lambda src, buf, vals: clip_ufunc(src, a, b, out=buf)
    if name == "aten::sigmoid.out":
        one = np.array(1, dt)

        def sigmoid(src: np.ndarray, buf: np.ndarray, vals: list[Any]) -> None:
            with np.errstate(over="ignore"):
                np.negative(src, out=buf)
                np.exp(buf, out=buf)
            np.add(buf, one, out=buf)
            np.divide(one, buf, out=buf)
        return sigmoid
    kernel_fn = {"aten::silu.out": silu_out, "aten::hardswish.out": hardswish_out,
                 "aten::hardsigmoid.out": hardsigmoid_out}[name]

    def call(src: np.ndarray, buf: np.ndarray, vals: list[Any]) -> None:
        res = kernel_fn(src, buf)
        if res is not buf:
            np.copyto(buf, res)
    return call


def _add_relu_fn(add: Callable[[np.ndarray, np.ndarray, list[Any]], None],
                 relu: Callable[[np.ndarray, np.ndarray, list[Any]], None],
                 other: int) -> Callable[[np.ndarray, np.ndarray, list[Any]], None]:
    """A chain's add of value ``other`` then relu as one compiled pass where it applies (the
    same bits: the float32 sum, then relu keeping NaN and -0.0), else the two operations."""

    def add_relu(src: np.ndarray, buf: np.ndarray, vals: list[Any]) -> None:
        if not add_f32_into(src, vals[other], buf, relu=True):
            add(src, buf, vals)
            relu(buf, buf, vals)
    return add_relu


def _is_scalar(const: Callable[[int], np.ndarray | None], i: Any, value: float) -> bool:
    """Whether value ``i`` is a constant holding one element equal to ``value``."""
    c = const(i) if isinstance(i, int) else None
    return c is not None and c.size == 1 and float(c.reshape(-1)[0]) == value


def _hardswish_len(ops: Sequence[tuple[str, tuple[Any, ...]]], x: int,
                   const: Callable[[int], np.ndarray | None]) -> int:
    """How many leading ``ops`` of a chain over ``x`` spell x * clamp(x + 3, 0, 6) / 6 (an
    exported hardswish: add, clamp(s) or hardtanh, mul by x, div), else 0."""
    if len(ops) < 4 or ops[0][0] != "aten::add.out" or ops[0][1][0] != "b" or not _is_scalar(const, ops[0][1][2], 3):
        return 0
    k, lo, hi = 1, None, None
    while k < len(ops) and ops[k][0] in ("aten::clamp.out", "aten::hardtanh.out") and k < 3:
        a, b = ops[k][1][2], ops[k][1][3]
        if a is not None:
            lo = a if lo is None else max(lo, a)
        if b is not None:
            hi = b if hi is None else min(hi, b)
        k += 1
    if k == 1 or lo != 0 or hi != 6 or (k == 3 and (ops[1][1][2], ops[2][1][3]) != (0, 6)):
        return 0  # clamp(lo) then clamp(hi): the order numpy's path takes as well
    if (k + 2 > len(ops) or ops[k][0] != "aten::mul.out" or ops[k][1][:3] != ("b", "aten::mul.out", x)
            or ops[k + 1][0] != "aten::div.out" or ops[k + 1][1][3] or not _is_scalar(const, ops[k + 1][1][2], 6)):
        return 0
    return k + 2


def _ew_step(chain: _EwChain, out: int, label: str, const: Callable[[int], np.ndarray | None] | None = None) -> Step:
    """One step running ``chain`` in place in value ``out`` (planned, static). ``const(i)``
    is value i's constant array, if it is one (to recognise a hardswish spelt out)."""
    x, dt = chain.x, chain.dtype
    ops = [(name, spec) for _, name, spec, _ in chain.ops]
    fns: list[Callable[[np.ndarray, np.ndarray, list[Any]], None]] = []
    k = 0
    if const is not None and dt == np.float32 and (n_hs := _hardswish_len(ops, x, const)):
        # hardswish as exported: one pass of the compiled kernel where it is built (the same
        # float32 operations in the same order, bit-identical), else hardswish_out's numpy path
        fns.append(_ew_fn("aten::hardswish.out", ("u", "aten::hardswish.out", None, None), dt))
        k = n_hs
    while k < len(ops):
        name, spec = ops[k]
        # add a same-shape tensor, then relu (a residual connection): one compiled pass split
        # over the kernels' threads where it applies (add_f32_into), the two ufuncs otherwise
        if (dt == np.float32 and name == "aten::add.out" and k + 1 < len(ops) and ops[k + 1][0] == "aten::relu.out"):
            fns.append(_add_relu_fn(_ew_fn(name, spec, dt), _ew_fn(*ops[k + 1], dt), spec[2]))
            k += 2
            continue
        # sigmoid(x) then mul by x: silu, one pass fewer.
        if (k == 0 and name == "aten::sigmoid.out" and len(ops) > 1 and ops[1][0] == "aten::mul.out"
                and ops[1][1][2] == x):
            fns.append(_ew_fn("aten::silu.out", ("u", "aten::silu.out", None, None), dt))
            k += 2
            continue
        fns.append(_ew_fn(name, spec, dt))
        k += 1
    first, rest = fns[0], tuple(fns[1:])

    # defaults, not cells (see _views_step)
    def step(vals: list[Any], m: Method, first: Callable[..., None] = first,
             rest: tuple[Callable[..., None], ...] = rest, x: int = x, out: int = out) -> None:
        buf = vals[out]
        first(vals[x], buf, vals)
        for f in rest:
            f(buf, buf, vals)

    step.__qualname__ = label
    return step


@dataclass(slots=True)
class _Chains:
    """The layout chains feeding the operands of one matmul instruction, or the arguments
    of one DelegateCall (``name`` is then ``_DELEGATE``): ``chains[k]`` is operand ``k``'s,
    nearest first; ``use[k]`` how many of its links are folded now."""

    pc: int
    name: str
    params: tuple[int, ...]
    chains: dict[int, list[_Link]]
    valid: dict[int, tuple[int, ...]]  # lengths whose links and source pass the static checks
    use: dict[int, int]


def _ew_static_ok(mt: _Matcher, ew: _EwChain, skip: frozenset[int] = frozenset()) -> bool:
    """The memory checks of an elementwise chain that don't depend on other rewrites: its
    operands are not written between where they were read and the chain's last instruction
    (except by the chain's own dropped writes), and its output, written from the first
    operation on, shares no memory with those that later operations read. ``skip``:
    instructions that won't run (constant copies folded away).

    Answered in C where it is built (``_uses.ew_static_ok``: a dozen Python calls per operand
    here); ``_ew_static_ok_py`` answers what it leaves."""
    if _match_static is not None:
        st = mt.storage
        found = _match_static.ew_static_ok(
            (mt.cp.template, mt.cp.slots, mt.uses.written, st.regions, st.writes_at, np.ndarray, _ASK), ew.x, ew.ops, skip)
        if found is not _ASK:
            return found  # type: ignore[no-any-return]
    return _ew_static_ok_py(mt, ew, skip)


def _ew_static_ok_py(mt: _Matcher, ew: _EwChain, skip: frozenset[int] = frozenset()) -> bool:
    """_ew_static_ok's Python code."""
    st = mt.storage
    pcs = ew.pcs
    last = pcs[-1]
    out = ew.out
    first = pcs[0]
    excl = skip.union(pcs)  # (once, not per operand: skip holds every folded copy of the plan)
    for v, p in ew.reads():
        if mt.constant(v) is not None:
            continue
        if not st.static(v):
            return False
        # The first operation reads its operands in one ufunc pass (numpy copies an input
        # overlapping its out first); later ones read them after out has been written.
        if p != first and (v == out or st.overlap(v, out)):
            return False
        if st.written_between(v, p, last, excl):
            return False
    return True


_CONST_COPIES = ("dim_order_ops::_to_dim_order_copy.out", "aten::_to_copy.out")
_CONST_COPY_MAX_SIZE = 4096  # elements of a folded constant copy (the exporter's scalars)


def _constant_copy(mt: _Matcher, pc: int) -> tuple[int, np.ndarray, tuple[int, ...]] | None:
    """(out, value, readers) when instruction ``pc`` converts a constant (``_to_copy`` /
    ``_to_dim_order_copy``, literal non_blocking, no memory format / the identity dim order) into a
    planned static out of at most ``_CONST_COPY_MAX_SIZE`` elements that only it writes,
    not a method output, read afterwards only by kernel calls or delegates naming it directly
    (not in a list; a delegate then only reads it: nothing else writes out): ``value`` is
    what the copy writes, computed here, read-only."""
    found = mt.copy_checks(pc)
    if found is None:
        return None
    name, const, nb_value, order, out, dtype, sizes, readers = found
    key = (name, const.dtype.str, const.shape, const.tobytes(), nb_value, None if order is None else tuple(order),
           dtype, sizes)
    if key in mt.copied:
        value = mt.copied[key]
    else:
        value = mt.copied[key] = _copied_value(name, const, nb_value, order, dtype, sizes)
    return None if value is None else (out, value, readers)


def _copy_checks_py(mt: _Matcher, pc: int) -> tuple[Any, ...] | None:
    """_Matcher.copy_checks' Python code."""
    a = mt.instructions[pc]
    if not isinstance(a, KernelCall) or mt.op_names[a.op_index] not in _CONST_COPIES:
        return None
    for name in _CONST_COPIES:
        call = mt.kernel_call(pc, name, 4)
        if call is not None:
            break
    else:
        return None
    (src, nb, fmt, out), results = call
    const = mt.constant(src)
    meta = mt.static_tensor(out)
    if const is None or meta is None or results != {out} or mt.literal(nb, (Bool,)) is None:
        return None
    # No memory format / dim order, or (_to_dim_order_copy) the identity dim order.
    order = None if mt.is_none(fmt) else mt.int_list(fmt) if name != "aten::_to_copy.out" else False
    if order is not None and order != list(range(len(meta[1]))):
        return None
    st, uses = mt.storage, mt.uses
    if (not st.static(out) or out in uses.outputs or out in st.inputs
            or uses.writers.get(out) != frozenset({pc}) or math.prod(meta[1]) > _CONST_COPY_MAX_SIZE):
        return None
    readers = tuple(sorted(uses.mentions.get(out, frozenset()) - {pc}))
    for r in readers:
        a = mt.instructions[r]
        if r < pc:
            return None
        if isinstance(a, DelegateCall):  # (only the copy writes out: the delegate just reads it)
            if mt.named_in(r).count(out) != list(a.args).count(out):
                return None
            continue
        if not isinstance(a, KernelCall):
            return None
        kd = get_kernel(mt.op_names[a.op_index])
        if kd is None or mt.named_in(r).count(out) != list(a.args[: kd.num_params]).count(out):
            return None
    return name, const, mt.cp.template[nb], order, out, meta[0], meta[1], readers


def _copied_value(name: str, const: np.ndarray, nb: Any, order: list[int] | None, dtype: np.dtype,
                  shape: tuple[int, ...]) -> np.ndarray | None:
    """What constant copy kernel ``name`` writes into an out of ``dtype`` and ``shape``,
    read-only; None where the kernel refuses (the step as written reports it, at execute)."""
    kd = get_kernel(name)
    assert kd is not None
    value = np.empty(shape, dtype)
    try:
        res = kd.fn(const, nb, order, value)
    except (OrchestraError, ValueError, TypeError):
        return None
    if res is not value:
        if not isinstance(res, np.ndarray) or res.shape != value.shape:
            return None
        np.copyto(value, res, casting="unsafe")
    value.setflags(write=False)
    return value


def _substituted(ew: _EwChain, sub: dict[int, int]) -> _EwChain:
    """``ew`` with the other operands in ``sub`` read from their substitutes."""
    ops = tuple((p, name, ("b", spec[1], sub.get(spec[2], spec[2]), spec[3]) if spec[0] == "b" else spec, o)
                for p, name, spec, o in ew.ops)
    return _EwChain(ew.x, ops, ew.dtype)


def _drop_constant_copy(ccs: dict[int, Any], ews: dict[int, _EwChain], pc: int) -> None:
    """Drops constant copy ``pc`` and the elementwise chains that step over it (they were
    checked assuming it doesn't run)."""
    del ccs[pc]
    for last, ew in list(ews.items()):
        if ew.pcs[0] < pc < last:
            del ews[last]


def _gelu_scratch(mt: _Matcher, pc: int) -> tuple[int, int, int] | None:
    """(x, out, elements) when instruction ``pc`` is a gelu the scratch step may run: exact
    (literal "none"), float32 of static shape past the kernel's table size, out planned of
    the same shape and dtype, x constant or planned of static shape (an ndarray of that
    shape at every execute)."""
    call = mt.kernel_call(pc, _GELU, 3)
    if call is None:
        return None
    (x, approx, out), results = call
    if results != {out} or x == approx or out == approx or mt.literal(approx, (String,)) != "none":
        return None
    meta = mt.static_tensor(out)
    if meta is None or meta[0] != np.dtype(np.float32) or mt.static_tensor(x) != meta:
        return None
    n = math.prod(meta[1])
    if n <= GELU_TABLE_MAX_SIZE or not mt.storage.static(out):
        return None
    if mt.constant(x) is None and not mt.storage.static(x):
        return None
    return x, out, n


def _new_scratch(size: int, _value: Any) -> np.ndarray:
    """A Method's float32 scratch buffer of ``size`` elements (a derived value)."""
    return np.empty(size, np.float32)


def _gelu_step(x: int, out: int, scratch: int, label: str) -> Step:
    """One step running the float32 gelu fit of value ``x`` into ``out`` in scratch value
    ``scratch``."""

    # defaults, not cells (see _views_step)
    def step(vals: list[Any], m: Method, x: int = x, out: int = out, scratch: int = scratch,
             fit: Callable[..., Any] = gelu_fit_f32_into) -> None:
        fit(vals[x], vals[out], vals[scratch])

    step.__qualname__ = label
    return step


_SE_UNARY = MappingProxyType({  # a plain step's operator -> its squeeze_excite_into ops
    "aten::relu.out": ((SE_CLAMP, 0.0, math.nan),),
    "aten::sigmoid.out": ((SE_SIGMOID, 0.0, 0.0),),
    "aten::silu.out": ((SE_SIGMOID, 0.0, 0.0), (SE_MULX, 0.0, 0.0)),
})


def _se_chain_ops(chain: _EwChain, const: Callable[[int], np.ndarray | None]) -> list[tuple[float, float, float]] | None:
    """An elementwise chain as squeeze_excite_into ops, or None when an operation has none
    (its other operands must be one-element float32 constants, or the chain's input)."""
    ops: list[tuple[float, float, float]] = []
    for _, name, spec, _ in chain.ops:
        if spec[0] == "u":
            if name == "aten::clamp.out":
                lo, hi = spec[2], spec[3]
                ops.append((SE_CLAMP, math.nan if lo is None else float(lo), math.nan if hi is None else float(hi)))
            elif name in _SE_UNARY:
                ops.extend(_SE_UNARY[name])
            else:
                return None
            continue
        _, _, other, right = spec
        if other == chain.x:
            if name != "aten::mul.out":
                return None
            ops.append((SE_MULX, 0.0, 0.0))
            continue
        c = const(other)
        if c is None or c.dtype != np.float32 or c.size != 1:
            return None
        v = float(c.reshape(()))
        code = {"aten::add.out": SE_ADD, "aten::mul.out": SE_MUL, "aten::div.out": None if right else SE_DIV}.get(name)
        if code is None:
            return None
        ops.append((code, v, 0.0))
    return ops


def _fuse_squeeze_excite(mt: _Matcher, steps: list[Step], spans: list[tuple[int, ...]], rewrites: list[Rewrite],
                         info: dict[int, tuple[str, Any]], const: Callable[[int], np.ndarray | None]) -> None:
    """Six consecutive steps computing a squeeze-and-excite block become one step calling
    ``squeeze_excite_into``: a mean over the planes of x (N, C, H, W) into s (N, C, 1, 1), a
    planned 1x1 convolution of s into t1 (N, R, 1, 1), an activation (relu, silu, or an
    elementwise chain of such operations and scalar constants) into t2, a planned 1x1
    convolution of t2 into t3 (N, C, 1, 1), a gate (sigmoid, or a chain: the exported
    hardsigmoid) into g, and x * g into out. Every value is static, planned and float32. The
    fused step writes every value the six wrote, in their order, and reads x again for the
    product after writing g, so it is the six steps run at once, whatever memory the plan
    gave those values; where squeeze_excite_into declines (an operand that doesn't fit, the
    kernels not built), it runs the six steps."""
    f32 = np.dtype(np.float32)
    st = mt.storage

    def meta(v: int) -> tuple[int, ...] | None:
        m = mt.static_tensor(v)
        return m[1] if m is not None and m[0] == f32 and st.static(v) else None

    def plain(k: int, name: str) -> tuple[int, ...] | None:
        d = info.get(k)
        kd = get_kernel(name)
        if d is None or d[0] != "plain" or kd is None:
            return None
        call = mt.kernel_call(d[1], name, kd.num_params)
        if call is None or call[1] != {call[0][-1]}:
            return None
        return call[0]

    def unary(k: int, src: int) -> tuple[int, list[tuple[float, float, float]]] | None:
        """(out, ops) of step k, an activation of value src."""
        d = info.get(k)
        if d is not None and d[0] == "ew":
            chain = d[1]
            ops = _se_chain_ops(chain, const) if chain.x == src else None
            return None if ops is None else (chain.out, ops)
        for name, ops_ in _SE_UNARY.items():
            p = plain(k, name)
            if p is not None:
                return (p[1], list(ops_)) if p[0] == src else None
        return None

    def dense(k: int, src: int, rows: int, cols: int) -> tuple[int, np.ndarray, np.ndarray] | None:
        """(out, w (rows x cols), b) of step k, a planned 1x1 convolution of value src."""
        d = info.get(k)
        if d is None or d[0] != "conv":
            return None
        params, out, w, b, static = d[1]
        if params[0] != src or static != ((1, 1), (0, 0), (1, 1), 1) or w.dtype != f32 or w.shape != (rows, cols, 1, 1):
            return None
        if b is None:
            b = np.zeros(rows, f32)
        elif b.dtype != f32 or b.shape != (rows,):
            return None
        return out, np.ascontiguousarray(w.reshape(rows, cols)), np.ascontiguousarray(b)

    def match(k: int) -> tuple[tuple[int, ...], tuple[np.ndarray, ...]] | None:
        p = plain(k, "aten::mean.out")
        if p is None:
            return None
        x, dim, keepdim, dtype, s = p
        xm, sm = meta(x), meta(s)
        if xm is None or sm is None or len(xm) != 4 or sm != (xm[0], xm[1], 1, 1):
            return None
        axes = mt.int_list(dim)
        if (axes is None or sorted(a % 4 for a in axes) != [2, 3] or len(axes) != 2
                or mt.literal(keepdim, (Bool,)) is not True or not mt.is_none(dtype)):
            return None
        n, c = xm[0], xm[1]
        d1 = info.get(k + 1)
        if d1 is None or d1[0] != "conv":
            return None
        r = d1[1][2].shape[0]
        c1 = dense(k + 1, s, r, c)
        if c1 is None or meta(c1[0]) != (n, r, 1, 1):
            return None
        a1 = unary(k + 2, c1[0])
        if a1 is None or meta(a1[0]) != (n, r, 1, 1):
            return None
        c2 = dense(k + 3, a1[0], c, r)
        if c2 is None or meta(c2[0]) != (n, c, 1, 1):
            return None
        a2 = unary(k + 4, c2[0])
        if a2 is None or meta(a2[0]) != (n, c, 1, 1):
            return None
        p = plain(k + 5, "aten::mul.out")
        if p is None or {p[0], p[1]} != {x, a2[0]} or p[0] == p[1] or meta(p[2]) != xm:
            return None
        values = (x, p[2], s, c1[0], a1[0], c2[0], a2[0])
        ops1 = np.array(a1[1], f32).reshape(-1)
        ops2 = np.array(a2[1], f32).reshape(-1)
        return values, (c1[1], c1[2], c2[1], c2[2], ops1, ops2)

    found: list[tuple[int, tuple[int, ...], tuple[np.ndarray, ...]]] = []
    k = 0
    while k + 6 <= len(steps):  # info is by these indices: every match first, then the rewrite
        hit = match(k)
        if hit is None:
            k += 1
            continue
        found.append((k, *hit))
        k += 6
    fused: list[Rewrite] = []
    for k, values, consts in reversed(found):  # from the end: the earlier indices stay valid
        span = tuple(sorted({p for sp in spans[k:k + 6] for p in sp}))
        label = f"step[{span[-1]}] squeeze-and-excite (mean + 1x1 convolution + activation + 1x1 convolution + gate + mul)"
        steps[k:k + 6] = [_se_step(values, consts, tuple(steps[k:k + 6]), label)]
        spans[k:k + 6] = [span]
        fused.append(Rewrite("squeeze_excite", span))
    rewrites.extend(reversed(fused))


def _se_step(values: tuple[int, ...], consts: tuple[np.ndarray, ...], as_written: tuple[Step, ...], label: str) -> Step:
    """One step running a squeeze-and-excite block (``_fuse_squeeze_excite``): values (x, out,
    s, t1, t2, t3, g), constants (w1, b1, w2, b2, ops1, ops2); the six steps as written where
    the compiled call declines."""
    for a in consts:
        a.setflags(write=False)

    # The fourteen operands are bound as defaults, not captured: fourteen cells (and the
    # closure's tuple) for the collector to walk after every load become one tuple.
    def step(vals: list[Any], m: Method, values: tuple[int, ...] = values, consts: tuple[np.ndarray, ...] = consts,
             as_written: tuple[Step, ...] = as_written, se: Callable[..., bool] = squeeze_excite_into) -> None:
        x, out, s, t1, t2, t3, g = values
        if not se(vals[x], vals[out], vals[s], vals[t1], vals[t2], vals[t3], vals[g], *consts):
            for f in as_written:
                f(vals, m)

    step.__qualname__ = label
    return step


def optimize_steps(
    cp: CompiledPlan,
    instructions: Sequence[Any],
    where: Sequence[tuple[int, int]],
    rets: Sequence[tuple[int, ...] | None],
    plain: Sequence[Step],
    kernel_step: Callable[[Callable[..., Any], tuple[int, ...], tuple[int, ...], str, str], Step],
    uses: PlanUses | None = None,
) -> tuple[list[Step], list[tuple[int, ...]], list[Rewrite], list[tuple[int, Any]]]:
    """The optimised steps of a plan, which instructions each covers, the rewrites made, and
    the values the steps read beyond the plan's own.

    ``plain[pc]`` is the step of instruction ``pc`` as written; ``where[pc]`` is its
    (chain, index in chain); ``kernel_step(fn, params, rets, what, label)`` binds a kernel
    step like the interpreter's own. Derived value ``j`` (value index ``len(plan.values) + j``)
    is ``(-1, array)``, a constant, or ``(source, fn)``: ``fn(values[source])``, made once per
    Method (a view of a planned tensor of static shape, which a Method never rebinds).
    ``uses`` is the plan's use analysis when the caller already made it.
    """
    steps: list[Step] = []
    spans: list[tuple[int, ...]] = []
    rewrites: list[Rewrite] = []
    if uses is None:
        uses = analyse_uses(cp, instructions, rets)
    n = len(instructions)
    if not uses.straight:
        return list(plain), [(pc,) for pc in range(n)], rewrites, []
    mt = _Matcher(cp, instructions, rets, uses)
    st = mt.storage
    delegate_outputs: Sequence[frozenset[int] | None] = getattr(cp, "delegate_outputs", ())

    # 1. Candidates: patterns whose own instructions pass the checks.
    # conv pc -> (conv params, BN out, W', b', the scale the convolution applies or None)
    folds: dict[int, tuple[tuple[int, ...], int, np.ndarray, np.ndarray, np.ndarray | None]] = {}
    pools: dict[int, tuple[tuple[int, ...], int]] = {}  # pc -> (values-only params, out)
    mms: dict[int, _Chains] = {}  # matmul pc -> the layout chains of its operands
    ews: dict[int, _EwChain] = {}  # last pc -> elementwise chain
    claimed: set[int] = set()
    # Constant copies folded to constants their readers read instead (the copies don't run).
    ccs = {} if st.opaque else {pc: c for pc in mt.copy_candidates() if (c := _constant_copy(mt, pc)) is not None}
    claimed.update(ccs)
    cc_skip = frozenset(ccs)
    folded_bytes = 0

    # Values a layout instruction defines, and those on their bytes: the only delegate
    # arguments with a chain to look for (most are other delegates' outputs).
    layout_made: set[int] = set()
    if any(isinstance(a, DelegateCall) for a in instructions):
        groups = st.same_bytes()
        for a in instructions:
            if isinstance(a, KernelCall) and mt.op_names[a.op_index] in _LAYOUT_OPS and a.args:
                out = a.args[-1]
                layout_made.update(groups.get(out, (out,)))

    def reader_valid(c: _Chains, k: int) -> tuple[int, ...]:
        """The lengths of operand ``k``'s chain its reader can read the source of (a
        delegate's: with the copies of its other arguments' chains in use left out too)."""
        if c.name != _DELEGATE:  # a matmul's operands are judged one at a time
            return mt.chain_sources(c.chains[k], c.pc)
        skip = frozenset(ln.pc for k2, m2 in c.use.items() if k2 != k for ln in c.chains[k2][:m2])
        valid = mt.chain_sources(c.chains[k], c.pc, skip)
        if not valid:
            return valid
        # The delegate writes its outputs while it runs: one may lie on the source (the plan
        # reuses a source's memory once the copy has read it) only where the backend reads
        # all of this argument before it writes that output.
        a = instructions[c.pc]
        outs = delegate_outputs[a.delegate_index] or frozenset()
        links = c.chains[k]
        return tuple(m for m in valid
                     if all(not (o == links[m - 1].src or st.overlap(o, links[m - 1].src))
                            or (k, j) in cp.delegate_in_place(a.delegate_index)
                            for j, o in enumerate(a.args) if j in outs))

    def grow(c: _Chains) -> None:
        """A new reader's chains (``chains``, nothing in ``use``): each at its longest valid
        length given the others' copies in use, from none up (a length only grows, so the
        others' stay valid)."""
        again = True
        while again:
            again = False
            for k in c.chains:
                valid = c.valid[k] = reader_valid(c, k)
                if valid and valid[-1] > c.use.get(k, 0):
                    c.use[k] = valid[-1]
                    again = c.name == _DELEGATE and len(c.chains) > 1

    def take_chains(found: _Chains, operands: Sequence[int]) -> None:
        """The layout chains of ``found``'s reader's ``operands`` (up to a copy another
        reader took), grown to their valid lengths: a candidate when one is in use."""
        for k in operands:
            links = mt.layout_chain(found.pc, k)
            for j, ln in enumerate(links):
                if ln.pc in claimed:
                    del links[j:]
                    break
            if links:
                found.chains[k] = links
        grow(found)
        if found.use:
            mms[found.pc] = found
            claimed.update(ln.pc for k in found.use for ln in found.chains[k])

    def cut_to(c: _Chains, k: int, most: int) -> bool:
        """Operand ``k``'s chain in use to its longest valid length up to ``most`` (none:
        out of use); True when that changed it."""
        m = max((v for v in c.valid[k] if v <= most), default=0)
        if m == c.use[k]:
            return False
        if m:
            c.use[k] = m
        else:
            del c.use[k]
        return True

    def rejoin(c: _Chains) -> None:
        """Each operand's chain cut to what is valid given the others' copies left out
        (``use``: the lengths in force), until that holds for all. Lengths only shrink, so
        this ends."""
        again = True
        while again:
            again = False
            for k in list(c.use):
                c.valid[k] = reader_valid(c, k)
                if cut_to(c, k, c.use[k]):
                    again = True

    pc = 0
    while pc < n:
        conv = mt.conv(pc)
        if conv is not None and pc + 1 < n and where[pc + 1][0] == where[pc][0]:
            fold = mt.batch_norm_fold(pc + 1, *conv)
            # The folded weights are a copy the Program keeps: within FOLD_BUDGET_BYTES only,
            # so a large model's weights stay views into its file (DESIGN: constants are views).
            # A weight its convolution scales as it runs is not copied (only the scale is).
            kept = 0 if fold is None else fold[2].nbytes + (fold[1] if fold[3] is None else fold[3]).nbytes
            if fold is not None and folded_bytes + kept <= FOLD_BUDGET_BYTES:
                folded_bytes += kept
                folds[pc] = (conv[0], *fold)
                pc += 2
                continue
        mp = mt.maxpool_values(pc)
        ew = None if mp is not None or st.opaque else mt.ew_chain(pc, claimed)
        if ew is not None:  # one chain of the plan only (instructions are numbered across chains)
            same = [op for op in ew.ops if where[op[0]][0] == where[pc][0]]
            ew = _EwChain(ew.x, tuple(same), ew.dtype) if len(same) >= 2 else None
        while ew is not None and not _ew_static_ok(mt, ew, cc_skip):
            # The longest prefix that passes (a hardswish's final division reads a scalar
            # the exporter may place on the input's memory once the multiply has read it).
            ew = _EwChain(ew.x, ew.ops[:-1], ew.dtype) if len(ew.ops) > 2 else None
        if ew is not None:
            ews[ew.pcs[-1]] = ew
            claimed.update(ew.pcs)
            pc = ew.pcs[-1] + 1
            continue
        if mp is not None:
            pools[pc] = mp
        elif not st.opaque and isinstance(instructions[pc], DelegateCall):
            # A delegate's arguments it only reads (its backend says which it writes), made
            # by layout copies: the delegate reads their source in place (as views), like a
            # matmul's operands.
            a = instructions[pc]
            outs = delegate_outputs[a.delegate_index] if a.delegate_index < len(delegate_outputs) else None
            if outs is not None and not (cp.lists and any(i in cp.lists for i in a.args)):
                take_chains(_Chains(pc, _DELEGATE, tuple(a.args), {}, {}, {}),
                            [k for k, i in enumerate(a.args)
                             if k not in outs and i in layout_made and mt.static_tensor(i) is not None])
        elif not st.opaque:
            a = instructions[pc]
            name = cp.meta.operators[a.op_index] if isinstance(a, KernelCall) else ""
            spec = _MATMULS.get(name)
            call = None if spec is None else mt.kernel_call(pc, name, spec[0])
            if call is not None and call[1] == {call[0][-1]}:
                take_chains(_Chains(pc, name, call[0], {}, {}, {}), spec[1])  # type: ignore[arg-type]
        pc += 1

    # A constant copy's readers read its value: as plain kernel steps, or as the other
    # operand of an elementwise chain's operation (each substituted in step 3).
    # (a delegate reading views reads its folded constants too: not in the way)
    other_rewritten = set(folds) | {pc + 1 for pc in folds} | set(pools) | {pc for pc, c in mms.items()
                                                                               if c.name != _DELEGATE}
    other_rewritten.update(ln.pc for c in mms.values() for ln_list in c.chains.values() for ln in ln_list)
    in_ew: dict[int, Any] | None = None  # each chained instruction's spec, and the chains' inputs,
    ew_xs: set[int] = set()  # made again when a dropped copy drops chains
    for pc, (out, _, readers) in list(ccs.items()):
        if in_ew is None:
            in_ew = {p: spec for ew in ews.values() for p, _, spec, _ in ew.ops}
            ew_xs = {ew.x for ew in ews.values()}
        if any(r in other_rewritten or (r in in_ew and (in_ew[r][0] != "b" or in_ew[r][2] != out))
               or out in ew_xs for r in readers):
            _drop_constant_copy(ccs, ews, pc)
            in_ew = None

    # Folded convolutions ending in an activation that alone reads their result (relu, an
    # exported hardswish, sigmoid-then-mul silu): the convolution writes the activation's
    # output itself (conv2d's act), the batch norm's output is never written.
    acts: dict[int, tuple[str, tuple[int, ...], int]] = {}  # conv pc -> (activation, its instructions, its out)
    ew_first = {ew.pcs[0]: ew for ew in ews.values()}
    cc_values = {out: value for out, value, _ in ccs.values()}

    def const_of(i: int) -> np.ndarray | None:
        c = mt.constant(i)
        return c if c is not None else cc_values.get(i)

    for pc, (_, bn_out, *_) in folds.items():
        q = pc + 2
        while q in ccs:  # a folded constant copy (a hardswish's 3) runs nowhere: look past it
            q += 1
        meta = mt.static_tensor(bn_out)
        if q >= n or where[q][0] != where[pc][0] or meta is None or meta[0] != np.float32:
            continue
        found: tuple[str, tuple[int, ...], int] | None = None
        ew = ew_first.get(q)
        if ew is not None:
            ops = [(name, spec) for _, name, spec, _ in ew.ops]
            if ew.x != bn_out:
                pass
            elif _hardswish_len(ops, bn_out, const_of) == len(ops):
                found = ("hardswish", ew.pcs, ew.out)
            elif (len(ops) == 2 and ops[0][0] == "aten::sigmoid.out"
                  and ops[1][1][:3] == ("b", "aten::mul.out", bn_out)):
                found = ("silu", ew.pcs, ew.out)
        elif q not in claimed and not st.opaque:
            call = mt.kernel_call(q, "aten::relu.out", 2)
            if (call is not None and call[0][0] == bn_out and call[1] == {call[0][1]}
                    and mt.static_tensor(call[0][1]) == meta and st.static(call[0][1])):
                found = ("relu", (q,), call[0][1])
        if found is not None and mt.uses.only_named_by(bn_out, (pc + 1, *found[1])):
            acts[pc] = found
            claimed.update(found[1])

    # 2. Leaving out a write must not change what any read sees, given every other write
    # left out: drop the candidates where it would, until none does. A matmul reading a
    # chain's source reads what the chain's first copy read, where it read it (nothing
    # writes the source in between), so that read stays where it is.
    base_reads = st.reads()
    while True:
        dropped: set[tuple[int, int]] = set()
        designated: set[tuple[int, int]] = set()  # reads that a rewrite does away with
        for pc in folds:
            bn = instructions[pc + 1].args
            y = instructions[pc].args[9]
            dropped.update(((pc, y), (pc + 1, bn[8]), (pc + 1, bn[9])))
            designated.add((pc + 1, y))
        for pc in pools:
            dropped.add((pc, instructions[pc].args[7]))
        for c in mms.values():
            for k, m in c.use.items():
                links = c.chains[k][:m]
                for ln in links:
                    dropped.add((ln.pc, ln.out))
                    designated.add((ln.reader, ln.read))
        for ew in ews.values():
            for (p0, _, _, v), (p1, _, _, _) in zip(ew.ops, ew.ops[1:]):
                dropped.add((p0, v))
                designated.add((p1, v))
        for pc, (_, act_pcs, _) in acts.items():
            bn_out = folds[pc][1]
            dropped.add((pc + 1, bn_out))
            designated.update((p, bn_out) for p in act_pcs)
        for pc, (out, _, readers) in ccs.items():
            dropped.add((pc, out))
            designated.update((r, out) for r in readers)
        # base_reads less the designated reads; the sets of values without one are shared
        # with base_reads (nothing below changes a set).
        reads = dict(base_reads)
        for p, v in designated:
            ps = reads.get(v)
            if ps is not None and p in ps:
                reads[v] = ps - {p}
        # The questions this pass asks drop_unobserved below, answered together where they can be.
        queries = [(out, pc) for pc, (out, _, _) in ccs.items()]
        for pc in folds:
            bn = instructions[pc + 1].args
            queries += [(instructions[pc].args[9], pc), (bn[8], pc + 1), (bn[9], pc + 1)]
        queries += [(instructions[pc].args[7], pc) for pc in pools]
        queries += [(folds[pc][1], pc + 1) for pc in acts if pc in folds]
        queries += [(v, p) for ew in ews.values() for p, _, _, v in ew.ops[:-1]]
        queries += [(ln.out, ln.pc) for c in mms.values() for k, m in c.use.items() for ln in c.chains[k][:m]]
        st.prefetch_covered(queries, reads, dropped)
        changed = False
        for pc, (out, _, _) in list(ccs.items()):
            if not st.drop_unobserved(out, pc, reads, dropped):
                _drop_constant_copy(ccs, ews, pc)
                changed = True
        for pc in list(folds):
            bn = instructions[pc + 1].args
            if not (st.drop_unobserved(instructions[pc].args[9], pc, reads, dropped)
                    and st.drop_unobserved(bn[8], pc + 1, reads, dropped)
                    and st.drop_unobserved(bn[9], pc + 1, reads, dropped)):
                del folds[pc]
                changed = True
        for pc in list(pools):
            if not st.drop_unobserved(instructions[pc].args[7], pc, reads, dropped):
                del pools[pc]
                changed = True
        for pc, (kind, act_pcs, _) in list(acts.items()):
            if (pc not in folds or (kind != "relu" and act_pcs[-1] not in ews)
                    or not st.drop_unobserved(folds[pc][1], pc + 1, reads, dropped)):
                del acts[pc]
                changed = True
        for last, ew in list(ews.items()):
            if not all(st.drop_unobserved(v, p, reads, dropped) for p, _, _, v in ew.ops[:-1]):
                del ews[last]
                changed = True
        for c in mms.values():
            cut = False
            for k in list(c.use):
                ok = 0
                for ln in c.chains[k][: c.use[k]]:
                    if not st.drop_unobserved(ln.out, ln.pc, reads, dropped):
                        break
                    ok += 1
                if cut_to(c, k, ok):
                    changed = cut = True
            if cut:  # an operand's copies run again: the others' sources may be written now
                rejoin(c)
        if not changed:
            break

    # 3. The steps.
    gone = {ln.pc for c in mms.values() for k, m in c.use.items() for ln in c.chains[k][:m]}
    gone.update(p for ew in ews.values() for p in ew.pcs[:-1])
    gone.update(ccs)

    def op_name(pc: int) -> str:
        return cp.meta.operators[instructions[pc].op_index]

    nv = len(cp.plan.values)
    derived: list[tuple[int, Any]] = []
    views = _Views(cp)
    cc_sub: dict[int, int] = {}  # folded copy's out -> its constant (a derived value)
    cc_of: dict[int, set[int]] = {}  # reader -> the folded copies it reads
    for pc, (out, value, readers) in ccs.items():
        cc_sub[out] = nv + len(derived)
        derived.append((-1, value))
        for r in readers:
            cc_of.setdefault(r, set()).add(pc)
        rewrites.append(Rewrite("constant_copy", (pc,), (value,)))

    def with_copies(span: tuple[int, ...]) -> tuple[int, ...]:
        """``span`` with the folded copies its instructions read: an executor running a
        step's instructions as written (numpy_cpu's tiling) runs those copies too."""
        extra = set().union(*(cc_of.get(p, ()) for p in span))
        return tuple(sorted(extra.union(span))) if extra else span
    gelus = {pc: g for pc in range(n) if pc not in gone and pc not in folds and pc not in pools and pc not in ews
             and pc not in mms and (g := _gelu_scratch(mt, pc)) is not None}
    fused = {p for _, act_pcs, _ in acts.values() for p in act_pcs}  # run by their convolution's step
    # Convolutions not folded, with a constant weight and bias and literal arguments: planned
    # once per input shape in their step (the same kernel, checks and choices made once).
    planned_convs: dict[int, tuple[tuple[int, ...], int, np.ndarray, np.ndarray | None, Any]] = {}
    for pc in range(n if not st.opaque else 0):
        if pc in gone or pc in folds or pc in pools or pc in ews or pc in mms or pc in fused or pc in cc_of:
            continue
        conv = mt.conv(pc)
        if conv is None:
            continue
        params, out = conv
        w = mt.constant(params[1])
        b = None if mt.is_none(params[2]) else mt.constant(params[2])
        static = _conv_static(mt, params)
        if w is not None and (b is not None or mt.is_none(params[2])) and static is not None:
            planned_convs[pc] = (params, out, w, b, static)
    if gelus:  # one scratch buffer per Method for all of them
        gelu_scratch = nv + len(derived)
        first = next(iter(gelus.values()))
        derived.append((first[1], functools.partial(_new_scratch, 3 * max(g[2] for g in gelus.values()))))
    def const_value(i: int) -> np.ndarray | None:
        """Value ``i``'s constant array (a derived one: a folded constant copy), else None."""
        if i >= nv:
            return derived[i - nv][1] if derived[i - nv][0] == -1 else None
        return mt.constant(i)

    # step index -> what it runs, for the squeeze-and-excite pass: ("plain", pc), ("conv",
    # planned_convs[pc]) or ("ew", the chain as its step runs it)
    info: dict[int, tuple[str, Any]] = {}

    def spare_of(params: tuple[int, ...], out: int, span: tuple[int, ...]) -> int | None:
        """A folded convolution's own output, as the spare of its step covering ``span``:
        left out (step 2 checked that no read observes its bytes after the convolution, given
        the writes that still run after it), of ``out``'s static shape; only where no other
        step runs between the convolution and the step (a write there could share its bytes
        and be overwritten by the step's later write of it)."""
        y = params[9]
        if y == out or not st.static(y) or not st.static(out) or mt.static_tensor(y) != mt.static_tensor(out):
            return None
        covered = set(span)
        if any(q not in covered and q not in ccs for q in range(span[0], span[-1] + 1)):
            return None
        return y

    pc = 0
    while pc < n:
        label = f"step[{pc}]"
        if pc in fused:
            pc += 1
            continue
        if pc in folds:
            params, out, w, b, scale = folds[pc]
            consts = (w, b) if scale is None else (w, b, scale)
            (ci, i0), (_, i1) = where[pc], where[pc + 1]
            act = acts.get(pc)
            if act is None:
                name = f"{_CONV} + {_BN} (folded)"
                what = f"chains[{ci}].instructions[{i0}..{i1}] ({name})"
                steps.append(_conv_bn_step(cp, params, out, w, b, what, f"{label} {name}",
                                           static=_conv_static(mt, params), spare=spare_of(params, out, (pc, pc + 1)),
                                           scale=scale))
                spans.append((pc, pc + 1))
                rewrites.append(Rewrite("conv_bn", (pc, pc + 1), consts))
            else:
                kind, act_pcs, act_out = act
                span = (pc, pc + 1, *act_pcs)
                name = f"{_CONV} + {_BN} (folded) + {kind}"
                what = f"chains[{ci}].instructions[{i0}..{where[act_pcs[-1]][1]}] ({name})"
                steps.append(_conv_bn_step(cp, params, act_out, w, b, what, f"{label} {name}", act=kind,
                                           static=_conv_static(mt, params), spare=spare_of(params, act_out, span),
                                           scale=scale))
                spans.append(with_copies(span))
                rewrites.append(Rewrite("conv_bn", (pc, pc + 1), consts))
                rewrites.append(Rewrite("conv_activation", span))
            pc += 2
            continue
        if pc in pools:
            params, out = pools[pc]
            name = f"{_MAXPOOL} (values only)"
            ci, ii = where[pc]
            what = f"chains[{ci}].instructions[{ii}] ({name})"
            steps.append(kernel_step(max_pool2d_values_out, params, (out,), what, f"{label} {name}"))
            spans.append((pc,))
            rewrites.append(Rewrite("maxpool_values", (pc,)))
            pc += 1
            continue
        c = mms.get(pc)
        ew = ews.get(pc)
        if pc in gone:
            pass
        elif ew is not None:
            span_t = ew.pcs
            name = " + ".join(op_name(i) for i in span_t) + " (elementwise chain)"
            chain = _substituted(ew, cc_sub) if cc_sub else ew
            info[len(steps)] = ("ew", chain)
            steps.append(_ew_step(chain, ew.out, f"{label} {name}", const=const_value))
            spans.append(with_copies(span_t))
            rewrites.append(Rewrite("elementwise_chain", span_t))
        elif c is not None and c.use:
            params = list(c.params)
            per_execute: dict[int, tuple[int, Any]] = {}
            consts: list[np.ndarray] = []
            span = {pc}
            for k, m in sorted(c.use.items()):
                links = c.chains[k][:m]
                src = links[-1].src
                ops, fn = views.of(mt.static_tensor(src)[1], tuple(op for ln in reversed(links) for op in ln.ops))  # type: ignore[index]
                span.update(ln.pc for ln in links)
                const = mt.constant(src)
                if const is not None:
                    arr = fn(const)
                    arr.setflags(write=False)  # a view of the program's bytes, or a copy made once here
                    consts.append(arr)
                    params[k] = nv + len(derived)
                    derived.append((-1, arr))
                elif views.stays(src, ops, fn):
                    params[k] = nv + len(derived)
                    derived.append((src, fn))
                else:
                    per_execute[k] = (src, fn)
            span_t = tuple(sorted(span))
            if c.name == _DELEGATE:
                a = instructions[pc]
                d = cp.plan.delegates[a.delegate_index]
                name = " + ".join(op_name(i) for i in span_t if i != pc) + f" + delegate {d.id} (as views)"
                what = (", ".join("chains[{}].instructions[{}]".format(*where[i]) for i in span_t)
                        + f" ({name}, delegate {a.delegate_index})")
                params = [cc_sub.get(i, i) for i in params]  # and the folded constants it reads
                steps.append(cp.delegate_step(a.delegate_index, tuple(params), what, f"{label} {name}", per_execute))
                spans.append(with_copies(span_t))
                rewrites.append(Rewrite("delegate_views", span_t, tuple(consts)))
                pc += 1
                continue
            kd = get_kernel(c.name)
            assert kd is not None
            name = " + ".join(op_name(i) for i in span_t) + " (as views)"
            what = ", ".join("chains[{}].instructions[{}]".format(*where[i]) for i in span_t) + f" ({name})"
            if per_execute:
                steps.append(_views_step(cp, kd.fn, tuple(params), c.params[-1], per_execute, what, f"{label} {name}"))
            else:
                steps.append(kernel_step(kd.fn, tuple(params), (c.params[-1],), what, f"{label} {name}"))
            spans.append(span_t)
            rewrites.append(Rewrite("matmul_views", span_t, tuple(consts)))
        elif pc in cc_of and isinstance(instructions[pc], DelegateCall):
            a = instructions[pc]
            d = cp.plan.delegates[a.delegate_index]
            ci, ii = where[pc]
            steps.append(cp.delegate_step(a.delegate_index, tuple(cc_sub.get(i, i) for i in a.args),
                                          f"chains[{ci}].instructions[{ii}] (delegate {a.delegate_index}, {d.id})",
                                          f"{label} delegate {d.id} (constant operands)"))
            spans.append(with_copies((pc,)))
        elif pc in cc_of:
            a = instructions[pc]
            kd = get_kernel(op_name(pc))
            assert kd is not None
            params = tuple(cc_sub.get(i, i) for i in a.args[: kd.num_params])
            ci, ii = where[pc]
            steps.append(kernel_step(kd.fn, params, rets[pc] or (), f"chains[{ci}].instructions[{ii}] ({op_name(pc)})",
                                     f"{label} {op_name(pc)} (constant operand)"))
            spans.append(with_copies((pc,)))
        elif pc in planned_convs:
            params, out, w, b, static = planned_convs[pc]
            ci, ii = where[pc]
            info[len(steps)] = ("conv", planned_convs[pc])
            steps.append(_conv_bn_step(cp, params, out, w, b, f"chains[{ci}].instructions[{ii}] ({_CONV})",
                                       f"{label} {_CONV} (planned)", static=static))
            spans.append((pc,))
            rewrites.append(Rewrite("conv_planned", (pc,)))
        elif pc in gelus:
            x, out, _ = gelus[pc]
            steps.append(_gelu_step(x, out, gelu_scratch, f"{label} {_GELU} (float32 fit, scratch)"))
            spans.append((pc,))
            rewrites.append(Rewrite("gelu_scratch", (pc,)))
        else:
            info[len(steps)] = ("plain", pc)
            steps.append(plain[pc])
            spans.append((pc,))
        pc += 1
    if not st.opaque and squeeze_excite_available():
        _fuse_squeeze_excite(mt, steps, spans, rewrites, info, const_value)
    return steps, spans, rewrites, derived
