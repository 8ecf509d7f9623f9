"""Read and verify an XNNPACK delegate blob: the ``XH00`` header, the ``XNNGraph``
flatbuffer (identifiers ``XN01`` and the legacy ``XN00``) and the constant data.

The blob is untrusted: every table, vector, union and index is bounds-checked (through the
format layer's verified flatbuffer reader) and every failure is a :class:`BackendError`
whose message names the delegate and the schema path of the bad thing, e.g.
``XNNGraph.xnodes[3] (XNNConv2d).input1_id: ...``. Nothing here allocates more than the
blob's own size: payloads are ``memoryview`` slices of the input.

Layout (ExecuTorch ``backends/xnnpack/serialization``)::

    0..4    unused (zeros)            4..8   magic b"XH00"
    8..10   header length (u16 LE)    10..14 flatbuffer offset (u32 LE)
    14..18  flatbuffer size (u32)     18..22 constant data offset (u32)
    22..30  constant data size (u64)
"""

from __future__ import annotations

import dataclasses
import struct
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from orchestra.errors import BackendError, Error, OrchestraError
from orchestra.program._reader import _Fallback, _FlatReader, _Table
from orchestra.program._schema import _fast_init

__all__ = [
    "DATATYPE_NAMES",
    "NODE_TYPES",
    "XH_MAGIC",
    "ConstantRef",
    "QuantParams",
    "XGraph",
    "XNode",
    "XValue",
    "parse_blob",
]

XH_MAGIC = b"XH00"
_XH_LENGTH = 30
_FILE_IDENTIFIERS = (b"XN01", b"XN00")
INVALID_ID = 0xFFFFFFFF
# ExecuTorch caps num_externs the same way (XNNCompiler.cpp).
MAX_EXTERNS = 4096
# XNNPACK's XNN_MAX_TENSOR_DIMS.
MAX_DIMS = 6
VALUE_FLAG_EXTERNAL_INPUT = 0x1
VALUE_FLAG_EXTERNAL_OUTPUT = 0x2

_f32 = struct.Struct("<f").unpack_from
_i16 = struct.Struct("<h").unpack_from

# enum XNNDatatype (schema.fbs): index = value.
DATATYPE_NAMES: tuple[str, ...] = (
    "invalid", "fp32", "fp16", "qint8", "quint8", "qint32", "qcint8", "qcint32", "qcint4",
    "qdint8", "qbint4", "qpint8", "int32", "pfp32", "bf16",
)

# Field layouts of the node tables. "u" uint32, "f" float32, "i" int32, "U" [uint32].
_N2X1 = (("input1_id", "u"), ("input2_id", "u"), ("output_id", "u"), ("flags", "u"))
_N1X1 = (("input_id", "u"), ("output_id", "u"), ("flags", "u"))
_CONV = tuple((n, "u") for n in (
    "padding_top", "padding_right", "padding_bottom", "padding_left", "kernel_height", "kernel_width",
    "subsampling_height", "subsampling_width", "dilation_height", "dilation_width", "group_input_channels",
    "group_output_channels", "groups", "adjustment_height", "adjustment_width", "input1_id", "filter_id",
    "bias_id", "output_id", "flags"))
_POOL = tuple((n, "u") for n in (
    "padding_top", "padding_right", "padding_bottom", "padding_left", "pooling_height", "pooling_width",
    "stride_height", "stride_width", "dilation_height", "dilation_width", "input_id", "output_id", "flags"))
_CAT = (("axis", "u"), ("input1_id", "u"), ("input2_id", "u"), ("input3_id", "u"), ("input4_id", "u"),
        ("output_id", "u"), ("flags", "u"), ("input5_id", "u"))

# union XNodeUnion (schema.fbs), in tag order (tag = index + 1): (name, field layout).
NODE_TYPES: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("XNNAdd", _N2X1),
    ("XNNFullyConnected", (("input1_id", "u"), ("filter_id", "u"), ("bias_id", "u"), ("output_id", "u"), ("flags", "u"))),
    ("XNNSoftmax", _N1X1),
    ("XNNSigmoid", _N1X1),
    ("XNNStaticTranspose", (("num_dims", "u"), ("perm", "U"), ("input_id", "u"), ("output_id", "u"), ("flags", "u"))),
    ("XNNClamp", _N1X1),
    ("XNNConv2d", _CONV),
    ("XNNDiv", _N2X1),
    ("XNNStaticResizeBilinear2D", (("new_height", "u"), ("new_width", "u"), ("input_id", "u"), ("output_id", "u"), ("flags", "u"))),
    ("XNNStaticConstantPad", (("pre_paddings", "U"), ("post_paddings", "U"), ("padding_value", "f"), ("input_id", "u"), ("output_id", "u"), ("flags", "u"))),
    ("XNNAvgPooling2d", _POOL),
    ("XNNMinimum", _N2X1),
    ("XNNDepthwiseConv2d", _CONV),
    ("XNNMaxPooling2d", _POOL),
    ("XNNMultiply", _N2X1),
    ("XNNSubtract", _N2X1),
    ("XNNFloor", _N1X1),
    ("XNNConvert", _N1X1),
    ("XNNGlobalAvgPooling2d", _N1X1),
    ("XNNStaticReshape", (("num_dims", "u"), ("new_shape", "U"), ("input_id", "u"), ("output_id", "u"), ("flags", "u"))),
    ("XNNArgMaxPooling2d", tuple((n, "u") for n in (
        "padding_top", "padding_right", "padding_bottom", "padding_left", "pooling_height", "pooling_width",
        "input_id", "output_value_id", "output_index_id", "flags"))),
    ("XNNSquareRoot", _N1X1),
    ("XNNCeiling", _N1X1),
    ("XNNHardswish", _N1X1),
    ("XNNLeakyReLU", (("negative_slope", "f"), ("input_id", "u"), ("output_id", "u"), ("flags", "u"))),
    ("XNNMaximum", _N2X1),
    ("XNNNegate", _N1X1),
    ("XNNSquare", _N1X1),
    ("XNNELU", (("alpha", "f"), ("input_id", "u"), ("output_id", "u"), ("flags", "u"))),
    ("XNNAbs", _N1X1),
    ("XNNPReLU", _N2X1),
    ("XNNConcatenate2", _CAT),
    ("XNNConcatenate3", _CAT),
    ("XNNConcatenate4", _CAT),
    ("XNNStaticSlice", (("num_dims", "u"), ("offsets", "U"), ("sizes", "U"), ("input_id", "u"), ("output_id", "u"), ("flags", "u"))),
    ("XNNScaledDotProductAttention", tuple((n, "u") for n in (
        "query_id", "key_id", "value_id", "scale_id", "mask_id", "output_id", "flags"))),
    ("XNNBatchMatrixMultiply", _N2X1),
    ("XNNConcatenate5", _CAT),
    ("XNNConvTranspose2d", _CONV),
    ("XNNReciprocalSquareRoot", _N1X1),
    ("XNNLog", _N1X1),
    ("XNNGelu", _N1X1),
    ("XNNTanh", _N1X1),
    ("XNNExp", _N1X1),
    ("XNNSin", _N1X1),
    ("XNNCopy", _N1X1),
    ("XNNCos", _N1X1),
)

# union XNNQuantParams, in tag order.
QUANT_PARAM_TYPES = ("PerChannelQuant", "PerTensorQuant", "PerTokenDynamicQuant", "PerChannelGroupQuant")


@dataclass(frozen=True, slots=True)
class QuantParams:
    """One value's quantization parameters, as serialized (checked for bounds, not meaning).

    ``kind`` is one of :data:`QUANT_PARAM_TYPES`. Fields a kind lacks are left at their
    defaults. ``scale`` holds the inline scales (per-tensor: one).
    """

    kind: str
    scale: tuple[float, ...] = ()
    zero_point: int = 0
    channel_dim: int = 0
    group_size: int = 0
    scale_buffer_idx: int = 0
    num_scales: int = 0
    num_nonbatch_dims: int = 0


@dataclass(frozen=True, slots=True)
class XValue:
    """One ``XNNTensorValue`` (or the tensor of an ``XNNQuantizedTensorValue``).

    ``id`` is the serialized id (``id_out``) nodes refer to; ``external_id`` indexes the
    DelegateCall's arguments when ``flags`` marks it an external input/output.
    """

    index: int
    id: int
    datatype: int
    dims: tuple[int, ...]
    constant_buffer_idx: int
    external_id: int
    flags: int
    dq_datatype: int = 0
    quant: QuantParams | None = None

    @property
    def datatype_name(self) -> str:
        return DATATYPE_NAMES[self.datatype] if 0 <= self.datatype < len(DATATYPE_NAMES) else f"<{self.datatype}>"

    @property
    def is_input(self) -> bool:
        return bool(self.flags & VALUE_FLAG_EXTERNAL_INPUT)

    @property
    def is_output(self) -> bool:
        return bool(self.flags & VALUE_FLAG_EXTERNAL_OUTPUT)


@dataclass(frozen=True, slots=True)
class XNode:
    """One ``XNode``: its union type name, decoded fields, debug handle and fused
    ``output_min_max`` (None when absent: no clamp)."""

    index: int
    type: str
    fields: dict[str, Any] = field(hash=False)
    debug_handle: int = 0
    output_min_max: tuple[float, float] | None = None


@dataclass(frozen=True, slots=True)
class ConstantRef:
    """Where one constant lives: ``named_key`` in the program's named data, or
    ``offset``/``size`` inside the blob's constant-data section (or ``inline`` bytes of the
    deprecated ``constant_buffer``)."""

    offset: int
    size: int
    named_key: str | None = None
    inline: memoryview | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class XGraph:
    """A verified ``XNNGraph`` plus the blob's constant-data section."""

    identifier: str
    version: str
    nodes: tuple[XNode, ...]
    values: tuple[XValue, ...]
    num_externs: int
    input_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    constants: tuple[ConstantRef, ...]  # index 0 is reserved (non-constant)
    constant_section: memoryview = field(repr=False, compare=False)
    uses_constant_buffer: bool = False

    def value_by_id(self) -> dict[int, XValue]:
        return {v.id: v for v in self.values}


for _cls in (QuantParams, XValue, XNode, ConstantRef):  # a graph has hundreds of each
    _fast_init(_cls)


class _Reader(_FlatReader):
    """The format layer's verified reader, plus the scalar widths the XNNGraph uses."""

    __slots__ = ()

    def f32(self, t: _Table, slot: int, path: str) -> float:
        p = self._field(t, slot, 4, path)
        return _f32(self.buf, p)[0] if p else 0.0

    def i16(self, t: _Table, slot: int, path: str) -> int:
        p = self._field(t, slot, 2, path)
        return _i16(self.buf, p)[0] if p else 0

    def has(self, t: _Table, slot: int) -> bool:
        e = 4 + 2 * slot
        return e + 2 <= t.vtsize and struct.unpack_from("<H", self.buf, t.vt + e)[0] != 0


def _fail(where: str, msg: str, code: Error = Error.InvalidProgram) -> BackendError:
    return BackendError(f"{where}: {msg}", code)


def parse_header(blob: memoryview, where: str) -> tuple[int, int, int, int] | None:
    """(flatbuffer offset, flatbuffer size, constant offset, constant size) of an XH00
    header, or None when the blob has no header (a bare flatbuffer)."""
    n = len(blob)
    if n < 8 or bytes(blob[4:8]) != XH_MAGIC:
        return None
    if n < _XH_LENGTH:
        raise _fail(where, f"XH00 header is truncated: the blob has {n} bytes, the header needs {_XH_LENGTH}")
    length = struct.unpack_from("<H", blob, 8)[0]
    if length < _XH_LENGTH:
        raise _fail(where, f"XH00 header length {length} is smaller than {_XH_LENGTH}")
    fb_off, fb_size, cd_off = struct.unpack_from("<III", blob, 10)
    cd_size = struct.unpack_from("<Q", blob, 22)[0]
    if fb_size < 8:
        raise _fail(where, f"XH00 header: flatbuffer size {fb_size} is too small (minimum 8)")
    if fb_off > n or fb_size > n - fb_off:
        raise _fail(where, f"XH00 header: flatbuffer offset {fb_off} + size {fb_size} run past the blob ({n} bytes)")
    if cd_off > n or cd_size > n - cd_off:
        raise _fail(where, f"XH00 header: constant data offset {cd_off} + size {cd_size} run past the blob ({n} bytes)")
    if cd_off < fb_off or cd_off - fb_off < fb_size:
        raise _fail(where, f"XH00 header: constant data (offset {cd_off}) overlaps the flatbuffer "
                           f"(offset {fb_off}, size {fb_size})")
    return fb_off, fb_size, cd_off, cd_size


def _u32s(r: _Reader, t: _Table, slot: int, path: str) -> tuple[int, ...]:
    v = r.scalars(t, slot, "I", 4, path)
    return () if v is None else tuple(v)


def _quant(r: _Reader, qt: _Table, path: str) -> QuantParams | None:
    tag, v = r.union(qt, 1, path + ".quant_params")
    if tag == 0:
        return None
    if tag > len(QUANT_PARAM_TYPES):
        raise _fail("", f"{path}.quant_params: unknown quantization parameter type tag {tag}")
    kind = QUANT_PARAM_TYPES[tag - 1]
    p = f"{path}.quant_params ({kind})"
    if v is None:
        raise _fail("", f"{p}: the parameters are missing")
    if kind == "PerChannelQuant":
        sc = r.scalars(v, 0, "f", 4, p + ".scale")
        return QuantParams(kind, tuple(sc or ()), channel_dim=r.i32(v, 1, p + ".channel_dim"),
                           scale_buffer_idx=r.u32(v, 2, p + ".scale_buffer_idx"), num_scales=r.u32(v, 3, p + ".num_scales"))
    if kind == "PerTensorQuant":
        return QuantParams(kind, (r.f32(v, 0, p + ".scale"),), zero_point=r.i32(v, 1, p + ".zero_point"))
    if kind == "PerTokenDynamicQuant":
        return QuantParams(kind, num_nonbatch_dims=r.i32(v, 0, p + ".num_nonbatch_dims"))
    sc = r.scalars(v, 0, "f", 4, p + ".scale")
    return QuantParams(kind, tuple(sc or ()), channel_dim=r.i32(v, 1, p + ".channel_dim"),
                       group_size=r.i32(v, 2, p + ".group_size"), scale_buffer_idx=r.u32(v, 4, p + ".scale_buffer_idx"),
                       num_scales=r.u32(v, 5, p + ".num_scales"))


def _value(r: _Reader, index: int, t: _Table, path: str) -> XValue:
    tag, v = r.union(t, 0, path + ".xvalue_union")
    if tag not in (1, 2):
        raise _fail("", f"{path}: unknown value type tag {tag} (XValueUnion has XNNTensorValue=1, "
                        f"XNNQuantizedTensorValue=2)", Error.NotSupported)
    if v is None:
        raise _fail("", f"{path}: the value's table is missing")
    quant = None
    if tag == 2:
        qpath = path + " (XNNQuantizedTensorValue)"
        quant = _quant(r, v, qpath)
        tv = r.sub_table(v, 0, qpath + ".tensor_value")
        if tv is None:
            raise _fail("", f"{qpath}.tensor_value is missing")
        v, path = tv, qpath + ".tensor_value"
    dims = _u32s(r, v, 2, path + ".dims")
    num_dims = r.u32(v, 1, path + ".num_dims")
    if num_dims != len(dims):
        raise _fail("", f"{path}: num_dims {num_dims} differs from len(dims) {len(dims)}")
    if len(dims) > MAX_DIMS:
        raise _fail("", f"{path}: {len(dims)} dims, XNNPACK allows at most {MAX_DIMS}")
    return XValue(
        index=index, id=r.u32(v, 6, path + ".id_out"), datatype=r.i16(v, 0, path + ".datatype"), dims=dims,
        constant_buffer_idx=r.u32(v, 3, path + ".constant_buffer_idx"), external_id=r.u32(v, 4, path + ".external_id"),
        flags=r.u32(v, 5, path + ".flags"), dq_datatype=r.i16(v, 7, path + ".dq_datatype"), quant=quant)


def _node(r: _Reader, index: int, t: _Table, path: str) -> XNode:
    tag, v = r.union(t, 0, path + ".xnode_union")
    if tag == 0 or tag > len(NODE_TYPES):
        raise _fail("", f"{path}: unknown node type tag {tag} (this reader knows tags 1..{len(NODE_TYPES)})",
                    Error.NotSupported)
    name, layout = NODE_TYPES[tag - 1]
    p = f"{path} ({name})"
    if v is None:
        raise _fail("", f"{p}: the node's table is missing")
    fields: dict[str, Any] = {}
    for slot, (fname, kind) in enumerate(layout):
        fp = f"{p}.{fname}"
        if kind == "u":
            fields[fname] = r.u32(v, slot, fp)
        elif kind == "f":
            fields[fname] = r.f32(v, slot, fp)
        elif kind == "i":
            fields[fname] = r.i32(v, slot, fp)
        else:
            fields[fname] = _u32s(r, v, slot, fp)
    mm = r.sub_table(t, 3, path + ".output_min_max")
    omm = None if mm is None else (r.f32(mm, 0, path + ".output_min_max.output_min"),
                                   r.f32(mm, 1, path + ".output_min_max.output_max"))
    return XNode(index, name, fields, r.u32(t, 2, path + ".debug_handle"), omm)


# -- the fast path ------------------------------------------------------------------------
# Values and nodes are most of a graph. ``_Fast`` decodes them with every check of the
# checked decoders above (table, vtable and field bounds and alignment, vector bounds, union
# tags, dims, the object budget charged the same way) but builds no schema path and reads a
# table's whole vtable in one unpack: on anything unusual it raises ``_Fallback`` and
# ``parse_blob`` decodes the graph again on the checked path, whose error names the place.
# Of the quantization parameters, the per-tensor and per-channel kinds are decoded here.
_i32s = struct.Struct("<i").unpack_from
_u64 = struct.Struct("<Q").unpack_from
_hh = struct.Struct("<HH").unpack_from
_u32v = struct.Struct("<I").unpack_from
_u8s = struct.Struct("<B").unpack_from
_vt_structs = tuple(struct.Struct(f"<{n}H") for n in range(64))


class _Fast:
    __slots__ = ("r", "buf", "end")

    def __init__(self, r: _Reader) -> None:
        self.r, self.buf, self.end = r, r.buf, r.end

    def table(self, pos: int) -> tuple[int, int, tuple[int, ...], int, int]:
        """(position, object size, field offsets, vtable position, vtable size)."""
        r, buf, end = self.r, self.buf, self.end
        r.budget -= 1
        if r.budget < 0 or pos < 0 or pos + 4 > end or pos & 3:
            raise _Fallback
        vt = pos - _i32s(buf, pos)[0]
        if vt < 0 or vt + 4 > end or vt & 1:
            raise _Fallback
        vtsize, objsize = _hh(buf, vt)
        if vtsize < 4 or vtsize & 1 or vt + vtsize > end or objsize < 4 or pos + objsize > end:
            raise _Fallback
        n = (vtsize - 4) >> 1
        offs = _vt_structs[n].unpack_from(buf, vt + 4) if n < 64 else struct.unpack_from(f"<{n}H", buf, vt + 4)
        return pos, objsize, offs, vt, vtsize

    def field(self, t: tuple[int, int, tuple[int, ...], int, int], slot: int, size: int) -> int:
        offs = t[2]
        o = offs[slot] if slot < len(offs) else 0
        if o == 0:
            return 0
        if o < 4 or o + size > t[1]:
            raise _Fallback
        return t[0] + o

    def ref(self, p: int) -> int:
        target = p + _u32v(self.buf, p)[0]
        if target + 4 > self.end:
            raise _Fallback
        return target

    def vector(self, t: tuple[int, int, tuple[int, ...], int, int], slot: int) -> tuple[int, int]:
        """(start, length) of a vector of 4-byte elements, (0, 0) when absent; each element
        charged to the object budget."""
        p = self.field(t, slot, 4)
        if not p:
            return 0, 0
        v = self.ref(p)
        n = _u32v(self.buf, v)[0]
        if v & 3 or v + 4 + 4 * n > self.end:
            raise _Fallback
        self.r.budget -= n
        if self.r.budget < 0:
            raise _Fallback
        return v + 4, n

    def u32s(self, t: tuple[int, int, tuple[int, ...], int, int], slot: int) -> tuple[int, ...]:
        start, n = self.vector(t, slot)
        return struct.unpack_from(f"<{n}I", self.buf, start) if n else ()

    def scalar(self, t: tuple[int, int, tuple[int, ...], int, int], slot: int, unpack: Callable[..., tuple],
               size: int, default: Any = 0) -> Any:
        p = self.field(t, slot, size)
        return unpack(self.buf, p)[0] if p else default

    def tables(self, t: tuple[int, int, tuple[int, ...], int, int], slot: int) -> list[int]:
        """Positions of a vector of tables' elements (each table still to be read)."""
        start, n = self.vector(t, slot)
        return [self.ref(start + 4 * i) for i in range(n)]

    def scalars(self, t: tuple[int, int, tuple[int, ...], int, int], layout: tuple[Any, ...]) -> list[Any]:
        """Fields 0.. of ``t`` by ``layout``: (size, unpack, default) per scalar field,
        None for a [uint32] vector field."""
        pos, objsize, offs = t[0], t[1], t[2]
        n, buf = len(offs), self.buf
        out: list[Any] = []
        for slot, spec in enumerate(layout):
            if spec is None:
                out.append(self.u32s(t, slot))
                continue
            o = offs[slot] if slot < n else 0
            if o == 0:
                out.append(spec[2])
            elif o < 4 or o + spec[0] > objsize:
                raise _Fallback
            else:
                out.append(spec[1](buf, pos + o)[0])
        return out

    def union(self, t: tuple[int, int, tuple[int, ...], int, int], slot: int) -> tuple[int, Any]:
        tag = self.scalar(t, slot, _u8s, 1)
        if tag == 0:
            return 0, None
        p = self.field(t, slot + 1, 4)
        return tag, (self.table(self.ref(p)) if p else None)

    def value(self, index: int, pos: int) -> XValue:
        t = self.table(pos)
        tag, v = self.union(t, 0)
        if v is None or tag not in (1, 2):
            raise _Fallback
        quant = None
        if tag == 2:  # XNNQuantizedTensorValue: its parameters, then its tensor_value
            qtag, q = self.union(v, 1)
            if qtag:
                if q is None or qtag > 2:  # the rarer kinds: the checked decoder reads them
                    raise _Fallback
                if qtag == 2:  # PerTensorQuant
                    scale, zero_point = self.scalars(q, _PER_TENSOR_LAYOUT)
                    quant = QuantParams("PerTensorQuant", (scale,), zero_point=zero_point)
                else:  # PerChannelQuant
                    start, n = self.vector(q, 0)
                    quant = QuantParams("PerChannelQuant", struct.unpack_from(f"<{n}f", self.buf, start) if n else (),
                                        channel_dim=self.scalar(q, 1, _i32s, 4), scale_buffer_idx=self.scalar(q, 2, _u32v, 4),
                                        num_scales=self.scalar(q, 3, _u32v, 4))
            p = self.field(v, 0, 4)
            if not p:
                raise _Fallback
            v = self.table(self.ref(p))
        datatype, num_dims, dims, cbi, external_id, flags, id_out, dq = self.scalars(v, _VALUE_LAYOUT)
        if num_dims != len(dims) or len(dims) > MAX_DIMS:
            raise _Fallback
        return XValue(index, id_out, datatype, dims, cbi, external_id, flags, dq, quant)

    def constant(self, pos: int, section: int) -> ConstantRef:
        """One ``ConstantDataOffset``: offset, size, named_key (a ``section``-byte constant
        section holds the unnamed ones)."""
        t = self.table(pos)
        off, size = self.scalar(t, 0, _u64, 8), self.scalar(t, 1, _u64, 8)
        key = None
        p = self.field(t, 2, 4)
        if p:
            v = self.ref(p)
            n = _u32v(self.buf, v)[0]
            start = v + 4
            if v & 3 or start + n >= self.end or self.buf[start + n] != 0:
                raise _Fallback
            self.r.budget -= 1
            if self.r.budget < 0:
                raise _Fallback
            try:
                key = str(self.buf[start:start + n], "utf-8") or None
            except UnicodeDecodeError:
                raise _Fallback from None
        if key is None and (off > section or size > section - off):
            raise _Fallback
        return ConstantRef(off, size, key)

    def node(self, index: int, pos: int) -> XNode:
        t = self.table(pos)
        tag, v = self.union(t, 0)
        if tag == 0 or tag > len(NODE_TYPES) or v is None:
            raise _Fallback
        name, names, layout = _NODE_LAYOUTS[tag - 1]
        fields = dict(zip(names, self.scalars(v, layout)))
        p = self.field(t, 3, 4)
        omm = None
        if p:
            omm = tuple(self.scalars(self.table(self.ref(p)), (_F32, _F32)))
        return XNode(index, name, fields, self.scalar(t, 2, _u32v, 4), omm)


_U32, _F32, _I32, _I16 = (4, _u32v, 0), (4, _f32, 0.0), (4, _i32s, 0), (2, _i16, 0)
# XNNTensorValue: datatype, num_dims, dims, constant_buffer_idx, external_id, flags, id_out, dq_datatype
_VALUE_LAYOUT = (_I16, _U32, None, _U32, _U32, _U32, _U32, _I16)
# PerTensorQuant: scale, zero_point.
_PER_TENSOR_LAYOUT = (_F32, _I32)
# Per node type: (the value-id fields its node reads, those it writes), in layout order.
NODE_VALUE_FIELDS: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]] = MappingProxyType({
    name: (tuple(f for f, _ in layout if f.endswith("_id") and not f.startswith("output")),
           tuple(f for f, _ in layout if f.endswith("_id") and f.startswith("output")))
    for name, layout in NODE_TYPES})
_NODE_LAYOUTS = tuple((name, tuple(f for f, _ in layout),
                       tuple({"u": _U32, "f": _F32, "i": _I32}.get(kind) for _, kind in layout))
                      for name, layout in NODE_TYPES)


# The node layouts as the C decoder takes them: one letter per field ("u" uint32, "f" float32,
# "i" int32, "U" [uint32]), by union tag.
_LAYOUT_CODES = tuple("".join(kind for _, kind in layout) for _, layout in NODE_TYPES)
# What the C decoder builds its objects from (as _Fast.value and _Fast.node make them): each class
# with its fields in order, the quantization kinds of the union's tags 1 and 2 (per channel: its
# zero point 0; per tensor: channel_dim, scale_buffer_idx and num_scales 0), and each node type's
# name and field names by union tag.
_MAKERS = tuple((cls, tuple(f.name for f in dataclasses.fields(cls))) for cls in (XValue, XNode, QuantParams)) + (
    ("PerChannelQuant", "PerTensorQuant"), tuple((name, names) for name, names, _ in _NODE_LAYOUTS))

# ... and the constants (XH00 blobs: offset, size, named key; never inline bytes).
_CONSTANT_MAKER = (ConstantRef, tuple(f.name for f in dataclasses.fields(ConstantRef)))


def _setup_native_xdecode():  # noqa: ANN202 - the module, or None
    """``orchestra.backends.xnnpack._xdecode`` (optional C extension: ``_Fast``'s decoding of
    the values, nodes and constants in C, the same checks and budget charge); None where it is
    not built."""
    try:
        from . import _xdecode
    except ImportError:
        return None
    return _xdecode


# The C decoder, or None: the Python fast path (tests set None to compare the two).
_native_xdecode = _setup_native_xdecode()


def parse_blob(blob: memoryview, where: str, *, max_objects: int = 10_000_000) -> XGraph:
    """Parses and verifies a delegate blob.

    Raises:
        BackendError: the header, flatbuffer or a cross reference is invalid (code
            InvalidProgram), the identifier is not XN00/XN01 or a node/value type is unknown
            (DelegateInvalidCompatibility / NotSupported). The message starts with ``where``.
    """
    blob = memoryview(blob).cast("B") if not isinstance(blob, memoryview) or blob.format != "B" else blob
    native = _native_xdecode
    if native is not None and blob.c_contiguous and sys.byteorder == "little":
        # the whole blob in one C call (header, identifier, root, values, nodes, ids,
        # constants); None for anything the code below would raise for or fall back on, and
        # for a blob without the XH00 header: that code then decodes it and names the place.
        got = native.blob(blob, max_objects, _LAYOUT_CODES, _MAKERS, _CONSTANT_MAKER)
        if got is not None:
            ident_s, version, values, nodes, num_externs, input_ids, output_ids, consts, cd_off, cd_size = got
            if num_externs > MAX_EXTERNS:
                raise _fail(where, f"XNNGraph.num_externs {num_externs} exceeds {MAX_EXTERNS} (corrupt graph?)")
            return XGraph(ident_s, version, nodes, values, num_externs, input_ids, output_ids, consts,
                          blob[cd_off:cd_off + cd_size], False)
    hdr = parse_header(blob, where)
    if hdr is None:
        fb, section = blob, blob[0:0]
    else:
        fb_off, fb_size, cd_off, cd_size = hdr
        fb, section = blob[fb_off:fb_off + fb_size], blob[cd_off:cd_off + cd_size]
    if len(fb) < 8:
        raise _fail(where, f"the XNNGraph flatbuffer is truncated ({len(fb)} bytes)")
    ident = bytes(fb[4:8])
    if ident not in _FILE_IDENTIFIERS:
        raise _fail(where, f"XNNGraph file identifier {ident!r} is not XN01 or XN00 (not an XNNPACK delegate blob, "
                           f"or a newer format)", Error.DelegateInvalidCompatibility)
    try:
        try:
            num_externs, *rest = _decode(_Reader(fb, max_objects), hdr is None, section, fast=True)
        except _Fallback:  # decoded again on the checked path, whose error names the place
            num_externs, *rest = _decode(_Reader(fb, max_objects), hdr is None, section, fast=False)
    except BackendError as exc:
        raise BackendError(f"{where}: {exc.message.lstrip(': ')}", exc.code) from None
    except OrchestraError as exc:
        raise BackendError(f"{where}: {exc.message}", Error.InvalidProgram) from None
    if num_externs > MAX_EXTERNS:
        raise _fail(where, f"XNNGraph.num_externs {num_externs} exceeds {MAX_EXTERNS} (corrupt graph?)")
    version, nodes, values, input_ids, output_ids, consts = rest
    return XGraph(ident.decode(), version, nodes, values, num_externs, input_ids, output_ids, consts, section,
                  hdr is None)


def _decode(r: _Reader, uses_cb: bool, section: memoryview, *, fast: bool) -> tuple[Any, ...]:
    """(num_externs, version, nodes, values, input_ids, output_ids, constants) of the graph;
    ``fast``: values, nodes and constant_data through ``_Fast`` (raising ``_Fallback`` on
    anything it does not take)."""
    root = r.table(struct.unpack_from("<I", r.buf, 0)[0], "XNNGraph")
    version = r.string(root, 0, "XNNGraph.version") or ""
    native = _native_xdecode if fast and r.buf.c_contiguous and sys.byteorder == "little" else None
    if native is not None:  # the same decoding in C
        got = native.graph(r.buf, r.end, root.pos, r.budget, _LAYOUT_CODES, _MAKERS)
        if got is None:
            raise _Fallback
        values, nodes, spent = got  # XValue and XNode objects
        r.budget -= spent
    elif fast:
        f = _Fast(r)
        rt = f.table(root.pos)
        r.budget += 1  # the root, charged by r.table already
        values = tuple(f.value(i, p) for i, p in enumerate(f.tables(rt, 2)))
        nodes = tuple(f.node(i, p) for i, p in enumerate(f.tables(rt, 1)))
    else:
        values = tuple(_value(r, i, t, p) for i, (t, p) in enumerate(r.tables(root, 2, "XNNGraph.xvalues") or ()))
        nodes = tuple(_node(r, i, t, p) for i, (t, p) in enumerate(r.tables(root, 1, "XNNGraph.xnodes") or ()))
    num_externs = r.u32(root, 3, "XNNGraph.num_externs")
    input_ids = _u32s(r, root, 4, "XNNGraph.input_ids")
    output_ids = _u32s(r, root, 5, "XNNGraph.output_ids")
    consts: list[ConstantRef] = []
    # As ExecuTorch: a blob without an XH00 header keeps its constants in the deprecated
    # constant_buffer; with a header, constant_data points into the constant section or
    # at named data.
    if uses_cb:
        for t, p in r.tables(root, 6, "XNNGraph.constant_buffer") or ():
            data = r.bytes(t, 0, p + ".storage")
            consts.append(ConstantRef(0, 0 if data is None else len(data), None, data if data is not None else r.buf[0:0]))
    elif native is not None:
        got = native.constants(r.buf, r.end, root.pos, r.budget, len(section))
        if got is None:
            raise _Fallback
        consts = [ConstantRef(*c) for c in got[0]]
        r.budget -= got[1]
    elif fast:
        consts = [f.constant(p, len(section)) for p in f.tables(rt, 8)]
    else:
        for t, p in r.tables(root, 8, "XNNGraph.constant_data") or ():
            off, size = r.u64(t, 0, p + ".offset"), r.u64(t, 1, p + ".size")
            key = (r.string(t, 2, p + ".named_key") if r.has(t, 2) else None) or None
            if key is None and (off > len(section) or size > len(section) - off):
                raise _fail("", f"{p}: offset {off} + size {size} run past the blob's constant data "
                                f"({len(section)} bytes)")
            consts.append(ConstantRef(off, size, key))
    return num_externs, version, nodes, values, input_ids, output_ids, tuple(consts)


def constant_bytes(graph: XGraph, value: XValue, named_data: Callable[[str], memoryview] | None, where: str,
                   buffer: int | None = None) -> memoryview:
    """The bytes of a constant value (zero copy): from the blob's constant section, the
    deprecated inline buffer or the program's named data. ``buffer``: the constant at that
    index instead of the value's own (a per-channel quantization's scale buffer), named in
    errors as the value's."""
    idx = value.constant_buffer_idx if buffer is None else buffer

    def p() -> str:  # formatted only into an error message
        return f"{where}: XNNGraph.xvalues[{value.index}] (id {value.id})"

    if idx >= len(graph.constants):
        raise _fail(p(), f"constant_buffer_idx {idx} is out of range (the graph has {len(graph.constants)} constants)")
    ref = graph.constants[idx]
    if ref.inline is not None:
        return ref.inline
    if ref.named_key is not None:
        if named_data is None:
            raise _fail(p(), f"constant {idx} lives in the program's named data (key {ref.named_key!r}) but no named "
                             "data is available to this backend", Error.NotFound)
        try:
            data = named_data(ref.named_key)
        except OrchestraError as exc:
            raise _fail(p(), f"constant {idx}: {exc.message}", Error.NotFound) from None
        if type(data) is not memoryview:
            data = memoryview(data)
        if data.format != "B":
            data = data.cast("B")
        if ref.size > len(data):
            raise _fail(p(), f"constant {idx} (named key {ref.named_key!r}) declares {ref.size} bytes, the named data "
                             f"holds {len(data)}")
        # (the program's own view where the constant is the whole entry: no new view to keep alive)
        return data[:ref.size] if ref.size and ref.size != len(data) else data
    return graph.constant_section[ref.offset:ref.offset + ref.size]
