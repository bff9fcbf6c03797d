"""A BlockSpace that shares full blocks by content: the scheduler half of prefix caching
(docs/design/scheduler.md#prefix-cache). Pure Python; every choice is a function of the calls made,
so a replayed scheduler reproduces every hit, eviction and block table."""
from __future__ import annotations

import heapq
from hashlib import blake2b
from typing import Hashable, Iterable, Sequence

from core.blocks import Allocation, NoCapacity, pool
from core.heap import LazyHeap

_ROOT = bytes(16)  # the parent key of a first block; as long as every key, so never ambiguous
_EMPTY: tuple[int, ...] = ()


def chain_root(salt: str | None) -> bytes:
    """The parent key of a request's first block: _ROOT unsalted, else a digest of the salt,
    so requests of different salts share no key, hence no block (docs/security.md)."""
    if salt is None:
        return _ROOT
    return blake2b(b"salt\0" + salt.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def block_key(parent: bytes, tokens: Sequence[int]) -> bytes:
    """A full block's key: chained over its parent's, so equal keys mean equal prefixes.
    blake2b, not hash(): identical across processes, runs and Python versions."""
    return blake2b(parent + ",".join(map(str, tokens)).encode(), digest_size=16).digest()


class PrefixCacheBlocks:
    """Reference-counted blocks; a full block whose K/V are computed is registered under
    its key and stays reusable, once no request holds it, until it is evicted.

    Invariants: a block is in exactly one of `_free` (no key, unreferenced), `_handle`
    (keyed, unreferenced: evictable) and `_ref` (held); `_key` and `_block` are inverse
    maps; a keyed block is never written again (it is full and computed, and every holder
    computes only positions past it).
    """

    def __init__(self, block_tokens: int, ids: Iterable[int]):
        self._free = pool(block_tokens, ids)     # min-heap of unkeyed unreferenced ids
        self._B = block_tokens
        self._total = len(self._free)
        self._evictable: LazyHeap[int] = LazyHeap()  # keyed, unreferenced: (prio, stamp, id)
        self._handle: dict[int, list] = {}       # block -> its _evictable entry
        self._ref: dict[int, int] = {}           # block -> live references (absent: 0)
        self._prio: dict[int, int] = {}          # block -> top priority of its holders since
                                                 # it was last unreferenced
        self._key: dict[int, bytes] = {}         # block -> key, held or cached
        self._block: dict[bytes, int] = {}       # key -> block
        self._owner: dict[int, Hashable] = {}    # keyed block -> the request that computed it
        self._tables: dict[Hashable, list[int]] = {}
        self._done: dict[Hashable, tuple[int, bytes]] = {}  # id -> (blocks settled, last key)
        self._req_prio: dict[Hashable, int] = {}
        self._clock = 0  # logical: one tick per block unreferenced
        self._memo: tuple[Sequence[int] | None, bytes, list[bytes]] = (None, _ROOT, [])  # _chain
        self.prefix_query_tokens = 0           # tokens looked up by successful allocations
        self.prefix_hit_tokens = 0             # of those, found cached (every hit)
        self.prefix_recompute_hit_tokens = 0   # of the hits, on blocks the request computed

    # ------------------------------------------------------------------ BlockSpace

    def block_tokens(self) -> int:
        return self._B

    def total_blocks(self) -> int:
        return self._total

    def free_blocks(self) -> int:
        """Every block no live request holds, cached ones included."""
        return len(self._free) + len(self._handle)

    def cached_blocks(self) -> int:
        """The free blocks that hold a reusable prefix (evictable)."""
        return len(self._handle)

    def allocate(self, id: Hashable, tokens: Sequence[int], priority: int = 0,
                 lookup: bool = True, salt: str | None = None) -> Allocation:
        """The longest cached prefix of full blocks, capped before the last token (whose K/V
        must go to a block id owns alone), plus fresh blocks; all or nothing. lookup=False:
        fresh blocks only (they are still cached for others as they are computed). salt:
        the chain starts from chain_root(salt), so only equal salts share blocks."""
        if id in self._tables:
            raise ValueError(f"request {id!r} already holds blocks")
        root = chain_root(salt)
        hits, parent = self._lookup(tokens, root) if lookup else ([], root)
        fresh = -(-len(tokens) // self._B) - len(hits)
        revived = sum(b in self._handle for b in hits)
        if fresh > self.free_blocks() - revived:
            raise NoCapacity(f"need {fresh + revived} blocks, {self.free_blocks()} free")
        for b in hits:
            self._hold(b, priority)
        self._tables[id] = hits + self._take(fresh, priority)
        self._done[id] = (len(hits), parent)
        self._req_prio[id] = priority
        B = self._B
        self.prefix_query_tokens += len(tokens) if lookup else 0
        self.prefix_hit_tokens += len(hits) * B
        self.prefix_recompute_hit_tokens += B * sum(self._owner[b] == id for b in hits)
        return Allocation(len(hits) * B)

    def append_slot(self, id: Hashable, total: int) -> None:
        need = -(-total // self._B)
        table = self._tables.get(id)
        if table is None:
            self._tables[id] = self._take(need, 0)
            self._done[id] = (0, _ROOT)
        elif len(table) < need:
            table += self._take(need - len(table), self._req_prio.get(id, 0))

    def release(self, id: Hashable, computed: Sequence[int] = ()) -> None:
        """Register the computed full blocks, then drop id's references."""
        table = self._tables.get(id)
        if table is None:
            return
        self.computed(id, computed, len(computed))
        del self._tables[id], self._done[id]
        self._req_prio.pop(id, None)
        for b in reversed(table):  # deeper blocks get older stamps: a chain is useless
            self._clock += 1       # without its head, so its tail is evicted first
            self._unhold(b)

    def truncate(self, id: Hashable, total: int) -> None:
        """As FreeListBlocks.truncate. The blocks let go hold no computed prefix (drafts
        never reach `computed`), so they are free at once."""
        table = self._tables.get(id)
        keep = -(-total // self._B)
        if table is not None and len(table) > keep:
            for b in reversed(table[keep:]):
                self._unhold(b)
            self._tables[id] = table[:keep]

    def block_table(self, id: Hashable) -> Sequence[int]:
        """The live table (read-only for callers) or an empty tuple."""
        return self._tables.get(id, _EMPTY)

    # ------------------------------------------------------------------ PrefixHooks

    def cached_prefix(self, tokens: Sequence[int], salt: str | None = None) -> int:
        return len(self._lookup(tokens, chain_root(salt))[0]) * self._B

    def computed(self, id: Hashable, tokens: Sequence[int], upto: int) -> None:
        table = self._tables.get(id)
        if table is None:  # released meanwhile (aborted mid-step)
            return
        B = self._B
        count, parent = self._done[id]
        full = min(upto // B, len(table))
        if full <= count:
            return
        for i in range(count, full):
            parent = block_key(parent, tokens[i * B:(i + 1) * B])
            if parent not in self._block:  # else an equal block computed alongside is kept
                b = table[i]
                self._block[parent] = b
                self._key[b] = parent
                self._owner[b] = id
        self._done[id] = (full, parent)

    def drop_cached(self) -> None:
        """Forget every key. Held blocks stay held; live requests do not register their
        earlier blocks again."""
        for b in self._handle:
            del self._prio[b]
        self._free.extend(self._handle)
        heapq.heapify(self._free)
        self._evictable = LazyHeap()
        for d in (self._handle, self._key, self._block, self._owner):
            d.clear()

    def summary(self) -> tuple:
        """The cache's state in brief, for a state hash or a log line."""
        return (len(self._handle), len(self._block), self.prefix_query_tokens,
                self.prefix_hit_tokens, self.prefix_recompute_hit_tokens)

    # ------------------------------------------------------------------ internals

    def _lookup(self, tokens: Sequence[int], root: bytes) -> tuple[list[int], bytes]:
        cached = self._block
        hits: list[int] = []
        parent = root
        for key in self._chain(tokens, root):
            b = cached.get(key)
            if b is None:
                break
            hits.append(b)
            parent = key
        return hits, parent

    def _chain(self, tokens: Sequence[int], root: bytes) -> list[bytes]:
        """The keys of tokens' full blocks before position n-1 (always computed), chained
        from root. The last list's chain is kept: admission looks the waiting head up twice
        (cached_prefix, then allocate), and again every step it waits. The scheduler's token
        lists only grow, so a kept chain of the same root is a prefix of the chain now."""
        B, n = self._B, (len(tokens) - 1) // self._B
        memo, memo_root, keys = self._memo
        if memo is not tokens or memo_root != root:
            keys = []
        parent = keys[-1] if keys else root
        for i in range(len(keys), n):
            parent = block_key(parent, tokens[i * B:(i + 1) * B])
            keys.append(parent)
        self._memo = (tokens, root, keys)
        return keys[:n]

    def _hold(self, b: int, priority: int) -> None:
        entry = self._handle.pop(b, None)
        if entry is not None:
            self._evictable.remove(entry)
        refs = self._ref.get(b, 0)
        self._prio[b] = priority if refs == 0 else max(self._prio[b], priority)
        self._ref[b] = refs + 1

    def _unhold(self, b: int) -> None:
        refs = self._ref[b] - 1
        if refs:
            self._ref[b] = refs
            return
        del self._ref[b]
        if b in self._key:
            self._handle[b] = self._evictable.push((self._prio[b], self._clock, b), b)
        else:
            del self._prio[b]
            heapq.heappush(self._free, b)

    def _take(self, k: int, priority: int) -> list[int]:
        """k fresh blocks: free ones lowest id first, then evictions (lowest priority, then
        least recently unreferenced). Never a held block."""
        if k > self.free_blocks():
            raise NoCapacity(f"need {k} blocks, {self.free_blocks()} free")
        out = []
        for _ in range(k):
            b = heapq.heappop(self._free) if self._free else self._evict()
            self._ref[b] = 1
            self._prio[b] = priority
            out.append(b)
        return out

    def _evict(self) -> int:
        b = self._evictable.pop()
        del self._handle[b], self._block[self._key.pop(b)], self._owner[b], self._prio[b]
        return b
