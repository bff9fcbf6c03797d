"""Paged attention plugged into transformers models as attn_implementation="tl_paged".

The model runs all sequences of a step flattened as one row of T tokens. Every layer's
attention call writes the step's K/V into the paged cache at the slot mapping, then
attends from the cache: the leading run of one-token sequences (decodes) through the C
kernel of worker/native.py where it is built (CPU fp32), else gathered into a few masked
SDPA calls; each later sequence (a PrefillSpan) alone with a causal mask offset by its
cached prefix.

GQA never expands the cache: for decodes the query heads sharing a KV head are folded into
the query length (query head h = kv_head * rep + r, transformers' layout); spans use SDPA's
enable_gqa. Every SDPA call is 4-D: on CPU a 3-D call falls back to the math kernel (2.6x
slower on a 512-token chunk of smol).

No mask function is registered for "tl_paged": transformers 5.24 then builds no attention
mask at all (create_causal_mask returns None for attention names it has no mask for),
where sdpa's would build a [T, T] mask for the flattened step (6.6 ms at T = 2048 on CPU).

A layer's `sliding_window` keyword W picks the step's masks cut to that window (a query at
position p sees keys p - W < k <= p, transformers' sliding_window_overlay), built once per
step by worker/step.py. `softcap` (Gemma2) caps the scores as tanh(s / cap) * cap before the
mask; SDPA has no such option, so those layers take the same math written out.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from worker import native

NAME = "tl_paged"
KWARG = "tl_paged"  # the model(...) keyword that carries the PagedStep to every layer
# Keywords the models pass that concern other parts of the forward, not attention's result.
PASSIVE = frozenset({KWARG, "position_ids", "use_cache", "output_router_logits"})


@dataclass
class PrefillSpan:
    """A sequence after the leading one-token run (a prefill chunk of the scheduler's, or a
    one-token sequence after one), attended alone: tokens [begin, end) of the step."""
    begin: int
    end: int
    slots: torch.Tensor        # [keys] cache slots of positions first..context-1, where
                               # first is 0 or, in a sliding window, the first it reaches
    mask: torch.Tensor | None  # [1, 1, length, keys] bool, True = attend; None = causal


@dataclass
class DecodeGroup:
    """Decodes of similar context length, gathered and attended together: padding every
    decode to the longest context in the step would gather mostly padding in mixed batches."""
    rows: torch.Tensor | None    # [g] long indices among the decodes; None = all, in order
    tables: torch.Tensor         # [g, width] long block ids
    mask: torch.Tensor           # [g, 1, 1, width * block_size] bool


@dataclass
class NativeDecode:
    """All decodes for the C kernel, which reads the pool in place (no groups needed)."""
    tables: torch.Tensor         # [n, width] int64 block ids
    context: torch.Tensor        # [n] int64


@dataclass
class PagedStep:
    kv: torch.Tensor             # [layers, 2, num_blocks, block_size, kv_heads, head_dim]
    slot_mapping: torch.Tensor   # [T] long, where each query token's K/V go
    num_decode: int              # the first num_decode tokens are one-token sequences
    decode_groups: list[DecodeGroup]
    spans: list[PrefillSpan]
    native: NativeDecode | None = None   # set: decodes take the C kernel, not the groups
    # per sliding window W: the decode groups and spans with masks (and span slots) cut to W
    windows: dict[int, tuple[list[DecodeGroup], list[PrefillSpan]]] = field(default_factory=dict)

    def masks(self, window: int | None) -> tuple[list[DecodeGroup], list[PrefillSpan]]:
        if window is None:
            return self.decode_groups, self.spans
        if window not in self.windows:
            raise ValueError(f"a layer asks for sliding window {window}, the step was built "
                             f"for {sorted(self.windows) or 'none'}")
        return self.windows[window]


def paged_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0,
                    sliding_window=None, softcap=None, **kwargs):
    """query [1, H, T, D], key/value [1, KVH, T, D] -> ([1, T, H, D], None)."""
    _refuse_unknown(module, attention_mask, dropout, kwargs)
    step: PagedStep = kwargs[KWARG]
    groups, spans = step.masks(sliding_window)
    _, heads, tokens, dim = query.shape
    rep = heads // key.shape[1]
    cache = step.kv[module.layer_idx]                           # [2, N, B, KVH, D]
    flat = cache.view(2, -1, cache.shape[-2], dim)              # [2, N * B, KVH, D]
    if step.native is not None:   # the kernel's library is built: one call, not ~7
        native.kv_write(cache, step.slot_mapping, key[0], value[0])
    else:
        flat[0].index_copy_(0, step.slot_mapping, key[0].transpose(0, 1))
        flat[1].index_copy_(0, step.slot_mapping, value[0].transpose(0, 1))

    q = query[0]                                                # [H, T, D]
    nd = step.num_decode
    if nd == tokens:
        return _decode(q, cache, step, groups, rep, scaling, softcap).unsqueeze(0), None
    out = query.new_empty(tokens, heads, dim)
    if nd:
        out[:nd] = _decode(q[:, :nd], cache, step, groups, rep, scaling, softcap)
    for s in spans:
        out[s.begin:s.end] = _span(q[:, s.begin:s.end], flat, s, rep, scaling, softcap)
    return out.unsqueeze(0), None


def _refuse_unknown(module, attention_mask, dropout, kwargs) -> None:
    """A keyword this attention does not implement would be silently ignored: refuse it
    (worker/runner.py probes this at load, so a checkpoint fails there, not mid-serving)."""
    if attention_mask is not None:
        raise ValueError(f"{type(module).__name__} passes its own attention mask, which the "
                         "paged attention does not follow")
    extra = [k for k, v in kwargs.items() if v is not None and k not in PASSIVE]
    if dropout:
        extra.append("dropout")
    if extra:
        raise ValueError(f"{type(module).__name__} passes {', '.join(extra)}, which the "
                         "paged attention does not implement")


def _decode(q, cache, step: PagedStep, groups: list[DecodeGroup], rep: int, scaling,
            softcap) -> torch.Tensor:
    """q [H, n, D] for n one-token sequences -> [n, H, D]."""
    heads, n, dim = q.shape
    if step.native is not None:
        if softcap is not None:  # build_step refuses the kernel with windows
            raise ValueError("the C decode kernel has no softcap")
        return native.paged_decode(q.transpose(0, 1), cache[0], cache[1], step.native.tables,
                                   step.native.context, scaling)
    qg = q.transpose(0, 1).reshape(n, heads // rep, rep, dim)   # [n, KVH, rep, D]
    if len(groups) == 1 and groups[0].rows is None:
        return _decode_group(qg, cache, groups[0], scaling, softcap).reshape(n, heads, dim)
    out = qg.new_empty(qg.shape)
    for g in groups:
        out[g.rows] = _decode_group(qg[g.rows], cache, g, scaling, softcap)
    return out.reshape(n, heads, dim)


def _decode_group(qg, cache, g: DecodeGroup, scaling, softcap) -> torch.Tensor:
    k = _gather(cache[0], g.tables)                             # [g, KVH, L, D]
    v = _gather(cache[1], g.tables)
    if softcap is not None:
        return _softcapped(qg, k, v, g.mask, scaling, softcap)
    return F.scaled_dot_product_attention(qg, k, v, attn_mask=g.mask, scale=scaling)


def _gather(cache: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    """Whole blocks along dim 0 (a row memcpy each; index_select along any other dim of
    the pool is several times slower)."""
    n, width = tables.shape
    _, block, kv_heads, dim = cache.shape
    blocks = cache.index_select(0, tables.reshape(-1))         # [n * W, B, KVH, D]
    return blocks.view(n, width * block, kv_heads, dim).transpose(1, 2)


def _span(q, flat, s: PrefillSpan, rep: int, scaling, softcap) -> torch.Tensor:
    """q [H, m, D] for one sequence's m query tokens -> [m, H, D]."""
    k = flat[0].index_select(0, s.slots).transpose(0, 1)        # [KVH, ctx, D]
    v = flat[1].index_select(0, s.slots).transpose(0, 1)
    if softcap is not None:
        heads, m, dim = q.shape
        mask = s.mask
        if mask is None:
            mask = torch.ones(m, len(s.slots), dtype=torch.bool, device=q.device).tril()
        o = _softcapped(q.view(heads // rep, rep, m, dim), k[:, None], v[:, None], mask,
                        scaling, softcap)                       # [KVH, rep, m, D]
        return o.reshape(heads, m, dim).transpose(0, 1)
    o = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=s.mask,
                                       is_causal=s.mask is None, scale=scaling,
                                       enable_gqa=rep > 1)
    return o[0].transpose(0, 1)


def _softcapped(q, k, v, mask, scaling, softcap) -> torch.Tensor:
    """SDPA's math with capped scores, as transformers' eager attention computes it:
    q [..., Q, D], k/v [..., L, D], mask broadcastable to [..., Q, L] (True = attend)."""
    scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5 if scaling is None else scaling)
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v


def register() -> None:
    """Idempotent: AttentionInterface keeps one global mapping."""
    AttentionInterface.register(NAME, paged_attention)
