"""The compiler's checks of a graph's values (``Compiler._define`` and the external values'
tables): each bad value fails at compile with its own message, naming the value, before
anything is allocated."""

from __future__ import annotations

import pytest

from orchestra import BackendError, Error
from orchestra.backends.xnnpack._blob import ConstantRef, XGraph, XValue
from orchestra.backends.xnnpack._compile import MAX_WORKSPACE_BYTES, compile_graph

F32 = 1


def _graph(values: list[XValue], num_externs: int = 2, section: bytes = b"") -> XGraph:
    consts = (ConstantRef(0, 0), ConstantRef(0, len(section)))
    return XGraph("XN01", "", (), tuple(values), num_externs, (), (), consts, memoryview(section))


def _v(index: int, vid: int, dims: tuple[int, ...] = (2, 3), *, datatype: int = F32, cbi: int = 0, ext: int = 0,
       flags: int = 0) -> XValue:
    return XValue(index, vid, datatype, dims, cbi, ext, flags)


CASES = [
    ([_v(0, 0xFFFFFFFF)], "d: XNNGraph.xvalues[0] (id 4294967295): id_out is XNN_INVALID_VALUE_ID", Error.InvalidProgram),
    ([_v(0, 5), _v(1, 5)], "d: XNNGraph.xvalues[1] (id 5): id 5 is defined twice (also by xvalues[0])",
     Error.InvalidProgram),
    ([_v(0, 1, datatype=2)], "d: XNNGraph.xvalues[0] (id 1): datatype fp16 is not supported by this backend "
     "(supported: ", Error.NotSupported),
    ([_v(0, 1, (1 << 20, 1 << 20))], f"d: XNNGraph.xvalues[0] (id 1): dims [1048576, 1048576] hold more than "
     f"{MAX_WORKSPACE_BYTES} bytes (corrupt dims?)", Error.MemoryAllocationFailed),
    ([_v(0, 1, flags=4)], "d: XNNGraph.xvalues[0] (id 1): flags 0x4 hold bits other than "
     "EXTERNAL_INPUT/EXTERNAL_OUTPUT", Error.InvalidProgram),
    ([_v(0, 1, ext=2, flags=1)], "d: XNNGraph.xvalues[0] (id 1): external_id 2 is not below num_externs 2",
     Error.InvalidProgram),
    ([_v(0, 1, cbi=1, flags=2)], "d: XNNGraph.xvalues[0] (id 1): an external value can't be a constant",
     Error.InvalidProgram),
    ([_v(0, 1, cbi=1)], "d: XNNGraph.xvalues[0] (id 1): constant 1 holds 8 bytes, dims [2, 3] of fp32 need 24",
     Error.InvalidProgram),
    ([_v(i, i, (1 << 28,)) for i in range(3)], f"d: the delegate's activations would need more than "
     f"{MAX_WORKSPACE_BYTES} bytes per Method (corrupt dims?)", Error.MemoryAllocationFailed),
    ([_v(0, 1, flags=3)], "d: value id 1 is both an external input and output", Error.InvalidProgram),
    ([_v(0, 1, ext=1, flags=1), _v(1, 2, ext=1, flags=2)], "d: external_id 1 is used by two values",
     Error.InvalidProgram),
]


@pytest.mark.parametrize(("values", "message", "code"), CASES, ids=[c[1].split(": ", 2)[-1][:40] for c in CASES])
def test_bad_values_fail_naming_the_value(values: list[XValue], message: str, code: Error) -> None:
    with pytest.raises(BackendError) as got:
        compile_graph(_graph(values, section=bytes(8)), "d", None)
    assert str(got.value.message).startswith(message), got.value.message
    assert got.value.code == code


def test_good_values_get_their_slots_constants_and_externals() -> None:
    """Internal values get a buffer each, external ones a slot bound at execute (none), a
    constant a read-only view of its bytes; the plan's inputs and outputs are by external id."""
    from orchestra.backends.xnnpack._compile import Compiler

    section = bytes(range(24))
    values = [_v(0, 7, (2,), ext=1, flags=1), _v(1, 8, (2,)), _v(2, 9, (2, 3), datatype=12, cbi=1),
              _v(3, 10, (2,), ext=0, flags=2)]
    c = Compiler(_graph(values, section=section), "d", None)
    c._written, c._externals = {}, []
    for v in values:
        c._define(v)
    assert [c.infos[i].slot for i in (7, 8, 9, 10)] == [0, 1, -1, 2]
    assert c.buffers == [None, ((2,), c.infos[8].dtype, None), None]
    assert c.workspace_bytes == 8
    k = c.infos[9].const
    assert k is not None and not k.flags.writeable and k.dtype == "int32" and k.tobytes() == section
    assert [(i.value.id, i.external) for i in c._externals] == [(7, 1), (10, 0)]
