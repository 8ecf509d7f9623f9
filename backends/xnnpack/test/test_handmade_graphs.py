"""XNNPACK graphs written by hand with ExecuTorch's own XNNGraph serializer, for node types
and encodings the partitioner does not emit for our models (ELU, Sin/Cos, Copy, Convert,
Concatenate4/5, grouped transposed convolution, output_min_max on a binary node, constants
in the blob's constant-data section instead of named data). Each graph is wrapped into a
.pte (orchestra's ProgramBuilder) and run by ExecuTorch's runtime with XNNPACK and by
orchestra; outputs must agree within 1e-4. ScaledDotProductAttention, which ExecuTorch's
runtime no longer implements, is checked against a numpy reference."""

from __future__ import annotations

import importlib.util
import math
import pathlib

import numpy as np
import pytest

from orchestra.aot import BackendDetails, PreprocessResult, ProgramBuilder, aot_backends, register_aot_backend
from orchestra.program import CompileSpec
from orchestra.runtime import Backend, load_program, register_backend, registered_backends

from orchestra.backends.xnnpack import XnnpackBackend

REPO = pathlib.Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("_xnn_et_helpers2", REPO / "tests" / "_executorch.py")
assert _spec is not None and _spec.loader is not None
et_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(et_helpers)

ID = "XnnpackBackend"
if ID not in registered_backends():
    register_backend(Backend(ID, XnnpackBackend()))

S = pytest.importorskip("executorch.backends.xnnpack.serialization.xnnpack_graph_schema")
from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import serialize_xnnpack_binary  # noqa: E402

pytestmark = pytest.mark.executorch
INVALID = 0xFFFFFFFF
BLOB_KEY = "test.xnnpack_blob"


class _HandmadeBlob(BackendDetails):
    """AOT half for these tests only: the processed blob is the one passed as compile spec."""

    @staticmethod
    def preprocess(program, compile_specs):
        return PreprocessResult(next(bytes(c.value) for c in compile_specs if c.key == BLOB_KEY))


if ID not in aot_backends():
    register_aot_backend(ID, _HandmadeBlob)


class Graph:
    """A tiny builder over ExecuTorch's XNNGraph dataclasses."""

    def __init__(self) -> None:
        self.values: list = []
        self.nodes: list = []
        self.consts: list = [S.ConstantDataOffset(0, 0, None)]
        self.data = bytearray()
        self.inputs: list[tuple[int, tuple[int, ...]]] = []
        self.outputs: list[tuple[int, tuple[int, ...]]] = []
        self.ext = 0

    def _value(self, dims, cidx=0, ext=INVALID, flags=0) -> int:
        vid = len(self.values)
        self.values.append(S.XValue(S.XNNTensorValue(S.XNNDatatype.xnn_datatype_fp32, len(dims), list(dims), cidx, ext,
                                                     flags, vid)))
        return vid

    def input(self, dims) -> int:
        vid = self._value(dims, ext=self.ext, flags=1)
        self.inputs.append((vid, tuple(dims)))
        self.ext += 1
        return vid

    def tensor(self, dims) -> int:
        return self._value(dims)

    def output(self, dims) -> int:
        vid = self._value(dims, ext=-1, flags=2)
        self.outputs.append((vid, tuple(dims)))
        return vid

    def const(self, array: np.ndarray) -> int:
        """A constant in the blob's constant-data section (16-byte aligned)."""
        a = np.ascontiguousarray(array, np.float32)
        self.data += b"\0" * (-len(self.data) % 16)
        self.consts.append(S.ConstantDataOffset(len(self.data), a.nbytes, None))  # no named_key field
        self.data += a.tobytes()
        return self._value(a.shape, cidx=len(self.consts) - 1)

    def node(self, union, minmax: tuple[float, float] | None = None) -> None:
        mm = None if minmax is None else S.OutputMinMax(*minmax)
        self.nodes.append(S.XNode(union, len(self.nodes), mm))

    def blob(self) -> bytes:
        # External outputs follow the inputs.
        for k, (vid, _) in enumerate(self.outputs):
            self.values[vid].xvalue_union.external_id = self.ext + k
        g = S.XNNGraph("0", self.nodes, self.values, self.ext + len(self.outputs), [v for v, _ in self.inputs],
                       [v for v, _ in self.outputs], self.consts)
        return serialize_xnnpack_binary(g, self.data)

    def program(self) -> bytes:
        from orchestra.program import dumps

        sub = ProgramBuilder()
        sm = sub.method("forward")
        sins = [sm.input(np.float32, dims) for _, dims in self.inputs]
        # the subgraph's content is irrelevant (the blob replaces it); its shapes are not
        souts = [sm.call("aten::full.out", list(dims), 0.0) for _, dims in self.outputs]
        sm.output(*souts) if sins is not None else None
        pb = ProgramBuilder()
        m = pb.method("forward")
        ins = [m.input(np.float32, dims) for _, dims in self.inputs]
        outs = m.delegate(ID, sub, ins, [CompileSpec(BLOB_KEY, self.blob())])
        m.output(*outs)
        return dumps(pb.build())


def _check_against_executorch(g: Graph, inputs: list[np.ndarray]) -> list[np.ndarray]:
    if not et_helpers.xnnpack_available():
        pytest.skip("executorch with XNNPACK is not installed")
    pte = g.program()
    want = et_helpers.run_executorch(pte, "forward", inputs)
    got = load_program(pte).load_method("forward").execute(inputs)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    return got


RNG = np.random.default_rng(11)


def test_unary_chain_elu_sin_cos_copy_convert_and_fused_minmax() -> None:
    g = Graph()
    x = g.input((2, 3, 5))
    c = g.const(RNG.standard_normal((3, 5)))
    a = g.tensor((2, 3, 5))
    g.node(S.XNNAdd(x, c, a, 0), minmax=(-0.75, 1.25))  # honoured on binary nodes
    e = g.tensor((2, 3, 5))
    g.node(S.XNNELU(0.6, a, e, 0))
    s, co, cp = g.tensor((2, 3, 5)), g.tensor((2, 3, 5)), g.tensor((2, 3, 5))
    g.node(S.XNNSin(e, s, 0))
    g.node(S.XNNCos(s, co, 0))
    g.node(S.XNNCopy(co, cp, 0))
    lr = g.tensor((2, 3, 5))
    g.node(S.XNNLeakyReLU(1.7, cp, lr, 0))
    out = g.output((2, 3, 5))
    g.node(S.XNNConvert(lr, out, 0))
    _check_against_executorch(g, [RNG.standard_normal((2, 3, 5)).astype(np.float32) * 2])


@pytest.mark.parametrize("n", [4, 5])
def test_concatenate_4_and_5(n: int) -> None:
    g = Graph()
    ins = [g.input((2, k + 1, 3)) for k in range(n)]
    out = g.output((2, sum(k + 1 for k in range(n)), 3))
    ids = ins + [INVALID] * (5 - n)
    cls = S.XNNConcatenate4 if n == 4 else S.XNNConcatenate5
    g.node(cls(1, ids[0], ids[1], ids[2], ids[3], out, 0, ids[4]))
    _check_against_executorch(g, [RNG.standard_normal((2, k + 1, 3)).astype(np.float32) for k in range(n)])


def test_grouped_dilated_transposed_convolution_with_blob_constants() -> None:
    groups, gic, goc, kh, kw = 2, 3, 2, 3, 2
    g = Graph()
    x = g.input((1, 5, 4, groups * gic))
    w = g.const(RNG.standard_normal((groups * goc, kh, kw, gic)))
    b = g.const(RNG.standard_normal(groups * goc))
    sh, sw, dh, dw, pt, pr, pb, pl, ah, aw = 2, 1, 1, 2, 1, 0, 0, 1, 1, 0
    oh = (5 - 1) * sh + (kh - 1) * dh + 1 + ah - pt - pb
    ow = (4 - 1) * sw + (kw - 1) * dw + 1 + aw - pl - pr
    out = g.output((1, oh, ow, groups * goc))
    g.node(S.XNNConvTranspose2d(pt, pr, pb, pl, kh, kw, sh, sw, dh, dw, gic, goc, groups, ah, aw, x, w, b, out, 0),
           minmax=(-1.0, 1.0))
    _check_against_executorch(g, [RNG.standard_normal((1, 5, 4, groups * gic)).astype(np.float32)])


def test_grouped_conv_asymmetric_padding_and_avg_pool_with_padding() -> None:
    g = Graph()
    x = g.input((1, 7, 6, 4))
    w = g.const(RNG.standard_normal((6, 3, 2, 2)))
    c = g.tensor((1, 4, 6, 6))
    # pads t1 r2 b0 l1, stride 2x1, 2 groups of 2 -> 3 channels
    oh, ow = (7 + 1 - 3) // 2 + 1, (6 + 3 - 2) // 1 + 1
    c = g.tensor((1, oh, ow, 6))
    g.node(S.XNNConv2d(1, 2, 0, 1, 3, 2, 2, 1, 1, 1, 2, 3, 2, 0, 0, x, w, INVALID, c, 0))
    out = g.output((1, oh, ow, 6))
    g.node(S.XNNAvgPooling2d(1, 1, 1, 1, 3, 3, 1, 1, 1, 1, c, out, 0))
    _check_against_executorch(g, [RNG.standard_normal((1, 7, 6, 4)).astype(np.float32)])


def test_scaled_dot_product_attention_matches_numpy_reference() -> None:
    # ExecuTorch's runtime no longer defines this node (XNNCompiler.cpp has no case for it),
    # so orchestra's result is checked against the formula XNNPACK documents.
    b, h, t, s, d = 1, 2, 8, 6, 16
    g = Graph()
    q, k, v = g.input((b, h, t, d)), g.input((b, h, s, d)), g.input((b, h, s, d))
    scale = np.full(d, 1 / math.sqrt(d), np.float32)
    mask = np.triu(np.full((t, s), -1e4, np.float32), 1)
    sc, mk = g.const(scale), g.const(mask)
    out = g.output((b, h, t, d))
    g.node(S.XNNScaledDotProductAttention(q, k, v, sc, mk, out, 0))
    pte = g.program()
    xs = [RNG.standard_normal(sh).astype(np.float32) for sh in ((b, h, t, d), (b, h, s, d), (b, h, s, d))]
    got = load_program(pte).load_method("forward").execute(xs)[0]
    logits = (xs[0] * scale) @ np.swapaxes(xs[1], -1, -2) + mask
    p = np.exp(logits - logits.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ xs[2]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_huge_dims_fail_at_init_without_allocating() -> None:
    from orchestra import BackendError
    from orchestra.backends.xnnpack._blob import parse_blob
    from orchestra.backends.xnnpack._compile import compile_graph

    g = Graph()
    x = g.input((1, 1 << 20, 1 << 20, 3))  # 12 TiB if anyone allocated it
    out = g.output((1, 1 << 19, 1 << 19, 3))
    g.node(S.XNNAvgPooling2d(0, 0, 0, 0, 2, 2, 2, 2, 1, 1, x, out, 0))
    with pytest.raises(BackendError, match="corrupt dims"):
        compile_graph(parse_blob(memoryview(g.blob()), "d"), "d", None)
    g = Graph()
    x = g.input((1, 1, 1, 3))
    out = g.output((1, 1, 1, 3))
    # a kernel of 2^23 x 2^23 over 2^22 padding each side: the padded input is refused first
    g.node(S.XNNMaxPooling2d(1 << 22, 1 << 22, 1 << 22, 1 << 22, 1 << 23, 1 << 23, 1, 1, 1, 1, x, out, 0))
    with pytest.raises(BackendError):
        compile_graph(parse_blob(memoryview(g.blob()), "d"), "d", None)


def _qvalue(g: Graph, dims, scale: float, zp: int) -> int:
    vid = len(g.values)
    tv = S.XNNTensorValue(S.XNNDatatype.xnn_datatype_qint8, len(dims), list(dims), 0, INVALID, 0, vid)
    g.values.append(S.XValue(S.XNNQuantizedTensorValue(tv, S.PerTensorQuant(scale, zp))))
    return vid


def _island(g: Graph, q_in: int, op, dims, scale: float, zp: int) -> int:
    """Convert q_in to float32, ``op`` over it, Convert back: a float island; its int8 output."""
    f, y = g.tensor(dims), g.tensor(dims)
    g.node(S.XNNConvert(q_in, f, 0))
    g.node(op(f, y, 0))
    q_out = _qvalue(g, dims, scale, zp)
    g.node(S.XNNConvert(y, q_out, 0))
    return q_out


def _silu_island(g: Graph, q_in: int, dims, scale: float, zp: int) -> int:
    """Convert q_in to float32, x * sigmoid(x), Convert back: a SiLU island; its int8 output."""
    f, s, y = g.tensor(dims), g.tensor(dims), g.tensor(dims)
    g.node(S.XNNConvert(q_in, f, 0))
    g.node(S.XNNSigmoid(f, s, 0))
    g.node(S.XNNMultiply(f, s, y, 0))
    q_out = _qvalue(g, dims, scale, zp)
    g.node(S.XNNConvert(y, q_out, 0))
    return q_out


def test_islands_of_the_same_float_nodes_share_one_compile_and_equal_their_steps(monkeypatch) -> None:
    """Islands whose float nodes are the same (SiLUs, sigmoids) but whose Converts differ are
    one family each: their float nodes compiled once over every member's 256 values; an island
    of its own kind (tanh) is compiled with its Converts. Every table equals its island's own
    steps: the outputs over all 256 bytes of each input equal the graph run with no lookups."""
    from orchestra.backends.xnnpack import _compile, _quantized

    dims = (1, 16, 16)
    g = Graph()
    xs, qs = [], []
    for scale, zp in ((0.05, 3), (0.02, -7), (0.11, 120)):
        x = g.input(dims)
        q = _qvalue(g, dims, scale, zp)
        g.node(S.XNNConvert(x, q, 0))
        xs.append((scale, zp))
        qs.append(q)
    outs = [_silu_island(g, qs[0], dims, 0.03, -100), _silu_island(g, qs[1], dims, 0.011, 5),
            _silu_island(g, qs[2], dims, 0.05, -128), _island(g, qs[0], S.XNNSigmoid, dims, 1 / 256, -128),
            _island(g, qs[2], S.XNNSigmoid, dims, 1 / 200, -100), _island(g, qs[1], S.XNNTanh, dims, 1 / 128, 0)]
    for q in outs:
        out = g.output(dims)
        g.node(S.XNNConvert(q, out, 0))
    codes = np.arange(-128, 128, dtype=np.float32).reshape(dims)
    inputs = [(codes - zp) * np.float32(scale) for scale, zp in xs]  # every int8 value of each input once

    compiles: list[tuple[int, int]] = []  # (nodes, the first value's elements) of each lookup-table compile
    real_compile = _compile.Compiler.compile

    def counting(self):  # noqa: ANN001, ANN202
        if not self.lookup:
            compiles.append((len(self.graph.nodes), math.prod(self.graph.values[0].dims)))
        return real_compile(self)

    monkeypatch.setattr(_compile.Compiler, "compile", counting)
    pte = g.program()
    got = load_program(pte).load_method("forward").execute(inputs)
    # the SiLUs' two float nodes over 3 x 256 values, the sigmoids' one over 2 x 256, the tanh with its Converts
    # (without the compiled kernels, no families: islands with their Converts)
    from orchestra.runtime import kernels
    if kernels.compiled() is not None:
        assert sorted(compiles) == [(1, 512), (2, 768), (3, 256)]
    monkeypatch.setattr(_compile.Compiler, "_plan_lookup", lambda self, readers: None)
    plain = load_program(pte).load_method("forward").execute(inputs)
    assert len(got) == len(plain) == 6
    for a, b in zip(got, plain):
        assert np.array_equal(a, b)
    monkeypatch.undo()
    monkeypatch.setattr(_quantized, "_island_key", lambda c, chain: None)  # every island with its Converts
    batched = load_program(pte).load_method("forward").execute(inputs)
    for a, b in zip(got, batched):
        assert np.array_equal(a, b)


def test_chained_float_islands_are_lookups_equal_to_their_steps(monkeypatch) -> None:
    """Float islands whose values meet (one island's output is the next one's input; two read
    the same input) are compiled for their tables in separate graphs (Compiler._plan_lookup,
    _quantized._lookup_tables), and every table equals its island's own steps: the outputs
    over all 256 input bytes are those of the graph run with no lookups, and ExecuTorch's
    within one quantization step."""
    from orchestra.backends.xnnpack import _compile, _quantized

    dims = (1, 16, 16)
    g = Graph()
    x = g.input(dims)
    q1 = _qvalue(g, dims, 0.05, 3)
    g.node(S.XNNConvert(x, q1, 0))
    qa = _island(g, q1, S.XNNSigmoid, dims, 1 / 256, -128)
    qb = _island(g, qa, S.XNNHardswish, dims, 0.01, -20)  # reads island a's output
    qc = _island(g, q1, S.XNNTanh, dims, 1 / 128, 0)  # reads island a's input
    for q in (qb, qc):
        out = g.output(dims)
        g.node(S.XNNConvert(q, out, 0))
    codes = np.arange(-128, 128, dtype=np.float32).reshape(dims)
    inputs = [(codes - 3) * np.float32(0.05)]  # every int8 value of q1 once

    batches: list[int] = []
    real = _quantized._lookup_tables

    def recording(c, chains):  # noqa: ANN001, ANN202
        got = real(c, chains)
        batches.append(len(chains))
        return got

    monkeypatch.setattr(_quantized, "_lookup_tables", recording)
    pte = g.program()
    got = load_program(pte).load_method("forward").execute(inputs)
    assert batches == [3]  # one call for the graph's three islands ...
    compiles: list[int] = []
    real_compile = _compile.Compiler.compile

    def counting(self):  # noqa: ANN001, ANN202
        if not self.lookup:
            compiles.append(len(self.graph.nodes))
        return real_compile(self)

    monkeypatch.setattr(_compile.Compiler, "compile", counting)
    load_program(pte).load_method("forward")
    assert sorted(compiles) == [3, 6]  # ... two graphs: a alone, then b and c together
    monkeypatch.setattr(_compile.Compiler, "_plan_lookup", lambda self, readers: None)
    plain = load_program(pte).load_method("forward").execute(inputs)
    for a, b in zip(got, plain):
        assert np.array_equal(a, b)
    if et_helpers.xnnpack_available():
        want = et_helpers.run_executorch(pte, "forward", inputs)
        for a, b, step in zip(got, want, (0.01, 1 / 128)):
            np.testing.assert_allclose(a, b, rtol=0, atol=step * 1.01)


def test_nodes_out_of_order_or_reading_undefined_values_fail_naming_the_node() -> None:
    from orchestra import BackendError

    g = Graph()  # y = sigmoid(t) placed before t = abs(x): t is read before any node writes it
    x, t, y = g.input((1, 8)), g.tensor((1, 8)), g.output((1, 8))
    g.node(S.XNNSigmoid(t, y, 0))
    g.node(S.XNNAbs(x, t, 0))
    with pytest.raises(BackendError, match=r"xnodes\[0\] \(XNNSigmoid.*reads value id 1 before any node writes it"):
        load_program(g.program()).load_method("forward")
    g = Graph()  # an input id no value defines
    x, y = g.input((1, 8)), g.output((1, 8))
    g.node(S.XNNAdd(x, 7, y, 0))
    with pytest.raises(BackendError, match=r"input2_id refers to value id 7, which no XNNGraph.xvalues entry defines"):
        load_program(g.program()).load_method("forward")


def test_the_fusion_planner_reads_value_fields_of_hand_made_nodes() -> None:
    """Nodes of types the node table lacks (made by hand, not decoded) have their value fields
    found by name."""
    from orchestra.backends.xnnpack._blob import NODE_VALUE_FIELDS, XNode
    from orchestra.backends.xnnpack._compile import _value_fields

    assert NODE_VALUE_FIELDS["XNNConv2d"] == (("input1_id", "filter_id", "bias_id"), ("output_id",))
    assert NODE_VALUE_FIELDS["XNNConcatenate5"][0] == ("input1_id", "input2_id", "input3_id", "input4_id", "input5_id")
    known = XNode(0, "XNNAdd", {"input1_id": 1, "input2_id": 2, "output_id": 3, "flags": 0})
    assert _value_fields(known) == (("input1_id", "input2_id"), ("output_id",))
    made = XNode(1, "custom.Op", {"input_id": 1, "scale_id": 4, "output_id": 5, "output2_id": 6, "flags": 0})
    assert _value_fields(made) == (("input_id", "scale_id"), ("output_id", "output2_id"))


def test_in_place_pairs_follow_the_last_read_of_each_input_through_views() -> None:
    """Plan.in_place (what ``delegate_in_place`` answers): an input may share memory with an
    output when every step reading it, through a reshape's view too, runs before the first
    step writing that output."""
    from orchestra.backends.xnnpack import XnnpackHandle

    g = Graph()
    x, y = g.input((2, 3, 5)), g.input((2, 3, 5))
    c = g.const(RNG.standard_normal((3, 5)))
    c2 = g.const(RNG.standard_normal((6, 5)))
    t = g.tensor((2, 3, 5))
    v = g.tensor((6, 5))
    out1, out2 = g.output((2, 3, 5)), g.output((6, 5))
    g.node(S.XNNAdd(x, c, t, 0))  # 0: the last read of x
    g.node(S.XNNSigmoid(t, out1, 0))  # 1: out1 written
    g.node(S.XNNStaticReshape(2, [6, 5], y, v, 0))  # 2: v is a view of y
    g.node(S.XNNAdd(v, c2, out2, 0))  # 3: y read through v, out2 written
    got = _check_against_executorch(g, [RNG.standard_normal((2, 3, 5)).astype(np.float32) for _ in range(2)])
    assert len(got) == 2
    m = load_program(g.program()).load_method("forward")
    (plan,) = [h.plan for _, h in m._handles if isinstance(h, XnnpackHandle)]
    # arguments: x 0, y 1, out1 2, out2 3; y is read until node 3, where out2 is written
    assert plan.in_place == {(0, 2), (0, 3)}
