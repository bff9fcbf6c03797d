"""ForwardBatches made by hand, without a scheduler, for worker tests and benchmarks.

The layout follows core.batch: one-token decodes first, then prefill chunks;
slot = block_id * block_size + offset; tables padded with 0 to the widest.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from core.ipc.protocol import F64, I32, I64, ForwardBatch, SamplingParams

GREEDY = SamplingParams()


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


def make_batch(parts: Sequence[Part], block_size: int, step: int = 0) -> ForwardBatch:
    ids, pos, slots, qs, ctx, rows = I32(), I32(), I32(), I32([0]), I32(), I32()
    temp, top_p, top_k, seeds, gen = F64(), F64(), I32(), I64(), I32()
    width = max((len(p.table) for p in parts), default=0)
    tables = I32()
    for i, p in enumerate(parts):
        end = p.start + p.length
        ids.extend(p.tokens[p.start:end])
        pos.extend(range(p.start, end))
        slots.extend(p.table[q // block_size] * block_size + q % block_size
                     for q in range(p.start, end))
        qs.append(len(ids))
        ctx.append(end)
        tables.extend(list(p.table) + [0] * (width - len(p.table)))
        if p.sample:
            rows.append(i)
            temp.append(p.params.temperature)
            top_p.append(p.params.top_p)
            top_k.append(p.params.top_k)
            seeds.append(p.params.seed or 0)
            gen.append(p.gen_index)
    return ForwardBatch(step=step, seq_ids=I32(range(len(parts))), input_ids=ids, positions=pos,
                        slot_mapping=slots, query_start=qs, context_lens=ctx,
                        block_tables=tables, table_width=width, sample_rows=rows,
                        temperature=temp, top_p=top_p, top_k=top_k, seeds=seeds,
                        gen_index=gen)


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
