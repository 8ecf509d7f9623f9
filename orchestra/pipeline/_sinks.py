"""Where results go: the :class:`Sink` protocol and two small sinks."""

from __future__ import annotations

import collections
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from ._frame import Result

__all__ = ["CallbackSink", "CollectSink", "Sink"]


@runtime_checkable
class Sink(Protocol):
    """Receives each processed frame's :class:`Result`, in frame order.

    A slow ``send`` holds its pipeline's worker, so frames queue up (and the drop policy
    decides) before the executor: a sink never needs its own buffer.
    """

    async def send(self, result: Result) -> None: ...


class CollectSink:
    """Keeps the last ``maxlen`` results (all of them with ``maxlen=None``) in ``results``."""

    def __init__(self, maxlen: int | None = None) -> None:
        self.results: collections.deque[Result] = collections.deque(maxlen=maxlen)

    async def send(self, result: Result) -> None:
        self.results.append(result)

    def __len__(self) -> int:
        return len(self.results)


class CallbackSink:
    """Calls ``fn(result)`` for each result; ``fn`` may be a plain or an ``async`` function."""

    def __init__(self, fn: Callable[[Result], Any] | Callable[[Result], Awaitable[Any]]) -> None:
        if not callable(fn):
            raise TypeError(f"CallbackSink needs a callable, got {fn!r}")
        self.fn = fn
        self._async = _is_async(fn)

    async def send(self, result: Result) -> None:
        if self._async:
            await self.fn(result)
        else:
            self.fn(result)


def _is_async(fn: Any) -> bool:
    """Whether calling ``fn`` returns a coroutine (decided once, not per frame)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))
