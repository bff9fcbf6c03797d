"""Regroup one StepEvents message per request: the frontend answers each request once a step."""
from __future__ import annotations

from dataclasses import dataclass, field

from core.ipc.protocol import ProtocolError, StepEvents
from core.sched_types import FINISH_REASONS



@dataclass
class RequestEvents:
    """One request's part of a step: its tokens (with their logprobs when it asked) and,
    when it finished, the reason and the core's figures."""
    fid: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[list] = field(default_factory=list)
    reason: str | None = None
    figures: dict | None = None
    prompt: list = field(default_factory=list)   # [[first position, entries], ...]


def group_events(ev: StepEvents) -> list[RequestEvents]:
    """Per request, in order of first appearance. Raises ProtocolError for a message that
    does not hang together, so the caller drops all of it rather than apply half."""
    n = len(ev.tokens)
    if len(ev.fids) != n:
        raise ProtocolError(400, f"events: {len(ev.fids)} fids but {n} tokens")
    if len(ev.logprobs) not in (0, n) or len(ev.top_logprobs) not in (0, n):
        raise ProtocolError(400, f"events: logprobs for {len(ev.logprobs)} of {n} tokens")
    out: dict[int, RequestEvents] = {}
    for i, (fid, tok) in enumerate(zip(ev.fids, ev.tokens)):
        r = out.get(fid) or out.setdefault(fid, RequestEvents(fid))
        r.tokens.append(tok)
        if len(ev.logprobs) and ev.logprobs[i] == ev.logprobs[i]:   # NaN: not asked
            r.logprobs.append(ev.logprobs[i])
            r.top.append(ev.top_logprobs[i] or [])
    for item in ev.prompt_logprobs:
        fid, first, entries = _prompt(item)
        r = out.get(fid) or out.setdefault(fid, RequestEvents(fid))
        r.prompt.append([first, entries])
    for item in ev.finished:
        fid, reason, figures = _finished(item)
        r = out.get(fid) or out.setdefault(fid, RequestEvents(fid))
        r.reason, r.figures = reason, figures
    return list(out.values())


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
