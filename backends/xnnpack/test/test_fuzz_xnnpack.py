"""2,000 seeded mutations of the committed fixtures' XNNPACK delegate blobs (tools/fuzz_pte.py
--xnnpack): each is parsed, compiled and run, and must succeed or raise an OrchestraError,
within 1 s."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("fuzz_pte", ROOT / "tools" / "fuzz_pte.py")
assert _spec is not None and _spec.loader is not None
fuzz_pte = sys.modules.get("fuzz_pte") or importlib.util.module_from_spec(_spec)
if "fuzz_pte" not in sys.modules:
    sys.modules["fuzz_pte"] = fuzz_pte
    _spec.loader.exec_module(fuzz_pte)

CASES = 2000


def _cases():
    fixtures = [p.read_bytes() for p in sorted((ROOT / "tests" / "fixtures").glob("xnnpack_*.pte"))]
    cases = fuzz_pte.xnnpack_cases(fixtures)
    assert len(cases) >= 5
    return cases


def test_mutated_xnnpack_blobs_run_or_raise_orchestra_error() -> None:
    kinds: dict[str, int] = {}
    outcomes: dict[str, int] = {}
    bad = []
    for i, kind, _blob, out in fuzz_pte.run_xnnpack(_cases(), CASES, seed=20261123):
        kinds[kind] = kinds.get(kind, 0) + 1
        outcomes[out.kind] = outcomes.get(out.kind, 0) + 1
        if out.kind in ("crashed", "slow"):
            bad.append(f"case {i} ({kind}): {out.kind}: {out.detail}")
    assert not bad, "\n".join(bad[:20])
    assert set(kinds) == set(fuzz_pte.XNNPACK_KINDS)
    assert outcomes.get("rejected", 0) > CASES // 2
    assert outcomes.get("loaded", 0) > 0


def test_xnnpack_mutator_is_deterministic() -> None:
    a = [b for _, _, b, _ in fuzz_pte.run_xnnpack(_cases(), 40, seed=5)]
    b = [b for _, _, b, _ in fuzz_pte.run_xnnpack(_cases(), 40, seed=5)]
    assert a == b


def _parse_outcome(blob: bytes) -> tuple:
    from orchestra.backends.xnnpack import _blob
    from orchestra.errors import OrchestraError

    try:
        # repr: NaN fields compare equal, and 0 differs from 0.0
        return ("ok", repr(_blob.parse_blob(memoryview(blob), "d", max_objects=20_000)))
    except OrchestraError as exc:
        return ("error", type(exc).__name__, exc.code, str(exc))


def test_the_fast_blob_decoders_agree_with_the_checked_one(monkeypatch) -> None:
    """parse_blob decodes values, nodes and constants on a fast path (no schema paths, one
    unpack per vtable; in C where the optional extension ``_xdecode`` is built) that must
    accept exactly what the checked decoders accept: on the fixtures' blobs (the int8 ones'
    quantized values included) and 3,000 seeded mutations of them, the graph or the error
    (type, code, message) is the same from the C decoder, from the Python fast path and with
    the fast path switched off. The object budget is small here so that mutated vector lengths
    reach it."""
    from orchestra.backends.xnnpack import _blob
    from orchestra.program._reader import _Fallback

    int8 = [p.read_bytes() for p in sorted((ROOT / "tests" / "fixtures" / "int8").glob("xnnpack_int8_*.pte"))]
    cases = _cases() + fuzz_pte.xnnpack_cases(int8)
    assert len(cases) > len(_cases())
    rng = fuzz_pte.random.Random(20261126)
    blobs = [c.blob for c in cases]
    blobs += [fuzz_pte.mutate_xnnpack(cases[i % len(cases)].blob, rng,
                                      fuzz_pte.XNNPACK_KINDS[(i // len(cases)) % len(fuzz_pte.XNNPACK_KINDS)])
              for i in range(3000)]
    ways = {}
    if _blob._native_xdecode is not None:
        native_calls = []
        whole_calls = []
        real = _blob._native_xdecode

        class Spy:
            def __init__(self, whole: bool) -> None:
                self.whole = whole

            def blob(self, *a):  # noqa: ANN002, ANN202
                got = real.blob(*a) if self.whole else None
                whole_calls.append(got is not None)
                return got

            def graph(self, *a):  # noqa: ANN002, ANN202
                got = real.graph(*a)
                native_calls.append(got is not None)
                return got

            def constants(self, *a):  # noqa: ANN002, ANN202
                return real.constants(*a)

        monkeypatch.setattr(_blob, "_native_xdecode", Spy(whole=True))
        ways["C, whole blob"] = [_parse_outcome(b) for b in blobs]
        # the unmutated blobs and many mutated ones decoded in the one call
        assert sum(whole_calls) >= len(cases) and sum(whole_calls) < len(blobs)
        monkeypatch.setattr(_blob, "_native_xdecode", Spy(whole=False))
        ways["C, values and nodes"] = [_parse_outcome(b) for b in blobs]
        assert sum(native_calls) >= len(cases)  # the C decoder decoded (at least the unmutated blobs)
    monkeypatch.setattr(_blob, "_native_xdecode", None)
    ways["Python fast path"] = [_parse_outcome(b) for b in blobs]
    fell_back = []

    def no_fast(self, pos):
        fell_back.append(pos)
        raise _Fallback

    monkeypatch.setattr(_blob._Fast, "table", no_fast)
    checked = [_parse_outcome(b) for b in blobs]
    assert len(fell_back) > len(blobs) // 3  # the checked decoders did run
    for way, got in ways.items():
        for i, (a, b) in enumerate(zip(got, checked)):
            assert a == b, f"blob {i}: {way} {a!r:.300}\nchecked path {b!r:.300}"
    assert sum(1 for a in checked if a[0] == "ok") >= len(cases)
    assert sum(1 for a in checked if a[0] == "error") > 500


def test_the_c_decoder_builds_the_blob_classes_and_refuses_makers_that_do_not_fit() -> None:
    """The C decoder builds XValue / XNode / QuantParams objects itself (through their slots);
    makers naming too few fields, or a field that is not a slot, are a TypeError, not objects
    with unset fields."""
    import pytest

    from orchestra.backends.xnnpack import _blob

    native = _blob._native_xdecode
    if native is None:
        pytest.skip("the C decoder is not built")
    blob = memoryview(_cases()[0].blob).cast("B")
    hdr = _blob.parse_header(blob, "test")
    if hdr is not None:  # the flatbuffer after the header
        blob = blob[hdr[0]:hdr[0] + hdr[1]]
    root = int.from_bytes(bytes(blob[:4]), "little")
    values, nodes, _ = native.graph(blob, len(blob), root, 10_000_000, _blob._LAYOUT_CODES, _blob._MAKERS)
    assert values and nodes
    assert all(type(v) is _blob.XValue and v.index == i for i, v in enumerate(values))
    assert all(type(n) is _blob.XNode and n.index == i and n.type for i, n in enumerate(nodes))
    bad = [((_blob.XValue, ("index", "id")),) + _blob._MAKERS[1:],  # too few fields
           _blob._MAKERS[:1] + ((_blob.XNode, ("index", "type", "fields", "debug_handle", "is_input")),)
           + _blob._MAKERS[2:],  # not a slot (a property of XValue, no attribute of XNode)
           _blob._MAKERS[:3] + (("PerChannelQuant",), _blob._MAKERS[4]),  # one kind
           _blob._MAKERS[:4] + (_blob._MAKERS[4][:-1],)]  # a node type short
    for makers in bad:
        with pytest.raises((TypeError, AttributeError)):
            native.graph(blob, len(blob), root, 10_000_000, _blob._LAYOUT_CODES, makers)


def _real_xnnpack_files() -> list[pathlib.Path]:
    """The committed XNNPACK fixtures, plus the real-size exports of ``benchmarks/real_models.py``
    where they are cached ($ORCHESTRA_REAL_MODELS, or ~/.cache/orchestra/real_models/*/)."""
    import os

    files = sorted((ROOT / "tests" / "fixtures").glob("xnnpack_*.pte"))
    files += sorted((ROOT / "tests" / "fixtures" / "int8").glob("xnnpack_int8_*.pte"))
    env = os.environ.get("ORCHESTRA_REAL_MODELS")
    dirs = [pathlib.Path(env)] if env else sorted((pathlib.Path.home() / ".cache" / "orchestra" / "real_models").glob("*"))
    for d in dirs:
        files += sorted(d.glob("*.xnnpack*.pte"))
    return files


def test_the_one_call_c_decoder_agrees_on_every_real_xnnpack_file(monkeypatch) -> None:
    """Every delegate of every XNNPACK file at hand decodes to the same graph (repr: values,
    nodes, ids, constants, the constant section's bytes) through the C decoder's one call for
    the whole blob as through the Python decoders."""
    import pytest

    from orchestra.backends.xnnpack import _blob
    from orchestra.runtime import load_program

    if _blob._native_xdecode is None:
        pytest.skip("the C decoder is not built")
    real = _blob._native_xdecode
    blobs = []
    for f in _real_xnnpack_files():
        d = load_program(f).definition
        for name in d.method_names:
            blobs += [d.delegate_data(x.processed) for x in d.plan(name).delegates if x.id == "XnnpackBackend"]
    assert len(blobs) >= 5
    whole, parts = [], []

    class Spy:
        def blob(self, *a):  # noqa: ANN002, ANN202
            got = real.blob(*a)
            whole.append(got is not None)
            return got

        def graph(self, *a):  # noqa: ANN002, ANN202
            got = real.graph(*a)
            parts.append(got is not None)
            return got

        def constants(self, *a):  # noqa: ANN002, ANN202
            return real.constants(*a)

    def graph(b: memoryview) -> tuple:
        g = _blob.parse_blob(b, "d")
        return repr(g), bytes(g.constant_section), g.constants

    monkeypatch.setattr(_blob, "_native_xdecode", Spy())
    c = [graph(b) for b in blobs]
    # every one decoded in the one call but those the C decoder leaves to the checked one
    # (a dynamic int8 fixture's per-token quantization)
    assert len(whole) == len(blobs) and whole.count(False) == parts.count(False) < len(blobs) // 4
    monkeypatch.setattr(_blob, "_native_xdecode", None)
    assert c == [graph(b) for b in blobs]
