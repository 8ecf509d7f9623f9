"""The worker threads of one delegate handle.

A :class:`WorkerPool` belongs to exactly one handle: it is created at ``init`` with no
threads, grows lazily to ``num_threads - 1`` workers (the executing thread is always one of
the participants), and is shut down at ``destroy``. Nothing here is process-global: no BLAS
thread counts, no environment variables, no shared executor.

A job is ``(tile, count)``: every participant claims tile indices from one shared counter
until they run out, so a slow thread never holds up the others, and the executing thread
waits only for tiles that workers actually claimed. Which thread runs which
tile does not change what a tile computes: results don't depend on the thread count.
"""

from __future__ import annotations

import itertools
import queue
import threading
import weakref
from collections.abc import Callable

__all__ = ["WorkerPool"]

Tile = Callable[[int], None]

_STOP = None


def _participate(tile: Tile, count: int, counter: itertools.count, used: set[int]) -> tuple[int, BaseException | None]:
    """Claims and runs tiles until none are left; returns (tiles run, first error). A failed
    tile doesn't stop the claiming, so every tile is always run and accounted for."""
    ran = 0
    error = None
    for k in counter:  # next() on itertools.count is atomic under the GIL
        if k >= count:
            break
        ran += 1
        try:
            tile(k)
        except BaseException as exc:
            if error is None:
                error = exc
    if ran:
        used.add(threading.get_ident())
    return ran, error


def _worker(inbox: queue.SimpleQueue, done: queue.SimpleQueue) -> None:
    while True:
        job = inbox.get()
        if job is _STOP:
            return
        ran, error = _participate(*job)
        if ran:
            # Only a worker that ran tiles reports: one that wakes after the others finished
            # them all finds none, reports nothing, and nobody waits for it.
            done.put((ran, error))


def _stop(workers: list[tuple[threading.Thread, queue.SimpleQueue]]) -> None:
    for _, inbox in workers:
        inbox.put(_STOP)


class WorkerPool:
    """Worker threads owned by one handle (see the module docstring).

    Not thread-safe by design: one Method (hence one handle) executes on one thread at a
    time, and only that thread calls :meth:`run`.
    """

    __slots__ = ("name", "_workers", "_done", "_finalizer", "used", "__weakref__")

    def __init__(self, name: str) -> None:
        self.name = name
        self._workers: list[tuple[threading.Thread, queue.SimpleQueue]] = []
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        # Threads that ran at least one tile since the last reset (the executing thread too).
        self.used: set[int] = set()
        # A pool dropped without close() still stops its threads (they hold no reference to it).
        self._finalizer = weakref.finalize(self, _stop, self._workers)

    @property
    def workers(self) -> int:
        """Worker threads started so far (the executing thread is not counted)."""
        return len(self._workers)

    def thread_ids(self) -> tuple[int, ...]:
        return tuple(t.ident for t, _ in self._workers if t.ident is not None)

    def _grow(self, n: int) -> None:
        while len(self._workers) < n:
            inbox: queue.SimpleQueue = queue.SimpleQueue()
            t = threading.Thread(target=_worker, args=(inbox, self._done),
                                 name=f"{self.name}-w{len(self._workers) + 1}", daemon=True)
            t.start()
            self._workers.append((t, inbox))

    def run(self, tile: Tile, count: int, threads: int) -> None:
        """Runs ``tile(0) ... tile(count - 1)`` on up to ``threads`` threads (this one
        included) and returns when all are done. The first exception a tile raised is
        re-raised here, after every participant has stopped."""
        p = threads if threads < count else count
        if p <= 1:
            for k in range(count):
                tile(k)
            if count:
                self.used.add(threading.get_ident())
            return
        self._grow(p - 1)
        counter = itertools.count()
        job = (tile, count, counter, self.used)
        workers = self._workers
        for i in range(p - 1):
            workers[i][1].put(job)
        finished, error = _participate(tile, count, counter, self.used)
        # Wait for the tiles the workers claimed (not for workers that claimed none: on a
        # busy machine a worker may get no CPU before this thread has run every tile).
        done = self._done
        while finished < count:
            ran, err = done.get()
            finished += ran
            if err is not None and error is None:
                error = err
        if error is not None:
            raise error

    def close(self) -> None:
        """Stops and joins the worker threads. Idempotent."""
        workers = list(self._workers)
        self._finalizer()  # sends the stop message once
        for t, _ in workers:
            t.join()
        self._workers.clear()
