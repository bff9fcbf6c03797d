"""stats() over data-parallel replicas: each replica's CoreStats, and their totals."""
from __future__ import annotations

from dataclasses import dataclass, field

SUMMED = ("running", "waiting", "free_blocks", "total_blocks", "steps", "preemptions",
          "finished", "step_ms_total", "cached_blocks", "prefix_query_tokens",
          "prefix_hit_tokens", "prefix_recompute_hit_tokens")


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
    out["pids"] = {**first["pids"], "frontend": frontend_pid}
    out["replicas"] = per_replica
    return out
