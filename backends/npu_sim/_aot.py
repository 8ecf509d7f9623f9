"""The ahead-of-time half: ``NpuSimBackendDetails.preprocess``.

The processed blob is the subgraph itself as a ``.pte`` (``orchestra.program.dumps``); the
runtime half loads it with orchestra's own runtime. MACs and the working set are not stored
in the blob or in compile specs: ``init`` recomputes them from the subgraph (one source of
truth, and hand-made blobs cost the same as lowered ones). ``preprocess`` computes them too,
and loads the blob once, so a subgraph the runtime can't run fails here, ahead of time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestra.aot import BackendDetails, CompileSpec, PreprocessResult
from orchestra.errors import BackendError, Error, InvalidArgumentError, OrchestraError
from orchestra.program import ProgramDef, dumps
from orchestra.runtime import load_program

from ._cost import analyze_subgraph

__all__ = ["NpuSimBackendDetails"]


class NpuSimBackendDetails(BackendDetails):
    """Lowers a subgraph (a :class:`~orchestra.program.ProgramDef` with a ``forward``
    method) for ``NpuSimBackend``. Takes no compile specs: where and how an instance runs
    (device, core, power mode, priority) are runtime options."""

    @staticmethod
    def preprocess(program: Any, compile_specs: Sequence[CompileSpec]) -> PreprocessResult:
        """Returns ``dumps(program)``.

        Raises:
            InvalidArgumentError: a compile spec was given (the message names it).
            BackendError: code DelegateInvalidCompatibility when ``program`` is not a
                ProgramDef, has no ``forward``, or does not load in orchestra's runtime
                (e.g. an operator without a kernel; the message says which).
        """
        if compile_specs:
            keys = ", ".join(repr(getattr(cs, "key", cs)) for cs in compile_specs)
            raise InvalidArgumentError(
                f"NpuSimBackend takes no compile specs (got {keys}); device, core, power_mode, priority "
                "and label are runtime options")
        if not isinstance(program, ProgramDef):
            raise BackendError(
                f"NpuSimBackend lowers orchestra ProgramDefs (a subgraph with a 'forward' method), "
                f"got {type(program).__name__}", Error.DelegateInvalidCompatibility)
        blob = dumps(program)
        try:
            analyze_subgraph(program, "forward")
            load_program(blob).load_method("forward").close()
        except OrchestraError as exc:
            raise BackendError(f"NpuSimBackend can't run this subgraph: {exc.message}",
                               Error.DelegateInvalidCompatibility) from exc
        return PreprocessResult(blob)
