"""The Llama modules of one model on the C row ops (worker/row_ops.py): RMSNorm, the rotary
embedding of q and k, and the residual add before the post-attention norm.

On a one-row decode of smollm2 these are ~1,800 small torch calls a step (~60 a layer); here
they are 3 calls a layer. The MLP keeps torch's silu(gate) * up: 2 calls, which the decode
graph replays faster (~4-7 us) than one op with a Python kernel runs (~10-14 us).

Only this model's instances change (their `forward`, as worker/linear/packed.py swaps a
linear layer's), and only modules whose class is transformers' Llama one, whose code the
replacements follow step for step: every other family keeps its own code. Same sub-module
calls in the same order, so the linear layers' sibling fusion (packed.py, quant_fuse.py)
still sees q, k, v (and gate, up) handed one tensor.

Numerics: RMSNorm's mean of squares is summed in the kernel's fixed order (not torch's),
within float32 rounding of torch's; the rotary embedding and the residual add give torch's
bits.
"""
from __future__ import annotations

import torch
from torch import nn

from worker import row_ops


def usable(model, tp: int) -> bool:
    """CPU float32, one worker process (a shard's modules follow transformers' plan), and the
    kernel built (and not turned off: TL_ROW_OPS=0)."""
    p = next(model.parameters())
    return (tp == 1 and p.device.type == "cpu" and p.dtype == torch.float32
            and row_ops.enabled() and row_ops.kernel() is not None)


def adapt(model: nn.Module) -> int:
    """Put the row ops in the model's Llama modules, in place; how many were changed."""
    from transformers.models.llama import modeling_llama as ll

    swaps = {ll.LlamaRMSNorm: _norm_forward, ll.LlamaAttention: _attention_forward,
             ll.LlamaDecoderLayer: _layer_forward}
    changed = 0
    for mod in model.modules():
        make = swaps.get(type(mod))
        if make is not None:
            mod.forward = make(mod)
            changed += 1
    return changed


def _norm_forward(norm):
    return lambda hidden_states: row_ops.rms_norm(hidden_states, norm.weight,
                                                  norm.variance_epsilon)


def _attention_forward(attn):
    """LlamaAttention.forward with apply_rotary_pos_emb as one op on q and k before their
    heads are split out (transformers 5's, `cache` its past_key_values)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.llama.modeling_llama import eager_attention_forward

    def forward(hidden_states, position_embeddings=None, attention_mask=None, cache=None,
                **kwargs):
        lead = hidden_states.shape[:-1]
        heads = (*lead, -1, attn.head_dim)
        q = attn.q_proj(hidden_states)
        k = attn.k_proj(hidden_states)
        v = attn.v_proj(hidden_states)
        q, k = row_ops.rope(q, k, *position_embeddings, attn.head_dim)
        q, k, v = (t.view(heads).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            k, v = cache.update(k, v, attn.layer_idx, kwargs=kwargs)
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(attn.config._attn_implementation,
                                                          eager_attention_forward)
        out, weights = interface(attn, q, k, v, attention_mask,
                                 dropout=attn.attention_dropout if attn.training else 0.0,
                                 scaling=attn.scaling, **kwargs)
        return attn.o_proj(out.reshape(*lead, -1).contiguous()), weights
    return forward


def _layer_forward(layer):
    """LlamaDecoderLayer.forward with the residual add and the post-attention RMSNorm as
    one op."""
    post = layer.post_attention_layernorm

    def forward(hidden_states, attention_mask=None, position_ids=None, cache=None,
                use_cache=False, position_embeddings=None, **kwargs):
        h = layer.input_layernorm(hidden_states)
        h, _ = layer.self_attn(hidden_states=h, attention_mask=attention_mask,
                               position_ids=position_ids, cache=cache, use_cache=use_cache,
                               position_embeddings=position_embeddings, **kwargs)
        residual, h = row_ops.add_rms_norm(h, hidden_states, post.weight,
                                           post.variance_epsilon)
        return residual + layer.mlp(h)
    return forward
