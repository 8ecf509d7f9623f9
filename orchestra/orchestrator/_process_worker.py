"""The worker of a ``placement="process"`` instance, driven by the event loop.

Same contract towards the :class:`~._instance.Instance` as the thread
:class:`~._worker.Worker` (``inbox``, ``mailbox``, counters, ``started``/``current`` for the
deadline watchdog, ``kill``, the ready/failed/exit callbacks), but no relay thread: every
method here runs on the event loop's thread.

* ``inbox.put(request)`` (from ``Instance.execute``) queues it and, while a slot of the
  worker process is free, copies the inputs into shared memory and writes one small message
  on the request pipe (:class:`~._process.WorkerProcess`). Up to
  :data:`~._process.PIPELINE_DEPTH` requests are in the process at once, so it never waits
  for the parent between executes.
* Replies are read in a ``loop.add_reader`` callback, in request order; each result is
  copied out of its slot and resolved at once, and the freed slot takes the next request.
* Option changes (``mailbox`` + ``WAKE``) are written on the same pipe, so they apply in the
  child exactly between the executes sent before and after them (all backends of one
  change back to back); the ack comes with the child's reply. A change of one backend's
  init-only values is instead *prepared* on a thread of the process while it keeps
  executing, swapped in at the first boundary after, and acked once built (like the thread
  worker's). A CPU change re-pins the worker process.
* Faults: an execute that raises in the process answers its caller and the process goes on
  (``RestartPolicy.restart_on_error`` kills it and starts a fresh one instead). A process
  that dies (a crash in a backend) or sends a corrupt stream counts as a failed execute of
  its oldest request and is replaced after the restart policy's backoff; requests that were
  behind it in the process are sent again to the new process (their results were never
  delivered). A deadline kills the process (``kill``); the Instance moves what was queued to a replacement.
* Starting a process blocks (spawn, import, load), so it runs on a short-lived thread that
  posts the result back to the loop.

Inputs and outputs are copied on the event loop's thread (memcpy speed: about 0.1 ms per MB);
bound very large tensors with thread placement instead.
"""

from __future__ import annotations

import collections
import itertools
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Mapping
from multiprocessing import resource_tracker
from types import MappingProxyType
from typing import Any

from ..errors import Error, InvalidArgumentError, OrchestraError
from ..telemetry import bound, get_logger
from ._errors import InstanceClosedError, InstanceFailedError
from ._process import PIPELINE_DEPTH, WorkerProcess, rebuild_error
from ._worker import STOP, WAKE, OptionChange, WorkerBase, wrap_error

__all__ = ["ProcessWorker"]

_log = get_logger(__name__)


class _Inbox:
    """What the Instance sees as the worker's queue (all calls on the loop's thread)."""

    __slots__ = ("w",)

    def __init__(self, w: ProcessWorker) -> None:
        self.w = w

    def put(self, item: Any) -> None:
        w = self.w
        if item is STOP:
            w._stopping = True
            w._maybe_finish()
        elif item is WAKE:
            w._pump()
        elif w.abandoned:
            if w.redirect is not None:
                w.redirect(item)
        else:
            w._queue.append(item)
            if w._free:
                w._pump()

    def get_nowait(self) -> Any:
        """Takes back a request that has not produced a result (quarantine, failure)."""
        q = self.w._queue
        if not q:
            raise queue.Empty
        return q.popleft()


class ProcessWorker(WorkerBase):
    """A worker process and the loop-side state machine that drives it (see the module
    docstring). Created and driven by the Instance."""

    def __init__(self, *, initializer: Callable[[], None] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.initializer = initializer
        self.where = f"instance {self.instance!r}"
        self.inbox = _Inbox(self)  # type: ignore[assignment]
        self.method: WorkerProcess | None = None
        # started/current: the oldest request in the process (when it started: when the one
        # before it finished)
        self._queue: collections.deque = collections.deque()  # requests not sent yet
        # in the process, in order: [request, slot, sent_at] for executes, OptionChange for options
        self._sent: collections.deque = collections.deque()
        self._free = list(range(PIPELINE_DEPTH - 1, -1, -1))
        self._preparing: dict[int, OptionChange] = {}  # init-only changes being built in the process
        self._cids = itertools.count()
        self._stopping = False
        self._first = True
        self._writing = False
        self._paced: Any = None
        self._forced_src: Any = None
        self._forced_view: Mapping[str, Mapping[str, Any]] = MappingProxyType({})
        self._inherited = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None

    @property
    def label(self) -> str:
        m = self.method
        return f"orchestra:{self.instance}#{self.generation} (worker process {m.pid if m is not None else '-'})"

    # -- lifetime -------------------------------------------------------------------------
    def start(self) -> None:
        self._spawn_loader(0.0)

    def _spawn_loader(self, delay: float) -> None:
        threading.Thread(target=self._load, args=(delay,), name=f"orchestra:{self.instance}:start", daemon=True).start()

    def _load(self, delay: float) -> None:
        """On a helper thread: start the worker process, post the outcome to the loop."""
        if hasattr(signal, "pthread_sigmask"):
            # the process inherits this thread's mask: the terminal's Ctrl-C (sent to the
            # whole process group) stays pending there, unseen; the parent drains, then closes
            # it. (Starting multiprocessing's resource tracker unblocks SIGINT: start it first.)
            resource_tracker.ensure_running()
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        if delay:
            time.sleep(delay)
        proc: WorkerProcess | None = None
        err: BaseException | None = None
        with bound(instance=self.instance, pool=self.pool):
            try:
                blas, source = self.threads.for_process(self.cpus) if self.threads is not None else (None, "not limited")
                proc = WorkerProcess(self.program, self.method_name, self.desired(), self.cpus, self.initializer,
                                     self.where, methods=self.methods, blas_threads=blas)
                self.blas, self.blas_source = proc.blas, source
            except BaseException as exc:  # noqa: BLE001 - reported to the loop
                err = exc
        try:
            self.loop.call_soon_threadsafe(self._loaded, proc, err)
        except RuntimeError:  # the loop is closed: nobody wants the process
            if proc is not None:
                proc.close()

    def _loaded(self, proc: WorkerProcess | None, exc: BaseException | None) -> None:
        if self.abandoned or self.state in ("failed", "stopped"):
            if proc is not None:
                _close_later(proc)
            return
        if proc is None:
            assert exc is not None
            self.last_error = exc
            if self._first:
                self._first = False
                self.state = "failed"
                self.on_ready(self, exc)
                self.on_exit(self)
                return
            self.consecutive += 1
            if self.consecutive > self.restart.max_restarts:
                self._fail(f"reloading the method failed {self.consecutive} times in a row (max_restarts="
                           f"{self.restart.max_restarts}); last: {type(exc).__name__}: {exc}", exc)
                return
            self._schedule_restart(exc)
            return
        self.method = proc
        self.state = "running"
        self.loop.add_reader(proc.fd, self._readable)
        if self.threads is not None:  # one more process: unbound ones may have to share now
            self.threads.process_ready(self)
        if self._first:
            self._first = False
            self.on_ready(self, None)
        self._pump()
        if self._stopping:
            self._maybe_finish()

    def relimit(self, cpus: tuple[int, ...] | None) -> None:
        """On the loop: sets the process's BLAS limit by the orchestrator's rule for ``cpus``
        (sent on the pipe, in force before its next execute)."""
        m = self.method
        if self.threads is None or m is None:
            return
        blas, self.blas_source = self.threads.for_process(cpus)
        if blas is not None and blas != self.blas:
            m.send_blas_threads(blas)
            self.blas = blas

    def _maybe_finish(self) -> None:
        """After STOP: once nothing is queued or in the process, close it and exit."""
        if self.state != "running" or self._queue or self._sent or self.mailbox or self._preparing:
            if self.state in ("failed", "stopped"):
                return
            if self.state == "running" and self.mailbox:
                self._pump()
            return
        self.state = "stopped"
        proc = self._detach()
        if proc is None:
            self.loop.call_soon(self.on_exit, self)
        else:  # exited once the process is gone (the Instance's drain waits for that)
            _close_later(proc, lambda: self._post(self.on_exit, self))

    def _detach(self) -> WorkerProcess | None:
        proc, self.method = self.method, None
        if proc is not None:
            self.loop.remove_reader(proc.fd)
            if self._writing:
                self.loop.remove_writer(proc._wfd)
                self._writing = False
        return proc

    def kill(self) -> None:
        """Ends the worker process at once (a deadline, or a drain that timed out).

        Requests sent behind the stuck one go back to the queue (the Instance takes them for
        the replacement); anything still here on the next loop turn fails as closed."""
        proc = self._detach()
        if proc is not None:
            proc.kill()
            _close_later(proc)
        self._requeue()
        self.state = "stopped"
        self.loop.call_soon(self._discard)

    def _requeue(self) -> None:
        """Requests in the process that produced no result go back to the front of the
        queue, in order (all but ``current``: its caller is answered by whoever stopped it);
        option changes in flight are acked (a new process loads the desired options)."""
        for ch in self._preparing.values():
            self._ack(ch, None)
        self._preparing.clear()
        back = []
        for e in self._sent:
            if isinstance(e, OptionChange):
                self._ack(e, None)
            elif e[0][0] is not self.current:
                back.append(e[0])
        self._sent.clear()
        self._queue.extendleft(reversed(back))
        self._free = list(range(PIPELINE_DEPTH - 1, -1, -1))

    def _discard(self) -> None:
        err = InstanceClosedError(f"instance {self.instance!r}: its worker process was stopped")
        batch = [(item[0], False, err) for item in self._queue]
        self._queue.clear()
        cur = self.current
        if cur is not None and not cur.done():
            batch.append((cur, False, err))
        self.current = None
        self.started = 0.0
        if batch:
            self.resolve(batch)
        while self.mailbox:
            self._ack(self.mailbox.popleft(), None)

    # -- requests -------------------------------------------------------------------------
    def _pump(self) -> None:
        """Sends queued option changes and requests while the process has room."""
        m = self.method
        if m is None or self.state != "running" or self.abandoned:
            return
        if self.mailbox:
            self._apply_mailbox(m)
        q, free = self._queue, self._free
        period = self.period
        while q and free:
            if period:  # paced: one request at a time, started no sooner than the schedule
                if len(free) < PIPELINE_DEPTH:
                    break
                now = time.perf_counter()
                if now < self._next_start:
                    if self._paced is None:
                        self._paced = self.loop.call_later(self._next_start - now, self._pace_due)
                    break
                self._next_start = now + period
            item = q.popleft()
            fut, inputs, overrides, _ = item
            if fut.cancelled():
                self.resolve([(fut, None, None)])
                continue
            slot = free.pop()
            try:
                m.send_execute(slot, inputs, overrides)
            except Exception as exc:  # noqa: BLE001 - the inputs were rejected; nothing was sent
                free.append(slot)
                if not isinstance(exc, InvalidArgumentError):
                    exc = InvalidArgumentError(f"{self.where}: inputs rejected: {type(exc).__name__}: {exc}")
                self.rejected += 1
                self.resolve([(fut, False, wrap_error(self.instance, exc,
                                                      "not restarted: the inputs or options were rejected"))])
                continue
            t = time.perf_counter()
            self._sent.append([item, slot, t])
            if self.current is None:
                self.current = fut
                self.started = t
        if m.backlog and not self._writing:
            self._writing = True
            self.loop.add_writer(m._wfd, self._writable)

    def _pace_due(self) -> None:
        self._paced = None
        self._pump()

    def _writable(self) -> None:
        m = self.method
        if m is None:
            return
        m.flush()
        if not m.backlog:
            self._writing = False
            self.loop.remove_writer(m._wfd)

    def _apply_mailbox(self, m: WorkerProcess) -> None:
        mailbox = self.mailbox
        while mailbox:
            ch = mailbox.popleft()
            if ch.cpus is not None and hasattr(os, "sched_setaffinity") and m.pid is not None:
                try:
                    os.sched_setaffinity(m.pid, ch.cpus if ch.cpus else (self._inherited or range(os.cpu_count() or 1)))
                except OSError as exc:
                    _log.warning("setting worker process CPU affinity failed", instance=self.instance, cpus=ch.cpus,
                                 error=repr(exc))
            if ch.cpus is not None:  # BLAS threads follow the CPUs
                self.relimit(ch.cpus or None)
            if len(ch.changes) == 1 and ch.init_only:  # built in the process while it executes
                (backend, values), = ch.changes.items()
                cid = next(self._cids)
                self._preparing[cid] = ch
                m.send_prepare(cid, backend, values)
            elif ch.changes:
                m.send_options(ch.changes)
                self._sent.append(ch)
            else:
                self._ack(ch, None)

    def _answered(self, ch: OptionChange, error: Any) -> None:
        """The process's answer to an option change: None (in force from its next execute)
        or the error it raised, described."""
        exc = None if error is None else rebuild_error(error, self.where)
        if exc is not None:
            _log.warning("option change rejected by the worker process", instance=self.instance, error=repr(exc))
        self._ack(ch, exc)

    def _ack(self, ch: OptionChange, exc: BaseException | None) -> None:
        if ch.ack is not None:
            ch.ack(exc)

    # -- replies --------------------------------------------------------------------------
    def _readable(self) -> None:
        m = self.method
        if m is None:
            return
        try:
            replies = m.read()
        except OrchestraError as exc:  # a corrupt stream: treat the process as crashed
            replies = None
            self.last_error = exc
        if replies is None:
            self._died(m)
            return
        if not replies:
            return
        sent, free = self._sent, self._free
        record = self.latency.record
        results = []
        for r in replies:
            if type(r) is tuple and r[0] == "prep":  # out of order: an init-only change was built
                ch = self._preparing.pop(r[1], None)
                if ch is not None:
                    if r[2] is None:  # built: put it in force (answered in order)
                        m.send_commit()
                        self._sent.append(ch)
                    else:
                        self._answered(ch, r[2])
                continue
            if not sent:  # a reply to nothing: the stream is corrupt; treat the process as crashed
                self.last_error = OrchestraError(f"{self.where}: the worker process sent an unexpected reply",
                                                 Error.Internal)
                self._died(m)
                return
            e = sent.popleft()
            if isinstance(e, OptionChange):
                if results:  # the executes before the change answer first
                    self.resolve(results)
                    results = []
                if r[0] == "ok" and len(r) > 1:
                    m.forced = r[1]  # the options in force now
                self._answered(e, None if r[0] == "ok" else r[1])
                continue
            item, slot, _ = e
            free.append(slot)
            if type(r) is float:  # fast reply: its duration; outputs at their static shapes
                out = m.static_outputs(slot)
                results.append((item[0], True, (out, self._options_view(m), r) if item[3] else out))
                record(r)
                self.executions += 1
                self.consecutive = 0
                continue
            if r[0] == "ok":
                _, oshapes, oscalars, dt, forced = r
                out = m.outputs(slot, oshapes, oscalars, forced)  # m.forced: the options it ran with
                results.append((item[0], True, (out, self._options_view(m), dt) if item[3] else out))
                record(dt)
                self.executions += 1
                self.consecutive = 0
                continue
            if item[0] is self.current:
                self.current = None
            if results:
                self.resolve(results)
                results = []
            if not self._failed(item[0], rebuild_error(r[1], self.where)):
                return  # restarting or failed: what the process still sends is discarded
        self._track()
        if self._queue:  # the process gets its next request before the loop resolves anything
            self._pump()
        if results:
            self.resolve(results)
        if self._stopping:
            self._maybe_finish()

    def _options_view(self, m: WorkerProcess) -> Mapping[str, Mapping[str, Any]]:
        """The options in force in the process as of its last reply, read-only (made once
        per change)."""
        forced = m.forced
        if self._forced_src is not forced:
            self._forced_src = forced
            self._forced_view = MappingProxyType({b: MappingProxyType(dict(v)) for b, v in forced.items()})
        return self._forced_view

    def _track(self) -> None:
        """Points the watchdog at the oldest request still in the process."""
        for e in self._sent:
            if not isinstance(e, OptionChange):
                fut = e[0][0]
                if fut is not self.current:  # it started when the one before it finished
                    self.current = fut
                    self.started = max(e[2], time.perf_counter())
                return
        self.current = None
        self.started = 0.0

    # -- faults ---------------------------------------------------------------------------
    def _failed(self, fut: Any, exc: OrchestraError, *, fatal: bool = False) -> bool:
        """A failed execute (``fatal``: the process died in it). Returns False when the
        process is being replaced (restart) or the instance failed."""
        verdict, reason, answer = self._judge_failure(fut, exc, fatal=fatal)
        self.resolve([answer])
        if verdict == "failed":
            self._fail(reason, exc)
        elif verdict == "restart":
            self._begin_restart(exc)
        return verdict in ("rejected", "kept")

    def _died(self, m: WorkerProcess) -> None:
        """The reply pipe closed: the process exited without being asked to."""
        if self.abandoned or self.state != "running":
            return
        code = m.exitcode
        exc = OrchestraError(f"{self.where}: the worker process exited unexpectedly"
                             f"{f' (exit code {code})' if code is not None else ''}", Error.Internal)
        for e in self._sent:
            if not isinstance(e, OptionChange):
                self._sent.remove(e)
                self._free.append(e[1])
                if e[0][0] is self.current:
                    self.current = None
                self._failed(e[0][0], exc, fatal=True)
                return
        self.last_error = exc
        self.consecutive += 1
        if self.consecutive > self.restart.max_restarts:
            self._fail(f"the worker process exited {self.consecutive} times in a row "
                       f"(max_restarts={self.restart.max_restarts})", exc)
        else:
            self._begin_restart(exc)

    def _begin_restart(self, exc: BaseException) -> None:
        proc = self._detach()
        if proc is not None:
            proc.kill()
            _close_later(proc)
        self.current = None
        self._requeue()
        self.started = 0.0
        self._schedule_restart(exc)

    def _schedule_restart(self, exc: BaseException) -> None:
        self.state = "restarting"
        self.restarts += 1
        delay = self.restart.backoff(self.consecutive)
        with bound(instance=self.instance, pool=self.pool):
            _log.warning("instance restarting", attempt=self.consecutive, max_restarts=self.restart.max_restarts,
                         backoff_s=delay, error=f"{type(exc).__name__}: {exc}", placement="process")
        self._spawn_loader(delay)

    def _fail(self, reason: str, exc: BaseException) -> None:
        self.state = "failed"
        proc = self._detach()
        if proc is not None:
            proc.kill()
        err = InstanceFailedError(f"instance {self.instance!r} failed: {reason}", instance=self.instance)
        err.__cause__ = exc
        self.current = None
        self._requeue()
        batch = [(item[0], False, err) for item in self._queue]
        self._queue.clear()
        self.started = 0.0
        if batch:
            self.resolve(batch)
        while self.mailbox:
            self._ack(self.mailbox.popleft(), None)
        with bound(instance=self.instance, pool=self.pool):
            _log.error("instance failed", reason=reason)
        self.loop.call_soon(self.on_failed, self, reason, exc)
        if proc is None:
            self.loop.call_soon(self.on_exit, self)
        else:
            _close_later(proc, lambda: self._post(self.on_exit, self))

    def __repr__(self) -> str:
        return f"<ProcessWorker {self.instance!r}#{self.generation} {self.state}>"


def _close_later(proc: WorkerProcess, then: Callable[[], None] | None = None) -> None:
    """Joins and cleans up a worker process off the event loop, then calls ``then`` there."""
    def run() -> None:
        try:
            proc.close()
        finally:
            if then is not None:
                then()

    threading.Thread(target=run, name="orchestra:close-worker-process", daemon=True).start()
