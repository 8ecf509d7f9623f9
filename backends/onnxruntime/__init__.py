"""onnxruntime backend: runs whole ONNX models as ExecuTorch delegates.

- :class:`OnnxRuntimeBackend` (runtime): the delegate blob is the ONNX model's bytes; one
  ``onnxruntime.InferenceSession`` per delegate per Method, configured by runtime options.
- :class:`OnnxRuntimeBackendDetails` (ahead of time): checks an ONNX model and returns its
  bytes as the processed blob.
- :func:`import_onnx`: an ONNX model wrapped as a one-delegate program (``forward``).

onnx and onnxruntime are imported lazily (the ``onnx`` extra); this package imports without
them. Registered through entry points as ``OnnxRuntimeBackend`` (groups
``orchestra.backends`` and ``orchestra.aot_backends``). See README.md.
"""

from typing import Any

from ._common import BACKEND_ID
from ._runtime import OnnxRuntimeBackend, OnnxRuntimeHandle

__all__ = [
    "BACKEND_ID",
    "OnnxRuntimeBackend",
    "OnnxRuntimeBackendDetails",
    "OnnxRuntimeHandle",
    "import_onnx",
]


def __getattr__(name: str) -> Any:
    # The AOT half pulls in orchestra.aot (ProgramBuilder, schemas); load it only when asked,
    # so running programs (and `import orchestra`) stays cheap.
    if name == "OnnxRuntimeBackendDetails":
        from ._aot import OnnxRuntimeBackendDetails

        return OnnxRuntimeBackendDetails
    if name == "import_onnx":
        from ._import import import_onnx

        return import_onnx
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
