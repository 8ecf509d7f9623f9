"""A greedy memory planner: one arena, reuse between tensors whose lifetimes don't overlap."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MemoryPlan", "plan_memory"]


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Where each tensor goes: ``offsets[i]`` in an arena of ``size`` bytes."""

    offsets: tuple[int, ...]
    size: int


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def plan_memory(
    sizes: Sequence[int],
    lifetimes: Sequence[tuple[int, int]],
    pinned: Sequence[bool],
    alignment: int = 16,
) -> MemoryPlan:
    """Places tensors in one arena, largest first, each at the lowest aligned offset free
    for its whole lifetime.

    Args:
        sizes: bytes of each tensor.
        lifetimes: ``(first, last)`` instruction using each tensor (inclusive: an op's
            inputs and outputs never share memory).
        pinned: tensors that share memory with nothing (method inputs and outputs, which the
            caller reads or writes outside the instruction stream).
        alignment: every offset is a multiple of this.
    """
    n = len(sizes)
    offsets = [0] * n
    placed: list[tuple[int, int, int]] = []  # (offset, end, tensor)
    order = sorted(range(n), key=lambda i: (not pinned[i], -sizes[i], lifetimes[i][0], i))
    for i in order:
        size = sizes[i]
        if size == 0:
            continue  # takes no memory; offset 0 is in bounds of any arena
        first, last = lifetimes[i]
        conflicts = sorted(
            (off, end) for off, end, j in placed
            if pinned[i] or pinned[j] or not (lifetimes[j][1] < first or last < lifetimes[j][0])
        )
        offset = 0
        for off, end in conflicts:
            if offset + size <= off:
                break
            offset = max(offset, _align(end, alignment))
        offsets[i] = offset
        placed.append((offset, offset + size, i))
    total = _align(max((end for _, end, _ in placed), default=0), alignment)
    return MemoryPlan(tuple(offsets), total)
