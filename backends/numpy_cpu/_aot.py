"""The ahead-of-time half: ``NumpyCpuBackendDetails.preprocess``.

The processed blob is the subgraph as a ``.pte`` (``orchestra.program.dumps``) with its
constants embedded. ``preprocess`` takes either an orchestra
:class:`~orchestra.program.ProgramDef` (from ``MethodBuilder.delegate``) or an ExecuTorch edge
``ExportedProgram`` (from ExecuTorch's ``to_backend``, through
:mod:`orchestra.aot.executorch`), which it converts with
:func:`orchestra.aot.executorch.to_program_def`. Either way it loads the blob once in
orchestra's runtime, so a subgraph the runtime can't run fails here, ahead of time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from orchestra.aot import BackendDetails, CompileSpec, PreprocessResult
from orchestra.errors import BackendError, Error, InvalidArgumentError, OrchestraError
from orchestra.program import ProgramDef, dumps
from orchestra.runtime import load_program

__all__ = ["NumpyCpuBackendDetails"]


class NumpyCpuBackendDetails(BackendDetails):
    """Lowers a subgraph for ``NumpyCpuBackend``. Takes no compile specs: how many threads
    an instance uses is a runtime option (``num_threads``)."""

    @staticmethod
    def preprocess(program: Any, compile_specs: Sequence[CompileSpec]) -> PreprocessResult:
        """Returns the subgraph as ``.pte`` bytes (method ``forward``, constants embedded).

        Raises:
            InvalidArgumentError: a compile spec was given (the message names it).
            BackendError: code DelegateInvalidCompatibility when ``program`` is neither a
                ProgramDef nor an ExecuTorch ExportedProgram, has no ``forward``, or does not
                load in orchestra's runtime (the message says why); code NotSupported when
                an ExportedProgram uses something the conversion can't express.
        """
        if compile_specs:
            keys = ", ".join(repr(getattr(cs, "key", cs)) for cs in compile_specs)
            raise InvalidArgumentError(
                f"NumpyCpuBackend takes no compile specs (got {keys}); num_threads is a runtime option")
        if not isinstance(program, ProgramDef):
            if type(program).__name__ != "ExportedProgram":
                raise BackendError(
                    "NumpyCpuBackend lowers orchestra ProgramDefs (a subgraph with a 'forward' method) or "
                    f"ExecuTorch edge ExportedPrograms, got {type(program).__name__}",
                    Error.DelegateInvalidCompatibility)
            from orchestra.aot.executorch import to_program_def

            program = to_program_def(program)
        if "forward" not in program.method_names:
            raise BackendError(
                f"NumpyCpuBackend: the subgraph has no 'forward' method (methods: {', '.join(program.method_names) or 'none'})",
                Error.DelegateInvalidCompatibility)
        blob = dumps(program)
        try:
            load_program(blob).load_method("forward").close()
        except OrchestraError as exc:
            raise BackendError(f"NumpyCpuBackend can't run this subgraph: {exc.message}",
                               Error.DelegateInvalidCompatibility) from exc
        return PreprocessResult(blob)
