"""The ahead-of-time half: ``OnnxRuntimeBackendDetails.preprocess`` checks an ONNX model and
returns its bytes, the blob the runtime half loads."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from orchestra.aot import BackendDetails, PreprocessResult
from orchestra.errors import InvalidArgumentError, NotFoundError, ProgramError
from orchestra.program import CompileSpec

from ._common import BACKEND_ID, check_names, names_from_specs

__all__ = ["OnnxRuntimeBackendDetails", "graph_io", "load_onnx"]

ModelSource = Any  # bytes-like | onnx.ModelProto | str | os.PathLike[str]


def _onnx() -> Any:
    try:
        import onnx  # lazily: orchestra imports without the onnx extra
    except ImportError as exc:
        raise InvalidArgumentError(
            f"{BACKEND_ID}: reading ONNX models needs the 'onnx' package (pip install 'orchestra[onnx]')"
        ) from exc
    return onnx


def load_onnx(source: ModelSource) -> tuple[Any, bytes, str]:
    """Reads and checks an ONNX model.

    Returns ``(model, model_bytes, name)``: the ``onnx.ModelProto``, its serialized bytes
    (external data, when read from a path, embedded) and a name for messages (the path, or
    ``"<bytes>"`` / ``"<ModelProto>"``).

    Raises:
        NotFoundError: a path that doesn't exist or can't be read.
        ProgramError: not an ONNX model, or one that ``onnx.checker`` rejects.
        InvalidArgumentError: ``source`` is of another type.
    """
    onnx = _onnx()
    if isinstance(source, onnx.ModelProto):
        model, name = source, "<ModelProto>"
        try:
            data = model.SerializeToString()
        except Exception as exc:  # over protobuf's 2 GiB limit
            raise ProgramError(f"{name}: the ONNX model can't be serialized (models must stay under 2 GiB): {exc}") from exc
    elif isinstance(source, (bytes, bytearray, memoryview)):
        data, name = bytes(source), "<bytes>"
        try:
            model = onnx.load_from_string(data)
        except Exception as exc:
            raise ProgramError(f"{name}: not an ONNX model ({len(data)} bytes): {type(exc).__name__}: {exc}") from exc
    elif isinstance(source, (str, os.PathLike)):
        name = os.fspath(source)
        if not os.path.isfile(name):
            raise NotFoundError(f"{name}: no such ONNX model file")
        try:
            model = onnx.load(name)  # with its external data, read from the file's folder
        except OSError as exc:
            raise NotFoundError(f"{name}: can't read the ONNX model (or its external data): {exc}") from exc
        except Exception as exc:
            raise ProgramError(f"{name}: not an ONNX model: {type(exc).__name__}: {exc}") from exc
        try:
            data = model.SerializeToString()
        except Exception as exc:
            raise ProgramError(f"{name}: the ONNX model can't be serialized (models must stay under 2 GiB): {exc}") from exc
    else:
        raise InvalidArgumentError(
            f"{BACKEND_ID} takes an ONNX model as bytes, an onnx.ModelProto or a path, not a {type(source).__name__}"
            + (" (it runs whole ONNX models; export the graph to ONNX first, then use import_onnx)"
               if type(source).__name__ in ("ProgramDef", "ExportedProgram") else "")
        )
    external = [t.name for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    if external:
        raise ProgramError(
            f"{name}: initializer(s) {', '.join(map(repr, external[:5]))} keep their data in external files; "
            "pass the model's path so the data is read and embedded"
        )
    try:
        onnx.checker.check_model(model)
    except Exception as exc:
        raise ProgramError(f"{name}: not a valid ONNX model: {type(exc).__name__}: {exc}") from exc
    return model, data, name


def graph_io(model: Any) -> tuple[list[Any], list[Any]]:
    """The graph's inputs (without initializers listed as inputs) and outputs (ValueInfoProtos)."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits], list(model.graph.output)


class OnnxRuntimeBackendDetails(BackendDetails):
    """Lowers an ONNX model for ``OnnxRuntimeBackend``: checks it with ``onnx.checker`` and
    returns its serialized bytes.

    ``program`` is the model's bytes, an ``onnx.ModelProto`` or a path to a ``.onnx`` file
    (external data next to it is embedded). Compile specs: optional ``input_names`` /
    ``output_names`` (comma-separated, UTF-8), checked against the model here.
    """

    @staticmethod
    def preprocess(program: Any, compile_specs: Sequence[CompileSpec]) -> PreprocessResult:
        model, data, name = load_onnx(program)
        found = names_from_specs(tuple(compile_specs), f"{BACKEND_ID} preprocess of {name}", strict=True)
        if found:
            inputs, outputs = graph_io(model)
            check_names(found, [i.name for i in inputs], [o.name for o in outputs], f"{BACKEND_ID} preprocess of {name}")
        return PreprocessResult(data)
