"""A run as a timeline of steps in seconds: what each step did and when it started and ended
(docs/design/whatif.md, "What-if replay"). A recorded log and a simulated run both become a list of
`Step`s, so that one set of functions (replay/stepmodel.py, replay/runmetrics.py) reads both.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from core.speculate import kept_outputs
from replay.logfile import LogFile


@dataclass(frozen=True, slots=True)
class Step:
    """One step. `ready`: when the loop could begin it (the previous step's end, or, after an
    idle wait, the arrival that woke it); `start`..`end`: plan to commit. Ids are requests'."""
    ready: float
    start: float
    end: float
    prefill: tuple          # ((id, start, length, last), ...)
    decode: tuple           # ids
    decode_ctx: tuple       # each decode row's context length (tokens it attends)
    preempted: tuple
    sampled: tuple          # the ids that got a token, in row order (a verified decode's
    #                         id once per token it kept)
    prev_sampled: int       # tokens the step before it published (0 after an idle wait)
    usable: bool = True     # False: abandoned, or right after a worker restart (no timing)
    drafts: tuple = ()      # each decode's drafts verified with it (aligned with decode;
    #                         () when the step drafted for none)
    verified: tuple = ()    # ((id, drafts, drafts kept), ...): its verified decodes' outcome


@dataclass
class Recorded:
    """A log as a timeline: times in seconds from `origin` (the log's first moment)."""
    origin: float
    steps: list[Step]
    arrivals: dict[int, float]                 # request id -> arrival (s)
    tokens: dict[int, list[int]] = field(default_factory=dict)  # id -> tokens it generated
    stopped: set[int] = field(default_factory=set)   # ids whose last token was a stop token


def recorded(log: LogFile) -> Recorded:
    rows = list(log.steps())
    starts = [r.wall_time - r.duration_ms / 1e3 for r in rows]
    if log.meta.get("overlap"):
        _unoverlap(rows, starts)
    logged = [r["arrival_time"] for r in log.requests.values() if r.get("arrival_time") is not None]
    origin = min([*logged, *starts[:1]], default=0.0)
    busy = [r.running + r.waiting > 0 for r in rows]   # work left after step k
    arrivals = {}
    for seq_id, r in log.requests.items():
        at = _arrival(r, rows, starts, busy)
        if at is not None:
            arrivals[seq_id] = at - origin
    added: dict[int, list[int]] = {}
    for step, inputs in log.inputs.items():
        added[step] = [i for kind, i in inputs if kind == "add" and i in arrivals]
    n = {seq_id: len(r["prompt_tokens"]) for seq_id, r in log.requests.items()}
    tokens: dict[int, list[int]] = {seq_id: [] for seq_id in log.requests}
    stopped: set[int] = set()
    steps, prev = [], 0
    for k, row in enumerate(rows):
        idle = k == 0 or not busy[k - 1]
        woke = min((arrivals[i] + origin for i in added.get(k, ())), default=starts[k])
        last = rows[k - 1].wall_time if k else woke   # an arrival read mid-step waits for it
        ready = (max(woke, last) if idle else last) - origin
        prev = 0 if idle else prev
        sched = row.schedule
        # a row after a request's stop token was planned before the stop was known
        # (overlapped): the scheduler drops it, so it is no token of the request
        kept = [o for o in kept_outputs(sched, row.outputs) if o[0] not in stopped]
        abandoned = not row.outputs and (sched["decode"] or any(c[3] for c in sched["prefill"]))
        restarted = any(kind == "restart" for kind, _ in log.inputs.get(k, ()))
        steps.append(Step(ready, starts[k] - origin, row.wall_time - origin,
                          tuple(tuple(c) for c in sched["prefill"]), tuple(sched["decode"]),
                          tuple(n[i] for i in sched["decode"]), tuple(sched["preempted"]),
                          tuple(o[0] for o in kept), prev, not (abandoned or restarted),
                          *_speculated(sched)))
        for seq_id, token, stop in kept:
            n[seq_id] += 1
            tokens[seq_id].append(token)
            if stop:
                stopped.add(seq_id)
        prev = len(kept)
    return Recorded(origin, steps, arrivals, tokens, stopped)


def _speculated(sched: dict) -> tuple[tuple, tuple]:
    """A logged schedule's drafts per decode and its verified decodes' (id, drafts, kept)."""
    drafts = dict(sched.get("drafts", ()))
    if not drafts:
        return (), ()
    return (tuple(len(drafts.get(i, ())) for i in sched["decode"]),
            tuple((i, len(drafts[i]), kept) for i, kept in sched.get("accepted", ())))


def _unoverlap(rows: list, starts: list[float]) -> None:
    """An overlapped log's step k was planned while step k-1 ran, so its plan..settle span
    (duration_ms) covers part of k-1's: as a timeline of steps one after the other, step k
    starts when k-1 settled, and its time is the interval between the two settles."""
    for k in range(1, len(rows)):
        starts[k] = min(rows[k].wall_time, max(starts[k], rows[k - 1].wall_time))


def _arrival(r: dict, rows: list, starts: list[float], busy: list[bool]) -> float | None:
    """The logged arrival; a log made before arrival_time existed gets the middle of the
    gap before its arrival step (the start of that step when the engine was idle)."""
    if r.get("arrival_time") is not None:
        return r["arrival_time"]
    k = r["arrival_step"]
    if k >= len(rows):
        return None
    if k == 0 or not busy[k - 1]:
        return starts[k]
    return (rows[k - 1].wall_time + starts[k]) / 2
