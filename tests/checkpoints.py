"""Small random-weight checkpoints of other shapes than the presets, for worker tests."""
from __future__ import annotations

from pathlib import Path

from worker.presets import Preset, write_checkpoint


def make_checkpoint(tmp_path_factory, name: str, seed: int, config: dict,
                    init_std: float = 0.25, bias_std: float = 0.0, bos: bool = False) -> Path:
    """An HF directory (with the byte tokenizer, prepending a BOS with `bos`) built from
    `config`, seeded; biases drawn with `bias_std` (else zero)."""
    path = tmp_path_factory.mktemp(name)
    write_checkpoint(Preset(f"{name}-test", "t", init_std=init_std, seed=seed,
                            bias_std=bias_std, bos=bos,
                            config={"eos_token_id": 256, "pad_token_id": 256,
                                    "tie_word_embeddings": False,
                                    "max_position_embeddings": 1024, **config}), path)
    return path


def echo_checkpoint(tmp_path_factory, name: str = "echo", seed: int = 3) -> Path:
    """A model that mostly repeats its last token: embeddings of std 1 tied to the LM head,
    layers of small weights (which still move every logit a little, so a wrong K/V shows in
    the logprobs). Greedy, it copies; seeded at a temperature near 8 it strays now and then,
    so prompt lookup's drafts are both accepted and rejected (a random preset never repeats
    itself enough for them to be right). Another `seed` gives other layers and the same
    embeddings: a draft model that mostly agrees with this one."""
    import torch
    from safetensors.torch import load_file, save_file
    path = make_checkpoint(tmp_path_factory, name, seed, {
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 512}, init_std=0.02)
    weights = load_file(path / "model.safetensors")
    embed = torch.randn(weights["model.embed_tokens.weight"].shape,
                        generator=torch.Generator().manual_seed(0))
    weights["model.embed_tokens.weight"], weights["lm_head.weight"] = embed, embed.clone()
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path
