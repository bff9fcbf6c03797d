"""Turn one ScheduleOutput into the ForwardBatch the worker runs (no torch here)."""
from __future__ import annotations

from typing import Mapping

from core.protocol import F64, I32, I64, ForwardBatch, SamplingParams

GREEDY = SamplingParams()


class _Builder:
    def __init__(self, block_size: int):
        self.bs = block_size
        self.seq_ids, self.input_ids, self.positions, self.slots = I32(), I32(), I32(), I32()
        self.query_start, self.context_lens = I32([0]), I32()
        self.tables: list = []
        self.sample_rows, self.gen_index, self.top_k = I32(), I32(), I32()
        self.temperature, self.top_p, self.seeds = F64(), F64(), I64()

    def add_seq(self, rid: int, tokens, start: int, length: int, table) -> None:
        bs = self.bs
        end = start + length
        self.seq_ids.append(rid)
        self.input_ids.extend(tokens[start:end])
        self.positions.extend(range(start, end))
        self.slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
        self.query_start.append(len(self.input_ids))
        self.context_lens.append(end)
        self.tables.append(table)

    def add_sample(self, gen_index: int, sp: SamplingParams) -> None:
        self.sample_rows.append(len(self.seq_ids) - 1)
        self.gen_index.append(gen_index)
        self.temperature.append(sp.temperature)
        self.top_p.append(sp.top_p)
        self.top_k.append(sp.top_k)
        self.seeds.append(sp.seed if sp.seed is not None else 0)

    def finish(self, step: int) -> ForwardBatch:
        width = max((len(t) for t in self.tables), default=0)
        tables = I32()
        for t in self.tables:
            tables.extend(t)
            tables.extend([0] * (width - len(t)))
        return ForwardBatch(step=step, seq_ids=self.seq_ids, input_ids=self.input_ids,
                            positions=self.positions, slot_mapping=self.slots,
                            query_start=self.query_start, context_lens=self.context_lens,
                            block_tables=tables, table_width=width,
                            sample_rows=self.sample_rows, temperature=self.temperature,
                            top_p=self.top_p, top_k=self.top_k, seeds=self.seeds,
                            gen_index=self.gen_index)


def build_batch(step: int, out, sched, sampling: Mapping[int, SamplingParams]) -> ForwardBatch:
    """Decodes first (one query token at position n-1), then prefill chunks in order.

    A decode and a chunk with `last` sample; the sampled token is the request's k-th
    generated token, k = len(tokens) - prompt_len (what stateless seeding keys on).
    """
    b = _Builder(sched.blocks.block_tokens())
    for rid in out.decode:
        toks = sched.tokens(rid)
        b.add_seq(rid, toks, len(toks) - 1, 1, sched.blocks.block_table(rid))
        b.add_sample(len(toks) - sched.prompt_len(rid), sampling.get(rid, GREEDY))
    for ch in out.prefill:
        toks = sched.tokens(ch.id)
        b.add_seq(ch.id, toks, ch.start, ch.length, sched.blocks.block_table(ch.id))
        if ch.last:
            b.add_sample(len(toks) - sched.prompt_len(ch.id), sampling.get(ch.id, GREEDY))
    return b.finish(step)


def sampled_ids(out) -> list[int]:
    """The request id of each sample row of build_batch(out), in the worker's token order."""
    return [*out.decode, *(c.id for c in out.prefill if c.last)]
