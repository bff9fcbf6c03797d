"""What one committed step produced: `StepCommit`, the one result of Engine.commit (and of
OverlapEngine.settle and launch), with the step's logprob columns (`Extras`).

Everything a caller needs after a step travels in it, so that no caller reads a step's
products off the engine's attributes afterwards (which the next step would overwrite)."""
from __future__ import annotations

from dataclasses import dataclass, field

from core.ipc.protocol import F32


@dataclass
class Extras:
    """A step's per-row logprobs (StepResult's columns), for the events of its tokens."""
    logprobs: dict[int, float]                       # seq_id -> chosen token's logprob
    top: dict[int, list[list]]                       # seq_id -> [[id, logprob], ...]
    # a decode verified with drafts: its later rows' (logprob, top), in row order
    later: dict[int, list[tuple]] = field(default_factory=dict)

    def at(self, seq_id: int, nth: int) -> tuple[float, list | None]:
        """The logprob and alternatives of seq_id's nth token of the step."""
        if nth == 0:
            return self.logprobs.get(seq_id, float("nan")), self.top.get(seq_id)
        rows = self.later.get(seq_id, ())
        return rows[nth - 1] if nth <= len(rows) else (float("nan"), None)


def extras_of(ids: list[int], result, sampling: dict) -> Extras | None:
    """StepResult's logprob columns (see core/ipc/protocol.py) keyed by request id: the
    rows that asked (a number, not NaN) each have their request's `logprobs` alternatives;
    a request's later rows (drafts verified) go to `later`. None: no row asked."""
    if result is None or not len(result.logprobs):
        return None
    lps, top, later, at = {}, {}, {}, 0
    tids, tlps = result.top_ids, result.top_logprobs
    for seq_id, lp in zip(ids, result.logprobs):
        if lp != lp:
            continue
        k = getattr(sampling.get(seq_id), "logprobs", 0) or 0
        if at + k > len(tids):
            raise ValueError("the worker returned fewer top logprobs than the batch asked")
        alts = [[tids[i], tlps[i]] for i in range(at, at + k)]
        if seq_id in lps:
            later.setdefault(seq_id, []).append((lp, alts))
        else:
            lps[seq_id], top[seq_id] = lp, alts
        at += k
    return Extras(lps, top, later)


def embeddings_of(pooled: list[int], result, logged=()) -> list[list]:
    """StepResult.pooled cut into one vector per pooled request ([[seq_id, F32], ...], in
    the batch's pool_rows order); ValueError when the worker's floats do not divide.
    Replay without a model (result None): the requests of `logged` (those the log holds
    a vector for), each with None."""
    if not pooled:
        return []
    if result is None:
        return [[seq_id, None] for seq_id in pooled if seq_id in logged]
    flat = getattr(result, "pooled", ())
    dims = len(flat) // len(pooled)
    if dims == 0 or dims * len(pooled) != len(flat):
        raise ValueError(f"the worker returned {len(flat)} pooled floats for"
                         f" {len(pooled)} pooled rows")
    raw = memoryview(flat.tobytes())
    step = dims * 4
    return [[seq_id, F32(raw[i * step:(i + 1) * step])] for i, seq_id in enumerate(pooled)]


@dataclass
class StepCommit:
    """One committed step's products."""
    events: list = field(default_factory=list)     # the scheduler's TokenEvent / Finished
    finished: dict[int, dict] = field(default_factory=dict)   # seq_id -> its metrics
    extras: Extras | None = None                   # logprobs of the rows that asked
    prompt_logprobs: list = field(default_factory=list)   # [[seq_id, first, entries], ...]
    accepted: list = field(default_factory=list)   # [[seq_id, drafts kept], ...]
    embeddings: list = field(default_factory=list)  # [[seq_id, F32 vector], ...]

    def then(self, later: StepCommit) -> StepCommit:
        """This step's products followed by a later one's (an overlapped step settles N
        and launches N+1 in one call; a launch that commits at once has no rows, so it
        brings events and finishes but no logprobs)."""
        return StepCommit(self.events + later.events, {**self.finished, **later.finished},
                          self.extras if self.extras is not None else later.extras,
                          self.prompt_logprobs + later.prompt_logprobs,
                          self.accepted + later.accepted, self.embeddings + later.embeddings)
