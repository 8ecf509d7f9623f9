"""The plan analysis done at load time: its fast paths give what the plain ones give."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import numpy as np
import pytest

from orchestra.runtime import load_program
from orchestra.runtime._method import CompiledPlan
from orchestra.runtime import _optimize
from orchestra.runtime._optimize import _Storage, analyse_uses

FIXTURES = pathlib.Path(__file__).parent / "fixtures"


def _storage(cp: CompiledPlan) -> _Storage:
    instructions, rets = [], []
    for ci, chain in enumerate(cp.plan.chains):
        for ii, ins in enumerate(chain.instructions):
            a = ins.instr_args
            instructions.append(a)
            rets.append(cp._bind_kernel(a, f"chains[{ci}].instructions[{ii}]")[3] if hasattr(a, "op_index") else None)
    return _Storage(cp, analyse_uses(cp, instructions, rets), len(instructions))


def _plain_defs(st: _Storage, value: int, pc: int, dropped: set[tuple[int, int]]) -> list[tuple[int, int, int]]:
    size = st.n + 2
    return sorted(((w - pc) % size, lo, hi) for d in st.overlapping(value) for w, lo, hi in st.whole_writes(d)
                  if (w, d) not in dropped)


@pytest.mark.parametrize("name", ["cnn", "convnet", "dwsep", "transformer", "mlp"])
def test_the_writes_over_a_value_selected_with_numpy_are_the_plain_ones(name: str) -> None:
    cp = load_program(FIXTURES / f"{name}.pte")._compiled_plan("forward")
    st = _storage(cp)
    rng = np.random.default_rng(3)
    writes = [(w, d) for d in st.regions for w, _, _ in st.whole_writes(d)]
    assert writes
    checked = 0
    for k in range(3):  # no write left out, some, most
        dropped = {writes[j] for j in rng.permutation(len(writes))[: len(writes) * k // 3]}
        for value, (m, lo, hi) in st.regions.items():
            if hi <= lo:
                continue
            for pc in (0, st.n // 2, st.n - 1, int(rng.integers(0, st.n))):
                kw, dlo, dhi = st._defs(m, lo, hi, pc, dropped)
                assert sorted(zip(kw.tolist(), dlo.tolist(), dhi.tolist())) == _plain_defs(st, value, pc, dropped)
                checked += 1
    assert checked > 30


def test_a_dropped_set_changed_between_calls_is_seen() -> None:
    cp = load_program(FIXTURES / "cnn.pte")._compiled_plan("forward")
    st = _storage(cp)
    value, (m, lo, hi) = next((v, r) for v, r in st.regions.items() if r[2] > r[1] and st.whole_writes(v))
    dropped: set[tuple[int, int]] = set()
    before = st._defs(m, lo, hi, 0, dropped)[0]
    dropped.add((st.whole_writes(value)[0][0], value))
    kw, dlo, dhi = st._defs(m, lo, hi, 0, dropped)
    assert sorted(zip(kw.tolist(), dlo.tolist(), dhi.tolist())) == _plain_defs(st, value, 0, dropped)
    assert len(kw) == len(before) - 1


def _question_rounds(st: _Storage, seed: int) -> Iterator[tuple[set, dict, list[tuple[int, int]]]]:
    """Four rounds of (dropped writes, reads, drop_unobserved questions (value, pc)): no write
    left out, then ever more; about a fifth of the reads left out; four positions per value."""
    rng = np.random.default_rng(seed)
    writes = [(w, d) for d in st.regions for w, _, _ in st.whole_writes(d)]
    base = st.reads()
    for k in range(4):
        dropped = {writes[j] for j in rng.permutation(len(writes))[: len(writes) * k // 4]}
        reads = {v: {p for p in ps if rng.random() < 0.8} for v, ps in base.items()}
        yield dropped, reads, [(value, pc) for value in st.regions
                               for pc in {0, st.n // 2, st.n - 1, int(rng.integers(0, st.n))}]


@pytest.mark.parametrize("name", ["cnn", "convnet", "dwsep", "transformer"])
def test_drop_unobserved_gives_the_same_answers_with_numpy(name: str) -> None:
    cp = load_program(FIXTURES / f"{name}.pte")._compiled_plan("forward")
    plain, vec = _storage(cp), _storage(cp)
    plain.numpy_from, vec.numpy_from = 1 << 30, 0
    answers = []
    for dropped, reads, queries in _question_rounds(plain, 5):
        for value, pc in queries:
            want = plain.drop_unobserved(value, pc, reads, dropped)
            assert vec.drop_unobserved(value, pc, reads, dropped) == want, (value, pc)
            answers.append(want)
    assert True in answers and False in answers


@pytest.mark.parametrize("name", ["cnn", "convnet", "dwsep", "transformer"])
def test_drop_unobserved_gives_the_same_answers_after_prefetch_covered(name: str) -> None:
    """The questions answered together (one array expression per memory) get the answers
    they get one by one; only those found covered are kept, the others are asked as before."""
    cp = load_program(FIXTURES / f"{name}.pte")._compiled_plan("forward")
    plain, pre = _storage(cp), _storage(cp)
    plain.numpy_from, pre.numpy_from = 1 << 30, 0
    answers, kept = [], 0
    for dropped, reads, queries in _question_rounds(plain, 7):
        pre.prefetch_covered(queries, reads, dropped)
        kept += len(pre._covered_known[4])  # type: ignore[index]
        for value, pc in queries:
            want = plain.drop_unobserved(value, pc, reads, dropped)
            assert pre.drop_unobserved(value, pc, reads, dropped) == want, (value, pc)
            answers.append(want)
        # A reads dict changed in place is seen (its size changes): nothing kept applies.
        reads[-5] = {0}
        assert all(pre.drop_unobserved(v, pc, reads, dropped) == plain.drop_unobserved(v, pc, reads, dropped)
                   for v, pc in queries[:20])
    assert True in answers and False in answers and kept


def _reference_uses(cp: CompiledPlan, instructions: list, rets: list) -> tuple:
    """The use analysis written plainly (as it was before it was made faster)."""
    from orchestra.program import DelegateCall, FreeCall, JumpFalseCall, KernelCall, MoveCall
    from orchestra.runtime._optimize import _expand, _out_params
    from orchestra.runtime.kernels import get_kernel

    lists = cp.lists
    mentions: dict = {}
    writers: dict = {}
    defines: dict = {}
    straight = True
    for pc, a in enumerate(instructions):
        wrote: list = []
        if isinstance(a, KernelCall):
            named = _expand(a.args, lists)
            wrote = _expand(rets[pc] or a.args, lists)
            name = cp.plan.operators[a.op_index].qualified_name
            kd = get_kernel(name)
            if kd is not None and len(a.args) > kd.num_params:
                outs = _out_params(name)
                where_named: dict = {}
                for p, i in enumerate(a.args[: kd.num_params]):
                    for j in _expand((i,), lists):
                        where_named.setdefault(j, []).append(p)
                for i in wrote:
                    at = where_named.get(i, [])
                    if i not in lists and (not at or (len(at) == 1 and at[0] in outs)):
                        defines.setdefault(i, set()).add(pc)
        elif isinstance(a, DelegateCall):
            named = _expand(a.args, lists)
            outs = cp.delegate_outputs[a.delegate_index]
            if outs is None or any(i in lists for i in a.args):
                wrote = named  # any argument may be written
            else:  # its backend writes these, each whole when named once
                wrote = [i for k, i in enumerate(a.args) if k in outs]
                for i in wrote:
                    if list(a.args).count(i) == 1:
                        defines.setdefault(i, set()).add(pc)
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
            mentions.setdefault(i, set()).add(pc)
        for i in wrote:
            writers.setdefault(i, set()).add(pc)
    return mentions, writers, defines, straight


def _check_uses(cp: object, instructions: list, rets: list) -> None:
    uses = analyse_uses(cp, instructions, rets)  # type: ignore[arg-type]
    mentions, writers, defines, straight = _reference_uses(cp, instructions, rets)  # type: ignore[arg-type]
    assert uses.mentions == {i: frozenset(s) for i, s in mentions.items()}
    assert uses.writers == {i: frozenset(s) for i, s in writers.items()}
    assert uses.defines == {i: frozenset(s) for i, s in defines.items()}
    assert uses.straight == straight
    # what a compiled plan keeps of it
    assert uses.first_mention == {i: min(s) for i, s in mentions.items()}
    assert uses.first_write == {i: min(s) for i, s in writers.items()}
    assert uses.first_define == {i: min(s) for i, s in defines.items()}


@pytest.fixture(params=["compiled", "python"])
def uses_loop(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The use analysis with its loop compiled (orchestra.runtime._uses), and without."""
    if request.param == "python":
        monkeypatch.setattr(_optimize, "_uses", None)
    elif _optimize._uses is None:
        pytest.skip("orchestra.runtime._uses was not built (no C compiler)")
    return request.param


@pytest.mark.parametrize("pte", sorted(p.name for p in FIXTURES.rglob("*.pte")))
def test_the_use_analysis_matches_the_plain_one(pte: str, uses_loop: str) -> None:
    path = next(FIXTURES.rglob(pte))
    prog = load_program(path)
    for name in prog.method_names:
        cp = prog._compiled_plan(name)
        instructions, rets = [], []
        for ci, chain in enumerate(cp.plan.chains):
            for ii, ins in enumerate(chain.instructions):
                a = ins.instr_args
                instructions.append(a)
                rets.append(cp._bind_kernel(a, f"chains[{ci}].instructions[{ii}]")[3] if hasattr(a, "op_index") else None)
        _check_uses(cp, instructions, rets)
        assert cp._uses == analyse_uses(cp, instructions, rets).firsts()


def test_the_use_analysis_of_lists_moves_frees_jumps_and_delegates(uses_loop: str) -> None:
    """Every kind of instruction, and results named through list values, in one plan (the
    plan only analysed, never run: each instruction's rules, not a program's)."""
    from types import SimpleNamespace

    from orchestra.program import DelegateCall, FreeCall, JumpFalseCall, KernelCall, MoveCall, Operator

    ops = [Operator("aten::cat", "out"), Operator("aten::split_with_sizes_copy", "out"),
           Operator("aten::relu", "out"), Operator("my::unknown", "out"),
           Operator("aten::max_pool2d_with_indices", "out")]
    lists = {10: (False, (0, 1)),  # TensorList [x0, x1]
             11: (False, (0, 5)),  # TensorList [x0, y]: y is both read and written by a cat into y
             12: (False, (6, 7)),  # TensorList: split's outputs
             13: (True, (0, -1, 2)),  # OptionalTensorList with a None
             14: (False, (3, 3))}  # IntList
    instructions = [
        KernelCall(0, (10, 3, 5)),  # cat([x0, x1], dim, out=y): y defined
        KernelCall(0, (11, 3, 5)),  # cat([x0, y], dim, out=y): y named twice, not defined
        KernelCall(1, (5, 14, 3, 12)),  # split(y, sizes, dim, out=[a, b]): a, b defined
        KernelCall(2, (6, 6)),  # relu(a, out=a): in place, a named twice
        KernelCall(3, (6, 13, 8)),  # no kernel: names and writes, defines nothing
        KernelCall(2, (7, 9)),  # relu(b, out=c) with its results given in rets
        DelegateCall(0, (0, 8, 9)),  # outputs: argument 2
        DelegateCall(1, (10, 9)),  # outputs unknown: any argument may be written
        MoveCall(9, 15),
        FreeCall(12),
        JumpFalseCall(4, 0),
        KernelCall(4, (0, 14, 14, 14, 14, 4, 16, 17, 16, 17)),
    ]
    rets = [None] * len(instructions)
    rets[5] = (9,)
    rets[2] = ()
    cp = SimpleNamespace(lists=lists, plan=SimpleNamespace(operators=ops), input_idx=(0, 1), output_idx=(15, 13),
                         delegate_outputs=(frozenset({2}), None))
    _check_uses(cp, instructions, rets)
    straight = [a for a in instructions if not isinstance(a, JumpFalseCall)]
    _check_uses(cp, straight, rets[: len(straight)])
    assert analyse_uses(cp, straight, rets[: len(straight)]).straight  # type: ignore[arg-type]


def _plain_producer(mt: object, value: int, reader: int) -> tuple[int, int] | None:
    """_Matcher.producer written plainly (as it was before it bisected)."""
    best = None
    for x in (value, *mt.storage.aliases(value)):
        for w in mt.uses.defines.get(x, ()):
            if w < reader and (best is None or w > best[0]):
                best = (w, x)
    return best


@pytest.mark.parametrize("pte", sorted(p.name for p in FIXTURES.rglob("*.pte")))
def test_the_producer_of_a_value_is_the_plain_ones(pte: str) -> None:
    from orchestra.runtime._optimize import _Matcher

    prog = load_program(next(FIXTURES.rglob(pte)))
    for name in prog.method_names:
        cp = prog._compiled_plan(name)
        st = _storage(cp)
        instructions = [ins.instr_args for chain in cp.plan.chains for ins in chain.instructions]
        rets = [cp._bind_kernel(a, "")[3] if hasattr(a, "op_index") else None for a in instructions]
        mt = _Matcher(cp, instructions, rets, st.uses)
        for value in st.regions:
            for reader in {0, 1, st.n // 2, st.n - 1, st.n, *mt.uses.defines.get(value, ())}:
                assert mt.producer(value, reader) == _plain_producer(mt, value, reader), (value, reader)
