"""``NumpyCpuBackend``: runs delegated subgraphs with orchestra's numpy kernels on a
per-instance thread pool.

The processed blob is a ``.pte`` holding the subgraph as method ``forward`` (constants
embedded). ``init`` loads it as an orchestra Method (own arenas) and builds the handle's
:class:`~._executor.Executor`; ``execute`` runs it with the ``num_threads`` in force for this
execute, writing the outputs into the DelegateCall's arrays.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from orchestra.errors import BackendError, Error, InvalidArgumentError, OrchestraError
from orchestra.program import CompileSpec
from orchestra.runtime import (
    BackendExecutionContext,
    BackendInitContext,
    BackendInterface,
    OptionSpec,
    load_program,
)

from ._executor import Executor, TiledOp
from ._pool import WorkerPool

__all__ = ["DEFAULT_MAX_TILES", "MAX_THREADS", "MAX_TILES_LIMIT", "NumpyCpuBackend", "NumpyCpuHandle", "NumpyCpuStatistics"]

BACKEND_ID = "NumpyCpuBackend"
# Upper bounds (a typo like 1000 should fail, not start 999 threads).
MAX_THREADS = 256
MAX_TILES_LIMIT = 64


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# The default of max_tiles: the CPUs this process may run on (2..8).
DEFAULT_MAX_TILES = min(8, max(2, _cpus()))


@dataclass(frozen=True, slots=True)
class _RangeOption(OptionSpec):
    """An int option that must lie in ``1..maximum``; checked wherever a value is passed in
    (``load_method``, ``set_options``, per-call overrides), as types are."""

    maximum: int = 1

    def check(self, value: Any, backend: str) -> Any:
        value = OptionSpec.check(self, value, backend)
        if not 1 <= value <= self.maximum:
            raise InvalidArgumentError(
                f"backend {backend!r} option {self.name!r} must be between 1 and {self.maximum}, got {value!r}")
        return value


@dataclass(frozen=True, slots=True)
class NumpyCpuStatistics:
    """Counters of one handle (one delegate of one Method instance).

    Attributes:
        executions: executes run.
        last_num_threads: the ``num_threads`` the last execute ran with.
        last_threads_used: how many distinct threads ran tiles in the last execute (the
            executing thread included; 1 when nothing was tiled or num_threads was 1).
        workers: worker threads started so far (the pool grows lazily, never shrinks).
        tiled_ops: operators of the subgraph that are cut into tiles, with their tile counts.
    """

    executions: int
    last_num_threads: int
    last_threads_used: int
    workers: int
    tiled_ops: tuple[tuple[str, int], ...]


class NumpyCpuHandle:
    """One delegate instance: its loaded subgraph, its executor and its worker threads."""

    __slots__ = ("executor", "pool", "n_args", "executions", "last_num_threads", "last_threads_used", "destroyed")

    def __init__(self, executor: Executor, pool: WorkerPool) -> None:
        meta = executor.method.meta
        self.executor = executor
        self.pool = pool
        self.n_args = len(meta.inputs) + len(meta.outputs)
        self.executions = 0
        self.last_num_threads = 0
        self.last_threads_used = 0
        self.destroyed = False

    @property
    def tiled_ops(self) -> tuple[TiledOp, ...]:
        return self.executor.tiled

    def statistics(self) -> NumpyCpuStatistics:
        return NumpyCpuStatistics(self.executions, self.last_num_threads, self.last_threads_used,
                                  self.pool.workers, tuple((op.name, op.tiles) for op in self.executor.tiled))

    def __repr__(self) -> str:
        return f"<NumpyCpuHandle {self.pool.name} tiled={len(self.executor.tiled)} workers={self.pool.workers}>"


class NumpyCpuBackend(BackendInterface):
    """orchestra's numpy kernels as a delegate backend, multi-threaded per instance (see
    ``backends/numpy_cpu/README.md``).

    Register it as ``Backend("NumpyCpuBackend", NumpyCpuBackend())`` (or through the
    ``orchestra.backends`` entry point).
    """

    option_specs = (
        _RangeOption("num_threads", int, 1, hot=True, maximum=MAX_THREADS,
                     doc=f"threads that share this instance's heavy operators (1..{MAX_THREADS}); "
                         "takes effect at the next execute"),
        _RangeOption("max_tiles", int, DEFAULT_MAX_TILES, maximum=MAX_TILES_LIMIT,
                     doc=f"init-only: a heavy operator is cut into at most this many tiles (1..{MAX_TILES_LIMIT}; "
                         "1 = never cut); fixed per instance, so results don't depend on num_threads"),
    )

    def init(self, context: BackendInitContext, processed: memoryview, compile_specs: tuple[CompileSpec, ...]) -> NumpyCpuHandle:
        where = f"{BACKEND_ID}: method {context.method_name!r} delegate {context.delegate_index}"
        try:
            program = load_program(bytes(processed))
            method = program.load_method("forward")
        except OrchestraError as exc:
            raise BackendError(f"{where}: the processed blob is not a subgraph this backend can run: {exc.message}",
                               Error.DelegateInvalidCompatibility) from exc
        pool = WorkerPool(f"numpy-cpu-{context.method_name}-d{context.delegate_index}")
        pool.name += f"-{id(pool):x}"
        try:
            executor = Executor(method, pool, where, context.runtime_specs.get("max_tiles"))
        except BaseException:
            method.close()
            raise
        return NumpyCpuHandle(executor, pool)

    def execute(self, context: BackendExecutionContext, handle: NumpyCpuHandle, args: list[Any]) -> None:
        if len(args) != handle.n_args:
            raise BackendError(
                f"{BACKEND_ID}: method {context.method_name!r} delegate {context.delegate_index}: the DelegateCall "
                f"passes {len(args)} values, the subgraph takes {handle.n_args} (inputs then outputs)",
                Error.InvalidProgram)
        threads = context.runtime_specs.get("num_threads")
        handle.executor.execute(args, threads)
        handle.executions += 1
        handle.last_num_threads = threads
        handle.last_threads_used = len(handle.pool.used)

    def destroy(self, handle: NumpyCpuHandle) -> None:
        if handle.destroyed:
            return
        handle.destroyed = True
        try:
            handle.pool.close()
        finally:
            handle.executor.method.close()
