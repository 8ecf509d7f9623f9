"""What one delegated subgraph costs the NPU: multiply-accumulates and on-chip bytes.

Computed once per delegate handle at ``init`` (and by ``preprocess`` to validate a lowering)
from the subgraph's ``forward`` plan, using each value's static shape (the upper bound for a
dynamically shaped tensor, so the estimate is conservative).

MAC table (``numel`` = number of elements; shapes are the program's):

=====================================  ====================================================
operator (any overload)                MACs
=====================================  ====================================================
``aten::convolution``                  ``out_numel * (Cin / groups) * prod(kernel)``, i.e.
                                       ``out_numel * weight.shape[1] * prod(weight.shape[2:])``;
                                       transposed: ``in_numel * weight.shape[1] * prod(...)``
``aten::mm``                           ``M * N * K``
``aten::addmm``                        ``M * N * K`` (of ``mat1 @ mat2``; the add is free)
``aten::bmm``                          ``B * M * N * K``
``aten::linear``                       ``out_numel * K`` (= ``M * N * K``)
any other operator with a tensor       ``numel`` of its output (the call's last tensor
argument (elementwise, reductions,     argument: the ``out`` of an ``.out`` operator)
copies, pooling, ...)
operators without tensor arguments     0 (scalar ``executorch_prim`` ops run on the host)
nested ``DelegateCall``                0 (not modelled)
=====================================  ====================================================

Working set = planned arena bytes (``non_const_buffer_sizes[1:]``) + constant bytes (each
constant tensor's ``numel * itemsize``, counted once per buffer). Every instance reserves
its whole working set on its core: the model has no weight sharing between instances.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from orchestra.errors import BackendError, Error, OrchestraError
from orchestra.program import Bool, DelegateCall, EValue, KernelCall, ProgramDef, Tensor, numpy_dtype

__all__ = ["OpCost", "SubgraphCost", "analyze_subgraph"]


@dataclass(frozen=True, slots=True)
class OpCost:
    """One instruction of the subgraph: its operator, its MACs and the rule that gave them."""

    instruction: int
    operator: str
    macs: int
    rule: str  # "conv", "conv_transposed", "mm", "addmm", "bmm", "linear", "elementwise", "none"


@dataclass(frozen=True, slots=True)
class SubgraphCost:
    """The static cost of one subgraph method (see the module docstring for the rules)."""

    method: str
    macs: int
    ops: tuple[OpCost, ...]
    arena_bytes: int
    constant_bytes: int

    @property
    def working_set_bytes(self) -> int:
        """Bytes of core memory one instance reserves: arenas plus constants."""
        return self.arena_bytes + self.constant_bytes


def _prod(xs: tuple[int, ...] | list[int]) -> int:
    n = 1
    for x in xs:
        n *= int(x)
    return n


def analyze_subgraph(program: ProgramDef, method: str = "forward") -> SubgraphCost:
    """MACs and working set of ``method`` of ``program``.

    Raises:
        BackendError: code DelegateInvalidCompatibility when the subgraph has no such method
            or an instruction refers to a value that isn't there / isn't the right kind.
    """
    try:
        plan = program.plan(method)
    except OrchestraError as exc:
        raise BackendError(f"NpuSimBackend: the subgraph has no method {method!r}: {exc}", Error.DelegateInvalidCompatibility) from exc
    values = plan.values
    where = f"NpuSimBackend: subgraph method {method!r}"

    def tensor(i: int, ins: int) -> Tensor | None:
        if not 0 <= i < len(values):
            raise BackendError(f"{where}: instruction {ins}: value index {i} out of range (0..{len(values) - 1})",
                               Error.DelegateInvalidCompatibility)
        v = values[i].val
        return v if isinstance(v, Tensor) else None

    def shape_of(i: int, ins: int, what: str, ndim: int | None = None) -> tuple[int, ...]:
        t = tensor(i, ins)
        if t is None or (ndim is not None and len(t.sizes) != ndim):
            want = "a tensor" if ndim is None else f"a {ndim}-d tensor"
            raise BackendError(f"{where}: instruction {ins}: {what} (values[{i}]) is not {want}",
                               Error.DelegateInvalidCompatibility)
        return tuple(t.sizes)

    ops: list[OpCost] = []
    pc = 0
    for chain in plan.chains:
        for instr in chain.instructions:
            a = instr.instr_args
            if isinstance(a, KernelCall):
                if not 0 <= a.op_index < len(plan.operators):
                    raise BackendError(f"{where}: instruction {pc}: operator index {a.op_index} out of range",
                                       Error.DelegateInvalidCompatibility)
                name = plan.operators[a.op_index].qualified_name
                ops.append(_kernel_cost(pc, name, a.args, values, tensor, shape_of))
            elif isinstance(a, DelegateCall):
                ops.append(OpCost(pc, f"delegate {a.delegate_index}", 0, "none"))
            pc += 1
    constant = 0
    seen: set[int] = set()
    for v in values:
        t = v.val
        if isinstance(t, Tensor) and t.is_constant and t.data_buffer_idx not in seen:
            seen.add(t.data_buffer_idx)
            dt = numpy_dtype(t.scalar_type)
            constant += _prod(t.sizes) * (dt.itemsize if dt is not None else 1)
    arena = sum(int(s) for s in plan.non_const_buffer_sizes[1:])
    return SubgraphCost(method, sum(o.macs for o in ops), tuple(ops), arena, constant)


def _kernel_cost(
    pc: int,
    name: str,
    args: tuple[int, ...],
    values: tuple[EValue, ...],
    tensor: Callable[[int, int], Tensor | None],
    shape_of: Callable[..., tuple[int, ...]],
) -> OpCost:
    base = name.split(".", 1)[0]
    if base == "aten::mm" and len(args) >= 2:
        m, k = shape_of(args[0], pc, "self", 2)
        _, n = shape_of(args[1], pc, "mat2", 2)
        return OpCost(pc, name, m * n * k, "mm")
    if base == "aten::addmm" and len(args) >= 3:
        m, k = shape_of(args[1], pc, "mat1", 2)
        _, n = shape_of(args[2], pc, "mat2", 2)
        return OpCost(pc, name, m * n * k, "addmm")
    if base == "aten::bmm" and len(args) >= 2:
        b, m, k = shape_of(args[0], pc, "self", 3)
        _, _, n = shape_of(args[1], pc, "mat2", 3)
        return OpCost(pc, name, b * m * n * k, "bmm")
    if base == "aten::linear" and len(args) >= 2:
        x = shape_of(args[0], pc, "input")
        n, k = shape_of(args[1], pc, "weight", 2)
        return OpCost(pc, name, _prod(x[:-1]) * n * k, "linear")
    if base == "aten::convolution" and len(args) >= 7:
        x = shape_of(args[0], pc, "input")
        w = shape_of(args[1], pc, "weight")
        per_output = _prod(w[1:])  # (Cin / groups) * prod(kernel) for a forward convolution
        flag = values[args[6]].val if 0 <= args[6] < len(values) else None
        if isinstance(flag, Bool) and flag.bool_val:
            return OpCost(pc, name, _prod(x) * per_output, "conv_transposed")
        out = [i for i in args if tensor(i, pc) is not None][-1]
        return OpCost(pc, name, _prod(shape_of(out, pc, "out")) * per_output, "conv")
    outs = [i for i in args if tensor(i, pc) is not None]
    if not outs:
        return OpCost(pc, name, 0, "none")
    return OpCost(pc, name, _prod(shape_of(outs[-1], pc, "out")), "elementwise")
