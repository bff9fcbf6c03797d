"""Regroup one StepEvents message per request: the frontend answers each request once a step."""
from __future__ import annotations

from core.ipc.protocol import ProtocolError, StepEvents

REASONS = frozenset({"stop", "length", "abort"})


def group_events(ev: StepEvents) -> list[tuple[int, list[int], str | None]]:
    """[(fid, tokens, finish reason or None)] in order of first appearance.

    Raises ProtocolError for a message that does not hang together, so the caller drops
    all of it rather than apply half.
    """
    if len(ev.fids) != len(ev.tokens):
        raise ProtocolError(400, f"events: {len(ev.fids)} fids but {len(ev.tokens)} tokens")
    tokens: dict[int, list[int]] = {}
    for fid, tok in zip(ev.fids, ev.tokens):
        tokens.setdefault(fid, []).append(tok)
    reasons: dict[int, str] = {}
    for item in ev.finished:
        if (not isinstance(item, list) or len(item) != 2 or type(item[0]) is not int
                or item[1] not in REASONS):
            raise ProtocolError(400, f"events: bad finished entry {item!r}")
        reasons[item[0]] = item[1]
    order = list(tokens) + [fid for fid in reasons if fid not in tokens]
    return [(fid, tokens.get(fid, []), reasons.get(fid)) for fid in order]
