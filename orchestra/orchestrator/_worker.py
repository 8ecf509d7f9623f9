"""The worker: one dedicated, long-lived thread per instance that owns its Method.

Hand-off (the per-execute hot path, see DESIGN "Performance facts"):

* in: the event loop puts ``(future, inputs, overrides, detail)`` on the worker's
  ``queue.SimpleQueue`` (no lock, no task, no anyio stream);
* out: the worker sends finished results back with one ``loop.call_soon_threadsafe`` per
  *batch*: while executes are fast (under ``BATCH_BELOW_S``) and more requests are already
  queued, results collect for up to ``FLUSH_AFTER_S`` and cross to the loop in one hop;
  slow executes deliver each result at once. A result whose future is already done
  (cancelled by its caller, or failed by the deadline watchdog) is dropped there.

Option changes reach the Method only on this thread, at an execute boundary: the loop
appends a change to ``mailbox`` (a deque) and wakes the worker; before every execute the
worker applies every queued change, all of one change's backends back to back, so an
execute sees one consistent snapshot across backends. A change of init-only values of a
single backend is *prepared* on a short-lived helper thread
(``Method.prepare_backend_options``) while this thread keeps executing with the old
values; later changes wait until it is published, and the swap at the next boundary costs
nothing. Init-only changes spanning several backends are set here
(``set_options``) and rebuilt at the boundary, to stay atomic.

CPU placement: ``os.sched_setaffinity(0, cpus)`` called on the worker thread pins that
thread only (Linux applies affinity per thread; pid 0 is the calling thread). Threads the
backends start inherit it when they are created from this thread. ``placement="process"``
instances use :class:`~._process_worker.ProcessWorker` instead (no thread of their own).
"""

from __future__ import annotations

import collections
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import Error, InvalidArgumentError, OrchestraError
from ..runtime import Method, Program
from ..telemetry import LatencyWindow, bound, get_logger
from ._errors import ExecuteError, ExecuteRejectedError, InstanceFailedError
from ._methods import MethodSet, load_for_worker
from ._spec import RestartPolicy
from ._threads import ThreadLimits

__all__ = ["BATCH_BELOW_S", "FLUSH_AFTER_S", "OptionChange", "Worker", "WorkerBase", "wrap_error"]

_log = get_logger(__name__)

STOP = object()  # finish what is queued before it, close the Method, exit
WAKE = object()  # look at the mailbox

BATCH_BELOW_S = 100e-6  # batch results only while executes take less than this
FLUSH_AFTER_S = 100e-6  # ... and for at most this long
MAX_BATCH = 64


def wrap_error(instance: str, exc: BaseException, what: str) -> ExecuteError:
    """The ExecuteError a caller gets for an execute that raised ``exc`` (its cause): an
    :class:`ExecuteRejectedError` (also an InvalidArgumentError) when the cause is one."""
    code = exc.code if isinstance(exc, OrchestraError) else Error.Internal
    cls = ExecuteRejectedError if isinstance(exc, InvalidArgumentError) else ExecuteError
    err = cls(f"instance {instance!r}: execute failed: {type(exc).__name__}: {exc} ({what})",
                       code, instance=instance)
    err.__cause__ = exc
    return err


@dataclass(slots=True, eq=False)
class OptionChange:
    """One consistent change of an instance's options (applied at one execute boundary).

    ``init_only``: backends whose init-only values change; ``cpus``: a new worker affinity
    (None: keep; ``()``: back to the inherited one); ``ack``: called on the loop with the
    exception or None once the change is published (in force from the next execute).
    """

    changes: Mapping[str, Mapping[str, Any]]
    init_only: frozenset[str] = frozenset()
    cpus: tuple[int, ...] | None = None
    ack: Callable[[BaseException | None], None] | None = None


class WorkerBase:
    """What an Instance needs of its worker, whatever runs the Method (a thread here, a
    process in ``_process_worker.py``): the constructor's arguments, ``inbox`` (``put`` a
    request, STOP or WAKE; ``get_nowait`` takes back one not run), ``mailbox`` (option
    changes), the counters, ``state`` (loading, running, restarting, failed, stopped),
    ``started``/``current`` for the deadline watchdog, ``abandoned``/``redirect``/``resolve``
    for a quarantine, ``method`` (``options()`` in force), ``label``, ``start()`` and
    ``kill()``.
    """

    def __init__(self, *, instance: str, pool: str, program: Program, method_name: str,
                 desired: Callable[[], Mapping[str, Mapping[str, Any]]], cpus: tuple[int, ...] | None,
                 restart: RestartPolicy, loop: Any, latency: LatencyWindow,
                 resolve: Callable[[list], None], on_ready: Callable[[Any, BaseException | None], None],
                 on_failed: Callable[[Any, str, BaseException], None], on_exit: Callable[[Any], None],
                 period: float = 0.0, generation: int = 0, methods: tuple[str, ...] = (),
                 threads: ThreadLimits | None = None, **_: Any) -> None:
        self.instance = instance
        self.pool = pool
        self.program = program
        self.method_name = method_name
        self.methods = methods  # several: one program instance (see _methods.py)
        self.desired = desired
        self.cpus = cpus
        self.restart = restart
        self.loop = loop
        self.latency = latency
        self.resolve = resolve
        self.redirect: Callable[[Any], None] | None = None
        self.on_ready = on_ready
        self.on_failed = on_failed
        self.on_exit = on_exit
        self.mailbox: collections.deque[OptionChange] = collections.deque()
        self.pending: list = []
        self.state = "loading"
        self.executions = 0
        self.failures = 0
        self.restarts = 0
        self.rejected = 0  # requests refused for their inputs or per-call options (caller errors)
        self.consecutive = 0
        self.failed_in_row = 0  # failed executes since the last success (rejected inputs aside)
        self._executions_at_failure = 0
        self.started = 0.0  # perf_counter() when the running execute started; 0.0 when idle
        self.current: Any = None  # the future of the running execute
        self.period = period  # pacing: seconds between execute starts (0: none)
        self._next_start = 0.0
        self.abandoned = False
        self.last_error: BaseException | None = None
        self.generation = generation
        self.threads = threads  # the orchestrator's BLAS thread limits (None: leave them alone)
        self.blas: int | None = None  # BLAS threads in force where the Method runs (once loaded)
        self.blas_source = "not limited"

    def _post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Calls ``fn(*args)`` on the loop's thread (from any thread)."""
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass

    def _judge_failure(self, fut: Any, exc: BaseException, *, fatal: bool = False) -> tuple[str, str, tuple]:
        """Counts a failed execute against the restart policy. ``fatal``: the worker is
        unhealthy (its process crashed), not just this execute. Returns the verdict
        (``"rejected"``: inputs or options refused, no restart; ``"kept"``: the execute
        raised, the worker goes on; ``"failed"``: past ``max_restarts``; ``"restart"``), the
        reason, and the caller's answer."""
        if isinstance(exc, InvalidArgumentError) and not fatal:  # the caller's mistake: not a failure
            self.rejected += 1
            return "rejected", "", (fut, False, wrap_error(self.instance, exc, "not restarted: the inputs or options were rejected"))
        self.failures += 1
        self.last_error = exc
        if self.executions != self._executions_at_failure:  # an execute succeeded since the last failure
            self._executions_at_failure = self.executions
            self.failed_in_row = 0
        self.failed_in_row += 1
        limit_in_row = self.restart.unhealthy_after
        if not fatal and not self.restart.restart_on_error and not 0 < limit_in_row <= self.failed_in_row:
            verdict, reason, what = "kept", "", "not restarted: a failed execute (RestartPolicy.restart_on_error is off)"
        else:
            self.failed_in_row = 0
            self.consecutive += 1
            limit = self.restart.max_restarts
            if self.consecutive > limit:
                verdict = "failed"
                what_failed = (f"{self.consecutive} consecutive failed executes" if fatal or self.restart.restart_on_error
                               else f"{limit_in_row} failed executes in a row, {self.consecutive} times")
                reason = f"{what_failed} (max_restarts={limit}); last: {type(exc).__name__}: {exc}"
                what = f"instance failed: {reason}"
            else:
                verdict, reason, what = "restart", "", f"restarting, {self.consecutive} of {limit}"
        return verdict, reason, (fut, False, wrap_error(self.instance, exc, what))


class Worker(WorkerBase):
    """A thread that owns one Method of one instance. Created and driven by the Instance.

    The loop reads ``executions``/``failures``/``restarts``/``started``/``current``/``state``
    (each written only by this thread); it writes ``period``, ``abandoned``, ``resolve``,
    and appends to ``inbox`` and ``mailbox``. No locks: single-writer attributes and the
    queue/deque's own atomicity.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.method: Method | MethodSet | None = None
        self._prep: threading.Thread | None = None
        self._prepared: OptionChange | None = None  # built by the helper thread, to put in force
        self._inherited: set[int] | None = None
        self.thread = threading.Thread(target=self._main, name=f"orchestra:{self.instance}#{self.generation}",
                                       daemon=True)

    def start(self) -> None:
        threads = self.threads
        if threads is not None:  # this process's BLAS pools go single-threaded (or the user's setting)
            threads.enter_threads(self)  # sets self.blas, self.blas_source
        self.thread.start()

    @property
    def label(self) -> str:
        return self.thread.name

    # -- posting to the loop ------------------------------------------------------------
    def _flush(self) -> None:
        batch = self.pending
        if batch:
            self.pending = []
            self._post(self.resolve, batch)

    # -- lifetime -------------------------------------------------------------------------
    def _main(self) -> None:
        with bound(instance=self.instance, pool=self.pool):
            try:
                if hasattr(os, "sched_getaffinity"):
                    self._inherited = os.sched_getaffinity(0)
                self._pin(self.cpus)
                self.method = self._load()
            except BaseException as exc:  # noqa: BLE001 - reported to the loop
                self.state = "failed"
                self.last_error = exc
                self._post(self.on_ready, self, exc)
                return
            self.state = "running"
            self._post(self.on_ready, self, None)
            try:
                self._serve()
            except BaseException as exc:  # pragma: no cover - a bug in this module
                _log.exception("worker crashed", error=repr(exc))
                self._fail(f"worker crashed: {type(exc).__name__}: {exc}", exc)
            finally:
                self._flush()
                if not self.abandoned or self.started == 0.0:
                    self._close_method()
                if self.state not in ("failed",):
                    self.state = "stopped"
                while self.mailbox:  # changes that came too late: nobody waits for them forever
                    self._ack(self.mailbox.popleft(), None)
                self._post(self.on_exit, self)

    def _load(self) -> Method | MethodSet:
        return load_for_worker(self.program, self.method_name, self.methods, self.desired())

    def kill(self) -> None:
        """Nothing to do: a thread can't be killed, only abandoned."""

    def _close_method(self) -> None:
        prep = self._prep
        if prep is not None:
            prep.join()
            self._prep = None
        ch, self._prepared = self._prepared, None
        if ch is not None:  # never put in force here; a fresh Method loads the desired options
            self._ack(ch, None)
        m, self.method = self.method, None
        if m is not None:
            try:
                m.close()
            except Exception as exc:  # noqa: BLE001 - closing must not take the worker down
                _log.warning("closing a Method failed", error=repr(exc))

    def _pin(self, cpus: tuple[int, ...] | None) -> None:
        if cpus is None or not hasattr(os, "sched_setaffinity"):
            return
        os.sched_setaffinity(0, cpus if cpus else (self._inherited or range(os.cpu_count() or 1)))

    # -- the loop -------------------------------------------------------------------------
    def _serve(self) -> None:
        get = self.inbox.get
        empty = self.inbox.empty
        perf = time.perf_counter
        mailbox = self.mailbox
        record = self.latency.record
        post = self.loop.call_soon_threadsafe
        t_first = 0.0
        while True:
            item = get()
            if self.abandoned:  # a stuck execute came back after the instance was replaced
                self._redirect(item)
                return
            if mailbox or self._prep is not None:
                self._boundary()
            if item is STOP:
                return
            if item is WAKE:
                if self.pending and empty():
                    self._flush()
                continue
            fut, inputs, overrides, detail = item
            if fut.cancelled():
                self.pending.append((fut, None, None))
                if empty():
                    self._flush()
                continue
            if self.period:
                if self.pending:
                    self._flush()
                self._pace()
            pending = self.pending
            if pending and perf() - t_first > FLUSH_AFTER_S:
                self._flush()
                pending = self.pending
            self.current = fut
            t0 = self.started = perf()
            try:
                m = self.method
                # A plain Method reads the caller's arrays in place (the caller awaits the
                # result and must not change them meanwhile, as with the copy made here).
                out = (m.execute(inputs, overrides, borrow_inputs=True) if type(m) is Method  # type: ignore[union-attr]
                       else m.execute(inputs, overrides))  # type: ignore[union-attr]
            except Exception as exc:  # noqa: BLE001 - sent to the caller
                self.started = 0.0
                self.current = None
                if self.abandoned or not self._failed(fut, exc):
                    return
                continue
            t1 = perf()
            self.started = 0.0
            self.current = None
            if self.abandoned:
                self.pending.append((fut, True, out))
                return
            dt = t1 - t0
            record(dt)
            self.executions += 1
            self.consecutive = 0
            if detail:  # the options this execute ran with: the Method's snapshot in force now
                out = (out, self.method.options(), dt)  # type: ignore[union-attr]
            if not pending:
                t_first = t1
            pending.append((fut, True, out))
            # Batch results only while executes are short and more requests are queued. Nothing
            # runs between the hand-off and the next get(), which releases the GIL the waking
            # loop needs.
            if dt > BATCH_BELOW_S or empty() or len(pending) >= MAX_BATCH or t1 - t_first > FLUSH_AFTER_S:
                self.pending = []
                try:
                    post(self.resolve, pending)
                except RuntimeError:  # the loop is closed
                    pass

    def _pace(self) -> None:
        now = time.perf_counter()
        nxt = self._next_start
        if now < nxt:
            time.sleep(nxt - now)
            now = nxt
        self._next_start = now + self.period

    def _redirect(self, item: Any) -> None:
        """An abandoned worker hands anything it took back to its instance (its new worker)."""
        if item is not STOP and item is not WAKE and self.redirect is not None:
            self._post(self.redirect, item)

    # -- options ----------------------------------------------------------------------------
    def _boundary(self) -> None:
        prep = self._prep
        if prep is not None:
            if prep.is_alive():
                return
        self._flush()  # results of the executes before the change reach their callers first
        if prep is not None:
            self._prep = None
            ch, self._prepared = self._prepared, None
            if ch is not None:
                self._commit(ch)
        mailbox = self.mailbox
        while mailbox:
            ch = mailbox.popleft()
            if ch.cpus is not None:
                try:
                    self._pin(ch.cpus)
                except OSError as exc:
                    _log.warning("setting worker CPU affinity failed", cpus=ch.cpus, error=repr(exc))
            m = self.method
            if m is None:
                self._ack(ch, None)
                continue
            if len(ch.changes) == 1 and ch.init_only:
                (backend, values), = ch.changes.items()
                t = threading.Thread(target=self._prepare, args=(m, backend, values, ch),
                                     name=f"orchestra:{self.instance}:prepare", daemon=True)
                self._prep = t
                t.start()
                return
            try:
                m.set_options(ch.changes)
            except Exception as exc:  # noqa: BLE001 - the engine validated; reported, never fatal
                self._ack(ch, exc)
            else:
                self._commit(ch)

    def _commit(self, ch: OptionChange) -> None:
        """Puts what is set in force now (this thread is between executes), then acks: the
        caller awaiting the change sees it in ``options()`` from then on."""
        m = self.method
        try:
            if m is not None:
                m.commit_options()
        except Exception as exc:  # noqa: BLE001 - the Method keeps its old options; reported
            self._ack(ch, exc)
        else:
            self._ack(ch, None)

    def _prepare(self, m: Method | MethodSet, backend: str, values: Mapping[str, Any], ch: OptionChange) -> None:
        with bound(instance=self.instance, pool=self.pool, backend=backend):
            try:
                m.prepare_backend_options(backend, values)
            except Exception as exc:  # noqa: BLE001 - reported to the loop
                self._ack(ch, exc)
            else:
                self._prepared = ch  # the worker swaps it in at its next boundary and acks
            finally:
                self.inbox.put(WAKE)

    def _ack(self, ch: OptionChange, exc: BaseException | None) -> None:
        if ch.ack is not None:
            self._post(ch.ack, exc)

    # -- faults ---------------------------------------------------------------------------
    def _failed(self, fut: Any, exc: Exception) -> bool:
        """Handles a failed execute. Returns False when the worker must exit."""
        verdict, reason, answer = self._judge_failure(fut, exc)
        self.pending.append(answer)
        if verdict == "failed":
            self._fail(reason, exc)
            return False
        self._flush()
        return verdict in ("rejected", "kept") or self._restart(exc)

    def _restart(self, exc: BaseException) -> bool:
        while True:
            self.state = "restarting"
            self.restarts += 1
            delay = self.restart.backoff(self.consecutive)
            _log.warning("instance restarting", attempt=self.consecutive, max_restarts=self.restart.max_restarts,
                         backoff_s=delay, error=f"{type(exc).__name__}: {exc}")
            self._close_method()
            if delay:
                time.sleep(delay)
            try:
                self.method = self._load()
            except Exception as load_exc:  # noqa: BLE001
                exc = load_exc
                self.last_error = exc
                self.consecutive += 1
                if self.consecutive > self.restart.max_restarts:
                    self._fail(f"reloading the method failed {self.consecutive} times in a row (max_restarts="
                               f"{self.restart.max_restarts}); last: {type(exc).__name__}: {exc}", exc)
                    return False
                continue
            self.state = "running"
            return True

    def _fail(self, reason: str, exc: BaseException) -> None:
        self.state = "failed"
        self._close_method()
        err = InstanceFailedError(f"instance {self.instance!r} failed: {reason}", instance=self.instance)
        err.__cause__ = exc
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                break
            if item is not STOP and item is not WAKE:
                self.pending.append((item[0], False, err))
        while self.mailbox:
            self._ack(self.mailbox.popleft(), None)
        self._flush()
        _log.error("instance failed", reason=reason)
        self._post(self.on_failed, self, reason, exc)
