"""NullRunner: no model. Each sample row's token is a hash of its last input token and that
token's position (or the next id that is not banned), so outputs are deterministic, cheap, and
never EOS. A pooled row's vector (an embedding) is NULL_HIDDEN hashes of the same two,
L2-normalised."""
from __future__ import annotations

import math
from itertools import islice

from core.ipc.protocol import F32, F64, I32, ForwardBatch, ModelInfo, StepResult
from worker.presets import PRESETS
from worker.preset_tokenizer import EOS_ID

_MASK64 = (1 << 64) - 1
NULL_HIDDEN = 8   # the null model's hidden size: an embedding's length


def null_token(token: int, position: int, vocab_size: int, eos_id: int = EOS_ID) -> int:
    z = ((token & 0xFFFFFFFF) << 32 | (position & 0xFFFFFFFF)) * 0x9E3779B97F4A7C15 & _MASK64
    z = (z ^ (z >> 29)) * 0xBF58476D1CE4E5B9 & _MASK64
    t = (z ^ (z >> 32)) % (vocab_size - 1)   # one id fewer than the vocabulary ...
    return t + 1 if t >= eos_id else t        # ... so EOS can be skipped over


def null_vector(token: int, position: int) -> list[float]:
    """The null model's embedding of a last token at a position: unit length."""
    v = [null_token(token, position * NULL_HIDDEN + k, 1 << 16) / (1 << 15) - 1.0
         for k in range(NULL_HIDDEN)]
    norm = math.sqrt(sum(x * x for x in v)) or 1.0
    return [x / norm for x in v]


def unbanned(token: int, banned: set[int], vocab_size: int, eos_id: int = EOS_ID) -> int:
    """The first id from `token` on (cyclically) that is neither banned nor EOS."""
    while token in banned or token == eos_id:
        token = (token + 1) % vocab_size
    return token


class NullRunner:
    def __init__(self, num_blocks: int = 256, block_size: int = 16, max_model_len: int = 2048,
                 tokenizer: str = ""):
        vocab = PRESETS["tiny"].config["vocab_size"]
        self.info = ModelInfo(model="null", num_blocks=num_blocks, block_size=block_size,
                              max_model_len=max_model_len, vocab_size=vocab, eos_ids=[EOS_ID],
                              dtype="float32", device="cpu", tokenizer=tokenizer,
                              hidden_size=NULL_HIDDEN)

    def run(self, batch: ForwardBatch) -> StepResult:
        """execute()'s tokens. The model is deterministic: an asking row's chosen token has
        logprob 0.0 and its k alternatives are the chosen token at 0.0, then ids 0, 1, ...
        (skipping it) at -inf, the real runner's order for such logits."""
        tokens = self.execute(batch)
        out = self._prompt(batch)
        out.tokens = tokens
        out.pooled = F32(x for q in batch.pool_rows
                         for x in null_vector(batch.input_ids[q], batch.positions[q]))
        if len(batch.logprobs) == 0:
            return out
        top = [self._top(t, k) for t, k in zip(tokens, batch.logprobs)]
        out.logprobs = F64(0.0 if k >= 0 else math.nan for k in batch.logprobs)
        out.top_ids = I32(i for row in top for i, _ in row)
        out.top_logprobs = F64(lp for row in top for _, lp in row)
        return out

    def _prompt(self, batch: ForwardBatch) -> StepResult:
        """Prompt logprobs of the same one-hot model: 0.0 (rank 1) for a prompt token the
        model would have chosen there, else -inf (rank 2)."""
        ids, pos, vocab = batch.input_ids, batch.positions, self.info.vocab_size
        chosen = [null_token(ids[q], pos[q], vocab) for q in batch.prompt_rows]
        hit = [c == t for c, t in zip(chosen, batch.prompt_targets)]
        top = [self._top(c, k) for c, k in zip(chosen, batch.prompt_top)]
        return StepResult(step=batch.step, tokens=I32(),
                          prompt_logprobs=F64(0.0 if h else -math.inf for h in hit),
                          prompt_ranks=I32(1 if h else 2 for h in hit),
                          prompt_top_ids=I32(i for row in top for i, _ in row),
                          prompt_top_logprobs=F64(lp for row in top for _, lp in row))

    def _top(self, token: int, k: int) -> list[tuple[int, float]]:
        others = islice((i for i in range(self.info.vocab_size) if i != token), max(k - 1, 0))
        return [(token, 0.0), *((i, -math.inf) for i in others)][:max(k, 0)]

    def execute(self, batch: ForwardBatch) -> I32:
        qs, ids, pos = batch.query_start, batch.input_ids, batch.positions
        vocab = self.info.vocab_size
        back = batch.sample_offset or [0] * len(batch.sample_rows)
        out = I32(null_token(ids[qs[r + 1] - 1 - b], pos[qs[r + 1] - 1 - b], vocab)
                  for r, b in zip(batch.sample_rows, back))
        starts = batch.banned_start
        for j in range(len(starts) - 1):
            out[j] = unbanned(out[j], set(batch.banned[starts[j]:starts[j + 1]]), vocab)
        return out

    def logits(self, batch: ForwardBatch):
        """One-hot rows (for tests that treat every runner alike)."""
        import torch

        out = torch.full((len(batch.sample_rows), self.info.vocab_size), float("-inf"))
        for j, t in enumerate(self.execute(batch)):
            out[j, t] = 0.0
        return out
