"""Which checkpoints the paged attention serves exactly, decided at load from the config.

A family is listed only once tests/worker/test_arch_families.py matches its greedy tokens with
transformers' generate. Anything else is refused at load, never served wrongly.
"""
from __future__ import annotations

SUPPORTED = frozenset({
    "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "olmo2", "granite",
    "starcoder2", "gpt2", "gpt_neox", "mixtral",
})
# Families whose greedy tokens over 2 ranks (worker/tp.py) tests/group/test_tp.py matches with one
# process's; as above, the others are refused rather than served unchecked.
CHECKED = frozenset({"llama", "qwen2", "mistral", "qwen3", "gemma", "gemma2", "granite",
                     "starcoder2", "mixtral"})
LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})


def check(config) -> None:
    """ValueError naming the model_type or the feature the paged attention cannot do."""
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED:
        raise ValueError(f"model_type {kind!r} is not supported: its attention is not "
                         f"checked against transformers; supported: {', '.join(sorted(SUPPORTED))}")
    problem = next(_unsupported(config), None)
    if problem:
        raise ValueError(f"model_type {kind!r} with {problem[0]} is not supported: {problem[1]}")


def _unsupported(config):
    other = set(getattr(config, "layer_types", None) or ()) - LAYER_TYPES
    if other:
        yield f"layer_types {sorted(other)}", "only full and sliding-window attention are paged"
    if getattr(config, "use_bidirectional_attention", False):
        yield "use_bidirectional_attention", "the paged attention is causal"
    if getattr(config, "add_cross_attention", False) or config.is_encoder_decoder:
        yield "cross-attention", "the paged attention is self-attention only"
    dynamic = [t for t in _rope_types(config) if "dynamic" in t or t == "longrope"]
    if dynamic:
        yield (f"rope_type {dynamic[0]!r}", "its frequencies follow the largest position in "
               "the forward pass, which is a whole step of sequences here")


def _rope_types(config) -> list[str]:
    rope = getattr(config, "rope_parameters", None) or {}
    if "rope_type" in rope:
        return [rope["rope_type"]]
    return [r.get("rope_type", "default") for r in rope.values() if isinstance(r, dict)]


def windows(config) -> tuple[int, ...]:
    """The sliding-window sizes the model's layers pass to the attention (at most one)."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if not window or (types is not None and "sliding_attention" not in types):
        return ()
    return (window,)


def plain_attention(config) -> bool:
    """No sliding window and no softcap: what the C decode kernel (worker/native.py) computes."""
    return not windows(config) and not getattr(config, "attn_logit_softcapping", None)


def check_split(config, tp: int) -> None:
    """ValueError saying why the model cannot be split over `tp` ranks."""
    if tp < 1:
        raise ValueError(f"--tp must be at least 1, not {tp}")
    if tp == 1:
        return
    kind = getattr(config, "model_type", None)
    if not getattr(config, "base_model_tp_plan", None):
        raise ValueError(f"model_type {kind!r} has no tensor-parallel plan in transformers; "
                         "it runs with --tp 1 only")
    if kind not in CHECKED:
        raise ValueError(f"model_type {kind!r} is not checked under tensor parallel "
                         f"(checked: {', '.join(sorted(CHECKED))}); it runs with --tp 1 only")
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    for n, what in ((heads, "attention heads"), (kv_heads, "KV heads")):
        if n % tp:
            raise ValueError(f"--tp {tp} does not divide the model's {n} {what}")
