"""Regroup one StepEvents message per request: the frontend answers each request once a step."""
from __future__ import annotations

from core.ipc.protocol import ProtocolError, StepEvents

REASONS = frozenset({"stop", "length", "abort"})


def group_events(ev: StepEvents) -> list[tuple[int, list[int], str | None]]:
    """[(rid, tokens, finish reason or None)] in order of first appearance.

    Raises ProtocolError for a message that does not hang together, so the caller drops
    all of it rather than apply half.
    """
    if len(ev.rids) != len(ev.tokens):
        raise ProtocolError(400, f"events: {len(ev.rids)} rids but {len(ev.tokens)} tokens")
    tokens: dict[int, list[int]] = {}
    for rid, tok in zip(ev.rids, ev.tokens):
        tokens.setdefault(rid, []).append(tok)
    reasons: dict[int, str] = {}
    for item in ev.finished:
        if (not isinstance(item, list) or len(item) != 2 or type(item[0]) is not int
                or item[1] not in REASONS):
            raise ProtocolError(400, f"events: bad finished entry {item!r}")
        reasons[item[0]] = item[1]
    order = list(tokens) + [rid for rid in reasons if rid not in tokens]
    return [(rid, tokens.get(rid, []), reasons.get(rid)) for rid in order]
