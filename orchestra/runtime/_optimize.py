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
  once per CompiledPlan in float64, cast to the weight's dtype, and are read-only arrays of
  their own, shared by every Method (the program's constant bytes are never touched; the
  cost is one copy of the folded convolutions' weights per Program). Results differ from
  the unfused pair by float rounding only. Not folded when a folded value would not be
  finite (a zero ``var + eps``, say): inf/NaN would not propagate as in the unfused pair.

Not done: fusing a following ``aten::relu.out`` into the convolution step (in place). It saves
only one step's dispatch, about 1 µs, lost in the noise on the fixtures (measured on
convnet, cnn and dynamic_batch), so it is not worth a rewrite.

Use analysis: for every value, the instructions that name it (as an argument, or as a
member of a list argument) and whether some instruction may write it (kernel results,
every delegate argument, move targets, freed values, method inputs). Anything not
understood counts as a read and a write. A value "only read by" an instruction is named by
no other instruction (before or after it, which also covers state carried between
executes) and is not a method output. Plans with control flow (``JumpFalseCall``) are left
as they are: their steps are not straight-line.

Fused steps cover several instructions; ``CompiledPlan.step_spans`` says which, so error
messages name them all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

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
    Tensor,
    numpy_dtype,
)
from .kernels import get_kernel
from .kernels._pool import max_pool2d_values_out

if TYPE_CHECKING:
    from ._method import CompiledPlan, Method, Step

__all__ = ["PlanUses", "Rewrite", "analyse_uses", "optimize_steps"]

_CONV = "aten::convolution.out"
_BN = "aten::_native_batch_norm_legit_no_training.out"
_MAXPOOL = "aten::max_pool2d_with_indices.out"
_FOLD_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@dataclass(frozen=True, slots=True)
class PlanUses:
    """Which instructions name each value, in one plan (instructions numbered across chains).

    Attributes:
        mentions: value index -> instructions whose arguments name it, directly or as a
            member of a list value (TensorList, OptionalTensorList, IntList).
        written: values some instruction may write, plus the method's inputs.
        outputs: the method's outputs (list members included).
        straight: False when the plan has control flow (or an instruction not understood).
    """

    mentions: dict[int, frozenset[int]]
    written: frozenset[int]
    outputs: frozenset[int]
    straight: bool

    def only_named_by(self, value: int, pcs: Sequence[int]) -> bool:
        """True when ``value`` is not a method output and no instruction outside ``pcs``
        names it."""
        return value not in self.outputs and self.mentions.get(value, frozenset()) <= frozenset(pcs)


@dataclass(frozen=True, slots=True)
class Rewrite:
    """One rewrite applied to a plan: its kind, the instructions its step covers, and the
    constants it computed (``conv_bn``: the folded weight and bias, read-only)."""

    kind: str  # "maxpool_values" or "conv_bn"
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


def analyse_uses(cp: CompiledPlan, instructions: Sequence[Any], rets: Sequence[tuple[int, ...] | None]) -> PlanUses:
    """The use analysis of ``cp``'s plan. ``rets[pc]`` is what a KernelCall writes (its
    results, as the step binds them), None for other instructions."""
    lists = cp.lists
    mentions: dict[int, set[int]] = {}
    written: set[int] = set(_expand(cp.input_idx, lists))
    straight = True
    for pc, a in enumerate(instructions):
        if isinstance(a, KernelCall):
            named = _expand(a.args, lists)
            written.update(_expand(rets[pc] or a.args, lists))
        elif isinstance(a, DelegateCall):
            named = _expand(a.args, lists)
            written.update(named)
        elif isinstance(a, MoveCall):
            named = _expand((a.move_from, a.move_to), lists)
            written.update(named)
        elif isinstance(a, FreeCall):
            named = _expand((a.value_index,), lists)
            written.update(named)
        elif isinstance(a, JumpFalseCall):
            named = _expand((a.cond_value_index,), lists)
            straight = False
        else:
            named = []
            straight = False
        for i in named:
            mentions.setdefault(i, set()).add(pc)
    return PlanUses(
        mentions={i: frozenset(s) for i, s in mentions.items()},
        written=frozenset(written),
        outputs=frozenset(_expand(cp.output_idx, lists)),
        straight=straight,
    )


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

    # -- helpers ----------------------------------------------------------------------------
    def kernel_call(self, pc: int, name: str, nparams: int) -> tuple[tuple[int, ...], set[int]] | None:
        """(params, results) when instruction ``pc`` calls ``name`` with ``nparams``
        parameters; a result that is a list value counts as its members."""
        if pc >= len(self.instructions):
            return None
        a = self.instructions[pc]
        if not isinstance(a, KernelCall) or self.plan.operators[a.op_index].qualified_name != name:
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

    def conv(self, pc: int) -> tuple[tuple[int, ...], int] | None:
        """(params, out) when instruction ``pc`` is a convolution writing only its planned out."""
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

    def batch_norm_fold(self, pc: int, conv_params: tuple[int, ...], y: int) -> tuple[int, np.ndarray, np.ndarray] | None:
        """(out0, W', b') when instruction ``pc`` is an inference batch norm of the
        convolution output ``y`` (written by instruction ``pc - 1``) that can be folded."""
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
        folded = fold_batch_norm(w, b, gamma, beta, mean, var, float(eps))  # type: ignore[arg-type]
        return None if folded is None else (o0, *folded)


def fold_batch_norm(
    w: np.ndarray,
    b: np.ndarray | None,
    gamma: np.ndarray | None,
    beta: np.ndarray | None,
    mean: np.ndarray,
    var: np.ndarray,
    eps: float,
) -> tuple[np.ndarray, np.ndarray] | None:
    """(W', b'): the convolution weight and bias with inference batch norm folded in, in
    float64 then cast to ``w``'s dtype, read-only, C-contiguous, new arrays. None when a
    folded value is not finite (inf/NaN would not propagate as in the unfused pair)."""
    f64 = np.float64
    with np.errstate(all="ignore"):
        scale = 1.0 / np.sqrt(var.astype(f64) + eps)
        if gamma is not None:
            scale = gamma.astype(f64) * scale
        shift = -mean.astype(f64) if b is None else b.astype(f64) - mean.astype(f64)
        shift = shift * scale
        if beta is not None:
            shift = shift + beta.astype(f64)
        w2 = np.ascontiguousarray((w.astype(f64) * scale.reshape((-1,) + (1,) * (w.ndim - 1))).astype(w.dtype))
        b2 = np.ascontiguousarray(shift.astype(w.dtype))
    if not (np.isfinite(w2).all() and np.isfinite(b2).all() and np.isfinite(w).all()):
        return None
    w2.setflags(write=False)
    b2.setflags(write=False)
    return w2, b2


def _conv_bn_step(cp: CompiledPlan, params: tuple[int, ...], out: int, w: np.ndarray, b: np.ndarray,
                  what: str, label: str) -> Step:
    """One step running ``aten::convolution.out`` with the folded weight ``w`` and bias
    ``b`` into value ``out`` (the batch norm's output)."""
    kd = get_kernel(_CONV)
    assert kd is not None
    conv = kd.fn
    x, _, _, st, pd, dl, tr, op, g, _ = params
    lists = tuple(i for i in params if i in cp.lists)

    def step(vals: list[Any], m: Method) -> None:
        if lists:
            m._refresh_lists(lists)
        o = vals[out]
        res = conv(vals[x], w, b, vals[st], vals[pd], vals[dl], vals[tr], vals[op], vals[g], o)
        if res is not o:
            m._write(out, res, what)

    step.__qualname__ = label
    return step


def optimize_steps(
    cp: CompiledPlan,
    instructions: Sequence[Any],
    where: Sequence[tuple[int, int]],
    rets: Sequence[tuple[int, ...] | None],
    plain: Sequence[Step],
    kernel_step: Callable[[Callable[..., Any], tuple[int, ...], tuple[int, ...], str, str], Step],
) -> tuple[list[Step], list[tuple[int, ...]], list[Rewrite]]:
    """The optimised steps of a plan, which instructions each covers, and the rewrites made.

    ``plain[pc]`` is the step of instruction ``pc`` as written; ``where[pc]`` is its
    (chain, index in chain); ``kernel_step(fn, params, rets, what, label)`` binds a kernel
    step like the interpreter's own.
    """
    steps: list[Step] = []
    spans: list[tuple[int, ...]] = []
    rewrites: list[Rewrite] = []
    uses = analyse_uses(cp, instructions, rets)
    n = len(instructions)
    if not uses.straight:
        return list(plain), [(pc,) for pc in range(n)], rewrites
    mt = _Matcher(cp, instructions, rets, uses)
    pc = 0
    while pc < n:
        label = f"step[{pc}]"
        conv = mt.conv(pc)
        if conv is not None and pc + 1 < n and where[pc + 1][0] == where[pc][0]:
            fold = mt.batch_norm_fold(pc + 1, *conv)
            if fold is not None:
                out, w, b = fold
                (ci, i0), (_, i1) = where[pc], where[pc + 1]
                name = f"{_CONV} + {_BN} (folded)"
                what = f"chains[{ci}].instructions[{i0}..{i1}] ({name})"
                steps.append(_conv_bn_step(cp, conv[0], out, w, b, what, f"{label} {name}"))
                spans.append((pc, pc + 1))
                rewrites.append(Rewrite("conv_bn", (pc, pc + 1), (w, b)))
                pc += 2
                continue
        mp = mt.maxpool_values(pc)
        if mp is not None:
            params, out = mp
            name = f"{_MAXPOOL} (values only)"
            ci, ii = where[pc]
            what = f"chains[{ci}].instructions[{ii}] ({name})"
            steps.append(kernel_step(max_pool2d_values_out, params, (out,), what, f"{label} {name}"))
            spans.append((pc,))
            rewrites.append(Rewrite("maxpool_values", (pc,)))
            pc += 1
            continue
        steps.append(plain[pc])
        spans.append((pc,))
        pc += 1
    return steps, spans, rewrites
