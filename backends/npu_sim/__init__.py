"""NpuSim: a model of a multi-core, camera-linked NPU that does real numpy computation.

The runtime half (:class:`NpuSimBackend`) and the device model (:class:`NpuDevice` and its
registry) need only orchestra's runtime. The AOT half, :class:`NpuSimBackendDetails`, is
imported on first access, so running programs never imports ``orchestra.aot``.
See ``backends/npu_sim/README.md``.
"""

from typing import Any

from ._backend import NpuSimBackend, NpuSimHandle
from ._cost import OpCost, SubgraphCost, analyze_subgraph
from ._device import (
    DEFAULT_CLOCK_MHZ,
    DEFAULT_JOB_OVERHEAD_CYCLES,
    DEFAULT_LINKS,
    DEFAULT_POWER_W,
    POWER_MODES,
    CoreStatistics,
    DeviceStatistics,
    JobCost,
    JobRecord,
    ModeUsage,
    NpuDevice,
    NpuJob,
    Reservation,
    ServedInstance,
    devices,
    get_device,
    register_device,
    unregister_device,
)

__all__ = [
    "DEFAULT_CLOCK_MHZ",
    "DEFAULT_JOB_OVERHEAD_CYCLES",
    "DEFAULT_LINKS",
    "DEFAULT_POWER_W",
    "POWER_MODES",
    "CoreStatistics",
    "DeviceStatistics",
    "JobCost",
    "JobRecord",
    "ModeUsage",
    "NpuDevice",
    "NpuJob",
    "NpuSimBackend",
    "NpuSimBackendDetails",
    "NpuSimHandle",
    "OpCost",
    "Reservation",
    "ServedInstance",
    "SubgraphCost",
    "analyze_subgraph",
    "devices",
    "get_device",
    "register_device",
    "unregister_device",
]


def __getattr__(name: str) -> Any:
    if name == "NpuSimBackendDetails":
        try:
            from ._aot import NpuSimBackendDetails
        except ImportError as exc:  # orchestra.aot missing or broken: say so, as an AttributeError
            raise AttributeError(f"{__name__}.NpuSimBackendDetails needs orchestra.aot: {exc}") from exc
        return NpuSimBackendDetails
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
