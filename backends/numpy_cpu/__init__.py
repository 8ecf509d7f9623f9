"""NumpyCpu: orchestra's numpy kernels as a delegate backend, with a thread pool per instance.

The runtime half (:class:`NumpyCpuBackend`) needs only orchestra's runtime. The AOT half,
:class:`NumpyCpuBackendDetails`, is imported on first access, so running programs never
imports ``orchestra.aot``. See ``backends/numpy_cpu/README.md``.
"""

from typing import Any

from ._backend import DEFAULT_MAX_TILES, MAX_THREADS, MAX_TILES_LIMIT, NumpyCpuBackend, NumpyCpuHandle, NumpyCpuStatistics
from ._executor import MIN_TILE_ELEMENTS, MIN_TILE_MACS, TiledOp, plan_tiled_op

__all__ = [
    "DEFAULT_MAX_TILES",
    "MAX_THREADS",
    "MAX_TILES_LIMIT",
    "MIN_TILE_ELEMENTS",
    "MIN_TILE_MACS",
    "NumpyCpuBackend",
    "NumpyCpuBackendDetails",
    "NumpyCpuHandle",
    "NumpyCpuStatistics",
    "TiledOp",
    "plan_tiled_op",
]


def __getattr__(name: str) -> Any:
    if name == "NumpyCpuBackendDetails":
        try:
            from ._aot import NumpyCpuBackendDetails
        except ImportError as exc:  # orchestra.aot missing or broken: say so, as an AttributeError
            raise AttributeError(f"{__name__}.NumpyCpuBackendDetails needs orchestra.aot: {exc}") from exc
        return NumpyCpuBackendDetails
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
