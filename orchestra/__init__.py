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
from .orchestrator import (
    CpuResource,
    DeadlineError,
    ExecuteError,
    InstanceClosedError,
    InstanceFailedError,
    InstanceSpec,
    NpuSimResource,
    Orchestrator,
    ResourceError,
    ResourcePool,
    RestartPolicy,
)
from .pipeline import Frame, FramesFile, Pipeline, Pipelines, SyntheticCamera
from .runtime import Method, MethodMeta, Program, Runtime, Session, load_program

__all__ = [
    "BackendError",
    "ConfigError",
    "CpuResource",
    "DeadlineError",
    "Error",
    "ExecuteError",
    "Frame",
    "FramesFile",
    "InstanceClosedError",
    "InstanceFailedError",
    "InstanceSpec",
    "InvalidArgumentError",
    "Method",
    "MethodMeta",
    "NotFoundError",
    "NpuSimResource",
    "OperatorMissingError",
    "OrchestraError",
    "Orchestrator",
    "Pipeline",
    "Pipelines",
    "Program",
    "ProgramError",
    "ResourceError",
    "ResourcePool",
    "RestartPolicy",
    "Runtime",
    "Session",
    "SyntheticCamera",
    "import_onnx",
    "load_program",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # import_onnx lives with the onnxruntime backend and pulls in the AOT layer: load on use.
    if name == "import_onnx":
        from .backends.onnxruntime import import_onnx

        return import_onnx
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
