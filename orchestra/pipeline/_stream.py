"""A bounded frame stream with a drop policy: a deque and loop futures.

Measured on this VM (uvloop, ping-pong between two tasks, consumer waiting each time):
deque + ``loop.create_future`` 8.6 µs, ``asyncio.Queue`` 18.6 µs, deque + ``anyio.Event``
24.7 µs, anyio memory object streams 80.7 µs (``benchmarks/bench_pipelines.py`` re-measures
it). Futures are only wake-up signals: an item always stays in the deque until a getter
takes it, so a getter cancelled after its wake-up loses nothing (it passes the wake-up on).
This needs anyio's asyncio backend (with or without uvloop).
"""

from __future__ import annotations

import asyncio
import collections
import enum
from collections.abc import Callable
from typing import Generic, TypeVar

import anyio

from ..errors import InvalidArgumentError

__all__ = ["DropPolicy", "DropReason", "FrameStream"]

T = TypeVar("T")


class DropPolicy(enum.StrEnum):
    """What a full stream does with one more frame."""

    DROP_OLDEST = "drop_oldest"  # live: evict the oldest queued frame, the newest wins
    DROP_NEWEST = "drop_newest"  # keep the queue, drop the incoming frame
    BLOCK = "block"  # capacity mode: the producer waits; nothing is dropped


class DropReason(enum.StrEnum):
    """Why a frame was dropped (the keys of the ``dropped`` counters)."""

    EVICTED = "evicted"  # pushed out of a full drop_oldest queue by a newer frame
    QUEUE_FULL = "queue_full"  # arrived at a full drop_newest queue
    DEADLINE = "deadline"  # older than deadline_s when it reached the executor
    SHUTDOWN = "shutdown"  # accepted but not finished when the pipeline stopped


def _drop_policy(value: DropPolicy | str, where: str) -> DropPolicy:
    try:
        return DropPolicy(value)
    except ValueError:
        allowed = ", ".join(repr(p.value) for p in DropPolicy)
        raise InvalidArgumentError(f"{where}: drop must be one of {allowed}, got {value!r}") from None


def _wake_first(waiters: collections.deque[asyncio.Future[None]]) -> None:
    while waiters:
        fut = waiters.popleft()
        if not fut.done():
            fut.set_result(None)
            return


class FrameStream(Generic[T]):
    """A bounded FIFO from one stage to the next, applying a :class:`DropPolicy` when full.

    ``put_nowait`` never waits: in ``drop_oldest`` it evicts the oldest item, in
    ``drop_newest`` it drops the new one (each reported to ``on_drop`` with its
    :class:`DropReason`), in ``block`` it raises ``anyio.WouldBlock``. ``put`` waits for room
    in ``block`` mode and is ``put_nowait`` otherwise. ``get`` waits for an item and raises
    ``anyio.EndOfStream`` once the stream is closed and empty. Any number of getters and
    putters; all on one event loop (not thread-safe).
    """

    __slots__ = ("_capacity", "_closed", "_getters", "_items", "_max_depth", "_on_drop", "_policy", "_putters")

    def __init__(self, capacity: int, policy: DropPolicy | str = DropPolicy.DROP_OLDEST,
                 on_drop: Callable[[T, DropReason], None] | None = None) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise InvalidArgumentError(f"stream capacity must be an int >= 1, got {capacity!r}")
        self._capacity = capacity
        self._policy = _drop_policy(policy, "FrameStream")
        self._on_drop = on_drop
        self._items: collections.deque[T] = collections.deque()
        self._getters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._putters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False
        self._max_depth = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def policy(self) -> DropPolicy:
        return self._policy

    @property
    def depth(self) -> int:
        """Items queued now."""
        return len(self._items)

    @property
    def max_depth(self) -> int:
        """The most items ever queued at once (never above ``capacity``)."""
        return self._max_depth

    @property
    def closed(self) -> bool:
        return self._closed

    def put_nowait(self, item: T) -> bool:
        """Adds ``item`` without waiting; True if it was queued, False if it was dropped.

        Raises:
            anyio.WouldBlock: ``block`` mode and the stream is full.
            anyio.ClosedResourceError: the stream is closed.
        """
        if self._closed:
            raise anyio.ClosedResourceError
        items = self._items
        if len(items) >= self._capacity:
            policy = self._policy
            if policy is DropPolicy.DROP_OLDEST:
                old = items.popleft()
                if self._on_drop is not None:
                    self._on_drop(old, DropReason.EVICTED)
            elif policy is DropPolicy.DROP_NEWEST:
                if self._on_drop is not None:
                    self._on_drop(item, DropReason.QUEUE_FULL)
                return False
            else:
                raise anyio.WouldBlock
        items.append(item)
        n = len(items)
        if n > self._max_depth:
            self._max_depth = n
        if self._getters:
            _wake_first(self._getters)
        return True

    async def put(self, item: T) -> bool:
        """Adds ``item``, waiting for room in ``block`` mode; True if it was queued.

        Raises:
            anyio.ClosedResourceError: the stream is (or got) closed.
        """
        if self._policy is DropPolicy.BLOCK:
            while len(self._items) >= self._capacity and not self._closed:
                fut = asyncio.get_running_loop().create_future()
                self._putters.append(fut)
                try:
                    await fut
                except BaseException:
                    self._abandon(fut, self._putters, len(self._items) < self._capacity)
                    raise
        return self.put_nowait(item)

    def get_nowait(self) -> T:
        """Takes the oldest item.

        Raises:
            anyio.WouldBlock: empty and open.
            anyio.EndOfStream: empty and closed.
        """
        if self._items:
            item = self._items.popleft()
            if self._putters:
                _wake_first(self._putters)
            return item
        if self._closed:
            raise anyio.EndOfStream
        raise anyio.WouldBlock

    async def get(self) -> T:
        """Takes the oldest item, waiting for one.

        Raises:
            anyio.EndOfStream: the stream is closed and empty.
        """
        items = self._items
        while not items:
            if self._closed:
                raise anyio.EndOfStream
            fut = asyncio.get_running_loop().create_future()
            self._getters.append(fut)
            try:
                await fut
            except BaseException:
                self._abandon(fut, self._getters, bool(items))
                raise
        item = items.popleft()
        if self._putters:
            _wake_first(self._putters)
        return item

    @staticmethod
    def _abandon(fut: asyncio.Future[None], waiters: collections.deque[asyncio.Future[None]], ready: bool) -> None:
        # A waiter gives up (cancelled). If it had been woken, pass the wake-up on.
        if fut.done() and not fut.cancelled():
            if ready:
                _wake_first(waiters)
        else:
            fut.cancel()
            try:
                waiters.remove(fut)
            except ValueError:
                pass

    def close(self) -> None:
        """No more puts; getters take what is queued, then get ``anyio.EndOfStream``."""
        if self._closed:
            return
        self._closed = True
        for waiters in (self._getters, self._putters):
            while waiters:
                fut = waiters.popleft()
                if not fut.done():
                    fut.set_result(None)

    def drain(self) -> list[T]:
        """Removes and returns everything queued (to account for it at shutdown)."""
        out = list(self._items)
        self._items.clear()
        while self._putters:
            _wake_first(self._putters)
        return out

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"FrameStream({len(self._items)}/{self._capacity}, {self._policy.value}, {state})"
