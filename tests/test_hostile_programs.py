"""Hostile programs: small, well-formed ``.pte`` files whose arguments ask the runtime for
absurd amounts of memory or time. Each is built with the torch-free ``ProgramBuilder``,
then edited through ``orchestra.program.loads``/``dumps`` (the sizes a builder would refuse),
and must fail fast with an ``OrchestraError`` naming what is wrong, without allocating the
absurd result first. Memory is measured with ``tracemalloc`` (numpy reports its data
allocations to it), in this process.
"""

from __future__ import annotations

import dataclasses
import re
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from orchestra import OrchestraError
from orchestra.aot import ProgramBuilder
from orchestra.program import EValue, Int, TensorList, dumps, loads
from orchestra.runtime import load_program

PEAK_LIMIT = 64 << 20  # bytes an execute of these tiny programs may allocate


def edit_values(data: bytes, fn: Callable[[int, Any], Any]) -> bytes:
    """``data`` with each value ``v`` (index ``i``) of its first plan replaced by ``fn(i, v)``."""
    prog = loads(data)
    plan = prog.execution_plan[0]
    values = tuple(EValue(fn(i, ev.val)) for i, ev in enumerate(plan.values))
    return dumps(dataclasses.replace(prog, execution_plan=(dataclasses.replace(plan, values=values),)))


def swap_ints(data: bytes, table: dict[int, int]) -> bytes:
    """``data`` with every Int value found in ``table`` replaced by its entry."""
    return edit_values(data, lambda i, v: Int(table[v.int_val]) if isinstance(v, Int) and v.int_val in table else v)


def peak_of(fn: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def fails_small(data: bytes, inputs: list[Any], match: str) -> OrchestraError:
    """Loads ``data``; its execute raises an OrchestraError matching ``match`` without
    allocating more than PEAK_LIMIT."""
    m = load_program(data).load_method("forward")
    err: list[OrchestraError] = []

    def run() -> None:
        try:
            m.execute(inputs)
        except OrchestraError as exc:
            err.append(exc)

    peak = peak_of(run)
    assert err, "the hostile program executed"
    assert peak < PEAK_LIMIT, f"{peak} bytes allocated before failing: {err[0]}"
    assert re.search(match, str(err[0])), str(err[0])
    return err[0]


def _one(op: str, *args: Any, **kwargs: Any) -> bytes:
    b = ProgramBuilder()
    f = b.method("forward")
    f.output(f.call(op, *args, **kwargs))
    return b.to_bytes()


# -- run-time allocations sized by arguments -------------------------------------------------
@pytest.mark.parametrize("op", ["aten::full.out", "aten::zeros.out", "aten::ones.out", "aten::empty.out"])
def test_creation_ops_asked_for_a_huge_size_fail_before_allocating(op: str) -> None:
    args = ([7, 9], 1.0) if op == "aten::full.out" else ([7, 9],)
    data = swap_ints(_one(op, *args), {7: 20000, 9: 20000})
    fails_small(data, [], rf"{op}: a result of shape \[20000, 20000\] \(400000000 elements\) does not fit its output")


def test_arange_asked_for_4e8_elements_fails_before_allocating() -> None:
    data = swap_ints(_one("aten::arange.out", 13), {13: 400_000_000})
    fails_small(data, [], r"aten::arange.out: a result of shape \[400000000\]")
    data = swap_ints(_one("aten::arange.start_out", 3, 13, 1), {13: 400_000_000})
    fails_small(data, [], r"aten::arange.start_out: a result of shape \[399999997\]")


def _with_input(op: str, shape: tuple[int, ...], *args: Any) -> bytes:
    b = ProgramBuilder()
    f = b.method("forward")
    f.output(f.call(op, f.input(np.float32, shape), *args))
    return b.to_bytes()


def test_repeat_pad_expand_and_upsample_with_huge_arguments_fail_before_allocating() -> None:
    x = np.ones((2, 3), np.float32)
    fails_small(swap_ints(_with_input("aten::repeat.out", (2, 3), [7, 9]), {7: 100_000, 9: 100_000}), [x],
                r"aten::repeat.out: a result of shape \[200000, 300000\]")
    fails_small(swap_ints(_with_input("aten::constant_pad_nd.out", (2, 3), [7, 9]), {7: 100_000, 9: 100_000}), [x],
                r"aten::constant_pad_nd.out: a result of shape \[2, 200003\]")
    fails_small(swap_ints(_with_input("aten::expand_copy.out", (2, 3), [7, 2, 3]), {7: 50_000_000}), [x],
                r"does not fit output")
    x4 = np.ones((1, 1, 2, 3), np.float32)
    fails_small(swap_ints(_with_input("aten::upsample_nearest2d.out", (1, 1, 2, 3), [7, 9]), {7: 100_000, 9: 100_000}),
                [x4], r"aten::upsample_nearest2d.out: a result of shape \[1, 1, 100000, 100000\]")


def test_cat_of_one_tensor_listed_a_thousand_times_fails_before_allocating() -> None:
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (100_000,))
    f.output(f.call("aten::cat.out", [x, x], 0))
    data = edit_values(b.to_bytes(), lambda i, v: TensorList(v.items * 500) if isinstance(v, TensorList) else v)
    fails_small(data, [np.ones(100_000, np.float32)], r"aten::cat.out: a result of shape \[100000000\]")


def test_convolution_with_a_huge_padding_fails_before_allocating() -> None:
    b = ProgramBuilder()
    f = b.method("forward")
    w = np.ones((1, 1, 3, 3), np.float32)
    f.output(f.call("aten::convolution.out", f.input(np.float32, (1, 1, 8, 8)), w, None, [1, 1], [7, 7], [1, 1],
                    False, [0, 0], 1))
    data = swap_ints(b.to_bytes(), {7: 100_000})
    fails_small(data, [np.ones((1, 1, 8, 8), np.float32)], r"aten::convolution.out: a result of shape")


def _arena_out(shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    """An ``out`` the way a Method passes it: a view of a planned (uint8) arena just big enough."""
    dt = np.dtype(dtype)
    arena = np.zeros(int(np.prod(shape)) * dt.itemsize, np.uint8)
    return arena.view(dt).reshape(shape)


@pytest.mark.parametrize("op, args", [
    ("aten::index.Tensor_out", lambda: (np.ones((4, 4), np.float32), [np.zeros((30000, 1), np.int64),
                                                                    np.zeros((1, 30000), np.int64)])),
    ("aten::index_select.out", lambda: (np.ones((4, 100_000), np.float32), 0, np.zeros(10_000, np.int64))),
    ("aten::embedding.out", lambda: (np.ones((4, 100_000), np.float32), np.zeros(10_000, np.int64), -1, False, False)),
    ("aten::mm.out", lambda: (np.ones((30000, 1), np.float32), np.ones((1, 30000), np.float32))),
    ("aten::add.out", lambda: (np.ones((30000, 1), np.float32), np.ones((1, 30000), np.float32), 1)),
    ("aten::upsample_bilinear2d.out", lambda: (np.ones((1, 1, 2, 2), np.float32), [30000, 30000], False, None, None)),
    ("aten::adaptive_avg_pool2d.out", lambda: (np.ones((1, 1, 2, 2), np.float32), [30000, 30000])),
])
def test_kernels_whose_result_size_comes_from_their_arguments_check_it_first(op: str, args: Callable[[], tuple]) -> None:
    """Indices, broadcasting and output sizes can make results far larger than the inputs:
    each kernel compares the size with its planned output before numpy builds it."""
    from orchestra.runtime.kernels import get_kernel

    fn = get_kernel(op).fn
    a = args()
    out = _arena_out((2, 2))
    err: list[OrchestraError] = []

    def run() -> None:
        try:
            fn(*a, out)
        except OrchestraError as exc:
            err.append(exc)

    peak = peak_of(run)
    assert err and peak < PEAK_LIMIT, (peak, err)
    assert "does not fit its output" in str(err[0]) or "exceeds the kernel scratch limit" in str(err[0]), str(err[0])


# -- DYNAMIC_UNBOUND tensors ------------------------------------------------------------------
def _unbound(**changes: Any) -> bytes:
    """forward(x[4]) = x + 1, with x made DYNAMIC_UNBOUND and ``changes`` applied to it."""
    b = ProgramBuilder()
    f = b.method("forward")
    f.output(f.call("aten::add.Scalar_out", f.input(np.float32, (4,)), 1.0))
    data = b.to_bytes()
    x = loads(data).execution_plan[0].inputs[0]
    return edit_values(data, lambda i, v: dataclasses.replace(v, shape_dynamism=2, **changes) if i == x else v)


@pytest.mark.parametrize("changes, match", [
    ({"sizes": (-5, 4), "dim_order": (0, 1)}, r"values\[\d+\]\.tensor\.sizes: negative size -5"),
    ({"sizes": (1 << 16, 1 << 16), "dim_order": (0, 1)}, r"values\[\d+\]\.tensor\.sizes: 4294967296 elements exceed the cap"),
    ({"allocation_info": None}, None),  # unplanned: allowed
])
def test_unbound_tensors_get_the_same_size_checks_at_load(changes: dict, match: str | None) -> None:
    data = _unbound(**changes)
    if match is None:
        m = load_program(data).load_method("forward")
        np.testing.assert_array_equal(m.execute([np.arange(4, dtype=np.float32)])[0], np.arange(4) + 1)
        return
    with pytest.raises(OrchestraError, match=match):
        load_program(data)


def test_an_unbound_tensor_placed_past_its_arena_is_refused_at_load() -> None:
    from orchestra.program import AllocationDetails

    data = _unbound(allocation_info=AllocationDetails(1, 1 << 30))
    with pytest.raises(OrchestraError, match=r"overruns planned buffer 1"):
        load_program(data)


def test_an_unbound_input_larger_than_its_planned_memory_is_rejected_at_execute() -> None:
    m = load_program(_unbound()).load_method("forward")
    assert m.meta.inputs[0].shape == (4,)
    with pytest.raises(OrchestraError, match=r"input 0: shape \[1000\] \(1000 elements\) does not fit the planned memory"):
        m.execute([np.ones(1000, np.float32)])
    np.testing.assert_array_equal(m.execute([np.ones(4, np.float32)])[0], np.full(4, 2, np.float32))


# -- loops --------------------------------------------------------------------------------
def _looping(body: bool) -> bytes:
    """forward(x[8, 8]) with a JumpFalse back to instruction 0 on a constant False: an empty
    self-loop, or a loop around one small matmul."""
    b = ProgramBuilder()
    f = b.method("forward")
    x = f.input(np.float32, (8, 8))
    y = f.call("aten::mm.out", x, x) if body else f.call("aten::add.Scalar_out", x, 0.0)
    f.output(y)
    prog = loads(b.to_bytes())
    plan = prog.execution_plan[0]
    from orchestra.program import Bool, Instruction, JumpFalseCall

    cond = len(plan.values)
    chain = plan.chains[0]
    ins = chain.instructions + (Instruction(JumpFalseCall(cond, 0 if body else len(chain.instructions))),)
    chain = dataclasses.replace(chain, instructions=ins, stacktrace=None)
    plan = dataclasses.replace(plan, values=plan.values + (EValue(Bool(False)),), chains=(chain,))
    return dumps(dataclasses.replace(prog, execution_plan=(plan,)))


@pytest.mark.parametrize("body", [False, True], ids=["empty self-loop", "loop around a matmul"])
def test_a_program_that_loops_forever_fails_fast_naming_the_method_and_its_budget(body: bool) -> None:
    m = load_program(_looping(body)).load_method("forward")
    steps = len(m._cp.steps)
    assert steps * 10_000 <= 30_000  # a budget of a few ten thousand steps (was 10M)
    with pytest.raises(OrchestraError, match=rf"method 'forward': more than {steps * 10_000} instructions in one "
                                             rf"execute \(its instruction budget") as ei:
        m.execute([np.ones((8, 8), np.float32)])
    assert ei.value.code.name == "InvalidState"


def test_a_looping_execute_stops_at_its_time_limit() -> None:
    m = load_program(_looping(True)).load_method("forward")
    m.instruction_cap = 1 << 62
    m.time_limit_s = 0.05
    with pytest.raises(OrchestraError, match=r"method 'forward': execute ran past its time limit of 0.05 s"):
        m.execute([np.ones((8, 8), np.float32)])
