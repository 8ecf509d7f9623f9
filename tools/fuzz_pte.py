#!/usr/bin/env python3
"""Seeded mutation fuzzer for orchestra's .pte reader.

Mutates real fixtures (bit flips, truncation, 4-byte integer overwrites, splices) and checks
that every case either loads or raises ``orchestra.ProgramError``, never anything else, within
a time limit; a case that loads must also write back (``dumps``) and read back equal.

    python tools/fuzz_pte.py --cases 100000 [--seed 1] [--fixtures tests/fixtures]

``--structured`` mutates decoded programs instead and also executes what loads (see
``structured_run``): every case loads and runs or raises an OrchestraError, in under 2 s and
512 MiB (peak resident memory of the worker process per case, from resource.getrusage).

    python tools/fuzz_pte.py --structured --cases 100000 [--seed 1]

The test suite runs 2,000 cases of each mode through the same code (tests/test_fuzz.py).

``--xnnpack`` fuzzes XNNPACK delegate blobs instead (the ``xnnpack_*`` fixtures' blobs):
bit flips, truncation, and integer overwrites aimed at the XH00 header's offsets/sizes and
inside the XNNGraph flatbuffer; each case is parsed, compiled and (when that succeeds) run on
zero inputs, and must succeed or raise an ``OrchestraError`` within the time limit.
backends/xnnpack/test runs 2,000 cases.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import random
import struct
import sys
import time
from dataclasses import dataclass
from typing import Any

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


# --------------------------------------------------------------------------- structured mode
# Mutates decoded programs through orchestra.program (sizes, dynamism, allocation info, value
# kinds, argument indices, jumps, delegates, ...), re-encodes them, then loads AND executes
# what loads (inputs matching method_meta), in a worker process: a case must load and run,
# or raise an OrchestraError, within STRUCT_SECONDS and STRUCT_PEAK_BYTES. The peak is the
# worker's resident memory: its peak (VmHWM in /proc/self/status) after the kernel's high-water
# mark was reset for the case (Linux: /proc/self/clear_refs), minus the resident memory before it;
# where that reset is unavailable, tracemalloc's peak (Python and numpy allocations; slower).

STRUCT_KINDS = ("sizes", "dynamism", "allocation", "value_kind", "int", "args", "jump", "delegate", "list",
                "operator", "scalar_type", "buffers")
STRUCT_SECONDS = 2.0
STRUCT_PEAK_BYTES = 512 << 20
# What the worker loads programs with, and the kernels' scratch limit there: a program may
# plan at most this much memory (orchestra.program.Limits is the documented knob).
STRUCT_PLANNED_BYTES = 256 << 20
STRUCT_MAX_NUMEL = 1 << 26
_INTERESTING = (0, 1, 2, 3, 4, 7, 8, 16, 255, 256, 4096, 65535, 65536, 20000, 1 << 20, 400_000_000,
                (1 << 31) - 1, -1, -2, -(1 << 31))


def _pick(rng: random.Random, lo: int, hi: int) -> int:
    """An interesting int in [lo, hi] (edges, small numbers, powers of two, or anything)."""
    r = rng.random()
    if r < 0.6:
        v = rng.choice(_INTERESTING)
    elif r < 0.8:
        v = rng.choice((lo, hi, lo + 1, hi - 1))
    else:
        v = rng.randint(lo, hi)
    return min(max(v, lo), hi)


def _near(rng: random.Random, v: int, lo: int, hi: int) -> int:
    """``v`` nudged (an off-by-some), or an interesting int, within [lo, hi]."""
    if rng.random() < 0.5:
        return min(max(v + rng.choice((-2, -1, 1, 2, 8, 1000)), lo), hi)
    return _pick(rng, lo, hi)


I32 = (-(1 << 31), (1 << 31) - 1)
U32 = (0, (1 << 32) - 1)
I64 = (-(1 << 63), (1 << 63) - 1)


def structured_mutate(prog: Any, rng: random.Random, kind: str) -> Any:
    """One structure-aware mutation of a decoded program (``orchestra.program.ProgramDef``)."""
    import dataclasses as dc

    from orchestra.program import _schema as S

    pi = rng.randrange(len(prog.execution_plan))
    plan = prog.execution_plan[pi]
    values = list(plan.values)
    nv = len(values)
    chains = list(plan.chains)

    def tensors() -> list[int]:
        return [i for i, ev in enumerate(values) if isinstance(ev.val, S.Tensor)]

    def set_tensor(fn: Any) -> None:
        ts = tensors()
        if ts:
            i = rng.choice(ts)
            values[i] = S.EValue(fn(values[i].val))

    def any_index() -> int:
        return rng.choice((rng.randrange(nv) if nv else 0, rng.randrange(nv) if nv else 0, -1, nv, _pick(rng, *I32)))

    if kind == "sizes":
        def sizes(t: Any) -> Any:
            sz = list(t.sizes)
            r = rng.random()
            if sz and r < 0.6:
                k = rng.randrange(len(sz))
                sz[k] = _near(rng, sz[k], *I32)
            elif r < 0.8 and len(sz) < 6:
                sz.insert(rng.randrange(len(sz) + 1), _pick(rng, -2, 70000))
                return dc.replace(t, sizes=tuple(sz), dim_order=tuple(range(len(sz))) if rng.random() < 0.8 else t.dim_order)
            elif sz:
                sz.pop(rng.randrange(len(sz)))
                return dc.replace(t, sizes=tuple(sz), dim_order=tuple(range(len(sz))) if rng.random() < 0.8 else t.dim_order)
            return dc.replace(t, sizes=tuple(sz))
        set_tensor(sizes)
    elif kind == "dynamism":
        set_tensor(lambda t: dc.replace(t, shape_dynamism=rng.choice((0, 1, 2, 2, 3, -1))))
    elif kind == "allocation":
        def alloc(t: Any) -> Any:
            r = rng.random()
            if r < 0.25:
                return dc.replace(t, allocation_info=None)
            a = t.allocation_info or S.AllocationDetails(1, 0)
            if r < 0.5:
                return dc.replace(t, allocation_info=S.AllocationDetails(_pick(rng, 0, 5), a.memory_offset_low,
                                                                          a.memory_offset_high))
            if r < 0.85:
                return dc.replace(t, allocation_info=S.AllocationDetails(a.memory_id, _near(rng, a.memory_offset_low, *U32),
                                                                          a.memory_offset_high))
            return dc.replace(t, allocation_info=S.AllocationDetails(a.memory_id, a.memory_offset_low, _pick(rng, *U32)))
        set_tensor(alloc)
    elif kind == "value_kind":
        if nv:
            i = rng.randrange(nv)
            donor = values[rng.randrange(nv)].val
            values[i] = S.EValue(rng.choice((
                donor, None, S.Null(), S.Int(_pick(rng, *I64)), S.Bool(rng.random() < 0.5),
                S.Double(rng.choice((0.0, -1.0, 1e30, float("nan"), float("inf")))), S.String("x"),
                S.IntList(tuple(_pick(rng, -1, nv) for _ in range(rng.randrange(4)))),
                S.TensorList(tuple(rng.randrange(nv) for _ in range(rng.randrange(4)))),
                S.DoubleList((1.0, 2.0)), S.BoolList((True,)),
                S.OptionalTensorList(tuple(rng.choice((-1, rng.randrange(nv))) for _ in range(rng.randrange(4)))))))
    elif kind == "int":
        ints = [i for i, ev in enumerate(values) if isinstance(ev.val, S.Int)]
        if ints:
            i = rng.choice(ints)
            values[i] = S.EValue(S.Int(_near(rng, values[i].val.int_val, *I64)))
    elif kind == "list":
        lists = [i for i, ev in enumerate(values) if isinstance(ev.val, (S.IntList, S.TensorList, S.OptionalTensorList))]
        if lists:
            i = rng.choice(lists)
            v = values[i].val
            items = list(v.items)
            r = rng.random()
            if items and r < 0.4:
                k = rng.randrange(len(items))
                items[k] = any_index()
            elif items and r < 0.7:
                items = items * rng.choice((2, 3, 1000, 100_000)) if isinstance(v, S.TensorList) else items + items
            elif items:
                items.pop(rng.randrange(len(items)))
            else:
                items.append(any_index())
            lo, hi = I64 if isinstance(v, S.IntList) else I32
            values[i] = S.EValue(type(v)(tuple(min(max(x, lo), hi) for x in items)))
    elif kind in ("args", "jump", "operator"):
        ci = rng.randrange(len(chains)) if chains else None
        if ci is not None:
            ch = chains[ci]
            ins = list(ch.instructions)
            n = len(ins)
            if kind == "args" and ins:
                k = rng.randrange(n)
                a = ins[k].instr_args
                if isinstance(a, (S.KernelCall, S.DelegateCall)) and a.args:
                    args = list(a.args)
                    if rng.random() < 0.8:
                        args[rng.randrange(len(args))] = any_index()
                    else:
                        args.pop(rng.randrange(len(args))) if rng.random() < 0.5 else args.append(any_index())
                    ins[k] = S.Instruction(dc.replace(a, args=tuple(args)))
                elif isinstance(a, S.MoveCall):
                    ins[k] = S.Instruction(S.MoveCall(any_index(), a.move_to))
            elif kind == "jump":
                cond = rng.choice([i for i, ev in enumerate(values) if isinstance(ev.val, (S.Bool, S.Int, S.Tensor))]
                                  or [0])
                r = rng.random()
                call: Any
                if r < 0.6:
                    call = S.JumpFalseCall(cond, rng.choice((0, rng.randrange(n + 1), n, n + 1, -1)))
                elif r < 0.75:
                    call = S.MoveCall(any_index(), any_index())
                elif r < 0.9:
                    call = S.FreeCall(max(any_index(), 0))
                else:
                    call = None
                at = rng.randrange(n + 1)
                if n and rng.random() < 0.5:
                    ins[min(at, n - 1)] = S.Instruction(call)
                else:
                    ins.insert(at, S.Instruction(call))
            elif kind == "operator" and plan.operators:
                ops = list(plan.operators)
                k = rng.randrange(len(ops))
                ops[k] = rng.choice(ops + [S.Operator("aten::full", "out"), S.Operator("aten::arange", "out"),
                                           S.Operator("aten::nope", "out"), S.Operator("aten::repeat", "out")])
                plan = dc.replace(plan, operators=tuple(ops))
            chains[ci] = dc.replace(ch, instructions=tuple(ins), stacktrace=None)
    elif kind == "delegate":
        if plan.delegates:
            dels = list(plan.delegates)
            k = rng.randrange(len(dels))
            d = dels[k]
            r = rng.random()
            if r < 0.3:
                d = dc.replace(d, id=rng.choice(("XnnpackBackend", "NoSuchBackend", "", d.id + "x")))
            elif r < 0.6:
                d = dc.replace(d, processed=S.BackendDelegateDataReference(rng.choice((0, 1, 2, 7)), _pick(rng, 0, 8)))
            else:
                d = dc.replace(d, compile_specs=d.compile_specs + (S.CompileSpec(rng.choice(("k", "threads", "")),
                                                                                 bytes(rng.randrange(256) for _ in range(4))),))
            dels[k] = d
            plan = dc.replace(plan, delegates=tuple(dels))
        else:  # a delegate call where there is no delegate
            if chains:
                ch = chains[0]
                ins = list(ch.instructions)
                ins.insert(rng.randrange(len(ins) + 1), S.Instruction(S.DelegateCall(_pick(rng, -1, 2), (any_index(),))))
                chains[0] = dc.replace(ch, instructions=tuple(ins), stacktrace=None)
    elif kind == "scalar_type":
        set_tensor(lambda t: dc.replace(t, scalar_type=rng.choice((0, 1, 2, 3, 4, 5, 6, 7, 11, 15, 22, 27, -1, 100))))
    elif kind == "buffers":
        bufs = list(plan.non_const_buffer_sizes)
        if bufs:
            k = rng.randrange(len(bufs))
            bufs[k] = _near(rng, bufs[k], 0, I64[1])
        else:
            bufs = [0, _pick(rng, 0, 1 << 20)]
        plan = dc.replace(plan, non_const_buffer_sizes=tuple(bufs))
    else:  # pragma: no cover
        raise ValueError(kind)
    plan = dc.replace(plan, values=tuple(values), chains=tuple(chains))
    plans = list(prog.execution_plan)
    plans[pi] = plan
    return dc.replace(prog, execution_plan=tuple(plans))


def structured_cases(fixtures: list[bytes], cases: int, seed: int):
    """Yields (case index, kind, mutated bytes): 1-3 structured mutations of a fixture each,
    re-encoded with ``dumps`` (a mutation the writer can't encode is drawn again)."""
    from orchestra.program import dumps as _dumps
    from orchestra.program import loads as _loads

    decoded = [_loads(f) for f in fixtures]
    rng = random.Random(seed)
    for i in range(cases):
        base = decoded[i % len(decoded)]
        kind = STRUCT_KINDS[(i // len(decoded)) % len(STRUCT_KINDS)]
        for _attempt in range(20):
            prog = structured_mutate(base, rng, kind)
            for _ in range(rng.choice((0, 0, 1, 2))):
                prog = structured_mutate(prog, rng, rng.choice(STRUCT_KINDS))
            try:
                data = _dumps(prog)
            except Exception:  # noqa: BLE001 - not encodable (a value out of its field's range): draw again
                continue
            break
        else:
            data = fixtures[i % len(fixtures)]
        yield i, kind, data


def _inputs_for(meta: Any, rng: Any) -> list[Any] | None:
    """Inputs matching ``meta`` (None when they would be too large to make)."""
    import numpy as np

    from orchestra.runtime import TensorInfo

    out: list[Any] = []
    for info in meta.inputs:
        if isinstance(info, TensorInfo):
            dt = info.dtype or np.dtype(np.float32)
            n = 1
            for s in info.shape:
                n *= max(s, 0)
            if n * dt.itemsize > 64 << 20:
                return None
            shape = tuple(max(s, 0) for s in info.shape)
            if dt.kind == "f":
                out.append(rng.standard_normal(shape).astype(dt))
            elif dt.kind == "b":
                out.append(rng.random(shape) < 0.5)
            else:
                out.append(rng.integers(0, 4, shape).astype(dt))
        else:
            out.append({"int": 1, "float": 0.5, "bool": True, "str": "x"}.get(info.kind))
    return out


class _Peak:
    """Peak memory of one case in this process (see the comment above STRUCT_KINDS)."""

    def __init__(self) -> None:
        import tracemalloc

        self.rusage = False
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.rusage = True
        except OSError:
            tracemalloc.start()
        self.base = 0

    @staticmethod
    def _rss_kb(key: str = "VmRSS:") -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
        return 0  # pragma: no cover

    def reset(self) -> None:
        import tracemalloc

        if self.rusage:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.base = self._rss_kb() << 10
        else:
            tracemalloc.reset_peak()
            self.base = tracemalloc.get_traced_memory()[0]

    def read(self) -> int:
        import resource
        import tracemalloc

        if self.rusage:
            # VmHWM, the peak RSS of this process's memory, which clear_refs resets; not
            # getrusage's ru_maxrss, which also keeps the peak of the memory exec replaced (the
            # parent's, copied at fork: a test runner grown past the limit made every case "hungry")
            hwm = self._rss_kb("VmHWM:")
            peak = hwm << 10 if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10
            return peak - self.base
        return tracemalloc.get_traced_memory()[1] - self.base


def structured_check(data: bytes, peak: _Peak | None = None) -> Outcome:
    """Loads ``data`` and executes every method that loads, once; classifies what happened.

    Runs in the worker process (see :func:`structured_run`), which measures ``peak``."""
    import numpy as np

    from orchestra import OrchestraError
    from orchestra.program import Limits
    from orchestra.runtime import load_program

    limits = Limits(max_planned_memory=STRUCT_PLANNED_BYTES, max_numel=STRUCT_MAX_NUMEL)
    if peak is not None:
        peak.reset()
    t0 = time.perf_counter()
    kind, detail = "executed", ""
    try:
        prog = load_program(data, limits=limits)
        rng = np.random.default_rng(0)
        for name in prog.method_names:
            inputs = _inputs_for(prog.method_meta(name), rng)
            with prog.load_method(name) as m:
                m.time_limit_s = STRUCT_SECONDS / 2  # a loop of heavy steps stops here, not at its instruction budget
                if inputs is not None:
                    m.execute(inputs)
    except OrchestraError as exc:
        kind, detail = "rejected", f"{type(exc).__name__}: {exc}"[:300]
    except Exception as exc:  # noqa: BLE001 - the point is to catch everything else
        import traceback

        kind, detail = "crashed", f"{type(exc).__name__}: {exc}"[:300] + "\n" + traceback.format_exc()[-1500:]
    dt = time.perf_counter() - t0
    used = peak.read() if peak is not None else 0
    if kind != "crashed":
        if dt > STRUCT_SECONDS:
            kind, detail = "slow", f"{dt:.3f}s ({kind}: {detail[:200]})"
        elif used > STRUCT_PEAK_BYTES:
            kind, detail = "hungry", f"{used / 2**20:.0f} MiB peak ({kind}: {detail[:200]})"
    return Outcome(kind, detail, dt)


def _serve() -> None:
    """The worker process: reads length-prefixed cases on stdin, answers pickled Outcomes
    (with their peak) on the original stdout (fd 1 is pointed at stderr for everything else)."""
    import pickle

    from orchestra.runtime.kernels import _util

    proto = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _util.SCRATCH_BYTES = STRUCT_PLANNED_BYTES
    _util.UNPLANNED_RESULT_BYTES = STRUCT_PLANNED_BYTES
    peak = _Peak()
    inp = sys.stdin.buffer
    while True:
        head = inp.read(4)
        if len(head) < 4:
            return
        data = inp.read(struct.unpack("<I", head)[0])
        o = structured_check(data, peak)
        out = pickle.dumps((o.kind, o.detail, o.seconds))
        proto.write(struct.pack("<I", len(out)) + out)
        proto.flush()


class _Worker:
    """A worker process checking structured cases (a crash in it fails only that case)."""

    def __init__(self) -> None:
        import subprocess

        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)

    def check(self, data: bytes, timeout: float) -> Outcome:
        import pickle
        import select

        t0 = time.perf_counter()
        try:
            self.p.stdin.write(struct.pack("<I", len(data)) + data)
            self.p.stdin.flush()
            buf = b""
            need = 4
            while len(buf) < need:
                left = timeout - (time.perf_counter() - t0)
                if left <= 0 or not select.select([self.p.stdout], [], [], left)[0]:
                    self.close()
                    return Outcome("slow", f"no answer within {timeout:g} s (worker killed)", time.perf_counter() - t0)
                chunk = os.read(self.p.stdout.fileno(), need - len(buf))
                if not chunk:
                    raise EOFError
                buf += chunk
                if need == 4 and len(buf) == 4:
                    need = 4 + struct.unpack("<I", buf)[0]
            return Outcome(*pickle.loads(buf[4:]))
        except (EOFError, BrokenPipeError, OSError):
            code = self.p.poll()
            self.close()
            return Outcome("crashed", f"the worker process died (exit code {code})", time.perf_counter() - t0)

    @property
    def alive(self) -> bool:
        return self.p.poll() is None

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


def structured_recheck(data: bytes) -> Outcome:
    """One case again, in a fresh worker process (tells a slow case from a busy machine)."""
    w = _Worker()
    try:
        return w.check(data, timeout=STRUCT_SECONDS * 5 + 10)
    finally:
        w.close()


def structured_run(fixtures: list[bytes], cases: int, seed: int, progress: bool = False):
    """Yields (case index, kind, mutated bytes, outcome) for ``cases`` structured mutations,
    each loaded and executed in a worker process."""
    w = _Worker()
    try:
        for i, kind, data in structured_cases(fixtures, cases, seed):
            if not w.alive:
                w = _Worker()
            yield i, kind, data, w.check(data, timeout=STRUCT_SECONDS * 5 + 10)
            if progress and (i + 1) % 1000 == 0:
                print(f"  {i + 1:,} cases", file=sys.stderr, flush=True)
    finally:
        w.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--fixtures", default=str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures"))
    ap.add_argument("--save-failures", metavar="DIR", help="write each failing case here")
    ap.add_argument("--xnnpack", action="store_true", help="fuzz the XNNPACK delegate blobs of the fixtures instead")
    ap.add_argument("--structured", action="store_true",
                    help="mutate decoded programs (sizes, dynamism, allocation, value kinds, argument indices, jumps, "
                         "delegates) and load AND execute what loads, in a worker process")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the --structured worker
    args = ap.parse_args(argv)
    if args.serve:
        _serve()
        return 0
    files = sorted(pathlib.Path(args.fixtures).glob("*.pte"))
    if not files:
        print(f"no .pte files in {args.fixtures}", file=sys.stderr)
        return 2
    fixtures = [f.read_bytes() for f in files]
    if args.xnnpack:
        return _main_xnnpack(args, fixtures)
    if args.structured:
        return _structured_main(args, fixtures)
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


def _structured_main(args: Any, fixtures: list[bytes]) -> int:
    counts = {"executed": 0, "rejected": 0, "crashed": 0, "slow": 0, "hungry": 0}
    worst = 0.0
    failures = 0
    t0 = time.perf_counter()
    for i, kind, case, out in structured_run(fixtures, args.cases, args.seed, progress=True):
        counts[out.kind] += 1
        worst = max(worst, out.seconds)
        if out.kind in ("crashed", "slow", "hungry"):
            failures += 1
            print(f"case {i} ({kind}): {out.kind}: {out.detail}")
            if args.save_failures:
                d = pathlib.Path(args.save_failures)
                d.mkdir(parents=True, exist_ok=True)
                (d / f"structured{i}.pte").write_bytes(case)
    dt = time.perf_counter() - t0
    print(f"{args.cases:,} structured cases over {len(fixtures)} fixtures in {dt:.1f}s (seed {args.seed}): "
          f"{counts['executed']:,} loaded and executed, {counts['rejected']:,} rejected with an OrchestraError, "
          f"{counts['crashed']} crashed, {counts['slow']} over {STRUCT_SECONDS:g} s, {counts['hungry']} over "
          f"{STRUCT_PEAK_BYTES >> 20} MiB peak; slowest {worst * 1000:.1f} ms")
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
