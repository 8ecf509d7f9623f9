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


# -- _Matcher's tables in C (_optimize._match) against its Python code --------------------------

def _all_model_files() -> list[pathlib.Path]:
    """Every exported real-size model (portable and XNNPACK) where a cache of them is present."""
    return sorted({p for f in _real_model_files() for p in f.parent.glob("*.pte")})


_MATCH_PROGRAMS = sorted(FIXTURES.rglob("*.pte")) + _all_model_files()


def _matchers(path: pathlib.Path) -> Iterator[_optimize._Matcher]:
    """A _Matcher over each straight-line plan of the program at ``path``."""
    prog = load_program(path)
    for name in prog.method_names:
        cp = prog._compiled_plan(name)
        instructions = [ins.instr_args for chain in cp.plan.chains for ins in chain.instructions]
        rets = [cp._bind_kernel(a, "")[3] if hasattr(a, "op_index") else None for a in instructions]
        uses = analyse_uses(cp, instructions, rets)
        if uses.straight:
            yield _optimize._Matcher(cp, instructions, rets, uses)


def _compiled(path: pathlib.Path) -> list[tuple[object, ...]]:
    """What compiling each method of ``path`` made: rewrites (with their constants), step spans,
    derived values (constants' bytes; a view's source)."""
    prog = load_program(path)
    found: list[tuple[object, ...]] = []
    for name in prog.method_names:
        cp = prog._compiled_plan(name)
        nv = len(cp.plan.values)
        consts = [(r, [(c.dtype.str, c.shape, c.tobytes()) for c in r.constants]) for r in cp.rewrites]
        extra = [None if x is None else (x.dtype.str, x.shape, x.tobytes()) if isinstance(x, np.ndarray) else x
                 for x in cp.template[nv:]]
        found.append((consts, cp.step_spans, extra, [(i, src) for i, src, _ in cp.derived]))
    return found


def _need_match() -> None:
    if _optimize._match is None:
        pytest.skip("orchestra.runtime._uses was not built (no C compiler)")


@pytest.mark.parametrize("path", _MATCH_PROGRAMS, ids=lambda p: p.name)
def test_the_matcher_tables_in_c_give_the_python_answers(path: pathlib.Path) -> None:
    """Every answer the C tables give for a plan's instructions (layout_links, ew_ops: one per
    instruction) is what the Python code gives; they leave none of these plans to it."""
    _need_match()
    for mt in _matchers(path):
        n = len(mt.instructions)
        links, ew_ops = mt.layout_links(), mt.ew_ops()
        assert len(links) == len(ew_ops) == n
        assert all(links[pc] is not _optimize._ASK and links[pc] == mt.layout_link_py(pc) for pc in range(n))
        assert all(ew_ops[pc] is not _optimize._ASK and ew_ops[pc] == mt.ew_op_py(pc) for pc in range(n))
        st = mt.storage
        groups = _optimize._match.same_bytes(st.regions, mt.cp.slots)  # type: ignore[union-attr]
        st._same_bytes = None
        with pytest.MonkeyPatch.context() as m:
            m.setattr(_optimize, "_match", None)
            assert groups == st.same_bytes() and list(groups) == list(st.same_bytes())
        assert all(groups[j] is groups[g[0]] for j, g in groups.items())  # one list per group
        _check_conv_folds(mt)


def _same_checks(c: object, py: object) -> bool:
    """Two answers of bn_fold_checks: the same constants (the very arrays), the same values."""
    if c is None or py is None:
        return c is py
    return len(c) == len(py) and all(  # type: ignore[arg-type]
        (x is y) if isinstance(x, np.ndarray) or isinstance(y, np.ndarray) else (type(x) is type(y) and x == y)
        for x, y in zip(c, py))  # type: ignore[call-overload]


def _check_conv_folds(mt: _optimize._Matcher) -> None:
    """conv_folds' tables are conv's, _read_conv_static's and bn_fold_checks' Python answers for
    every instruction, and const_copies' are copy_checks', none left to the Python code."""
    convs, statics, folds = mt.conv_folds()
    assert len(convs) == len(statics) == len(folds) == len(mt.instructions)
    for pc in range(len(mt.instructions)):
        conv = mt.conv_py(pc)
        assert convs[pc] is not _optimize._ASK and convs[pc] == conv, pc
        if conv is None:
            assert statics[pc] is None and folds[pc] is None
            continue
        assert statics[pc] is not _optimize._ASK and statics[pc] == _optimize._read_conv_static(mt, conv[0]), pc
        assert folds[pc] is not _optimize._ASK and _same_checks(folds[pc], mt.bn_fold_checks_py(pc + 1, *conv)), pc
    copies = mt.const_copies()
    assert len(copies) == len(mt.instructions)
    assert all(copies[pc] is not _optimize._ASK and _same_checks(copies[pc], _optimize._copy_checks_py(mt, pc))
               for pc in range(len(mt.instructions)))


@pytest.mark.parametrize("switch", ["_match", "_match_folds", "_match_chains", "_memo_views"])
@pytest.mark.parametrize("path", _MATCH_PROGRAMS, ids=lambda p: p.name)
def test_plans_are_compiled_the_same_with_the_matcher_tables_off(path: pathlib.Path, switch: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The rewrites (their constants' bytes included), step spans and derived values of every
    method are the same with the C tables (_optimize._match; _match_folds: the fold tables
    alone) and without them."""
    _need_match()
    on = _compiled(path)
    monkeypatch.setattr(_optimize, switch, None)
    assert _compiled(path) == on


def _odd_plan() -> dict[str, object]:
    """The inputs of _uses.layout_links for one permute_copy of a (2, 3) float tensor (value 0)
    into value 2 by dims value 1 = [3, 4] = [1, 0]."""
    from orchestra.program import EValue, Int, IntList, KernelCall, Null, Tensor

    values = (EValue(Tensor(6, 0, (2, 3), (0, 1))), EValue(IntList((3, 4))), EValue(Tensor(6, 0, (3, 2), (0, 1))),
              EValue(Int(1)), EValue(Int(0)))
    return {"instructions": [KernelCall(0, (0, 1, 2))], "rets": [(2,)], "lists": {1: (False, (3, 4))},
            "values": values, "template": [None, None, None, 1, 0], "written": frozenset({2}),
            "regions": {2: (0, 0, 24)}, "kinds": [(1, 3)], "to_numpy": dict(_optimize._NUMPY_OF),
            "types": (KernelCall, Tensor, Int, Null)}


def _links(plan: dict[str, object]) -> object:
    p = plan
    return _optimize._match.layout_links(p["instructions"], p["rets"], p["lists"], p["values"], p["template"],  # type: ignore[union-attr]
                                         p["written"], p["regions"], p["kinds"], p["to_numpy"], *p["types"],  # type: ignore[misc]
                                         _optimize._ASK)


def test_the_matcher_tables_leave_odd_inputs_to_python() -> None:
    """An instruction or value of a shape the Python code doesn't make (an int past 64 bits, a
    subclass, an index out of range, a list flag not a bool) gets _ASK from the C table (the
    Python code then answers, or raises, as it always did); inputs of another type, None."""
    from orchestra.program import EValue, KernelCall, Tensor

    _need_match()
    ask = _optimize._ASK
    assert _links(_odd_plan()) == [(0, 2, (("T", (1, 0)),))]

    def changed(**kw: object) -> object:
        plan = _odd_plan()
        plan.update(kw)
        return _links(plan)

    values = _odd_plan()["values"]
    assert changed(template=[None, None, None, 1, True]) == [None]  # a bool: not a literal int
    assert changed(template=[None, None, None, 1, 1 << 70]) == [ask]
    assert changed(template=[None, None, None, 1, 1.0]) == [ask]
    assert changed(written=frozenset({2, 4})) == [None]
    assert changed(regions={}) == [None] and changed(regions={2: (0, 0, 1 << 64)}) == [ask]
    assert changed(regions={0: (0, 8, 32), 2: (0, 0, 24)}) == [None]  # src overlaps out
    assert changed(lists={1: (0, (3, 4))}) == [ask] and changed(lists={1: (False, [3, 4])}) == [ask]
    assert changed(lists={1: (True, (3, 4))}) == [None]
    for out in (9, -1):  # a value past the plan's (Python indexes from the end)
        assert changed(instructions=[KernelCall(0, (0, 1, out))], rets=[(out,)], regions={out: (0, 0, 24)}) == [ask]
    assert changed(instructions=[KernelCall(-1, (0, 1, 2))]) == [ask]  # (Python indexes from the end)
    assert changed(instructions=[KernelCall(1, (0, 1, 2))]) == [ask]
    assert changed(instructions=[KernelCall(0, (0, 1))]) == [None]  # fewer arguments than parameters
    assert changed(instructions=[KernelCall(0, [0, 1, 2])]) == [ask]
    sub = type("SubCall", (KernelCall,), {})
    assert changed(instructions=[sub(0, (0, 1, 2))]) == [ask]
    assert changed(instructions=[object()]) == [None]
    assert changed(kinds=[None]) == [None] and changed(kinds=[(1, 1 << 70)]) == [ask] and changed(kinds=[(9, 3)]) == [ask]
    assert changed(kinds=[(1, 2)]) == [ask]  # fewer parameters than a permute reads
    assert changed(rets=[(2, 1 << 70)]) == [ask] and changed(rets=[[2]]) == [ask] and changed(rets=[()]) == [None]
    assert changed(rets=[(2, 0)]) == [None]
    big = EValue(Tensor(6, 0, (2, 1 << 70), (0, 1)))
    assert changed(values=(big, *values[1:])) == [ask]  # type: ignore[index]
    dynamic = EValue(Tensor(6, 0, (2, 3), (0, 1), shape_dynamism=1))
    assert changed(values=(dynamic, *values[1:])) == [None]  # type: ignore[index]
    tsub = type("SubTensor", (Tensor,), {})
    assert changed(values=(EValue(tsub(6, 0, (2, 3), (0, 1))), *values[1:])) == [ask]  # type: ignore[index]
    assert changed(values=(EValue(Tensor(99, 0, (2, 3), (0, 1))), *values[1:])) == [None]  # no numpy dtype
    assert changed(values=list(values)) is None  # type: ignore[arg-type]
    assert changed(instructions=tuple(_odd_plan()["instructions"])) is None  # type: ignore[arg-type]
    assert changed(written={2}) == _links(_odd_plan())  # (a set or a frozenset)
    assert changed(to_numpy=_optimize._NUMPY_OF.items()) is None


def test_the_elementwise_table_leaves_odd_inputs_to_python() -> None:
    """ew_ops, as layout_links: a relu of value 0 into value 2 (a planned float32 tensor of
    static shape), then the same with odd inputs."""
    from orchestra.program import KernelCall

    _need_match()
    ask = _optimize._ASK
    slot = type("Slot", (), {"dynamic": False})()

    def ew(slots: object = (None, None, slot), params: object = (("aten::relu.out", 2),), **kw: object) -> object:
        p = _odd_plan()
        p.update({"instructions": [KernelCall(0, (0, 2))], **kw})
        return _optimize._match.ew_ops(p["instructions"], p["rets"], p["lists"], p["values"], p["template"],  # type: ignore[union-attr]
                                       p["written"], list(slots), list(params), p["to_numpy"], _optimize._FOLD_DTYPES,  # type: ignore[call-overload]
                                       *p["types"], ask)  # type: ignore[misc]

    assert ew() == [("aten::relu.out", (0, 2), 2)]
    assert ew(slots=(None, None, None)) == [None] and ew(slots=(None, None)) == [ask]
    assert ew(slots=(None, None, type("Slot", (), {"dynamic": True})())) == [None]
    assert ew(slots=(None, None, type("Slot", (), {"dynamic": 0})())) == [ask]
    assert ew(params=(None,)) == [None] and ew(params=(("aten::relu.out", 1 << 70),)) == [ask]
    assert ew(params=(("aten::relu.out", 3),)) == [None]  # fewer arguments than parameters
    assert ew(params=()) == [ask] and ew(params=(("aten::relu.out",),)) == [ask]
    assert ew(rets=[(2, 0)]) == [None] and ew(rets=[(1 << 70,)]) == [ask]
    assert ew(instructions=[KernelCall(0, (2, 2))]) == [None]  # out read too
    assert ew(instructions=[KernelCall(0, (0, 1 << 70))]) == [ask]
    assert ew(instructions=[KernelCall(0, (0, 1))], rets=[(1,)]) == [None]  # not a tensor
    assert ew(lists={}) == ew() and ew(to_numpy={}) == [None]  # (no dtype)
    assert ew(written=[2]) is None


def test_same_bytes_leaves_odd_inputs_to_python() -> None:
    """_uses.same_bytes: None for a value not an int in range of the slots, or inputs of
    another type; Python's comparisons otherwise (a dim order given as a list is not the
    identity tuple)."""
    _need_match()
    u = _optimize._match
    plain = type("Slot", (), {"dynamic": False, "dim_order": (0, 1), "bound": (2, 3), "dtype": np.dtype(np.float32)})
    other = type("Slot", (), {"dynamic": False, "dim_order": [0, 1], "bound": (2, 3), "dtype": np.dtype(np.float32)})
    regions = {0: (0, 0, 24), 1: (0, 0, 24), 2: (0, 0, 24), 3: (0, 24, 24)}
    found = u.same_bytes(regions, [plain(), plain(), other(), plain()])  # type: ignore[union-attr]
    assert found == {0: [0, 1], 1: [0, 1]} and found[0] is found[1]
    assert u.same_bytes({**regions, 9: (0, 0, 24)}, [plain()] * 4) is None  # type: ignore[union-attr]
    assert u.same_bytes({-1: (0, 0, 24)}, [plain()]) is None and u.same_bytes({0: [0, 0, 24]}, [plain()]) is None  # type: ignore[union-attr]
    assert u.same_bytes(regions, (plain(),) * 4) is None  # type: ignore[union-attr]


def _fuzz_matcher(seed: int) -> _optimize._Matcher:
    """A _Matcher (made without a program: only what layout_link reads) over random layout
    instructions of every kind: random shapes and literal arguments, most of them what the
    operator needs (an out of the shape it makes), many not (bad dims, bools, None, a written
    literal, a dynamic or overlapping tensor, another dtype)."""
    from types import SimpleNamespace

    from orchestra.program import Bool, EValue, Int, IntList, KernelCall, Null, Tensor

    rng = np.random.default_rng(seed)
    names = list(_optimize._LAYOUT_OPS)
    values: list[EValue] = []
    template: list[object] = []
    lists: dict[int, tuple[bool, tuple[int, ...]]] = {}
    written: set[int] = set()
    regions: dict[int, tuple[int, int, int]] = {}
    instructions: list[object] = []
    rets: list[tuple[int, ...] | None] = []

    def add(val: object, obj: object = None) -> int:
        values.append(EValue(val))
        template.append(obj)
        return len(values) - 1

    def lit(v: object) -> int:
        if v is None:
            return add(Null())
        k = add(Bool(v) if isinstance(v, bool) else Int(v), v)  # type: ignore[arg-type]
        if rng.random() < 0.03:
            written.add(k)
        return k

    def int_list(items: list[object]) -> int:
        members = tuple(lit(v) for v in items)
        k = add(IntList(members))
        lists[k] = (bool(rng.random() < 0.03), members)
        return k

    def odd(v: int) -> object:
        """v, or now and then something else in its place."""
        r = rng.random()
        return v if r > 0.15 else True if r < 0.03 else None if r < 0.06 else v + int(rng.integers(-3, 4))

    def tensor(shape: tuple[int, ...], planned: bool) -> int:
        st = 6 if rng.random() > 0.05 else 4
        k = add(Tensor(st, 0, tuple(shape), tuple(range(len(shape))), shape_dynamism=int(rng.random() < 0.04)))
        if planned:
            regions[k] = (0, 1000 * k, 1000 * k + 4 * int(np.prod(shape)))
        return k

    for _ in range(600):
        name = names[int(rng.integers(len(names)))]
        ndim = int(rng.integers(0, 5))
        shape = tuple(int(d) for d in rng.integers(1, 4, ndim))
        x = np.zeros(shape)
        src = tensor(shape, rng.random() < 0.7)
        args: list[int] = []
        y = x
        try:
            if name == "aten::permute_copy.out":
                dims = [int(d) - (ndim if rng.random() < 0.3 else 0) for d in rng.permutation(ndim)]
                y = x.transpose([d % ndim for d in dims]) if ndim else x
                args = [int_list([odd(d) for d in dims])]
            elif name == "aten::transpose_copy.int_out":
                d0, d1 = (int(d) for d in rng.integers(-ndim - 1, ndim + 1, 2))
                y = np.swapaxes(x, d0, d1) if ndim else x
                args = [lit(odd(d0)), lit(odd(d1))]
            elif name == "aten::t_copy.out":
                y = x.T
            elif name in ("aten::view_copy.out", "aten::_unsafe_view.out"):
                y = x.reshape(tuple(rng.permutation(shape)) if ndim else ())
                size = list(y.shape)
                if size and rng.random() < 0.4:
                    size[int(rng.integers(len(size)))] = -1
                args = [int_list([odd(d) for d in size])]
            elif name in ("aten::squeeze_copy.dims_out", "aten::squeeze_copy.dim_out", "aten::unsqueeze_copy.out"):
                y = x.reshape(tuple(d for d in shape if d != 1 or rng.random() < 0.5) + (1,) * int(rng.integers(0, 2)))
                args = [int_list([0]) if name.endswith("dims_out") else lit(0)]
            elif name == "aten::expand_copy.out":
                args = [int_list([odd(d) for d in shape]), lit(False)]
            elif name == "aten::slice_copy.Tensor_out":
                dim = int(rng.integers(-ndim - 1, ndim + 1))
                start = None if rng.random() < 0.3 else int(rng.integers(-4, 5))
                end = None if rng.random() < 0.3 else (1 << 63) - 1 if rng.random() < 0.3 else int(rng.integers(-4, 5))
                step = int(rng.integers(-1, 4))
                y = x[(slice(None),) * (dim % ndim) + (slice(start, end, step),)] if ndim else x
                args = [lit(odd(dim)), lit(start), lit(end), lit(odd(step))]
            elif name == "aten::clone.out":
                args = [lit(None)]
            elif name == "dim_order_ops::_clone_dim_order.out":
                args = [lit(False), lit(None)]
        except (ValueError, IndexError, TypeError, ZeroDivisionError, np.exceptions.AxisError):
            pass
        out_shape = tuple(y.shape) if rng.random() > 0.1 else tuple(int(d) for d in rng.integers(1, 4, ndim))
        out = tensor(out_shape, rng.random() < 0.95)
        if src in regions and out in regions and rng.random() < 0.05:
            regions[src] = regions[out]  # the same bytes
        nparams = _optimize._LAYOUT_OPS[name]
        args = (args + [lit(0) for _ in range(nparams)])[: nparams - 2]
        if args and rng.random() < 0.05:  # out named as another argument too, or in a list there
            k = int(rng.integers(len(args)))
            if args[k] in lists and rng.random() < 0.5:
                lists[args[k]] = (False, (*lists[args[k]][1], out))
            else:
                args[k] = out
        instructions.append(KernelCall(names.index(name), (src, *args, out)))
        rets.append((out,) if rng.random() > 0.05 else (out, src))
    plan = SimpleNamespace(values=tuple(values))
    cp = SimpleNamespace(lists=lists, template=template, plan=plan)
    mt = object.__new__(_optimize._Matcher)
    mt.to_numpy = dict(_optimize._NUMPY_OF)
    mt.cp, mt.values, mt.instructions, mt.rets, mt.op_names = cp, plan.values, instructions, rets, tuple(names)
    mt.uses = _optimize.PlanUses(mentions={}, written=frozenset(written), outputs=frozenset(), straight=True)
    mt.storage = object.__new__(_Storage)
    mt.storage.regions = regions
    mt._links = None
    return mt


@pytest.mark.parametrize("seed", range(8))
def test_the_layout_links_in_c_are_the_python_ones_on_random_plans(seed: int) -> None:
    """Random layout instructions of every kind (most of them links, many not): the C table's
    answer is the Python code's for each, and it leaves none to it."""
    _need_match()
    mt = _fuzz_matcher(seed)
    links = mt.layout_links()
    answers = [mt.layout_link_py(pc) for pc in range(len(mt.instructions))]
    assert links == answers
    kinds = {mt.op_names[a.op_index] for a, found in zip(mt.instructions, answers) if found is not None}
    assert kinds == set(_optimize._LAYOUT_OPS) and answers.count(None) > 20


def _fuzz_conv_matcher(seed: int) -> _optimize._Matcher:
    """A _Matcher (made without a program: only what conv, _read_conv_static and batch_norm_fold
    read) over random convolution + batch norm pairs: most of them foldable, many not (a
    constant of another dtype, rank or length, a literal None, bool or written, a transposed or
    non-literal convolution, an out named again, read elsewhere, not planned or of other
    sizes, results beyond the outs, a value past the plan, a subclass of a payload type)."""
    from types import SimpleNamespace

    from orchestra.program import Bool, Double, EValue, Int, IntList, KernelCall, Null, Tensor

    rng = np.random.default_rng(seed)
    values: list[EValue] = []
    template: list[object] = []
    slots: list[object] = []
    lists: dict[int, tuple[bool, tuple[int, ...]]] = {}
    written: set[int] = set()
    outputs: set[int] = set()
    instructions: list[object] = []
    rets: list[tuple[int, ...] | None] = []
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    sub_tensor = type("SubTensor", (Tensor,), {})
    sub_bool = type("SubBool", (Bool,), {"__slots__": ()})

    def p(prob: float) -> bool:
        return bool(rng.random() < prob)

    def add(val: object, obj: object = None, slot: object = None) -> int:
        values.append(EValue(val))
        template.append(obj)
        slots.append(slot)
        return len(values) - 1

    def lit(v: object) -> int:
        if v is None:
            return add(Null())
        if isinstance(v, bool):
            k = add(sub_bool(v) if p(0.01) else Bool(v), v)
        elif isinstance(v, float):
            k = add(Double(v), v)
        else:
            k = add(Int(v), v)  # type: ignore[arg-type]
        if p(0.02):
            written.add(k)
        return k

    def int_list(items: list[object]) -> int:
        k = add(IntList(tuple(lit(v) for v in items)))
        lists[k] = (p(0.02), values[k].val.items)  # type: ignore[union-attr]
        if p(0.02):
            written.add(k)
        return k

    def tensor(shape: tuple[int, ...], dt: np.dtype, planned: bool) -> int:
        st = {f32: 6, f64: 7}.get(dt, 4)
        kind = sub_tensor if p(0.01) else Tensor
        return add(kind(st, 0, shape, tuple(range(len(shape))), shape_dynamism=int(p(0.03))), None,
                   SimpleNamespace(dynamic=False) if planned else None)

    def const(shape: tuple[int, ...], dt: np.dtype) -> int:
        if p(0.03):
            return lit(None)
        arr = np.ones(shape, dt)
        arr.setflags(write=False)
        k = add(Tensor(6 if dt == f32 else 7, 0, shape, tuple(range(len(shape)))), arr,
                SimpleNamespace(dynamic=False) if p(0.02) else None)
        if p(0.02):
            written.add(k)
        return k

    for _ in range(300):
        dt = f32 if p(0.6) else f64 if p(0.7) else np.dtype(np.float16)
        oc, ic = int(rng.integers(0, 4)) if p(0.05) else int(rng.integers(1, 4)), int(rng.integers(1, 4))
        rank = 4 if p(0.85) else int(rng.integers(1, 6))
        xshape = (1, ic, 5, 5)[:rank] + (3,) * (rank - 4)
        yshape = (1, oc if p(0.95) else oc + 1, 5, 5)[:rank] + (3,) * (rank - 4)
        x = tensor(xshape, dt if p(0.95) else f64, p(0.8))
        w = const((oc, ic, 1, 1)[:rank] + (1,) * (rank - 4) if p(0.95) else (oc, ic), dt if p(0.97) else f32)
        b = const((oc,) if p(0.95) else (oc + 1,), dt) if p(0.7) else lit(None)
        two = [1, 1] if p(0.9) else [1]
        conv_args = [x, w, b, int_list(two), int_list([0, 0] if p(0.9) else [0, True]), int_list(two),
                     lit(False if p(0.95) else True if p(0.5) else None), int_list([0, 0]),
                     lit(1 if p(0.95) else True if p(0.5) else 1 << 70)]
        y = tensor(yshape, dt if p(0.97) else f64, p(0.95))
        if p(0.03):
            conv_args[int(rng.integers(9))] = y  # out read too
        elif p(0.02):
            lists[conv_args[3]] = (False, (*lists[conv_args[3]][1], y))
        instructions.append(KernelCall(0, (*conv_args, y)))
        rets.append((y,) if p(0.9) else () if p(0.3) else None if p(0.3) else (y, x))
        if p(0.1):  # no batch norm after it
            continue
        vec = lambda: const((oc,) if p(0.95) else (oc, 1), dt if p(0.97) else f32)  # noqa: E731
        o0 = tensor(yshape if p(0.95) else yshape[:-1], dt, p(0.95))
        o1, o2 = tensor((oc,), dt, p(0.5)), tensor((oc,), dt, p(0.5))
        gamma, beta = (vec() if p(0.9) else lit(None)), (vec() if p(0.9) else lit(None))
        eps = lit(1e-5 if p(0.8) else 1 if p(0.3) else True if p(0.3) else None)
        bn_args = [y if p(0.97) else x, gamma, beta, vec(), vec(), lit(0.1), eps, o0, o1, o2]
        if p(0.02):
            bn_args[int(rng.integers(1, 10))] = y  # y named twice
        elif p(0.04):  # ... where nothing else looks: the momentum, or a list there
            if p(0.5):
                bn_args[5] = y
            else:
                bn_args[5] = add(IntList((y,)))
                lists[bn_args[5]] = (False, (y,))
        if p(0.02):
            bn_args[int(rng.integers(7, 10))] = bn_args[int(rng.integers(7, 10))]  # outs not distinct
        instructions.append(KernelCall(1, tuple(bn_args)))
        rets.append((o0, o1, o2) if p(0.95) else (o0, o1, o2, x) if p(0.5) else None)
        if p(0.05):
            outputs.add((y, o1, o2)[int(rng.integers(3))])
        if p(0.05):  # another instruction names one of them
            instructions.append(KernelCall(2, ((y, o0, o1, o2)[int(rng.integers(4))],)))
            rets.append(None)
    if p(0.5):  # a last convolution with nothing after it
        instructions.append(instructions[0])
        rets.append(rets[0])
    mentions: dict[int, set[int]] = {}
    for pc, a in enumerate(instructions):
        for i in _optimize._expand(a.args, lists):  # type: ignore[attr-defined]
            mentions.setdefault(i, set()).add(pc)
    plan = SimpleNamespace(values=tuple(values))
    cp = SimpleNamespace(lists=lists, template=template, plan=plan, slots=slots)
    mt = object.__new__(_optimize._Matcher)
    mt.to_numpy = dict(_optimize._NUMPY_OF)
    mt.cp, mt.values, mt.instructions, mt.rets = cp, plan.values, instructions, rets
    mt.op_names = (_optimize._CONV, _optimize._BN, "aten::relu.out")
    mt.uses = _optimize.PlanUses(mentions=mentions, written=frozenset(written), outputs=frozenset(outputs), straight=True)
    mt.conv_statics, mt._folds = {}, None
    return mt


@pytest.mark.parametrize("seed", range(8))
def test_the_conv_fold_tables_in_c_are_the_python_ones_on_random_plans(seed: int) -> None:
    """Random convolution + batch norm pairs (most foldable, many not): conv_folds' answers are
    the Python code's for each instruction, and the odd ones (a subclass, an int past 64 bits)
    are left to it."""
    _need_match()
    mt = _fuzz_conv_matcher(seed)
    convs, statics, folds = mt.conv_folds()
    ask = _optimize._ASK
    asked = 0
    for pc in range(len(mt.instructions)):
        conv = mt.conv_py(pc)
        if convs[pc] is ask:
            asked += 1
            assert statics[pc] is ask and folds[pc] is ask
            continue
        assert convs[pc] == conv, pc
        if conv is None:
            assert statics[pc] is None and folds[pc] is None
            continue
        if statics[pc] is not ask:
            assert statics[pc] == _optimize._read_conv_static(mt, conv[0]), pc
        if folds[pc] is not ask:
            assert _same_checks(folds[pc], mt.bn_fold_checks_py(pc + 1, *conv)), pc
        # (the constants are finite: a fold where the checks pass)
        assert (mt.batch_norm_fold(pc + 1, *conv) is None) == (mt.bn_fold_checks_py(pc + 1, *conv) is None), pc
    answered = [c for c in folds if c is not None and c is not ask]
    assert len(answered) > 30 and sum(c is None for c in folds) > 30 and asked < len(convs) // 4


def test_the_conv_fold_tables_leave_odd_inputs_to_python() -> None:
    """conv_folds, as layout_links: inputs of another type give None; an operator code, a
    mention set or an instruction of a shape the Python code doesn't make gives _ASK where it is
    read (the Python code then answers, or raises, as it always did)."""
    from orchestra.program import KernelCall

    _need_match()
    ask = _optimize._ASK
    mt = _fuzz_conv_matcher(0)
    convs, _, folds = mt.conv_folds()
    pc = next(pc for pc, f in enumerate(folds) if f is not None and f is not ask)
    y, o1 = convs[pc][1], mt.instructions[pc + 1].args[8]

    def tables(**kw: object) -> object:
        from orchestra.program import Bool, Double, Int, Null, Tensor

        args = {"instructions": mt.instructions, "rets": mt.rets, "lists": mt.cp.lists, "values": mt.values,
                "template": mt.cp.template, "written": mt.uses.written, "slots": mt.cp.slots,
                "mentions": mt.uses.mentions, "outputs": mt.uses.outputs, "codes": [1, 2, None],
                "dtypes": _optimize._FOLD_DTYPES, "to_numpy": dict(_optimize._NUMPY_OF), "ndarray": np.ndarray}
        args.update(kw)
        return _optimize._match.conv_folds(*args.values(), KernelCall, Tensor, Int, Null, Bool, Double, ask)  # type: ignore[union-attr]

    assert tables() == (convs, *mt.conv_folds()[1:])
    for odd in ({"mentions": list(mt.uses.mentions.items())}, {"written": list(mt.uses.written)},
                {"outputs": list(mt.uses.outputs)}, {"codes": (1, 2, None)}, {"slots": tuple(mt.cp.slots)},
                {"dtypes": list(_optimize._FOLD_DTYPES)}, {"ndarray": None}, {"rets": mt.rets[:-1]}):
        assert tables(**odd) is None, odd
    assert set(tables(codes=[1 << 70, 2, None])[0]) <= {None, ask}  # type: ignore[index]
    assert tables(codes=[1])[2][pc] is ask  # (the batch norm's operator past the codes)
    assert tables(mentions={**mt.uses.mentions, y: sorted(mt.uses.mentions[y])})[2][pc] is ask
    assert tables(mentions={**mt.uses.mentions, o1: {pc + 1, pc + 5}})[2][pc] is None  # o1 read elsewhere
    bad = list(mt.instructions)
    bad[pc + 1] = KernelCall(1, list(bad[pc + 1].args))
    assert tables(instructions=bad)[2][pc] is ask
    bad[pc + 1] = KernelCall(1, (*mt.instructions[pc + 1].args[:9], 1 << 70))
    assert tables(instructions=bad)[2][pc] is ask
    bad[pc] = type("SubCall", (KernelCall,), {})(0, mt.instructions[pc].args)
    assert [t[pc] for t in tables(instructions=bad)] == [ask, ask, ask]  # type: ignore[union-attr]


def _fuzz_copy_matcher(seed: int) -> _optimize._Matcher:
    """A _Matcher (made without a program: only what _constant_copy reads) over random constant
    copies (_to_copy, _to_dim_order_copy) and their readers: most of them foldable, many not (a
    source not constant, a non_blocking not a literal bool, a dim order not the identity or not
    literal, an out dynamic, not planned, too large, an output or input, written elsewhere, read
    before the copy, in a list, past a kernel's parameters or by a move)."""
    from types import SimpleNamespace

    from orchestra.program import Bool, DelegateCall, EValue, Int, IntList, KernelCall, MoveCall, Null, Tensor

    rng = np.random.default_rng(seed)
    values: list[EValue] = []
    template: list[object] = []
    slots: list[object] = []
    lists: dict[int, tuple[bool, tuple[int, ...]]] = {}
    written: set[int] = set()
    outputs: set[int] = set()
    inputs: set[int] = set()
    instructions: list[object] = []
    rets: list[tuple[int, ...] | None] = []
    extra_writes: list[tuple[int, int]] = []

    def p(prob: float) -> bool:
        return bool(rng.random() < prob)

    def add(val: object, obj: object = None, slot: object = None) -> int:
        values.append(EValue(val))
        template.append(obj)
        slots.append(slot)
        return len(values) - 1

    def lit(v: object) -> int:
        k = add(Null()) if v is None else add(Bool(v) if isinstance(v, bool) else Int(v), v)  # type: ignore[arg-type]
        if p(0.02):
            written.add(k)
        return k

    for _ in range(200):
        ndim = int(rng.integers(0, 4))
        shape = tuple(int(d) for d in rng.integers(1, 4, ndim)) if p(0.95) else (70, 70)
        if p(0.9):
            arr = np.full(shape, 3.0, np.float32 if p(0.5) else np.float64)
            src = add(Tensor(6, 0, shape, tuple(range(len(shape)))), arr, None if p(0.97) else SimpleNamespace())
        else:
            src = add(Tensor(6, 0, shape, tuple(range(len(shape)))), None, SimpleNamespace(dynamic=False))
        nb = lit(False if p(0.9) else None if p(0.5) else 1)
        op = int(rng.integers(2))
        if p(0.6):
            fmt = lit(None)
        else:
            dims = list(range(ndim)) if p(0.7) else list(range(ndim))[::-1] if p(0.6) else list(range(ndim + 1))
            fmt = add(IntList(tuple(lit(int(d)) for d in dims))) if p(0.9) else lit(0)
            if fmt not in lists and isinstance(values[fmt].val, IntList):
                lists[fmt] = (p(0.05), values[fmt].val.items)  # type: ignore[union-attr]
        dyn = False if p(0.9) else True if p(0.5) else 0
        out = add(Tensor(6, 0, shape, tuple(range(len(shape)))), None, None if p(0.05) else SimpleNamespace(dynamic=dyn))
        if p(0.03):
            outputs.add(out)
        if p(0.03):
            inputs.add(out)
        pc = len(instructions)
        instructions.append(KernelCall(op, (src, nb, fmt, out)))
        rets.append((out,) if p(0.95) else (out, src) if p(0.5) else ())
        if p(0.03):
            extra_writes.append((out, pc + 1))
        for _ in range(int(rng.integers(0, 3))):
            other = add(Tensor(6, 0, shape, tuple(range(len(shape)))))
            kind = rng.random()
            if kind < 0.6:
                args = [out, other, lit(1), other]
                if p(0.05):
                    lst = add(IntList((out,)))
                    lists[lst] = (False, (out,))
                    args[1] = lst
                if p(0.05):
                    args.append(out)  # past the kernel's parameters
                instructions.append(KernelCall(2, tuple(args)))
                rets.append((other,))
            elif kind < 0.9:
                args = [other, out]
                if p(0.1):
                    lst = add(IntList((out,)))
                    lists[lst] = (False, (out,))
                    args.append(lst)
                instructions.append(DelegateCall(0, tuple(args)))
                rets.append(None)
            else:
                instructions.append(MoveCall(out, other))
                rets.append(None)
        if p(0.03) and pc:  # read before the copy
            extra_writes.append((-1, pc - 1))
            instructions[pc - 1] = KernelCall(3, (out,))
    mentions: dict[int, set[int]] = {}
    writers: dict[int, set[int]] = {}
    for pc, a in enumerate(instructions):
        args = (a.move_from, a.move_to) if isinstance(a, MoveCall) else a.args  # type: ignore[attr-defined]
        for i in _optimize._expand(args, lists):
            mentions.setdefault(i, set()).add(pc)
        for i in rets[pc] or ():
            writers.setdefault(i, set()).add(pc)
    for v, pc in extra_writes:
        if v >= 0:
            writers.setdefault(v, set()).add(pc)
    plan = SimpleNamespace(values=tuple(values))
    cp = SimpleNamespace(lists=lists, template=template, plan=plan, slots=slots)
    mt = object.__new__(_optimize._Matcher)
    mt.to_numpy = dict(_optimize._NUMPY_OF)
    mt.cp, mt.values, mt.instructions, mt.rets = cp, plan.values, instructions, rets
    mt.op_names = ("dim_order_ops::_to_dim_order_copy.out", "aten::_to_copy.out", "aten::add.out", "aten::relu.out")
    mt.uses = _optimize.PlanUses(mentions=mentions, written=frozenset(written), outputs=frozenset(outputs),
                                 straight=True, writers=writers)
    mt.storage = object.__new__(_Storage)
    mt.storage.cp, mt.storage.inputs = cp, frozenset(inputs)
    mt.copied, mt._copies = {}, None
    return mt


@pytest.mark.parametrize("seed", range(8))
def test_the_constant_copy_table_in_c_is_the_python_one_on_random_plans(seed: int) -> None:
    """Random constant copies and readers (most foldable, many not): const_copies' answer is the
    Python code's for each instruction, and it leaves to it only the odd ones (a slot's dynamic
    flag not a bool)."""
    _need_match()
    ask = _optimize._ASK
    mt = _fuzz_copy_matcher(seed)
    copies = mt.const_copies()
    answers = [_optimize._copy_checks_py(mt, pc) for pc in range(len(mt.instructions))]
    assert all(c is ask or _same_checks(c, py) for c, py in zip(copies, answers, strict=True))
    for pc in (pc for pc, c in enumerate(copies) if c is ask):
        assert mt.cp.slots[mt.instructions[pc].args[3]].dynamic is 0  # type: ignore[attr-defined]  # noqa: F632
    passed = [c for c in answers if c is not None]
    assert len(passed) > 40 and sum(c is None for c in answers[: len(answers) // 2]) > 40
    assert {c[0] for c in passed} == {"dim_order_ops::_to_dim_order_copy.out", "aten::_to_copy.out"}
    assert any(c[3] is not None for c in passed) and any(c[7] for c in passed)
    # the odd inputs: of another type, None; an instruction or operator entry of another shape, _ASK
    from orchestra.program import KernelCall

    assert _optimize._match.const_copies(*([None] * 21), _optimize._ASK) is None  # type: ignore[union-attr]
    pc = next(pc for pc, c in enumerate(answers) if c is not None)
    mt.instructions[pc] = KernelCall(0, list(mt.instructions[pc].args))  # type: ignore[attr-defined]
    mt._copies = None
    assert mt.const_copies()[pc] is _optimize._ASK


# -- _uses.ew_chain: the elementwise chain walk in C ------------------------------------------------


def _need_chains() -> None:
    _need_match()
    if _optimize._match_chains is None:
        pytest.skip("orchestra.runtime._uses was not built (no C compiler)")


def _chain_c(mt: _optimize._Matcher, pc: int, taken: set[int]) -> object:
    """_uses.ew_chain's answer as ew_chain gives it (an _EwChain, None), or _ASK."""
    found = _optimize._match_chains.ew_chain(mt.ew_context(), pc, taken)  # type: ignore[union-attr]
    return found if found is None or found is _optimize._ASK else _optimize._EwChain(*found)


def _same_chain(c: object, py: object) -> bool:
    """Two ew_chain answers: equal, with the same types inside (a bool is not an int here)."""
    if c is None or py is None:
        return c is py
    kinds = lambda ch: [(type(p), [type(s) for s in spec]) for p, _, spec, _ in ch.ops]  # noqa: E731
    return c == py and kinds(c) == kinds(py) and type(c.x) is type(py.x)  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", _MATCH_PROGRAMS, ids=lambda p: p.name)
def test_the_chain_walk_in_c_gives_the_python_answers(path: pathlib.Path) -> None:
    """ew_chain's C walk gives ew_chain_py's answer for every instruction of every plan, with
    nothing taken, some instructions taken, and the constant copies optimize_steps takes first;
    it leaves none of these plans to the Python code."""
    import random

    _need_chains()
    for mt in _matchers(path):
        n = len(mt.instructions)
        rnd = random.Random(n)
        copies = {pc for pc in mt.copy_candidates() if _optimize._constant_copy(mt, pc) is not None}
        for taken in (set(), set(rnd.sample(range(n), n // 4)), copies):
            for pc in range(n):
                c = _chain_c(mt, pc, taken)
                assert c is not _optimize._ASK and _same_chain(c, mt.ew_chain_py(pc, taken)), (pc, taken)


def test_plans_are_compiled_the_same_with_the_chain_walk_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rewrites (constants' bytes included), step spans and derived values of every method
    of every program are the same with the C chain walk and without it."""
    _need_chains()
    on = [_compiled(p) for p in _MATCH_PROGRAMS]
    monkeypatch.setattr(_optimize, "_match_chains", None)
    assert [_compiled(p) for p in _MATCH_PROGRAMS] == on


_EW_NAMES = ("aten::relu.out", "aten::sigmoid.out", "aten::hardswish.out", "aten::clamp.out", "aten::hardtanh.out",
             "aten::add.out", "aten::sub.out", "aten::mul.out", "aten::div.out", "aten::_to_copy.out",
             "dim_order_ops::_to_dim_order_copy.out", "aten::mm.out")


def _random_ew_matcher(seed: int) -> _optimize._Matcher:
    """A _Matcher over a random straight-line plan of elementwise operations (clamp bounds of
    every kind, both operand orders, alphas, skippable copies between them, operands of other
    shapes and dtypes, outputs read later or returned)."""
    import random
    from types import SimpleNamespace

    from orchestra.program import Bool, Double, EValue, Int, KernelCall, Null, Tensor

    rnd = random.Random(seed)
    values: list[object] = []
    template: list[object] = []
    slots: list[object] = []
    planned = type("Slot", (), {"dynamic": False})()
    dynamic = type("Slot", (), {"dynamic": True})()

    def add(val: object, t: object = None, slot: object = None) -> int:
        values.append(EValue(val))  # type: ignore[arg-type]
        template.append(t)
        slots.append(slot)
        return len(values) - 1

    f32, f64 = 6, 7
    x0 = add(Tensor(f32, 0, (2, 3), (0, 1)), None, planned)
    acts = [x0, add(Tensor(f32, 0, (2, 3), (0, 1)), None, planned), add(Tensor(f32, 0, (2, 3), (0, 1)), None, dynamic)]
    others = [add(Tensor(f32, 0, shape, tuple(range(len(shape)))), np.ones(shape, np.float32))
              for shape in ((3,), (1,), (2, 3), (1, 3), (2, 1, 3), (4,))]
    others += [add(Tensor(f64, 0, (2, 3), (0, 1)), np.ones((2, 3)), None), add(Tensor(f32, 0, (2, 3), (0, 1)), None, None),
               add(Tensor(f32, 0, (2, 3), (0, 1), shape_dynamism=1), None, planned)]
    lits = [add(Int(v), v) for v in (0, 1, 2, 6)] + [add(Double(v), v) for v in (0.0, 1.0, float("nan"), -6.5)]
    lits += [add(Bool(True), True), add(Null(), None), add(Null(), None), add(Int(1), 1)]
    written_lit = lits[-1]
    instructions: list[object] = []
    rets: list[object] = []
    written = {written_lit}
    cur = x0
    for _ in range(rnd.randint(4, 14)):
        k = rnd.randrange(len(_EW_NAMES))
        name = _EW_NAMES[k]
        odd = rnd.random() < 0.15  # an out no chain takes (another dtype, shape, or not planned statically)
        out = add(Tensor(f64 if odd and rnd.random() < 0.3 else f32, 0, (3, 2) if odd and rnd.random() < 0.3 else (2, 3),
                         (0, 1)), None, rnd.choice((dynamic, None)) if odd and rnd.random() < 0.5 else planned)
        src = cur if rnd.random() < 0.8 else rnd.choice(acts + others)
        other = rnd.choice(others + acts + [cur, x0])
        if name in ("aten::clamp.out", "aten::hardtanh.out"):
            args = (src, rnd.choice(lits), rnd.choice(lits), out)
        elif name in ("aten::add.out", "aten::sub.out"):
            a, b = (src, other) if rnd.random() < 0.6 else (other, src)
            args = (a, b, rnd.choice(lits[:6] + [written_lit, lits[-3]]), out)
        elif name in ("aten::mul.out", "aten::div.out"):
            args = (src, other, out) if rnd.random() < 0.6 else (other, src, out)
        elif name.endswith("_copy.out") or "_to_" in name:
            args = (rnd.choice(others + [cur, x0]), lits[-2], lits[-2], out)
            for _ in range(rnd.choice((0, 0, 2))):  # a run of copies: more than a chain steps over
                extra = add(Tensor(f32, 0, (1,), (0,)), None, planned)
                instructions.append(KernelCall(k, (others[1], lits[-2], lits[-2], extra)))
                rets.append((extra,))
                written.add(extra)
        elif name == "aten::mm.out":
            args = (src, other, out)
        else:
            args = (src, out)
        instructions.append(KernelCall(k, args))
        rets.append((out,))
        written.add(out)
        if rnd.random() < 0.9:
            cur = out
    outputs = frozenset(rnd.sample(sorted(written - {written_lit}), 1))
    mentions: dict[int, set[int]] = {}
    for pc, a in enumerate(instructions):
        for i in a.args:  # type: ignore[attr-defined]
            mentions.setdefault(i, set()).add(pc)
    cp = SimpleNamespace(lists={}, template=template, slots=slots, plan=SimpleNamespace(values=tuple(values)),
                         meta=SimpleNamespace(operators=_EW_NAMES))
    uses = _optimize.PlanUses(mentions=mentions, written=frozenset(written), outputs=outputs, straight=True)
    mt = object.__new__(_optimize._Matcher)
    mt.to_numpy = dict(_optimize._NUMPY_OF)
    storage = object.__new__(_Storage)
    storage.cp = cp  # type: ignore[assignment]
    for k, v in {"cp": cp, "plan": cp.plan, "values": cp.plan.values, "instructions": instructions, "rets": rets,
                 "uses": uses, "storage": storage, "op_names": _EW_NAMES, "_ew_ops": None, "_ew_ctx": None}.items():
        setattr(mt, k, v)
    return mt


def test_the_chain_walk_in_c_on_random_plans() -> None:
    """On random plans reaching the branches the exported models don't (clamp bounds None,
    NaN or of the wrong kind, sub/div with the running value on the right, alphas, copies
    stepped over, operands that don't broadcast), the C walk gives the Python answer for
    every instruction; the branches are reached."""
    _need_chains()
    seen: dict[str, int] = {}
    for seed in range(400):
        mt = _random_ew_matcher(seed)
        n = len(mt.instructions)
        for taken in (set(), {seed % n}):
            for pc in range(n):
                c, py = _chain_c(mt, pc, taken), mt.ew_chain_py(pc, taken)
                assert c is not _optimize._ASK and _same_chain(c, py), (seed, pc, taken, c, py)
                for p, name, spec, _ in () if py is None else py.ops:
                    seen[name] = seen.get(name, 0) + 1
                    if spec[0] == "b" and spec[3]:
                        seen["right"] = seen.get("right", 0) + 1
                    if spec[0] == "u" and len(mt.instructions[p].args) == 4 and None in spec[2:]:
                        seen["one bound"] = seen.get("one bound", 0) + 1
                if py is not None and py.ops[-1][0] - py.ops[0][0] >= len(py.ops):
                    seen["skipped"] = seen.get("skipped", 0) + 1
    for k in ("aten::clamp.out", "aten::hardtanh.out", "aten::add.out", "aten::sub.out", "aten::div.out", "right",
              "one bound", "skipped"):
        assert seen.get(k, 0) > 0, (k, seen)


def test_the_chain_walk_leaves_odd_inputs_to_python() -> None:
    """Inputs of a shape _Matcher doesn't make give _ASK (the Python code then answers as it
    always did): a table entry left to Python, a taken that is not a set, an instruction out of
    range, a table of another length; a context that is not a tuple raises."""
    _need_chains()
    ask = _optimize._ASK
    mt = next(m for s in range(50) if (m := _random_ew_matcher(s))
              and any(m.ew_chain_py(pc, set()) for pc in range(len(m.instructions))))
    pc = next(pc for pc in range(len(mt.instructions)) if mt.ew_chain_py(pc, set()))
    ctx = mt.ew_context()
    ew = _optimize._match_chains  # type: ignore[union-attr]
    assert _optimize._EwChain(*ew.ew_chain(ctx, pc, set())) == mt.ew_chain_py(pc, set())
    assert ew.ew_chain(ctx, pc, frozenset()) is not ask
    assert ew.ew_chain(ctx, pc, [pc]) is ask and ew.ew_chain(ctx, pc, {pc}) is None
    assert ew.ew_chain(ctx, -1, set()) is ask and ew.ew_chain(ctx, len(mt.instructions), set()) is ask
    assert ew.ew_chain(ctx, 1 << 70, set()) is ask and ew.ew_chain(ctx, True, set()) is ask
    table = list(ctx[8])
    table[pc] = ask
    assert ew.ew_chain((*ctx[:8], table, *ctx[9:]), pc, set()) is ask
    table[pc] = ("x", [], 0)
    assert ew.ew_chain((*ctx[:8], table, *ctx[9:]), pc, set()) is ask
    assert ew.ew_chain((*ctx[:8], table[:-1], *ctx[9:]), pc, set()) is ask
    assert ew.ew_chain((*ctx[:6], dict(ctx[6]), list(ctx[7]), *ctx[8:]), pc, set()) is ask
    with pytest.raises(TypeError):
        ew.ew_chain(list(ctx), pc, set())
    with pytest.raises(TypeError):
        ew.ew_chain(ctx[:-1], pc, set())
    # With the C code off, or its table declined, the Python code answers alone.
    mt._ew_ctx = None
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_optimize, "_match_chains", None)
        assert mt.ew_context() == () and mt.ew_chain(pc, set()) == mt.ew_chain_py(pc, set())
    mt._ew_ctx, mt._ew_ops = None, []
    assert mt.ew_context() == () and mt.ew_chain(pc, set()) == mt.ew_chain_py(pc, set())


# -- _uses.ew_static_ok: an elementwise chain's memory checks in C ----------------------------------


def _need_static() -> None:
    if _optimize._match_static is None:
        pytest.skip("orchestra.runtime._uses was not built (no C compiler)")


def _static_c(mt: _optimize._Matcher, ew: _optimize._EwChain, skip: frozenset[int]) -> object:
    st = mt.storage
    ctx = (mt.cp.template, mt.cp.slots, mt.uses.written, st.regions, st.writes_at, np.ndarray, _optimize._ASK)
    return _optimize._match_static.ew_static_ok(ctx, ew.x, ew.ops, skip)  # type: ignore[union-attr]


def _chains_and_prefixes(mt: _optimize._Matcher, taken: set[int]) -> Iterator[_optimize._EwChain]:
    """Every chain ew_chain finds (the Python walk), and each prefix of two operations or more."""
    for pc in range(len(mt.instructions)):
        ew = mt.ew_chain_py(pc, taken)
        while ew is not None:
            yield ew
            ew = _optimize._EwChain(ew.x, ew.ops[:-1], ew.dtype) if len(ew.ops) > 2 else None


@pytest.mark.parametrize("path", _MATCH_PROGRAMS, ids=lambda p: p.name)
def test_the_chain_memory_checks_in_c_give_the_python_answers(path: pathlib.Path) -> None:
    """_uses.ew_static_ok gives _ew_static_ok_py's answer for every chain (and prefix) of every
    plan, with no instruction skipped and with the constant copies optimize_steps folds; it
    leaves none of them to the Python code (MobileNetV3 has both answers)."""
    _need_static()
    seen = set()
    for mt in _matchers(path):
        copies = frozenset(pc for pc in mt.copy_candidates() if _optimize._constant_copy(mt, pc) is not None)
        for taken, skip in ((set(), frozenset()), (set(copies), copies)):
            for ew in _chains_and_prefixes(mt, taken):
                c = _static_c(mt, ew, skip)
                assert c is not _optimize._ASK and c is _optimize._ew_static_ok_py(mt, ew, skip), (ew, skip)
                seen.add(c)
    if path.name == "mobilenet_v3.portable.pte":  # (a hardswish's division whose scalar shares the input's memory)
        assert seen == {True, False}


def test_plans_are_compiled_the_same_with_the_chain_memory_checks_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rewrites (constants' bytes included), step spans and derived values of every method
    of every program are the same with _ew_static_ok's checks in C and without them."""
    _need_static()
    on = [_compiled(p) for p in _MATCH_PROGRAMS]
    monkeypatch.setattr(_optimize, "_match_static", None)
    assert [_compiled(p) for p in _MATCH_PROGRAMS] == on


def _random_storage(mt: _optimize._Matcher, seed: int, slots: bool = False) -> None:
    """Give a random elementwise matcher's storage regions in two memories that often overlap,
    and the writes of its instructions (plus stray writes of other values); with ``slots``,
    make some planned values dynamic or not planned (after its chains were found: the walk
    takes static operands only)."""
    import random

    rnd = random.Random(seed)
    st = mt.storage
    st.regions = {}
    for i, slot in enumerate(mt.cp.slots):
        if slot is not None or rnd.random() < 0.1:  # (a region without a slot: answered all the same)
            lo = rnd.randrange(0, 32, 8)
            st.regions[i] = (rnd.randrange(2), lo, lo + rnd.choice((0, 8, 16, 24)))
    st.writes_at = [list(a.args[-1:]) for a in mt.instructions]  # type: ignore[attr-defined]
    for ws in st.writes_at:
        if rnd.random() < 0.3:
            ws.insert(0, rnd.randrange(len(mt.cp.slots)))
    if slots:
        dynamic = type("Slot", (), {"dynamic": True})()
        for i, slot in enumerate(mt.cp.slots):
            if slot is not None and rnd.random() < 0.1:
                mt.cp.slots[i] = rnd.choice((dynamic, None))


def test_the_chain_memory_checks_in_c_on_random_plans() -> None:
    """On random plans (dynamic and unplanned operands, operands written inside the chain,
    regions overlapping the output, instructions skipped), the C checks give the Python answer
    for every chain and prefix; every way to fail is reached."""
    _need_static()
    seen: dict[str, int] = {}
    for seed in range(400):
        mt = _random_ew_matcher(seed)
        chains = list(_chains_and_prefixes(mt, set()))
        _random_storage(mt, seed, slots=True)
        n = len(mt.instructions)
        for skip in (frozenset(), frozenset({seed % n, (seed // 3) % n})):
            for ew in chains:
                c, py = _static_c(mt, ew, skip), _optimize._ew_static_ok_py(mt, ew, skip)
                assert c is not _optimize._ASK and c is py, (seed, ew, skip)
                seen[str(py)] = seen.get(str(py), 0) + 1
                st = mt.storage
                for v, p in ew.reads():
                    if mt.constant(v) is None and not st.static(v):
                        seen["not static"] = seen.get("not static", 0) + 1
                    elif mt.constant(v) is None and p != ew.pcs[0] and v != ew.out and st.overlap(v, ew.out):
                        seen["overlaps out"] = seen.get("overlaps out", 0) + 1
                    elif mt.constant(v) is None and st.written_between(v, p, ew.pcs[-1], skip | set(ew.pcs)):
                        seen["written"] = seen.get("written", 0) + 1
    for k in ("True", "False", "not static", "overlaps out", "written"):
        assert seen.get(k, 0) > 0, (k, seen)


def test_the_chain_memory_checks_leave_odd_inputs_to_python() -> None:
    """Inputs of a shape _Matcher and _Storage don't make give _ASK (the Python code then
    answers, raising where it always did): an index out of range, a value or pc not an int, a
    spec of another shape, skip not a set, a writes list not a list; no operations; a context
    that is not a tuple, or short, raises."""
    _need_static()
    ask = _optimize._ASK
    f = _optimize._match_static.ew_static_ok  # type: ignore[union-attr]
    mt, ew = next((m, e) for s in range(50) if _random_storage(m := _random_ew_matcher(s), s) is None
                  for e in _chains_and_prefixes(m, set()) if _optimize._ew_static_ok_py(m, e))
    st = mt.storage
    ctx = (mt.cp.template, mt.cp.slots, mt.uses.written, st.regions, st.writes_at, np.ndarray, ask)
    assert f(ctx, ew.x, ew.ops, frozenset()) is True and f(ctx, ew.x, ew.ops, set()) is True
    assert f(ctx, ew.x, ew.ops, [1]) is ask and f(ctx, ew.x, (), frozenset()) is ask
    assert f(ctx, ew.x, list(ew.ops), frozenset()) is ask
    assert f(ctx, len(mt.cp.template), ew.ops, frozenset()) is ask and f(ctx, -1, ew.ops, frozenset()) is ask
    assert f(ctx, 1 << 70, ew.ops, frozenset()) is ask and f(ctx, float(ew.x), ew.ops, frozenset()) is ask
    op = ew.ops[0]
    for odd in ((float(op[0]), *op[1:]), (op[0], op[1], list(op[2]), op[3]), (op[0], op[1], op[2][:2], op[3]),
                op[:3], (op[0], op[1], (b"u", *op[2][1:]), op[3])):
        assert f(ctx, ew.x, (odd, *ew.ops[1:]), frozenset()) is ask, odd
    assert f((ctx[0], ctx[1][:ew.x], *ctx[2:]), ew.x, ew.ops, frozenset()) is ask
    for k, odd in ((0, tuple(ctx[0])), (1, tuple(ctx[1])), (2, list(ctx[2])), (3, list(ctx[3].items())),
                   (4, tuple(ctx[4])), (5, None)):
        assert f((*ctx[:k], odd, *ctx[k + 1:]), ew.x, ew.ops, frozenset()) is ask, k
    # A writes entry, region or slot of another shape, where the checks reach it (a writes
    # entry: in a chain that steps over an instruction).
    mt2, ew2 = next((m, e) for s in range(400) if _random_storage(m := _random_ew_matcher(s), s) is None
                    for e in _chains_and_prefixes(m, set()) if _optimize._ew_static_ok_py(m, e)
                    and any(q not in e.pcs for q in range(e.pcs[0], e.pcs[-1])))
    ctx2 = (mt2.cp.template, mt2.cp.slots, mt2.uses.written, mt2.storage.regions, mt2.storage.writes_at, np.ndarray, ask)
    assert f(ctx2, ew2.x, ew2.ops, frozenset()) is True
    odd_writes = [[float(w) for w in ws] + [0.5] for ws in ctx2[4]]
    assert f((*ctx2[:4], odd_writes, *ctx2[5:]), ew2.x, ew2.ops, frozenset()) is ask
    odd_writes = [(*ws,) for ws in ctx2[4]]
    assert f((*ctx2[:4], odd_writes, *ctx2[5:]), ew2.x, ew2.ops, frozenset()) is ask
    assert f((*ctx2[:4], ctx2[4][:ew2.pcs[0] + 1], *ctx2[5:]), ew2.x, ew2.ops, frozenset()) is ask
    odd_regions = {i: (float(r[0]), r[1], r[2]) for i, r in ctx[3].items()}
    planned_read = any(mt.constant(v) is None for v, _ in ew.reads())
    assert (f((*ctx[:3], odd_regions, *ctx[4:]), ew.x, ew.ops, frozenset()) is ask) == planned_read
    odd_slot = type("Slot", (), {"dynamic": 0})()
    odd_slots = [odd_slot if s is not None else None for s in ctx[1]]
    assert (f((ctx[0], odd_slots, *ctx[2:]), ew.x, ew.ops, frozenset()) is ask) == planned_read
    with pytest.raises(TypeError):
        f(list(ctx), ew.x, ew.ops, frozenset())
    with pytest.raises(TypeError):
        f(ctx[:-1], ew.x, ew.ops, frozenset())
    # What _ew_static_ok does with an ask: the Python code answers (and raises where it does).
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_optimize, "_match_static", None)
        assert _optimize._ew_static_ok(mt, ew) is True
    bad = _optimize._EwChain(len(mt.cp.template) + 5, ew.ops, ew.dtype)
    with pytest.raises(IndexError):
        _optimize._ew_static_ok(mt, bad)
# -- _Matcher's layout chains in C (_optimize._match_chains) against its Python code ------------

def _c_producer(mt: _optimize._Matcher, value: object, reader: int) -> object:
    """producer's C answer (with the matcher's cache of group defines, as layout_chain's)."""
    return _optimize._match_chains.producer(mt.storage.same_bytes(), mt._chain_defs, mt.uses.defines,  # type: ignore[union-attr]
                                            value, reader, _optimize._ASK)


def _c_chain(mt: _optimize._Matcher, pc: int, k: int, links: object) -> object:
    """_uses.layout_chain's answer for operand ``k`` of instruction ``pc`` as tuples, after
    checking that its _Link objects are those tuples'."""
    args = (mt.instructions[pc].args[k], pc, _optimize._MAX_LINKS, links, mt.storage.same_bytes(), mt._chain_defs,  # type: ignore[attr-defined]
            mt.uses.defines, mt.values, mt.cp.template, mt.to_numpy, _optimize.Tensor)
    found = _optimize._match_chains.layout_chain(*args, None, _optimize._ASK)  # type: ignore[union-attr]
    objs = _optimize._match_chains.layout_chain(*args, _optimize._Link, _optimize._ASK)  # type: ignore[union-attr]
    if isinstance(found, list):
        assert all(type(o) is _optimize._Link for o in objs)
        assert [tuple(getattr(o, f) for f in _optimize._Link.__slots__) for o in objs] == found
    else:
        assert objs is found
    return found


def _c_sources(mt: _optimize._Matcher, links: list[_optimize._Link], pc: int, skip: frozenset[int]) -> object:
    """_uses.chain_sources' answer for ``links`` read by instruction ``pc``."""
    st = mt.storage
    return _optimize._match_chains.chain_sources(  # type: ignore[union-attr]
        links, pc, skip, _optimize._Link, mt.instructions, mt.cp.lists, mt.values, mt.cp.template, mt.uses.written,
        mt.cp.slots, mt.uses.outputs, st.inputs, st.regions, st.writes_at, mt.to_numpy, _optimize.Tensor,
        np.ndarray, _optimize._ASK)


def _chain_questions(mt: _optimize._Matcher) -> Iterator[tuple[int, int]]:
    """(reader, operand) of every tensor operand of every instruction (beyond what the plan's
    matmuls and delegates ask: a superset of the questions optimize_steps asks)."""
    for pc, a in enumerate(mt.instructions):
        for k in range(len(getattr(a, "args", ()))):
            yield pc, k


@pytest.mark.parametrize("path", _MATCH_PROGRAMS, ids=lambda p: p.name)
def test_the_layout_chains_in_c_are_the_python_ones(path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """For every operand of every instruction, the chain walked in C is layout_chain_py's and
    was not left to it; producer's C answer is the Python one for every (value, reader) the
    walks ask and for every planned value at a few readers."""
    _need_match()
    asked: list[tuple[int, int]] = []
    real = _optimize._Matcher.producer

    def spy(self: _optimize._Matcher, value: int, reader: int) -> tuple[int, int] | None:
        asked.append((value, reader))
        return real(self, value, reader)

    monkeypatch.setattr(_optimize._Matcher, "producer", spy)
    answers: set[tuple[int, ...]] = set()
    for mt in _matchers(path):
        links = mt.layout_links()
        for pc, k in _chain_questions(mt):
            found = _c_chain(mt, pc, k, links)
            assert found is not None and found is not _optimize._ASK, (pc, k)
            assert [_optimize._Link(*t) for t in found] == mt.layout_chain(pc, k) == mt.layout_chain_py(pc, k), (pc, k)
            chain = mt.layout_chain(pc, k)
            if chain:  # chain_sources' answer, alone and with copies of other operands left out
                for skip in (frozenset(), frozenset({chain[0].pc}), frozenset(range(max(0, pc - 5), pc))):
                    got = _c_sources(mt, chain, pc, skip)
                    assert got is not _optimize._ASK and got == mt.chain_sources_py(chain, pc, skip), (pc, k)
                    answers.add(got)
        st = mt.storage
        for value in st.regions:
            asked.extend((value, r) for r in {0, 1, st.n // 2, st.n - 1, st.n, *mt.uses.defines.get(value, ())})
        for value, reader in asked:
            assert _c_producer(mt, value, reader) == real(mt, value, reader), (value, reader)
        asked.clear()
    if path.name.startswith(("vit_tiny", "bert", "gpt2", "transformer")):
        assert () in answers and len(answers) > 1  # (chains cut and kept)


def _fuzz_chain_matcher(seed: int) -> _optimize._Matcher:
    """A _Matcher (made without a program: what producer and layout_chain read) over random
    same-bytes groups, defines and layout links: chains of every length up to past _MAX_LINKS,
    links whose out is another value of the group (read with another shape), values defined
    several times, at one position by several of a group, not at all, links left to Python."""
    from types import SimpleNamespace

    from orchestra.program import EValue, Tensor

    rng = np.random.default_rng(seed)
    nv, n = 80, 160
    values = tuple(EValue(Tensor(6, int(rng.random() < 0.03), (int(rng.integers(1, 5)), 6), (0, 1))) for _ in range(nv))
    groups: dict[int, list[int]] = {}
    pool = [int(v) for v in rng.permutation(nv)]
    while len(pool) > 1 and len(groups) < nv // 2:
        g = [pool.pop() for _ in range(min(len(pool), int(rng.integers(2, 5))))]
        for x in g:
            groups[x] = g
    defines: dict[int, set[int]] = {}
    for v in range(nv):
        for _ in range(int(rng.integers(0, 4))):
            defines.setdefault(v, set()).add(int(rng.integers(0, n)))
    for g in set(map(id, groups.values())):  # several of a group defined at one position
        members = next(x for x in groups.values() if id(x) == g)
        if rng.random() < 0.3:
            w = int(rng.integers(0, n))
            for x in members:
                defines.setdefault(x, set()).add(w)
    ask = _optimize._ASK
    links: list[object] = []
    for pc in range(n):
        r = rng.random()
        outs = [v for v, ws in defines.items() if pc in ws]
        if r < 0.15 or not outs:
            links.append(None)
        elif r < 0.18:
            links.append(ask)
        else:
            out = outs[int(rng.integers(len(outs)))]
            links.append((int(rng.integers(nv)), out, (("T", (1, 0)),)))
    plan = SimpleNamespace(values=values)
    cp = SimpleNamespace(template=[None] * nv, plan=plan)
    mt = object.__new__(_optimize._Matcher)
    mt.to_numpy = dict(_optimize._NUMPY_OF)
    mt.cp, mt.values, mt.instructions = cp, values, [SimpleNamespace(args=(int(v),)) for v in rng.integers(0, nv, n)]
    mt.uses = _optimize.PlanUses(mentions={}, written=frozenset(), defines=defines, outputs=frozenset(), straight=True)
    mt.storage = object.__new__(_Storage)
    mt.storage._same_bytes = groups
    mt._links, mt._chain_defs, mt._group_defs = links, {}, {}
    return mt


@pytest.mark.parametrize("seed", range(8))
def test_the_layout_chains_in_c_are_the_python_ones_on_random_plans(seed: int) -> None:
    """Random groups, defines and links: producer's C answer is the Python one for every value
    at every reader; each chain walked in C is the Python one, or left to it (a link the table
    leaves to Python, a value read with another shape that isn't static: Python's raises)."""
    _need_match()
    mt = _fuzz_chain_matcher(seed)
    n, nv = len(mt.instructions), len(mt.values)
    for value in range(nv):
        for reader in range(-1, n + 2):
            assert _c_producer(mt, value, reader) == mt.producer(value, reader), (value, reader)
    lengths, left = set(), 0
    for pc in range(n):
        found = _c_chain(mt, pc, 0, mt._links)
        try:
            py = mt.layout_chain_py(pc, 0)
        except TypeError:  # static_tensor(cur) is None: the C code leaves it
            assert found is _optimize._ASK
            left += 1
            continue
        if found is _optimize._ASK:
            left += 1
            assert mt.layout_chain(pc, 0) == py
            continue
        assert [_optimize._Link(*t) for t in found] == py == mt.layout_chain(pc, 0), pc  # type: ignore[union-attr]
        lengths.add(len(py))
    assert {0, 1, 2} <= lengths and left < n // 2


def test_the_layout_chains_leave_odd_inputs_to_python() -> None:
    """Inputs of another type: None (the Python code walks); a value not an exact int (a bool, a
    big int), a define not an int, defines not a set, a link of another shape: _ASK."""
    _need_match()
    u, ask = _optimize._match_chains, _optimize._ASK
    assert u is not None
    g = [1, 2]
    groups, defines = {1: g, 2: g}, {1: {5}, 2: {5, 7}}
    table: dict[int, bytes] = {}
    assert u.producer(groups, table, defines, 2, 6, ask) == (5, 2)
    assert table[1] is table[2]  # one per group
    assert u.producer(groups, table, defines, 1, 6, ask) == (5, 1)
    assert u.producer(groups, table, defines, 1, 9, ask) == (7, 2)
    assert u.producer(groups, table, defines, 1, 5, ask) is None
    assert u.producer({}, {}, {3: {4, 8}}, 3, 9, ask) == (8, 3) and u.producer({}, {}, {}, 3, 9, ask) is None
    for odd in ([], {}, {}), ({}, [], {}), ({}, {}, []):
        assert u.producer(*odd, 1, 9, ask) is ask
    assert u.producer({}, {}, {}, True, 9, ask) is ask and u.producer({}, {}, {}, 1 << 70, 9, ask) is ask
    assert u.producer({}, {}, {3: {True}}, 3, 9, ask) is ask and u.producer({}, {}, {3: [4]}, 3, 9, ask) is ask
    assert u.producer({}, {1: b"123"}, {}, 1, 9, ask) is ask  # (a cache it did not make)
    assert u.producer({1: (1, 2)}, {}, {}, 1, 9, ask) is ask  # a group not a list
    assert u.producer({1: [True, 1]}, {}, {}, 1, 9, ask) is ask  # a member not an exact int
    assert u.producer({1: [2, 3]}, {}, {}, 1, 9, ask) is ask  # not in its own group
    from orchestra.program import EValue, Tensor

    values = (EValue(Tensor(6, 0, (2, 3), (0, 1))), EValue(Tensor(6, 0, (3, 2), (0, 1))))
    args = ([None, (0, 1, (("T", (1, 0)),))], {}, {}, {1: {1}}, values, [None, None], dict(_optimize._NUMPY_OF), Tensor, None,
            ask)
    assert u.layout_chain(1, 2, 8, *args) == [(1, 0, 1, 2, 1, (("T", (1, 0)),))]
    assert u.layout_chain(1, 2, 0, *args) == []
    assert u.layout_chain(True, 2, 8, *args) is ask
    assert u.layout_chain(1, 2, 8, *args[:-2], _optimize._Link, ask) == [_optimize._Link(1, 0, 1, 2, 1, (("T", (1, 0)),))]
    for k, odd in ((0, ()), (1, []), (2, []), (3, ()), (4, list(values)), (5, ()), (6, []), (7, 0), (8, 0)):
        bad = list(args)
        bad[k] = odd
        assert u.layout_chain(1, 2, 8, *bad) is None, k
    for link in (ask, (0, 1), (0, True, ()), (True, 1, ()), [0, 1, ()]):
        bad = list(args)
        bad[0] = [None, link]
        assert u.layout_chain(1, 2, 8, *bad) is ask, link
    bad = list(args)
    bad[0] = [None, None, None]
    bad[3] = {1: {7}}
    assert u.layout_chain(1, 9, 8, *bad) is ask  # a define past the table
    bad = list(args)
    bad[4] = (EValue(Tensor(6, 0, (2, 3), (0, 1))), EValue(Tensor(6, 0, (3, 2), (0, 1), shape_dynamism=1)))
    bad[0] = [None, (0, 2, ())]
    bad[1], bad[2] = {1: [1, 2], 2: [1, 2]}, {}
    bad[3] = {2: {1}}
    assert u.layout_chain(1, 2, 8, *bad) is ask  # read as a value of dynamic shape: Python's raises


@pytest.mark.parametrize("seed", range(8))
def test_chain_sources_in_c_are_the_python_ones_on_random_plans(seed: int) -> None:
    """Random links over random storage (readers naming a link's result once, twice or in a
    list, results that are plan outputs, writes between, memories shared, constants written or
    planned, sources of dynamic shape, inputs, copies left out): chain_sources' C answer is
    chain_sources_py's for each, none left to it; odd links and values are."""
    from types import SimpleNamespace

    from orchestra.program import EValue, Tensor

    _need_match()
    rng = np.random.default_rng(seed)
    nv, n = 60, 40
    values = tuple(EValue(Tensor(6, 0, (2, 3), (0, 1), shape_dynamism=int(rng.random() < 0.1))) for _ in range(nv))
    regions = {v: (int(rng.integers(0, 3)), int(lo), int(lo) + int(rng.integers(1, 40)))
               for v in range(nv) if rng.random() < 0.7 for lo in [rng.integers(0, 200)]}
    template: list[object] = [np.zeros(2, np.float32) if rng.random() < 0.2 else None for _ in range(nv)]
    slots = [object() if v in regions or rng.random() < 0.1 else None for v in range(nv)]
    lists = {v: (False, tuple(int(x) for x in rng.integers(-1, nv, 3))) for v in range(nv) if rng.random() < 0.1}
    instructions = [SimpleNamespace(args=tuple(int(x) for x in rng.integers(0, nv, int(rng.integers(1, 5)))))
                    for _ in range(n)]
    writes_at = [[int(x) for x in rng.integers(0, nv, int(rng.integers(0, 3)))] for _ in range(n)]
    cp = SimpleNamespace(template=template, slots=slots, lists=lists, plan=SimpleNamespace(values=values))
    mt = object.__new__(_optimize._Matcher)
    mt.to_numpy = dict(_optimize._NUMPY_OF)
    mt.cp, mt.values, mt.instructions = cp, values, instructions
    mt.uses = _optimize.PlanUses(mentions={}, written=frozenset(int(x) for x in rng.integers(0, nv, 6)),
                                 outputs=frozenset(int(x) for x in rng.integers(0, nv, 4)), straight=True)
    mt.storage = st = object.__new__(_Storage)
    st.regions, st.writes_at, st.inputs = regions, writes_at, frozenset(int(x) for x in rng.integers(0, nv, 6))
    answers = set()
    for _ in range(300):
        pc = int(rng.integers(1, n))
        links, reader = [], pc
        for _ in range(int(rng.integers(1, 6))):
            lpc = int(rng.integers(0, reader)) if reader else 0
            args = instructions[reader].args
            read = args[int(rng.integers(len(args)))] if rng.random() < 0.8 else int(rng.integers(nv))
            links.append(_optimize._Link(lpc, int(rng.integers(nv)), read if rng.random() < 0.7 else int(rng.integers(nv)),
                                         reader, read, ()))
            reader = lpc
        skip = frozenset(int(x) for x in rng.integers(0, n, int(rng.integers(0, 4))))
        got = _c_sources(mt, links, pc, skip)
        assert got is not _optimize._ASK and got == mt.chain_sources_py(links, pc, skip) == mt.chain_sources(links, pc, skip)
        answers.add(got)
    assert () in answers and any(len(a) > 1 for a in answers) and len(answers) > 5
    # odd links and values: left to Python
    ask = _optimize._ASK
    ln = _optimize._Link(0, 1, 2, 1, instructions[1].args[0], ())
    assert _c_sources(mt, [SimpleNamespace(**{f: getattr(ln, f) for f in ln.__slots__})], 2, frozenset()) is ask
    assert _c_sources(mt, [_optimize._Link(0, 1, 2, n, 3, ())], 2, frozenset()) is ask  # a reader past the plan
    assert _c_sources(mt, [_optimize._Link(0, True, 2, 1, 3, ())], 2, frozenset()) is ask
    assert _c_sources(mt, [ln], 2, frozenset({True})) is ask
    assert _c_sources(mt, [ln], 2, frozenset(range(100))) is ask  # more left out than handled
    assert _optimize._match_chains.chain_sources(None, 0, *([None] * 15), ask) is None  # type: ignore[union-attr]


@pytest.mark.parametrize("path", _MATCH_PROGRAMS, ids=lambda p: p.name)
def test_the_views_kept_per_plan_are_made_afresh_the_same(path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """optimize_steps' kept views (_memo_views): every view made from one it kept gives what a
    fresh _view_fn gives, on the very arrays a Method reads (its derived views' values, each
    method's outputs); _stays_a_view's kept answers are the fresh ones."""
    made: list[tuple[tuple[object, ...], object]] = []
    real_view_fn, real_stays = _optimize._view_fn, _optimize._stays_a_view
    stays: list[tuple[object, int, object, bool]] = []

    def view_fn(ops: object) -> object:
        fn = real_view_fn(ops)  # type: ignore[arg-type]
        made.append((ops, fn))  # type: ignore[arg-type]
        return fn

    def stays_a_view(cp: object, src: int, fn: object) -> bool:
        got = real_stays(cp, src, fn)  # type: ignore[arg-type]
        stays.append((cp, src, fn, got))
        return got

    monkeypatch.setattr(_optimize, "_view_fn", view_fn)
    monkeypatch.setattr(_optimize, "_stays_a_view", stays_a_view)
    prog = load_program(path)
    for name in prog.method_names:
        made.clear()
        cp = prog._compiled_plan(name)
        fns = {id(fn): ops for ops, fn in made}
        for i, src, fn in cp.derived:
            if id(fn) in fns:  # a kept function: the ops it was made for
                x = np.arange(int(np.prod(cp.slots[src].bound)), dtype=np.float64).reshape(cp.slots[src].bound)
                assert np.array_equal(fn(x), real_view_fn(fns[id(fn)])(x))  # type: ignore[arg-type]
        assert len({ops for ops, _ in made}) == len(made)  # each made once per plan
    for cp, src, fn, got in stays:
        assert real_stays(cp, src, fn) == got  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(4))
def test_the_views_kept_are_the_fresh_ones_on_random_chains(seed: int) -> None:
    """_Views' answers (kept per plan) for random sources and chains of transposes, reshapes
    and slices, many sharing a shape, a first op, an order or a layout: each the fresh
    _simplify / _view_fn / _stays_a_view answer."""
    from types import SimpleNamespace

    from orchestra.runtime._method import _Slot

    rng = np.random.default_rng(seed)
    slots = []
    for _ in range(30):
        shape = tuple(int(d) for d in rng.choice([1, 2, 3, 4], int(rng.integers(1, 4))))
        order = tuple(int(d) for d in (rng.permutation(len(shape)) if rng.random() < 0.3 else range(len(shape))))
        slot = object.__new__(_Slot)
        slot.bound, slot.dim_order, slot.dynamic = shape, order, bool(rng.random() < 0.1)
        slot.dtype = np.dtype(np.float32 if rng.random() < 0.8 else np.int64)
        slots.append(slot if rng.random() > 0.05 else None)
    cp = SimpleNamespace(slots=slots)
    views = _optimize._Views(cp)  # type: ignore[arg-type]
    seen = set()
    for _ in range(400):
        src = int(rng.integers(len(slots)))
        shape = slots[src].bound if slots[src] is not None else (2, 3)
        raw, cur = [], shape
        for _ in range(int(rng.integers(1, 4))):
            r = rng.random()
            if r < 0.4:
                op = ("T", tuple(int(d) for d in rng.permutation(len(cur))))
            elif r < 0.8:
                op = ("R", tuple(int(d) for d in rng.permutation((*cur, 1)[: len(cur) + int(rng.integers(0, 2))])))
            else:
                dim = int(rng.integers(len(cur)))
                op = ("S", (dim, int(rng.integers(0, 2)), None, int(rng.integers(1, 3))))
            nxt = _optimize._apply_shape(cur, [op])  # type: ignore[list-item]
            if nxt is None:
                break
            raw.append(op)
            cur = nxt
        ops, fn = views.of(shape, tuple(raw))  # type: ignore[arg-type]
        assert ops == _optimize._simplify(shape, raw)  # type: ignore[arg-type]
        x = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
        assert np.array_equal(fn(x), _optimize._view_fn(ops)(x))
        assert views.stays(src, ops, fn) == _optimize._stays_a_view(cp, src, _optimize._view_fn(ops))  # type: ignore[arg-type]
        seen.add(ops)
    assert len(seen) > 20 and len(views.memo) < 1200
