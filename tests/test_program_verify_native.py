"""``orchestra.program._decode.plain_values`` / ``plain_instructions`` (the verifier's fast
paths in C) and ``extra_info_values`` (behind ``orchestra.program.tensors_with_extra_info``).

``_verify_plan`` checks every value and instruction of a plan. Where the extension is built, C
first vouches for the values and instructions that pass those checks (a tensor that
``_plain_tensor_ok`` accepts, a TensorList whose items are in range, an instruction whose
indices are in range) and Python checks only the rest, naming what is wrong. The contract: C
vouches only for what Python's checks accept, so a load gives the same ProgramDef, or the
same error type and message, with the C path, with the C decoder but Python's verification,
and with no extension at all. These tests check that on every fixture and real model present
and on thousands of programs edited to be wrong in each way the verifier knows. Skipped where
the extension is not built.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import pathlib
import struct
import types
from collections.abc import Iterator

import numpy as np
import pytest

from orchestra.program import _reader, _schema as S, dumps, loads, tensors_with_extra_info
from orchestra.program._reader import Limits

_decode = pytest.importorskip("orchestra.program._decode", reason="the optional C extension is not built")

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = pathlib.Path(__file__).parent / "fixtures"
FIXTURE_FILES = sorted(FIXTURES.rglob("*.pte")) + sorted((ROOT.parent / "shared" / "fixtures").glob("*.pte"))


def _real_model_files() -> list[pathlib.Path]:
    """Exported real models where a cache of them is present (benchmarks/real_models.py's
    default cache, or $ORCHESTRA_REAL_MODELS); none in CI."""
    dirs = [pathlib.Path.home() / ".cache" / "orchestra" / "real_models"]
    if os.environ.get("ORCHESTRA_REAL_MODELS"):
        dirs.append(pathlib.Path(os.environ["ORCHESTRA_REAL_MODELS"]))
    found: set[pathlib.Path] = set()
    for d in dirs:
        if d.is_dir():
            found.update(d.glob("v1-*/*.pte"))
            found.update(d.glob("*.pte"))
    return sorted(found)


def _id(p: pathlib.Path) -> str:
    return f"{p.parent.name}/{p.name}"


# The three ways to load: the C verifier (and decoder), the C decoder with Python's
# verification, and no extension at all.
_DECODER_ONLY = types.SimpleNamespace(**{k: getattr(_decode, k) for k in ("evalues", "instructions", "segments", "named_data")})
_MODES = {"c": _decode, "c decoder, python verifier": _DECODER_ONLY, "python": None}


def _same(a: object, b: object) -> bool:
    """Equal and of the same types all the way down (memoryviews by their bytes, floats by
    their bits)."""
    if type(a) is not type(b):
        return False
    if dataclasses.is_dataclass(a):
        return all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, memoryview):
        return a.tobytes() == b.tobytes()
    return a == b


def _with(native: object, fn):  # noqa: ANN001, ANN202
    saved = _reader._native_decode
    _reader._native_decode = native
    try:
        return fn()
    finally:
        _reader._native_decode = saved


def _outcome(data: bytes, limits: Limits | None, native: object) -> object:
    def run() -> object:
        try:
            return loads(data, limits=limits)
        except Exception as exc:  # noqa: BLE001 - compared by type and message
            return (type(exc), str(exc))

    return _with(native, run)


def _agree(data: bytes, limits: Limits | None = None) -> str:
    """Loads ``data`` the three ways; they must give the same program or the same error."""
    want = _outcome(data, limits, None)
    for mode, native in _MODES.items():
        if native is None:
            continue
        got = _outcome(data, limits, native)
        if isinstance(want, tuple):
            assert got == want, f"{mode}: {got} where Python says {want}"
        else:
            assert not isinstance(got, tuple), f"{mode}: {got} where Python loads the program"
            assert _same(got, want), f"{mode}: another program"
    return "refused" if isinstance(want, tuple) else "loaded"


# -- what C vouches for, value by value -----------------------------------------------------------
def _nconst(prog: S.ProgramDef) -> int:
    if prog.constant_buffer:
        return len(prog.constant_buffer)
    return 0 if prog.constant_segment is None else len(prog.constant_segment.offsets)


def _python_fast_path(prog: S.ProgramDef, plan: S.ExecutionPlan, limits: Limits) -> set[int]:
    """The values the fast path of _verify_plan's Python loop lets through."""
    nv, out = len(plan.values), set()
    for i, ev in enumerate(plan.values):
        v = ev.val
        if isinstance(v, S.Tensor):
            ok = _reader._plain_tensor_ok(v, limits, plan.non_const_buffer_sizes, _nconst(prog), prog)
        elif isinstance(v, (S.TensorList, S.OptionalTensorList)):
            ok = all(0 <= x < nv or (x == -1 and isinstance(v, S.OptionalTensorList)) for x in v.items)
        else:
            ok = True
        if ok:
            out.add(i)
    return out


def _c_vouches(prog: S.ProgramDef, plan: S.ExecutionPlan, limits: Limits) -> set[int]:
    unvouched = list(_with(_decode, lambda: _reader._unvouched_values(prog, plan, limits)))
    assert unvouched == sorted(set(unvouched)), "not in order, or repeated"
    return set(range(len(plan.values))) - set(unvouched)


def _check_extra_info(prog: S.ProgramDef) -> None:
    """tensors_with_extra_info finds the same values with and without the extension."""
    for plan in prog.execution_plan:
        want = [i for i, ev in enumerate(plan.values) if getattr(ev.val, "extra_tensor_info", None) is not None]
        for native in _MODES.values():
            assert _with(native, lambda p=plan: tensors_with_extra_info(p)) == want


def _check_vouching(prog: S.ProgramDef, limits: Limits, exact: bool) -> None:
    """C vouches only for values Python's fast path accepts (for every value of a file as
    exported: for exactly those), and only for instructions Python's checks accept."""
    _check_extra_info(prog)
    for plan in prog.execution_plan:
        c, py = _c_vouches(prog, plan, limits), _python_fast_path(prog, plan, limits)
        assert c <= py, f"C vouches for values {sorted(c - py)[:10]} that Python checks"
        if exact:
            assert c == py, f"C leaves values {sorted(py - c)[:10]} to Python"
        nv, nops, ndel = len(plan.values), len(plan.operators), len(plan.delegates)
        for chain in plan.chains:
            left = set(_with(_decode, lambda ch=chain: _reader._unvouched_instructions(ch.instructions, nv, nops, ndel)))
            for i, ins in enumerate(chain.instructions):
                ok = _instruction_ok(ins.instr_args, nv, nops, ndel, len(chain.instructions))
                if i not in left:
                    assert ok, f"C vouches for {ins}"
                elif exact:
                    assert not ok, f"C leaves a good instruction to Python: {ins}"


def _instruction_ok(a: object, nv: int, nops: int, ndel: int, n: int) -> bool:
    if isinstance(a, S.KernelCall):
        return 0 <= a.op_index < nops and all(0 <= x < nv for x in a.args)
    if isinstance(a, S.DelegateCall):
        return 0 <= a.delegate_index < ndel and all(0 <= x < nv for x in a.args)
    if isinstance(a, S.MoveCall):
        return 0 <= a.move_from < nv and 0 <= a.move_to < nv
    if isinstance(a, S.JumpFalseCall):
        return 0 <= a.cond_value_index < nv and 0 <= a.destination_instruction <= n
    return 0 <= a.value_index < nv


def test_the_extension_vouches_and_is_used() -> None:
    assert _reader._native_decode is _decode
    prog = loads((FIXTURES / "mlp.pte").read_bytes())
    plan = prog.execution_plan[0]
    assert list(_reader._unvouched_values(prog, plan, Limits())) == []
    with pytest.MonkeyPatch.context() as m:  # and not without it
        m.setattr(_reader, "_native_decode", None)
        assert list(_reader._unvouched_values(prog, plan, Limits())) == list(range(len(plan.values)))
        m.setattr(_reader, "_native_decode", _DECODER_ONLY)
        assert list(_reader._unvouched_values(prog, plan, Limits())) == list(range(len(plan.values)))


@pytest.mark.parametrize("path", FIXTURE_FILES + _real_model_files(), ids=_id)
def test_every_file_loads_the_same_and_c_vouches_for_exactly_the_fast_path(path: pathlib.Path) -> None:
    data = path.read_bytes()
    assert _agree(data) == "loaded"
    prog = loads(data)
    _check_vouching(prog, Limits(), exact=True)
    for limits in (Limits(max_numel=None), Limits(max_numel=1 << 100), Limits(max_numel=0), Limits(max_numel=-1)):
        _check_vouching(prog, limits, exact=True)


# -- programs edited to be wrong ------------------------------------------------------------------
ET = S.ExtraTensorInfo
U32 = (1 << 32) - 1


def _nbytes(t: S.Tensor) -> int:
    return int(np.prod(t.sizes, dtype=object)) * _reader._ITEMSIZE.get(t.scalar_type, 1)


def _tensor_edits(t: S.Tensor, arenas: tuple[int, ...], nconst: int) -> list[dict]:
    """Edits of one tensor, each at or just past an edge a check of _verify_plan draws."""
    n, sizes = len(t.sizes), t.sizes
    edits: list[dict] = [dict(scalar_type=x) for x in (-1, 0, 8, 11, 29, 30, 127)]
    edits += [dict(storage_offset=x) for x in (1, -1)] + [dict(shape_dynamism=x) for x in (-1, 1, 2, 3)]
    edits += [dict(sizes=s) for s in (
        ((-1,) + sizes[1:]) if n else (-1,), sizes + (0,), sizes + (-3,), (0,) + sizes + (-3,), (0, -1),
        (2**31 - 1,) * 3, (2**16, 2**16), (2**15, 2**16), (2**15, 2**15, 2), (0, 2**31 - 1, 2**31 - 1, 2**31 - 1),
        (2**31 - 1,) * 9, tuple(2 * x for x in sizes), tuple(x + 1 for x in sizes), (), (1,))]
    edits += [dict(dim_order=d) for d in (
        tuple(reversed(range(n))), (0,) * n, tuple(range(n + 1)), (), tuple(range(n))[:-1], (255,) * max(n, 1),
        tuple(range(1, n)) + (0,))]
    edits += [dict(sizes=(1,) * 9, dim_order=tuple(reversed(range(9)))), dict(sizes=(1,) * 9, dim_order=tuple(range(9))),
              dict(sizes=(1,) * 300, dim_order=tuple(i % 256 for i in range(300))), dict(sizes=(1,) * 256, dim_order=tuple(range(256)))]
    edits += [dict(extra_tensor_info=e) for e in (ET(0, "buf", 0), ET(0, None, S.TensorDataLocation.EXTERNAL),
                                                  ET(5, "x", 0), ET(0, "", 0))]
    a = t.allocation_info
    if a is not None:
        nb = _nbytes(t)
        arena = arenas[a.memory_id] if 0 <= a.memory_id < len(arenas) else 0
        edits += [dict(allocation_info=S.AllocationDetails(m, a.memory_offset_low, a.memory_offset_high))
                  for m in (0, len(arenas) - 1, len(arenas), U32)]
        edits += [dict(allocation_info=S.AllocationDetails(a.memory_id, lo, hi)) for lo, hi in (
            (arena - nb, 0), (arena - nb + 1, 0), (max(arena - nb, 0), 1), (U32, 0), (U32, U32), (0, 0), (arena, 0))
            if 0 <= lo <= U32]
        edits += [dict(allocation_info=None), dict(data_buffer_idx=1), dict(data_buffer_idx=1, extra_tensor_info=ET(0, "m", 0))]
    else:
        edits += [dict(data_buffer_idx=x) for x in (0, 1, nconst - 1, nconst, U32) if x >= 0]
        edits += [dict(allocation_info=S.AllocationDetails(1, 0, 0))]
    return edits


def _replace_value(prog: S.ProgramDef, i: int, val: object) -> S.ProgramDef:
    plan = prog.execution_plan[0]
    values = plan.values[:i] + (S.EValue(val),) + plan.values[i + 1:]
    return dataclasses.replace(prog, execution_plan=(dataclasses.replace(plan, values=values),) + prog.execution_plan[1:])


def _replace_plan(prog: S.ProgramDef, **changes: object) -> S.ProgramDef:
    plan = dataclasses.replace(prog.execution_plan[0], **changes)
    return dataclasses.replace(prog, execution_plan=(plan,) + prog.execution_plan[1:])


def _picked(plan: S.ExecutionPlan) -> list[int]:
    """A few values of each kind the verifier treats differently."""
    kinds: dict[str, list[int]] = {}
    for i, ev in enumerate(plan.values):
        v = ev.val
        if isinstance(v, S.Tensor):
            k = ("extra" if v.extra_tensor_info is not None else "planned" if v.allocation_info is not None
                 else "constant" if v.data_buffer_idx > 0 else "unplanned")
        else:
            k = type(v).__name__
        kinds.setdefault(k, []).append(i)
    return [i for found in kinds.values() for i in found[:3]]


def _mutants(prog: S.ProgramDef, rng: np.random.Generator, fuzz: int) -> Iterator[tuple[str, S.ProgramDef]]:
    """``prog`` edited in one place at a time, then ``fuzz`` times in random places at once."""
    plan = prog.execution_plan[0]
    nv, arenas, nconst = len(plan.values), plan.non_const_buffer_sizes, _nconst(prog)
    picked = _picked(plan)
    for i in picked:
        v = plan.values[i].val
        if isinstance(v, S.Tensor):
            for e in _tensor_edits(v, arenas, nconst):
                yield f"values[{i}] {e}", _replace_value(prog, i, dataclasses.replace(v, **e))
        for new in (S.TensorList((nv,)), S.TensorList((-1,)), S.TensorList((nv - 1, 0)), S.TensorList(()),
                    S.OptionalTensorList((-1, 0)), S.OptionalTensorList((-2,)), S.OptionalTensorList((nv,)),
                    S.OptionalTensorList((nv - 1, -1)), S.IntList((nv, -5)), S.Null(), None):
            yield f"values[{i}] = {new}", _replace_value(prog, i, new)
    # The arenas and the constants.
    for sizes in (arenas[:1], (0,), (), arenas + (1 << 62,), arenas + (-1,), tuple(max(x - 1, 0) for x in arenas),
                  tuple(x // 2 for x in arenas), (0, 0) + arenas[1:]):
        yield f"non_const_buffer_sizes={sizes}", _replace_plan(prog, non_const_buffer_sizes=sizes)
    cs = prog.constant_segment
    if cs is not None and cs.offsets:
        seg = prog.segments[cs.segment_index].size
        o = cs.offsets
        for offs in (o[:-1], o[:1], tuple(reversed(o)), o[:1] + tuple(x + 64 for x in o[1:]), tuple(x // 2 for x in o),
                     o[:-1] + (seg,), o[:-1] + (seg + 1,), tuple(o[1:2] * len(o)), (0,) * len(o), tuple(1 << 40 for _ in o)):
            yield f"constant_segment.offsets={offs}", dataclasses.replace(prog, constant_segment=S.SubsegmentOffsets(cs.segment_index, offs))
        for i in picked:  # a constant's data cut to its exact size, one byte short, or by an offset before its start
            v = plan.values[i].val
            if isinstance(v, S.Tensor) and v.allocation_info is None and 0 < v.data_buffer_idx < len(o) - 1:
                k, nb = v.data_buffer_idx, _nbytes(v)
                for nxt in (o[k] + nb, o[k] + nb - 1, o[k] - 1, o[k]):
                    if nxt >= 0:
                        offs = o[: k + 1] + (nxt,) + o[k + 2:]
                        yield f"constant_segment.offsets={offs}", dataclasses.replace(prog, constant_segment=S.SubsegmentOffsets(cs.segment_index, offs))
    # The instructions: each kind, in range and just out of it.
    chain = plan.chains[0]
    n, nops, ndel = len(chain.instructions), len(plan.operators), len(plan.delegates)
    for args in (S.KernelCall(nops, ()), S.KernelCall(-1, ()), S.KernelCall(max(nops - 1, 0), (nv - 1, 0)),
                 S.KernelCall(0, (nv,)), S.KernelCall(0, (-1,)), S.DelegateCall(ndel, ()), S.DelegateCall(0, (0,)),
                 S.DelegateCall(max(ndel - 1, 0), (nv,)), S.MoveCall(nv, 0), S.MoveCall(0, -1), S.MoveCall(nv - 1, 0),
                 S.JumpFalseCall(nv, 0), S.JumpFalseCall(0, n), S.JumpFalseCall(0, n + 1), S.JumpFalseCall(0, -1),
                 S.JumpFalseCall(nv - 1, 0), S.FreeCall(nv), S.FreeCall(-1), S.FreeCall(nv - 1)):
        ins = (S.Instruction(args),) + chain.instructions[1:]
        new_chain = dataclasses.replace(chain, instructions=ins, stacktrace=None)
        yield f"instructions[0] = {args}", _replace_plan(prog, chains=(new_chain,) + plan.chains[1:])
    # Random edits of several fields of several tensors at once.
    tensors = [i for i, ev in enumerate(plan.values) if isinstance(ev.val, S.Tensor)]
    for k in range(fuzz):
        p = prog
        for _ in range(int(rng.integers(1, 4))):
            i = tensors[int(rng.integers(len(tensors)))]
            v = p.execution_plan[0].values[i].val
            edits = _tensor_edits(v, arenas, nconst)
            p = _replace_value(p, i, dataclasses.replace(v, **edits[int(rng.integers(len(edits)))]))
        yield f"fuzz {k}", p


def _legacy(prog: S.ProgramDef) -> S.ProgramDef:
    """``prog`` with its constants in the legacy constant_buffer instead of a segment."""
    bufs = tuple(S.Buffer(prog.constant_data(i)) for i in range(_nconst(prog)))
    return dataclasses.replace(prog, constant_buffer=bufs, constant_segment=None)


BASES = ["mlp", "transformer", "state/kv_cache", "state/train_step", "state/state_counter",
         "state/segments_no_header", "xnnpack_transformer", "two_methods", "mlp as constant_buffer"]


def _base(name: str) -> bytes:
    if name == "mlp as constant_buffer":
        return dumps(_legacy(loads((FIXTURES / "mlp.pte").read_bytes())))
    return (FIXTURES / f"{name}.pte").read_bytes()


@pytest.mark.parametrize("name", BASES)
def test_programs_edited_to_be_wrong_load_the_same_three_ways(name: str) -> None:
    data = _base(name)
    assert _agree(data) == "loaded"
    prog = loads(data)
    seen = {"loaded": 0, "refused": 0}
    written = 0
    for label, bad in _mutants(prog, np.random.default_rng(len(name)), fuzz=150):
        try:
            raw = dumps(bad)
        except Exception:  # noqa: BLE001 - the writer refuses a few (a negative size): nothing to load
            continue
        written += 1
        try:
            seen[_agree(raw)] += 1
        except AssertionError as exc:
            raise AssertionError(f"{name}, {label}: {exc}") from None
    assert seen["refused"] > written // 3 and seen["loaded"] > 10, seen


@pytest.mark.parametrize("name", ["mlp", "state/kv_cache", "mlp as constant_buffer"])
@pytest.mark.parametrize("limits", [Limits(max_numel=None), Limits(max_numel=0), Limits(max_numel=100),
                                    Limits(max_numel=-1), Limits(max_numel=1 << 100), Limits(max_planned_memory=100)],
                         ids=["no cap", "cap 0", "cap 100", "cap -1", "cap 2**100", "planned 100"])
def test_limits_bind_the_same_three_ways(name: str, limits: Limits) -> None:
    prog = loads(_base(name))
    for label, bad in itertools.islice(_mutants(prog, np.random.default_rng(5), fuzz=30), 0, None, 3):
        try:
            raw = dumps(bad)
        except Exception:  # noqa: BLE001
            continue
        try:
            _agree(raw, limits)
        except AssertionError as exc:
            raise AssertionError(f"{name}, {label}: {exc}") from None


@pytest.mark.parametrize("name", BASES)
def test_c_vouches_only_for_what_python_accepts(name: str) -> None:
    """The same edits, on the decoded objects (no writer in the way: ints past what the file's
    fields hold too), value by value."""
    prog = loads(_base(name))
    plan = prog.execution_plan[0]
    big = [dict(sizes=(1 << 40, 1 << 40)), dict(sizes=(1 << 62, 4)), dict(sizes=(1 << 70,)), dict(sizes=(0, 1 << 70)),
           dict(data_buffer_idx=-1), dict(data_buffer_idx=1 << 70), dict(storage_offset=1 << 70), dict(scalar_type=1 << 70),
           dict(sizes=(2.0,)), dict(sizes=[2]), dict(dim_order=(True,)), dict(sizes=(True, 3))]
    for label, bad in _mutants(prog, np.random.default_rng(9), fuzz=50):
        # Under the default cap C is exact: it leaves to Python only what Python refuses.
        _check_vouching(bad, Limits(), exact=True)
        _check_vouching(bad, Limits(max_numel=None), exact=False)
    for i in _picked(plan):
        v = plan.values[i].val
        if isinstance(v, S.Tensor):
            for e in big:
                _check_vouching(_replace_value(prog, i, dataclasses.replace(v, **e)), Limits(max_numel=None), exact=False)
            if v.allocation_info is not None:
                for lo, hi in ((1 << 40, 0), (0, 1 << 40), (-1, 0)):
                    a = S.AllocationDetails(v.allocation_info.memory_id, lo, hi)
                    _check_vouching(_replace_value(prog, i, dataclasses.replace(v, allocation_info=a)), Limits(), exact=False)
        for new in (S.TensorList((1 << 70,)), S.TensorList((0.0,)), S.OptionalTensorList((-1.0,)), S.TensorList([0])):
            _check_vouching(_replace_value(prog, i, new), Limits(), exact=False)


def test_the_entry_points_check_their_arguments() -> None:
    prog = loads((FIXTURES / "mlp.pte").read_bytes())
    plan = prog.execution_plan[0]
    values, arenas = plan.values, plan.non_const_buffer_sizes
    ok = (values, arenas, None, _reader._ITEMSIZES, (), None)
    assert _decode.plain_values(*ok) == [i for i, ev in enumerate(values)
                                         if isinstance(ev.val, S.Tensor) and ev.val.data_buffer_idx > 0]
    for bad, exc in [((list(values),) + ok[1:], TypeError), (ok[:2] + ("1",) + ok[3:], TypeError),
                     (ok[:3] + (list(_reader._ITEMSIZES),) + ok[4:], TypeError), (ok[:5] + (-1,), ValueError),
                     (ok[:5] + (1.0,), ValueError)]:
        with pytest.raises(exc):
            _decode.plain_values(*bad)
    # Objects that are not the schema's: left to Python, not misread.
    assert _decode.plain_values((1, None, S.Tensor, values[0].val), arenas, None, b"\4", (), None) == [0, 1, 2, 3]
    assert _decode.plain_instructions((1, None, plan.values[0]), 10, 10, 10) == [0, 1, 2]
    named = S.EValue(dataclasses.replace(values[0].val, extra_tensor_info=ET(0, "x", 0)))
    assert _decode.extra_info_values((values[0], 1, S.EValue(S.Int(3)), named, S.EValue(None), S.EValue(1.5))) == [1, 3, 5]
    with pytest.raises(TypeError):
        _decode.extra_info_values(list(values))
    with pytest.raises(TypeError):
        _decode.plain_instructions(list(plan.chains[0].instructions), 1, 1, 1)
