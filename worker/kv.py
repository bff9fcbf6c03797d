"""The paged KV tensor: [layers, 2, num_blocks, block_size, kv_heads, head_dim]."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from core.config import MAX_NUM_BLOCKS, MAX_SLOTS, layout_problem

DEFAULT_KV_MEMORY = 1 << 30   # cap on the default pool when neither size is given
DEFAULT_CONTEXTS = 4          # the default pool holds this many max_model_len sequences


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


def size_pool(shape: KVShape, block_size: int, dtype: torch.dtype, max_model_len: int,
              num_blocks: int | None = None, kv_memory: int | None = None) -> int:
    """Number of blocks: given, or what kv_memory bytes hold (at most the engine's bound on
    the pool, core/config.py), or a default for a few contexts."""
    if num_blocks is not None and kv_memory is not None:
        raise ValueError("give num_blocks or kv_memory, not both")
    per_block = shape.block_bytes(block_size, dtype)
    if num_blocks is None:
        if kv_memory is None:
            want = -(-DEFAULT_CONTEXTS * max_model_len // block_size)
            num_blocks = min(want, DEFAULT_KV_MEMORY // per_block)
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
