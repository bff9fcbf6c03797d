"""stats() over data-parallel replicas: each replica's CoreStats, and their totals.

A client's Stats query is asked of every live replica and answered once all of them have
(a replica that dies meanwhile counts as answered; with none left it is a 503).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from core.ipc.protocol import CoreStats, ErrorReply, StatsQuery, StatsReply
from core.step_times import merge_snapshots

SUMMED = ("running", "waiting", "free_blocks", "total_blocks", "steps", "preemptions",
          "finished", "step_ms_total", "cached_blocks", "prefix_query_tokens",
          "prefix_hit_tokens", "prefix_recompute_hit_tokens", "draft_tokens", "accepted_tokens")
HISTOGRAM = "step_ms_histogram"   # summed bucket by bucket (core/step_times.py)


@dataclass
class StatsWait:
    """One client's Stats query, waiting on the replicas it was sent to."""
    ident: bytes
    pending: set[int]
    got: dict[int, dict] = field(default_factory=dict)


def replica_stats(core_stats: dict, index: int, pids: dict, max_model_len: int,
                  joined: bool = False) -> dict:
    """One replica's stats; `joined`: its core runs elsewhere (its pids are not this
    machine's)."""
    st = dict(core_stats, joined=joined)
    st.setdefault("max_model_len", max_model_len)
    core_pids = st.get("pids") if isinstance(st.get("pids"), dict) else {}
    st["pids"] = {**pids, **core_pids}
    return {"replica": index, **st}


def merge(per_replica: list[dict], frontend_pid: int) -> dict:
    """The first replica's keys, counts summed, max_model_len the least; `pids` keeps the
    first replica's core and worker; `replicas` lists each one's own stats."""
    first = per_replica[0]
    out = {k: v for k, v in first.items() if k not in ("replica", "joined")}
    for k in SUMMED:
        values = [st[k] for st in per_replica if isinstance(st.get(k), (int, float))]
        if values:
            out[k] = sum(values)
    out["max_model_len"] = min(st["max_model_len"] for st in per_replica)
    hists = [st[HISTOGRAM] for st in per_replica if isinstance(st.get(HISTOGRAM), dict)]
    if hists:
        out[HISTOGRAM] = merge_snapshots(hists)
    out["pids"] = {**first["pids"], "frontend": frontend_pid}
    out["replicas"] = per_replica
    return out


class StatsQueries:
    """The Stats queries in flight, by qid (the frontend's own counter)."""

    def __init__(self, none_left: str):
        self._none_left = none_left   # the 503's message when every asked replica died
        self._next_qid = 0
        self._waits: dict[int, StatsWait] = {}

    def ask(self, ident: bytes, replicas) -> bool:
        """Ask every live replica for `ident`; False when none took the query."""
        qid, self._next_qid = self._next_qid, self._next_qid + 1
        asked = {r.index for r in replicas if r.up and r.send(StatsQuery(qid))}
        if asked:
            self._waits[qid] = StatsWait(ident, asked)
        return bool(asked)

    def answer(self, r, msg: CoreStats) -> tuple[bytes, object] | None:
        """Replica `r`'s answer; (client, reply) once the query is complete."""
        wait = self._waits.get(msg.qid)
        if wait is None or r.index not in wait.pending:
            return None
        wait.pending.discard(r.index)
        wait.got[r.index] = replica_stats(msg.stats, r.index, r.pids, r.info.max_model_len,
                                          r.joined)
        return self._reply(msg.qid) if not wait.pending else None

    def replica_gone(self, index: int) -> list[tuple[bytes, object]]:
        """Replica `index` died: the queries that waited only on it are complete now."""
        done = []
        for qid, wait in list(self._waits.items()):
            wait.pending.discard(index)
            if not wait.pending:
                done.append(self._reply(qid))
        return done

    def _reply(self, qid: int) -> tuple[bytes, object]:
        wait = self._waits.pop(qid)
        if not wait.got:
            return wait.ident, ErrorReply(None, 503, self._none_left)
        per_replica = [wait.got[k] for k in sorted(wait.got)]
        return wait.ident, StatsReply(merge(per_replica, os.getpid()))
