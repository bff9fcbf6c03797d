"""Speculative decoding's rules that are not the proposer's (docs/design/scheduler.md, "Speculative
decoding"): how many drafts a request gets, when a step speculates at all, and which of a
verified sequence's sampled rows are its tokens. Pure Python; the scheduler and the engine
call it, replay re-runs it."""
from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import Sequence, TypeVar

from core.ngram import propose

Row = TypeVar("Row")
# a draft the worker's draft model has yet to propose (it is never a token: never accepted)
PENDING = -1
_FIRST, _SECOND, _THIRD = itemgetter(0), itemgetter(1), itemgetter(2)


@dataclass
class Drafting:
    """num_draft: the most drafts one request gets in a step (K); max_batch: a step
    speculates only while at most this many requests run (past it, the k extra rows each
    cost more than the steps they save); by_model: the worker's draft model proposes the
    drafts, so the schedule holds PENDING placeholders until its result fills them."""
    num_draft: int
    max_batch: int
    by_model: bool = False

    def step_speculates(self, running: int) -> bool:
        return self.num_draft > 0 and running <= self.max_batch

    def drafts(self, tokens: Sequence[int], k: int, room: int) -> list[int]:
        """At most min(k, room) drafts for a request whose tokens so far are `tokens`."""
        if self.by_model:
            return [PENDING] * min(k, room)
        return propose(tokens, min(k, room))

    @staticmethod
    def model_seen(n: int, taken: int, drafted: int) -> int:
        """Positions the draft model holds KV for after a step that verified `drafted`
        drafts of a request with n tokens before it and kept `taken` rows: it fed the
        request's last token and its first drafted-1 drafts, of which the accepted ones
        (taken-1) stay."""
        return n + min(taken - 1, drafted - 1)

    def adapt(self, k: int, drafted: int, accepted: int) -> int:
        """The next step's draft count: halved on a miss (at least 1), doubled when every
        draft was accepted (at most num_draft)."""
        if drafted == 0:
            return k
        if accepted < drafted:
            return max(1, k // 2)
        return min(self.num_draft, 2 * k)


def verified(drafts: Sequence[int], rows: Sequence[Row], token_of, stop_of) -> list[Row]:
    """The tokens of a sequence verified with `drafts`: rows[i] is the target's sample at
    the position of drafts[i] (given drafts[:i] before it), rows[len(drafts)] the one after
    the last draft. Row i counts only while every draft before it equals the row that
    sampled its position; a stop token ends the run. So the result is 1..len(drafts)+1
    rows, and every row kept is the token plain decoding would have sampled there."""
    out = [rows[0]]
    for i in range(1, len(rows)):
        prev = rows[i - 1]
        if stop_of(prev) or token_of(prev) != drafts[i - 1]:
            break
        out.append(rows[i])
    return out



def kept_rows(drafts: dict, rows: Sequence[Row], id_of, token_of,
              stop_of) -> tuple[list[Row], list[list[int]]]:
    """A step's rows in the worker's order (a decode with k drafts has k+1 consecutive
    rows) -> the rows its requests keep, and [[id, drafts kept], ...] in decode order.
    The engine applies it to the worker's tokens, replay to a log's outputs."""
    kept: list[Row] = []
    accepted: list[list[int]] = []
    i = 0
    while i < len(rows):
        seq_id = id_of(rows[i])
        d = drafts.get(seq_id)
        if d is None:
            kept.append(rows[i])
            i += 1
            continue
        run = verified(d, rows[i:i + len(d) + 1], token_of, stop_of)
        kept += run
        accepted.append([seq_id, len(run) - 1])
        i += len(d) + 1
    return kept, accepted


def kept_outputs(schedule: dict, outputs: list) -> list:
    """A logged step's outputs ([id, token, stop] rows, core/logrecords.py) its requests
    kept: all of them unless the schedule has "drafts"."""
    if "drafts" not in schedule:
        return outputs
    return kept_rows(dict(schedule["drafts"]), outputs, _FIRST, _SECOND, _THIRD)[0]
