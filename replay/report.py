"""Human reports on a step log: the run's summary and one request's life."""
from __future__ import annotations

from collections import defaultdict

from core.speculate import kept_outputs
from replay.logfile import LogFile

SPARK = " .:-=+*#%@"


def _first_admission(log: LogFile) -> dict[int, int]:
    first: dict[int, int] = {}
    for row in log.steps():
        for seq_id, start, _, _ in row.schedule["prefill"]:
            if start == 0:
                first.setdefault(seq_id, row.step)
    return first


def _spark(values: list[float], width: int = 60) -> str:
    if not values:
        return ""
    top = max(values) or 1
    stride = max(1, len(values) // width)
    cols = [max(values[i:i + stride]) for i in range(0, len(values), stride)]
    return "".join(SPARK[min(9, int(9 * v / top))] for v in cols)


def summary(log: LogFile) -> str:
    rows = list(log.steps())
    reqs = log.requests
    first = _first_admission(log)
    preempt = sum(len(r.schedule["preempted"]) for r in rows)
    tokens = sum(len(kept_outputs(r.schedule, r.outputs)) for r in rows)
    aborts = sum(1 for r in reqs.values() if r["finish_reason"] == "abort")
    total = log.meta["num_blocks"]
    used = [total - r.free_blocks for r in rows]
    lines = [f"log       {log.path}",
             f"model     {log.meta['model']}  ({total} blocks of {log.meta['block_size']})",
             f"requests  {len(reqs)}  (finished: " + ", ".join(
                 f"{k} {v}" for k, v in sorted(_count(reqs, "finish_reason").items())) + ")",
             f"steps     {len(rows)}   tokens {tokens}   preemptions {preempt}   aborts {aborts}",
             f"KV used   peak {max(used, default=0)}/{total}  mean "
             f"{sum(used) / max(len(used), 1):.1f}",
             f"          |{_spark(used)}|",
             "wait (steps from arrival to first admission) by priority:"]
    waits = defaultdict(list)
    for seq_id, r in reqs.items():
        if seq_id in first:
            waits[r["priority"]].append(first[seq_id] - r["arrival_step"])
    for prio in sorted(waits, reverse=True):
        w = waits[prio]
        lines.append(f"  priority {prio:>5}: n={len(w):<5} mean {sum(w) / len(w):7.1f}  max {max(w)}")
    lines.append("slowest steps:")
    for r in sorted(rows, key=lambda r: -r.duration_ms)[:5]:
        lines.append(f"  step {r.step:>6}: {r.duration_ms:8.2f} ms  decode {len(r.schedule['decode'])}"
                     f"  prefill tokens {sum(c[2] for c in r.schedule['prefill'])}")
    return "\n".join(lines)


def _count(reqs: dict, key: str) -> dict:
    out: dict = defaultdict(int)
    for r in reqs.values():
        out[r[key] or "unfinished"] += 1
    return out


def request_life(log: LogFile, seq_id: int) -> str:
    r = log.requests.get(seq_id)
    if r is None:
        return f"request {seq_id}: not in this log"
    lines = [f"request {seq_id} (client id {r['client_request_id']!r}), priority {r['priority']},"
             f" prompt {len(r['prompt_tokens'])} tokens, max_tokens {r['max_tokens']},"
             f" sampling {r['sampling']}" + (f", user {r['user']!r}" if r.get("user") else ""),
             f"  step {r['arrival_step']:>6}: arrived"]
    for row in log.steps():
        for c in row.schedule["prefill"]:
            if c[0] == seq_id:
                what = "admitted, " if c[1] == 0 else ""
                lines.append(f"  step {row.step:>6}: {what}prefill chunk {c[1]}..{c[1] + c[2]}"
                             + (" (last)" if c[3] else ""))
        if seq_id in row.schedule["preempted"]:
            lines.append(f"  step {row.step:>6}: preempted")
    out = r["output_tokens"] or []
    lines.append(f"  step {r['finish_step'] if r['finish_step'] is not None else '?':>6}: "
                 f"finished: {r['finish_reason'] or 'unfinished'}, {len(out)} tokens")
    lines.append(f"  tokens: {out}")
    return "\n".join(lines)
