"""The .pte format layer: loads/load/dumps, zero copy, verification messages."""

from __future__ import annotations

import dataclasses
import mmap
import pathlib
import struct

import numpy as np
import pytest

import orchestra
from orchestra import Error, NotFoundError, OrchestraError, ProgramError
from orchestra.program import (
    DataLocation,
    EValue,
    KernelCall,
    Limits,
    ProgramDef,
    Tensor,
    dumps,
    load,
    loads,
)
from orchestra.program import _reader

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
ALL = sorted(p.stem for p in FIXTURES.glob("*.pte"))


def _bytes(name: str) -> bytes:
    return (FIXTURES / f"{name}.pte").read_bytes()


def _replace_value(prog: ProgramDef, index: int, **changes) -> ProgramDef:
    plan = prog.execution_plan[0]
    values = list(plan.values)
    values[index] = EValue(dataclasses.replace(values[index].val, **changes))
    return dataclasses.replace(prog, execution_plan=(dataclasses.replace(plan, values=tuple(values)),) + prog.execution_plan[1:])


def _first_tensor(prog: ProgramDef, pred=lambda t: True) -> int:
    for i, ev in enumerate(prog.execution_plan[0].values):
        if isinstance(ev.val, Tensor) and pred(ev.val):
            return i
    raise AssertionError("no such tensor")


@pytest.mark.parametrize("name", ALL)
def test_every_fixture_loads_and_round_trips(name: str) -> None:
    data = _bytes(name)
    prog = loads(data)
    assert prog.method_names
    for plan in prog.execution_plan:
        assert plan.chains and plan.chains[0].instructions
    again = loads(dumps(prog))
    assert again == prog


@pytest.mark.parametrize("name", ALL)
def test_load_maps_the_file_and_copies_no_weight(name: str) -> None:
    prog = load(FIXTURES / f"{name}.pte")
    assert prog == loads(_bytes(name))
    for seg in prog.segments:
        assert isinstance(seg.data.obj, mmap.mmap)
    data = _bytes(name)
    prog = loads(data)
    plan = prog.execution_plan[0]
    consts = [ev.val for ev in plan.values if isinstance(ev.val, Tensor) and ev.val.is_constant]
    for t in consts:
        view = prog.constant_data(t.data_buffer_idx)
        assert view.obj is data  # a view into the caller's bytes, not a copy
    for d in plan.delegates:
        assert prog.delegate_data(d.processed).obj is data


def test_constant_data_matches_the_bytes_in_the_file() -> None:
    data = _bytes("mlp")
    prog = loads(data)
    i = _first_tensor(prog, lambda t: t.is_constant)
    t = prog.execution_plan[0].values[i].val
    view = prog.constant_data(t.data_buffer_idx)
    seg = prog.segments[prog.constant_segment.segment_index]
    base = struct.unpack_from("<Q", data, 24)[0]
    start = base + seg.offset + prog.constant_segment.offsets[t.data_buffer_idx]
    assert bytes(view[:16]) == data[start : start + 16]


def test_delegate_data_moves_between_inline_and_segments() -> None:
    names = [n for n in ALL if loads(_bytes(n)).execution_plan[0].delegates]
    if not names:
        pytest.skip("no delegated fixture yet")
    for name in names:
        prog = loads(_bytes(name))
        blobs = [bytes(prog.delegate_data(d.processed)) for p in prog.execution_plan for d in p.delegates]
        for mode, loc in (("inline", DataLocation.INLINE), ("segment", DataLocation.SEGMENT)):
            moved = loads(dumps(prog, delegate_data=mode))
            ds = [d for p in moved.execution_plan for d in p.delegates]
            assert all(d.processed.location == loc for d in ds)
            assert [bytes(moved.delegate_data(d.processed)) for d in ds] == blobs
            assert loads(dumps(moved, delegate_data="keep")) == moved


def test_error_types_and_codes() -> None:
    with pytest.raises(ProgramError) as ei:
        loads(b"\0" * 4)
    assert isinstance(ei.value, OrchestraError)
    assert ei.value.code is Error.InvalidProgram
    assert "too short" in str(ei.value)
    assert issubclass(orchestra.ProgramError, orchestra.OrchestraError)


def test_wrong_identifier_is_named() -> None:
    data = bytearray(_bytes("mlp"))
    data[4:8] = b"XX99"
    with pytest.raises(ProgramError, match=r"header: file identifier is b'XX99', expected b'ET12'"):
        loads(bytes(data))


def test_missing_and_bad_files(tmp_path: pathlib.Path) -> None:
    with pytest.raises(NotFoundError, match="nope.pte: no such file"):
        load(tmp_path / "nope.pte")
    empty = tmp_path / "empty.pte"
    empty.write_bytes(b"")
    with pytest.raises(ProgramError, match="empty.pte: header: file is empty"):
        load(empty)
    bad = tmp_path / "trunc.pte"
    bad.write_bytes(_bytes("cnn")[:1000])
    with pytest.raises(ProgramError, match=r"^.*trunc\.pte: extended_header\.program_size"):
        load(bad)


def test_not_bytes() -> None:
    with pytest.raises(ProgramError, match="must be bytes-like, not int"):
        loads(42)  # type: ignore[arg-type]


def _locate_sizes_vector(data: bytes, value_index: int) -> int:
    """Position of the length word of values[value_index].tensor.sizes (test navigation)."""
    fb = memoryview(data)[: struct.unpack_from("<Q", data, 16)[0]]
    r = _reader._FlatReader(fb, None)
    root = r.table(struct.unpack_from("<I", fb, 0)[0], "program")
    plan = r.tables(root, 1, "p")[0][0]
    val = r.tables(plan, 2, "v")[value_index][0]
    _, tensor = r.union(val, 0, "val")
    field = r._field(tensor, 2, 4, "sizes")
    return field + struct.unpack_from("<I", fb, field)[0]


def test_vector_past_the_end_names_the_path() -> None:
    data = _bytes("mlp")
    idx = _first_tensor(loads(data))
    pos = _locate_sizes_vector(data, idx)
    bad = bytearray(data)
    struct.pack_into("<I", bad, pos, 0x3FFFFFFF)
    with pytest.raises(ProgramError) as ei:
        loads(bytes(bad))
    assert str(ei.value) == f"execution_plan[0].values[{idx}].tensor.sizes: vector runs past the end of the buffer"


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"scalar_type": 99}, r"\.tensor\.scalar_type: unknown scalar type 99"),
        ({"storage_offset": 3}, r"\.tensor\.storage_offset: storage_offset 3 is not supported"),
        ({"dim_order": (0, 0)}, r"\.tensor\.dim_order: \[0, 0\] is not a permutation"),
        ({"shape_dynamism": 7}, r"\.tensor\.shape_dynamism: unknown shape dynamism 7"),
        ({"sizes": (-1, 4)}, r"\.tensor\.sizes: negative size -1"),
    ],
)
def test_tensor_metadata_is_verified(changes, message) -> None:
    prog = loads(_bytes("mlp"))
    idx = _first_tensor(prog, lambda t: len(t.sizes) == 2)
    bad = dumps(_replace_value(prog, idx, **changes))
    with pytest.raises(ProgramError, match=rf"^execution_plan\[0\]\.values\[{idx}\]{message}"):
        loads(bad)


def test_planned_tensor_must_fit_its_arena() -> None:
    prog = loads(_bytes("mlp"))
    idx = _first_tensor(prog, lambda t: t.allocation_info is not None)
    t = prog.execution_plan[0].values[idx].val
    big = (t.sizes[0] * 1000,) + t.sizes[1:]
    with pytest.raises(ProgramError, match=r"allocation_info: tensor of \d+ bytes at offset \d+ overruns planned buffer 1"):
        loads(dumps(_replace_value(prog, idx, sizes=big)))


def test_constant_tensor_must_fit_its_data() -> None:
    prog = loads(_bytes("mlp"))
    idx = _first_tensor(prog, lambda t: t.is_constant)
    t = prog.execution_plan[0].values[idx].val
    with pytest.raises(ProgramError, match=r"data_buffer_idx: tensor needs \d+ bytes but its data has \d+"):
        loads(dumps(_replace_value(prog, idx, sizes=tuple(s * 64 for s in t.sizes))))
    with pytest.raises(ProgramError, match=r"data_buffer_idx: constant buffer index 999 out of range"):
        loads(dumps(_replace_value(prog, idx, data_buffer_idx=999)))


def test_instruction_indices_are_verified() -> None:
    prog = loads(_bytes("mlp"))
    plan = prog.execution_plan[0]
    chain = plan.chains[0]
    ins = list(chain.instructions)
    k = next(i for i, x in enumerate(ins) if isinstance(x.instr_args, KernelCall))
    ins[k] = dataclasses.replace(ins[k], instr_args=KernelCall(op_index=len(plan.operators), args=ins[k].instr_args.args))
    bad = dataclasses.replace(prog, execution_plan=(dataclasses.replace(plan, chains=(dataclasses.replace(chain, instructions=tuple(ins)),)),))
    with pytest.raises(ProgramError, match=rf"chains\[0\]\.instructions\[{k}\]\.KernelCall\.op_index: operator index \d+ out of range"):
        loads(dumps(bad))


def test_caps_a_caller_can_set() -> None:
    data = _bytes("cnn")
    with pytest.raises(ProgramError, match="instructions exceed the cap of 1"):
        loads(data, limits=Limits(max_instructions=1))
    with pytest.raises(ProgramError, match="bytes of planned memory exceed the cap of 100"):
        loads(data, limits=Limits(max_planned_memory=100))
    with pytest.raises(ProgramError, match="elements exceed the cap of 10"):
        loads(data, limits=Limits(max_numel=10))
    with pytest.raises(ProgramError, match="cap on decoded objects"):
        loads(data, limits=Limits(max_objects=50))
    assert loads(data, limits=Limits(None, None, None, None, None)) == loads(data)


def test_unknown_method_is_not_found() -> None:
    prog = loads(_bytes("mlp"))
    with pytest.raises(NotFoundError, match=r"method 'nope' not found \(methods: forward\)"):
        prog.plan("nope")


def test_dumps_rejects_bad_arguments() -> None:
    prog = loads(_bytes("mlp"))
    with pytest.raises(orchestra.InvalidArgumentError, match="segment_alignment must be a power of two, got 3"):
        dumps(prog, segment_alignment=3)
    with pytest.raises(orchestra.InvalidArgumentError, match="delegate_data must be"):
        dumps(prog, delegate_data="elsewhere")  # type: ignore[arg-type]


@pytest.mark.executorch
@pytest.mark.parametrize("name", ALL)
def test_executorch_runs_our_rewrite_identically(name: str) -> None:
    et = pytest.importorskip("executorch.runtime")
    torch = pytest.importorskip("torch")
    npz = np.load(FIXTURES / f"{name}.npz")
    original = _bytes(name)
    rewritten = dumps(loads(original))
    runtime = et.Runtime.get()
    methods = sorted({k.split(".")[0] for k in npz.files})
    for method in methods:
        n_in = len([k for k in npz.files if k.startswith(f"{method}.in_")])
        inputs = [torch.from_numpy(np.array(npz[f"{method}.in_{i}"])) for i in range(n_in)]
        want = runtime.load_program(original).load_method(method).execute(inputs)
        got = runtime.load_program(rewritten).load_method(method).execute(inputs)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_large_inline_payloads_cost_nothing_per_byte() -> None:
    """A 16 MiB inline delegate blob is a view, so it must not trip the object budget."""
    prog = loads(_bytes("xnnpack_inline"))
    blob = memoryview(bytes(16 << 20))
    big = dataclasses.replace(prog, backend_delegate_data=(dataclasses.replace(prog.backend_delegate_data[0], data=blob),))
    again = loads(dumps(big), limits=Limits(max_objects=100_000))
    assert len(again.backend_delegate_data[0].data) == 16 << 20


# -- the fast path of the reader (values and instructions without path strings) -------------------
@pytest.mark.parametrize("name", ALL)
def test_fast_and_checked_decoding_agree_on_every_fixture(name: str) -> None:
    data = _bytes(name)
    assert _reader._loads(data, Limits(), True) == _reader._loads(data, Limits(), False)


def _decode(data: bytes, fast: bool) -> object:
    try:
        return _reader._loads(data, Limits(), fast)
    except (ProgramError, _reader._Fallback, struct.error, IndexError, ValueError, OverflowError) as exc:
        return type(exc)


def _compare_paths(bad: bytes) -> str:
    """Decodes ``bad`` on both paths: "refused" (both refuse it, and a caller sees the checked
    path's ProgramError), "same" (the same program) or "fallback" (the fast path gave up)."""
    checked = _decode(bad, False)
    fast = _decode(bad, True)
    if isinstance(checked, type):
        assert isinstance(fast, type), "the fast path accepted a program the checked path refuses"
        with pytest.raises(ProgramError):  # what a caller sees: the checked path's error
            loads(bad)
        return "refused"
    assert fast == checked or fast is _reader._Fallback
    return "same" if fast == checked else "fallback"


@pytest.mark.parametrize("name", ["mlp", "transformer", "xnnpack_transformer"])
def test_fast_decoding_never_accepts_what_the_checked_path_refuses(name: str) -> None:
    # Byte mutations in the flatbuffer (tables, vtables, vectors, values, instructions): the
    # fast path either decodes the same program as the checked path or gives up (loads then
    # decodes again on the checked path, whose error names the place).
    data = _bytes(name)
    fb_size = struct.unpack_from("<Q", data, 16)[0]
    rng = np.random.default_rng(12)
    refused = 0
    for _ in range(400):
        bad = bytearray(data)
        for pos in rng.integers(8, fb_size, size=int(rng.integers(1, 4))):
            bad[pos] = int(rng.integers(0, 256)) if rng.random() < 0.7 else bad[pos] ^ (1 << int(rng.integers(0, 8)))
        refused += _compare_paths(bytes(bad)) == "refused"
    assert refused > 50


def _segment_and_named_data_bytes(data: bytes) -> list[int]:
    """The positions of the bytes that hold the program's segments and named_data: the vectors'
    offsets and lengths, their tables and vtables, the keys (length, bytes, terminator)."""
    fb = memoryview(data)
    r = _reader._FlatReader(fb, None)
    root = r.table(struct.unpack_from("<I", data, 0)[0], "program")
    places: set[int] = set()
    for slot in (4, 7):
        p = r._field(root, slot, 4, "")
        v = p + struct.unpack_from("<I", data, p)[0]
        places.update(range(p, p + 4))
        places.update(range(v, v + 4 + 4 * struct.unpack_from("<I", data, v)[0]))
        for t, _ in r.tables(root, slot, "") or []:
            places.update(range(t.pos, t.pos + t.objsize))
            places.update(range(t.vt, t.vt + t.vtsize))
            if slot == 7:
                key = r._field(t, 0, 4, "")
                k = key + struct.unpack_from("<I", data, key)[0]
                places.update(range(k, k + 5 + struct.unpack_from("<I", data, k)[0]))
    return sorted(places)


@pytest.mark.parametrize("name", ["xnnpack_transformer", "xnnpack_convnet"])
def test_segments_and_named_data_decode_the_same_on_the_fast_path_or_fall_back(name: str) -> None:
    """The fast path decodes an XNNPACK program's segments and named data (hundreds in a real
    model) without schema paths: byte mutations inside them give the checked path's program or
    a fallback, never a program the checked path refuses, and what a caller sees is the checked
    path's error."""
    data = _bytes(name)
    places = _segment_and_named_data_bytes(data)
    assert _reader._loads(data, Limits(), True) == _reader._loads(data, Limits(), False)
    rng = np.random.default_rng(7)
    refused = same = 0
    native = _reader._native_decode
    if native is not None:  # the C decoder reads both tables of the unmutated program
        seen: list[str] = []

        class Spy:
            def __getattr__(self, kind: str):  # noqa: ANN204
                seen.append(kind)
                return getattr(native, kind)

        _reader._native_decode = Spy()
        try:
            assert _reader._loads(data, Limits(), True) == _reader._loads(data, Limits(), False)
        finally:
            _reader._native_decode = native
        assert {"segments", "named_data"} <= set(seen)
    for _ in range(600):
        bad = bytearray(data)
        for pos in rng.choice(places, size=int(rng.integers(1, 3))):
            bad[pos] = int(rng.integers(0, 256)) if rng.random() < 0.5 else bad[pos] ^ (1 << int(rng.integers(0, 8)))
        outcome = _compare_paths(bytes(bad))
        refused += outcome == "refused"
        same += outcome == "same"
        if native is not None:  # the C decoder's segments and named data: as the Python fast path's
            with_c = _decode(bytes(bad), True)
            _reader._native_decode = None
            try:
                python = _decode(bytes(bad), True)
            finally:
                _reader._native_decode = native
            assert isinstance(with_c, type) == isinstance(python, type)
            assert isinstance(with_c, type) or with_c == python
    assert refused > 50 and same > 50


def test_named_data_without_a_key_is_refused_with_its_path() -> None:
    data = _bytes("xnnpack_convnet")
    r = _reader._FlatReader(memoryview(data), None)
    root = r.table(struct.unpack_from("<I", data, 0)[0], "program")
    t, _ = (r.tables(root, 7, "") or [])[0]
    bad = bytearray(data)
    struct.pack_into("<H", bad, t.vt + 4, 0)  # the vtable's entry for field 0 (key): absent
    with pytest.raises(_reader._Fallback):
        _reader._loads(bytes(bad), Limits(), True)
    with pytest.raises(ProgramError, match=r"^named_data\[0\]\.key: named data has no key"):
        loads(bytes(bad))


def test_a_bad_value_found_on_the_fast_path_is_reported_with_its_path() -> None:
    data = _bytes("mlp")
    idx = _first_tensor(loads(data))
    bad = bytearray(data)
    struct.pack_into("<I", bad, _locate_sizes_vector(data, idx), 0x3FFFFFFF)
    with pytest.raises(_reader._Fallback):
        _reader._loads(bytes(bad), Limits(), True)
    with pytest.raises(ProgramError, match=rf"^execution_plan\[0\]\.values\[{idx}\]\.tensor\.sizes: vector runs past"):
        loads(bytes(bad))


# -- the schema's dataclasses (built through their slot descriptors) ----------------------------
def test_schema_classes_keep_their_dataclass_signature_and_stay_frozen() -> None:
    import inspect

    from orchestra.program import _schema

    classes = [c for c in vars(_schema).values() if isinstance(c, type) and dataclasses.is_dataclass(c)]
    assert len(classes) > 30
    for cls in classes:
        params = list(inspect.signature(cls).parameters.values())
        fields = [f for f in dataclasses.fields(cls) if f.init]
        assert [p.name for p in params] == [f.name for f in fields], cls
        assert [p.default for p in params] == [
            inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default for f in fields], cls
    t = _schema.Tensor(6, 0, (2, 3), (0, 1), data_buffer_idx=1)
    assert t == _schema.Tensor(scalar_type=6, storage_offset=0, sizes=(2, 3), dim_order=(0, 1), requires_grad=False,
                               data_buffer_idx=1)
    assert hash(t) == hash(dataclasses.replace(t))
    assert (t.allocation_info, t.layout, t.shape_dynamism, t.extra_tensor_info) == (None, 0, 0, None)
    assert dataclasses.replace(t, sizes=(6,)).sizes == (6,)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.sizes = (1,)  # type: ignore[misc]
    with pytest.raises(TypeError):
        _schema.Int()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _schema.Int(1, 2)  # type: ignore[call-arg]


def _passes(data: bytes, max_objects: int, fast: bool) -> bool:
    try:
        _reader._loads(data, Limits(max_objects=max_objects), fast)
    except ProgramError:
        return False
    return True


@pytest.mark.parametrize("name", ["mlp", "transformer", "cnn", "xnnpack_transformer"])
def test_the_fast_path_refuses_a_program_past_the_object_cap_the_checked_path_refuses(name: str) -> None:
    # Limits.max_objects must not be easier to pass on the fast path.
    data = _bytes(name)
    lo, hi = 0, 1 << 20  # the smallest cap the checked path accepts lies in (lo, hi]
    assert _passes(data, hi, False)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _passes(data, mid, False) else (mid, hi)
    assert not _passes(data, hi - 1, True)
    assert not _passes(data, hi - 1, False)
