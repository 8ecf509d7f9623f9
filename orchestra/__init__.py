"""orchestra: run many instances of one ExecuTorch program method at once."""

from .errors import (
    BackendError,
    ConfigError,
    Error,
    InvalidArgumentError,
    NotFoundError,
    OperatorMissingError,
    OrchestraError,
    ProgramError,
)
from typing import TYPE_CHECKING

# Everything else loads on first use (PEP 562): `import orchestra` and the CLI's quick commands
# (inspect, validate) don't pay for the orchestrator, the pipelines, the policies or the
# kernels until they are used.
_LAZY = {
    **dict.fromkeys(("ActorLostError", "ClusterError", "CpuResource", "DeadlineError", "ExecuteError", "ExecuteRejectedError", "Execution",
                     "InstanceClosedError", "InstanceFailedError", "InstanceSpec", "NpuSimResource", "Orchestrator", "PlacementError", "ResourceError",
                     "ResourcePool", "RestartPolicy"), ".orchestrator"),
    **dict.fromkeys(("Batcher", "Frame", "FramesFile", "JsonlSink", "MqttSink", "NpySink", "Pipeline", "Pipelines",
                     "Preprocess", "SyntheticCamera", "TopK", "VideoSource"), ".pipeline"),
    **dict.fromkeys(("Method", "MethodMeta", "Program", "ProgramInstance", "Runtime", "Session", "load_program"),
                    ".runtime"),
    "import_onnx": ".backends.onnxruntime",  # pulls in the AOT layer too
}
_SUBMODULES = frozenset({"aot", "backends", "config", "errors", "orchestrator", "pipeline", "policies", "program",
                         "runtime", "telemetry"})

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from .backends.onnxruntime import import_onnx
    from .orchestrator import (
        ActorLostError,
        ClusterError,
        CpuResource,
        DeadlineError,
        ExecuteError,
        ExecuteRejectedError,
        Execution,
        InstanceClosedError,
        InstanceFailedError,
        InstanceSpec,
        NpuSimResource,
        Orchestrator,
        PlacementError,
        ResourceError,
        ResourcePool,
        RestartPolicy,
    )
    from .pipeline import (
        Batcher,
        Frame,
        FramesFile,
        JsonlSink,
        MqttSink,
        NpySink,
        Pipeline,
        Pipelines,
        Preprocess,
        SyntheticCamera,
        TopK,
        VideoSource,
    )
    from .runtime import Method, MethodMeta, Program, ProgramInstance, Runtime, Session, load_program

__all__ = [
    "ActorLostError",
    "BackendError",
    "Batcher",
    "ClusterError",
    "ConfigError",
    "CpuResource",
    "DeadlineError",
    "Error",
    "ExecuteError",
    "ExecuteRejectedError",
    "Execution",
    "Frame",
    "FramesFile",
    "InstanceClosedError",
    "InstanceFailedError",
    "InstanceSpec",
    "InvalidArgumentError",
    "JsonlSink",
    "Method",
    "MethodMeta",
    "MqttSink",
    "NotFoundError",
    "NpuSimResource",
    "NpySink",
    "OperatorMissingError",
    "OrchestraError",
    "Orchestrator",
    "Pipeline",
    "Pipelines",
    "PlacementError",
    "Preprocess",
    "Program",
    "ProgramError",
    "ProgramInstance",
    "ResourceError",
    "ResourcePool",
    "RestartPolicy",
    "Runtime",
    "Session",
    "SyntheticCamera",
    "TopK",
    "VideoSource",
    "import_onnx",
    "load_program",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    import importlib

    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module, __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | _SUBMODULES)
