"""Prompt logprobs on the core's side (docs/design/worker.md, "Prompt logprobs"): which prompt
positions each asking request still lacks, the ForwardBatch columns that ask the worker
for them, and the worker's answer as deliveries, each position delivered once.

Position p (1 <= p < prompt_len) is scored by the logits of query position p - 1, so a
prefill chunk of positions [start, end) scores p in [start + 1, end], capped at the last
prompt position (the logits after it sample the first token). A request preempted and
recomputed, or planned again before its last step settled (overlapped scheduling), may be
asked again for positions it has: `deliver` drops those, so a client sees each once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from core.ipc.protocol import I32, ForwardBatch

Delivery = list   # [seq_id, first position, [[logprob, rank, [[id, logprob], ...]], ...]]
# Numbers per StepEvents of prompt logprobs (~0.2 MB of msgpack): under the frontend's 1 MiB
# limit on a core's frame, which a step of ~3,800 scored positions with 20 alternatives
# would pass whole (--max-batch-tokens 4096 or more).
PART_VALUES = 1 << 15


@dataclass(frozen=True, slots=True)
class Span:
    """Prompt positions first .. first + count - 1 of seq_id, scored in one step."""
    seq_id: int
    first: int
    count: int
    top: int       # alternatives per position
    seq: int       # its sequence's index in the batch
    start: int     # its chunk's first position


def parts(deliveries: Sequence[Delivery], budget: int = PART_VALUES) -> list[list[Delivery]]:
    """`deliveries` cut by positions into lists of at most ~`budget` numbers each, in order
    (a request's positions may span parts; the frontend keeps them by position)."""
    out: list[list[Delivery]] = []
    cur: list[Delivery] = []
    size = 0
    for key, first, entries in deliveries:
        per = 2 + 2 * (len(entries[0][2]) if entries else 0)
        step = max(1, budget // per)
        for a in range(0, len(entries), step):
            piece = entries[a:a + step]
            if cur and size + len(piece) * per > budget:
                out.append(cur)
                cur, size = [], 0
            cur.append([key, first + a, piece])
            size += len(piece) * per
    if cur:
        out.append(cur)
    return out


class PromptLogprobs:
    def __init__(self):
        self._want: dict[int, list[int]] = {}   # seq_id -> [top, prompt_len, next position]

    def add(self, seq_id: int, top: int, prompt_len: int) -> None:
        if prompt_len > 1:   # position 0 has no logprob: nothing to score
            self._want[seq_id] = [top, prompt_len, 1]

    def drop(self, seq_id: int) -> None:
        self._want.pop(seq_id, None)

    def spans(self, out, num_decode: int) -> list[Span]:
        """The positions a schedule's prefill chunks can score that are not delivered yet."""
        want = self._want
        if not want:
            return []
        spans = []
        for i, ch in enumerate(out.prefill):
            w = want.get(ch.id)
            if w is None:
                continue
            top, n, nxt = w
            lo, hi = max(ch.start + 1, nxt), min(ch.start + ch.length, n - 1)
            if hi >= lo:
                spans.append(Span(ch.id, lo, hi - lo + 1, top, num_decode + i, ch.start))
        return spans

    @staticmethod
    def fill(batch: ForwardBatch, spans: Sequence[Span],
             tokens: Callable[[int], Sequence[int]]) -> None:
        """The batch's prompt columns for `spans` (laid out by core/batch.py)."""
        rows, targets, tops = [], [], []
        qs = batch.query_start
        for s in spans:
            q0 = qs[s.seq] + s.first - 1 - s.start
            rows.extend(range(q0, q0 + s.count))
            targets.extend(tokens(s.seq_id)[s.first:s.first + s.count])
            tops.extend([s.top] * s.count)
        batch.prompt_rows, batch.prompt_targets, batch.prompt_top = (
            I32(rows), I32(targets), I32(tops))

    def deliver(self, spans: Sequence[Span], result) -> list[Delivery]:
        """The worker's StepResult for a batch filled from `spans`, as what each request
        gets now: positions it already has are dropped; a request with all of its
        positions is asked nothing more."""
        lps = result.prompt_logprobs
        ranks, tids, tlps = result.prompt_ranks, result.prompt_top_ids, result.prompt_top_logprobs
        rows = sum(s.count for s in spans)
        alts = sum(s.count * s.top for s in spans)
        if len(lps) != rows or len(ranks) != rows or len(tids) != alts or len(tlps) != alts:
            raise ValueError(f"the worker returned prompt logprobs for {len(lps)} positions,"
                             f" the batch asked for {rows}")
        out, row, at = [], 0, 0
        for s in spans:
            w = self._want.get(s.seq_id)
            skip = 0 if w is None else w[2] - s.first
            if w is not None and 0 <= skip < s.count:   # never a hole, never twice
                entries = []
                for m in range(skip, s.count):
                    a = at + m * s.top
                    entries.append([lps[row + m], ranks[row + m],
                                    [[tids[i], tlps[i]] for i in range(a, a + s.top)]])
                out.append([s.seq_id, s.first + skip, entries])
                w[2] = s.first + s.count
                if w[2] >= w[1]:
                    del self._want[s.seq_id]
            row += s.count
            at += s.count * s.top
        return out
