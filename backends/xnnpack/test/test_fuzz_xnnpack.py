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
