#!/usr/bin/env python3
"""Seeded mutation fuzzer for orchestra's .pte reader.

Mutates real fixtures (bit flips, truncation, 4-byte integer overwrites, splices) and checks
that every case either loads or raises ``orchestra.ProgramError``, never anything else, within
a time limit; a case that loads must also write back (``dumps``) and read back equal.

    python tools/fuzz_pte.py --cases 100000 [--seed 1] [--fixtures tests/fixtures]

The test suite runs 2,000 cases through the same code (tests/test_fuzz.py).

``--xnnpack`` fuzzes XNNPACK delegate blobs instead (the ``xnnpack_*`` fixtures' blobs):
bit flips, truncation, and integer overwrites aimed at the XH00 header's offsets/sizes and
inside the XNNGraph flatbuffer; each case is parsed, compiled and (when that succeeds) run on
zero inputs, and must succeed or raise an ``OrchestraError`` within the time limit.
backends/xnnpack/test runs 2,000 cases.
"""

from __future__ import annotations

import argparse
import pathlib
import random
import struct
import sys
import time
from dataclasses import dataclass

from orchestra import ProgramError
from orchestra.program import dumps, loads

INTERESTING_U32 = (0, 1, 2, 3, 4, 7, 8, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF,
                   0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF)
KINDS = ("bitflip", "truncate", "int32", "splice")


@dataclass(frozen=True)
class Outcome:
    kind: str  # "loaded" | "rejected" | "crashed" | "slow"
    detail: str
    seconds: float


def mutate(data: bytes, rng: random.Random, kind: str, donors: list[bytes]) -> bytes:
    """One mutation of ``data`` of the given kind. Offsets favour the flatbuffer part."""
    n = len(data)
    # Most of a file's structure lives in its first part (the flatbuffer); segments are bytes.
    head = min(n, max(64, struct.unpack_from("<Q", data, 16)[0] if data[8:12] == b"eh00" else n))
    buf = bytearray(data)
    if kind == "bitflip":
        for _ in range(rng.choice((1, 1, 2, 4, 8))):
            pos = rng.randrange(head)
            buf[pos] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        return bytes(buf[: rng.randrange(n)])
    elif kind == "int32":
        for _ in range(rng.choice((1, 1, 2, 3))):
            pos = rng.randrange(max(1, head - 3))
            if rng.random() < 0.7:
                pos &= ~3
            value = rng.choice(INTERESTING_U32) if rng.random() < 0.6 else rng.randrange(1 << 32)
            if rng.random() < 0.3:
                value = (struct.unpack_from("<I", buf, pos)[0] + rng.choice((-8, -4, -1, 1, 4, 8, n))) & 0xFFFFFFFF
            struct.pack_into("<I", buf, pos, value)
    elif kind == "splice":
        donor = rng.choice(donors) if donors else data
        length = rng.randrange(1, min(256, len(donor)) + 1)
        src = rng.randrange(len(donor) - length + 1)
        dst = rng.randrange(head)
        if rng.random() < 0.5:
            buf[dst : dst + length] = donor[src : src + length]  # overwrite
        else:
            buf[dst:dst] = donor[src : src + length]  # insert
    else:  # pragma: no cover
        raise ValueError(kind)
    return bytes(buf)


def check(data: bytes, slow_after: float = 1.0) -> Outcome:
    """Loads one case and classifies what happened."""
    t0 = time.perf_counter()
    try:
        prog = loads(data)
        written = dumps(prog)
        again = loads(written)
        # NaN doubles make equal programs compare unequal; then the rewrite must be stable.
        if again != prog and dumps(again) != written:
            return Outcome("crashed", "loads(dumps(p)) != p", time.perf_counter() - t0)
        kind, detail = "loaded", ""
    except ProgramError as exc:
        kind, detail = "rejected", str(exc)
    except Exception as exc:  # noqa: BLE001 - the point is to catch everything else
        kind, detail = "crashed", f"{type(exc).__name__}: {exc}"
    dt = time.perf_counter() - t0
    if dt > slow_after and kind != "crashed":
        return Outcome("slow", f"{dt:.3f}s ({kind})", dt)
    return Outcome(kind, detail, dt)


def run(fixtures: list[bytes], cases: int, seed: int, progress: bool = False):
    """Yields (case index, kind, mutated bytes, outcome) for ``cases`` seeded mutations."""
    rng = random.Random(seed)
    for i in range(cases):
        data = fixtures[i % len(fixtures)]
        kind = KINDS[(i // len(fixtures)) % len(KINDS)]
        case = mutate(data, rng, kind, fixtures)
        yield i, kind, case, check(case)
        if progress and (i + 1) % 5000 == 0:
            print(f"  {i + 1:,} cases", file=sys.stderr, flush=True)


# -- XNNPACK blob mode -------------------------------------------------------------------
XNNPACK_KINDS = ("bitflip", "truncate", "header", "graph_int32")
_XH_FIELDS = ((8, "<H"), (10, "<I"), (14, "<I"), (18, "<I"), (22, "<Q"))


@dataclass(frozen=True)
class XnnpackCase:
    """One XNNPACK delegate blob of a fixture, with the program's named data."""

    name: str
    blob: bytes
    named_data: dict[str, bytes]


def xnnpack_cases(fixtures: list[bytes]) -> list[XnnpackCase]:
    """Every XnnpackBackend delegate blob in ``fixtures``."""
    out = []
    for k, data in enumerate(fixtures):
        prog = loads(data)
        named = {nd.key: bytes(prog.named_data_bytes(nd.key)) for nd in prog.named_data}
        for plan in prog.execution_plan:
            for i, d in enumerate(plan.delegates):
                if d.id == "XnnpackBackend":
                    out.append(XnnpackCase(f"fixture{k}.{plan.name}.delegate{i}", bytes(prog.delegate_data(d.processed)),
                                           named))
    return out


def mutate_xnnpack(blob: bytes, rng: random.Random, kind: str) -> bytes:
    """One mutation of an XNNPACK blob: ``header`` rewrites one XH00 field (offsets, sizes,
    length) with an interesting or nearby value; ``graph_int32`` overwrites 4-byte words
    inside the flatbuffer (offsets, vtable entries, ids, dims)."""
    buf = bytearray(blob)
    n = len(buf)
    fb_off, fb_size = (struct.unpack_from("<II", buf, 10) if n >= 30 and buf[4:8] == b"XH00" else (0, n))
    fb_end = min(n, fb_off + fb_size)
    if kind == "bitflip":
        for _ in range(rng.choice((1, 1, 2, 4, 8))):
            pos = rng.randrange(min(n, fb_end + 16) or 1)
            buf[pos] ^= 1 << rng.randrange(8)
    elif kind == "truncate":
        return bytes(buf[: rng.randrange(n)])
    elif kind == "header":
        pos, fmt = rng.choice(_XH_FIELDS)
        old = struct.unpack_from(fmt, buf, pos)[0]
        bits = struct.calcsize(fmt) * 8
        choice = rng.random()
        if choice < 0.4:
            value = rng.choice(INTERESTING_U32) & ((1 << bits) - 1)
        elif choice < 0.8:
            value = (old + rng.choice((-16, -8, -4, -1, 1, 4, 8, 16, n))) % (1 << bits)
        else:
            value = rng.randrange(1 << bits)
        struct.pack_into(fmt, buf, pos, value)
    elif kind == "graph_int32":
        for _ in range(rng.choice((1, 1, 2, 3))):
            pos = fb_off + rng.randrange(max(1, fb_end - fb_off - 3))
            if rng.random() < 0.7:
                pos = fb_off + ((pos - fb_off) & ~3)
            value = rng.choice(INTERESTING_U32) if rng.random() < 0.6 else rng.randrange(1 << 32)
            if rng.random() < 0.3:
                value = (struct.unpack_from("<I", buf, pos)[0] + rng.choice((-8, -4, -1, 1, 4, 8))) & 0xFFFFFFFF
            struct.pack_into("<I", buf, pos, value)
    else:  # pragma: no cover
        raise ValueError(kind)
    return bytes(buf)


def check_xnnpack(blob: bytes, named_data: dict[str, bytes], slow_after: float = 1.0) -> Outcome:
    """Parses, compiles and runs one blob (zero inputs); classifies what happened."""
    import numpy as np

    from orchestra import NotFoundError, OrchestraError
    from orchestra.backends.xnnpack._blob import parse_blob
    from orchestra.backends.xnnpack._compile import Workspace, compile_graph

    def named(key: str) -> memoryview:
        if key not in named_data:
            raise NotFoundError(f"named data {key!r} not found")
        return memoryview(named_data[key])

    t0 = time.perf_counter()
    try:
        plan = compile_graph(parse_blob(memoryview(blob), "fuzz"), "fuzz", named)
        ws = Workspace(plan)
        for _, slot, shape, dtype in plan.inputs:
            ws.bufs[slot] = np.zeros(shape, dtype)
        for _, slot, shape, dtype in plan.outputs:
            ws.bufs[slot] = np.empty(shape, dtype)
        with np.errstate(all="ignore"):
            for step in plan.steps:
                step(ws.bufs)
        kind, detail = "loaded", ""
    except OrchestraError as exc:
        kind, detail = "rejected", str(exc)
    except Exception as exc:  # noqa: BLE001 - the point is to catch everything else
        kind, detail = "crashed", f"{type(exc).__name__}: {exc}"
    dt = time.perf_counter() - t0
    if dt > slow_after and kind != "crashed":
        return Outcome("slow", f"{dt:.3f}s ({kind})", dt)
    return Outcome(kind, detail, dt)


def run_xnnpack(cases: list[XnnpackCase], count: int, seed: int, progress: bool = False):
    """Yields (case index, kind, mutated blob, outcome) for ``count`` seeded blob mutations."""
    rng = random.Random(seed)
    for i in range(count):
        c = cases[i % len(cases)]
        kind = XNNPACK_KINDS[(i // len(cases)) % len(XNNPACK_KINDS)]
        blob = mutate_xnnpack(c.blob, rng, kind)
        yield i, kind, blob, check_xnnpack(blob, c.named_data)
        if progress and (i + 1) % 5000 == 0:
            print(f"  {i + 1:,} cases", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fixtures", default=str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures"))
    ap.add_argument("--save-failures", metavar="DIR", help="write each failing case here")
    ap.add_argument("--xnnpack", action="store_true", help="fuzz the XNNPACK delegate blobs of the fixtures instead")
    args = ap.parse_args(argv)
    files = sorted(pathlib.Path(args.fixtures).glob("*.pte"))
    if not files:
        print(f"no .pte files in {args.fixtures}", file=sys.stderr)
        return 2
    fixtures = [f.read_bytes() for f in files]
    if args.xnnpack:
        return _main_xnnpack(args, fixtures)
    counts = {"loaded": 0, "rejected": 0, "crashed": 0, "slow": 0}
    worst = 0.0
    t0 = time.perf_counter()
    failures = 0
    for i, kind, case, out in run(fixtures, args.cases, args.seed, progress=True):
        counts[out.kind] += 1
        worst = max(worst, out.seconds)
        if out.kind in ("crashed", "slow"):
            failures += 1
            print(f"case {i} ({kind}): {out.kind}: {out.detail}")
            if args.save_failures:
                d = pathlib.Path(args.save_failures)
                d.mkdir(parents=True, exist_ok=True)
                (d / f"case{i}.pte").write_bytes(case)
    dt = time.perf_counter() - t0
    print(f"{args.cases:,} cases over {len(files)} fixtures in {dt:.1f}s (seed {args.seed}): "
          f"{counts['loaded']:,} loaded, {counts['rejected']:,} rejected with ProgramError, "
          f"{counts['crashed']} crashed, {counts['slow']} over 1 s; slowest {worst * 1000:.1f} ms")
    return 1 if failures else 0


def _main_xnnpack(args: argparse.Namespace, fixtures: list[bytes]) -> int:
    cases = xnnpack_cases(fixtures)
    if not cases:
        print(f"no XnnpackBackend delegates in {args.fixtures}", file=sys.stderr)
        return 2
    counts = {"loaded": 0, "rejected": 0, "crashed": 0, "slow": 0}
    worst, failures, t0 = 0.0, 0, time.perf_counter()
    for i, kind, blob, out in run_xnnpack(cases, args.cases, args.seed, progress=True):
        counts[out.kind] += 1
        worst = max(worst, out.seconds)
        if out.kind in ("crashed", "slow"):
            failures += 1
            print(f"case {i} ({kind}): {out.kind}: {out.detail}")
            if args.save_failures:
                d = pathlib.Path(args.save_failures)
                d.mkdir(parents=True, exist_ok=True)
                (d / f"xnnpack_case{i}.bin").write_bytes(blob)
    dt = time.perf_counter() - t0
    print(f"{args.cases:,} XNNPACK blob cases over {len(cases)} delegates in {dt:.1f}s (seed {args.seed}): "
          f"{counts['loaded']:,} ran, {counts['rejected']:,} rejected with OrchestraError, "
          f"{counts['crashed']} crashed, {counts['slow']} over 1 s; slowest {worst * 1000:.1f} ms")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
