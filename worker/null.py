"""NullRunner: no model. Each sample row's token is a hash of its last input token and that
token's position, so outputs are deterministic, cheap, and never EOS."""
from __future__ import annotations

from core.ipc.protocol import I32, ForwardBatch, ModelInfo
from worker.presets import PRESETS
from worker.preset_tokenizer import EOS_ID

_MASK64 = (1 << 64) - 1


def null_token(token: int, position: int, vocab_size: int, eos_id: int = EOS_ID) -> int:
    z = ((token & 0xFFFFFFFF) << 32 | (position & 0xFFFFFFFF)) * 0x9E3779B97F4A7C15 & _MASK64
    z = (z ^ (z >> 29)) * 0xBF58476D1CE4E5B9 & _MASK64
    t = (z ^ (z >> 32)) % (vocab_size - 1)   # one id fewer than the vocabulary ...
    return t + 1 if t >= eos_id else t        # ... so EOS can be skipped over


class NullRunner:
    def __init__(self, num_blocks: int = 256, block_size: int = 16, max_model_len: int = 2048,
                 tokenizer: str = ""):
        vocab = PRESETS["tiny"].config["vocab_size"]
        self.info = ModelInfo(model="null", num_blocks=num_blocks, block_size=block_size,
                              max_model_len=max_model_len, vocab_size=vocab, eos_ids=[EOS_ID],
                              dtype="float32", device="cpu", tokenizer=tokenizer)

    def execute(self, batch: ForwardBatch) -> I32:
        qs, ids, pos = batch.query_start, batch.input_ids, batch.positions
        vocab = self.info.vocab_size
        return I32(null_token(ids[qs[r + 1] - 1], pos[qs[r + 1] - 1], vocab)
                   for r in batch.sample_rows)

    def logits(self, batch: ForwardBatch):
        """One-hot rows (for tests that treat every runner alike)."""
        import torch

        out = torch.full((len(batch.sample_rows), self.info.vocab_size), float("-inf"))
        for j, t in enumerate(self.execute(batch)):
            out[j, t] = 0.0
        return out
