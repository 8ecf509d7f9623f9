"""XnnpackBackend: the committed XNNPACK fixtures, real-size models exported in the session
and compared with ExecuTorch's own XNNPACK runtime, weight sharing between Method
instances, options, and rejection of corrupt or unsupported blobs."""

from __future__ import annotations

import hashlib
import importlib.util
import pathlib
import struct
import tempfile
from typing import Any

import numpy as np
import pytest

from orchestra import BackendError, Error, OrchestraError
from orchestra.program import loads
from orchestra.runtime import Backend, load_program, register_backend, registered_backends

import orchestra.backends.xnnpack as xnn
from orchestra.backends.xnnpack import XnnpackBackend, XnnpackHandle, summarize
from orchestra.backends.xnnpack._blob import NODE_TYPES, _Reader, parse_blob

REPO = pathlib.Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("_xnn_et_helpers", REPO / "tests" / "_executorch.py")
assert _spec is not None and _spec.loader is not None
et_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(et_helpers)
FIXTURES = et_helpers.FIXTURES

ID = "XnnpackBackend"
if ID not in registered_backends():  # entry points not installed (a bare checkout)
    register_backend(Backend(ID, XnnpackBackend()))

XNNPACK_FIXTURES = ["xnnpack_convnet", "xnnpack_inline", "xnnpack_dwsep", "xnnpack_transformer", "xnnpack_two_methods",
                    "xnnpack_dynamic_batch"]
TOL = 1e-4


def handles(method) -> list[XnnpackHandle]:
    return [h for _, h in method._handles if isinstance(h, XnnpackHandle)]


def delegate_blob(pte: bytes, method: str = "forward", index: int = 0) -> tuple[memoryview, int]:
    """(blob, its offset in the file) of one XNNPACK delegate."""
    prog = loads(pte)
    plan = next(p for p in prog.execution_plan if p.name == method)
    blob = prog.delegate_data(plan.delegates[index].processed)
    off = pte.find(bytes(blob))
    assert off >= 0 and pte.find(bytes(blob), off + 1) < 0
    return blob, off


# -- public surface -----------------------------------------------------------------------------
def test_public_names_importable() -> None:
    for name in xnn.__all__:
        assert getattr(xnn, name) is not None


def test_registered_under_the_id_executorch_writes() -> None:
    from orchestra.runtime import get_backend_class

    assert isinstance(get_backend_class(ID), XnnpackBackend)
    names = {s.name for s in XnnpackBackend.option_specs}
    assert {"num_threads", "weight_cache_enabled", "workspace_sharing_mode"} <= names


# -- committed fixtures ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", XNNPACK_FIXTURES)
def test_fixture_matches_executorch_outputs(name: str) -> None:
    prog = load_program(FIXTURES / f"{name}.pte")
    for method, data in et_helpers.load_npz(name).items():
        m = prog.load_method(method)
        assert handles(m), f"{name}.{method} has no XNNPACK delegate"
        out = m.execute(data["in"])
        assert len(out) == len(data["out"])
        for got, want in zip(out, data["out"]):
            np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL)
        # twice: buffers reused between executes give the same result
        again = m.execute(data["in"])
        for got, want in zip(again, data["out"]):
            np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL)


def test_methods_of_one_program_share_the_plan_and_own_activations() -> None:
    prog = load_program(FIXTURES / "xnnpack_convnet.pte")
    a, b = prog.load_method("forward"), prog.load_method("forward")
    (ha,), (hb,) = handles(a), handles(b)
    assert ha.plan is hb.plan  # weights prepacked once per Program
    assert ha.workspace is not hb.workspace
    assert all(x is not y for x, y in zip(ha.workspace.bufs, hb.workspace.bufs) if x is not None)
    assert ha.statistics().shared_plan and ha.statistics().prepacked_bytes > 0
    data = et_helpers.load_npz("xnnpack_convnet")["forward"]
    np.testing.assert_allclose(a.execute(data["in"])[0], b.execute(data["in"])[0], rtol=0, atol=0)


def test_methods_of_one_program_run_in_parallel_threads() -> None:
    import threading

    prog = load_program(FIXTURES / "xnnpack_dwsep.pte")
    data = et_helpers.load_npz("xnnpack_dwsep")["forward"]
    methods = [prog.load_method("forward") for _ in range(4)]
    rng = np.random.default_rng(5)
    inputs = [[rng.standard_normal(data["in"][0].shape).astype(np.float32)] for _ in methods]
    expected = [prog.load_method("forward").execute(x)[0].copy() for x in inputs]
    errors: list[str] = []

    def worker(k: int) -> None:
        for _ in range(20):
            got = methods[k].execute(inputs[k])[0]
            if not np.allclose(got, expected[k], rtol=0, atol=0):
                errors.append(f"method {k} differs")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(methods))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_weight_cache_disabled_gives_each_method_its_own_plan() -> None:
    prog = load_program(FIXTURES / "xnnpack_convnet.pte")
    opts = {ID: {"weight_cache_enabled": False}}
    a, b = prog.load_method("forward", backend_options=opts), prog.load_method("forward", backend_options=opts)
    assert handles(a)[0].plan is not handles(b)[0].plan
    assert not handles(a)[0].statistics().shared_plan
    data = et_helpers.load_npz("xnnpack_convnet")["forward"]
    np.testing.assert_allclose(a.execute(data["in"])[0], data["out"][0], rtol=TOL, atol=TOL)


def test_options_are_validated() -> None:
    prog = load_program(FIXTURES / "xnnpack_inline.pte")
    with pytest.raises(OrchestraError, match="workspace_sharing_mode"):
        prog.load_method("forward", backend_options={ID: {"workspace_sharing_mode": 3}})
    with pytest.raises(OrchestraError, match="workspace_sharing_mode"):
        prog.load_method("forward", backend_options={ID: {"workspace_sharing_mode": "global"}})
    prog.load_method("forward", backend_options={ID: {"workspace_sharing_mode": 2}})  # ExecuTorch's Global
    with pytest.raises(OrchestraError, match="num_threads"):
        prog.load_method("forward", backend_options={ID: {"num_threads": "two"}})
    with pytest.raises(OrchestraError, match="num_threads"):
        prog.load_method("forward", backend_options={ID: {"num_threads": 0}})
    m = prog.load_method("forward", backend_options={ID: {"num_threads": 1}})
    m.set_options({ID: {"num_threads": 2}})  # hot: accepted between executes
    data = et_helpers.load_npz("xnnpack_inline")["forward"]
    np.testing.assert_allclose(m.execute(data["in"])[0], data["out"][0], rtol=TOL, atol=TOL)


@pytest.mark.executorch
def test_dynamic_batch_specialises_plans_and_matches_executorch() -> None:
    if not et_helpers.xnnpack_available():
        pytest.skip("executorch with XNNPACK is not installed")
    pte = (FIXTURES / "xnnpack_dynamic_batch.pte").read_bytes()
    prog = load_program(pte)
    m = prog.load_method("forward")
    rng = np.random.default_rng(3)
    for batch in (3, 8, 1, 5, 3):
        x = rng.standard_normal((batch, 2, 6, 6)).astype(np.float32)
        want = et_helpers.run_executorch(pte, "forward", [x])[0]
        got = m.execute([x])[0]
        assert got.shape == want.shape == (batch, 5)
        np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL)
    hs = handles(m)
    assert hs and all(len(h.by_shape) == 3 for h in hs)  # batches 3, 1, 5 (8 is the serialized bound)
    # plans for other dims reuse the delegate's re-laid-out weights
    for h in hs:
        for plan, _ in h.by_shape.values():
            assert plan.prepacked_bytes == 0


def test_wrong_input_is_rejected_naming_the_delegate() -> None:
    m = load_program(FIXTURES / "xnnpack_inline.pte").load_method("forward")
    with pytest.raises(OrchestraError):
        m.execute([np.zeros((3, 8), np.float32)])
    h = handles(m)[0]
    with pytest.raises(BackendError, match=r"delegate 0 \(XnnpackBackend\): argument 0 .* 2 dims"):
        XnnpackBackend().execute(None, h, [np.zeros((3, 8, 1), np.float32), np.zeros((2, 4), np.float32)])


def test_summary_names_nodes_tensors_and_constant_location() -> None:
    pte = (FIXTURES / "xnnpack_convnet.pte").read_bytes()
    blob, _ = delegate_blob(pte)
    s = summarize(blob)
    assert dict(s.node_types) == {"XNNConv2d": 2, "XNNStaticTranspose": 2, "XNNMaxPooling2d": 2, "XNNAdd": 1,
                                  "XNNStaticReshape": 1, "XNNFullyConnected": 1}
    assert s.tensors == 16 and s.constants == 6 and s.constants_in == "named data"
    assert s.constant_bytes == 864 + 32 + 2304 + 32 + 5120 + 40
    assert "Conv2d x2" in s.line()


# -- corrupt and unsupported blobs ---------------------------------------------------------------
def _node_tag_pos(blob: memoryview, node: int) -> int:
    fb_off = struct.unpack_from("<I", blob, 10)[0]
    fb_size = struct.unpack_from("<I", blob, 14)[0]
    fb = blob[fb_off:fb_off + fb_size]
    r = _Reader(fb, None)
    root = r.table(struct.unpack_from("<I", fb, 0)[0], "root")
    t, _ = r.tables(root, 1, "xnodes")[node]
    return fb_off + r._field(t, 0, 1, "tag")


def _patched(name: str, node: int, tag: int) -> bytes:
    pte = bytearray((FIXTURES / f"{name}.pte").read_bytes())
    blob, off = delegate_blob(bytes(pte))
    pte[off + _node_tag_pos(blob, node)] = tag
    return bytes(pte)


def test_unknown_node_type_fails_at_load_method_naming_node_and_delegate() -> None:
    prog = load_program(_patched("xnnpack_convnet", 4, 200))
    with pytest.raises(BackendError, match=r"delegate 0 \(XnnpackBackend\).*xnodes\[4\].*unknown node type tag 200") as e:
        prog.load_method("forward")
    assert e.value.code == Error.NotSupported


def test_known_but_unimplemented_node_type_fails_at_load_method() -> None:
    argmax = next(i for i, (n, _) in enumerate(NODE_TYPES) if n == "XNNArgMaxPooling2d") + 1
    prog = load_program(_patched("xnnpack_inline", 0, argmax))
    with pytest.raises(BackendError, match=r"delegate 0 \(XnnpackBackend\).*xnodes\[0\].*XNNArgMaxPooling2d"):
        prog.load_method("forward")


def test_bad_header_offsets_are_rejected() -> None:
    pte = (FIXTURES / "xnnpack_inline.pte").read_bytes()
    blob, _ = delegate_blob(pte)
    raw = bytearray(blob)
    for pos, value in ((10, 1 << 30), (14, 3), (18, 0), (22, 1 << 60)):
        bad = bytearray(raw)
        fmt = "<Q" if pos == 22 else "<I"
        struct.pack_into(fmt, bad, pos, value)
        with pytest.raises(BackendError, match="XH00 header"):
            parse_blob(memoryview(bytes(bad)), "d")
    with pytest.raises(BackendError, match="XN01 or XN00"):
        bad = bytearray(raw)
        fb_off = struct.unpack_from("<I", bad, 10)[0]
        bad[fb_off + 4:fb_off + 8] = b"ZZ99"
        parse_blob(memoryview(bytes(bad)), "d")


def test_every_truncation_is_an_orchestra_error() -> None:
    blob = bytes(delegate_blob((FIXTURES / "xnnpack_inline.pte").read_bytes())[0])
    for n in range(0, len(blob), 7):
        try:
            parse_blob(memoryview(blob[:n]), "d")
        except OrchestraError:
            pass


# -- real-size models, against ExecuTorch's XNNPACK runtime --------------------------------------
def _load_models():
    spec = importlib.util.spec_from_file_location("_xnn_test_models", pathlib.Path(__file__).parent / "_models.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cache_dir() -> pathlib.Path:
    src = (pathlib.Path(__file__).parent / "_models.py").read_bytes()
    import executorch  # noqa: F401
    import torch

    key = hashlib.sha256(src + torch.__version__.encode()).hexdigest()[:16]
    d = pathlib.Path(tempfile.gettempdir()) / f"orchestra-xnnpack-models-{key}"
    d.mkdir(exist_ok=True)
    return d


def _export(name: str) -> tuple[bytes, list[np.ndarray]]:
    if not et_helpers.xnnpack_available():
        pytest.skip("executorch with XNNPACK is not installed (the export extra)")
    import warnings

    _models = _load_models()
    d = _cache_dir()
    path = d / f"{name}.pte"
    module, inputs = _models.MODELS[name]()
    if not path.exists():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pte = _models.export_xnnpack(module, inputs)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(pte)
        tmp.replace(path)
    return path.read_bytes(), [t.numpy() for t in inputs]


MODEL_NODES = {
    "mobilenet_se_224": {"XNNConv2d", "XNNDepthwiseConv2d", "XNNHardswish", "XNNGlobalAvgPooling2d", "XNNMultiply",
                         "XNNFullyConnected"},
    "vit_sdpa_128": {"XNNBatchMatrixMultiply", "XNNSoftmax", "XNNGelu", "XNNFullyConnected"},
    "patch_embed_224": {"XNNConv2d", "XNNFullyConnected"},
    "dwsep_upsample": {"XNNDepthwiseConv2d", "XNNStaticResizeBilinear2D", "XNNConcatenate2"},
    "effreg_silu_112": {"XNNConv2d", "XNNDepthwiseConv2d", "XNNSigmoid", "XNNMultiply", "XNNHardswish",
                        "XNNFullyConnected", "XNNGlobalAvgPooling2d"},
    "ops_zoo": {"XNNConvTranspose2d", "XNNPReLU", "XNNLeakyReLU", "XNNAvgPooling2d", "XNNMaxPooling2d",
                "XNNStaticConstantPad", "XNNStaticSlice", "XNNConcatenate3", "XNNReciprocalSquareRoot", "XNNLog",
                "XNNFloor", "XNNCeiling", "XNNMinimum", "XNNMaximum", "XNNSquareRoot", "XNNExp", "XNNTanh"},
}


@pytest.mark.executorch
@pytest.mark.parametrize("name", sorted(MODEL_NODES))
def test_real_size_model_matches_executorch_xnnpack(name: str) -> None:
    pte, inputs = _export(name)
    want = et_helpers.run_executorch(pte, "forward", inputs)
    prog = load_program(pte)
    m = prog.load_method("forward")
    seen = {t for h in handles(m) for t in h.plan.node_types}
    assert MODEL_NODES[name] <= seen, MODEL_NODES[name] - seen
    got = m.execute(inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=TOL, atol=TOL)


@pytest.mark.executorch
@pytest.mark.parametrize("native", [True, False], ids=["compiled", "numpy"])
@pytest.mark.parametrize("name", ["effreg_silu_112", "mobilenet_se_224", "vit_sdpa_128", "dwsep_upsample",
                                  "patch_embed_224"])
def test_compiled_and_numpy_steps_both_match_executorch(name: str, native: bool,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan binds orchestra's compiled kernels where they are built (channels-last
    depthwise and grouped convolutions, products with their bias and activation, SiLU /
    hardswish fused into the convolution or linear layer before them) and numpy steps
    where they are not: both give ExecuTorch's XNNPACK outputs."""
    from orchestra.runtime import kernels

    if native and kernels.compiled() is None:
        pytest.skip("orchestra's compiled kernels are not built")
    bound: set[str] = set()  # the compiled kernels the plan binds

    class Recording:
        def __getattr__(self, kernel: str) -> Any:
            bound.add(kernel)
            return getattr(module, kernel)

    module = kernels.compiled()
    monkeypatch.setattr(kernels, "compiled", (lambda: Recording()) if native else (lambda: None))
    pte, inputs = _export(name)
    want = et_helpers.run_executorch(pte, "forward", inputs)
    m = load_program(pte).load_method("forward")
    got = m.execute(inputs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=TOL, atol=TOL)
    if native and name == "patch_embed_224":
        # 16x16 patches gathered for the compiled product, not the direct convolution
        assert "linear_f32" in bound and "gconv_nhwc_f32" not in bound, bound
    if native and name in ("mobilenet_se_224", "vit_sdpa_128"):
        # the image's NCHW -> NHWC, the attention heads' transposes: the compiled copy
        assert "permute_4b" in bound, bound
    if native and name in ("effreg_silu_112", "mobilenet_se_224"):
        # squeeze-excite's gate times the feature map: one compiled pass
        assert {"mul_rows_f32", "dwconv_nhwc_f32", "linear_f32"} <= bound, bound
    if name == "effreg_silu_112":
        (plan,) = [h.plan for h in handles(m)]
        ran = set(plan.step_nodes)
        sigmoids = [i for i, t in enumerate(plan.node_types) if t == "XNNSigmoid"]
        hardswish = [i for i, t in enumerate(plan.node_types) if t == "XNNHardswish"]
        fused = [i for i in sigmoids + hardswish if i not in ran]
        if native:
            # the 5 SiLUs and the hardswish run inside other steps; the gate's sigmoid runs
            assert len(fused) == 6 and len(sigmoids) == 6, (fused, sigmoids)
        else:
            assert fused == []


@pytest.mark.executorch
def test_copies_between_delegates_are_read_in_place_with_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backend says which DelegateCall arguments it writes (its graph's external
    outputs), so the runtime knows the rest are only read: a layout copy feeding a delegate
    (the exporter's ``expand_copy`` to the same shape between two delegates) is left out
    and the delegate reads its source in place, where nothing writes the source before the
    delegate runs and none of the delegate's outputs lies on it. The same bytes reach the
    delegate: outputs bit-identical to the plan that runs every copy."""
    pte, inputs = _export("vit_sdpa_128")
    want = et_helpers.run_executorch(pte, "forward", inputs)
    prog = load_program(pte)
    cp = prog._compiled_plan("forward")
    args = [a for ch in cp.plan.chains for a in (i.instr_args for i in ch.instructions)]
    for di, outs in enumerate(cp.delegate_outputs):
        calls = [a for a in args if getattr(a, "delegate_index", None) == di]
        assert outs and calls and all(max(outs) < len(a.args) for a in calls), (di, outs)
    views = [r for r in cp.rewrites if r.kind == "delegate_views"]
    assert views
    ops = cp.meta.operators
    for r in views:
        *copies, reader = r.instructions
        assert copies and all(ops[args[pc].op_index] == "aten::expand_copy.out" for pc in copies)
        assert type(args[reader]).__name__ == "DelegateCall"
    left_out = {pc for r in views for pc in r.instructions[:-1]}
    assert not any(left_out & set(span) for span in cp.step_spans if len(span) == 1)
    got = prog.load_method("forward").execute(inputs)
    # the plan as it was: every argument possibly written, every copy runs
    monkeypatch.setattr(XnnpackBackend, "delegate_outputs", lambda self, *a: None)
    plain = load_program(pte)
    assert not [r for r in plain._compiled_plan("forward").rewrites if r.kind == "delegate_views"]
    ref = plain.load_method("forward").execute(inputs)
    for g, p, w in zip(got, ref, want):
        assert np.array_equal(g, p)
        np.testing.assert_allclose(g, w, rtol=TOL, atol=TOL)


@pytest.mark.executorch
def test_constant_inputs_of_a_delegate_are_read_from_constants(monkeypatch: pytest.MonkeyPatch) -> None:
    """The exporter passes hardsigmoid's 3 and 6 to the delegate as inputs, each made per
    execute by a ``_to_dim_order_copy`` of a constant: the delegate only reads them (its
    backend says so), so it reads the constants, computed once, and those copies don't run."""
    pte, inputs = _export("mobilenet_se_224")
    prog = load_program(pte)
    cp = prog._compiled_plan("forward")
    folded = [r for r in cp.rewrites if r.kind == "constant_copy"]
    assert folded and len(cp.steps) == 1, (len(folded), len(cp.steps))
    got = prog.load_method("forward").execute(inputs)
    monkeypatch.setattr(XnnpackBackend, "delegate_outputs", lambda self, *a: None)
    plain = load_program(pte)
    assert len(plain._compiled_plan("forward").steps) == len(folded) + 1
    for g, p in zip(got, plain.load_method("forward").execute(inputs)):
        assert np.array_equal(g, p)


def test_delegate_outputs_are_the_graphs_external_outputs() -> None:
    """Asked before any init: the fixture's external outputs, as argument positions; a blob
    that does not parse gives None (unknown; init reports it)."""
    from orchestra.runtime import BackendInitContext

    blob, _ = delegate_blob((FIXTURES / "xnnpack_convnet.pte").read_bytes())
    ctx = BackendInitContext("forward", 0, "XnnpackBackend", program_cache={})
    outs = XnnpackBackend().delegate_outputs(ctx, blob, ())
    graph = parse_blob(blob, "test")
    assert outs == frozenset(v.external_id for v in graph.values if v.flags & 2) and outs
    assert "xnnpack.graph" in ctx.program_cache  # init parses it once
    assert len(outs) < graph.num_externs
    assert XnnpackBackend().delegate_outputs(BackendInitContext("forward", 0, "XnnpackBackend"),
                                              memoryview(b"not a blob at all, too short"), ()) is None


# -- orchestra inspect ---------------------------------------------------------------------------
def test_inspect_shows_xnnpack_node_types_tensors_and_constants(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from orchestra import _cli

    assert _cli.main(["inspect", str(FIXTURES / "xnnpack_convnet.pte")]) == 0
    out = capsys.readouterr().out
    assert "XNNPACK graph XN01: 9 nodes (Conv2d x2, MaxPooling2d x2, StaticTranspose x2" in out
    assert "16 tensors, 6 constant (8392 bytes in named data)" in out
    assert _cli.main(["inspect", "--json", str(FIXTURES / "xnnpack_transformer.pte")]) == 0
    facts = json.loads(capsys.readouterr().out)
    dets = [d["details"] for m in facts["methods"] for d in m["delegates"]]
    assert dets and all(d["constants_in"] in ("named data", "none") for d in dets)
    assert sum(d["node_types"].get("XNNBatchMatrixMultiply", 0) for d in dets) == 2


def test_inspect_reports_an_invalid_blob_without_failing(tmp_path: pathlib.Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from orchestra import _cli

    bad = tmp_path / "bad.pte"
    bad.write_bytes(_patched("xnnpack_convnet", 2, 201))
    assert _cli.main(["inspect", str(bad)]) == 0
    assert "invalid: " in capsys.readouterr().out


# -- arena layout -------------------------------------------------------------------------------
def _random_buffers(rng: np.random.Generator, n: int, positions: int) -> tuple[list[int], list[int], list[int]]:
    first = [int(v) for v in rng.integers(0, positions, n)]
    # mostly short lifetimes (a few nodes), some that span much of the graph
    last = [f + int(rng.integers(0, 4) if rng.random() < 0.8 else rng.integers(0, positions)) for f in first]
    sizes = rng.choice([0, 1, 63, 64, 65, 4096, 150528, 602112], n)  # repeats: ties in size
    nbytes = [int(s) if rng.random() < 0.7 else int(rng.integers(0, 1 << 20)) for s in sizes]
    return nbytes, first, last


def test_compiled_arena_placement_equals_the_python_one_and_never_overlaps_live_buffers() -> None:
    from orchestra.backends.xnnpack._compile import _ALIGN, _place_python
    from orchestra.runtime.kernels import compiled

    native = compiled()
    if native is None:
        pytest.skip("the compiled kernels are not built")
    rng = np.random.default_rng(7)
    cases = [([], [], []), ([5], [0], [0]), ([10, 10, 10], [0, 0, 0], [0, 0, 0])]
    cases += [_random_buffers(rng, int(rng.integers(1, 300)), int(rng.integers(1, 200))) for _ in range(300)]
    for nbytes, first, last in cases:
        offs, arena = native.arena_place(nbytes, first, last, _ALIGN)
        assert (offs, arena) == _place_python(nbytes, first, last, _ALIGN)
        ends = [o + -(-b // _ALIGN) * _ALIGN for o, b in zip(offs, nbytes)]
        assert all(o % _ALIGN == 0 for o in offs) and arena == max(ends, default=0)
        for i in range(len(nbytes)):
            for j in range(i):
                if first[i] <= last[j] and first[j] <= last[i] and nbytes[i] and nbytes[j]:
                    assert ends[i] <= offs[j] or ends[j] <= offs[i], (i, j)


def test_compiled_arena_placement_refuses_bad_input() -> None:
    from orchestra.runtime.kernels import compiled

    native = compiled()
    if native is None:
        pytest.skip("the compiled kernels are not built")
    for args, match in [(([1, 2], [0], [0, 1], 64), "first must be a list of 2"),
                        (([-1], [0], [0], 64), "nbytes.0. is -1"),
                        (([8], [3], [2], 64), "ends .2. before it starts .3."),
                        (([8], [0], [0], 48), "power of two"),
                        (([8], [0], [1 << 62], 64), "out of range")]:
        with pytest.raises(ValueError, match=match):
            native.arena_place(*args)
    with pytest.raises(TypeError):
        native.arena_place((8,), [0], [0], 64)
    with pytest.raises(TypeError):
        native.arena_place([8.0], [0], [0], 64)


def test_shapes_broadcast_as_numpy_broadcasts_them() -> None:
    """The compiler's own broadcast of two shapes (numpy's builds arrays) gives numpy's
    answer on every pair of small shapes, zero-sized dims included, and None where numpy
    refuses."""
    from itertools import product

    from orchestra.backends.xnnpack._nodes import _broadcast_pair

    shapes = [s for n in range(4) for s in product((0, 1, 2, 3), repeat=n)]
    for a in shapes:
        for b in shapes:
            try:
                want: tuple[int, ...] | None = tuple(np.broadcast_shapes(a, b))
            except ValueError:
                want = None
            assert _broadcast_pair(a, b) == want, (a, b)
