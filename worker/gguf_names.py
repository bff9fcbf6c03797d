"""Which parameter of a transformers model each GGUF tensor is, and in what row order, for the
layouts whose tensors the worker reads from the file itself (llama, mistral, qwen2, qwen3):
llama.cpp's names (blk.N.attn_q.weight, output_norm.weight, ...) against transformers'
(model.layers.N.self_attn.q_proj.weight, model.norm.weight, ...).

llama.cpp's converter permutes the rows of llama's (and mistral's) Q and K weights and
biases for its rotary layout (convert_hf_to_gguf's LlamaModel.permute; K with the KV heads);
qwen2's and qwen3's are stored as transformers has them.
"""
from __future__ import annotations

import numpy as np

ARCHITECTURES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
# GGUF's per-block linear layers -> the module under model.layers.{i}
LAYER_LINEARS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                 "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                 "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                 "ffn_down": "mlp.down_proj"}
# the other per-block tensors -> the parameter under model.layers.{i}
LAYER_OTHERS = {"attn_norm.weight": "input_layernorm.weight",
                "ffn_norm.weight": "post_attention_layernorm.weight",
                "attn_q_norm.weight": "self_attn.q_norm.weight",      # qwen3
                "attn_k_norm.weight": "self_attn.k_norm.weight",
                **{f"{k}.bias": f"{v}.bias" for k, v in LAYER_LINEARS.items()}}   # qwen2
TOP = {"token_embd.weight": "model.embed_tokens.weight", "output.weight": "lm_head.weight",
       "output_norm.weight": "model.norm.weight"}
PERMUTED = {"llama": ("attn_q", "attn_k"), "mistral": ("attn_q", "attn_k")}


def module_name(tensor: str) -> str | None:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj'; None for any other."""
    parts = tensor.split(".")
    if len(parts) != 4 or parts[0] != "blk" or parts[3] != "weight":
        return None
    inner = LAYER_LINEARS.get(parts[2])
    return None if inner is None else f"model.layers.{parts[1]}.{inner}"


def parameter_name(tensor: str) -> str | None:
    """The model parameter the tensor is ('blk.0.attn_norm.weight' ->
    'model.layers.0.input_layernorm.weight'); None for a tensor the model has no place for
    (llama 3's rope_freqs: the config's rope scaling computes the same)."""
    if tensor in TOP:
        return TOP[tensor]
    if module := module_name(tensor):
        return f"{module}.weight"
    parts = tensor.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in LAYER_OTHERS:
        return f"model.layers.{parts[1]}.{LAYER_OTHERS[parts[2]]}"
    return None


def permuted_heads(tensor: str, architecture: str, config) -> int | None:
    """The head count the converter permuted the tensor's rows for, or None (not permuted)."""
    kind = tensor.split(".")[-2] if tensor.startswith("blk.") else None
    if kind not in PERMUTED.get(architecture, ()):
        return None
    if kind == "attn_q":
        return config.num_attention_heads
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


def unpermute(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Undo the converter's rotary permutation of a weight's rows (transformers' reverse)."""
    out = rows.shape[0]
    if out % (2 * n_head):
        raise ValueError(f"{out} rows do not split into {n_head} heads of rotary pairs")
    return (rows.reshape(n_head, out // n_head // 2, 2, *rows.shape[1:])
            .swapaxes(1, 2).reshape(rows.shape))
