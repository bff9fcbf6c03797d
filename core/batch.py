"""Turn one ScheduleOutput into the ForwardBatch the worker runs (no torch here).

Built column by column with comprehensions and one array conversion per field: this is
on the step loop's critical path, and per-field appends cost more than the scheduling.
"""
from __future__ import annotations

from itertools import chain
from typing import Mapping

from core.ipc.protocol import F64, I32, I64, ForwardBatch, SamplingParams

GREEDY = SamplingParams()


def _decodes(decode, sched, bs: int):
    """Columns of the decode sequences: one query token each, at position n - 1."""
    toks = [sched.tokens(r) for r in decode]
    tables = [sched.blocks.block_table(r) for r in decode]
    lens = [len(t) for t in toks]
    pos = [n - 1 for n in lens]
    return ([t[-1] for t in toks], pos, [tb[p // bs] * bs + p % bs for tb, p in zip(tables, pos)],
            lens, tables)


def _chunks(prefill, sched, bs: int):
    ids, pos, slots, ctx, tables = [], [], [], [], []
    for ch in prefill:
        toks, tb = sched.tokens(ch.id), sched.blocks.block_table(ch.id)
        end = ch.start + ch.length
        ids.extend(toks[ch.start:end])
        rng = range(ch.start, end)
        pos.extend(rng)
        slots.extend(tb[p // bs] * bs + p % bs for p in rng)
        ctx.append(end)
        tables.append(tb)
    return ids, pos, slots, ctx, tables


def _padded(tables: list) -> tuple[I32, int]:
    width = max(map(len, tables), default=0)
    return I32(chain.from_iterable(chain(t, [0] * (width - len(t))) for t in tables)), width


def build_batch(step: int, out, sched, sampling: Mapping[int, SamplingParams]) -> ForwardBatch:
    """Decodes first (one query token at position n-1), then prefill chunks in order.

    A decode and a chunk with `last` sample; the sampled token is the request's k-th
    generated token, k = len(tokens) - prompt_len (what stateless seeding keys on).
    """
    bs = sched.blocks.block_tokens()
    d_ids, d_pos, d_slots, d_ctx, d_tab = _decodes(out.decode, sched, bs)
    c_ids, c_pos, c_slots, c_ctx, c_tab = _chunks(out.prefill, sched, bs)
    n_dec = len(out.decode)
    qstart = list(range(n_dec + 1))
    for ch in out.prefill:
        qstart.append(qstart[-1] + ch.length)
    rows = list(range(n_dec)) + [n_dec + i for i, ch in enumerate(out.prefill) if ch.last]
    seq_ids = [*out.decode, *(ch.id for ch in out.prefill)]
    sample_ids = [seq_ids[r] for r in rows]
    params = [sampling.get(r, GREEDY) for r in sample_ids]
    tables, width = _padded(d_tab + c_tab)
    return ForwardBatch(
        step=step, seq_ids=I32(seq_ids), input_ids=I32(d_ids + c_ids),
        positions=I32(d_pos + c_pos), slot_mapping=I32(d_slots + c_slots),
        query_start=I32(qstart), context_lens=I32(d_ctx + c_ctx), block_tables=tables,
        table_width=width, sample_rows=I32(rows),
        temperature=F64([p.temperature for p in params]), top_p=F64([p.top_p for p in params]),
        top_k=I32([p.top_k for p in params]),
        seeds=I64([p.seed if p.seed is not None else 0 for p in params]),
        gen_index=I32([len(sched.tokens(r)) - sched.prompt_len(r) for r in sample_ids]))


def sampled_ids(out) -> list[int]:
    """The request id of each sample row of build_batch(out), in the worker's token order."""
    return [*out.decode, *(c.id for c in out.prefill if c.last)]
