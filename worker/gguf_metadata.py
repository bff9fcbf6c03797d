"""A GGUF file's model metadata checked against its tensors, before anything is built from
it: transformers makes a model of the size the metadata claims (a `block_count` of 100,000
is 100,000 layers made, whatever the file holds), and a head count that does not split the
tensors' rows would serve garbage. So every size the model is built from must be the size
of the tensors present; one line (ValueError) names the first that is not.

The tensors' dims are ggml's order: dims[0] is a row's length (the input size), dims[1] the
rows. The names are llama.cpp's, shared by the architectures served (gguf_file.ARCHITECTURES):
token_embd [hidden, vocab], blk.N.attn_output [heads x head_dim, hidden], blk.N.ffn_down
[ffn, hidden], and where the file has them apart, blk.N.attn_q / attn_k [hidden, heads x
head_dim] (phi3 and gpt2 fuse q, k and v in attn_qkv: its rows are all three).
"""
from __future__ import annotations

import re

from worker.gguf_index import GgufIndex, TensorInfo

LAYER = re.compile(r"blk\.(\d+)\.")
LIMIT = 1 << 24   # larger than any real model's count or size: a bound before arithmetic


def check(index: GgufIndex, arch: str) -> None:
    """ValueError naming the first model size in the metadata the tensors disagree with."""
    tensors = {t.name: t for t in index.tensors}
    size = _sizes(index, arch)
    _check_layers(tensors, arch, size["block_count"])
    embd = _tensor(tensors, "token_embd.weight")
    _agree("embedding_length", size["embedding_length"], "token_embd.weight's row length",
           embd.dims[0])
    vocab = index.array_lengths.get("tokenizer.ggml.tokens")
    if vocab is not None:
        _agree("the vocabulary (tokenizer.ggml.tokens)", vocab, "token_embd.weight's rows",
               embd.dims[-1])
    if f"{arch}.vocab_size" in index.fields:
        _agree(f"{arch}.vocab_size", size["vocab_size"], "token_embd.weight's rows",
               embd.dims[-1])
    _check_heads(tensors, index, arch, size)
    for i in range(size["block_count"]):
        down = _tensor(tensors, f"blk.{i}.ffn_down.weight")
        _agree(f"{arch}.feed_forward_length", size["feed_forward_length"],
               f"blk.{i}.ffn_down.weight's row length", down.dims[0])


def _sizes(index: GgufIndex, arch: str) -> dict[str, int]:
    """The metadata's sizes, each a positive int within LIMIT."""
    keys = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count")
    optional = ("attention.head_count_kv", "attention.key_length", "rope.dimension_count",
                "vocab_size")
    sizes = {}
    for key in (*keys, *optional):
        name = f"{arch}.{key}"
        if name not in index.fields:
            if key in keys:
                raise ValueError(f"GGUF metadata has no {name!r}")
            continue
        value = index.fields[name]
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= LIMIT:
            raise ValueError(f"GGUF metadata {name} = {value!r} is not a model size")
        sizes[key] = value
    return sizes


def _check_layers(tensors: dict[str, TensorInfo], arch: str, block_count: int) -> None:
    layers = {int(m.group(1)) for name in tensors if (m := LAYER.match(name))}
    if layers != set(range(block_count)):
        held = f"0..{max(layers)}" if layers else "none"
        raise ValueError(f"GGUF metadata {arch}.block_count is {block_count}, but the file "
                         f"holds tensors of {len(layers)} layers ({held})")


def _check_heads(tensors: dict[str, TensorInfo], index: GgufIndex, arch: str,
                 size: dict[str, int]) -> None:
    """Heads, KV heads and the head size must split blk.0's attention rows exactly."""
    heads = size["attention.head_count"]
    kv = size.get("attention.head_count_kv", heads)
    if heads % kv:
        raise ValueError(f"GGUF metadata: {heads} attention heads are not a multiple of "
                         f"{kv} KV heads")
    head_dim = size.get("attention.key_length") or size["embedding_length"] // heads
    if "rope.dimension_count" in size and size["rope.dimension_count"] > head_dim:
        raise ValueError(f"GGUF metadata {arch}.rope.dimension_count = "
                         f"{size['rope.dimension_count']} exceeds the head size {head_dim}")
    out = _tensor(tensors, "blk.0.attn_output.weight")
    _agree(f"{arch}.attention.head_count x head size", heads * head_dim,
           "blk.0.attn_output.weight's row length", out.dims[0])
    if "blk.0.attn_q.weight" in tensors:
        _agree(f"{arch}.attention.head_count x head size", heads * head_dim,
               "blk.0.attn_q.weight's rows", tensors["blk.0.attn_q.weight"].dims[-1])
        _agree(f"{arch}.attention.head_count_kv x head size", kv * head_dim,
               "blk.0.attn_k.weight's rows", _tensor(tensors, "blk.0.attn_k.weight").dims[-1])
    elif "blk.0.attn_qkv.weight" in tensors:
        _agree(f"{arch}'s heads and KV heads x head size", (heads + 2 * kv) * head_dim,
               "blk.0.attn_qkv.weight's rows", tensors["blk.0.attn_qkv.weight"].dims[-1])


def _tensor(tensors: dict[str, TensorInfo], name: str) -> TensorInfo:
    if name not in tensors:
        raise ValueError(f"the GGUF file has no tensor {name}")
    return tensors[name]


def _agree(claim: str, claimed: int, held: str, actual: int) -> None:
    if claimed != actual:
        raise ValueError(f"GGUF metadata {claim} is {claimed}, but {held} is {actual}")
