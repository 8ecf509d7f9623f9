"""2,000 seeded byte mutations of the fixtures: each loads or raises ProgramError, within 1 s;
2,000 seeded structured mutations (tools/fuzz_pte.py --structured): each loads and executes,
or raises an OrchestraError, within 2 s and 512 MiB (measured in the fuzzer's worker process)."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("fuzz_pte", ROOT / "tools" / "fuzz_pte.py")
fuzz_pte = importlib.util.module_from_spec(_spec)
sys.modules["fuzz_pte"] = fuzz_pte
_spec.loader.exec_module(fuzz_pte)

CASES = 2000


def test_mutated_programs_load_or_raise_program_error() -> None:
    fixtures = [p.read_bytes() for p in sorted((ROOT / "tests" / "fixtures").glob("*.pte"))]
    assert fixtures
    kinds: dict[str, int] = {}
    outcomes: dict[str, int] = {}
    bad = []
    for i, kind, _case, out in fuzz_pte.run(fixtures, CASES, seed=20261122):
        kinds[kind] = kinds.get(kind, 0) + 1
        outcomes[out.kind] = outcomes.get(out.kind, 0) + 1
        if out.kind in ("crashed", "slow"):
            bad.append(f"case {i} ({kind}): {out.kind}: {out.detail}")
    assert not bad, "\n".join(bad[:20])
    assert set(kinds) == set(fuzz_pte.KINDS)
    # The mutations must really exercise both paths.
    assert outcomes.get("rejected", 0) > CASES // 2
    assert outcomes.get("loaded", 0) > 0


def test_mutator_is_deterministic() -> None:
    fixtures = [p.read_bytes() for p in sorted((ROOT / "tests" / "fixtures").glob("*.pte"))]
    a = [c for _, _, c, _ in fuzz_pte.run(fixtures, 50, seed=5)]
    b = [c for _, _, c, _ in fuzz_pte.run(fixtures, 50, seed=5)]
    assert a == b


def test_structured_mutations_load_and_execute_or_raise_orchestra_error() -> None:
    fixtures = [p.read_bytes() for p in sorted((ROOT / "tests" / "fixtures").glob("*.pte"))]
    kinds: dict[str, int] = {}
    outcomes: dict[str, int] = {}
    bad = []
    for i, kind, case, out in fuzz_pte.structured_run(fixtures, CASES, seed=20261123):
        if out.kind == "slow":  # once more in a fresh worker: a busy machine is not a slow case
            out = fuzz_pte.structured_recheck(case)
        kinds[kind] = kinds.get(kind, 0) + 1
        outcomes[out.kind] = outcomes.get(out.kind, 0) + 1
        if out.kind not in ("executed", "rejected"):
            bad.append(f"case {i} ({kind}): {out.kind}: {out.detail}")
    assert not bad, "\n".join(bad[:20])
    assert set(kinds) == set(fuzz_pte.STRUCT_KINDS)
    # Both paths are exercised: programs that still run, and programs refused (at load or execute).
    assert outcomes.get("executed", 0) > CASES // 10
    assert outcomes.get("rejected", 0) > CASES // 2


def test_structured_mutator_is_deterministic() -> None:
    fixtures = [p.read_bytes() for p in sorted((ROOT / "tests" / "fixtures").glob("*.pte"))]
    a = [c for _, _, c in fuzz_pte.structured_cases(fixtures, 60, seed=5)]
    b = [c for _, _, c in fuzz_pte.structured_cases(fixtures, 60, seed=5)]
    assert a == b and len(set(a)) > 50


def test_a_workers_memory_peak_is_its_own_not_its_parents() -> None:
    """The worker's peak is /proc's VmHWM after clear_refs, not getrusage's ru_maxrss, which
    also keeps the peak of the memory exec replaced: the forked test runner's. (In CI the test
    process had grown past the 512 MiB limit and every case read as 'hungry'.)"""
    import numpy as np

    if not pathlib.Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/self/clear_refs")
    big = np.ones(600 << 18, np.float32)  # 600 MiB resident in this process, the worker's parent
    fixtures = [p.read_bytes() for p in sorted((ROOT / "tests" / "fixtures").glob("*.pte"))]
    try:
        outs = [out for _, _, _, out in fuzz_pte.structured_run(fixtures, 3, seed=20261123)]
    finally:
        del big
    assert [o.kind for o in outs if o.kind == "hungry"] == [], [o.detail for o in outs]
