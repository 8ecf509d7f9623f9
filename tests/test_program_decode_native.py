"""``orchestra.program._decode``: the reader's values and instructions decoded in C.

The C functions replace ``_Fast.evalues`` and ``_Fast.instructions`` when the extension is
built; the Python methods stay the reference. For any bytes the C path either returns what the
Python path returns (equal objects of the same types, the same object-budget charge) or falls
back where the Python path raises. Skipped where the extension is not built.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import pathlib
import struct
import sys

import numpy as np
import pytest

from orchestra import ProgramError
from orchestra.program import _reader, _schema as S, dumps, loads
from orchestra.program._reader import Limits, _Fallback, _Fast, _FlatReader

_decode = pytest.importorskip("orchestra.program._decode", reason="the optional C extension is not built")

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = pathlib.Path(__file__).parent / "fixtures"
SHARED_FIXTURES = ROOT.parent / "shared" / "fixtures"
FIXTURE_FILES = sorted(FIXTURES.rglob("*.pte")) + sorted(SHARED_FIXTURES.glob("*.pte"))


def _real_model_files() -> list[pathlib.Path]:
    """Exported real models where a cache of them is present (not in CI): benchmarks/real_models.py's
    default cache, ../cache, or $ORCHESTRA_REAL_MODELS."""
    dirs = [pathlib.Path.home() / ".cache" / "orchestra" / "real_models", ROOT.parent / "cache"]
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


@pytest.fixture
def python_only(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201 - a context switcher
    """Calls ``fn()`` with the extension switched off."""

    def run(fn):  # noqa: ANN001, ANN202
        with monkeypatch.context() as m:
            m.setattr(_reader, "_native_decode", None)
            return fn()

    return run


def test_the_extension_is_set_up_and_used(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _reader._native_decode is _decode  # setup() accepted the schema classes
    calls = []

    class Spy:
        def evalues(self, *a):  # noqa: ANN002, ANN202
            calls.append("evalues")
            return _decode.evalues(*a)

        def instructions(self, *a):  # noqa: ANN002, ANN202
            calls.append("instructions")
            return _decode.instructions(*a)

        def operators(self, *a):  # noqa: ANN002, ANN202
            calls.append("operators")
            return _decode.operators(*a)

    monkeypatch.setattr(_reader, "_native_decode", Spy())
    loads((FIXTURES / "two_methods.pte").read_bytes())
    assert calls.count("evalues") == 2 and calls.count("instructions") >= 2
    assert calls.count("operators") == 2


def test_setup_refuses_classes_that_do_not_fit() -> None:
    built = (S.EValue, S.Instruction, S.AllocationDetails, S.ExtraTensorInfo) + S.KERNEL_TYPES + S.INSTRUCTION_TYPES

    def classes(**swap):  # noqa: ANN003, ANN202
        out = {c.__name__: (c, tuple(f.name for f in dataclasses.fields(c))) for c in built}
        out.update(swap)
        return out

    @dataclasses.dataclass(frozen=True)  # no slots: fields are not member descriptors
    class Int:
        int_val: int

    try:
        with pytest.raises(ValueError, match="Tensor"):
            _decode.setup(classes(Tensor=(S.Tensor, ("scalar_type", "sizes"))), S.KERNEL_TYPES, S.INSTRUCTION_TYPES)
        with pytest.raises(TypeError, match="Int.int_val"):
            _decode.setup(classes(Int=(Int, ("int_val",))), S.KERNEL_TYPES, S.INSTRUCTION_TYPES)
        with pytest.raises(ValueError, match="kernel_types"):
            _decode.setup(classes(), S.KERNEL_TYPES + (S.Operator,), S.INSTRUCTION_TYPES)
        with pytest.raises(RuntimeError, match="setup"):  # a failed setup leaves it unusable
            _decode.evalues(b"\0" * 8, 8, 0, 1)
    finally:
        _decode.setup(classes(), S.KERNEL_TYPES, S.INSTRUCTION_TYPES)
    assert _decode.evalues(b"\0" * 8, 8, 0, 0) == ((), 0)


# -- comparing decoded objects exactly ---------------------------------------------------------------
def _same(a: object, b: object) -> bool:
    """Equal and of the same types all the way down (floats by their bits, so NaNs compare;
    memoryviews by their bytes)."""
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


def _fb(data: bytes) -> memoryview:
    """The flatbuffer part of a program (as loads cuts it)."""
    mv = memoryview(data)
    if len(data) >= 24 and data[8:12] == b"eh00":
        return mv[: struct.unpack_from("<Q", data, 16)[0]]
    return mv


def _vectors(fb: memoryview) -> list[tuple[str, int, int]]:
    """("evalues" | "operators" | "instructions", start, n) of every plan's values and
    operators and every chain's instructions, found with the checked reader (empty where it refuses the bytes)."""
    out: list[tuple[str, int, int]] = []
    try:
        r = _FlatReader(fb, None)
        t = r.table(struct.unpack_from("<I", fb, 0)[0], "program")
        for pt, pp in r.tables(t, 1, "plans") or []:
            v = r._vector(pt, 2, 4, pp)
            if v is not None:
                out.append(("evalues", *v))
            v = r._vector(pt, 6, 4, pp)
            if v is not None:
                out.append(("operators", *v))
            for ct, cp in r.tables(pt, 5, pp) or []:
                v = r._vector(ct, 2, 4, cp)
                if v is not None:
                    out.append(("instructions", *v))
    except (ProgramError, struct.error, IndexError):
        pass
    return out


def _python(fb: memoryview, kind: str, start: int, n: int) -> tuple[tuple, int] | type:
    saved = _reader._native_decode
    _reader._native_decode = None
    try:
        f = _Fast(_FlatReader(fb, None))
        return getattr(f, kind)(start, n), f.spent
    except (_Fallback, struct.error) as exc:
        return type(exc)
    finally:
        _reader._native_decode = saved


def _native(fb: memoryview, kind: str, start: int, n: int) -> tuple[tuple, int] | None:
    f = _Fast(_FlatReader(fb, None))
    try:
        return getattr(f, kind)(start, n), f.spent  # through the hook
    except _Fallback:
        assert getattr(_decode, kind)(fb, len(fb), start, n) is None
        return None


def _agree(fb: memoryview, kind: str, start: int, n: int) -> str:
    """Decodes with both paths and checks the contract; returns what happened."""
    py = _python(fb, kind, start, n)
    c = _native(fb, kind, start, n)
    if c is None:
        # Allowed wherever Python fails; this implementation makes exactly its checks, so
        # it never falls back where Python succeeds (stronger than the contract needs).
        assert isinstance(py, type), f"C fell back where Python decodes {kind}({start}, {n})"
        return "both refuse"
    assert not isinstance(py, type), f"C decoded {kind}({start}, {n}) where Python raises {py.__name__}"
    assert _same(c[0], py[0]), f"{kind}({start}, {n}) differ"
    assert c[1] == py[1], f"{kind}({start}, {n}): C spent {c[1]}, Python {py[1]}"
    return "both decode"


# -- a program with every kind of value and instruction ----------------------------------------------
def _all_kinds_program(reps: int) -> S.ProgramDef:
    """Every value kind (absent and present fields, shared shapes, non-ASCII names, extreme
    ints and doubles) and every instruction kind, ``reps`` times over; it passes loads'
    verification."""
    rng = np.random.default_rng(7)
    values: list[S.EValue] = []
    offset = 0
    for r in range(reps):
        base = len(values)
        nd = int(rng.integers(0, 5))  # one dimension of up to 299 (ints CPython does not cache), the rest small
        sizes = tuple(int(rng.integers(1, 300 if r % 3 and d == 0 else 5)) for d in range(nd))
        perm = tuple(int(x) for x in rng.permutation(nd)) if r % 4 == 1 else tuple(range(nd))
        numel = int(np.prod(sizes)) if sizes else 1
        planned = r % 3 != 2
        alloc = S.AllocationDetails(1, offset, 0) if planned else None
        if planned:
            offset += numel * 4
        extra = None
        if r % 5 == 3:
            extra = S.ExtraTensorInfo(0, f"couche_é.{r}.权重" if r % 2 else None, S.TensorDataLocation.EXTERNAL)
        values += [
            S.EValue(S.Tensor(6, 0, sizes, perm if r % 2 else (), r % 7 == 0, 0, alloc, 0, r % 3, extra)),
            S.EValue(S.Int((-1) ** r * (1 << (r % 64)) if r % 64 != 63 else -(1 << 63))),
            S.EValue(S.Int(0)),
            S.EValue(S.Int((1 << 63) - 1)),
            S.EValue(S.Bool(r % 2 == 0)),
            S.EValue(S.Double([0.0, -0.0, 1.5, -math.inf, math.inf, 1e308, 5e-324][r % 7])),
            S.EValue(S.String(["", "relu", "ünïcødé ✓", None][r % 4])),
            S.EValue(S.IntList(tuple(int(x) for x in rng.integers(-(1 << 40), 1 << 40, size=r % 6)))),
            S.EValue(S.DoubleList(tuple(float(x) for x in rng.normal(size=r % 4)))),
            S.EValue(S.BoolList(tuple(bool(x) for x in rng.integers(0, 2, size=r % 5)))),
            S.EValue(S.TensorList((base, base) if r % 2 else ())),
            S.EValue(S.OptionalTensorList((base, -1) if r % 3 else ())),
            S.EValue(S.Null()),
            S.EValue(None),
        ]
    nv = len(values)
    instrs = []
    for i in range(3 * reps):
        k = i % 5
        if k == 0:
            instrs.append(S.Instruction(S.KernelCall(i % 2, tuple(int(x) for x in rng.integers(0, nv, size=i % 4)))))
        elif k == 1:
            instrs.append(S.Instruction(S.DelegateCall(0, (i % nv,) if i % 2 else ())))
        elif k == 2:
            instrs.append(S.Instruction(S.MoveCall(i % nv, (i * 7) % nv)))
        elif k == 3:
            instrs.append(S.Instruction(S.JumpFalseCall(i % nv, i % (3 * reps // 2 + 1))))  # within its chain
        else:
            instrs.append(S.Instruction(S.FreeCall(i % nv)))
    half = len(instrs) // 2
    plan = S.ExecutionPlan(
        name="forward",
        container_meta_type=None,
        values=tuple(values),
        inputs=(0,),
        outputs=(nv - 14,),
        chains=(S.Chain((0,), (nv - 14,), tuple(instrs[:half])), S.Chain((), (), tuple(instrs[half:]))),
        operators=(S.Operator("aten::add", "out"), S.Operator("aten::relu")),
        delegates=(S.BackendDelegate("XnnpackBackend", S.BackendDelegateDataReference(S.DataLocation.INLINE, 0)),),
        non_const_buffer_sizes=(0, max(offset, 16)),
    )
    return S.ProgramDef(0, (plan,), backend_delegate_data=(S.BackendDelegateInlineData(memoryview(b"blob")),))


SMALL = dumps(_all_kinds_program(10))  # 140 values: fuzzed
BIG = dumps(_all_kinds_program(400))  # ~5,600 values, ~1,200 instructions: a realistic size in CI


def _spent_by_loads(data: bytes) -> int | None:
    """The object budget the fast path charged in loads (None: it fell back)."""
    charged: list[int] = []
    spend = _FlatReader.spend

    def record(self, n, path):  # noqa: ANN001, ANN202
        if path == "program":
            charged.append(n)
        return spend(self, n, path)

    _FlatReader.spend = record
    try:
        loads(data)
    finally:
        _FlatReader.spend = spend
    return charged[0] if charged else None


def _check_program(data: bytes, python_only) -> S.ProgramDef:  # noqa: ANN001
    fb = _fb(data)
    vecs = _vectors(fb)
    assert vecs
    for kind, start, n in vecs:
        assert _agree(fb, kind, start, n) == "both decode"
    prog = loads(data)
    slow = python_only(lambda: loads(data))
    assert prog == slow
    assert _same(prog, slow)
    spent = _spent_by_loads(data)
    assert spent is not None and spent == python_only(lambda: _spent_by_loads(data))
    return prog


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=_id)
def test_every_fixture_decodes_the_same(path: pathlib.Path, python_only) -> None:  # noqa: ANN001
    data = path.read_bytes()
    prog = _check_program(data, python_only)
    _check_program(dumps(prog), python_only)  # the same program as our writer lays it out


def test_a_big_program_of_every_kind_decodes_the_same(python_only) -> None:  # noqa: ANN001
    prog = _check_program(BIG, python_only)
    assert prog.execution_plan[0] == _all_kinds_program(400).execution_plan[0]
    values = prog.execution_plan[0].values
    assert len(values) == 5600
    assert {type(v.val) for v in values} == set(S.KERNEL_TYPES) | {type(None)}
    slow = python_only(lambda: loads(BIG)).execution_plan[0].values
    for a, b in zip(values[:300], slow[:300]):  # objects built in C: repr and hash like Python's
        assert repr(a) == repr(b)
        assert hash(a) == hash(b)
        assert a == b
    ins = [i for c in prog.execution_plan[0].chains for i in c.instructions]
    assert {type(i.instr_args) for i in ins} == set(S.INSTRUCTION_TYPES)
    assert hash(ins[0]) == hash(python_only(lambda: loads(BIG)).execution_plan[0].chains[0].instructions[0])
    with pytest.raises(dataclasses.FrozenInstanceError):
        values[0].val.sizes = ()  # type: ignore[misc]


@pytest.mark.parametrize("path", _real_model_files(), ids=_id)
def test_exported_real_models_decode_the_same(path: pathlib.Path, python_only) -> None:  # noqa: ANN001
    _check_program(path.read_bytes(), python_only)


# -- hostile bytes -----------------------------------------------------------------------------------
def _loads_outcome(data: bytes) -> object:
    try:
        return loads(data)
    except Exception as exc:  # noqa: BLE001 - compared by type and message
        return (type(exc), str(exc))


def _mutations(data: bytes, count: int, seed: int):  # noqa: ANN202 - an iterator of bytes
    fb_size = len(_fb(data))
    lo = 8 + (struct.unpack_from("<I", data, 12)[0] if data[8:12] == b"eh00" else 0)
    rng = np.random.default_rng(seed)
    for _ in range(count):
        bad = bytearray(data)
        what = rng.random()
        for _ in range(int(rng.integers(1, 4))):
            pos = int(rng.integers(lo, fb_size))
            if what < 0.4:  # a byte
                bad[pos] = int(rng.integers(0, 256)) if rng.random() < 0.6 else bad[pos] ^ (1 << int(rng.integers(0, 8)))
            elif pos + 4 <= fb_size:  # a 32-bit word (offsets, lengths, vtable entries)
                pos &= ~3 if rng.random() < 0.7 else ~1
                old = struct.unpack_from("<I", bad, pos)[0]
                new = [int(rng.integers(0, 1 << 32)), (old + int(rng.integers(-64, 65))) & 0xFFFFFFFF,
                       0, 0xFFFFFFFF, 0x7FFFFFFF, 0x80000000, int(rng.integers(0, 16))][int(rng.integers(0, 7))]
                struct.pack_into("<I", bad, pos, new)
        yield bytes(bad)


@pytest.mark.parametrize("name,count", [("mlp", 600), ("transformer", 300), ("two_methods", 300),
                                        ("state/kv_cache", 150), ("all_kinds", 1000)])
def test_mutated_programs_decode_the_same_or_fall_back(name: str, count: int, python_only) -> None:  # noqa: ANN001
    data = SMALL if name == "all_kinds" else (FIXTURES / f"{name}.pte").read_bytes()
    original = _vectors(_fb(data))
    seen = {"both decode": 0, "both refuse": 0}
    loads_refused = 0
    for i, bad in enumerate(_mutations(data, count, seed=len(name))):
        fb = _fb(bad)
        for kind, start, n in sorted(set(original) | set(_vectors(fb))):
            seen[_agree(fb, kind, start, n)] += 1
        if i % 2 == 0:  # loads, the way a caller sees it: the same program or the same error
            got = _loads_outcome(bad)
            want = python_only(lambda b=bad: _loads_outcome(b))
            if isinstance(want, tuple):
                loads_refused += 1
                assert got == want
            else:
                assert _same(got, want)
    assert seen["both decode"] > count // 2 and seen["both refuse"] > count // 10, seen
    assert loads_refused > count // 10


def _tables(fb: memoryview, start: int, count: int, members: bool = True) -> list[int]:
    """Positions of the first ``count`` tables of a vector of offsets at ``start`` and, with
    ``members``, of the union members they point to (read from well-formed bytes)."""
    u16, u32 = (lambda p: struct.unpack_from("<H", fb, p)[0]), (lambda p: struct.unpack_from("<I", fb, p)[0])
    out = []
    for i in range(count):
        pos = start + 4 * i + u32(start + 4 * i)
        out.append(pos)
        vt = pos - struct.unpack_from("<i", fb, pos)[0]
        if members and u16(vt) >= 8 and u16(vt + 6):
            out.append(pos + u16(vt + 6) + u32(pos + u16(vt + 6)))
    return out


def test_edge_values_in_tables_vtables_and_offsets_decode_the_same_or_fall_back() -> None:
    """Every table of one value (instruction) of each kind, edited at its edges: its vtable
    offset (vtables before the buffer, at its end, unaligned), every vtable entry (sizes and
    field offsets at and past the table's size) and every word of the table (offsets and
    lengths pointing at, just before and past the end)."""
    data = bytearray(SMALL)
    fb_size = len(_fb(bytes(data)))
    end = fb_size
    seen = {"both decode": 0, "both refuse": 0}
    for kind, start, n in _vectors(_fb(bytes(data))):
        for pos in _tables(memoryview(data)[:fb_size], start, min(n, 14 if kind == "evalues" else 5),
                           members=kind != "operators"):
            edits = [(pos, "<i", pos - vt) for vt in (-1, -2, -4, 1, end - 2, end - 3, end - 4, end)]
            vt = pos - struct.unpack_from("<i", data, pos)[0]
            vtsize, objsize = struct.unpack_from("<HH", data, vt)
            for e in range(vt, vt + vtsize, 2):
                edits += [(e, "<H", x) for x in (0, 1, 2, 3, 4, 5, objsize - 1, objsize, 0xFFFF)]
            for w in range(pos + 4, pos + objsize - 3, 4):
                edits += [(w, "<I", x & 0xFFFFFFFF) for x in (0, 1, 3, 4, end - w, end - w - 3, end - w - 4, end - w - 8,
                                                               0x7FFFFFFF, 0xFFFFFFFF)]
            for at, fmt, x in edits:
                bad = bytearray(data)
                struct.pack_into(fmt, bad, at, x)
                fb = memoryview(bytes(bad[:fb_size]))
                seen[_agree(fb, kind, start, n)] += 1
    assert seen["both decode"] > 100 and seen["both refuse"] > 500, seen


@pytest.mark.parametrize("name", ["mlp", "all_kinds"])
def test_truncated_programs_decode_the_same_or_fall_back(name: str, python_only) -> None:  # noqa: ANN001
    data = SMALL if name == "all_kinds" else (FIXTURES / f"{name}.pte").read_bytes()
    fb = _fb(data)
    vecs = _vectors(fb)
    rng = np.random.default_rng(3)
    cuts = sorted({int(x) for x in rng.integers(0, len(fb), size=150)} | {len(fb) - 1, len(fb) - 4, 0, 4})
    for k in cuts:
        short = memoryview(bytes(fb[:k]))  # its own allocation: reading past it is out of bounds
        for kind, start, n in vecs:
            _agree(short, kind, start, n)
        got = _loads_outcome(bytes(data[:k]))
        assert got == python_only(lambda: _loads_outcome(bytes(data[:k])))


def test_out_of_range_arguments_fall_back() -> None:
    fb = _fb((FIXTURES / "mlp.pte").read_bytes())
    kind, start, n = _vectors(fb)[0]
    for end, s, m in [(len(fb), start, n + 10**6), (len(fb), len(fb) + 4, 0), (len(fb), -4, 1), (len(fb), start, -1),
                      (len(fb) + 1, start, n), (-1, start, n), (start + 4 * n - 1, start, n)]:
        assert _decode.evalues(fb, end, s, m) is None
        assert _decode.instructions(fb, end, s, m) is None
    assert _decode.evalues(fb, len(fb), start, n) is not None
    with pytest.raises(TypeError):
        _decode.evalues("not bytes", 9, 0, 0)
    with pytest.raises(BufferError):
        _decode.evalues(memoryview(bytes(64))[::2], 32, 0, 0)


def test_buffers_of_other_formats_take_the_python_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # Python reads a signed-char view's bytes as signed ints; the hook leaves such views to it.
    fb = _fb((FIXTURES / "mlp.pte").read_bytes())
    kind, start, n = _vectors(fb)[0]
    want = _python(fb, kind, start, n)
    monkeypatch.setattr(_reader, "_native_decode", None)
    signed = _python(fb.cast("b"), kind, start, n)
    monkeypatch.setattr(_reader, "_native_decode", object())  # would fail if called
    f = _Fast(_FlatReader(fb.cast("b"), None))
    assert _same((f.evalues(start, n), f.spent), signed)
    assert _same(signed, want)  # mlp has no byte over 127 where it matters


def test_fall_backs_leak_nothing_and_leave_gc_as_it_was() -> None:
    data = SMALL
    cases = []
    for bad in _mutations(data, 300, seed=99):
        fb = _fb(bad)
        cases += [(fb, kind, start, n) for kind, start, n in _vectors(_fb(data))]

    def run() -> int:
        refused = 0
        for fb, kind, start, n in cases:
            if getattr(_decode, kind)(fb, len(fb), start, n) is None:
                refused += 1
        return refused

    refused = run()
    assert refused > 50
    gc.collect()
    before = sys.getallocatedblocks()
    for _ in range(3):
        run()
    gc.collect()
    assert sys.getallocatedblocks() - before < 200
    assert gc.isenabled()
    gc.disable()
    try:
        run()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_decoded_objects_are_untracked_and_a_decode_leaks_nothing() -> None:
    """What C builds is left out of the collector's scans (immutable, no cycles through it), so
    a decode that kept a reference too many would never be freed: none does."""
    fb = _fb(BIG)
    vectors = _vectors(fb)
    prog = loads(BIG)
    plan = prog.execution_plan[0]
    tensors = [ev.val for ev in plan.values if isinstance(ev.val, S.Tensor)]
    assert tensors and not any(gc.is_tracked(t) or gc.is_tracked(t.sizes) for t in tensors)
    assert not gc.is_tracked(plan.values) and not gc.is_tracked(plan.values[0])
    assert not gc.is_tracked(plan.chains[0].instructions[0].instr_args)
    del prog, plan, tensors

    def run() -> None:
        for kind, start, n in vectors:
            assert getattr(_decode, kind)(fb, len(fb), start, n) is not None

    run()
    gc.collect()
    before = sys.getallocatedblocks()
    for _ in range(5):
        run()
    gc.collect()
    assert sys.getallocatedblocks() - before < 200


# -- the object budget -------------------------------------------------------------------------------
def _outcome(data: bytes, max_objects: int) -> object:
    try:
        loads(data, limits=Limits(max_objects=max_objects))
    except ProgramError as exc:
        return str(exc)
    return "ok"


@pytest.mark.parametrize("name", ["mlp", "transformer", "all_kinds"])
def test_the_object_budget_binds_at_the_same_place(name: str, python_only) -> None:  # noqa: ANN001
    data = SMALL if name == "all_kinds" else (FIXTURES / f"{name}.pte").read_bytes()
    lo, hi = 0, 1 << 22  # the smallest cap loads accepts lies in (lo, hi]
    assert _outcome(data, hi) == "ok"
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _outcome(data, mid) == "ok" else (mid, hi)
    assert python_only(lambda: _outcome(data, hi)) == "ok"
    refused = _outcome(data, hi - 1)
    assert "Limits.max_objects" in refused
    assert python_only(lambda: _outcome(data, hi - 1)) == refused
    # The fast path's charge alone: the same with and without the extension.
    assert _spent_by_loads(data) == python_only(lambda: _spent_by_loads(data))
