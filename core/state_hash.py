"""What each step log row is checked by: its schedule column (`schedule_json`) and the
state hash chained through the rows (`state_hash`; docs/design/steplog.md, "State hash").
The engine writes both after each step; replay computes them again and compares."""
from __future__ import annotations

import hashlib

import msgpack

from core.sched import ScheduleOutput


def schedule_json(out: ScheduleOutput, hits=(), accepted=()) -> dict:
    """The step log's schedule column; `hits` ([[id, cached tokens], ...], the admissions
    that hit the prefix cache) only when there are any, so logs without a cache keep their
    shape; so are "drafts" ([[id, [drafts]], ...], the decodes verified with drafts) and
    "accepted" ([[id, drafts kept], ...], known once the step's tokens are) and "pooled"
    ([ids]: the embedding requests whose last prompt position the step pools)."""
    doc = {"prefill": [[c.id, c.start, c.length, c.last] for c in out.prefill],
           "decode": list(out.decode), "preempted": list(out.preempted)}
    if hits:
        doc["cached"] = [list(h) for h in hits]
    if out.drafts:
        doc["drafts"] = [[i, list(d)] for i, d in out.drafts.items()]
    if accepted:
        doc["accepted"] = [list(a) for a in accepted]
    if out.pooled:
        doc["pooled"] = list(out.pooled)
    return doc


HASH_PIECE = 2047   # hashlib lets the GIL go for an update of 2 KiB or more


def state_hash(prev: str, snapshot, sched_doc: dict, outputs: list) -> str:
    """The previous hash chained with the scheduler's state after the step (msgpack is
    a canonical, fast serialization of these plain tuples, lists, ints and bools).

    Fed in pieces under 2 KiB, which hashlib hashes without letting the GIL go: taking it
    back from the busy log writer thread would cost the step loop up to a switch interval,
    for a hash that takes microseconds (the digest is the same)."""
    h = hashlib.blake2b(prev.encode(), digest_size=16)
    data = memoryview(msgpack.packb((snapshot, sched_doc, outputs)))
    for i in range(0, len(data), HASH_PIECE):
        h.update(data[i:i + HASH_PIECE])
    return h.hexdigest()
