"""Regroup one StepEvents message per request: the frontend answers each request once a step."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from core.ipc.protocol import F32, ProtocolError, StepEvents
from core.sched_types import FINISH_REASONS



@dataclass
class RequestEvents:
    """One request's part of a step: its tokens (with their logprobs when it asked) and,
    when it finished, the reason and the core's figures."""
    fid: int
    tokens: list[int] = field(default_factory=list)
    # empty tuples unless filled (a list then): most steps' events have neither, and three
    # lists made for each request each step were a third of grouping them
    logprobs: Sequence[float] = ()
    top: Sequence[list] = ()
    reason: str | None = None
    figures: dict | None = None
    prompt: Sequence[list] = ()   # [[first position, entries], ...]
    embedding: object = None      # an embed request's vector (F32), the step it is pooled


def group_events(ev: StepEvents) -> list[RequestEvents]:
    """Per request, in order of first appearance. Raises ProtocolError for a message that
    does not hang together, so the caller drops all of it rather than apply half."""
    n = len(ev.tokens)
    if len(ev.fids) != n:
        raise ProtocolError(400, f"events: {len(ev.fids)} fids but {n} tokens")
    if len(ev.logprobs) not in (0, n) or len(ev.top_logprobs) not in (0, n):
        raise ProtocolError(400, f"events: logprobs for {len(ev.logprobs)} of {n} tokens")
    out: dict[int, RequestEvents] = {}
    if len(ev.logprobs):
        _with_logprobs(out, ev)
    else:
        get = out.get
        for fid, tok in zip(ev.fids, ev.tokens):
            r = get(fid)
            if r is None:
                out[fid] = RequestEvents(fid, [tok])
            else:
                r.tokens.append(tok)
    for item in ev.prompt_logprobs:
        fid, first, entries = _prompt(item)
        r = _of(out, fid)
        r.prompt = [*r.prompt, [first, entries]]
    _embeddings(out, ev)
    for item in ev.finished:
        fid, reason, figures = _finished(item)
        r = _of(out, fid)
        r.reason, r.figures = reason, figures
    return list(out.values())


def _of(out: dict[int, RequestEvents], fid: int) -> RequestEvents:
    r = out.get(fid)
    if r is None:
        r = out[fid] = RequestEvents(fid)
    return r


def _with_logprobs(out: dict[int, RequestEvents], ev: StepEvents) -> None:
    tops = ev.top_logprobs if len(ev.top_logprobs) else [None] * len(ev.tokens)
    for fid, tok, lp, top in zip(ev.fids, ev.tokens, ev.logprobs, tops):
        r = _of(out, fid)
        r.tokens.append(tok)
        if lp == lp:   # NaN: not asked
            if isinstance(r.logprobs, tuple):
                r.logprobs, r.top = [], []
            r.logprobs.append(lp)
            r.top.append(top or [])


def _embeddings(out: dict[int, RequestEvents], ev: StepEvents) -> None:
    """embed_fids[i]'s vector is the i-th equal slice of `embeddings`."""
    n = len(ev.embed_fids)
    if n == 0:
        if len(ev.embeddings):
            raise ProtocolError(400, "events: embeddings without embed_fids")
        return
    dims = len(ev.embeddings) // n
    if dims == 0 or dims * n != len(ev.embeddings):
        raise ProtocolError(400, f"events: {len(ev.embeddings)} floats for {n} embeddings")
    raw = memoryview(ev.embeddings.tobytes())
    for i, fid in enumerate(ev.embed_fids):
        _of(out, fid).embedding = F32(raw[i * dims * 4:(i + 1) * dims * 4])


def _prompt(item) -> tuple[int, int, list]:
    """[fid, first position, entries] (entries are passed on as they are)."""
    if (isinstance(item, list) and len(item) == 3 and type(item[0]) is int
            and type(item[1]) is int and item[1] >= 1 and isinstance(item[2], list)):
        return item[0], item[1], item[2]
    raise ProtocolError(400, f"events: bad prompt_logprobs entry {item!r:.200}")


def _finished(item) -> tuple[int, str, dict | None]:
    """[fid, reason] or [fid, reason, figures]."""
    if (isinstance(item, list) and len(item) in (2, 3) and type(item[0]) is int
            and item[1] in FINISH_REASONS and (len(item) == 2 or item[2] is None
                                        or isinstance(item[2], dict))):
        return item[0], item[1], item[2] if len(item) == 3 else None
    raise ProtocolError(400, f"events: bad finished entry {item!r:.200}")
