"""The draft model's side of speculative decoding (docs/design/scheduler.md, "Speculative
decoding"): a second model with the target's vocabulary proposes the drafts of a verify
batch (ForwardBatch.draft_seqs) before the target's forward checks them.

Its KV pool has the target's geometry and is addressed through the target's block tables:
the draft's K/V of position p lie in the same slot of its own pool as the target's do of
theirs. So it needs no tables of its own, rejected drafts are rolled back with the
target's (the core cuts the table), and a freed block's stale draft KV is never read: the
core tracks how far the draft model has seen each request (Scheduler.draft_seen), resets
it with the blocks, and sends the rest as draft_context.

Each draft is sampled as the target will sample the row that checks it (the same seed,
generated-token index and sampling parameters), so a draft model that agrees with the
target agrees with its sampled tokens too, not only its greedy ones. Which drafts are kept
is the target's call alone: a wrong draft costs time, never a token."""
from __future__ import annotations

from dataclasses import dataclass

from core.ipc.protocol import I32, ForwardBatch, SamplingParams
from worker.handmade import Part, make_batch


@dataclass
class _Seq:
    tokens: list[int]      # by position; those the draft has seen are 0s it never reads
    table: list[int]
    rows: list[int]        # its sample rows in the batch, in query order
    k: int
    seen: int              # the first position the first draft forward queries
    drafts: list[int]


def _seqs(batch: ForwardBatch) -> list[_Seq]:
    qs, ids, pos = batch.query_start, batch.input_ids, batch.positions
    ctx, cst, w = batch.draft_context, batch.draft_context_start, batch.table_width
    tables = list(batch.block_tables)
    rows: dict[int, list[int]] = {s: [] for s in batch.draft_seqs}
    for j, s in enumerate(batch.sample_rows):
        if s in rows:
            rows[s].append(j)
    out = []
    for i, s in enumerate(batch.draft_seqs):
        context = list(ctx[cst[i]:cst[i + 1]])
        first = qs[s]
        seen = pos[first] - len(context)
        if seen < 0:
            raise ValueError(f"draft sequence {s}: more draft context than positions")
        k = qs[s + 1] - first - 1
        if len(rows[s]) != k + 1:
            raise ValueError(f"draft sequence {s}: {len(rows[s])} sample rows for {k} drafts")
        out.append(_Seq([0] * seen + context + [ids[first]], tables[s * w:(s + 1) * w],
                        rows[s], k, seen, []))
    return out


def _params(batch: ForwardBatch, j: int) -> tuple[SamplingParams, int]:
    """Sample row j's parameters and generated-token index."""
    p = SamplingParams(temperature=batch.temperature[j], top_p=batch.top_p[j],
                       top_k=batch.top_k[j], seed=batch.seeds[j],
                       min_p=batch.min_p[j] if len(batch.min_p) else 0.0)
    return p, batch.gen_index[j]


class Drafter:
    """Proposes drafts with `runner` (a ModelRunner over the draft model and its pool)."""

    def __init__(self, runner):
        self.runner = runner

    def fill(self, batch: ForwardBatch) -> I32:
        """Drafts for batch.draft_seqs, written into batch.input_ids in place of the
        placeholders; returned flat, k per sequence in draft_seqs order."""
        seqs = _seqs(batch)
        bs = self.runner.info.block_size
        for i in range(max((q.k for q in seqs), default=0)):
            live = [q for q in seqs if q.k > i]
            parts = []
            for q in live:
                start = len(q.tokens) - 1 if i else q.seen
                params, gen = _params(batch, q.rows[i])
                parts.append(Part(q.tokens, start, len(q.tokens) - start, q.table,
                                  params=params, gen_index=gen))
            for q, t in zip(live, self.runner.execute(make_batch(parts, bs, batch.step))):
                q.drafts.append(t)
                q.tokens.append(t)
        ids = list(batch.input_ids)
        for s, q in zip(batch.draft_seqs, seqs):
            ids[batch.query_start[s] + 1:batch.query_start[s] + 1 + q.k] = q.drafts
        batch.input_ids = I32(ids)
        return I32([t for q in seqs for t in q.drafts])

