"""The scheduler's only view of KV memory: block ids, never bytes (seed section 2.6)."""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Hashable, Iterable, Protocol, Sequence, runtime_checkable


class NoCapacity(Exception):
    """The pool has too few free blocks; nothing was allocated."""


@dataclass(frozen=True)
class Allocation:
    cached_tokens: int = 0  # positions already holding K/V (prefix hits); 0 for a free list


class BlockSpace(Protocol):
    def block_tokens(self) -> int: ...
    def total_blocks(self) -> int: ...
    def free_blocks(self) -> int: ...

    def allocate(self, id: Hashable, tokens: Sequence[int]) -> Allocation:
        """Blocks for all len(tokens) positions or none (raises NoCapacity)."""
        ...

    def append_slot(self, id: Hashable, total: int) -> None:
        """Grow id's table to ceil(total / B) blocks, all or none (raises NoCapacity)."""
        ...

    def release(self, id: Hashable, computed: Sequence[int]) -> None:
        """Free every block of id; `computed` are the tokens whose K/V were written."""
        ...

    def truncate(self, id: Hashable, total: int) -> None:
        """Free id's blocks past the first ceil(total / B) (rejected drafts' slots). A table
        that shrinks becomes a new list, so that core/table_growth.py sees a new table."""
        ...

    def block_table(self, id: Hashable) -> Sequence[int]:
        """id's blocks in position order; empty for an id holding none. While id holds
        blocks this is one list that only grows at its end (core/table_growth.py relies
        on it); a new allocation is a new list."""
        ...


@runtime_checkable
class PrefixHooks(Protocol):
    """Optional extras of a BlockSpace that caches prefixes (core/prefix_cache.py); the
    scheduler uses them when its BlockSpace has them all (docs/design/scheduler.md#prefix-cache)."""

    def allocate(self, id: Hashable, tokens: Sequence[int], priority: int = 0,
                 lookup: bool = True, salt: str | None = None) -> Allocation:
        """As BlockSpace.allocate; `priority` ranks id's blocks for eviction once unused;
        lookup=False takes no cached blocks (a request that must compute every position);
        only requests of equal `salt` share blocks (docs/security.md)."""
        ...

    def cached_prefix(self, tokens: Sequence[int], salt: str | None = None) -> int:
        """The cached_tokens that allocate(tokens, salt=salt) would return now; changes
        nothing."""
        ...

    def computed(self, id: Hashable, tokens: Sequence[int], upto: int) -> None:
        """Positions 0..upto-1 of id hold the K/V of tokens[:upto]; ignored for an id
        holding no blocks."""
        ...

    def drop_cached(self) -> None:
        """The KV cache was lost: forget every cached prefix."""
        ...


_EMPTY: tuple[int, ...] = ()


def pool(block_tokens: int, ids: Iterable[int]) -> list[int]:
    """The validated block ids as a min-heap."""
    if type(block_tokens) is not int or block_tokens < 1:
        raise ValueError(f"block_tokens must be a positive int, got {block_tokens!r}")
    free = list(ids)
    if any(type(b) is not int or b < 0 for b in free):
        raise ValueError("block ids must be non-negative ints")
    if len(set(free)) != len(free):
        raise ValueError("block ids must be distinct")
    heapq.heapify(free)
    return free


class FreeListBlocks:
    """A plain free list: the lowest free ids first, so block tables are reproducible."""

    __slots__ = ("_B", "_total", "_free", "_tables")

    def __init__(self, block_tokens: int, ids: Iterable[int]):
        free = pool(block_tokens, ids)
        self._B = block_tokens
        self._total = len(free)
        self._free = free  # a min-heap of free ids
        self._tables: dict[Hashable, list[int]] = {}

    def block_tokens(self) -> int:
        return self._B

    def total_blocks(self) -> int:
        return self._total

    def free_blocks(self) -> int:
        return len(self._free)

    def allocate(self, id: Hashable, tokens: Sequence[int]) -> Allocation:
        if id in self._tables:
            raise ValueError(f"request {id!r} already holds blocks")
        self._tables[id] = self._take(-(-len(tokens) // self._B))
        return Allocation()

    def append_slot(self, id: Hashable, total: int) -> None:
        table = self._tables.get(id)
        if table is None:
            self._tables[id] = self._take(-(-total // self._B))
        elif len(table) * self._B < total:
            table += self._take(-(-total // self._B) - len(table))

    def release(self, id: Hashable, computed: Sequence[int] = ()) -> None:
        table = self._tables.pop(id, None)
        if table:
            free = self._free
            for b in table:
                heapq.heappush(free, b)

    def truncate(self, id: Hashable, total: int) -> None:
        table = self._tables.get(id)
        keep = -(-total // self._B)
        if table is not None and len(table) > keep:
            for b in table[keep:]:
                heapq.heappush(self._free, b)
            self._tables[id] = table[:keep]

    def block_table(self, id: Hashable) -> Sequence[int]:
        """The live table (read-only for callers) or an empty tuple."""
        return self._tables.get(id, _EMPTY)

    def _take(self, k: int) -> list[int]:
        free = self._free
        if k > len(free):
            raise NoCapacity(f"need {k} blocks, {len(free)} free")
        return [heapq.heappop(free) for _ in range(k)]
