"""The ForwardBatch layout (no torch here): `layout` lays out any sequences; `build_batch`
feeds it one ScheduleOutput, worker/handmade.py hand-made parts.

Built column by column with comprehensions and one array conversion per field: this is
on the step loop's critical path, and per-field appends cost more than the scheduling.
"""
from __future__ import annotations

from itertools import chain, islice, repeat
from typing import Mapping, Sequence

from core.ipc.protocol import F64, I32, I64, ForwardBatch, SamplingParams

GREEDY = SamplingParams()


def slots(tables: Sequence[Sequence[int]], positions: Sequence[int], block_size: int) -> list[int]:
    """The KV slot of each position p, tables[i] being the block table of positions[i]'s
    sequence: T[p // block_size] * block_size + p % block_size (docs/DESIGN.md, "Paged KV
    layout"; worker/step.py's `seq_slots` is the same formula on tensors)."""
    bs = block_size
    return [t[p // bs] * bs + p % bs for t, p in zip(tables, positions)]


def layout(step: int, block_size: int, seq_ids: Sequence[int], tokens: Sequence[Sequence[int]],
           tables: Sequence[Sequence[int]], num_decode: int, spans: Sequence[tuple[int, int]],
           rows: Sequence[int], params: Sequence[SamplingParams],
           gen_index: Sequence[int]) -> ForwardBatch:
    """Sequence i has tokens[i] and block table tables[i]. The first num_decode query one
    token, their last (position len - 1); each later one queries positions [start, end) of
    spans[i - num_decode] and has `end` tokens in cache afterwards. Sample row j is
    sequence rows[j], sampled with params[j] as generated token number gen_index[j].
    Tables are padded with 0 to the widest."""
    dec = tokens[:num_decode]
    ctx = [len(t) for t in dec]
    ids = [t[-1] for t in dec]
    pos = [n - 1 for n in ctx]
    tok_tables = list(tables[:num_decode])   # each query token's block table
    qstart = list(range(num_decode + 1))
    q = num_decode
    for toks, tb, (start, end) in zip(islice(tokens, num_decode, None),
                                      islice(tables, num_decode, None), spans):
        ids.extend(toks[start:end])
        pos.extend(range(start, end))
        tok_tables.extend(repeat(tb, end - start))
        ctx.append(end)
        q += end - start
        qstart.append(q)
    width = max(map(len, tables), default=0)
    return ForwardBatch(
        step=step, seq_ids=I32(seq_ids), input_ids=I32(ids), positions=I32(pos),
        slot_mapping=I32(slots(tok_tables, pos, block_size)), query_start=I32(qstart),
        context_lens=I32(ctx),
        block_tables=I32(chain.from_iterable(chain(t, [0] * (width - len(t))) for t in tables)),
        table_width=width, sample_rows=I32(rows),
        temperature=F64([p.temperature for p in params]), top_p=F64([p.top_p for p in params]),
        top_k=I32([p.top_k for p in params]),
        seeds=I64([p.seed if p.seed is not None else 0 for p in params]),
        gen_index=I32(gen_index))


def build_batch(step: int, out, sched, sampling: Mapping[int, SamplingParams]) -> ForwardBatch:
    """Decodes first (one query token at position n-1), then prefill chunks in order.

    A decode and a chunk with `last` sample; the sampled token is the request's k-th
    generated token, k = len(tokens) - prompt_len (what stateless seeding keys on).
    """
    n_dec = len(out.decode)
    seq_ids = [*out.decode, *(ch.id for ch in out.prefill)]
    tokens, table = sched.tokens, sched.blocks.block_table
    toks = [tokens(r) for r in seq_ids]
    rows = list(range(n_dec)) + [n_dec + i for i, ch in enumerate(out.prefill) if ch.last]
    sample_ids = [seq_ids[r] for r in rows]
    prompt_len = sched.prompt_len
    return layout(step, sched.blocks.block_tokens(), seq_ids, toks, [table(r) for r in seq_ids],
                n_dec, [(ch.start, ch.start + ch.length) for ch in out.prefill], rows,
                [sampling.get(r, GREEDY) for r in sample_ids],
                [len(toks[r]) - prompt_len(i) for r, i in zip(rows, sample_ids)])


def sampled_ids(out) -> list[int]:
    """The request id of each sample row of build_batch(out), in the worker's token order."""
    return [*out.decode, *(c.id for c in out.prefill if c.last)]
