"""A run's traffic: each request's arrival, prompt, length and priority, from a step log or
from a CSV trace (docs/design/whatif.md, "What-if replay").

A request's length is the number of tokens it generated in the recording; a simulation
makes it generate exactly those tokens (so prefix-cache hits on generated tokens repeat).
One that ended on its own (a stop token, its max_tokens) keeps its recorded max_tokens and
its last token is a stop when it was one: its limit is the live one (speculation's drafts
stop short of it). A request that generated nothing (aborted before its first token) is left
out.

CSV: `arrival_s,prompt_tokens,output_tokens,priority` (Vidur's request trace shape plus the
priority), one request a row, arrival in seconds from the trace's start.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, replace

from core.engine import speculative
from core.ipc.protocol import SamplingParams
from core.bounds import MAX_PRIORITY
from replay.logfile import LogFile
from replay.timeline import Recorded

COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens", "priority")


class TraceError(Exception):
    """A trace or log that cannot be simulated; the message says why (exit 2)."""


@dataclass(frozen=True)
class TraceRequest:
    id: int                  # the log's request id, or the CSV row (from 0)
    arrival_s: float
    prompt: tuple[int, ...]
    output: tuple[int, ...]  # the tokens it generates; its length is the request's length
    priority: int = 0
    cache_hits: bool = True  # False: it asked for prompt logprobs (docs/design/worker.md, "Prompt logprobs")
    cache_salt: str | None = None  # shares cached blocks only within its salt (from a log)
    max_tokens: int | None = None  # the recorded limit (None: len(output), it ends by length)
    stops: bool = False      # its last token is a stop token
    speculative: bool = True  # may be verified with drafts (core/engine.py speculative)

    @property
    def limit(self) -> int:
        return self.max_tokens or len(self.output)


def from_log(log: LogFile, rec: Recorded) -> list[TraceRequest]:
    out = []
    for seq_id, r in sorted(log.requests.items()):
        tokens = rec.tokens.get(seq_id)
        if tokens and seq_id in rec.arrivals:
            stops = seq_id in rec.stopped
            own = stops or r["finish_reason"] == "length"   # not a stop string nor an abort
            out.append(TraceRequest(seq_id, rec.arrivals[seq_id], tuple(r["prompt_tokens"]),
                                    tuple(tokens), r["priority"],
                                    r["sampling"].get("prompt_logprobs") is None,
                                    r["cache_salt"], r["max_tokens"] if own else None, stops,
                                    speculative(_sampling(r["sampling"]))))
    if not out:
        raise TraceError(f"{log.path}: no request generated a token; there is no traffic to"
                         " simulate")
    return out


def _sampling(doc: dict) -> SamplingParams:
    return SamplingParams(**{k: v for k, v in doc.items() if k not in ("ignore_eos", "embed")})


def scaled(reqs: list[TraceRequest], load: float) -> list[TraceRequest]:
    """Arrivals compressed by `load` (2.0: twice the rate) about the first arrival."""
    if not load > 0:
        raise TraceError(f"--load must be > 0, got {load}")
    t0 = min(r.arrival_s for r in reqs)
    return [replace(r, arrival_s=t0 + (r.arrival_s - t0) / load) for r in reqs]


def write_csv(reqs: list[TraceRequest], path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in reqs:
            w.writerow([repr(r.arrival_s), len(r.prompt), len(r.output), r.priority])


def read_csv(path: str) -> list[TraceRequest]:
    """Prompts are made up (distinct per request, so no prefix is shared), outputs zeros."""
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: cannot read the trace ({e})") from None
    if not rows or tuple(c.strip() for c in rows[0]) != COLUMNS:
        raise TraceError(f"{path}: a trace's first line must be {','.join(COLUMNS)}")
    out = [_row(i, row, f"{path} line {i + 2}") for i, row in enumerate(rows[1:]) if row]
    if not out:
        raise TraceError(f"{path}: the trace has no requests")
    return out


def _row(i: int, row: list[str], where: str) -> TraceRequest:
    if len(row) != len(COLUMNS):
        raise TraceError(f"{where}: {len(row)} fields, want {len(COLUMNS)}")
    try:
        arrival, prompt, output, prio = float(row[0]), int(row[1]), int(row[2]), int(row[3])
    except ValueError:
        raise TraceError(f"{where}: not numbers: {','.join(row)}") from None
    if not 0 <= arrival < float("inf") or prompt < 1 or output < 1 or abs(prio) > MAX_PRIORITY:
        raise TraceError(f"{where}: want arrival_s >= 0, prompt_tokens >= 1, output_tokens >= 1"
                         f" and |priority| <= {MAX_PRIORITY}")
    return TraceRequest(i, arrival, (i + 1,) + (1,) * (prompt - 1), (0,) * output, prio)
