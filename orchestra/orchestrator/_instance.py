"""Instances (loop side of a worker) and pools (a method loaded as several instances).

Everything here runs on the event loop's thread; the worker thread talks back only through
``loop.call_soon_threadsafe``. ``Instance.execute`` is the hot path: a loop future, one
``SimpleQueue.put``, one await.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import math
import queue
import time
import warnings
from collections.abc import Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import anyio

from ..errors import InvalidArgumentError, NotFoundError
from ..runtime import OptionSpec, Program, get_backend_class
from ..telemetry import LatencyWindow, bound, get_logger
from ._errors import DeadlineError, InstanceClosedError, InstanceFailedError, ResourceError
from ._methods import Routed
from ._resources import Reservation
from ._spec import InstanceSpec
from ._stats import InstanceStatistics, PoolStatistics
from ._process_worker import ProcessWorker
from ._ray import RayWorker
from ._threads import thread_budget
from ._worker import STOP, WAKE, OptionChange, Worker

if TYPE_CHECKING:  # pragma: no cover
    from ._orchestrator import Orchestrator

__all__ = ["Execution", "Instance", "Origin", "Pool"]

_log = get_logger(__name__)

Options = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class Origin:
    """Who set a value and why (what ``explain()`` reports).

    ``source`` is ``"default"`` (the backend's declared default), ``"spec"`` (the
    InstanceSpec's backend_options), ``"binding"`` (implied by the resource binding) or
    ``"policy"`` (then ``policy``, ``priority``, ``reason`` and ``signals`` say which, why and
    on what signal values). ``at`` is ``time.monotonic()`` and ``wall`` ``time.time()`` when
    the value was set.
    """

    source: str
    value: Any
    policy: str | None = None
    priority: int | None = None
    reason: str = ""
    signals: Mapping[str, Any] = field(default_factory=dict)
    at: float = 0.0
    wall: float = 0.0


@dataclass(frozen=True, slots=True)
class Execution:
    """One execute, with what it ran with (``execute(..., detail=True)`` returns it).

    ``outputs``: the method's outputs; ``options``: backend -> option -> value in force for
    *this* execute (read on the worker right after it, so a change racing with it can't
    mislabel it); ``instance``: the instance that ran it; ``latency_s``: the time of the
    execute on the worker (not the queueing before it).
    """

    outputs: list[Any]
    options: Mapping[str, Mapping[str, Any]]
    instance: str
    latency_s: float


def _settle(fut: asyncio.Future, exc: BaseException | None = None, value: Any = None) -> None:
    if not fut.done():
        if exc is None:
            fut.set_result(value)
        else:
            fut.set_exception(exc)


def _frozen(options: Mapping[str, Mapping[str, Any]]) -> Options:
    return MappingProxyType({b: MappingProxyType(dict(v)) for b, v in options.items()})



def _queued(w: Any) -> list[Any]:
    """Takes every request still in worker ``w``'s inbox (control markers dropped)."""
    items = []
    while True:
        try:
            item = w.inbox.get_nowait()
        except queue.Empty:
            return items
        if item is not STOP and item is not WAKE:
            items.append(item)

def _stuck_how(inst: Instance) -> str:
    return {"ray": "its Ray actor killed", "process": "its worker process killed"}.get(
        inst.placement, "its worker thread abandoned")


class Instance:
    """One instance of a pool's method: a worker thread owning one Method.

    Get it with ``pool["front"]``. The object stays the same across restarts and
    replacements (its worker changes).
    """

    def __init__(self, pool: Pool, spec: InstanceSpec, reservation: Reservation,
                 baseline: Options, sources: Mapping[tuple[str, str], str]) -> None:
        self.pool = pool
        self.spec = spec
        self.name = spec.name
        self.reservation = reservation
        self._orch = pool._orch
        self._loop = pool._orch._loop
        self.baseline = baseline
        self._sources = dict(sources)
        self.desired: Options = baseline  # replaced whole, never mutated: workers read it
        now, wall = time.monotonic(), time.time()
        self.origins: dict[tuple[str, str], Origin] = {
            k: Origin(src, baseline[k[0]][k[1]], at=now, wall=wall) for k, src in sources.items()}
        self.action_origins: dict[str, Origin] = {}
        self.latency = LatencyWindow()
        self.frame_latency = LatencyWindow()  # frames of the pipeline it serves, queueing included
        self.serves_pipeline = False
        self._in_flight = 0
        self._state = "starting"
        self._paused = False
        self._blocked = True  # paused, or not running: execute takes the slow path
        self._wake = anyio.Event()
        self._rate = spec.target_rate_hz
        self._base = [0, 0, 0, 0]  # executes, failures, restarts, rejected of workers that are gone
        self.replacements = 0
        self._fail_reason: str | None = None
        self._fail_exc: BaseException | None = None
        self._generation = 0
        self._worker: Worker | None = None
        self._ready: dict[Worker, asyncio.Future] = {}
        self._exit: dict[Worker, asyncio.Future] = {}
        self._acks: set[asyncio.Future] = set()  # option changes sent, not yet in force

    # -- the hot path -------------------------------------------------------------------
    async def execute(self, inputs: Sequence[Any], backend_options: Mapping[str, Mapping[str, Any]] | None = None,
                      *, method: str | None = None, detail: bool = False) -> Any:
        """Runs the method once on this instance's worker; returns its outputs (a list), or
        with ``detail=True`` an :class:`Execution`: the outputs plus the options this execute
        ran with, the instance and the execute's latency.

        ``inputs`` are read while the execute runs (thread placement reads them in place;
        process placement copies them into the worker's shared memory when it sends the
        request): don't change them until the call returns.

        ``method`` picks another of the pool's ``methods`` (they share this instance's state);
        default: the pool's method. ``backend_options`` overrides hot options for this call only. On a paused instance
        this waits until it is resumed (wrap it in ``anyio.fail_after`` to bound the wait).
        Cancelling the call abandons its result (a request already queued still runs).

        Raises:
            ExecuteRejectedError: the inputs (count, dtype, shape) or ``backend_options`` were
                refused (also an InvalidArgumentError; counted as ``rejected``, not a failure).
            ExecuteError: the Method raised (``__cause__`` is its exception; the instance
                restarts per its RestartPolicy).
            DeadlineError: the execute ran past the instance's ``deadline_s``.
            InstanceFailedError: the instance failed (gave up restarting); says why.
            InstanceClosedError: the instance was removed or the orchestrator closed.
        """
        if method is not None and method != self.pool.method:
            inputs = self.pool._for_method(method, inputs)
        if self._blocked:
            await self._wait_runnable()
        fut = self._loop.create_future()
        self._in_flight += 1
        self._worker.inbox.put((fut, inputs, backend_options, detail))  # type: ignore[union-attr]
        if not detail:
            return await fut
        out, options, dt = await fut
        return Execution(out, options, self.name, dt)

    def record_frame_latency(self, seconds: float) -> None:
        """A pipeline this instance serves processed a frame in ``seconds`` (capture to
        result, queueing included). The pipeline calls it; policies read the window
        (``InstanceView.frame_latency_p95``; ``latency_target`` acts on it by default)."""
        self.serves_pipeline = True
        self.frame_latency.record(seconds)

    def _resolve(self, batch: list) -> None:
        """Runs on the loop: results from the worker."""
        self._in_flight -= len(batch)
        for fut, ok, value in batch:
            if ok is None or fut.done():
                continue
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)

    @staticmethod
    def _resolve_late(batch: list) -> None:
        """Results from an abandoned worker: counted already, delivered if still awaited."""
        for fut, ok, value in batch:
            if ok is not None and not fut.done():
                (fut.set_result if ok else fut.set_exception)(value)

    async def _wait_runnable(self) -> None:
        while self._blocked:
            state = self._state
            if state == "failed":
                err = InstanceFailedError(f"instance {self.name!r} failed: {self._fail_reason}", instance=self.name)
                raise err from self._fail_exc
            if state in ("draining", "closed"):
                raise InstanceClosedError(f"instance {self.name!r} is {'being removed' if state == 'draining' else 'closed'}")
            if state == "starting":
                raise InstanceClosedError(f"instance {self.name!r} is not started")
            await self._wake.wait()  # paused

    def _update(self) -> None:
        blocked = self._paused or self._state != "running"
        was = self._blocked
        self._blocked = blocked
        if was and not blocked or blocked and self._state in ("failed", "draining", "closed"):
            self._wake.set()
            self._wake = anyio.Event()
        self.pool._routing_changed()

    # -- lifetime -------------------------------------------------------------------------
    def _spawn(self) -> Worker:
        self._generation += 1
        cluster = self._orch._cluster
        extra: dict[str, Any] = {}
        if cluster is not None:  # the Method runs in a Ray actor on the node with the binding's resources
            cls: type[Any] = RayWorker
            extra = {"cluster": cluster, "reservation": lambda: self.reservation, "capacity": self._orch.resources._capacity}
        else:
            cls = ProcessWorker if self.spec.placement == "process" else Worker
        w = cls(instance=self.name, pool=self.pool.name, program=self.pool.program, method_name=self.pool.method,
                   desired=lambda: self.desired, cpus=self.reservation.cpus, restart=self.spec.restart,
                   loop=self._loop, latency=self.latency, resolve=self._resolve, on_ready=self._on_ready,
                   on_failed=self._on_failed, on_exit=self._on_exit,
                   period=1.0 / self._rate if self._rate else 0.0, generation=self._generation,
                    initializer=self._orch.process_initializer, threads=self._orch._threads,
                    methods=self.pool.methods if len(self.pool.methods) > 1 else (), **extra)
        w.redirect = self._resubmit
        self._ready[w] = self._loop.create_future()
        self._exit[w] = self._loop.create_future()
        return w

    async def _start(self) -> None:
        w = self._worker = self._spawn()
        w.start()
        ready = self._ready[w]
        try:
            await ready
        except BaseException:
            self._state = "closed"
            w.inbox.put(STOP)  # cancelled while loading: the worker exits once loaded
            self._update()
            raise
        finally:
            self._ready.pop(w, None)
        self._state = "running"
        self._update()

    def _on_ready(self, w: Worker, exc: BaseException | None) -> None:
        fut = self._ready.pop(w, None)
        if fut is not None:  # the first start: load() awaits it
            _settle(fut, exc)
            return
        if w is not self._worker:
            return
        if exc is not None:  # a replacement failed to load
            self._mark_failed(f"its replacement failed to load: {type(exc).__name__}: {exc}", exc, w)
        else:
            _log.info("instance replacement ready", instance=self.name, generation=w.generation)
            self._update()

    def _on_failed(self, w: Worker, reason: str, exc: BaseException) -> None:
        if w is self._worker:
            self._mark_failed(reason, exc, w)

    def _on_exit(self, w: Worker) -> None:
        fut = self._exit.pop(w, None)
        if fut is not None:
            _settle(fut)
        if w is self._worker:
            self._settle_acks()

    def _settle_acks(self) -> None:
        """Option changes nobody will put in force (the worker is gone): done, so that no
        ``set_options`` waits forever; a new worker loads the desired options."""
        acks, self._acks = self._acks, set()
        for fut in acks:
            _settle(fut)

    def _mark_failed(self, reason: str, exc: BaseException, w: Worker) -> None:
        if self._state in ("failed", "closed"):
            return
        self._state = "failed"
        self._fail_reason = reason
        self._fail_exc = exc
        err = InstanceFailedError(f"instance {self.name!r} failed: {reason}", instance=self.name)
        err.__cause__ = exc
        leftovers = [(item[0], False, err) for item in _queued(w)]  # posted before the loop learned of the failure
        if leftovers:
            self._resolve(leftovers)
        self._orch.resources.release(self.reservation)
        self._settle_acks()
        with bound(instance=self.name, pool=self.pool.name):
            _log.error("instance marked failed and removed from routing", reason=reason)
        self._update()

    def _resubmit(self, item: Any) -> None:
        w = self._worker
        if self._state in ("draining", "closed") and (w is None or w.abandoned):
            self._resolve([(item[0], False, InstanceClosedError(f"instance {self.name!r} was removed"))])
        elif self._state == "failed" or w is None:
            self._resolve([(item[0], False, InstanceFailedError(f"instance {self.name!r} failed: {self._fail_reason}",
                                                                  instance=self.name))])
        else:
            w.inbox.put(item)

    def _quarantine(self, w: Worker, started: float) -> None:
        """The deadline watchdog found ``w`` stuck in an execute since ``started``."""
        if w is not self._worker or w.started != started or w.abandoned or self._state in ("failed", "closed"):
            return
        w.abandoned = True
        w.resolve = self._resolve_late
        w.kill()  # a worker process is ended; a thread can only be abandoned
        deadline = self.spec.deadline_s
        err = DeadlineError(
            f"instance {self.name!r}: execute ran past its deadline of {deadline:g} s; the instance was quarantined "
            f"({_stuck_how(self)}, "
            f"its Method never reused) and replaced by a fresh one", instance=self.name)
        done, w.pending = w.pending, []
        fut = w.current
        if fut is not None:
            done.append((fut, False, err))
        self._resolve(done)
        self._base[0] += w.executions
        self._base[1] += w.failures + 1
        self._base[2] += w.restarts
        self._base[3] += w.rejected
        self.replacements += 1
        moved = _queued(w)
        while w.mailbox:  # the replacement loads the desired options directly
            ch = w.mailbox.popleft()
            if ch.ack is not None:
                ch.ack(None)
        self._settle_acks()  # a change the stuck worker was preparing: the replacement loads it
        exited = self._exit.pop(w, None)
        if exited is not None:
            _settle(exited)  # nobody waits for the abandoned thread
        with bound(instance=self.name, pool=self.pool.name):
            _log.error("instance quarantined after a deadline; replacing it", deadline_s=deadline,
                       stuck=w.label, requeued=len(moved))
        if self._state == "draining":  # being removed: no replacement; queued work fails
            self._resolve([(it[0], False, InstanceClosedError(f"instance {self.name!r} was removed")) for it in moved])
            self._state = "closed"
            self._update()
            return
        nw = self._worker = self._spawn()
        self._ready.pop(nw, None)  # readiness arrives through _on_ready as a replacement
        for item in moved:
            nw.inbox.put(item)
        nw.start()

    async def _stop(self, timeout: float | None) -> None:
        """Drains: requests already queued complete, then the worker exits."""
        if self._state in ("closed",):
            return
        failed = self._state == "failed"
        if not failed:
            self._state = "draining"
        self._update()
        w = self._worker
        fut = self._exit.get(w) if w is not None else None
        if w is not None and fut is not None and not failed:
            w.inbox.put(STOP)
        if fut is not None:
            with anyio.move_on_after(math.inf if timeout is None else timeout) as scope:
                await fut
            if scope.cancelled_caught:
                _log.warning("instance did not drain in time; its worker is abandoned (a worker process is killed)",
                             instance=self.name, timeout_s=timeout)
                if w is not None:
                    self._abandon(w)
        self._state = "closed"
        self._settle_acks()
        self._update()

    def _abandon(self, w: Worker) -> None:
        """A drain timed out: ``w`` is abandoned (a worker process is killed, a thread left
        to return on its own) and every caller still waiting on it gets
        InstanceClosedError now; a result the abandoned thread delivers later is dropped."""
        if not w.abandoned:
            self._base[0] += w.executions
            self._base[1] += w.failures
            self._base[2] += w.restarts
            self._base[3] += w.rejected
        w.abandoned = True
        w.resolve = self._resolve_late
        w.kill()
        how = ("its Ray actor was killed" if self.placement == "ray" else "its worker process was stopped"
               if self.spec.placement == "process"
               else "its worker thread was abandoned")
        err = InstanceClosedError(f"instance {self.name!r} was removed: it did not drain within close_timeout; {how}")
        batch, w.pending = w.pending, []  # results it finished but had not posted yet
        fut = w.current
        if fut is not None:
            batch.append((fut, False, err))
        batch.extend((item[0], False, err) for item in _queued(w))
        while w.mailbox:
            ch = w.mailbox.popleft()
            if ch.ack is not None:
                ch.ack(None)
        self._settle_acks()
        if batch:
            self._resolve(batch)

    # -- state ----------------------------------------------------------------------------
    @property
    def state(self) -> str:
        """``running``, ``paused``, ``restarting``, ``replacing``, ``draining``, ``failed`` or ``closed``."""
        s = self._state
        if s != "running":
            return s
        w = self._worker
        if w is not None and w.state == "loading":
            return "replacing"
        if w is not None and w.state == "restarting":
            return "restarting"
        return "paused" if self._paused else "running"

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def binding(self) -> Mapping[str, Any]:
        return self.reservation.bind

    def pause(self) -> None:
        """Takes the instance out of routing; its executes wait until :meth:`resume`."""
        if not self._paused:
            self._paused = True
            self._update()

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            self._update()

    @property
    def paused(self) -> bool:
        return self._paused

    def set_target_rate(self, hz: float | None) -> None:
        """Paces executes to at most ``hz`` per second on the worker (None: no limit)."""
        if hz is not None and (isinstance(hz, bool) or not isinstance(hz, (int, float)) or not 0 < hz < math.inf):
            raise InvalidArgumentError(f"instance {self.name!r}: target rate must be a number > 0 or None, got {hz!r}")
        self._rate = hz
        if self._worker is not None:
            self._worker.period = 1.0 / hz if hz else 0.0

    @property
    def target_rate_hz(self) -> float | None:
        return self._rate

    def options(self) -> Mapping[str, Mapping[str, Any]]:
        """The options in force: backend -> option -> value, as the next execute runs with
        them (after ``await set_options(...)`` returns, they include its change). Empty
        while the instance has no Method loaded."""
        w = self._worker
        m = w.method if w is not None else None
        if m is None:
            return MappingProxyType({})
        return m.options()  # a Method, a MethodSet, or a worker process (as of its last reply)

    def options_in_force(self) -> dict[str, dict[str, Any]]:
        """Deprecated: :meth:`options`."""
        warnings.warn("Instance.options_in_force() is deprecated; use options()", DeprecationWarning, stacklevel=2)
        return {b: dict(v) for b, v in self.options().items()}

    def value(self, backend: str, option: str) -> Any:
        """The desired (in force or pending) value of one option."""
        v = self.desired.get(backend, {})
        if option in v:
            return v[option]
        return self.pool.option_specs[backend][option].default

    def baseline_origin(self, backend: str, option: str) -> Origin:
        """Where the value comes from when no policy sets it."""
        vals = self.baseline.get(backend, {})
        if option in vals:
            return Origin(self._sources.get((backend, option), "spec"), vals[option])
        return Origin("default", self.pool.option_specs[backend][option].default)

    def _checked(self, changes: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
        """``changes`` validated the way a Method validates them (unknown backend or option,
        wrong type or choice: InvalidArgumentError), and refused where the resource binding
        owns the option (ResourceError: change the binding with ``Pool.move``)."""
        where = f"instance {self.name!r}"
        if not isinstance(changes, Mapping):
            raise InvalidArgumentError(f"{where}: options must be a mapping backend -> {{option: value}}, "
                                       f"got {type(changes).__name__}")
        pool = self.pool
        out: dict[str, dict[str, Any]] = {}
        for b, vals in changes.items():
            specs = pool.option_specs.get(b)
            if specs is None:
                raise InvalidArgumentError(f"{where}: backend {b!r} is not used by method(s) "
                                           f"{', '.join(map(repr, pool.methods))} (it delegates to: "
                                           f"{', '.join(pool.backends) or 'no backend'})")
            if not isinstance(vals, Mapping):
                raise InvalidArgumentError(f"{where}: options of backend {b!r} must be a mapping option -> value, "
                                           f"got {type(vals).__name__}")
            bound_opts = self.reservation.options.get(b, {})
            for k, v in vals.items():
                s = specs.get(k)
                if s is None:
                    raise InvalidArgumentError(f"{where}: backend {b!r} has no option {k!r} "
                                               f"(options: {', '.join(specs) or 'none'})")
                if k in bound_opts and not s.hot:
                    raise ResourceError(f"{where}: {b} option {k!r} is set by its binding {dict(self.reservation.bind)} "
                                        f"({k}={bound_opts[k]!r}); change the binding with "
                                        f"Pool.move({self.name!r}, bind) instead")
                try:
                    out.setdefault(b, {})[k] = s.check(v, b)
                except InvalidArgumentError as exc:
                    raise InvalidArgumentError(f"{where}: {exc.message}", exc.code) from None
        return out

    async def set_options(self, options: Mapping[str, Mapping[str, Any]]) -> None:
        """Changes this instance's options: ``{backend: {option: value}}``, every value in
        one snapshot. Returns once the change is in force: at the instance's next execute
        boundary (after the execute running now), or at once when it is idle; from then
        :meth:`options` shows it and every execute runs with it. ``explain()`` reports these
        values with source ``"api"`` (a policy that proposes the same option later wins
        again; one that stops proposing it returns it to this value).

        Raises:
            InvalidArgumentError: unknown backend or option, wrong type, value outside choices.
            ResourceError: the option is set by the instance's resource binding (an NPU core,
                its device): change the binding with ``Pool.move``.
            OrchestraError: the backend failed to re-initialise with the new values (the
                instance keeps the old ones).
        """
        checked = self._checked(options)
        if not checked:
            return
        base = {b: dict(v) for b, v in self.baseline.items()}
        now, wall = time.monotonic(), time.time()
        for b, vals in checked.items():
            base.setdefault(b, {}).update(vals)
            for k, v in vals.items():
                self._sources[(b, k)] = "api"
                self.origins[(b, k)] = Origin("api", v, at=now, wall=wall)
        self.baseline = _frozen(base)
        await self._send(checked)

    def apply_options(self, changes: Mapping[str, Mapping[str, Any]], *, cpus: tuple[int, ...] | None = None) -> asyncio.Future:
        """Deprecated: ``await set_options(changes)``. Validates ``changes`` like it, sends
        them, and returns a future set once they are in force."""
        warnings.warn("Instance.apply_options(changes) is deprecated; use await set_options(changes)",
                      DeprecationWarning, stacklevel=2)
        checked = self._checked(changes)
        now, wall = time.monotonic(), time.time()
        for b, vals in checked.items():
            for k, v in vals.items():
                self.origins[(b, k)] = Origin("api", v, at=now, wall=wall)
        return self._send(checked, cpus=cpus)

    def _send(self, changes: Mapping[str, Mapping[str, Any]], *, cpus: tuple[int, ...] | None = None) -> asyncio.Future:
        """Makes ``changes`` (backend -> option -> value, already validated) this instance's
        desired options and sends them to the worker as one change. Returns a future set
        once they are in force, with an exception if they failed. (The engine and
        ``Pool.move`` use it; they keep ``origins`` themselves.)"""
        merged = {b: dict(v) for b, v in self.desired.items()}
        init_only = set()
        for b, vals in changes.items():
            merged.setdefault(b, {}).update(vals)
            specs = self.pool.option_specs[b]
            if any(not specs[k].hot for k in vals):
                init_only.add(b)
        self.desired = _frozen(merged)
        done = self._loop.create_future()
        w = self._worker
        if w is None or self._state in ("failed", "closed") or w.state in ("failed", "stopped"):
            _settle(done)
            return done
        acks = self._acks
        acks.add(done)
        done.add_done_callback(acks.discard)
        ch = OptionChange(_frozen(changes), frozenset(init_only), cpus, lambda exc: _settle(done, exc))
        w.mailbox.append(ch)
        w.inbox.put(WAKE)
        return done

    def counters(self) -> tuple[int, int, int]:
        """Deprecated: ``statistics()`` (its ``executes``, ``failures``, ``restarts``)."""
        warnings.warn("Instance.counters() is deprecated; use statistics()", DeprecationWarning, stacklevel=2)
        return self._counts()[:3]

    def _counts(self) -> tuple[int, int, int, int]:
        """(executes, failures, restarts, rejected) over every worker this instance had."""
        w = self._worker
        ex, fa, re, rj = self._base
        if w is not None and not w.abandoned:
            ex, fa, re, rj = ex + w.executions, fa + w.failures, re + w.restarts, rj + w.rejected
        return ex, fa, re, rj

    def describe(self) -> dict[str, Any]:
        """Cheap: who this is, what it is bound to, the options in force (what a pipeline's
        statistics show for its executor)."""
        return {"instance": self.name, "pool": self.pool.name, "unit": dict(self.reservation.bind),
                "options": {b: dict(v) for b, v in self.options().items()}, "state": self.state}

    def statistics(self) -> InstanceStatistics:
        w = self._worker
        ex, fa, re, rj = self._counts()
        in_force = self.options()
        pending = {}
        for b, vals in self.desired.items():
            diff = {k: v for k, v in vals.items() if b in in_force and in_force[b].get(k) != v}
            if diff:
                pending[b] = diff
        err = self._fail_reason or (repr(w.last_error) if w is not None and w.last_error is not None else None)
        return InstanceStatistics(
            name=self.name, pool=self.pool.name, state=self.state, binding=self.reservation.bind,
            cpus=self.reservation.cpus, executes=ex, failures=fa, restarts=re, replacements=self.replacements,
            rejected=rj, in_flight=self._in_flight, latency=self.latency.summary(), options=_frozen(in_force),
            pending=_frozen(pending), paused=self._paused, target_rate_hz=self._rate, last_error=err,
            threads=None if w is None or w.state == "loading" else thread_budget(
                self.placement, w.blas, w.blas_source, in_force, self._thread_options()),
            node=getattr(w, "node_id", None), node_address=getattr(w, "address", None))

    @property
    def placement(self) -> str:
        """Where its Method runs: ``"thread"``, ``"process"`` (``InstanceSpec.placement``) or
        ``"ray"`` (an actor on a node of the orchestrator's cluster)."""
        return "ray" if self._orch._cluster is not None else self.spec.placement

    @property
    def node(self) -> tuple[str, str] | None:
        """``(node id, address)`` of the Ray node its Method runs on; None off a cluster (or
        while its actor is not placed)."""
        w = self._worker
        node_id = getattr(w, "node_id", None)
        return None if node_id is None else (node_id, getattr(w, "address", None) or "?")

    def _thread_options(self) -> Mapping[str, str]:
        """Backend -> its thread option, from the orchestrator's CPU resources."""
        out: dict[str, str] = {}
        for r in self._orch.resources.resources:
            out.update(getattr(r, "thread_options", {}))
        return out

    def __repr__(self) -> str:
        return f"<Instance {self.name!r} of pool {self.pool.name!r} {self.state} bind={dict(self.reservation.bind)}>"


_MISSING = object()


class Pool:
    """A program method loaded as several instances; ``orch.load`` returns one.

    ``pool["front"]`` is an :class:`Instance`; ``await pool.execute(x, key="cam7")`` routes:
    a key sticks to the instance it was first routed to (while that instance can take
    work), otherwise the least loaded instance (fewest requests in flight) takes it.
    Paused instances are skipped; when every instance is paused the call waits.

    A pool remembers the ``max_sticky_keys`` (default 65,536) most recently routed keys; a
    key forgotten beyond that is routed afresh next time (and sticks again). Set the
    attribute on a pool to change it.
    """

    max_sticky_keys: int = 65_536

    def __init__(self, orch: Orchestrator, name: str, program: Program, method: str,
                 methods: Sequence[str] | None = None) -> None:
        self._orch = orch
        self.name = name
        self.program = program
        self.method = method
        self.meta = program.method_meta(method)
        # Several methods: every instance is one program instance holding them all (they
        # share its mutable state); ``method`` is the default of execute.
        self.methods: tuple[str, ...] = tuple(dict.fromkeys((method, *(methods or ()))))
        self.backends: tuple[str, ...] = tuple(dict.fromkeys(
            b for m in self.methods for b in program.method_meta(m).backends))
        self.option_specs: dict[str, dict[str, OptionSpec]] = {
            b: {s.name: s for s in get_backend_class(b).option_specs} for b in self.backends}
        self._instances: dict[str, Instance] = {}
        self._routable: list[Instance] = []
        self._sticky: collections.OrderedDict[Hashable, Instance] = collections.OrderedDict()
        self._rr = 0
        self._routed = 0
        self._gone = [0, 0, 0, 0, 0]  # executes, failures, restarts, rejected, replacements of removed instances
        self._avail = anyio.Event()
        self._template: InstanceSpec | None = None
        self._closed = False
        self._gil_hinted = False

    # -- access ---------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Instance:
        try:
            return self._instances[name]
        except KeyError:
            raise NotFoundError(f"pool {self.name!r} has no instance {name!r} "
                                f"(instances: {', '.join(self._instances) or 'none'})") from None

    def __contains__(self, name: object) -> bool:
        return name in self._instances

    def __iter__(self) -> Iterator[Instance]:
        return iter(list(self._instances.values()))

    def __len__(self) -> int:
        return len(self._instances)

    @property
    def instances(self) -> Mapping[str, Instance]:
        """Name -> :class:`Instance`, in the order they were added (read-only; the same shape
        as ``Orchestrator.pools``)."""
        return MappingProxyType(self._instances)

    def options(self) -> Mapping[str, Mapping[str, Mapping[str, Any]]]:
        """Instance name -> its options in force (backend -> option -> value; see
        :meth:`Instance.options`)."""
        return MappingProxyType({n: i.options() for n, i in self._instances.items()})

    async def set_options(self, options: Mapping[str, Mapping[str, Any]]) -> None:
        """``await instance.set_options(options)`` for every instance of the pool that is not
        failed or closed, concurrently; returns once the change is in force on all of them.
        Everything is checked on every instance before anything changes.

        Raises:
            InvalidArgumentError / ResourceError: as :meth:`Instance.set_options`.
        """
        live = [i for i in self._instances.values() if i._state not in ("failed", "closed")]
        for inst in live:
            inst._checked(options)
        async with anyio.create_task_group() as tg:
            for inst in live:
                tg.start_soon(inst.set_options, options)

    # -- routing --------------------------------------------------------------------------
    def _routing_changed(self) -> None:
        self._routable = [i for i in self._instances.values() if not i._blocked]
        self._avail.set()  # waiters re-check
        self._avail = anyio.Event()

    def _pick(self) -> Instance | None:
        r = self._routable
        n = len(r)
        if n == 0:
            return None
        if n == 1:
            return r[0]
        start = self._rr = (self._rr + 1) % n
        best = r[start]
        load = best._in_flight
        if load:
            for k in range(1, n):
                i = r[(start + k) % n]
                if i._in_flight < load:
                    best, load = i, i._in_flight
                    if not load:
                        break
        return best

    async def _wait_pick(self) -> Instance:
        while True:
            inst = self._pick()
            if inst is not None:
                return inst
            if self._closed:
                raise InstanceClosedError(f"pool {self.name!r} is closed")
            waiting = [i for i in self._instances.values() if i._state in ("running", "starting")]
            if not waiting:
                why = "; ".join(f"{i.name}: {i.state}" + (f" ({i._fail_reason})" if i._fail_reason else "")
                                for i in self._instances.values()) or "it has no instances"
                raise InstanceFailedError(f"pool {self.name!r} has no instance that can execute ({why})")
            await self._avail.wait()

    def _for_method(self, method: str, inputs: Sequence[Any]) -> Routed:
        if method not in self.methods:
            raise InvalidArgumentError(f"pool {self.name!r}: method {method!r} is not loaded in its instances "
                                       f"(methods: {', '.join(self.methods)})")
        return Routed(method, inputs)

    async def execute(self, inputs: Sequence[Any], *, key: Hashable | None = None,
                      backend_options: Mapping[str, Mapping[str, Any]] | None = None,
                      method: str | None = None, detail: bool = False) -> Any:
        """Runs the method once on a routed instance (see the class docstring). ``method``
        picks another of the pool's ``methods`` (default: the pool's method); route the
        calls that share state (a sequence's prefill and decodes) with one ``key``.
        Returns the outputs, or with ``detail=True`` an :class:`Execution` (the outputs, the
        options that execute ran with, the instance that ran it, its latency). Raises what
        :meth:`Instance.execute` raises."""
        if method is not None and method != self.method:
            inputs = self._for_method(method, inputs)
        self._routed += 1
        if key is None:
            inst = self._pick() or await self._wait_pick()
        else:
            sticky = self._sticky
            inst = sticky.get(key)
            if inst is None or inst._blocked:
                inst = self._pick() or await self._wait_pick()
                sticky[key] = inst
            sticky.move_to_end(key)
            while len(sticky) > self.max_sticky_keys:
                sticky.popitem(last=False)  # the least recently routed key
        return await inst.execute(inputs, backend_options, detail=detail)

    def routed_to(self, key: Hashable) -> str | None:
        """The instance ``key`` sticks to, if any."""
        inst = self._sticky.get(key)
        return inst.name if inst is not None else None

    # -- elastic --------------------------------------------------------------------------
    def _baseline(self, spec: InstanceSpec, res: Reservation) -> tuple[Options, dict[tuple[str, str], str]]:
        where = f"pool {self.name!r} instance {spec.name!r}"
        opts: dict[str, dict[str, Any]] = {}
        sources: dict[tuple[str, str], str] = {}
        for b, vals in spec.backend_options.items():
            specs = self.option_specs.get(b)
            if specs is None:
                raise InvalidArgumentError(f"{where}: backend {b!r} is not used by method(s) {', '.join(map(repr, self.methods))} "
                                           f"(it delegates to: {', '.join(self.backends) or 'no backend'})")
            for k, v in vals.items():
                s = specs.get(k)
                if s is None:
                    raise InvalidArgumentError(f"{where}: backend {b!r} has no option {k!r} (options: {', '.join(specs) or 'none'})")
                opts.setdefault(b, {})[k] = s.check(v, b)
                sources[(b, k)] = "spec"
        for b, vals in res.options.items():
            for k, v in vals.items():
                mine = opts.get(b, {})
                if k in mine and mine[k] != v:
                    raise ResourceError(f"{where}: backend_options sets {b} {k}={mine[k]!r} but its binding "
                                        f"{dict(res.bind)} sets {k}={v!r}; leave {k!r} to the binding")
                opts.setdefault(b, {})[k] = v
                sources[(b, k)] = "binding"
        return _frozen(opts), sources

    async def add(self, spec: InstanceSpec) -> Instance:
        """Adds an instance: holds its binding, starts its worker, loads its Method.

        Raises:
            ResourceError: the binding can't be satisfied (names the unit and its holder).
            InvalidArgumentError: the name is taken, or an option is invalid.
        """
        (inst,) = await self._add_many([spec])
        return inst

    async def _add_many(self, specs: Sequence[InstanceSpec]) -> list[Instance]:
        orch = self._orch
        orch._check_open()
        made: list[Instance] = []
        try:
            for spec in specs:
                if not isinstance(spec, InstanceSpec):
                    raise InvalidArgumentError(f"pool {self.name!r}: instances must be InstanceSpec, got {spec!r}")
                orch._claim_name(spec.name, self.name)
                try:
                    res = orch.resources.reserve(spec.name, spec.bind, self.backends)
                except BaseException:
                    orch._drop_name(spec.name)
                    raise
                try:
                    baseline, sources = self._baseline(spec, res)
                except BaseException:
                    orch.resources.release(res)
                    orch._drop_name(spec.name)
                    raise
                made.append(Instance(self, spec, res, baseline, sources))
            errors: list[BaseException] = []

            async def start(inst: Instance) -> None:
                try:
                    await inst._start()
                except Exception as exc:  # noqa: BLE001 - collected below
                    errors.append(exc)

            async with anyio.create_task_group() as tg:
                for inst in made:
                    tg.start_soon(start, inst)
            if errors:
                raise errors[0]
        except BaseException:
            with anyio.CancelScope(shield=True):
                for inst in made:
                    if inst._state == "running":
                        await inst._stop(orch.close_timeout)
                    orch.resources.release(inst.reservation)
                    orch._drop_name(inst.name)
            raise
        for inst in made:
            self._instances[inst.name] = inst
            orch._instances[inst.name] = inst
            orch._instance_added(inst)
            self._template = inst.spec
            with bound(instance=inst.name, pool=self.name):
                _log.info("instance added", binding=dict(inst.reservation.bind), cpus=inst.reservation.cpus)
        self._hint_gil()
        self._routing_changed()
        return made

    def _hint_gil(self) -> None:
        """Once per pool: several thread-placed instances of a method with no delegate (every
        operator a kernel of orchestra's numpy interpreter, which holds the GIL between numpy
        calls) will mostly take turns, not run in parallel; say so, and what scales."""
        if self._gil_hinted or self.backends or self._orch._cluster is not None:
            return
        threads = [i.name for i in self._instances.values() if i.spec.placement == "thread"]
        if len(threads) >= 2:
            self._gil_hinted = True
            _log.warning("thread-placed instances of an interpreted method share one GIL", pool=self.name,
                         instances=threads, hint="placement='process' runs each instance in its own worker "
                                                 "process, on its own core")

    async def remove(self, name: str) -> None:
        """Removes an instance after draining it: requests already queued complete, new
        ones are refused (routing skips it at once). Its resources are released."""
        inst = self[name]
        await inst._stop(self._orch.close_timeout)
        self._forget(inst)

    def _forget(self, inst: Instance) -> None:
        if self._instances.get(inst.name) is inst:  # its counts stay in the pool's running totals
            for k, v in enumerate((*inst._counts(), inst.replacements)):
                self._gone[k] += v
        self._instances.pop(inst.name, None)
        self._orch._instances.pop(inst.name, None)
        self._orch._drop_name(inst.name)
        self._orch.resources.release(inst.reservation)
        for k in [k for k, v in self._sticky.items() if v is inst]:
            del self._sticky[k]
        self._routing_changed()
        with bound(instance=inst.name, pool=self.name):
            _log.info("instance removed")

    def _next_name(self) -> str:
        k = 1
        while self._orch._name_taken(f"{self.name}-{k}"):
            k += 1
        return f"{self.name}-{k}"

    async def scale(self, n: int) -> tuple[str, ...]:
        """Runs ``n`` instances (failed ones don't count): adds instances named
        ``<pool>-<k>`` like the most recently added one still in the pool (same options,
        restart policy, deadline), each bound to free units of the same kind, or removes
        (drains) the most recently added. Returns the names added or
        removed.

        Raises:
            ResourceError: no free unit for a new instance (code OutOfResources).
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidArgumentError(f"pool {self.name!r}: scale takes an int >= 0, got {n!r}")
        live = [i for i in self._instances.values() if i._state not in ("failed", "closed")]
        if n > len(live):
            t = live[-1].spec if live else self._template
            if t is None:
                raise InvalidArgumentError(f"pool {self.name!r} has no instance to copy; add() one first")
            specs = []
            resources = self._orch.resources
            held: list[Reservation] = []
            try:
                for _ in range(n - len(live)):
                    name = self._next_name()
                    bind = resources.auto_bind(name, t.bind, self.backends) if t.bind else {}
                    spec = dataclasses.replace(t, name=name, bind=bind)
                    self._orch._claim_name(name, self.name)  # so the next name differs
                    held.append(resources.reserve(name, bind, self.backends))  # so the next bind differs
                    specs.append(spec)
            finally:
                for r in held:
                    resources.release(r)
                for s in specs:
                    self._orch._drop_name(s.name)
            made = await self._add_many(specs)
            return tuple(i.name for i in made)
        gone = [i.name for i in reversed(live)][: len(live) - n]
        async with anyio.create_task_group() as tg:
            for name in gone:
                tg.start_soon(self.remove, name)
        return tuple(gone)

    async def move(self, name: str, bind: Mapping[str, Any], *, origin: Origin | None = None) -> bool:
        """Rebinds an instance: holds the new units, changes its init-only options (the new
        delegate handles are prepared on a helper thread while it keeps executing, and
        swapped in at an execute boundary) and its worker's CPU affinity, then releases the
        old units. Returns False when ``bind`` is what it holds already.

        Raises:
            ResourceError: the new binding can't be satisfied (it keeps the old one).
            OrchestraError: the backend failed to initialise on the new units (it keeps the
                old binding and options).
        """
        inst = self[name]
        resources = self._orch.resources
        old = inst.reservation
        new = resources.resolve(name, bind, self.backends, ignore=name)
        if set(new.slots) == set(old.slots) and dict(new.bind) == dict(old.bind):
            return False
        changes: dict[str, dict[str, Any]] = {}
        for b, vals in new.options.items():
            for k, v in vals.items():
                if inst.value(b, k) != v:
                    changes.setdefault(b, {})[k] = v
        saved = (inst.baseline, inst.desired, dict(inst._sources), dict(inst.origins))
        resources.hold(new)
        inst.reservation = new
        base = {b: dict(v) for b, v in inst.baseline.items()}
        for b, vals in new.options.items():
            base.setdefault(b, {}).update(vals)
            for k in vals:
                inst._sources[(b, k)] = "binding"
        inst.baseline = _frozen(base)
        now, wall = time.monotonic(), time.time()
        for b, vals in changes.items():
            for k, v in vals.items():
                o = origin if origin is not None else Origin("binding", v)
                inst.origins[(b, k)] = dataclasses.replace(o, source="binding", value=v, at=now, wall=wall)
        cpus = None if new.cpus == old.cpus else (new.cpus or ())
        with bound(instance=name, pool=self.name):
            _log.info("instance moving", binding=dict(new.bind), previous=dict(old.bind), changes=changes,
                      policy=origin.policy if origin else None, reason=origin.reason if origin else "")
        if changes or cpus is not None:
            done = inst._send(changes, cpus=cpus)
            with anyio.move_on_after(self._orch.apply_timeout) as scope:
                try:
                    await done
                except Exception as exc:
                    with bound(instance=name, pool=self.name):
                        _log.error("instance move failed; it keeps its old binding", error=repr(exc))
                    resources.release(new)
                    inst.reservation = old
                    inst.baseline, inst.desired, inst._sources, inst.origins = saved
                    raise
            if scope.cancelled_caught:
                with bound(instance=name, pool=self.name):
                    _log.warning("instance move not confirmed in time (the worker is busy); it applies at the "
                                 "worker's next execute boundary", apply_timeout_s=self._orch.apply_timeout)
        if cpus is not None and inst._worker is not None:
            # the thread rules read each worker's CPUs: bound now, or unbound again
            inst._worker.cpus = cpus or None
            self._orch._threads.sharing_changed()
        resources.release(old)
        return True

    async def close(self) -> None:
        """Deprecated: :meth:`aclose` (async objects close with ``aclose``)."""
        warnings.warn("Pool.close() is deprecated; use await pool.aclose()", DeprecationWarning, stacklevel=2)
        await self.aclose()

    async def aclose(self) -> None:
        """Drains and removes every instance."""
        self._closed = True
        async with anyio.create_task_group() as tg:
            for inst in list(self._instances.values()):
                tg.start_soon(inst._stop, self._orch.close_timeout)
        for inst in list(self._instances.values()):
            self._forget(inst)
        self._avail.set()

    def describe(self) -> dict[str, Any]:
        """Cheap: the pool, its method and its instances with their bindings."""
        return {"pool": self.name, "method": self.method, "methods": list(self.methods),
                "instances": {n: dict(i.reservation.bind) for n, i in self._instances.items()}}

    def statistics(self) -> PoolStatistics:
        inst = tuple(i.statistics() for i in self._instances.values())
        ex, fa, re, rj, rp = self._gone
        return PoolStatistics(
            name=self.name, method=self.method, instances=inst,
            executes=ex + sum(s.executes for s in inst), failures=fa + sum(s.failures for s in inst),
            restarts=re + sum(s.restarts for s in inst), replacements=rp + sum(s.replacements for s in inst),
            rejected=rj + sum(s.rejected for s in inst),
            in_flight=sum(s.in_flight for s in inst), routed=self._routed, keys=len(self._sticky))

    def __repr__(self) -> str:
        return f"<Pool {self.name!r} method={self.method!r} instances={list(self._instances)}>"
