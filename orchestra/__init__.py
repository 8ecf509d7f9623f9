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
from .backends.onnxruntime import import_onnx
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
