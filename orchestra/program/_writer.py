"""Write a :class:`ProgramDef` as ``.pte`` bytes that ExecuTorch's runtime loads.

Layout, as ExecuTorch's own serializer writes it: the flatbuffer (root offset, ``ET12``), an
``eh00`` extended header inserted after the first 8 bytes (padded so the flatbuffer body keeps
its alignment), then the segments, each starting at a multiple of ``segment_alignment`` from
the segment base.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Literal

import flatbuffers

from ..errors import InvalidArgumentError
from . import _schema as S
from ._reader import EXTENDED_HEADER_MAGIC, FILE_IDENTIFIER

__all__ = ["dumps"]

_EH_LENGTH = 32


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


class _Builder:
    def __init__(self, tensor_alignment: int, delegate_alignment: int) -> None:
        self.b = flatbuffers.Builder(4096)
        self.tensor_alignment = tensor_alignment
        self.delegate_alignment = delegate_alignment
        self._strings: dict[str, int] = {}

    # -- primitives ---------------------------------------------------------------------
    def string(self, s: str | None) -> int:
        if s is None:
            return 0
        off = self._strings.get(s)
        if off is None:
            off = self._strings[s] = self.b.CreateString(s)
        return off

    def raw_bytes(self, data: bytes | memoryview, align: int) -> int:
        b = self.b
        n = len(data)
        b.StartVector(1, n, max(align, 4))
        b.head = b.head - n
        b.Bytes[b.head : b.head + n] = data
        return b.EndVector()

    def scalars(self, items, kind: str) -> int:
        b = self.b
        size, prepend = {
            "i32": (4, b.PrependInt32),
            "i64": (8, b.PrependInt64),
            "u64": (8, b.PrependUint64),
            "u8": (1, b.PrependUint8),
            "bool": (1, b.PrependBool),
            "f64": (8, b.PrependFloat64),
        }[kind]
        b.StartVector(size, len(items), size)
        for x in reversed(items):
            prepend(x)
        return b.EndVector()

    def offsets(self, offs: list[int]) -> int:
        b = self.b
        b.StartVector(4, len(offs), 4)
        for o in reversed(offs):
            b.PrependUOffsetTRelative(o)
        return b.EndVector()

    def table(self, nfields: int, fields: list[tuple[str, int, object]]) -> int:
        """fields: (kind, slot, value) with kind in u8/i8/bool/i32/u32/i64/u64/f64/off."""
        b = self.b
        b.StartObject(nfields)
        for kind, slot, v in fields:
            if kind == "off":
                if v:
                    b.PrependUOffsetTRelativeSlot(slot, v, 0)
            elif kind == "u8":
                b.PrependUint8Slot(slot, v, 0)
            elif kind == "i8":
                b.PrependInt8Slot(slot, v, 0)
            elif kind == "bool":
                b.PrependBoolSlot(slot, v, False)
            elif kind == "i32":
                b.PrependInt32Slot(slot, v, 0)
            elif kind == "u32":
                b.PrependUint32Slot(slot, v, 0)
            elif kind == "i64":
                b.PrependInt64Slot(slot, v, 0)
            elif kind == "u64":
                b.PrependUint64Slot(slot, v, 0)
            elif kind == "f64":
                b.PrependFloat64Slot(slot, v, 0.0)
            else:  # pragma: no cover - programming error
                raise AssertionError(kind)
        return b.EndObject()

    # -- schema -------------------------------------------------------------------------
    def tensor(self, t: S.Tensor) -> int:
        sizes = self.scalars(t.sizes, "i32")
        dim_order = self.scalars(t.dim_order, "u8")
        alloc = 0
        if t.allocation_info is not None:
            a = t.allocation_info
            alloc = self.table(3, [("u32", 0, a.memory_id), ("u32", 1, a.memory_offset_low), ("u32", 2, a.memory_offset_high)])
        extra = 0
        if t.extra_tensor_info is not None:
            e = t.extra_tensor_info
            fqn = self.string(e.fully_qualified_name)
            extra = self.table(3, [("u64", 0, e.mutable_data_segments_idx), ("off", 1, fqn), ("i8", 2, e.location)])
        return self.table(10, [
            ("i8", 0, t.scalar_type), ("i32", 1, t.storage_offset), ("off", 2, sizes),
            ("off", 3, dim_order), ("bool", 4, t.requires_grad), ("u32", 5, t.data_buffer_idx),
            ("off", 6, alloc), ("i8", 7, t.layout), ("i8", 8, t.shape_dynamism), ("off", 9, extra),
        ])

    def evalue(self, ev: S.EValue) -> int:
        v = ev.val
        if v is None:
            return self.table(2, [])
        tag = S.KERNEL_TYPES.index(type(v)) + 1
        if isinstance(v, S.Tensor):
            off = self.tensor(v)
        elif isinstance(v, S.Null):
            off = self.table(0, [])
        elif isinstance(v, S.Int):
            off = self.table(1, [("i64", 0, v.int_val)])
        elif isinstance(v, S.Bool):
            off = self.table(1, [("bool", 0, v.bool_val)])
        elif isinstance(v, S.Double):
            off = self.table(1, [("f64", 0, v.double_val)])
        elif isinstance(v, S.String):
            off = self.table(1, [("off", 0, self.string(v.string_val))])
        elif isinstance(v, S.IntList):
            off = self.table(1, [("off", 0, self.scalars(v.items, "i64"))])
        elif isinstance(v, S.DoubleList):
            off = self.table(1, [("off", 0, self.scalars(v.items, "f64"))])
        elif isinstance(v, S.BoolList):
            off = self.table(1, [("off", 0, self.scalars(v.items, "bool"))])
        else:  # TensorList, OptionalTensorList
            off = self.table(1, [("off", 0, self.scalars(v.items, "i32"))])
        return self.table(2, [("u8", 0, tag), ("off", 1, off)])

    def instruction(self, ins: S.Instruction) -> int:
        a = ins.instr_args
        if isinstance(a, S.KernelCall):
            off = self.table(2, [("i32", 0, a.op_index), ("off", 1, self.scalars(a.args, "i32"))])
        elif isinstance(a, S.DelegateCall):
            off = self.table(2, [("i32", 0, a.delegate_index), ("off", 1, self.scalars(a.args, "i32"))])
        elif isinstance(a, S.MoveCall):
            off = self.table(2, [("i32", 0, a.move_from), ("i32", 1, a.move_to)])
        elif isinstance(a, S.JumpFalseCall):
            off = self.table(2, [("i32", 0, a.cond_value_index), ("i32", 1, a.destination_instruction)])
        elif isinstance(a, S.FreeCall):
            off = self.table(1, [("i32", 0, a.value_index)])
        else:
            raise InvalidArgumentError(f"instruction arguments of type {type(a).__name__} cannot be written")
        tag = S.INSTRUCTION_TYPES.index(type(a)) + 1
        return self.table(2, [("u8", 0, tag), ("off", 1, off)])

    def frame(self, f: S.Frame) -> int:
        fn, name, ctx = self.string(f.filename), self.string(f.name), self.string(f.context)
        return self.table(4, [("off", 0, fn), ("i32", 1, f.lineno), ("off", 2, name), ("off", 3, ctx)])

    def chain(self, c: S.Chain) -> int:
        ins = self.scalars(c.inputs, "i32")
        outs = self.scalars(c.outputs, "i32")
        instrs = self.offsets([self.instruction(i) for i in c.instructions])
        st = 0
        if c.stacktrace is not None:
            st = self.offsets([
                self.table(1, [("off", 0, self.offsets([self.frame(f) for f in fl.items]))])
                for fl in c.stacktrace
            ])
        return self.table(4, [("off", 0, ins), ("off", 1, outs), ("off", 2, instrs), ("off", 3, st)])

    def delegate(self, d: S.BackendDelegate) -> int:
        did = self.string(d.id)
        ref = self.table(2, [("i8", 0, d.processed.location), ("u32", 1, d.processed.index)])
        specs = self.offsets([
            self.table(2, [("off", 0, self.string(cs.key)), ("off", 1, self.raw_bytes(cs.value, 1))])
            for cs in d.compile_specs
        ])
        return self.table(3, [("off", 0, did), ("off", 1, ref), ("off", 2, specs)])

    def plan(self, p: S.ExecutionPlan) -> int:
        name = self.string(p.name)
        cm = 0
        if p.container_meta_type is not None:
            i, o = self.string(p.container_meta_type.encoded_inp_str), self.string(p.container_meta_type.encoded_out_str)
            cm = self.table(2, [("off", 0, i), ("off", 1, o)])
        values = self.offsets([self.evalue(v) for v in p.values])
        ins = self.scalars(p.inputs, "i32")
        outs = self.scalars(p.outputs, "i32")
        chains = self.offsets([self.chain(c) for c in p.chains])
        ops = self.offsets([
            self.table(2, [("off", 0, self.string(o.name)), ("off", 1, self.string(o.overload))])
            for o in p.operators
        ])
        dels = self.offsets([self.delegate(d) for d in p.delegates])
        sizes = self.scalars(p.non_const_buffer_sizes, "i64")
        return self.table(9, [
            ("off", 0, name), ("off", 1, cm), ("off", 2, values), ("off", 3, ins), ("off", 4, outs),
            ("off", 5, chains), ("off", 6, ops), ("off", 7, dels), ("off", 8, sizes),
        ])

    def subsegment(self, s: S.SubsegmentOffsets) -> int:
        return self.table(2, [("u32", 0, s.segment_index), ("off", 1, self.scalars(s.offsets, "u64"))])

    def program(self, p: S.ProgramDef, seg_offsets: list[int]) -> bytes:
        plans = self.offsets([self.plan(x) for x in p.execution_plan])
        cbuf = self.offsets([
            self.table(1, [("off", 0, self.raw_bytes(buf.storage, self.tensor_alignment))])
            for buf in p.constant_buffer
        ])
        ddata = self.offsets([
            self.table(1, [("off", 0, self.raw_bytes(d.data, self.delegate_alignment))])
            for d in p.backend_delegate_data
        ])
        segs = self.offsets([
            self.table(2, [("u64", 0, off), ("u64", 1, s.size)]) for s, off in zip(p.segments, seg_offsets)
        ])
        cs = 0 if p.constant_segment is None else self.subsegment(p.constant_segment)
        mds = self.offsets([self.subsegment(m) for m in p.mutable_data_segments])
        named = self.offsets([
            self.table(2, [("off", 0, self.string(nd.key)), ("u32", 1, nd.segment_index)]) for nd in p.named_data
        ])
        root = self.table(8, [
            ("u32", 0, p.version), ("off", 1, plans), ("off", 2, cbuf), ("off", 3, ddata),
            ("off", 4, segs), ("off", 5, cs), ("off", 6, mds), ("off", 7, named),
        ])
        self.b.Finish(root, file_identifier=FILE_IDENTIFIER)
        return self.b.Output()


def _relocate_delegates(p: S.ProgramDef, mode: str) -> S.ProgramDef:
    """Moves delegate blobs inline or into segments, renumbering every segment reference."""
    segments = list(p.segments)
    inline = list(p.backend_delegate_data)
    seg_of_inline: dict[int, int] = {}
    inline_of_seg: dict[int, int] = {}
    plans = []
    for plan in p.execution_plan:
        dels = []
        for d in plan.delegates:
            ref = d.processed
            if mode == "segment" and ref.location == S.DataLocation.INLINE:
                if ref.index not in seg_of_inline:
                    data = inline[ref.index].data
                    seg_of_inline[ref.index] = len(segments)
                    segments.append(S.DataSegment(0, len(data), data))
                ref = S.BackendDelegateDataReference(S.DataLocation.SEGMENT, seg_of_inline[ref.index])
            elif mode == "inline" and ref.location == S.DataLocation.SEGMENT:
                if ref.index not in inline_of_seg:
                    inline_of_seg[ref.index] = len(inline)
                    inline.append(S.BackendDelegateInlineData(p.segments[ref.index].data))
                ref = S.BackendDelegateDataReference(S.DataLocation.INLINE, inline_of_seg[ref.index])
            dels.append(dataclasses.replace(d, processed=ref))
        plans.append(dataclasses.replace(plan, delegates=tuple(dels)))

    # Keep only what is still referenced, renumbering segments and inline blobs.
    used_seg: set[int] = set()
    used_inline: set[int] = set()
    for plan in plans:
        for d in plan.delegates:
            (used_seg if d.processed.location == S.DataLocation.SEGMENT else used_inline).add(d.processed.index)
    if p.constant_segment is not None and p.constant_segment.offsets:
        used_seg.add(p.constant_segment.segment_index)
    used_seg.update(m.segment_index for m in p.mutable_data_segments)
    used_seg.update(n.segment_index for n in p.named_data)
    # Unreferenced originals stay (nothing is silently dropped); only blobs we moved away go.
    drop_seg = set(inline_of_seg) - used_seg
    drop_inline = set(seg_of_inline) - used_inline
    seg_map = {}
    new_segs = []
    for i, s in enumerate(segments):
        if i not in drop_seg:
            seg_map[i] = len(new_segs)
            new_segs.append(s)
    inl_map = {}
    new_inline = []
    for i, d in enumerate(inline):
        if i not in drop_inline:
            inl_map[i] = len(new_inline)
            new_inline.append(d)

    def remap(ref: S.BackendDelegateDataReference) -> S.BackendDelegateDataReference:
        m = seg_map if ref.location == S.DataLocation.SEGMENT else inl_map
        return S.BackendDelegateDataReference(ref.location, m[ref.index])

    plans = [
        dataclasses.replace(pl, delegates=tuple(dataclasses.replace(d, processed=remap(d.processed)) for d in pl.delegates))
        for pl in plans
    ]
    cs = p.constant_segment
    if cs is not None and cs.offsets:
        cs = dataclasses.replace(cs, segment_index=seg_map[cs.segment_index])
    return dataclasses.replace(
        p,
        execution_plan=tuple(plans),
        segments=tuple(new_segs),
        backend_delegate_data=tuple(new_inline),
        constant_segment=cs,
        mutable_data_segments=tuple(dataclasses.replace(m, segment_index=seg_map[m.segment_index]) for m in p.mutable_data_segments),
        named_data=tuple(dataclasses.replace(n, segment_index=seg_map[n.segment_index]) for n in p.named_data),
    )


def dumps(
    program: S.ProgramDef,
    *,
    delegate_data: Literal["keep", "inline", "segment"] = "keep",
    segment_alignment: int = 128,
    tensor_alignment: int = 16,
    delegate_alignment: int = 16,
) -> bytes:
    """Serialise ``program`` as ``.pte`` bytes.

    Args:
        delegate_data: ``"keep"`` writes each delegate blob where it is; ``"inline"`` moves
            every blob into the flatbuffer; ``"segment"`` moves every blob into a segment.
        segment_alignment: each segment starts at a multiple of this from the segment base.
        tensor_alignment, delegate_alignment: alignment of inline constant / delegate data.
    """
    for name, a in (("segment_alignment", segment_alignment), ("tensor_alignment", tensor_alignment),
                    ("delegate_alignment", delegate_alignment)):
        if a <= 0 or a & (a - 1):
            raise InvalidArgumentError(f"{name} must be a power of two, got {a}")
    if delegate_data not in ("keep", "inline", "segment"):
        raise InvalidArgumentError(f"delegate_data must be 'keep', 'inline' or 'segment', got {delegate_data!r}")
    if delegate_data != "keep":
        program = _relocate_delegates(program, delegate_data)

    # Segment offsets (relative to the segment base): honour the recorded offset when it
    # keeps segments in order, so a loaded program writes back the same layout; new segments
    # (offset 0 after another) go at the next multiple of segment_alignment.
    seg_offsets: list[int] = []
    cur = 0
    for s in program.segments:
        if len(s.data) != s.size:
            raise InvalidArgumentError(f"segment holds {len(s.data)} bytes but its size says {s.size}")
        off = s.offset if s.offset >= cur else _align(cur, segment_alignment)
        seg_offsets.append(off)
        cur = off + s.size

    builder = _Builder(tensor_alignment, delegate_alignment)
    fb = builder.program(program, seg_offsets)
    header_len = _align(_EH_LENGTH, max(builder.b.minalign, 16))
    program_size = len(fb) + header_len
    segment_base = _align(program_size, segment_alignment) if program.segments else 0
    header = (
        EXTENDED_HEADER_MAGIC
        + struct.pack("<IQQQ", _EH_LENGTH, program_size, segment_base, cur if program.segments else 0)
    ).ljust(header_len, b"\0")
    root = struct.unpack_from("<I", fb, 0)[0] + header_len
    out = bytearray(struct.pack("<I", root) + fb[4:8] + header + fb[8:])
    if program.segments:
        out.extend(b"\0" * (segment_base - len(out)))
        for s, off in zip(program.segments, seg_offsets):
            out.extend(b"\0" * (segment_base + off - len(out)))
            out.extend(s.data)
    return bytes(out)
