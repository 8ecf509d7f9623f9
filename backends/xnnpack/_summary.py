"""A short description of an XNNPACK delegate blob (for ``orchestra inspect``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

from ._blob import DATATYPE_NAMES, parse_blob

__all__ = ["XnnpackSummary", "summarize"]

_ITEMSIZE = MappingProxyType({"fp32": 4, "fp16": 2, "bf16": 2, "int32": 4, "qint32": 4, "qcint32": 4, "qint8": 1,
                              "quint8": 1, "qcint8": 1, "qdint8": 1})


@dataclass(frozen=True, slots=True)
class XnnpackSummary:
    """What an XNNPACK delegate holds.

    Attributes:
        identifier: the flatbuffer's file identifier (``XN01``, legacy ``XN00``).
        node_types: (node type, count), most frequent first.
        tensors: values in the graph; ``constants``: how many of them are constants.
        constant_bytes: bytes of constant data the graph refers to.
        constants_in: where constants live: ``"named data"``, ``"blob"``, ``"inline buffer"``
            (deprecated), a combination joined by ``" + "``, or ``"none"``.
        datatypes: the value datatypes present, e.g. ``("fp32",)``.
    """

    identifier: str
    node_types: tuple[tuple[str, int], ...]
    tensors: int
    constants: int
    constant_bytes: int
    constants_in: str
    datatypes: tuple[str, ...]

    def line(self) -> str:
        """One line for a terminal."""
        nodes = ", ".join(f"{t.removeprefix('XNN')} x{n}" for t, n in self.node_types)
        return (f"XNNPACK graph {self.identifier}: {sum(n for _, n in self.node_types)} nodes ({nodes}); "
                f"{self.tensors} tensors, {self.constants} constant ({self.constant_bytes} bytes in "
                f"{self.constants_in}); datatypes {', '.join(self.datatypes)}")


def summarize(blob: memoryview | bytes, named_data: Callable[[str], memoryview] | None = None,
              where: str = "XNNPACK delegate") -> XnnpackSummary:
    """Reads (and verifies) an XNNPACK delegate blob and describes it.

    Raises:
        BackendError: the blob is not a valid XNNPACK delegate.
    """
    g = parse_blob(memoryview(blob), where)
    counts: dict[str, int] = {}
    for n in g.nodes:
        counts[n.type] = counts.get(n.type, 0) + 1
    places: set[str] = set()
    nbytes = 0
    consts = 0
    for v in g.values:
        if not v.constant_buffer_idx or v.constant_buffer_idx >= len(g.constants):
            continue
        consts += 1
        ref = g.constants[v.constant_buffer_idx]
        if ref.inline is not None:
            places.add("inline buffer")
            nbytes += len(ref.inline)
        elif ref.named_key is not None:
            places.add("named data")
            nbytes += ref.size or math.prod(v.dims) * _ITEMSIZE.get(v.datatype_name, 4)
        else:
            places.add("blob")
            nbytes += ref.size
    dts = sorted({DATATYPE_NAMES[v.datatype] if 0 <= v.datatype < len(DATATYPE_NAMES) else str(v.datatype)
                  for v in g.values})
    return XnnpackSummary(g.identifier, tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))), len(g.values),
                          consts, nbytes, " + ".join(sorted(places)) or "none", tuple(dts))
