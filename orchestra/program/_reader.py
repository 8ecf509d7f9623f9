"""Read and verify ``.pte`` bytes into a :class:`ProgramDef`.

Python's flatbuffers package has no verifier, and ``.pte`` files are untrusted input, so this
reader bounds-checks every table, vtable, vector, string and union it touches, then checks the
program's own cross references (value, operator, delegate, segment indices; tensor bytes
against their data). Every failure is a :class:`ProgramError` whose message starts with the
schema path of the bad thing, e.g.
``execution_plan[0].values[17].tensor.sizes: vector runs past the end of the buffer``.

Byte payloads are ``memoryview`` slices of the input: nothing is copied.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import struct
from itertools import starmap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NoReturn

from ..errors import NotFoundError, ProgramError
from . import _schema as S
from ._scalar_type import ScalarType

__all__ = ["Limits", "load", "loads", "tensors_with_extra_info"]

FILE_IDENTIFIER = b"ET12"
EXTENDED_HEADER_MAGIC = b"eh00"
_EH_MIN_LENGTH = 24  # magic, length, program_size, segment_base_offset
_EH_SEGMENT_DATA_SIZE_LENGTH = 32  # ... plus segment_data_size

_u8 = struct.Struct("<B").unpack_from
_u16 = struct.Struct("<H").unpack_from
_i32 = struct.Struct("<i").unpack_from
_u32 = struct.Struct("<I").unpack_from
_i64 = struct.Struct("<q").unpack_from
_u64 = struct.Struct("<Q").unpack_from
_f64 = struct.Struct("<d").unpack_from

_VALID_SCALAR_TYPES = frozenset(int(t) for t in ScalarType)


@dataclass(frozen=True)
class Limits:
    """Caps that protect a loader from hostile programs. ``None`` means no cap."""

    max_planned_memory: int | None = 4 << 30  # bytes over all planned arenas of a method
    max_numel: int | None = 1 << 31  # elements in one tensor
    max_instructions: int | None = 1_000_000  # over all chains of a method
    max_values: int | None = 1_000_000  # EValues in one method
    # Tables plus vector elements decoded. Flatbuffers may share one table from many places,
    # so a small hostile file could otherwise make the reader do quadratic work.
    max_objects: int | None = 10_000_000


def _fail(path: str, msg: str) -> NoReturn:
    raise ProgramError(f"{path}: {msg}")


class _Table:
    __slots__ = ("pos", "vt", "vtsize", "objsize")

    def __init__(self, pos: int, vt: int, vtsize: int, objsize: int) -> None:
        self.pos = pos
        self.vt = vt
        self.vtsize = vtsize
        self.objsize = objsize


class _FlatReader:
    """Bounds-checked access to one flatbuffer."""

    __slots__ = ("buf", "end", "budget")

    def __init__(self, buf: memoryview, budget: int | None) -> None:
        self.buf = buf
        self.end = len(buf)
        self.budget = budget if budget is not None else 1 << 62

    def spend(self, n: int, path: str) -> None:
        self.budget -= n
        if self.budget < 0:
            _fail(path, "program structure exceeds the cap on decoded objects (Limits.max_objects)")

    # -- tables -------------------------------------------------------------------------
    def table(self, pos: int, path: str) -> _Table:
        buf, end = self.buf, self.end
        self.budget -= 1
        if self.budget < 0:
            self.spend(0, path)
        if pos < 0 or pos + 4 > end:
            _fail(path, "table offset out of bounds")
        if pos % 4:
            _fail(path, "table is not 4-byte aligned")
        vt = pos - _i32(buf, pos)[0]
        if vt < 0 or vt + 4 > end:
            _fail(path, "vtable offset out of bounds")
        if vt % 2:
            _fail(path, "vtable is not 2-byte aligned")
        vtsize, objsize = _u16(buf, vt)[0], _u16(buf, vt + 2)[0]
        if vtsize < 4 or vtsize % 2 or vt + vtsize > end:
            _fail(path, f"vtable size {vtsize} is invalid or runs past the end of the buffer")
        if objsize < 4 or pos + objsize > end:
            _fail(path, f"table size {objsize} runs past the end of the buffer")
        return _Table(pos, vt, vtsize, objsize)

    def _field(self, t: _Table, slot: int, size: int, path: str) -> int:
        """Absolute position of field ``slot`` of ``t``, or 0 when absent."""
        e = 4 + 2 * slot
        if e + 2 > t.vtsize:
            return 0
        o = _u16(self.buf, t.vt + e)[0]
        if o == 0:
            return 0
        if o < 4 or o + size > t.objsize:
            _fail(path, "field lies outside its table")
        return t.pos + o

    def _deref(self, p: int, path: str) -> int:
        target = p + _u32(self.buf, p)[0]
        if target + 4 > self.end:
            _fail(path, "offset points past the end of the buffer")
        return target

    # -- scalars ------------------------------------------------------------------------
    def u8(self, t: _Table, slot: int, path: str) -> int:
        p = self._field(t, slot, 1, path)
        return _u8(self.buf, p)[0] if p else 0

    def i8(self, t: _Table, slot: int, path: str) -> int:
        v = self.u8(t, slot, path)
        return v - 256 if v > 127 else v

    def bool(self, t: _Table, slot: int, path: str) -> bool:
        return self.u8(t, slot, path) != 0

    def i32(self, t: _Table, slot: int, path: str) -> int:
        p = self._field(t, slot, 4, path)
        return _i32(self.buf, p)[0] if p else 0

    def u32(self, t: _Table, slot: int, path: str) -> int:
        p = self._field(t, slot, 4, path)
        return _u32(self.buf, p)[0] if p else 0

    def i64(self, t: _Table, slot: int, path: str) -> int:
        p = self._field(t, slot, 8, path)
        return _i64(self.buf, p)[0] if p else 0

    def u64(self, t: _Table, slot: int, path: str) -> int:
        p = self._field(t, slot, 8, path)
        return _u64(self.buf, p)[0] if p else 0

    def f64(self, t: _Table, slot: int, path: str) -> float:
        p = self._field(t, slot, 8, path)
        return _f64(self.buf, p)[0] if p else 0.0

    # -- references ---------------------------------------------------------------------
    def sub_table(self, t: _Table, slot: int, path: str) -> _Table | None:
        p = self._field(t, slot, 4, path)
        if not p:
            return None
        return self.table(self._deref(p, path), path)

    def _vector(self, t: _Table, slot: int, elem: int, path: str, *, decoded: bool = True) -> tuple[int, int] | None:
        """(start, length) of a vector field. ``decoded=False`` for byte payloads that are
        only sliced (zero copy): they cost one unit of the object budget, not one per byte."""
        p = self._field(t, slot, 4, path)
        if not p:
            return None
        v = self._deref(p, path)
        if v % 4:
            _fail(path, "vector is not 4-byte aligned")
        n = _u32(self.buf, v)[0]
        start = v + 4
        if start + n * elem > self.end:
            _fail(path, "vector runs past the end of the buffer")
        self.spend(n if decoded else 1, path)
        return start, n

    def string(self, t: _Table, slot: int, path: str) -> str | None:
        r = self._vector(t, slot, 1, path, decoded=False)
        if r is None:
            return None
        start, n = r
        if start + n >= self.end or self.buf[start + n] != 0:
            _fail(path, "string is not null-terminated")
        try:
            return str(self.buf[start : start + n], "utf-8")
        except UnicodeDecodeError:
            _fail(path, "string is not valid UTF-8")

    def bytes(self, t: _Table, slot: int, path: str) -> memoryview | None:
        r = self._vector(t, slot, 1, path, decoded=False)
        if r is None:
            return None
        start, n = r
        return self.buf[start : start + n]

    def scalars(self, t: _Table, slot: int, fmt: str, size: int, path: str) -> tuple | None:
        r = self._vector(t, slot, size, path)
        if r is None:
            return None
        start, n = r
        return struct.unpack_from(f"<{n}{fmt}", self.buf, start)

    def tables(self, t: _Table, slot: int, path: str) -> list[tuple[_Table, str]] | None:
        r = self._vector(t, slot, 4, path)
        if r is None:
            return None
        start, n = r
        out = []
        for i in range(n):
            p = start + 4 * i
            ep = f"{path}[{i}]"
            out.append((self.table(self._deref(p, ep), ep), ep))
        return out

    def union(self, t: _Table, slot: int, path: str) -> tuple[int, _Table | None]:
        """A union field occupies two slots: its type tag, then its value."""
        tag = self.u8(t, slot, path)
        if tag == 0:
            return 0, None
        return tag, self.sub_table(t, slot + 1, path)


# ---------------------------------------------------------------------------------------
# The fast path. A plan's values and instructions are most of a program; decoding them with
# a path string per field made loading slow. ``_Fast`` decodes them with every check of the
# checked decoders below (bounds, alignment, vtable and table sizes, null-terminated UTF-8
# strings, value and instruction tags, the object budget) but builds no path: on anything
# unusual it raises ``_Fallback`` and ``loads`` decodes the whole program again on the
# checked path, whose error names the place. Only well-formed programs stay on it. Where the
# optional C extension ``orchestra.program._decode`` is built, ``_Fast.evalues`` and
# ``_Fast.instructions`` run in it: the same checks, objects and budget charge, about ten
# times faster; the Python code below stays the reference (and runs where it is not built).


class _Fallback(Exception):
    """The fast path met something it does not decode: decode again on the checked path."""


def _setup_native_decode():  # noqa: ANN202 - the module, or None
    """``orchestra.program._decode`` (optional C extension: ``_Fast.evalues`` and
    ``_Fast.instructions`` in C, the same checks, objects and budget charge), given the schema
    classes it builds; None when it is not built or does not fit these classes."""
    try:
        from . import _decode
    except ImportError:
        return None
    built = (S.EValue, S.Instruction, S.AllocationDetails, S.ExtraTensorInfo) + S.KERNEL_TYPES + S.INSTRUCTION_TYPES
    if any(hasattr(c, "__post_init__") for c in built):
        return None  # it sets the fields without running __init__
    try:
        _decode.setup({c.__name__: (c, tuple(f.name for f in dataclasses.fields(c))) for c in built},
                      S.KERNEL_TYPES, S.INSTRUCTION_TYPES)
    except (TypeError, ValueError):
        return None
    return _decode


# The C decoder, or None: the Python code (tests set None to compare the two).
_native_decode = _setup_native_decode()


_u16x2 = struct.Struct("<HH").unpack_from
_i8 = struct.Struct("<b").unpack_from
_VT_UNPACK: dict[int, object] = {}  # number of vtable entries -> their unpack_from

# Field specs: (slot, size) of the fields a decoder reads from one table type.
_F_UNION = ((0, 1), (1, 4))  # EValue, Instruction: type tag, value
_F_TENSOR = ((0, 1), (1, 4), (2, 4), (3, 4), (4, 1), (5, 4), (6, 4), (7, 1), (8, 1), (9, 4))
_NINTS = 9
_INTS = tuple(f"<{n}i" for n in range(_NINTS))  # unpack formats of short int32 vectors (tensor sizes)
_F_ONE = {1: ((0, 1),), 4: ((0, 4),), 8: ((0, 8),)}
_F_TWO_I32 = ((0, 4), (1, 4))
_F_ALLOC = ((0, 4), (1, 4), (2, 4))
_F_EXTRA = ((0, 8), (1, 4), (2, 1))


def _vt_unpack(k: int):  # noqa: ANN202 - a struct unpack_from
    f = _VT_UNPACK.get(k)
    if f is None:
        f = _VT_UNPACK[k] = struct.Struct(f"<{k}H").unpack_from
    return f


class _VTable:
    """One decoded vtable: its field offsets, its table size, and per field spec the
    offsets of those fields (0 when absent), checked to lie inside the table once."""

    __slots__ = ("fields", "objsize", "layouts")

    def __init__(self, fields: tuple[int, ...], objsize: int) -> None:
        self.fields = fields
        self.objsize = objsize
        self.layouts: dict[tuple[tuple[int, int], ...], tuple[int, ...]] = {}

    def layout(self, spec: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
        found = self.layouts.get(spec)
        if found is None:
            f, out = self.fields, []
            for slot, size in spec:
                o = f[slot] if slot < len(f) else 0
                if o and (o < 4 or o + size > self.objsize):
                    raise _Fallback
                out.append(o)
            found = self.layouts[spec] = tuple(out)
        return found


class _Fast:
    """Path-free bounds-checked decoding of values and instructions (see above). A table
    is (position, its _VTable)."""

    __slots__ = ("buf", "end", "spent", "vts")

    def __init__(self, r: _FlatReader) -> None:
        self.buf = r.buf
        self.end = r.end
        self.spent = 0  # object budget used, charged to the reader at the end
        self.vts: dict[int, _VTable] = {}  # by position: tables of one type share vtables

    def table(self, pos: int) -> tuple[int, _VTable]:
        buf, end = self.buf, self.end
        if pos < 0 or pos + 4 > end or pos & 3:
            raise _Fallback
        vt = pos - _i32(buf, pos)[0]
        self.spent += 1
        e = self.vts.get(vt)
        if e is None:
            if vt < 0 or vt + 4 > end or vt & 1:
                raise _Fallback
            vtsize, objsize = _u16x2(buf, vt)
            if vtsize < 4 or vtsize & 1 or vt + vtsize > end or objsize < 4:
                raise _Fallback
            e = self.vts[vt] = _VTable(_vt_unpack((vtsize - 4) // 2)(buf, vt + 4), objsize)
        if pos + e.objsize > end:
            raise _Fallback
        return pos, e

    def ref(self, p: int) -> tuple[int, _VTable]:
        """The table the offset at ``p`` points to."""
        target = p + _u32(self.buf, p)[0]
        if target + 4 > self.end:
            raise _Fallback
        return self.table(target)

    def vector(self, p: int, elem: int, decoded: bool = True) -> tuple[int, int]:
        """(start, length) of the vector the offset at ``p`` points to."""
        buf = self.buf
        v = p + _u32(buf, p)[0]
        if v + 4 > self.end or v & 3:
            raise _Fallback
        n = _u32(buf, v)[0]
        if v + 4 + n * elem > self.end:
            raise _Fallback
        self.spent += n if decoded else 1
        return v + 4, n

    def ints(self, p: int, fmt: str, size: int) -> tuple:
        start, n = self.vector(p, size)
        return struct.unpack_from(f"<{n}{fmt}", self.buf, start)

    def string(self, p: int) -> str:
        start, n = self.vector(p, 1, False)
        if start + n >= self.end or self.buf[start + n] != 0:
            raise _Fallback
        try:
            return str(self.buf[start : start + n], "utf-8")
        except UnicodeDecodeError:
            raise _Fallback from None

    def tables(self, start: int, n: int) -> list[tuple[int, _VTable]]:
        """The tables a vector of ``n`` offsets at ``start`` points to."""
        offs = struct.unpack_from(f"<{n}I", self.buf, start)
        return [self.table(start + 4 * i + o) for i, o in enumerate(offs)]

    def c_decoder(self, kind: str) -> Callable[..., tuple | None] | None:
        """The C extension's decoder ``kind``; None where it is not built (or has no such
        decoder) or the buffer is not plain bytes (the Python code then)."""
        native = _native_decode
        if native is None or self.buf.format != "B" or not self.buf.c_contiguous:
            return None
        return getattr(native, kind, None)

    def in_c(self, kind: str, start: int, n: int) -> tuple | None:
        """``self.<kind>(start, n)`` ("evalues", "instructions", "segments", "named_data") decoded
        by the C extension; None where ``c_decoder`` has none."""
        decode = self.c_decoder(kind)
        if decode is None:
            return None
        r = decode(self.buf, self.end, start, n)
        if r is None:
            raise _Fallback
        self.spent += r[1]
        return r[0]

    def operators(self, start: int, n: int) -> tuple[tuple[str, str], ...]:
        """(name, overload) of the Operator tables of a vector of ``n`` offsets at ``start``,
        the overload "" where absent; an operator without a name falls back (the checked
        path names it). The same checks and charge as the checked path's ``r.tables`` and
        ``r.string``: a plan's few dozen operators then build no path string each."""
        done = self.in_c("operators", start, n)
        if done is not None:
            return done
        out = []
        for pos, vt in self.tables(start, n):
            o_name, o_overload = vt.layout(_F_TWO_I32)  # two string offsets
            if not o_name:
                raise _Fallback
            out.append((self.string(pos + o_name), self.string(pos + o_overload) if o_overload else ""))
        return tuple(out)

    def evalues(self, start: int, n: int) -> tuple[S.EValue, ...]:
        """The EValues of a vector of ``n`` table offsets at ``start`` (tables() then
        evalue() on each, with the table checks of the value and of its union member, and
        the decoding of the common kinds, inlined: the same checks, fewer calls)."""
        done = self.in_c("evalues", start, n)
        if done is not None:
            return done
        buf, end, vts = self.buf, self.end, self.vts
        offs = struct.unpack_from(f"<{n}I", buf, start)
        out = []
        append = out.append
        table, i32, u32, i64 = self.table, _i32, _u32, _i64
        EValue, Tensor, Int, Bool = S.EValue, S.Tensor, S.Int, S.Bool
        kinds = S.KERNEL_TYPES
        nkinds = len(kinds)
        f_union, f_int, f_bool = _F_UNION, _F_ONE[8], _F_ONE[1]
        spent = 0
        for i, o in enumerate(offs):
            pos = start + 4 * i + o
            if pos + 4 > end or pos & 3:
                raise _Fallback
            e = vts.get(pos - i32(buf, pos)[0])
            if e is None or pos + e.objsize > end:
                pos, e = table(pos)  # checks (and caches) the vtable, or raises
            else:
                spent += 1
            o_tag, o_val = e.layout(f_union)
            tag = buf[pos + o_tag] if o_tag else 0
            if tag == 0:
                append(EValue(None))
                continue
            if tag > nkinds or not o_val:
                raise _Fallback
            # The union member: ref(pos + o_val), inlined.
            p = pos + o_val
            vpos = p + u32(buf, p)[0]
            if vpos + 4 > end or vpos & 3:
                raise _Fallback
            ve = vts.get(vpos - i32(buf, vpos)[0])
            if ve is None or vpos + ve.objsize > end:
                vpos, ve = table(vpos)
            else:
                spent += 1
            kind = kinds[tag - 1]
            if kind is Tensor:
                append(EValue(self.tensor(vpos, ve)))
            elif kind is Int:
                (o,) = ve.layout(f_int)
                append(EValue(Int(i64(buf, vpos + o)[0] if o else 0)))
            elif kind is Bool:
                (o,) = ve.layout(f_bool)
                append(EValue(Bool(buf[vpos + o] != 0 if o else False)))
            else:
                append(self.member(kind, vpos, ve))
        self.spent += spent
        return tuple(out)

    def instructions(self, start: int, n: int) -> tuple[S.Instruction, ...]:
        """The Instructions of a vector of ``n`` table offsets at ``start`` (tables() then
        instruction() on each, with the table checks and the decoding of a KernelCall
        inlined, as in evalues)."""
        done = self.in_c("instructions", start, n)
        if done is not None:
            return done
        buf, end, vts = self.buf, self.end, self.vts
        offs = struct.unpack_from(f"<{n}I", buf, start)
        out = []
        append = out.append
        table, i32, u32 = self.table, _i32, _u32
        Instruction, KernelCall = S.Instruction, S.KernelCall
        kinds = S.INSTRUCTION_TYPES
        nkinds = len(kinds)
        f_union, f_two = _F_UNION, _F_TWO_I32
        spent = 0
        for i, o in enumerate(offs):
            pos = start + 4 * i + o
            if pos + 4 > end or pos & 3:
                raise _Fallback
            e = vts.get(pos - i32(buf, pos)[0])
            if e is None or pos + e.objsize > end:
                pos, e = table(pos)
            else:
                spent += 1
            o_tag, o_val = e.layout(f_union)
            tag = buf[pos + o_tag] if o_tag else 0
            if tag == 0 or tag > nkinds or not o_val:
                raise _Fallback
            p = pos + o_val
            vpos = p + u32(buf, p)[0]
            if vpos + 4 > end or vpos & 3:
                raise _Fallback
            ve = vts.get(vpos - i32(buf, vpos)[0])
            if ve is None or vpos + ve.objsize > end:
                vpos, ve = table(vpos)
            else:
                spent += 1
            kind = kinds[tag - 1]
            if kind is not KernelCall:
                append(self.instruction_args(kind, vpos, ve))
                continue
            o0, o1 = ve.layout(f_two)
            args: tuple[int, ...] = ()
            if o1:
                q = vpos + o1
                v = q + u32(buf, q)[0]
                if v + 4 > end or v & 3:
                    raise _Fallback
                m = u32(buf, v)[0]
                if v + 4 + 4 * m > end:
                    raise _Fallback
                spent += m
                args = struct.unpack_from(f"<{m}i", buf, v + 4)
            append(Instruction(KernelCall(i32(buf, vpos + o0)[0] if o0 else 0, args)))
        self.spent += spent
        return tuple(out)

    def field_vector(self, t: tuple[int, _VTable], slot: int, elem: int) -> tuple[int, int] | None:
        (o,) = t[1].layout(((slot, 4),))
        return self.vector(t[0] + o, elem) if o else None

    def evalue(self, t: tuple[int, _VTable]) -> S.EValue:
        pos, e = t
        o_tag, o_val = e.layout(_F_UNION)
        buf = self.buf
        tag = buf[pos + o_tag] if o_tag else 0
        if tag == 0:
            return S.EValue(None)
        if tag >= len(S.KERNEL_TYPES) + 1 or not o_val:
            raise _Fallback
        vpos, ve = self.ref(pos + o_val)
        return self.member(S.KERNEL_TYPES[tag - 1], vpos, ve)

    def member(self, kind: type, vpos: int, ve: _VTable) -> S.EValue:
        """The EValue whose union member of type ``kind`` is the table at ``vpos``."""
        buf = self.buf
        if kind is S.Tensor:
            return S.EValue(self.tensor(vpos, ve))
        if kind is S.Null:
            return S.EValue(S.Null())
        size = 1 if kind is S.Bool else 8 if kind in (S.Int, S.Double) else 4
        (o,) = ve.layout(_F_ONE[size])
        p = vpos + o
        if kind is S.Int:
            return S.EValue(S.Int(_i64(buf, p)[0] if o else 0))
        if kind is S.IntList:
            return S.EValue(S.IntList(self.ints(p, "q", 8) if o else ()))
        if kind is S.Bool:
            return S.EValue(S.Bool(buf[p] != 0 if o else False))
        if kind is S.Double:
            return S.EValue(S.Double(_f64(buf, p)[0] if o else 0.0))
        if kind is S.String:
            return S.EValue(S.String(self.string(p) if o else None))
        if kind is S.DoubleList:
            return S.EValue(S.DoubleList(self.ints(p, "d", 8) if o else ()))
        if kind is S.BoolList:
            return S.EValue(S.BoolList(tuple(bool(b) for b in self.ints(p, "B", 1)) if o else ()))
        if kind is S.TensorList:
            return S.EValue(S.TensorList(self.ints(p, "i", 4) if o else ()))
        return S.EValue(S.OptionalTensorList(self.ints(p, "i", 4) if o else ()))

    def tensor(self, pos: int, e: _VTable) -> S.Tensor:
        o_st, o_so, o_sz, o_do, o_rg, o_db, o_al, o_ly, o_dy, o_ex = e.layout(_F_TENSOR)
        buf, end = self.buf, self.end
        u32 = _u32
        spent = 0
        # sizes and dim_order: vector() then unpack, inlined (the same checks).
        sizes: tuple[int, ...] = ()
        if o_sz:
            p = pos + o_sz
            v = p + u32(buf, p)[0]
            if v + 4 > end or v & 3:
                raise _Fallback
            n = u32(buf, v)[0]
            if v + 4 + 4 * n > end:
                raise _Fallback
            spent += n
            sizes = struct.unpack_from(_INTS[n] if n < _NINTS else f"<{n}i", buf, v + 4)
        dim_order: tuple[int, ...] = ()
        if o_do:
            p = pos + o_do
            v = p + u32(buf, p)[0]
            if v + 4 > end or v & 3:
                raise _Fallback
            n = u32(buf, v)[0]
            if v + 4 + n > end:
                raise _Fallback
            spent += n
            dim_order = tuple(buf[v + 4 : v + 4 + n])
        alloc = None
        if o_al:
            # ref(pos + o_al) with table() inlined on the cached-vtable path.
            p = pos + o_al
            apos = p + u32(buf, p)[0]
            if apos + 4 > end or apos & 3:
                raise _Fallback
            ae = self.vts.get(apos - _i32(buf, apos)[0])
            if ae is None or apos + ae.objsize > end:
                apos, ae = self.table(apos)
            else:
                spent += 1
            a0, a1, a2 = ae.layout(_F_ALLOC)
            alloc = S.AllocationDetails(u32(buf, apos + a0)[0] if a0 else 0, u32(buf, apos + a1)[0] if a1 else 0,
                                        u32(buf, apos + a2)[0] if a2 else 0)
        self.spent += spent
        extra = None
        if o_ex:
            xpos, xe = self.ref(pos + o_ex)
            x0, x1, x2 = xe.layout(_F_EXTRA)
            extra = S.ExtraTensorInfo(_u64(buf, xpos + x0)[0] if x0 else 0, self.string(xpos + x1) if x1 else None,
                                      _i8(buf, xpos + x2)[0] if x2 else 0)
        return S.Tensor(  # positional (faster): scalar_type, storage_offset, sizes, dim_order,
            # requires_grad, data_buffer_idx, allocation_info, layout, shape_dynamism, extra_tensor_info
            _i8(buf, pos + o_st)[0] if o_st else 0,
            _i32(buf, pos + o_so)[0] if o_so else 0,
            sizes,
            dim_order,
            buf[pos + o_rg] != 0 if o_rg else False,
            u32(buf, pos + o_db)[0] if o_db else 0,
            alloc,
            _i8(buf, pos + o_ly)[0] if o_ly else 0,
            _i8(buf, pos + o_dy)[0] if o_dy else 0,
            extra,
        )

    def instruction(self, t: tuple[int, _VTable]) -> S.Instruction:
        pos, e = t
        o_tag, o_val = e.layout(_F_UNION)
        tag = self.buf[pos + o_tag] if o_tag else 0
        if tag == 0 or tag > len(S.INSTRUCTION_TYPES) or not o_val:
            raise _Fallback
        vpos, ve = self.ref(pos + o_val)
        return self.instruction_args(S.INSTRUCTION_TYPES[tag - 1], vpos, ve)

    def instruction_args(self, kind: type, vpos: int, ve: _VTable) -> S.Instruction:
        """The Instruction whose arguments of type ``kind`` are the table at ``vpos``."""
        buf = self.buf
        if kind is S.FreeCall:
            (o,) = ve.layout(_F_ONE[4])
            return S.Instruction(S.FreeCall(_i32(buf, vpos + o)[0] if o else 0))
        o0, o1 = ve.layout(_F_TWO_I32)
        first = _i32(buf, vpos + o0)[0] if o0 else 0
        if kind is S.KernelCall:
            return S.Instruction(S.KernelCall(first, self.ints(vpos + o1, "i", 4) if o1 else ()))
        if kind is S.DelegateCall:
            return S.Instruction(S.DelegateCall(first, self.ints(vpos + o1, "i", 4) if o1 else ()))
        second = _i32(buf, vpos + o1)[0] if o1 else 0
        if kind is S.MoveCall:
            return S.Instruction(S.MoveCall(first, second))
        return S.Instruction(S.JumpFalseCall(first, second))


# ---------------------------------------------------------------------------------------
# Schema decoding. Slot numbers follow the field order of ExecuTorch's program.fbs
# (a union takes two slots).


def _ints(r: _FlatReader, t: _Table, slot: int, fmt: str, size: int, path: str) -> tuple:
    v = r.scalars(t, slot, fmt, size, path)
    return () if v is None else v


def _tensor(r: _FlatReader, t: _Table, path: str) -> S.Tensor:
    sizes = _ints(r, t, 2, "i", 4, path + ".sizes")
    dim_order = _ints(r, t, 3, "B", 1, path + ".dim_order")
    alloc = r.sub_table(t, 6, path + ".allocation_info")
    extra = r.sub_table(t, 9, path + ".extra_tensor_info")
    return S.Tensor(
        scalar_type=r.i8(t, 0, path + ".scalar_type"),
        storage_offset=r.i32(t, 1, path + ".storage_offset"),
        sizes=sizes,
        dim_order=dim_order,
        requires_grad=r.bool(t, 4, path + ".requires_grad"),
        data_buffer_idx=r.u32(t, 5, path + ".data_buffer_idx"),
        allocation_info=None
        if alloc is None
        else S.AllocationDetails(
            r.u32(alloc, 0, path + ".allocation_info.memory_id"),
            r.u32(alloc, 1, path + ".allocation_info.memory_offset_low"),
            r.u32(alloc, 2, path + ".allocation_info.memory_offset_high"),
        ),
        layout=r.i8(t, 7, path + ".layout"),
        shape_dynamism=r.i8(t, 8, path + ".shape_dynamism"),
        extra_tensor_info=None
        if extra is None
        else S.ExtraTensorInfo(
            r.u64(extra, 0, path + ".extra_tensor_info.mutable_data_segments_idx"),
            r.string(extra, 1, path + ".extra_tensor_info.fully_qualified_name"),
            r.i8(extra, 2, path + ".extra_tensor_info.location"),
        ),
    )


def _evalue(r: _FlatReader, t: _Table, path: str) -> S.EValue:
    tag, v = r.union(t, 0, path + ".val")
    if tag == 0:
        return S.EValue(None)
    if tag >= len(S.KERNEL_TYPES) + 1:
        _fail(path + ".val", f"unknown value type tag {tag}")
    kind = S.KERNEL_TYPES[tag - 1]
    if v is None:
        _fail(path + ".val", f"{kind.__name__} value is missing")
    name = kind.__name__.lower()
    p = f"{path}.{name}"
    if kind is S.Tensor:
        return S.EValue(_tensor(r, v, p))
    if kind is S.Int:
        return S.EValue(S.Int(r.i64(v, 0, p + ".int_val")))
    if kind is S.Bool:
        return S.EValue(S.Bool(r.bool(v, 0, p + ".bool_val")))
    if kind is S.Double:
        return S.EValue(S.Double(r.f64(v, 0, p + ".double_val")))
    if kind is S.String:
        return S.EValue(S.String(r.string(v, 0, p + ".string_val")))
    if kind is S.IntList:
        return S.EValue(S.IntList(_ints(r, v, 0, "q", 8, p + ".items")))
    if kind is S.DoubleList:
        return S.EValue(S.DoubleList(_ints(r, v, 0, "d", 8, p + ".items")))
    if kind is S.BoolList:
        return S.EValue(S.BoolList(tuple(bool(b) for b in _ints(r, v, 0, "B", 1, p + ".items"))))
    if kind is S.TensorList:
        return S.EValue(S.TensorList(_ints(r, v, 0, "i", 4, p + ".items")))
    if kind is S.OptionalTensorList:
        return S.EValue(S.OptionalTensorList(_ints(r, v, 0, "i", 4, p + ".items")))
    return S.EValue(S.Null())


def _instruction(r: _FlatReader, t: _Table, path: str) -> S.Instruction:
    tag, v = r.union(t, 0, path + ".instr_args")
    if tag == 0:
        _fail(path + ".instr_args", "instruction has no arguments")
    if tag > len(S.INSTRUCTION_TYPES):
        _fail(path + ".instr_args", f"unknown instruction type tag {tag}")
    kind = S.INSTRUCTION_TYPES[tag - 1]
    if v is None:
        _fail(path + ".instr_args", f"{kind.__name__} arguments are missing")
    p = f"{path}.{kind.__name__}"
    if kind is S.KernelCall:
        args = S.KernelCall(r.i32(v, 0, p + ".op_index"), _ints(r, v, 1, "i", 4, p + ".args"))
    elif kind is S.DelegateCall:
        args = S.DelegateCall(r.i32(v, 0, p + ".delegate_index"), _ints(r, v, 1, "i", 4, p + ".args"))
    elif kind is S.MoveCall:
        args = S.MoveCall(r.i32(v, 0, p + ".move_from"), r.i32(v, 1, p + ".move_to"))
    elif kind is S.JumpFalseCall:
        args = S.JumpFalseCall(
            r.i32(v, 0, p + ".cond_value_index"), r.i32(v, 1, p + ".destination_instruction")
        )
    else:
        args = S.FreeCall(r.i32(v, 0, p + ".value_index"))
    return S.Instruction(args)


def _frame(r: _FlatReader, t: _Table, path: str) -> S.Frame:
    return S.Frame(
        r.string(t, 0, path + ".filename"),
        r.i32(t, 1, path + ".lineno"),
        r.string(t, 2, path + ".name"),
        r.string(t, 3, path + ".context"),
    )


def _chain(r: _FlatReader, t: _Table, path: str, fast: _Fast | None = None) -> S.Chain:
    if fast is not None:
        iv = fast.field_vector(fast.table(t.pos), 2, 4)
        instructions = () if iv is None else fast.instructions(*iv)
    else:
        instructions = tuple(_instruction(r, it, p) for it, p in r.tables(t, 2, path + ".instructions") or [])
    st = r.tables(t, 3, path + ".stacktrace")
    return S.Chain(
        inputs=_ints(r, t, 0, "i", 4, path + ".inputs"),
        outputs=_ints(r, t, 1, "i", 4, path + ".outputs"),
        instructions=instructions,
        stacktrace=None
        if st is None
        else tuple(
            S.FrameList(tuple(_frame(r, ft, fp) for ft, fp in (r.tables(lt, 0, lp + ".items") or [])))
            for lt, lp in st
        ),
    )


def _delegate(r: _FlatReader, t: _Table, path: str) -> S.BackendDelegate:
    did = r.string(t, 0, path + ".id")
    if did is None:
        _fail(path + ".id", "delegate has no backend id")
    pt = r.sub_table(t, 1, path + ".processed")
    if pt is None:
        _fail(path + ".processed", "delegate has no processed data reference")
    specs = []
    for st, sp in r.tables(t, 2, path + ".compile_specs") or []:
        key = r.string(st, 0, sp + ".key")
        val = r.bytes(st, 1, sp + ".value")
        specs.append(S.CompileSpec("" if key is None else key, b"" if val is None else bytes(val)))
    return S.BackendDelegate(
        id=did,
        processed=S.BackendDelegateDataReference(
            r.i8(pt, 0, path + ".processed.location"), r.u32(pt, 1, path + ".processed.index")
        ),
        compile_specs=tuple(specs),
    )


def _plan(r: _FlatReader, t: _Table, path: str, limits: Limits, fast: _Fast | None = None) -> S.ExecutionPlan:
    name = r.string(t, 0, path + ".name")
    if name is None:
        _fail(path + ".name", "execution plan has no name")
    cm = r.sub_table(t, 1, path + ".container_meta_type")
    if fast is not None:
        ft = fast.table(t.pos)
        vv = fast.field_vector(ft, 2, 4)
        nvalues = 0 if vv is None else vv[1]
        if limits.max_values is not None and nvalues > limits.max_values:
            raise _Fallback
        fast_values = () if vv is None else fast.evalues(*vv)
    else:
        vtabs = r.tables(t, 2, path + ".values") or []
        if limits.max_values is not None and len(vtabs) > limits.max_values:
            _fail(path + ".values", f"{len(vtabs)} values exceed the cap of {limits.max_values}")
    chains = r.tables(t, 5, path + ".chains") or []
    if limits.max_instructions is not None:
        # Cheap pre-check before decoding: count instruction vectors' lengths.
        total = 0
        for ct, cp in chains:
            v = r._vector(ct, 2, 4, cp + ".instructions")
            total += 0 if v is None else v[1]
        if total > limits.max_instructions:
            _fail(path + ".chains", f"{total} instructions exceed the cap of {limits.max_instructions}")
    if fast is not None:
        ov = fast.field_vector(ft, 6, 4)
        ops = [] if ov is None else list(starmap(S.Operator, fast.operators(*ov)))
    else:
        ops = []
        for ot, op in r.tables(t, 6, path + ".operators") or []:
            oname = r.string(ot, 0, op + ".name")
            if oname is None:
                _fail(op + ".name", "operator has no name")
            ops.append(S.Operator(oname, r.string(ot, 1, op + ".overload") or ""))
    return S.ExecutionPlan(
        name=name,
        container_meta_type=None
        if cm is None
        else S.ContainerMetadata(
            r.string(cm, 0, path + ".container_meta_type.encoded_inp_str"),
            r.string(cm, 1, path + ".container_meta_type.encoded_out_str"),
        ),
        values=fast_values if fast is not None else tuple(_evalue(r, vt, vp) for vt, vp in vtabs),
        inputs=_ints(r, t, 3, "i", 4, path + ".inputs"),
        outputs=_ints(r, t, 4, "i", 4, path + ".outputs"),
        chains=tuple(_chain(r, ct, cp, fast) for ct, cp in chains),
        operators=tuple(ops),
        delegates=tuple(_delegate(r, dt, dp) for dt, dp in r.tables(t, 7, path + ".delegates") or []),
        non_const_buffer_sizes=_ints(r, t, 8, "q", 8, path + ".non_const_buffer_sizes"),
    )


def _subsegment(r: _FlatReader, t: _Table, path: str) -> S.SubsegmentOffsets:
    return S.SubsegmentOffsets(
        r.u32(t, 0, path + ".segment_index"), _ints(r, t, 1, "Q", 8, path + ".offsets")
    )


# ---------------------------------------------------------------------------------------
# The container and cross-reference checks.


def _check_index(i: int, n: int, path: str, what: str) -> None:
    if not 0 <= i < n:
        _fail(path, f"{what} index {i} out of range (0..{n - 1})" if n else f"{what} index {i} but there are none")


def _tensor_nbytes(t: S.Tensor, path: str, limits: Limits) -> int | None:
    """Validates a tensor's metadata and returns its byte size at its sizes (for a
    DYNAMIC_UNBOUND tensor: at its initial sizes, checked like any other)."""
    if t.scalar_type not in _VALID_SCALAR_TYPES:
        _fail(path + ".scalar_type", f"unknown scalar type {t.scalar_type}")
    if t.storage_offset != 0:
        _fail(path + ".storage_offset", f"storage_offset {t.storage_offset} is not supported (must be 0)")
    if t.shape_dynamism not in (0, 1, 2):
        _fail(path + ".shape_dynamism", f"unknown shape dynamism {t.shape_dynamism}")
    if t.dim_order and sorted(t.dim_order) != list(range(len(t.sizes))):
        _fail(path + ".dim_order", f"{list(t.dim_order)} is not a permutation of the {len(t.sizes)} dimensions")
    numel = 1
    for s in t.sizes:
        if s < 0:
            _fail(path + ".sizes", f"negative size {s} in {list(t.sizes)}")
        numel *= s
    if limits.max_numel is not None and numel > limits.max_numel:
        _fail(path + ".sizes", f"{numel} elements exceed the cap of {limits.max_numel}")
    return numel * ScalarType(t.scalar_type).itemsize


_ITEMSIZE = {int(t): t.itemsize for t in ScalarType}

_IDENTITY = tuple(tuple(range(n)) for n in range(9))  # identity dim orders of up to 8 dimensions


def _plain_tensor_ok(t: S.Tensor, limits: Limits, arenas: tuple[int, ...], nconst: int, prog: S.ProgramDef) -> bool:
    """True when tensor ``t`` has no extra info (no mutable data, no name) and passes every
    check _verify_plan makes of a tensor; False sends it through those checks, which name
    what is wrong (or handle the rarer kinds)."""
    if t.extra_tensor_info is not None or t.storage_offset != 0 or t.shape_dynamism not in (0, 1, 2):
        return False
    itemsize = _ITEMSIZE.get(t.scalar_type)
    if itemsize is None:
        return False
    sizes = t.sizes
    d = t.dim_order
    if d and (len(sizes) > 8 or d != _IDENTITY[len(sizes)]) and sorted(d) != list(range(len(sizes))):
        return False
    numel = 1
    for s in sizes:
        if s < 0:
            return False
        numel *= s
    if limits.max_numel is not None and numel > limits.max_numel:
        return False
    nbytes = numel * itemsize
    a = t.allocation_info
    idx = t.data_buffer_idx
    if a is not None:
        return idx == 0 and 0 < a.memory_id < len(arenas) and a.offset + nbytes <= arenas[a.memory_id]
    return idx <= 0 or (idx < nconst and nbytes <= len(prog.constant_data(idx)))


# The item size of each scalar type by its number, 0 where none: for the C extension.
_ITEMSIZES = bytes(_ITEMSIZE.get(i, 0) for i in range(max(_ITEMSIZE) + 1))


def _unvouched_values(prog: S.ProgramDef, plan: S.ExecutionPlan, limits: Limits) -> Iterable[int]:
    """The indices of ``plan``'s values that _verify_plan must check: where the C extension is
    built, those its ``plain_values`` does not vouch for (it makes the checks of the loop's
    fast path, _plain_tensor_ok and the TensorList item range, on the objects: a program's
    thousands of values then cost no Python each); otherwise all of them."""
    check = getattr(_native_decode, "plain_values", None)
    values = plan.values
    if check is None or type(values) is not tuple or type(plan.non_const_buffer_sizes) is not tuple:
        return range(len(values))
    if prog.constant_buffer:
        constants, seg_len = tuple(len(b.storage) for b in prog.constant_buffer), None
    elif prog.constant_segment is not None and prog.constant_segment.offsets:
        cs = prog.constant_segment  # _verify has checked its segment index
        constants, seg_len = tuple(cs.offsets), len(prog.segments[cs.segment_index].data)
    else:
        constants, seg_len = (), None
    return check(values, plan.non_const_buffer_sizes, limits.max_numel, _ITEMSIZES, constants, seg_len)


def _unvouched_instructions(instructions: tuple[S.Instruction, ...], nv: int, nops: int, ndel: int) -> Iterable[int]:
    """The indices of a chain's instructions that _verify_plan must check: where the C
    extension is built, those its ``plain_instructions`` does not vouch for (it vouches for
    those whose indices are all in range, which pass the checks below); otherwise all."""
    check = getattr(_native_decode, "plain_instructions", None)
    if check is None or type(instructions) is not tuple:
        return range(len(instructions))
    return check(instructions, nv, nops, ndel)


def tensors_with_extra_info(plan: S.ExecutionPlan) -> list[int]:
    """The indices, in order, of ``plan``'s values that are tensors with ``extra_tensor_info``
    (mutable buffers, named or external tensors): a few among thousands of values, found
    without a Python step per value where the C extension is built."""
    find = getattr(_native_decode, "extra_info_values", None)
    values = plan.values
    candidates = range(len(values)) if find is None or type(values) is not tuple else find(values)
    return [i for i in candidates if isinstance(v := values[i].val, S.Tensor) and v.extra_tensor_info is not None]


def _verify_plan(prog: S.ProgramDef, pi: int, plan: S.ExecutionPlan, limits: Limits, based: bool) -> None:
    path = f"execution_plan[{pi}]"
    nv = len(plan.values)
    arenas = plan.non_const_buffer_sizes
    for i, s in enumerate(arenas):
        if s < 0:
            _fail(f"{path}.non_const_buffer_sizes[{i}]", f"negative buffer size {s}")
    planned = sum(arenas[1:])
    if limits.max_planned_memory is not None and planned > limits.max_planned_memory:
        _fail(f"{path}.non_const_buffer_sizes", f"{planned} bytes of planned memory exceed the cap of {limits.max_planned_memory}")
    if prog.constant_buffer:
        nconst = len(prog.constant_buffer)
    elif prog.constant_segment is not None:
        nconst = len(prog.constant_segment.offsets)
    else:
        nconst = 0

    inputs = frozenset(plan.inputs)
    values = plan.values
    for vi in _unvouched_values(prog, plan, limits):
        v = values[vi].val
        if isinstance(v, S.Tensor):
            if _plain_tensor_ok(v, limits, arenas, nconst, prog):
                continue
        elif not isinstance(v, (S.TensorList, S.OptionalTensorList)):
            continue  # nothing to check (IntList items are literal ints or SymInt indices, checked when used)
        elif all(0 <= item < nv or (item == -1 and isinstance(v, S.OptionalTensorList)) for item in v.items):
            continue
        vp = f"{path}.values[{vi}]"
        if isinstance(v, S.Tensor):
            tp = vp + ".tensor"
            nbytes = _tensor_nbytes(v, tp, limits)
            e = v.extra_tensor_info
            if (v.allocation_info is None and v.data_buffer_idx == 0 and e is not None and e.fully_qualified_name
                    and e.location != S.TensorDataLocation.EXTERNAL and vi not in inputs and nbytes):
                # An unplanned named mutable buffer: the runtime allocates it (counts as planned).
                planned += nbytes
                if limits.max_planned_memory is not None and planned > limits.max_planned_memory:
                    _fail(tp, f"mutable buffer {e.fully_qualified_name!r} takes planned memory past the cap of {limits.max_planned_memory} bytes")
            if v.allocation_info is not None:
                a = v.allocation_info
                ap = tp + ".allocation_info"
                if not 0 < a.memory_id < len(arenas):
                    _fail(ap + ".memory_id", f"memory_id {a.memory_id} names no planned buffer (buffers 1..{len(arenas) - 1})")
                if nbytes is not None and a.offset + nbytes > arenas[a.memory_id]:
                    _fail(ap, f"tensor of {nbytes} bytes at offset {a.offset} overruns planned buffer {a.memory_id} of {arenas[a.memory_id]} bytes")
            external = v.extra_tensor_info is not None and v.extra_tensor_info.location == S.TensorDataLocation.EXTERNAL
            if v.data_buffer_idx > 0 and not external:
                dp = tp + ".data_buffer_idx"
                if v.allocation_info is None:
                    _check_index(v.data_buffer_idx, nconst, dp, "constant buffer")
                    avail = len(prog.constant_data(v.data_buffer_idx))
                else:
                    mi = v.extra_tensor_info.mutable_data_segments_idx if v.extra_tensor_info else 0
                    _check_index(mi, len(prog.mutable_data_segments), tp + ".extra_tensor_info.mutable_data_segments_idx", "mutable data segment")
                    ms = prog.mutable_data_segments[mi]
                    _check_index(v.data_buffer_idx, len(ms.offsets), dp, "mutable data")
                    if not based:
                        _no_base(dp, f"the initial value of a mutable tensor (segments[{ms.segment_index}])")
                    seg = prog.segments[ms.segment_index]
                    avail = seg.size - ms.offsets[v.data_buffer_idx]
                if nbytes is not None and nbytes > avail:
                    _fail(dp, f"tensor needs {nbytes} bytes but its data has {avail}")
        elif isinstance(v, (S.TensorList, S.OptionalTensorList)):
            opt = isinstance(v, S.OptionalTensorList)
            for j, item in enumerate(v.items):
                if opt and item == -1:
                    continue
                _check_index(item, nv, f"{vp}.items[{j}]", "value")
        elif isinstance(v, S.IntList):
            pass  # items are literal ints (or value indices of SymInts; checked when used)
    for j, i in enumerate(plan.inputs):
        _check_index(i, nv, f"{path}.inputs[{j}]", "value")
    for j, i in enumerate(plan.outputs):
        _check_index(i, nv, f"{path}.outputs[{j}]", "value")
    nops, ndel = len(plan.operators), len(plan.delegates)
    for di, d in enumerate(plan.delegates):
        dp = f"{path}.delegates[{di}].processed"
        if d.processed.location == S.DataLocation.INLINE:
            _check_index(d.processed.index, len(prog.backend_delegate_data), dp + ".index", "inline delegate data")
        elif d.processed.location == S.DataLocation.SEGMENT:
            _check_index(d.processed.index, len(prog.segments), dp + ".index", "segment")
            if not based:
                _no_base(dp, f"delegate {d.id!r}'s processed blob (segments[{d.processed.index}])")
        else:
            _fail(dp + ".location", f"unknown data location {d.processed.location}")
    for ci, c in enumerate(plan.chains):
        cp = f"{path}.chains[{ci}]"
        for j, i in enumerate(c.inputs):
            _check_index(i, nv, f"{cp}.inputs[{j}]", "value")
        for j, i in enumerate(c.outputs):
            _check_index(i, nv, f"{cp}.outputs[{j}]", "value")
        n = len(c.instructions)
        if c.stacktrace is not None and len(c.stacktrace) != n:
            _fail(cp + ".stacktrace", f"{len(c.stacktrace)} frame lists for {n} instructions")
        instructions = c.instructions
        for ii in _unvouched_instructions(instructions, nv, nops, ndel):
            a = instructions[ii].instr_args
            if (isinstance(a, S.KernelCall) and 0 <= a.op_index < nops and (not a.args or (min(a.args) >= 0 and max(a.args) < nv))) or (
                    isinstance(a, S.FreeCall) and 0 <= a.value_index < nv):
                continue  # the common cases, checked without building paths
            ip = f"{cp}.instructions[{ii}]"
            if isinstance(a, S.KernelCall):
                _check_index(a.op_index, nops, ip + ".KernelCall.op_index", "operator")
                for j, x in enumerate(a.args):
                    _check_index(x, nv, f"{ip}.KernelCall.args[{j}]", "value")
            elif isinstance(a, S.DelegateCall):
                _check_index(a.delegate_index, ndel, ip + ".DelegateCall.delegate_index", "delegate")
                for j, x in enumerate(a.args):
                    _check_index(x, nv, f"{ip}.DelegateCall.args[{j}]", "value")
            elif isinstance(a, S.MoveCall):
                _check_index(a.move_from, nv, ip + ".MoveCall.move_from", "value")
                _check_index(a.move_to, nv, ip + ".MoveCall.move_to", "value")
            elif isinstance(a, S.JumpFalseCall):
                _check_index(a.cond_value_index, nv, ip + ".JumpFalseCall.cond_value_index", "value")
                if not 0 <= a.destination_instruction <= n:
                    _fail(ip + ".JumpFalseCall.destination_instruction", f"destination {a.destination_instruction} out of range (0..{n})")
            elif isinstance(a, S.FreeCall):
                _check_index(a.value_index, nv, ip + ".FreeCall.value_index", "value")


def _no_base(path: str, what: str) -> NoReturn:
    _fail(path, f"{what} lives in a segment, but the program has no extended header (eh00) giving the "
                "segments' base offset, so its segment data cannot be located (ExecuTorch reads such a "
                "file as one flatbuffer and fails the same way when a segment is used)")


def _verify(prog: S.ProgramDef, limits: Limits, based: bool = True) -> None:
    """Checks every cross reference. ``based``: the file gives its segments' base offset (an
    extended header); without one, any use of a segment fails (see _no_base)."""
    nseg = len(prog.segments)
    if prog.constant_buffer and prog.constant_segment is not None and prog.constant_segment.offsets:
        _fail("constant_segment", "both constant_buffer and constant_segment.offsets are set")
    if prog.constant_segment is not None:
        cs = prog.constant_segment
        if cs.offsets:
            _check_index(cs.segment_index, nseg, "constant_segment.segment_index", "segment")
            if len(cs.offsets) > 1 and not based:
                _no_base("constant_segment", f"constant data (segments[{cs.segment_index}])")
            size = prog.segments[cs.segment_index].size
            for j, o in enumerate(cs.offsets):
                if o > size:
                    _fail(f"constant_segment.offsets[{j}]", f"offset {o} lies past the end of segment {cs.segment_index} ({size} bytes)")
    for mi, ms in enumerate(prog.mutable_data_segments):
        _check_index(ms.segment_index, nseg, f"mutable_data_segments[{mi}].segment_index", "segment")
        size = prog.segments[ms.segment_index].size
        for j, o in enumerate(ms.offsets):
            if o > size:
                _fail(f"mutable_data_segments[{mi}].offsets[{j}]", f"offset {o} lies past the end of segment {ms.segment_index} ({size} bytes)")
    for ni, nd in enumerate(prog.named_data):
        _check_index(nd.segment_index, nseg, f"named_data[{ni}].segment_index", "segment")
        if not based:
            _no_base(f"named_data[{ni}]", f"named data {nd.key!r} (segments[{nd.segment_index}])")
    seen: set[str] = set()
    for pi, plan in enumerate(prog.execution_plan):
        if plan.name in seen:
            _fail(f"execution_plan[{pi}].name", f"duplicate method name {plan.name!r}")
        seen.add(plan.name)
        _verify_plan(prog, pi, plan, limits, based)


def _as_memoryview(data: bytes | bytearray | memoryview) -> memoryview:
    mv = data if isinstance(data, memoryview) else memoryview(data)
    if mv.ndim != 1 or mv.itemsize != 1:
        mv = mv.cast("B")
    return mv


def loads(data: bytes | bytearray | memoryview, *, limits: Limits | None = None) -> S.ProgramDef:
    """Parse and verify ``.pte`` bytes. Payloads in the result are views into ``data``.

    Raises:
        ProgramError: anything about the bytes is invalid; the message says where.
    """
    limits = limits or Limits()
    try:
        return _loads(data, limits, True)
    except (_Fallback, ProgramError, struct.error, IndexError, ValueError, OverflowError):
        # Something is unusual or wrong: decode again on the checked path, which raises the
        # error naming the place (or, for an unusual but valid program, returns it).
        pass
    return _loads(data, limits, False)


# DataSegment: offset, size (uint64); NamedData: key (string offset), segment_index (uint32).
_SEGMENT_LAYOUT = ((0, 8), (1, 8))
_NAMED_DATA_LAYOUT = ((0, 4), (1, 4))


def _fast_tables(r: _FlatReader, f: _Fast, t: _Table, slot: int) -> list[tuple[int, _VTable]]:
    """The tables of vector field ``slot`` of the root table ``t``, through ``f``."""
    p = r._field(t, slot, 4, "program")
    if not p:
        return []
    start, n = f.vector(p, 4)
    return f.tables(start, n)


def _fast_items(r: _FlatReader, f: _Fast, t: _Table, slot: int, kind: str) -> tuple | None:
    """The items of vector field ``slot`` of the root table ``t`` decoded by the C extension
    (``kind``: "segments" or "named_data", as the Python fast path below reads them); None
    where it is not built."""
    p = r._field(t, slot, 4, "program")
    if not p:
        return ()
    if f.c_decoder(kind) is None:  # (checked before the vector charges its length)
        return None
    start, n = f.vector(p, 4)
    return f.in_c(kind, start, n)


def _fast_fields(buf: memoryview, pos: int, vt: _VTable, layout: tuple[tuple[int, int], ...],
                 unpack: Callable[..., tuple]) -> tuple[int, ...]:
    """The scalar fields of one table by ``layout`` (0 where absent), all read by ``unpack``."""
    return tuple(unpack(buf, pos + o)[0] if o else 0 for o in vt.layout(layout))


def _loads(data: bytes | bytearray | memoryview, limits: Limits, fast: bool) -> S.ProgramDef:
    try:
        mv = _as_memoryview(data)
    except TypeError as exc:
        raise ProgramError(f"program data must be bytes-like, not {type(data).__name__}") from exc
    n = len(mv)
    if n < 8:
        _fail("header", f"{n} bytes is too short for a program (need at least 8)")
    ident = bytes(mv[4:8])
    if ident != FILE_IDENTIFIER:
        _fail("header", f"file identifier is {ident!r}, expected {FILE_IDENTIFIER!r}: not an ExecuTorch program")

    program_size = n
    segment_base = 0
    segment_data_size: int | None = None
    if n >= 16 and bytes(mv[8:12]) == EXTENDED_HEADER_MAGIC:
        length = _u32(mv, 12)[0]
        if length < _EH_MIN_LENGTH or 8 + length > n:
            _fail("extended_header.length", f"header length {length} is invalid for a {n}-byte file")
        program_size = _u64(mv, 16)[0]
        segment_base = _u64(mv, 24)[0]
        if length >= _EH_SEGMENT_DATA_SIZE_LENGTH:
            segment_data_size = _u64(mv, 32)[0]
        if not 8 + length <= program_size <= n:
            _fail("extended_header.program_size", f"program size {program_size} is outside the file ({n} bytes)")
        if segment_base and not program_size <= segment_base <= n:
            _fail("extended_header.segment_base_offset", f"segment base {segment_base} is outside [{program_size}, {n}]")
        if segment_data_size and segment_base + segment_data_size > n:
            _fail("extended_header.segment_data_size", f"segment data of {segment_data_size} bytes at {segment_base} runs past the end of the file ({n} bytes)")

    fb = mv[:program_size]
    r = _FlatReader(fb, limits.max_objects)
    f = _Fast(r) if fast else None
    root = _u32(fb, 0)[0]
    t = r.table(root, "program")

    segs = []
    seg_end = n if not segment_data_size else segment_base + segment_data_size
    if f is not None:  # an XNNPACK program has hundreds of segments and named data: path-free
        pairs = _fast_items(r, f, t, 4, "segments")
        if pairs is None:
            pairs = [_fast_fields(fb, pos, vt, _SEGMENT_LAYOUT, _u64) for pos, vt in _fast_tables(r, f, t, 4)]
    else:
        pairs = [(r.u64(st, 0, sp + ".offset"), r.u64(st, 1, sp + ".size")) for st, sp in r.tables(t, 4, "segments") or []]
    for i, (off, size) in enumerate(pairs):
        if not segment_base:
            # Like ExecuTorch: without a base the file is one flatbuffer and its segment table
            # is only an error when something reads a segment (checked in _verify).
            segs.append(S.DataSegment(off, size, fb[0:0]))
            continue
        start = segment_base + off
        if segs and off < segs[-1].offset + segs[-1].size:
            prev = segs[-1]
            _fail(f"segments[{i}]", f"segment at offset {off} overlaps or precedes segments[{len(segs) - 1}] "
                      f"(offsets {prev.offset}..{prev.offset + prev.size}); segments must be sorted by offset")
        if start + size > seg_end:
            _fail(f"segments[{i}]", f"segment of {size} bytes at offset {off} runs past the end of the segment data ({seg_end - segment_base} bytes)")
        segs.append(S.DataSegment(off, size, mv[start : start + size]))

    cbuf = []
    for bt, bp in r.tables(t, 2, "constant_buffer") or []:
        b = r.bytes(bt, 0, bp + ".storage")
        cbuf.append(S.Buffer(fb[0:0] if b is None else b))
    ddata = []
    for dt, dp in r.tables(t, 3, "backend_delegate_data") or []:
        b = r.bytes(dt, 0, dp + ".data")
        ddata.append(S.BackendDelegateInlineData(fb[0:0] if b is None else b))
    cst = r.sub_table(t, 5, "constant_segment")
    named = []
    if f is not None:
        keyed = _fast_items(r, f, t, 7, "named_data")
        if keyed is not None:
            named = [S.NamedData(key, seg) for key, seg in keyed]
        else:
            for pos, vt in _fast_tables(r, f, t, 7):
                o_key, o_seg = vt.layout(_NAMED_DATA_LAYOUT)
                if not o_key:
                    raise _Fallback  # the checked path names it
                named.append(S.NamedData(f.string(pos + o_key), _u32(fb, pos + o_seg)[0] if o_seg else 0))
    else:
        for nt, np_ in r.tables(t, 7, "named_data") or []:
            key = r.string(nt, 0, np_ + ".key")
            if key is None:
                _fail(np_ + ".key", "named data has no key")
            named.append(S.NamedData(key, r.u32(nt, 1, np_ + ".segment_index")))
    prog = S.ProgramDef(
        version=r.u32(t, 0, "version"),
        execution_plan=tuple(_plan(r, pt, pp, limits, f) for pt, pp in r.tables(t, 1, "execution_plan") or []),
        constant_buffer=tuple(cbuf),
        backend_delegate_data=tuple(ddata),
        segments=tuple(segs),
        constant_segment=None if cst is None else _subsegment(r, cst, "constant_segment"),
        mutable_data_segments=tuple(
            _subsegment(r, mt, mp) for mt, mp in r.tables(t, 6, "mutable_data_segments") or []
        ),
        named_data=tuple(named),
    )
    if f is not None:
        r.spend(f.spent, "program")
    _verify(prog, limits, based=bool(segment_base))
    return prog


def load(path: str | os.PathLike[str], *, limits: Limits | None = None) -> S.ProgramDef:
    """Memory-map and parse a ``.pte`` file. Payloads are views into the mapping.

    Raises:
        NotFoundError: the file does not exist or cannot be read.
        ProgramError: the file is not a valid program; the message starts with its path.
    """
    name = os.fspath(path)
    try:
        with open(name, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise ProgramError(f"{name}: header: file is empty")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError as exc:
        raise NotFoundError(f"{name}: no such file") from exc
    except IsADirectoryError as exc:
        raise NotFoundError(f"{name}: is a directory, not a .pte file") from exc
    except OSError as exc:
        raise NotFoundError(f"{name}: cannot read: {exc.strerror or exc}") from exc
    try:
        return loads(memoryview(mm), limits=limits)
    except ProgramError as exc:
        raise ProgramError(f"{name}: {exc.message}") from None
