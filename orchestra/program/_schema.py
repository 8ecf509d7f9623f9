"""Frozen dataclasses that mirror ExecuTorch's program schema (``schema/program.fbs``).

Names and field order follow the schema, so a reader of ExecuTorch's docs finds the same
things here. Byte payloads (constant buffers, delegate blobs, segment data) are
``memoryview``s into the bytes the program was loaded from: loading copies no weight.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Union

__all__ = [
    "AllocationDetails",
    "BackendDelegate",
    "BackendDelegateDataReference",
    "BackendDelegateInlineData",
    "Bool",
    "BoolList",
    "Buffer",
    "Chain",
    "CompileSpec",
    "ContainerMetadata",
    "DataLocation",
    "DataSegment",
    "DelegateCall",
    "Double",
    "DoubleList",
    "EValue",
    "ExecutionPlan",
    "ExtraTensorInfo",
    "FreeCall",
    "Frame",
    "FrameList",
    "Instruction",
    "InstructionArguments",
    "Int",
    "IntList",
    "JumpFalseCall",
    "KernelCall",
    "KernelTypes",
    "MoveCall",
    "NamedData",
    "Null",
    "Operator",
    "OptionalTensorList",
    "ProgramDef",
    "String",
    "SubsegmentOffsets",
    "Tensor",
    "TensorDataLocation",
    "TensorList",
    "TensorShapeDynamism",
]


class TensorShapeDynamism(enum.IntEnum):
    """How a tensor's shape may change at run time."""

    STATIC = 0
    DYNAMIC_BOUND = 1  # sizes are upper bounds; memory is planned for them
    DYNAMIC_UNBOUND = 2  # sizes are meaningless; memory comes at run time


class TensorDataLocation(enum.IntEnum):
    """Where a tensor's data is stored."""

    CONSTANT_SEGMENT = 0
    EXTERNAL = 1


class DataLocation(enum.IntEnum):
    """Where a delegate's processed blob is stored."""

    INLINE = 0  # Program.backend_delegate_data
    SEGMENT = 1  # Program.segments


@dataclass(frozen=True, slots=True)
class ContainerMetadata:
    encoded_inp_str: str | None = None
    encoded_out_str: str | None = None


@dataclass(frozen=True, slots=True)
class Null:
    pass


@dataclass(frozen=True, slots=True)
class AllocationDetails:
    """Where a planned (non-constant) tensor lives: arena ``memory_id`` at ``offset``."""

    memory_id: int
    memory_offset_low: int
    memory_offset_high: int = 0

    @property
    def offset(self) -> int:
        """The full 64-bit byte offset into the arena."""
        return (self.memory_offset_high << 32) | self.memory_offset_low


@dataclass(frozen=True, slots=True)
class ExtraTensorInfo:
    mutable_data_segments_idx: int = 0
    fully_qualified_name: str | None = None
    location: int = TensorDataLocation.CONSTANT_SEGMENT


@dataclass(frozen=True, slots=True)
class Tensor:
    scalar_type: int
    storage_offset: int
    sizes: tuple[int, ...]
    dim_order: tuple[int, ...]
    requires_grad: bool = False
    data_buffer_idx: int = 0
    allocation_info: AllocationDetails | None = None
    layout: int = 0
    shape_dynamism: int = TensorShapeDynamism.STATIC
    extra_tensor_info: ExtraTensorInfo | None = None

    @property
    def is_constant(self) -> bool:
        """True when the data comes from the program (constant buffer or segment)."""
        return self.data_buffer_idx > 0 and self.allocation_info is None


@dataclass(frozen=True, slots=True)
class Int:
    int_val: int


@dataclass(frozen=True, slots=True)
class Bool:
    bool_val: bool


@dataclass(frozen=True, slots=True)
class Double:
    double_val: float


@dataclass(frozen=True, slots=True)
class String:
    string_val: str | None


@dataclass(frozen=True, slots=True)
class IntList:
    """A list of ints; ExecuTorch stores SymInt lists as value indices of Int EValues."""

    items: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DoubleList:
    items: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class BoolList:
    items: tuple[bool, ...]


@dataclass(frozen=True, slots=True)
class TensorList:
    """Value indices of the tensors in the list."""

    items: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OptionalTensorList:
    """Value indices of the tensors (or None values) in the list."""

    items: tuple[int, ...]


KernelTypes = Union[
    Null, Int, Bool, Double, Tensor, String, IntList, DoubleList, BoolList, TensorList,
    OptionalTensorList,
]
# Union tags, in schema order (0 is NONE).
KERNEL_TYPES: tuple[type, ...] = (
    Null, Int, Bool, Double, Tensor, String, IntList, DoubleList, BoolList, TensorList,
    OptionalTensorList,
)


@dataclass(frozen=True, slots=True)
class EValue:
    val: KernelTypes | None


@dataclass(frozen=True, slots=True)
class Operator:
    name: str
    overload: str = ""

    @property
    def qualified_name(self) -> str:
        """``namespace::name.overload``, the key kernels are registered under."""
        return f"{self.name}.{self.overload}" if self.overload else self.name


@dataclass(frozen=True, slots=True)
class KernelCall:
    op_index: int
    args: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DelegateCall:
    delegate_index: int
    args: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MoveCall:
    move_from: int
    move_to: int


@dataclass(frozen=True, slots=True)
class JumpFalseCall:
    cond_value_index: int
    destination_instruction: int


@dataclass(frozen=True, slots=True)
class FreeCall:
    value_index: int


InstructionArguments = Union[KernelCall, DelegateCall, MoveCall, JumpFalseCall, FreeCall]
INSTRUCTION_TYPES: tuple[type, ...] = (KernelCall, DelegateCall, MoveCall, JumpFalseCall, FreeCall)


@dataclass(frozen=True, slots=True)
class Instruction:
    instr_args: InstructionArguments | None


@dataclass(frozen=True, slots=True)
class Frame:
    filename: str | None = None
    lineno: int = 0
    name: str | None = None
    context: str | None = None


@dataclass(frozen=True, slots=True)
class FrameList:
    items: tuple[Frame, ...] = ()


@dataclass(frozen=True, slots=True)
class BackendDelegateDataReference:
    location: int
    index: int


@dataclass(frozen=True, slots=True)
class CompileSpec:
    key: str
    value: bytes


@dataclass(frozen=True, slots=True)
class BackendDelegate:
    id: str
    processed: BackendDelegateDataReference
    compile_specs: tuple[CompileSpec, ...] = ()


@dataclass(frozen=True, slots=True)
class Chain:
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    instructions: tuple[Instruction, ...]
    stacktrace: tuple[FrameList, ...] | None = None


@dataclass(frozen=True, slots=True)
class ExecutionPlan:
    name: str
    container_meta_type: ContainerMetadata | None
    values: tuple[EValue, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    chains: tuple[Chain, ...]
    operators: tuple[Operator, ...]
    delegates: tuple[BackendDelegate, ...]
    non_const_buffer_sizes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Buffer:
    """Legacy inline constant data (``Program.constant_buffer``)."""

    storage: memoryview


@dataclass(frozen=True, slots=True)
class BackendDelegateInlineData:
    data: memoryview


@dataclass(frozen=True, slots=True)
class DataSegment:
    """A segment after the flatbuffer. ``offset`` is relative to the segment base.

    ``data`` holds the segment's bytes (a view into the loaded file). When writing, a
    segment goes at its ``offset`` if that keeps segments in order, otherwise at the next
    multiple of the segment alignment.
    """

    offset: int
    size: int
    data: memoryview = field(repr=False)


@dataclass(frozen=True, slots=True)
class SubsegmentOffsets:
    segment_index: int
    offsets: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class NamedData:
    key: str
    segment_index: int


@dataclass(frozen=True, slots=True)
class ProgramDef:
    """A whole ExecuTorch program: the ``Program`` table plus its segments' bytes."""

    version: int
    execution_plan: tuple[ExecutionPlan, ...]
    constant_buffer: tuple[Buffer, ...] = ()
    backend_delegate_data: tuple[BackendDelegateInlineData, ...] = ()
    segments: tuple[DataSegment, ...] = ()
    constant_segment: SubsegmentOffsets | None = None
    mutable_data_segments: tuple[SubsegmentOffsets, ...] = ()
    named_data: tuple[NamedData, ...] = ()

    @property
    def method_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.execution_plan)

    def plan(self, name: str) -> ExecutionPlan:
        """The execution plan called ``name``; KeyError-free: raises NotFoundError."""
        for p in self.execution_plan:
            if p.name == name:
                return p
        from ..errors import NotFoundError

        raise NotFoundError(
            f"method {name!r} not found (methods: {', '.join(self.method_names) or 'none'})"
        )

    def constant_data(self, data_buffer_idx: int) -> memoryview:
        """The bytes of constant ``data_buffer_idx`` (a view; may include trailing padding).

        Reads the legacy ``constant_buffer`` when present, otherwise ``constant_segment``.
        The reader has checked every index a valid program uses.
        """
        if self.constant_buffer:
            return self.constant_buffer[data_buffer_idx].storage
        cs = self.constant_segment
        assert cs is not None
        seg = self.segments[cs.segment_index].data
        start = cs.offsets[data_buffer_idx]
        nxt = data_buffer_idx + 1
        end = cs.offsets[nxt] if nxt < len(cs.offsets) and cs.offsets[nxt] >= start else len(seg)
        return seg[start:end]

    def delegate_data(self, ref: BackendDelegateDataReference) -> memoryview:
        """The processed blob a delegate refers to (a view)."""
        if ref.location == DataLocation.INLINE:
            return self.backend_delegate_data[ref.index].data
        return self.segments[ref.index].data

    def named_data_bytes(self, key: str) -> memoryview:
        """The bytes stored under ``key`` in ``named_data``."""
        for nd in self.named_data:
            if nd.key == key:
                return self.segments[nd.segment_index].data
        from ..errors import NotFoundError

        raise NotFoundError(
            f"named data {key!r} not found (keys: {', '.join(n.key for n in self.named_data) or 'none'})"
        )


def _fast_init(cls: type) -> None:
    """Give frozen dataclass ``cls`` an ``__init__`` with the same parameters and defaults
    that stores each field through its slot's descriptor. The generated one goes through
    ``object.__setattr__`` per field, about twice the cost, and a program has thousands of
    these objects (one or two per value and instruction) to build at load."""
    ns: dict[str, object] = {}
    params: list[str] = []
    body: list[str] = []
    for k, f in enumerate(dataclasses.fields(cls)):
        if not f.init or f.default_factory is not dataclasses.MISSING:
            return  # keep the generated __init__
        ns[f"_set{k}"] = getattr(cls, f.name).__set__
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            ns[f"_default{k}"] = f.default
            params.append(f"{f.name}=_default{k}")
        body.append(f"    _set{k}(self, {f.name})\n")
    exec(f"def __init__(self{''.join(', ' + p for p in params)}):\n{''.join(body) or '    pass'}\n", ns)
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"  # type: ignore[attr-defined]
    init.__module__ = cls.__module__  # type: ignore[attr-defined]
    init.__annotations__ = dict(cls.__init__.__annotations__)  # type: ignore[misc]
    cls.__init__ = init  # type: ignore[misc]


for _cls in list(globals().values()):
    if isinstance(_cls, type) and dataclasses.is_dataclass(_cls) and _cls.__module__ == __name__:
        _fast_init(_cls)
del _cls
