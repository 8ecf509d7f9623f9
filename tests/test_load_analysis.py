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


# -- _Storage's loops in C (orchestra.runtime._uses) against its Python code ---------------------

def _real_model_files() -> list[pathlib.Path]:
    """The exported real-size models (portable) where a cache of them is present (not in CI)."""
    import os

    base = pathlib.Path(os.environ.get("ORCHESTRA_REAL_MODELS", pathlib.Path.home() / ".cache" / "orchestra" / "real_models"))
    return sorted(base.glob("v1-*/*.portable.pte")) if base.is_dir() else []


_STORAGE_PROGRAMS = sorted(FIXTURES.rglob("*.pte")) + _real_model_files()


def _storage_answers(cp: CompiledPlan, uses: _optimize.PlanUses, seed: int) -> dict[str, object]:
    """Everything _Storage answers for ``cp``'s plan (its use analysis ``uses``), made with
    whichever code ``_optimize._uses`` selects: its layout, reads, and per round of questions
    (``_question_rounds``, every memory tested as a large one) each memory's reads and own
    writes, prefetch_covered's known set and drop_unobserved's answers."""
    st = _Storage(cp, uses, sum(len(chain.instructions) for chain in cp.plan.chains))
    st.numpy_from = 0
    # (in order, and reads' sets with their types: the same dicts, not only equal ones)
    answers: dict[str, object] = {
        "regions": list(st.regions.items()), "by_mem": list(st.by_mem.items()), "writes_at": st.writes_at,
        "reads": [(v, type(ps), sorted(ps)) for v, ps in st.reads().items()],
    }
    if not st.n:  # no instruction: no question to ask
        return answers
    rounds = list(_question_rounds(st, seed))
    base = st.reads()  # the reads as optimize_steps passes them (frozensets and sets)
    rounds.append((set(), base, [(v, pc) for v in st.regions for pc in (0, st.n // 3, st.n - 1)]))
    for k, (dropped, reads, queries) in enumerate(rounds):
        for m in st.by_mem:
            rp, rlo, rhi, val = st._mem_reads(m, reads)
            own, has = st._own_writes(m, reads, dropped)
            assert rp.dtype == rlo.dtype == rhi.dtype == own.dtype == np.int64 and has.dtype == bool
            answers[f"{k} mem_reads {m}"] = (rp.tolist(), rlo.tolist(), rhi.tolist(), val)
            answers[f"{k} own_writes {m}"] = (own.tolist(), has.tolist())
        for numpy_from in (-1, 32, 0):  # (which memories prefetch_covered tests)
            st.numpy_from = numpy_from
            st.prefetch_covered(queries, reads, dropped)
            answers[f"{k} {numpy_from} known"] = set(st._covered_known[4])  # type: ignore[index]
        answers[f"{k} drop_unobserved"] = [st.drop_unobserved(v, pc, reads, dropped) for v, pc in queries]
    return answers


@pytest.mark.parametrize("path", _STORAGE_PROGRAMS, ids=lambda p: p.name)
def test_the_storage_proofs_in_c_give_the_python_answers(path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each answer of _Storage (layout, reads, each memory's reads and own writes, the known
    set of prefetch_covered, drop_unobserved) and the compiled plan's rewrites and steps are
    the same made in C and in Python."""
    if _optimize._uses is None:
        pytest.skip("orchestra.runtime._uses was not built (no C compiler)")
    compiled = load_program(path)
    names = compiled.method_names
    # One use analysis for both (the compiled scan fills its dicts in another order).
    uses = [_storage(compiled._compiled_plan(name)).uses for name in names]
    c_answers = [_storage_answers(compiled._compiled_plan(name), u, 13) for name, u in zip(names, uses)]
    with monkeypatch.context() as m:
        m.setattr(_optimize, "_uses", None)
        py_answers = [_storage_answers(compiled._compiled_plan(name), u, 13) for name, u in zip(names, uses)]
        python = load_program(path)
        py_plans = [(python._compiled_plan(name).rewrites, python._compiled_plan(name).step_spans) for name in names]
    known = 0
    for c, py in zip(c_answers, py_answers):
        assert c.keys() == py.keys()
        for key in c:
            assert c[key] == py[key], key
            known += len(c[key]) if key.endswith("known") else 0  # type: ignore[arg-type]
    assert [(compiled._compiled_plan(name).rewrites, compiled._compiled_plan(name).step_spans) for name in names] == py_plans
    if path.stem in ("cnn", "convnet", "dwsep", "transformer") or path.name.endswith(".portable.pte"):
        assert known  # (questions found covered, not only the others)


def test_the_storage_loops_leave_odd_inputs_to_python() -> None:
    """Inputs not of the shape _Storage makes (an int past 64 bits, a list for a set, a
    position out of range) get None (cover: False, the set untouched) from the C code: the
    Python code then answers, or raises, as it always did."""
    u = _optimize._uses
    if u is None:
        pytest.skip("orchestra.runtime._uses was not built (no C compiler)")
    col = np.array([0, 1], np.int64)
    yes = np.array([True, False])
    assert u.layout((None,)) is None
    assert u.writes_at({1: {0, 5}}, 3) is None and u.writes_at({1: {-1}}, 3) is None
    assert u.writes_at({1: [0]}, 3) is None and u.writes_at({1: {0, 2}, 2: {2}}, 3) == [[1], [], [1, 2]]
    assert u.reads([], {}, frozenset(), 3) is None and u.reads({}, {}, (1,), 3) is None
    assert u.mem_reads([(0, 8, 1)], {1: [3]}) is None  # a list of positions
    assert u.mem_reads([(0, 8, 1)], {1: {1 << 70}}) is None
    assert u.mem_reads([(0, 1 << 64, 1)], {1: {2}}) is None
    assert u.mem_reads([[0, 8, 1]], {}) is None
    assert u.mem_reads([(0, 8, 1)], {}) == (b"", b"", b"", [])
    slot = type("S", (), {"dynamic": False})()
    assert u.own_writes([(0, 8, 5)], col, col, col, [slot], {}, frozenset(), set()) is None  # value past the slots
    assert u.own_writes([(0, 8, 0)], col, col, col, [slot], {0: {1 << 64}}, frozenset(), set()) is None
    assert u.own_writes([(0, 8, 0)], col.astype(np.int32), col, col, [slot], {}, frozenset(), set()) is None
    assert u.own_writes([(0, 8, 0)], col, col[:1], col, [slot], {}, frozenset(), set()) is None
    assert u.own_writes([(0, 8, 0)], col, col, col, [slot], {0: [1]}, frozenset(), set()) is None
    regions = {1: (1, 0, 8), 2: (1, 8, 8), 3: (2, 0, 1 << 64)}
    assert u.group([(1, 4), (2, 4), (5, 4), (1, 6)], regions, {1: [(0, 8, 1)]}, 0) == {1: [(0, 8, 4), (0, 8, 6)]}
    assert u.group([(1, 4)], regions, {1: [(0, 8, 1)]}, 1) == {}
    assert u.group([(1, 4)], regions, {}, -1) == {1: [(0, 8, 4)]}  # (len(()) > -1, as in Python)
    assert u.group([(3, 4)], regions, {}, -1) is None and u.group([[1, 4]], regions, {}, 0) is None
    assert u.group([(1, 4)], regions, {1: ()}, 0) is None and u.group([(1, 4)], regions, {}, 1 << 64) is None
    known: set = set()
    for qs, size in (([(0, 8, 1 << 61)], 5), ([(0, 8, 1)], 0), ([(0, 8, 1)], 1 << 70), ([[0, 8, 1]], 5)):
        assert u.cover(known, 1, qs, col, col, col + 8, col, yes, size) is False
    assert u.cover(known, 1, [(0, 8, 1)], col, col, col + 8, col, yes.astype(np.int8), 5) is False
    assert u.cover(known, 1, [(0, 8, 1)], col, col, col + 8, np.array([1 << 61, 0]), yes, 5) is False
    assert not known
    # A position past 64 bits in a plan's analysis: the Python code answers (here, raises as
    # numpy does).
    cp = load_program(FIXTURES / "cnn.pte")._compiled_plan("forward")
    st = _storage(cp)
    m = next(iter(st.by_mem))
    d = next(v for _, _, v in st.by_mem[m] if st.whole_writes(v) and v in st.uses.defines)
    st.uses.defines[d].add(1 << 70)  # type: ignore[attr-defined]
    st._whole_writes.clear()
    with pytest.raises(OverflowError):
        st._own_writes(m, {v: {1 << 69} for _, _, v in st.by_mem[m]}, set())
