"""A GGUF file's quantized tensors as QuantLinear layers, the blocks as stored.

This puts, in place of each linear layer whose GGUF tensor is a type the kernel multiplies
by (worker.linear.quant.TYPES), a QuantLinear on that tensor's blocks as they lie in the
file's map (worker/gguf_tensors.py: no copy), and in place of the token embedding (and the
output head that shares it, or the file's own output tensor) a QuantEmbedding (a
QuantLinear) on theirs. The llama.cpp converter permutes the rows of Q and K for its rotary
layout; a row is whole blocks, so those rows are put back in transformers' order as bytes
(a copy). Nothing is rounded again: each layer's `dense()` equals transformers' dequantized
weight bit for bit (tests/worker/test_gguf_quant.py). Tensors of the block types the kernel
lacks are re-quantized to Q8_0 (worker/requantize.py), said once with the cost; float
tensors are left to the caller (worker/gguf_tensors.py reads them as float32).
"""
from __future__ import annotations

import sys

import numpy as np
import torch
from torch import nn

from worker import requantize
from worker.gguf_index import TensorInfo
from worker.gguf_names import ARCHITECTURES, module_name, permuted_heads, unpermute
from worker.gguf_tensors import FLOATS, GgufTensors
from worker.linear.quant import TYPES, QuantWeight
from worker.linear.quant_module import QuantEmbedding, QuantLinear, put

EMBEDDINGS = ("token_embd.weight", "output.weight")


def load_quantized(model: nn.Module, tensors: GgufTensors,
                   architecture: str) -> dict[str, str]:
    """Replace the linear layers and the embedding of `model` whose tensors in the file are
    blocks by QuantLinear/QuantEmbedding layers on them; {module name: type}. Float tensors
    stay as the model's (empty) weights, for the caller to read."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"quantized weights are not read for GGUF architecture "
                         f"{architecture!r} (read for: {', '.join(sorted(ARCHITECTURES))})")
    done, requantized, unread = {}, set(), set()
    for t in tensors.index.tensors:
        name = t.name if t.name in EMBEDDINGS else module_name(t.name)
        if name is None:
            continue
        weight = _weight(tensors, t, permuted_heads(t.name, architecture, model.config))
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
        print(requantize.warning(tensors.path.name, requantized), file=sys.stderr, flush=True)
    if unread := unread - set(FLOATS):
        print(f"{tensors.path.name}: tensors of {', '.join(sorted(unread))} are served as "
              "float32 weights (no kernel for them): about 4-8x the bytes per token of their "
              "blocks", file=sys.stderr, flush=True)
    return done


def _weight(tensors: GgufTensors, t: TensorInfo, n_head: int | None) -> QuantWeight | None:
    """The tensor as served: its blocks, or Q8_0 ones re-quantized from a type the kernel
    lacks; None for a type neither (float: read as the model's float weight)."""
    qtype = TYPES.get(t.type_name)
    rows = tensors.raw(t)
    if qtype is not None:
        if n_head is not None:   # whole rows of blocks, moved: a copy
            rows = torch.from_numpy(np.ascontiguousarray(unpermute(rows.numpy(), n_head)))
        return QuantWeight(rows, qtype, (rows.shape[0], int(t.dims[0])))
    if not requantize.requantizable(t.type_name):
        return None
    floats = requantize.decoded(rows.numpy(), t.type_name)
    return requantize.to_q8_0(floats if n_head is None else unpermute(floats, n_head))


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
