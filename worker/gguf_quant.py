"""A GGUF file's quantized tensors as QuantLinear layers, the blocks as stored.

The converted checkpoint (worker/gguf_convert.py) holds every weight dequantized; this
puts, in place of each linear layer whose GGUF tensor is a type the kernel multiplies by
(Q8_0, Q4_0, Q4_1), a QuantLinear on that tensor's bytes, and in place of the token
embedding (and the output head that shares it, or the file's own output tensor) a
QuantEmbedding (a QuantLinear) on theirs. The llama.cpp converter permutes the rows of Q
and K for its rotary layout; a row is whole blocks, so the rows are put back in
transformers' order as bytes. Nothing is rounded again: each layer's `dense()` equals the
converted checkpoint's weight bit for bit (tests/worker/test_gguf_quant.py). Tensors of
the types the kernel lacks (the K-quants, Q5_0, Q5_1) are re-quantized to Q8_0
(worker/requantize.py), said once with the cost.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from worker import requantize
from worker.gguf_index import TensorInfo, read_index, read_into
from worker.linear.quant import TYPES, QuantWeight
from worker.linear.quant_module import QuantEmbedding, QuantLinear, put

# GGUF's per-block tensor names -> the module under model.layers.{i} (llama's layout, which
# the architectures below share)
LAYER_TENSORS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                 "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                 "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                 "ffn_down": "mlp.down_proj"}
ARCHITECTURES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
EMBEDDINGS = ("token_embd.weight", "output.weight")
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
    cfg = model.config
    heads = {"attn_q": cfg.num_attention_heads,
             "attn_k": getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads}
    done, unread, requantized = {}, set(), set()
    with open(path, "rb") as f:
        for t in read_index(path).tensors:
            name = t.name if t.name in EMBEDDINGS else module_name(t.name)
            if name is None:
                continue
            kind = t.name.split(".")[-2]
            n_head = heads[kind] if kind in PERMUTED.get(architecture, ()) else None
            weight = _weight(f, t, n_head)
            if weight is None:
                unread.add(t.type_name)
                continue
            label = weight.qtype.name
            if t.type_name != label:
                requantized.add(t.type_name)
                label = f"{label} from {t.type_name}"
            if t.name in EMBEDDINGS:
                done.update(dict.fromkeys(_embedding(model, t.name, weight), label))
            else:
                _replace(model, name, weight)
                done[name] = label
    if requantized:
        print(requantize.warning(Path(path).name, requantized), file=sys.stderr, flush=True)
    unread -= {"F32", "F16", "BF16"}
    if unread:
        print(f"{Path(path).name}: tensors of {', '.join(sorted(unread))} are served as float32 "
              "weights (no kernel for them): about 4-8x the bytes per token of their blocks",
              file=sys.stderr, flush=True)
    return done


def _weight(f, t: TensorInfo, n_head: int | None) -> QuantWeight | None:
    """The tensor as served: its blocks, or Q8_0 ones re-quantized from a type the kernel
    lacks; None for a type neither (float: the checkpoint's weight stays)."""
    qtype = TYPES.get(t.type_name)
    if qtype is not None:
        return _blocks(f, t, qtype, n_head)
    if not requantize.requantizable(t.type_name):
        return None
    floats = requantize.decoded(_raw(f, t), t.type_name)
    return requantize.to_q8_0(floats if n_head is None else unpermute(floats, n_head))


def _blocks(f, t: TensorInfo, qtype, n_head: int | None) -> QuantWeight:
    """The tensor's blocks as the file stores them, its rows put back in transformers'
    order where the converter permuted them for `n_head` heads."""
    rows = _raw(f, t)
    if n_head is not None:
        rows = np.ascontiguousarray(unpermute(rows, n_head))
    return QuantWeight(torch.from_numpy(rows), qtype, (rows.shape[0], int(t.dims[0])))


def _raw(f, t: TensorInfo) -> np.ndarray:
    """[rows, bytes per row] uint8, read from the open file."""
    out = np.empty(t.byte_shape, dtype=np.uint8)
    read_into(f, t, out)
    return out


def _embedding(model: nn.Module, tensor: str, weight: QuantWeight) -> dict[str, str]:
    """token_embd: the input embedding, and the output head where it shares the embedding's
    weight; output: the head."""
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head is not None and getattr(head, "weight", 0) is getattr(emb, "weight", 1)
    targets = {"token_embd.weight": [emb, head] if tied else [emb],
               "output.weight": [] if tied else [head]}[tensor]
    names = {id(m): n for n, m in model.named_modules()}
    done = {}
    for mod in targets:
        if tuple(mod.weight.shape) != weight.shape:
            raise ValueError(f"{tensor}: the GGUF tensor is {list(weight.shape)}, the model's "
                             f"weight {list(mod.weight.shape)}")
        new = (QuantEmbedding(weight) if mod is emb
               else QuantLinear(weight, getattr(mod, "bias", None)))
        put(model, names[id(mod)], new)
        done[names[id(mod)]] = weight.qtype.name
    return done


def _replace(model: nn.Module, name: str, weight: QuantWeight) -> None:
    old = model.get_submodule(name)
    if tuple(old.weight.shape) != weight.shape:
        raise ValueError(f"{name}: the GGUF tensor is {list(weight.shape)}, the model's weight "
                         f"{list(old.weight.shape)}")
    put(model, name, QuantLinear(weight, old.bias))
