"""The loops over a plan's values in C (``orchestra.runtime._plan``) against the Python loops of
``CompiledPlan.__init__`` and ``Method.__init__`` they stand in for: the same template, slots,
lists and everything derived from them, the same executes, the same errors for bad programs."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import pathlib
import re
import sys
from typing import Any

import numpy as np
import pytest

from orchestra import OrchestraError
from orchestra.program import (
    AllocationDetails,
    EValue,
    ExtraTensorInfo,
    Int,
    IntList,
    JumpFalseCall,
    KernelCall,
    OptionalTensorList,
    ProgramDef,
    ScalarType,
    Tensor,
    TensorList,
    TensorShapeDynamism,
)
from orchestra.runtime import _method, load_program
from orchestra.runtime._method import CompiledPlan, Method, _Slot
from orchestra.runtime._optimize import analyse_uses

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
NATIVE = _method._plan

pytestmark = pytest.mark.skipif(NATIVE is None, reason="orchestra.runtime._plan is not built")


def _real_models() -> list[pathlib.Path]:
    """The exported real-size models, portable and XNNPACK, where a cache is present (not in CI)."""
    base = pathlib.Path(os.environ.get("ORCHESTRA_REAL_MODELS", pathlib.Path.home() / ".cache" / "orchestra" / "real_models"))
    return sorted(base.glob("v1-*/*.pte")) if base.is_dir() else []


SHARED = ROOT.parent / "shared" / "fixtures"
PROGRAMS = sorted(FIXTURES.rglob("*.pte")) + (sorted(SHARED.glob("*.pte")) if SHARED.is_dir() else []) + _real_models()


def _compiled(prog: ProgramDef, name: str, native: bool, monkeypatch: pytest.MonkeyPatch, plan: Any = None,
              state_layout: Any = None) -> CompiledPlan:
    monkeypatch.setattr(_method, "_plan", NATIVE if native else None)
    try:
        return CompiledPlan(prog, plan if plan is not None else prog.plan(name), "w", state_layout=state_layout)
    finally:
        monkeypatch.setattr(_method, "_plan", NATIVE)


def _same_array(a: np.ndarray, b: np.ndarray, *, where: bool = True) -> bool:
    """Same type, dtype, shape, strides, flags and bytes (and, with ``where``, the same memory:
    both views of the same bytes of the file)."""
    return (type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape and a.strides == b.strides
            and a.flags.writeable == b.flags.writeable and a.flags.c_contiguous == b.flags.c_contiguous
            and a.flags.aligned == b.flags.aligned and a.tobytes() == b.tobytes()
            and (not where or a.__array_interface__["data"][0] == b.__array_interface__["data"][0]))


def _same(x: Any, y: Any, *, where: bool = True) -> bool:
    if isinstance(x, np.ndarray):
        return isinstance(y, np.ndarray) and _same_array(x, y, where=where)
    if isinstance(x, _Slot):
        return type(y) is _Slot and all(
            type(getattr(x, f)) is type(getattr(y, f)) and getattr(x, f) == getattr(y, f) for f in _Slot.__slots__)
    if isinstance(x, list):
        return type(y) is list and len(x) == len(y) and all(_same(a, b, where=where) for a, b in zip(x, y))
    return type(x) is type(y) and (x is y or x == y or (isinstance(x, float) and x != x and y != y))  # (NaN)


def _assert_same_plans(a: CompiledPlan, b: CompiledPlan) -> None:
    nv = len(a.plan.values)
    assert len(a.template) == len(b.template)
    for i, (x, y) in enumerate(zip(a.template, b.template)):
        # (a derived constant, past the plan's values, is computed anew by each compile)
        assert _same(x, y, where=i < nv), f"template[{i}]"
    # constants are still views of the program's bytes, and read-only where they were
    seg = a.program.segments[a.program.constant_segment.segment_index].data if a.program.constant_segment else None
    for x in a.template[:nv]:
        if isinstance(x, np.ndarray) and x.size and seg is not None and not a.program.constant_buffer:
            assert np.shares_memory(x, np.frombuffer(seg, np.uint8))
    assert len(a.slots) == len(b.slots) and all(_same(x, y) for x, y in zip(a.slots, b.slots))
    assert list(a.lists.items()) == list(b.lists.items())  # (in the same order)
    assert all(type(a.lists[i][0]) is bool for i in a.lists)
    assert a.runtime_tensors == b.runtime_tensors
    assert (a.planned, a.planned_views, a.planned_strided) == (b.planned, b.planned_views, b.planned_strided)
    assert a.static_lists == b.static_lists
    assert [(m, o, bytes(d)) for m, o, d in a.initial] == [(m, o, bytes(d)) for m, o, d in b.initial]
    assert a.input_slots == tuple(a.slots[i] for i in a.input_idx)
    assert len(a.steps) == len(b.steps) and a.step_spans == b.step_spans
    assert [r.kind for r in a.rewrites] == [r.kind for r in b.rewrites]
    assert a.instruction_budget == b.instruction_budget and a.loops == b.loops


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: p.name)
def test_a_compiled_plan_is_the_same_with_its_value_loop_in_c(path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prog = load_program(path)
    for name in prog.method_names:
        on = _compiled(prog._def, name, True, monkeypatch, state_layout=prog._state_layout)
        off = _compiled(prog._def, name, False, monkeypatch, state_layout=prog._state_layout)
        _assert_same_plans(on, off)


def _method_of(cp: CompiledPlan, native: bool, monkeypatch: pytest.MonkeyPatch) -> Method | None:
    monkeypatch.setattr(_method, "_plan", NATIVE if native else None)
    try:
        return Method(cp)
    except OrchestraError:  # a backend not available here
        return None
    finally:
        monkeypatch.setattr(_method, "_plan", NATIVE)


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: p.name)
def test_a_methods_values_and_outputs_are_the_same_with_its_loops_in_c(path: pathlib.Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    prog = load_program(path)
    npz = path.with_suffix(".npz")
    data = np.load(npz) if npz.exists() else None
    for name in prog.method_names:
        cp = prog._compiled_plan(name)
        on, off = _method_of(cp, True, monkeypatch), _method_of(cp, False, monkeypatch)
        if on is None or off is None:
            assert on is None and off is None
            continue
        assert len(on._vals) == len(off._vals)
        for i, (x, y) in enumerate(zip(on._vals, off._vals)):
            if isinstance(x, list):  # a list value: the same members (each Method's own views)
                assert type(y) is list and len(x) == len(y), i
                assert all((a is None and b is None) or _same(a, b, where=False) for a, b in zip(x, y)), i
            elif i < len(cp.template) and cp.template[i] is not None:
                assert x is y and y is cp.template[i], i  # a literal or constant: the plan's own object
            elif i >= len(cp.plan.values):  # derived per Method: a view, or scratch (np.empty)
                assert (x.dtype, x.shape, x.strides) == (y.dtype, y.shape, y.strides), i
            else:  # a view of each Method's own arena
                assert _same(x, y, where=False), i
        k = 0
        inputs = []
        while data is not None and f"{name}.in_{k}" in data:
            inputs.append(data[f"{name}.in_{k}"])
            k += 1
        if not inputs:
            continue
        a, b = on.execute(inputs), off.execute(inputs)
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert _same(np.asarray(x), np.asarray(y), where=False)


# -- bad programs ------------------------------------------------------------------------------

def _outcome(prog: ProgramDef, name: str, native: bool, monkeypatch: pytest.MonkeyPatch, plan: Any = None) -> Any:
    try:
        return _compiled(prog, name, native, monkeypatch, plan=plan)
    except Exception as exc:  # noqa: BLE001 - the comparison is the point
        return (type(exc), str(exc))


def _assert_same_outcomes(prog: ProgramDef, name: str, monkeypatch: pytest.MonkeyPatch, plan: Any = None) -> bool:
    on, off = (_outcome(prog, name, n, monkeypatch, plan) for n in (True, False))
    if isinstance(on, CompiledPlan) and isinstance(off, CompiledPlan):
        _assert_same_plans(on, off)
        return True
    assert on == off
    return False


def test_structured_mutations_compile_or_fail_the_same_with_the_value_loop_in_c(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = importlib.util.spec_from_file_location("fuzz_pte", ROOT / "tools" / "fuzz_pte.py")
    fuzz_pte = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fuzz_pte", fuzz_pte)
    spec.loader.exec_module(fuzz_pte)
    fixtures = [p.read_bytes() for p in sorted(FIXTURES.glob("*.pte"))]
    compiled = failed = 0
    for _i, _kind, data in fuzz_pte.structured_cases(fixtures, 300, seed=40):
        try:
            prog = load_program(data)
        except OrchestraError:
            continue
        for name in prog.method_names:
            if _assert_same_outcomes(prog._def, name, monkeypatch):
                compiled += 1
            else:
                failed += 1
    assert compiled > 50 and failed > 5


def _replace_values(prog: ProgramDef, fn: Any) -> Any:
    plan = prog.plan("forward")
    return dataclasses.replace(plan, values=tuple(EValue(fn(i, ev.val)) for i, ev in enumerate(plan.values)))


class _MyInt(Int):
    __slots__ = ()


def _first(prog: ProgramDef, kind: Any, pred: Any = lambda v: True) -> int:
    return next(i for i, ev in enumerate(prog.plan("forward").values) if isinstance(ev.val, kind) and pred(ev.val))


@pytest.mark.parametrize("edit", [
    "list item out of range", "optional list item -2", "list item not an int", "unsupported scalar type",
    "external data", "sizes a list", "negative size", "transposed constant", "zero-size constant",
    "constant past its segment", "Int subclass", "planned with an initial value", "value not an EValue",
])
def test_odd_values_give_the_python_loops_result_or_error(edit: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Values the reader would refuse, handed to CompiledPlan directly: the C loop leaves each
    to the Python loop, which gives what it gives without C (a plan, or the same error)."""
    prog = load_program(FIXTURES / "cnn.pte")._def
    lst = _first(prog, (IntList, TensorList))
    const = _first(prog, Tensor, lambda t: t.allocation_info is None and t.data_buffer_idx > 0 and len(t.sizes) >= 2)
    planned = _first(prog, Tensor, lambda t: t.allocation_info is not None)
    nv = len(prog.plan("forward").values)

    def fn(i: int, v: Any) -> Any:
        r = dataclasses.replace
        if edit == "list item out of range" and i == lst:
            return r(v, items=(*v.items, nv))
        if edit == "optional list item -2" and i == lst:
            return OptionalTensorList(items=(*v.items, -1, -2))
        if edit == "list item not an int" and i == lst:
            return r(v, items=(*v.items, 1.0))
        if edit == "unsupported scalar type" and i == const:
            return r(v, scalar_type=8)  # complex
        if edit == "external data" and i == const:
            return r(v, extra_tensor_info=ExtraTensorInfo(0, "w", 1))
        if edit == "sizes a list" and i == planned:
            return r(v, sizes=list(v.sizes))
        if edit == "negative size" and i == planned:
            return r(v, sizes=(-1, *v.sizes[1:]))
        if edit == "transposed constant" and i == const:
            return r(v, dim_order=tuple(reversed(range(len(v.sizes)))))
        if edit == "zero-size constant" and i == const:
            return r(v, sizes=(0, *v.sizes[1:]))
        if edit == "constant past its segment" and i == const:
            return r(v, sizes=(1 << 40, *v.sizes[1:]))
        if edit == "Int subclass" and isinstance(v, Int):
            return _MyInt(v.int_val)
        if edit == "planned with an initial value" and i == planned:
            return r(v, data_buffer_idx=1)
        return v

    plan = _replace_values(prog, fn)
    if edit == "value not an EValue":
        plan = dataclasses.replace(plan, values=(*plan.values[:-1], plan.values[-1].val))
    _assert_same_outcomes(prog, "forward", monkeypatch, plan=plan)
    # and C really left it to Python
    cs = prog.constant_segment
    seg = np.frombuffer(prog.segments[cs.segment_index].data, np.uint8)
    todo = NATIVE.values(plan.values, _method._DTYPE_TABLE, seg, cs.offsets, int(TensorShapeDynamism.STATIC))[4]
    assert todo and set(todo) <= {lst, const, planned, len(plan.values) - 1} | {
        i for i, ev in enumerate(plan.values) if type(getattr(ev, "val", None)) is _MyInt}


def test_the_c_loop_vouches_for_the_plain_values_and_makes_the_python_objects() -> None:
    """A direct check of _plan.values on hand-made values: which it takes, what it makes."""
    seg = np.frombuffer(bytes(range(64)), np.uint8)
    f32 = int(ScalarType.FLOAT)
    values = (
        EValue(Int(7)),
        EValue(Tensor(f32, 0, (2, 2), (0, 1), False, 1, None, 0, 0, None)),  # constant at offsets[1]
        EValue(Tensor(f32, 0, (2, 3), (1, 0), False, 0, AllocationDetails(1, 16, 0), 0, 1, None)),  # planned, transposed
        EValue(Tensor(f32, 0, (4,), (), False, 0, None, 0, 0, None)),  # an input without planned memory
        EValue(OptionalTensorList((1, -1))),
        EValue(Tensor(f32, 0, (2, 2), (1, 0), False, 1, None, 0, 0, None)),  # transposed constant: Python's
        EValue(IntList((0, 9))),  # out of range: Python's
        EValue(None),
    )
    template, slots, lists, runtime, todo = NATIVE.values(values, _method._DTYPE_TABLE, seg, (0, 8), 0)
    assert todo == [5, 6]
    assert template[0] == 7 and runtime == [3] and lists == {4: (True, (1, -1))}
    c = template[1]
    assert c.dtype == np.float32 and c.shape == (2, 2) and not c.flags.writeable
    assert c.tobytes() == bytes(range(8, 24)) and np.shares_memory(c, seg)
    s = slots[2]
    assert type(s) is _Slot and (s.memory_id, s.offset, s.bound, s.dim_order) == (1, 16, (2, 3), (1, 0))
    assert (s.dtype, s.dynamic, s.capacity, s.contiguous) == (np.dtype(np.float32), True, 6, False)
    assert [x for i, x in enumerate(slots) if i != 2] == [None] * 7


def test_a_methods_loops_in_c_stop_at_what_they_do_not_know() -> None:
    vals: list[Any] = [None, 5, 6]
    arena = np.zeros(64, np.uint8)
    views = ((0, (2,), np.dtype(np.int32), 0, 8), (1, (2,), np.dtype(np.int32), np.int64(0), 8))
    assert NATIVE.views(vals, views, [arena]) == 1
    assert vals[0].shape == (2,) and vals[0].__array_interface__["data"][0] == arena.ctypes.data + 8 and vals[1] == 5
    lists = {1: (False, (2, 0)), 2: (True, (np.int64(1),)), 0: (False, ())}
    assert NATIVE.lists(vals, lists) == 1
    assert vals[1][0] == 6 and vals[1][1] is vals[0] and vals[2] == 6


# -- the instruction loop ----------------------------------------------------------------------

@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: p.name)
def test_each_kernel_call_is_bound_as_bind_kernel_binds_it(path: pathlib.Path) -> None:
    """The loop binds a call of an operator it has bound before without _bind_kernel: the same
    (name, kernel, parameters, results); static_lists and loops as written plainly."""
    prog = load_program(path)
    for name in prog.method_names:
        cp = prog._compiled_plan(name)
        instructions = [ins.instr_args for chain in cp.plan.chains for ins in chain.instructions]
        binds = [cp._bind_kernel(a, "") if isinstance(a, KernelCall) else None for a in instructions]
        assert list(cp.instruction_steps._binds) == binds
        uses = analyse_uses(cp, instructions, [None if b is None else b[3] for b in binds])
        assert cp.static_lists == frozenset(
            i for i, (_, items) in cp.lists.items()
            if uses.straight and i not in uses.written and not any(j in uses.written for j in items if j >= 0))
        assert cp.loops == any(isinstance(a, JumpFalseCall) and a.destination_instruction <= pc
                               for pc, a in enumerate(instructions))


def _edit_instruction(prog: ProgramDef, fn: Any) -> Any:
    plan = prog.plan("forward")
    chains = tuple(dataclasses.replace(c, instructions=tuple(
        dataclasses.replace(ins, instr_args=fn(ci, ii, ins.instr_args)) for ii, ins in enumerate(c.instructions)))
        for ci, c in enumerate(plan.chains))
    return dataclasses.replace(plan, chains=chains)


def test_a_later_call_of_a_bound_operator_with_too_few_arguments_is_named() -> None:
    prog = load_program(FIXTURES / "transformer.pte")._def
    instructions = [ins.instr_args for ins in prog.plan("forward").chains[0].instructions]
    ops = [a.op_index if isinstance(a, KernelCall) else None for a in instructions]
    later = next(ii for ii, op in enumerate(ops) if op is not None and op in ops[:ii])  # a second call of an operator
    plan = _edit_instruction(prog, lambda ci, ii, a: dataclasses.replace(a, args=a.args[:1]) if ii == later else a)
    name = prog.plan("forward").operators[ops[later]].name
    with pytest.raises(OrchestraError, match=rf"^w: chains\[0\]\.instructions\[{later}\]: {re.escape(name)}\S* takes \d+ "
                                             r"arguments, the program passes 1$"):
        CompiledPlan(prog, plan, "w")
