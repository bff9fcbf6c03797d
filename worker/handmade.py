"""ForwardBatches made by hand, without a scheduler, for worker tests and benchmarks: the
layout is core.batch.layout's, each Part a sequence in the given order."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from core.batch import GREEDY, layout
from core.ipc.protocol import ForwardBatch, SamplingParams


@dataclass
class Part:
    """Query positions [start, start + length) of one sequence whose tokens are `tokens`."""
    tokens: Sequence[int]
    start: int
    length: int
    table: Sequence[int]
    sample: bool = True
    params: SamplingParams = field(default_factory=SamplingParams)
    gen_index: int = 0
    banned: Sequence[int] = ()    # ids the sampled token must not be (min_tokens)


def make_batch(parts: Sequence[Part], block_size: int, step: int = 0) -> ForwardBatch:
    """Sequence i is parts[i] (seq_ids 0, 1, ...); a part with `sample` is sampled."""
    rows = [i for i, p in enumerate(parts) if p.sample]
    return layout(step, block_size, range(len(parts)), [p.tokens for p in parts],
                  [p.table for p in parts], 0, [(p.start, p.start + p.length) for p in parts],
                  rows, [parts[i].params for i in rows], [parts[i].gen_index for i in rows],
                  [parts[i].banned for i in rows])


def blocks_needed(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def generate_alone(runner, prompt: Sequence[int], max_tokens: int, table: Sequence[int],
                   chunks: Sequence[int] | None = None, params: SamplingParams = GREEDY,
                   collect_logits: bool = False):
    """Prefill `prompt` (in chunks of the given lengths, default whole) then decode until
    `max_tokens` tokens are generated. Returns the tokens, and the logits of each sampled
    step when collect_logits. `table` must cover len(prompt) + max_tokens - 1 positions."""
    bs = runner.info.block_size
    tokens, out, logits = list(prompt), [], []
    chunks = list(chunks or [len(prompt)])
    assert sum(chunks) == len(prompt)
    start = 0
    for n in chunks:
        last = start + n == len(prompt)
        b = make_batch([Part(tokens, start, n, table, sample=last, params=params)], bs)
        start += n
        if last:
            _sample(runner, b, tokens, out, logits, collect_logits)
        else:
            runner.execute(b)
    while len(out) < max_tokens:
        p = Part(tokens, len(tokens) - 1, 1, table, params=params, gen_index=len(out))
        _sample(runner, make_batch([p], bs), tokens, out, logits, collect_logits)
    return (out, logits) if collect_logits else out


def _sample(runner, batch, tokens, out, logits, collect):
    if collect:
        logits.append(runner.logits(batch)[0].float().cpu())
    (tok,) = runner.execute(batch)
    tokens.append(tok)
    out.append(tok)
