"""The paged KV tensor: [layers, 2, num_blocks, block_size, kv_heads, head_dim], and how
many blocks it holds.

The default pool (neither --num-blocks nor --kv-memory) fits the machine and the model:
DEFAULT_CONTEXTS full max_model_len contexts, within DEFAULT_KV_FRACTION of the memory
available once the weights are loaded (MemAvailable, /proc/meminfo) and at most
DEFAULT_KV_MEMORY; where that holds less than one full context, one context, if it fits in
ONE_CONTEXT_FRACTION of what is available (a pool that cannot hold one max_model_len
request would refuse the longest requests the model takes); else the worker refuses to
start, naming the --max-model-len that would fit. Without /proc/meminfo the pool is the
contexts capped at DEFAULT_KV_MEMORY, unchecked.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from core.config import MAX_NUM_BLOCKS, MAX_SLOTS, layout_problem

DEFAULT_CONTEXTS = 4          # the default pool holds this many max_model_len sequences,
DEFAULT_KV_FRACTION = 0.5     # within this share of the memory left after the weights
DEFAULT_KV_MEMORY = 8 << 30   # and at most this many bytes,
ONE_CONTEXT_FRACTION = 0.8    # but one context where it fits in this share
MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True)
class KVShape:
    layers: int
    kv_heads: int
    head_dim: int

    def block_bytes(self, block_size: int, dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return self.layers * 2 * block_size * self.kv_heads * self.head_dim * elem


def kv_shape(config, tp: int = 1) -> KVShape:
    """One rank's share of the KV heads: the config still counts all of them under TP."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return KVShape(config.num_hidden_layers, kv_heads // tp, head_dim)


def available_memory(meminfo: Path = MEMINFO) -> int | None:
    """The kernel's estimate of the bytes that can be allocated now without swapping
    (MemAvailable), or None where there is no such figure."""
    try:
        for line in meminfo.read_text().splitlines():
            name, _, value = line.partition(":")
            if name == "MemAvailable":
                return int(value.split()[0]) * 1024   # the file counts kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def default_blocks(per_block: int, block_size: int, max_model_len: int,
                   available: int | None) -> int:
    """The default pool's blocks (the module's docstring has the rule), given `available`
    bytes of memory beside the loaded weights; ValueError where one context does not fit."""
    context = -(-max_model_len // block_size)
    budget = DEFAULT_KV_MEMORY
    if available is not None:
        budget = min(budget, int(DEFAULT_KV_FRACTION * available))
    blocks = min(DEFAULT_CONTEXTS * context, budget // per_block)
    if blocks >= context or available is None:
        return blocks
    if context * per_block <= ONE_CONTEXT_FRACTION * available:
        return context
    fits = int(ONE_CONTEXT_FRACTION * available) // per_block * block_size
    gib = 1 << 30
    raise ValueError(
        f"the default KV pool cannot hold one {max_model_len}-token context"
        f" ({context * per_block / gib:.2f} GiB) in the {available / gib:.2f} GiB of memory"
        f" available beside the weights: pass --max-model-len {fits} or less, or size the"
        " pool with --kv-memory or --num-blocks")


def size_pool(shape: KVShape, block_size: int, dtype: torch.dtype, max_model_len: int,
              num_blocks: int | None = None, kv_memory: int | None = None,
              available: int | None = None, weights: int = 0) -> int:
    """Number of blocks: given, or what kv_memory bytes hold (at most the engine's bound on
    the pool, core/config.py), or the default for this machine (default_blocks). The
    default reads MemAvailable unless `available` is given, less `weights`: the bytes of
    weights not loaded yet (0 once they are, as MemAvailable then counts them)."""
    if num_blocks is not None and kv_memory is not None:
        raise ValueError("give num_blocks or kv_memory, not both")
    per_block = shape.block_bytes(block_size, dtype)
    if num_blocks is None:
        if kv_memory is None:
            free = available_memory() if available is None else available
            num_blocks = default_blocks(per_block, block_size, max_model_len,
                                        None if free is None else max(0, free - weights))
        else:
            num_blocks = kv_memory // per_block
        num_blocks = min(num_blocks, MAX_NUM_BLOCKS, MAX_SLOTS // block_size)
    if num_blocks < 1:
        raise ValueError(f"the KV pool must hold at least one block ({per_block} bytes)")
    if why := layout_problem(num_blocks, block_size, max_model_len):
        raise ValueError(why)
    return int(num_blocks)


def allocate(shape: KVShape, num_blocks: int, block_size: int, dtype: torch.dtype,
             device: torch.device | str) -> torch.Tensor:
    return torch.zeros(shape.layers, 2, num_blocks, block_size, shape.kv_heads, shape.head_dim,
                       dtype=dtype, device=device)
