"""A min-heap with handles and lazy deletion (docs/design/scheduler.md#the-lazy-deletion-heap).

`remove(handle)` only marks the entry dead (O(1)); `pop` and `peek` drop dead entries as
they surface. When dead entries outnumber live ones the heap is rebuilt, so memory stays
O(live) and every operation stays O(log n) amortized.
"""
from __future__ import annotations

import heapq
from typing import Generic, TypeVar

T = TypeVar("T")

# An entry (also the handle) is the list [key, seq, item]: lists compare in C, and the
# unique seq decides before the item is ever compared (equal keys pop in push order).
Handle = list
_KEY, _SEQ, _ITEM = 0, 1, 2
_DEAD = object()
_COMPACT_MIN = 64  # don't rebuild tiny heaps; a rebuild is O(n)


class LazyHeap(Generic[T]):
    """Smallest key first; equal keys in push order."""

    __slots__ = ("_heap", "_live", "_seq")

    def __init__(self) -> None:
        self._heap: list[Handle] = []
        self._live = 0
        self._seq = 0

    def __len__(self) -> int:
        return self._live

    def __bool__(self) -> bool:
        return self._live > 0

    def push(self, key: tuple, item: T) -> Handle:
        entry = [key, self._seq, item]
        self._seq += 1
        heapq.heappush(self._heap, entry)
        self._live += 1
        return entry

    def peek(self) -> T:
        """The smallest live item; IndexError when empty."""
        return self._top()[_ITEM]

    def peek_key(self) -> tuple:
        return self._top()[_KEY]

    def pop(self) -> T:
        """Remove and return the smallest live item; IndexError when empty."""
        entry = self._top()
        heapq.heappop(self._heap)
        self._live -= 1
        item = entry[_ITEM]
        entry[_ITEM] = _DEAD
        return item

    def remove(self, handle: Handle) -> bool:
        """Mark the entry dead. False when it was already popped or removed."""
        if handle[_ITEM] is _DEAD:
            return False
        handle[_ITEM] = _DEAD
        self._live -= 1
        dead = len(self._heap) - self._live
        if dead > _COMPACT_MIN and dead > self._live:
            self._heap = [e for e in self._heap if e[_ITEM] is not _DEAD]
            heapq.heapify(self._heap)
        return True

    @staticmethod
    def alive(handle: Handle) -> bool:
        return handle[_ITEM] is not _DEAD

    def _top(self) -> Handle:
        heap = self._heap
        while heap and heap[0][_ITEM] is _DEAD:
            heapq.heappop(heap)
        if not heap:
            raise IndexError("peek or pop from an empty heap")
        return heap[0]
