"""Format-layer benchmark: how long loading a ``.pte`` takes and how much memory it keeps.

Run on demand (not a test):

    python benchmarks/bench_format.py [--fixtures DIR] [--repeat N]

Per fixture: median and min time of ``loads(bytes)``, ``load(path)`` (open + mmap + parse)
and ``dumps(program)``; the bytes Python allocates while ``loads`` runs (``tracemalloc`` peak)
and those still held after it returns with the program alive (retained), next to the file
size and the payload size (constant tensors + delegate blobs + named data). Weights are views
into the input, so retained memory is program metadata only.

The baseline, measured in the same run: the first fixture again with 16 MiB of extra named
data appended (``+16MiB``). If loading copied weights, its retained bytes would grow by
16 MiB; they should stay those of the original.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import pathlib
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from orchestra.program import DataLocation, DataSegment, NamedData, ProgramDef, dumps, load, loads

DEFAULT_FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures"
PAD = 16 << 20


def _time_us(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """(median, min) wall time of ``fn()`` in microseconds over ``repeat`` runs."""
    for _ in range(min(10, repeat)):
        fn()
    samples = []
    clock = time.perf_counter_ns
    for _ in range(repeat):
        t0 = clock()
        fn()
        samples.append(clock() - t0)
    return statistics.median(samples) / 1e3, min(samples) / 1e3


def _alloc(data: bytes) -> tuple[int, int]:
    """(peak, retained) bytes Python allocates while ``loads(data)`` runs / after it returns."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        prog = loads(data)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del prog
    return peak - before, current - before


def payload_bytes(prog: ProgramDef) -> int:
    """Bytes of constant data, delegate blobs and named data (what a loader could copy)."""
    total = sum(len(b.storage) for b in prog.constant_buffer)
    cs = prog.constant_segment
    if cs is not None and cs.offsets:
        total += prog.segments[cs.segment_index].size
    total += sum(len(d.data) for d in prog.backend_delegate_data)
    seen: set[int] = set()
    for plan in prog.execution_plan:
        for d in plan.delegates:
            if d.processed.location == DataLocation.SEGMENT and d.processed.index not in seen:
                seen.add(d.processed.index)
                total += prog.segments[d.processed.index].size
    for nd in prog.named_data:
        if nd.segment_index not in seen:
            seen.add(nd.segment_index)
            total += prog.segments[nd.segment_index].size
    for ms in prog.mutable_data_segments:
        if ms.segment_index not in seen:
            seen.add(ms.segment_index)
            total += prog.segments[ms.segment_index].size
    return total


def padded(prog: ProgramDef, extra: int) -> bytes:
    """``prog`` with one more named-data segment of ``extra`` bytes, serialised."""
    blob = memoryview(bytes(range(256)) * (extra // 256))
    seg = DataSegment(offset=0, size=len(blob), data=blob)
    return dumps(dataclasses.replace(
        prog,
        segments=prog.segments + (seg,),
        named_data=prog.named_data + (NamedData("bench.padding", len(prog.segments)),),
    ))


def measure(name: str, path: pathlib.Path, data: bytes, repeat: int) -> dict[str, Any]:
    prog = loads(data)
    peak, retained = _alloc(data)
    row = {
        "name": name,
        "file": len(data),
        "payload": payload_bytes(prog),
        "loads": _time_us(lambda: loads(data), repeat),
        "load": _time_us(lambda: load(path), repeat),
        # dumps writes every payload byte: fewer runs for the big baseline file
        "dumps": _time_us(lambda: dumps(prog), repeat if len(data) < (1 << 20) else max(5, repeat // 20)),
        "peak": peak,
        "retained": retained,
    }
    return row


def _kib(n: int) -> str:
    return f"{n / 1024:,.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixtures", type=pathlib.Path, default=DEFAULT_FIXTURES,
                    help=f"folder of .pte files (default: {DEFAULT_FIXTURES})")
    ap.add_argument("--repeat", type=int, default=200, help="timed runs per measurement (default 200)")
    args = ap.parse_args(argv)
    files = sorted(args.fixtures.glob("*.pte"))
    if not files:
        print(f"bench_format: no .pte files in {args.fixtures}", file=sys.stderr)
        return 2

    rows = [measure(p.stem, p, p.read_bytes(), args.repeat) for p in files]
    base = max(rows, key=lambda r: r["payload"])  # the most weight-heavy fixture
    base_path = args.fixtures / f"{base['name']}.pte"
    with tempfile.TemporaryDirectory() as tmp:
        big_path = pathlib.Path(tmp) / f"{base['name']}+16MiB.pte"
        big = padded(load(base_path), PAD)
        big_path.write_bytes(big)
        big_row = measure(big_path.stem, big_path, big, args.repeat)
    rows.append(big_row)

    head = ["fixture", "file KiB", "payload KiB", "loads med/min µs", "load med/min µs",
            "dumps med µs", "peak KiB", "retained KiB", "retained/file", "retained/payload"]
    table = [head]
    for r in rows:
        table.append([
            r["name"], _kib(r["file"]), _kib(r["payload"]),
            f"{r['loads'][0]:,.0f} / {r['loads'][1]:,.0f}", f"{r['load'][0]:,.0f} / {r['load'][1]:,.0f}",
            f"{r['dumps'][0]:,.0f}", _kib(r["peak"]), _kib(r["retained"]),
            f"{r['retained'] / r['file']:.3f}",
            f"{r['retained'] / r['payload']:.3f}" if r["payload"] else "-",
        ])
    widths = [max(len(row[c]) for row in table) for c in range(len(head))]
    print(f"orchestra.program load/dump, {args.repeat} runs each, Python {sys.version.split()[0]}; "
          "peak/retained = Python allocations (tracemalloc) during/after loads(bytes); "
          "payload = constants + delegate blobs + named data")
    for i, row in enumerate(table):
        print("  ".join(cell.ljust(widths[c]) if c == 0 else cell.rjust(widths[c]) for c, cell in enumerate(row)))
        if i == 0:
            print("  ".join("-" * w for w in widths))

    grew = big_row["retained"] - base["retained"]
    slower = big_row["loads"][0] / base["loads"][0]
    ratios = [r["retained"] / r["file"] for r in rows[:-1]]
    if abs(grew) < PAD // 100:
        print(
            f"conclusion: weights are views, not copies: +{PAD >> 20} MiB of weights in {base['name']} "
            f"changed retained memory by {grew:+,} bytes and loads() time by {slower:.2f}x; what is "
            f"retained is metadata ({min(ratios):.1f}-{max(ratios):.1f}x the file for these tiny "
            f"fixtures, {big_row['retained'] / big_row['file']:.3f}x with the weights)."
        )
    else:
        print(f"conclusion: WEIGHTS ARE COPIED: +{PAD >> 20} MiB of weights grew retained memory by {grew:+,} bytes.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
