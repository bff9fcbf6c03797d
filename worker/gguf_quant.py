"""A GGUF file's quantized tensors as QuantLinear layers, the blocks as stored.

The converted checkpoint (worker/gguf_convert.py) holds every weight dequantized; this
puts, in place of each linear layer whose GGUF tensor is a type the kernel multiplies by
(Q8_0, Q4_0, Q4_1), a QuantLinear on that tensor's bytes. The llama.cpp converter permutes
the rows of Q and K for its rotary layout; a row is whole blocks, so the rows are put back
in transformers' order as bytes. Nothing is rounded again: each layer's `dense()` equals
the converted checkpoint's weight bit for bit (tests/worker/test_gguf_quant.py).

Not wired into serving yet: the worker's load path does not call it.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from worker.linear.quant import TYPES, QuantWeight
from worker.linear.quant_module import QuantLinear, put

# GGUF's per-block tensor names -> the module under model.layers.{i} (llama's layout, which
# the architectures below share)
LAYER_TENSORS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                 "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                 "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                 "ffn_down": "mlp.down_proj"}
ARCHITECTURES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
PERMUTED = {"llama": ("attn_q", "attn_k"), "mistral": ("attn_q", "attn_k")}


def module_name(tensor: str) -> str | None:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj'; None for any other."""
    parts = tensor.split(".")
    if len(parts) != 4 or parts[0] != "blk" or parts[3] != "weight":
        return None
    inner = LAYER_TENSORS.get(parts[2])
    return None if inner is None else f"model.layers.{parts[1]}.{inner}"


def unpermute(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Undo the converter's rotary permutation of a weight's rows (transformers' reverse)."""
    out = rows.shape[0]
    return (rows.reshape(n_head, out // n_head // 2, 2, *rows.shape[1:])
            .swapaxes(1, 2).reshape(rows.shape))


def load_quantized(model: nn.Module, path: str | Path, architecture: str) -> dict[str, str]:
    """Replace the linear layers of `model` whose tensors in `path` are Q8_0/Q4_0/Q4_1 by
    QuantLinear layers on their blocks; {module name: type}. Other types stay as the float
    weights of the converted checkpoint, with one line on stderr naming them."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"quantized weights are not read for GGUF architecture "
                         f"{architecture!r} (read for: {', '.join(sorted(ARCHITECTURES))})")
    from gguf import GGUFReader
    reader = GGUFReader(str(path))
    cfg = model.config
    heads = {"attn_q": cfg.num_attention_heads,
             "attn_k": getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads}
    done, unread = {}, set()
    for t in reader.tensors:
        name, qtype = module_name(t.name), TYPES.get(t.tensor_type.name)
        if name is None:
            continue
        if qtype is None:
            unread.add(t.tensor_type.name)
            continue
        rows = np.asarray(t.data)
        kind = t.name.split(".")[2]
        if kind in PERMUTED.get(architecture, ()):
            rows = unpermute(rows, heads[kind])
        _replace(model, name, QuantWeight(torch.from_numpy(np.array(rows, copy=True)), qtype,
                                          (rows.shape[0], int(t.shape[0]))))
        done[name] = qtype.name
    unread -= {"F32", "F16", "BF16"}
    if unread:
        print(f"{Path(path).name}: tensors of {', '.join(sorted(unread))} are served as float32 "
              "weights (no kernel for them): about 4-8x the bytes per token of their blocks",
              file=sys.stderr, flush=True)
    return done


def _replace(model: nn.Module, name: str, weight: QuantWeight) -> None:
    old = model.get_submodule(name)
    if tuple(old.weight.shape) != weight.shape:
        raise ValueError(f"{name}: the GGUF tensor is {list(weight.shape)}, the model's weight "
                         f"{list(old.weight.shape)}")
    put(model, name, QuantLinear(weight, old.bias))
