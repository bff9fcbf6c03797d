"""A step's scheduler events as the StepEvents messages the core pushes to the frontend.

One message per step, unless speculative decoding gave a request several tokens
(docs/design/scheduler.md, "Speculative decoding"): then message i carries each request's i-th token
of the step, so the frontend still sees one token per request per message, and a stop
string completed by one of them ends the request at that token (its StopRequest counts
the tokens it has seen), never at the step's last. Finishes ride on the last message;
the step's embeddings go before them, in messages of bounded size (`embedding_parts`).
"""
from __future__ import annotations

from core.ipc.protocol import F32, F64, I32, StepEvents
from core.sched_types import Finished, TokenEvent


def step_messages(events: list, fid_of: dict, extras, figures: dict
                  ) -> tuple[list[StepEvents], list[int]]:
    """The messages for `events` (requests without a fid in `fid_of` left out), and the ids
    of the requests that finished (the caller forgets their fids). `extras`: the step's
    logprobs (core/engine.py Extras) or None; `figures`: the finished requests' metrics."""
    rounds: list[tuple[list, list, list, list]] = [([], [], [], [])]   # fids, tokens, lps, tops
    finished, ended = [], []
    nth: dict[int, int] = {}   # a request's tokens so far this step
    for ev in events:
        fid = fid_of.get(ev.id)
        if fid is None:
            continue
        if type(ev) is TokenEvent:
            k = nth[ev.id] = nth.get(ev.id, -1) + 1
            if k == len(rounds):
                rounds.append(([], [], [], []))
            fids, tokens, lps, tops = rounds[k]
            fids.append(fid)
            tokens.append(ev.token)
            if extras is not None:
                lp, top = extras.at(ev.id, k)
                lps.append(lp)
                tops.append(top)
        elif type(ev) is Finished:
            finished.append([fid, ev.reason.value, figures.get(ev.id)])
            ended.append(ev.id)
    last = len(rounds) - 1
    out = [StepEvents(fids=I32(fids), tokens=I32(tokens),
                      finished=finished if i == last else [], logprobs=F64(lps),
                      top_logprobs=tops)
           for i, (fids, tokens, lps, tops) in enumerate(rounds)
           if fids or (i == last and finished)]
    return out, ended


# Bytes of vectors per StepEvents: under the frontend's 1 MiB limit on a core's frame with
# room to spare (a step of 256 vectors of a 4096-wide model is 4 MiB: four messages).
EMBED_PART_BYTES = 1 << 18


def embedding_parts(embeddings: list, fid_of: dict,
                    budget: int = EMBED_PART_BYTES) -> list[tuple[I32, F32]]:
    """The step's vectors ([[seq_id, F32], ...]) as (embed_fids, embeddings) columns of at
    most ~`budget` bytes each (at least one vector each); requests without a fid left out."""
    out: list[tuple[I32, F32]] = []
    fids, floats = I32(), F32()
    for seq_id, vector in embeddings:
        fid = fid_of.get(seq_id)
        if fid is None or vector is None:
            continue
        if len(fids) and (len(floats) + len(vector)) * 4 > budget:
            out.append((fids, floats))
            fids, floats = I32(), F32()
        fids.append(fid)
        floats.extend(vector)
    if len(fids):
        out.append((fids, floats))
    return out
