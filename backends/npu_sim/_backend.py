"""``NpuSimBackend``: runs delegated subgraphs on the cores of a modelled NPU.

The processed blob is a ``.pte`` holding the subgraph as method ``forward``. ``init`` loads
it (one :class:`~orchestra.runtime.Method` per delegate handle, so every instance has its
own arenas), computes its MACs and working set, and reserves the working set on the core
the instance is bound to. ``execute`` runs the subgraph's real numpy computation on that
core's thread and accounts the modelled time and energy there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from orchestra.errors import BackendError, Error, OrchestraError
from orchestra.program import CompileSpec
from orchestra.runtime import (
    BackendExecutionContext,
    BackendInitContext,
    BackendInterface,
    Method,
    OptionSpec,
    load_program,
)

from ._cost import SubgraphCost, analyze_subgraph
from ._device import POWER_MODES, JobCost, JobRecord, NpuDevice, Reservation, get_device

__all__ = ["NpuSimBackend", "NpuSimHandle"]


class NpuSimHandle:
    """One delegate instance bound to one core (what ``init`` returns).

    Attributes:
        device, core: where it runs.
        label: the ``label`` option (shows in the core's statistics).
        handle_id: unique on the device.
        cost: the subgraph's MACs and working set.
        costs: the modelled job cost per power mode.
        reservation: its share of the core's memory.
        last_job: the record of its last finished job, or None.
    """

    __slots__ = ("device", "core", "label", "handle_id", "method", "n_inputs", "n_outputs", "cost", "costs",
                 "reservation", "last_job", "destroyed")

    def __init__(self, device: NpuDevice, core: int, label: str, handle_id: int, method: Method,
                 cost: SubgraphCost, costs: Mapping[str, JobCost], reservation: Reservation) -> None:
        self.device = device
        self.core = core
        self.label = label
        self.handle_id = handle_id
        self.method = method
        self.n_inputs = len(method.meta.inputs)
        self.n_outputs = len(method.meta.outputs)
        self.cost = cost
        self.costs = costs
        self.reservation = reservation
        self.last_job: JobRecord | None = None
        self.destroyed = False

    def __repr__(self) -> str:
        label = f" {self.label!r}" if self.label else ""
        return f"<NpuSimHandle #{self.handle_id}{label} on {self.device.name!r} core {self.core}>"


class NpuSimBackend(BackendInterface):
    """The modelled NPU as an orchestra backend (see ``backends/npu_sim/README.md``).

    Register it as ``Backend("NpuSimBackend", NpuSimBackend())`` (or through the
    ``orchestra.backends`` entry point) and register an :class:`NpuDevice` for it to run on.
    """

    option_specs = (
        OptionSpec("device", str, "npu0", doc="init-only: name of the registered NpuDevice to run on"),
        OptionSpec("core", int, 0, doc="init-only: the core this instance is bound to"),
        OptionSpec("power_mode", str, "balanced", choices=POWER_MODES, hot=True,
                   doc="clock/power operating point of this instance's jobs"),
        OptionSpec("priority", int, 0, hot=True,
                   doc="order among jobs waiting on the same core: higher first, then submission order"),
        OptionSpec("label", str, "", doc="init-only: a name for this instance in core statistics (e.g. the camera)"),
    )

    def init(self, context: BackendInitContext, processed: memoryview, compile_specs: tuple[CompileSpec, ...]) -> NpuSimHandle:
        specs = context.runtime_specs
        where = f"NpuSimBackend: method {context.method_name!r} delegate {context.delegate_index}"
        device = get_device(specs["device"])
        core = device.check_core(specs["core"])
        missing = [m for m in POWER_MODES if m not in device.clock_mhz]
        if missing:
            raise BackendError(f"{where}: npu device {device.name!r} lacks power mode(s) {', '.join(missing)} "
                               f"(it has: {', '.join(device.power_modes)})", Error.DelegateInvalidCompatibility)
        try:
            program = load_program(bytes(processed))  # the upload to the device: a copy
            cost = analyze_subgraph(program.definition, "forward")
            method = program.load_method("forward")
        except OrchestraError as exc:
            raise BackendError(f"{where}: the processed blob is not a subgraph this backend can run: {exc.message}",
                               Error.DelegateInvalidCompatibility) from exc
        label = specs["label"]
        named = f" (label {label!r})" if label else ""
        what = (f"{where}{named}: working set {cost.working_set_bytes:,} bytes "
                f"(arenas {cost.arena_bytes:,} + constants {cost.constant_bytes:,})")
        try:
            reservation = device.reserve(core, cost.working_set_bytes, what)
        except BaseException:
            method.close()
            raise
        costs = {mode: device.cost(cost.macs, mode) for mode in device.power_modes}
        return NpuSimHandle(device, core, label, device.new_id(), method, cost, costs, reservation)

    def execute(self, context: BackendExecutionContext, handle: NpuSimHandle, args: list[Any]) -> None:
        specs = context.runtime_specs
        n = handle.n_inputs
        if len(args) != n + handle.n_outputs:
            raise BackendError(
                f"NpuSimBackend: method {context.method_name!r} delegate {context.delegate_index}: the DelegateCall "
                f"passes {len(args)} values, the subgraph takes {n} inputs and {handle.n_outputs} outputs",
                Error.InvalidProgram)
        method = handle.method

        def work() -> None:  # runs on the core's thread
            outs = method.execute(args[:n])
            for k, out in enumerate(outs):
                dst = args[n + k]
                if isinstance(dst, np.ndarray) and isinstance(out, np.ndarray) and dst.shape == out.shape:
                    np.copyto(dst, out, casting="unsafe")
                else:
                    args[n + k] = out

        job = handle.device.submit(handle.core, work, cost=handle.costs[specs["power_mode"]],
                                   priority=specs["priority"], handle_id=handle.handle_id, label=handle.label)
        _, handle.last_job = job.wait()

    def destroy(self, handle: NpuSimHandle) -> None:
        if handle.destroyed:
            return
        handle.destroyed = True
        try:
            handle.device.release(handle.reservation)
        finally:
            handle.method.close()
