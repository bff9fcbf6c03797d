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
