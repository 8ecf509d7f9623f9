"""``Orchestrator``: pools of instances on bound resources, retuned by a policy engine."""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType, TracebackType
from typing import Any

import anyio

from ..errors import Error, InvalidArgumentError, NotFoundError, OrchestraError
from ..policies import Policy, SignalSource
from ..runtime import Program, load_program
from ..telemetry import get_logger
from ._engine import Engine, Explanation
from ._errors import InstanceClosedError
from ._instance import Instance, Pool
from ._ray import RayCluster, check_cluster_address
from ._resources import Resource, ResourcePool
from ._spec import InstanceSpec
from ._stats import EngineRun, OrchestratorStatistics, PoolStatistics
from ._threads import ThreadLimits

__all__ = ["Orchestrator"]

_log = get_logger(__name__)


class Orchestrator:
    """Runs many instances of program methods at once, each on its own worker thread and
    bound resources, with a policy engine retuning their backend options between executes.

    ::

        async with Orchestrator(resources=pool, policies=[...], signals=[...], period=1.0) as orch:
            p = await orch.load(program, method="forward", instances=[
                InstanceSpec(name="front", bind={"camera": "front"}), ...])
            out = await p["front"].execute([x])
            out = await p.execute([x], key="cam7")

    Args:
        resources: a :class:`ResourcePool` (or the resources to build one) that bindings
            draw from; None: no resources (instances can't bind anything).
        policies: :class:`~orchestra.policies.Policy` objects.
        signals: :class:`~orchestra.policies.SignalSource` objects the engine polls.
        period: every policy runs at least once per ``period`` seconds; None: only on
            :meth:`refresh`.
        poll_interval: how often signals are polled (policies whose signals changed run
            then); default ``period``.
        apply_timeout: how long an engine run waits for init-only changes (and moves) to be
            prepared.
        close_timeout: how long removing an instance (or closing) waits for its queued work
            before abandoning its worker thread.
        process_initializer: for ``placement="process"`` instances: a picklable module-level
            function each worker process runs before loading its Method (e.g. to register
            backends that are not entry points).
        blas_threads: compute threads per worker process (given to orchestra's compiled
            kernels where they are built, the BLAS/OpenMP pools then running one; else to those
            pools), and BLAS/OpenMP threads for this process while it runs thread-placed
            instances; None (default): orchestra decides (a worker process:
            the CPUs it is bound to, 1 when unbound and sharing; thread placement: 1), unless
            ``OPENBLAS_NUM_THREADS`` / ``MKL_NUM_THREADS`` / ``OMP_NUM_THREADS`` is set, which
            is then left in force. Each instance's ``statistics().threads`` reports it.
        cluster: None (default): instances run here. ``"auto"``, ``"ray://HOST:PORT"`` or
            ``"HOST:PORT"``: every instance runs its Method in a Ray actor on that cluster,
            requesting exactly its binding as Ray resources (``DEVICE.core.N`` for its NPU
            core, ``camera.NAME`` for its camera, ``CPU`` for the CPUs it binds), so Ray
            starts it on the node that has them; this process keeps the resource accounting
            and the policy engine, option changes reach the actor at its next execute, and
            ``statistics()``/``explain()`` name each instance's node. Needs the ``ray``
            extra (``pip install 'orchestra[ray]'``); the connection is made when the
            orchestrator is entered (and closed when it closes, unless this process was
            connected already). ``process_initializer`` runs in each actor before it loads.

    Needs asyncio (with or without uvloop): the per-execute hand-off uses loop futures and
    ``loop.call_soon_threadsafe``. Everything else is anyio.
    """

    def __init__(self, resources: ResourcePool | Iterable[Resource] | None = None, policies: Sequence[Policy] = (),
                 signals: Sequence[SignalSource] = (), period: float | None = 1.0, *,
                 poll_interval: float | None = None, apply_timeout: float = 5.0, close_timeout: float | None = 10.0,
                 process_initializer: Callable[[], None] | None = None, blas_threads: int | None = None,
                 cluster: str | None = None) -> None:
        if resources is None:
            resources = ResourcePool()
        elif not isinstance(resources, ResourcePool):
            resources = ResourcePool(resources)
        for key, v in (("apply_timeout", apply_timeout), ("close_timeout", close_timeout)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= math.inf):
                raise InvalidArgumentError(f"{key} must be a number of seconds > 0, got {v!r}")
        self._cluster = RayCluster(check_cluster_address(cluster)) if cluster is not None else None
        self.resources = resources
        self.apply_timeout = float(apply_timeout)
        self.close_timeout = close_timeout
        self.process_initializer = process_initializer
        self._threads = ThreadLimits(blas_threads, sharing=lambda: len(self._names), available=self._cpu_count)
        self._engine = Engine(self, tuple(policies), tuple(signals), period, poll_interval)
        self._pools: dict[str, Pool] = {}
        self._gone = (0, 0, 0, 0, 0)  # executes, failures, restarts, replacements, rejected of unloaded pools
        self._instances: dict[str, Instance] = {}
        self._names: dict[str, str] = {}  # instance name -> pool name (claimed while loading too)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tg: Any = None
        self._deadline_added: anyio.Event | None = None  # the watchdog waits on it while no instance has a deadline
        self._open = False
        self._closed = False

    # -- lifetime -------------------------------------------------------------------------
    async def __aenter__(self) -> Orchestrator:
        if self._open or self._closed:
            raise OrchestraError("an Orchestrator can be entered once", Error.InvalidState)
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise OrchestraError("the orchestrator runs on asyncio (with or without uvloop), not on this event loop",
                                 Error.NotSupported) from None
        if self._cluster is not None:  # fails at once (naming the address) when nobody answers there
            if threading.current_thread() is threading.main_thread():
                self._cluster.connect()  # once, at start: Ray sets its signal handlers on the main thread
            else:
                await anyio.to_thread.run_sync(self._cluster.connect)
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        self._open = True
        tg.start_soon(self._engine.serve)
        tg.start_soon(self._watchdog)
        _log.info("orchestrator started", policies=[p.name for p in self._engine.policies],
                  signals=[s.name for s in self._engine.sources], period=self._engine.period)
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> bool | None:
        await self.aclose()
        self._tg.cancel_scope.cancel()
        return await self._tg.__aexit__(et, e, tb)

    async def aclose(self) -> None:
        """Drains and removes every pool (also done when leaving ``async with``)."""
        if not self._open:
            return
        self._open = False
        self._closed = True
        with anyio.CancelScope(shield=True):
            for pool in list(self._pools.values()):
                await pool.aclose()
        self._pools.clear()
        self._threads.restore()
        if self._cluster is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._cluster.close)
        _log.info("orchestrator closed")

    def _cpu_count(self) -> int:
        """The CPUs orchestra was given: its CPU resources', else this process's affinity."""
        ids: set[int] = set()
        for r in self.resources.resources:
            ids.update(getattr(r, "cpu_ids", ()))
        if ids:
            return len(ids)
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

    def _check_open(self) -> None:
        if not self._open:
            raise InstanceClosedError("the orchestrator is not running (use it as `async with Orchestrator(...) as orch`)")

    # -- names ----------------------------------------------------------------------------
    def _claim_name(self, name: str, pool: str) -> None:
        have = self._names.get(name)
        if have is not None:
            raise InvalidArgumentError(f"instance name {name!r} is taken (by pool {have!r}); instance names are unique per orchestrator")
        self._names[name] = pool
        self._threads.sharing_changed()

    def _drop_name(self, name: str) -> None:
        if self._names.pop(name, None) is not None:
            self._threads.sharing_changed()

    def _name_taken(self, name: str) -> bool:
        return name in self._names

    def _live(self) -> list[Instance]:
        return [i for i in self._instances.values() if i._state == "running"]

    # -- pools ----------------------------------------------------------------------------
    async def load(self, program: Program | str | os.PathLike[str] | bytes, method: str = "forward",
                   instances: Sequence[InstanceSpec] = (), *, name: str | None = None,
                   methods: Sequence[str] | None = None) -> Pool:
        """Loads ``method`` of ``program`` as a pool of ``instances``: holds each binding,
        starts each worker thread, loads each Method on it. All or nothing.

        ``name`` names the pool. Default, the rule of the TOML config's ``[program] name``:
        the stem of the program's file (``models/convnet.pte`` -> ``convnet``), or the method
        name for a program made from bytes; made unique with a number (``convnet2``).
        Returns the Pool.

        ``methods`` (e.g. ``("prefill", "decode")``) makes every instance a program
        instance: those methods (and ``method``, the default of ``execute``) loaded together,
        sharing that instance's mutable state (see ``Program.load_methods``); run one with
        ``execute(..., method="decode")``. Without it an instance holds ``method`` alone,
        with its own state even when the program shares state between methods.

        Raises:
            NotFoundError: no such method.
            ResourceError: a binding can't be satisfied (names the unit and who holds it).
            InvalidArgumentError: duplicate names, bad options.
            OrchestraError: a Method failed to load (the runtime's error).
        """
        self._check_open()
        if not isinstance(program, Program):
            program = await anyio.to_thread.run_sync(load_program, program)
        program.method_meta(method)
        if methods is not None:
            if isinstance(methods, str) or not all(isinstance(m, str) for m in methods):
                raise InvalidArgumentError(f"methods must be a sequence of method names, got {methods!r}")
            for m in methods:
                program.method_meta(m)
        if name is None:
            src = program.source
            base = method if src.startswith("<") else (os.path.splitext(os.path.basename(src))[0] or method)
            name, k = base, 1
            while name in self._pools:
                k += 1
                name = f"{base}{k}"
        elif not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"pool name must be a non-empty string, got {name!r}")
        elif name in self._pools:
            raise InvalidArgumentError(f"a pool named {name!r} exists (pools: {', '.join(self._pools)})")
        pool = Pool(self, name, program, method, methods)
        self._pools[name] = pool
        try:
            await pool._add_many(list(instances))
        except BaseException:
            self._pools.pop(name, None)
            raise
        _log.info("pool loaded", pool=name, method=method, methods=list(pool.methods), instances=list(pool.instances))
        return pool

    @property
    def pools(self) -> Mapping[str, Pool]:
        return MappingProxyType(self._pools)

    def pool(self, name: str) -> Pool:
        try:
            return self._pools[name]
        except KeyError:
            raise NotFoundError(f"no pool {name!r} (pools: {', '.join(self._pools) or 'none'})") from None

    def instance(self, name: str) -> Instance:
        """An instance by name, whatever its pool."""
        try:
            return self._instances[name]
        except KeyError:
            raise NotFoundError(f"no instance {name!r} (instances: {', '.join(self._instances) or 'none'})") from None

    async def unload(self, name: str) -> None:
        """Drains and removes a pool."""
        pool = self.pool(name)
        await pool.aclose()
        if self._pools.pop(name, None) is pool:
            self._gone = _add(self._gone, pool.statistics())

    # -- the engine -----------------------------------------------------------------------
    async def refresh(self) -> EngineRun:
        """Runs the policy engine once now: polls the signals, runs every policy, applies.
        When it returns, hot changes are in force for every execute that starts after it
        and init-only changes are prepared (up to ``apply_timeout``)."""
        self._check_open()
        return await self._engine.run(force=True)

    def explain(self) -> Explanation:
        """Per instance and option: the value, who set it (policy, binding, spec or
        default), why (the policy's reason and signal values) and when."""
        return self._engine.explain()

    @property
    def signals(self) -> Mapping[str, Any]:
        """The signal values of the last poll."""
        return self._engine.signals

    # -- deadlines ------------------------------------------------------------------------
    async def _watchdog(self) -> None:
        """Quarantines instances stuck in an execute past their ``deadline_s`` (checked at
        a quarter of the smallest deadline: a stuck execute is caught between 1 and 1.25
        deadlines after it started). While no instance has a deadline it sleeps until one is
        added, so an idle orchestrator does not wake up."""
        while True:
            ds = [i.spec.deadline_s for i in self._instances.values() if i.spec.deadline_s]
            if not ds:
                self._deadline_added = anyio.Event()
                await self._deadline_added.wait()
                continue
            await anyio.sleep(max(min(ds) / 4, 0.002))
            now = time.perf_counter()
            for inst in list(self._instances.values()):
                d = inst.spec.deadline_s
                w = inst._worker
                if d and w is not None:
                    started = w.started
                    if started and now - started > d:
                        try:
                            inst._quarantine(w, started)
                        except Exception as exc:  # noqa: BLE001 - never kill the watchdog
                            _log.exception("quarantine failed", instance=inst.name, error=repr(exc))

    def _instance_added(self, inst: Instance) -> None:
        """Wakes the watchdog when ``inst`` (just added) has a deadline to watch."""
        if inst.spec.deadline_s and self._deadline_added is not None:
            self._deadline_added.set()

    # -- statistics -----------------------------------------------------------------------
    def statistics(self) -> OrchestratorStatistics:
        e = self._engine
        pools = tuple(p.statistics() for p in self._pools.values())
        totals = self._gone
        for ps in pools:
            totals = _add(totals, ps)
        ex, fa, re, rp, rj = totals
        return OrchestratorStatistics(
            pools=pools, engine_runs=e.runs,
            changes_applied=e.changes, actions_applied=e.actions, proposals_rejected=e.rejected,
            policy_errors=e.errors, signals=MappingProxyType(dict(e.signals)),
            executes=ex, failures=fa, restarts=re, replacements=rp, rejected=rj)

    @property
    def cluster(self) -> str | None:
        """The Ray cluster address instances run on (None: they run in this process)."""
        return None if self._cluster is None else self._cluster.address

    def __repr__(self) -> str:
        state = "open" if self._open else "closed" if self._closed else "not started"
        where = "" if self._cluster is None else f" cluster={self._cluster.address!r}"
        return f"<Orchestrator {state}{where} pools={list(self._pools)}>"


def _add(totals: tuple[int, int, int, int, int], ps: PoolStatistics) -> tuple[int, int, int, int, int]:
    ex, fa, re, rp, rj = totals
    return ex + ps.executes, fa + ps.failures, re + ps.restarts, rp + ps.replacements, rj + ps.rejected
