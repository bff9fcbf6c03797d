"""Built-in random-weight models, written once as normal HF checkpoint directories.

Weights are drawn from a fixed seed with a large std: small random Llamas with the usual
0.02 init repeat one token and have tiny top-1/top-2 logit gaps; the engine's equality
tests need varied tokens and gaps far above CPU matmul noise (docs/design/worker.md#numerics).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from worker.preset_tokenizer import BOS_ID, EOS_ID, save_tokenizer


@dataclass(frozen=True)
class Preset:
    name: str
    version: str
    config: dict = field(hash=False)
    init_std: float
    seed: int = 0
    bias_std: float = 0.0  # > 0: biases are drawn too (else they stay at HF's zero init)
    bos: bool = False      # the tokenizer prepends a BOS token (worker/preset_tokenizer.py)


_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_act": "silu",
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "bos_token_id": None,
          "eos_token_id": EOS_ID, "pad_token_id": EOS_ID, "attention_bias": False,
          "mlp_bias": False}

PRESETS = {
    "tiny": Preset("tiny", "v2", init_std=0.25, config=dict(
        _LLAMA, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
        max_position_embeddings=2048, tie_word_embeddings=False)),
    "smol": Preset("smol", "v2", init_std=0.1, config=dict(
        _LLAMA, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
        max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True)),
}


def cache_root() -> Path:
    root = os.environ.get("TL_CACHE_DIR") or os.path.join(Path.home(), ".cache", "tl-engine")
    return Path(root) / "presets"


def preset_dir(name: str) -> Path:
    """The preset's checkpoint directory, written first if missing."""
    p = PRESETS[name]
    path = cache_root() / f"{p.name}-{p.version}"
    if not (path / "config.json").exists():
        write_dir_atomically(path, lambda tmp: write_checkpoint(p, tmp), "config.json")
    return path


def write_dir_atomically(path: Path, fill, done: str) -> None:
    """`fill(tmp)` writes the directory in a temporary sibling, renamed to `path` once whole;
    `done` names the file whose presence says a directory is whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        fill(tmp)
        try:
            os.rename(tmp, path)
        except OSError:  # another process renamed its copy first: theirs is identical
            if not (path / done).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_checkpoint(p: Preset, out: Path) -> None:
    """Build the model from `p.config` with seeded weights and save it with the tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    cfg = dict(p.config, **({"bos_token_id": BOS_ID} if p.bos else {}))
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg, initializer_range=p.init_std)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gen = torch.Generator().manual_seed(p.seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if param.dim() >= 2:  # matrices and embeddings; norm weights stay at 1
                param.copy_(torch.randn(param.shape, generator=gen) * p.init_std)
            elif p.bias_std and name.endswith(".bias"):
                param.copy_(torch.randn(param.shape, generator=gen) * p.bias_std)
    model.generation_config = GenerationConfig(eos_token_id=EOS_ID, pad_token_id=EOS_ID,
                                               bos_token_id=BOS_ID if p.bos else None)
    model.save_pretrained(out)
    save_tokenizer(config.vocab_size, str(out), bos=p.bos)
