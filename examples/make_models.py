"""Builds the example programs in ``examples/models/`` (deterministic: same bytes every run).

- ``convnet_npu.pte``: a small conv net on a ``float32 [1, 3, 16, 16]`` frame whose whole
  body is one delegate to ``NpuSimBackend`` (conv 3x3 -> relu -> max-pool 2x2 -> conv 3x3 ->
  relu -> max-pool 2x2 -> flatten -> linear to 10 classes), weights from a seeded numpy RNG.
  Built with :class:`orchestra.aot.ProgramBuilder`; ``examples/cameras.toml`` runs it on the
  cores of a simulated NPU, so the NpuSimBackend options (``power_mode`` ...) apply.
- ``mobilenet_npu.pte``: a MobileNet-style classifier of real size on a ``float32
  [1, 3, 224, 224]`` frame (a stride-2 stem, six depthwise-separable blocks with hardswish down
  to 7x7, global average pool, a 1000-class linear layer: ~0.4 M weights, ~60 M
  multiply-accumulates), delegated whole to ``NpuSimBackend``; the main job
  (``examples/cameras.toml``) runs decoded video frames through it.
- ``tiny.onnx`` and ``tiny_onnx.pte`` (only when the ``onnx`` package is installed): a tiny
  ONNX model (Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm) on the same input, and
  the program ``orchestra.import_onnx`` makes of it (one delegate to OnnxRuntimeBackend), for
  ``examples/onnx_camera.toml``.

Run from anywhere: ``python examples/make_models.py``.
"""

from __future__ import annotations

import pathlib
import sys

import numpy as np

from orchestra import aot
from orchestra.program import dumps

MODELS = pathlib.Path(__file__).resolve().parent / "models"
INPUT_SHAPE = (1, 3, 16, 16)
SEED = 20240611


def _weights(rng: np.random.Generator, *shape: int) -> np.ndarray:
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
    return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)


def convnet_npu() -> bytes:
    """The conv net, delegated whole to NpuSimBackend, as .pte bytes."""
    from orchestra.backends import npu_sim

    if "NpuSimBackend" not in aot.aot_backends():  # registered by entry point when installed
        aot.register_aot_backend("NpuSimBackend", npu_sim.NpuSimBackendDetails)
    rng = np.random.default_rng(SEED)
    sub = aot.ProgramBuilder()
    s = sub.method("forward")
    x = s.input(np.float32, INPUT_SHAPE)
    # conv(weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    h = s.call("aten::convolution.out", x, _weights(rng, 8, 3, 3, 3), _weights(rng, 8),
               [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    h = s.call("aten::relu.out", h)
    h, _ = s.call("aten::max_pool2d_with_indices.out", h, [2, 2], [2, 2])  # -> [1, 8, 8, 8]
    h = s.call("aten::convolution.out", h, _weights(rng, 16, 8, 3, 3), _weights(rng, 16),
               [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    h = s.call("aten::relu.out", h)
    h, _ = s.call("aten::max_pool2d_with_indices.out", h, [2, 2], [2, 2])  # -> [1, 16, 4, 4]
    h = s.call("aten::view_copy.out", h, [1, 16 * 4 * 4])
    y = s.call("aten::linear.out", h, _weights(rng, 10, 256), _weights(rng, 10))  # -> [1, 10]
    s.output(y)

    outer = aot.ProgramBuilder()
    f = outer.method("forward")
    (out,) = f.delegate("NpuSimBackend", sub, [f.input(np.float32, INPUT_SHAPE)])
    f.output(out)
    return outer.to_bytes()


# (out_channels, stride) of each depthwise-separable block of mobilenet_npu.
MOBILENET_BLOCKS = ((32, 2), (64, 2), (96, 1), (128, 2), (192, 1), (256, 2))
MOBILENET_INPUT = (1, 3, 224, 224)
MOBILENET_CLASSES = 1000


def mobilenet_npu() -> bytes:
    """The MobileNet-style classifier, delegated whole to NpuSimBackend, as .pte bytes."""
    from orchestra.backends import npu_sim

    if "NpuSimBackend" not in aot.aot_backends():
        aot.register_aot_backend("NpuSimBackend", npu_sim.NpuSimBackendDetails)
    rng = np.random.default_rng(SEED + 2)
    sub = aot.ProgramBuilder()
    s = sub.method("forward")
    x = s.input(np.float32, MOBILENET_INPUT)
    c = 16
    h = s.call("aten::convolution.out", x, _weights(rng, c, 3, 3, 3), _weights(rng, c),
               [2, 2], [1, 1], [1, 1], False, [0, 0], 1)                  # -> [1, 16, 112, 112]
    h = s.call("aten::hardswish.out", h)
    for out_c, stride in MOBILENET_BLOCKS:
        # depthwise 3x3 (groups = channels), then pointwise 1x1
        h = s.call("aten::convolution.out", h, _weights(rng, c, 1, 3, 3), _weights(rng, c),
                   [stride, stride], [1, 1], [1, 1], False, [0, 0], c)
        h = s.call("aten::hardswish.out", h)
        h = s.call("aten::convolution.out", h, _weights(rng, out_c, c, 1, 1), _weights(rng, out_c),
                   [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
        h = s.call("aten::hardswish.out", h)
        c = out_c                                                           # ends at [1, 256, 7, 7]
    h = s.call("aten::mean.out", h, [2, 3], False, None)                   # -> [1, 256]
    y = s.call("aten::linear.out", h, _weights(rng, MOBILENET_CLASSES, c), _weights(rng, MOBILENET_CLASSES))
    s.output(y)

    outer = aot.ProgramBuilder()
    f = outer.method("forward")
    (out,) = f.delegate("NpuSimBackend", sub, [f.input(np.float32, MOBILENET_INPUT)])
    f.output(out)
    return outer.to_bytes()


def tiny_onnx() -> bytes:
    """A tiny ONNX model (needs the ``onnx`` package), serialized."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(SEED + 1)
    w = numpy_helper.from_array(_weights(rng, 4, 3, 3, 3), "conv_w")
    b = numpy_helper.from_array(_weights(rng, 4), "conv_b")
    fc_w = numpy_helper.from_array(_weights(rng, 10, 4), "fc_w")
    fc_b = numpy_helper.from_array(_weights(rng, 10), "fc_b")
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["r"]),
            helper.make_node("GlobalAveragePool", ["r"], ["p"]),
            helper.make_node("Flatten", ["p"], ["f"], axis=1),
            helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], transB=1),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(INPUT_SHAPE))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        initializer=[w, b, fc_w, fc_b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="orchestra-examples")
    model.ir_version = 8  # readable by every onnxruntime >= 1.16
    onnx.checker.check_model(model)
    return model.SerializeToString()


def main() -> int:
    MODELS.mkdir(exist_ok=True)
    path = MODELS / "convnet_npu.pte"
    path.write_bytes(convnet_npu())
    print(f"wrote {path}")
    path = MODELS / "mobilenet_npu.pte"
    path.write_bytes(mobilenet_npu())
    print(f"wrote {path}")
    try:
        import onnx  # noqa: F401
    except ImportError:
        print("onnx is not installed: skipped tiny.onnx and tiny_onnx.pte (pip install 'orchestra[onnx]')")
        return 0
    from orchestra import import_onnx

    model = tiny_onnx()
    (MODELS / "tiny.onnx").write_bytes(model)
    print(f"wrote {MODELS / 'tiny.onnx'}")
    (MODELS / "tiny_onnx.pte").write_bytes(dumps(import_onnx(model)))
    print(f"wrote {MODELS / 'tiny_onnx.pte'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
