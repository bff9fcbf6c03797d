"""A recorded or given traffic re-scheduled by the real scheduler (core/sched.py) under any
configuration, in simulated time (docs/design/whatif.md, "What-if replay").

The loop is the core's (core/process.py): between steps, every request that has arrived by
the time the next step is planned joins the queue; with nothing unfinished the clock jumps to
the next arrival. A timer (replay/stepmodel.py) says how long each step's gap and forward
take; a fake worker answers each sampled row with the request's recorded token at that
position, so each request finishes after exactly its recorded tokens. A decode verified with
drafts samples k + 1 rows, row i the recorded token i positions on: core/speculate.py then
keeps exactly the drafts that equal the recorded tokens, which under exact verification are
the drafts the live run would keep (docs/design/whatif.md, "Speculative decoding in a
what-if").
"""
from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter

from core.batch import sampled_ids
from core.config import build_engine, layout_problem
from core.sched import (AdmitError, Request, SchedPolicy, Scheduler, SchedulerConfig,
                        StepOutput, TokenEvent)
from core.speculate import kept_rows
from replay.speculation import drafting
from replay.stepmodel import forward_features
from replay.timeline import Step
from replay.trace import TraceError, TraceRequest

KNOBS = ("policy", "aging_steps", "max_seqs", "max_batch_tokens", "num_blocks", "prefill",
         "max_chunk", "preempt_margin", "speculative", "num_draft", "spec_max_batch")


@dataclass(frozen=True)
class Knobs:
    """What a what-if may change; None keeps the log's value. aging_steps 0 is strict
    priority and preempt_margin 0 never preempts for arrivals (as scripts/serve reads them)."""
    policy: str | None = None
    aging_steps: int | None = None
    max_seqs: int | None = None
    max_batch_tokens: int | None = None
    num_blocks: int | None = None
    prefill: str | None = None
    max_chunk: int | None = None
    preempt_margin: int | None = None
    speculative: str | None = None   # "ngram" or "off" (replay/speculation.py)
    num_draft: int | None = None
    spec_max_batch: int | None = None


def scheduler_for(meta: dict, knobs: Knobs, tokens: bool = True) -> Scheduler:
    """The log's scheduler (core/config.py engine_from_meta) with the knobs applied.
    `tokens`: the traffic has the recorded tokens (a CSV trace has none to draft from)."""
    sc = dict(meta["sched_config"])
    sc["policy"] = SchedPolicy[(knobs.policy or sc["policy"]).upper()]
    sc["num_draft"], sc["spec_max_batch"] = drafting(meta, knobs, tokens)
    sc["draft_model"] = False   # drafting() predicts n-grams only
    for name in ("max_seqs", "max_batch_tokens"):
        if getattr(knobs, name) is not None:
            sc[name] = getattr(knobs, name)
    for name in ("aging_steps", "preempt_margin"):
        if getattr(knobs, name) is not None:
            sc[name] = getattr(knobs, name) or None
    pf = meta["prefill"]
    pick = lambda mine, logged: logged if mine is None else mine  # noqa: E731
    num_blocks = pick(knobs.num_blocks, meta["num_blocks"])
    try:
        if why := layout_problem(num_blocks, meta["block_size"],
                                 meta["model_info"]["max_model_len"]):
            raise ValueError(why)
        cfg = SchedulerConfig(**sc)
        engine = build_engine(cfg, pick(knobs.prefill, pf["kind"]),
                              pick(knobs.max_chunk, pf["max_chunk"]), meta["block_size"],
                              num_blocks, (), meta["seed"],
                              prefix_cache=meta.get("prefix_cache", False))
    except ValueError as e:
        raise TraceError(f"bad configuration: {e}") from None
    return engine.sched


@dataclass
class Simulated:
    steps: list[Step]
    refused: list[tuple[int, str]] = field(default_factory=list)   # (request id, why)
    tokens: dict[int, list[int]] = field(default_factory=dict)     # id -> the tokens it took


def simulate(sched: Scheduler, reqs: list[TraceRequest], timer,
             overlap: bool = False) -> Simulated:
    """`overlap`: the core plans a step while the one before it runs (core/overlap.py), so
    a request that arrives while step k-1 runs first joins step k+1: the cut-off for step
    k's queue is when step k-1 started, not when step k does."""
    queue = sorted(reqs, key=lambda r: (r.arrival_s, r.id))
    # a guard: every step computes at least one position; recomputes after preemption
    # cost more, but not fifty times the whole traffic
    limit = 50 * sum(len(r.prompt) + len(r.output) for r in reqs) + 1000
    req_of: dict[int, TraceRequest] = {}      # the scheduler's id -> the request
    out = Simulated([])
    clock, i, prev = (queue[0].arrival_s if queue else 0.0), 0, 0
    planned_at = None    # overlap: when the step now planned could first be planned
    while i < len(queue) or sched.has_unfinished():
        if not sched.has_unfinished():
            clock, prev, planned_at = max(clock, queue[i].arrival_s), 0, None
        ready = clock
        start = ready + timer.gap_s(len(out.steps), prev)
        cutoff = start if planned_at is None else planned_at
        while i < len(queue) and queue[i].arrival_s <= cutoff:
            r = queue[i]
            i += 1
            try:
                req_of[sched.add(Request(list(r.prompt), r.limit, r.priority, r.cache_hits,
                                         r.cache_salt, r.speculative))] = r
            except AdmitError as e:
                out.refused.append((r.id, str(e)))
        if not sched.has_unfinished():
            clock = start
            continue
        if len(out.steps) >= limit:
            raise TraceError(f"the simulation made no progress after {limit} steps")
        step = _step(sched, req_of, timer, len(out.steps), ready, start, prev, out.tokens)
        out.steps.append(step)
        clock, prev = step.end, len(step.sampled)
        planned_at = step.start if overlap else None
    return out


def _step(sched: Scheduler, req_of: dict, timer, k: int, ready: float, start: float,
          prev: int, tokens: dict[int, list[int]]) -> Step:
    plan = sched.schedule()
    prefill = tuple((c.id, c.start, c.length, c.last) for c in plan.prefill)
    ctx = tuple(len(sched.tokens(i)) for i in plan.decode)
    drafts = tuple(len(plan.drafts.get(i, ())) for i in plan.decode) if plan.drafts else ()
    end = start + timer.forward_s(k, forward_features(prefill, ctx, drafts))
    outs = _answers(sched, req_of, sampled_ids(plan))
    accepted: list = []
    if plan.drafts:
        outs, accepted = kept_rows(plan.drafts, outs, _ID, _TOKEN, _STOP)
    for ev in sched.on_step(outs):
        if type(ev) is TokenEvent:
            tokens.setdefault(req_of[ev.id].id, []).append(ev.token)

    def names(seq_ids) -> tuple:   # the scheduler's ids -> the requests' own
        return tuple(req_of[i].id for i in seq_ids)

    return Step(ready, start, end, tuple((req_of[c[0]].id, *c[1:]) for c in prefill),
                names(plan.decode), ctx, names(plan.preempted), names(o.id for o in outs),
                prev, True, drafts,
                tuple((req_of[i].id, len(plan.drafts[i]), n) for i, n in accepted))


def _answers(sched: Scheduler, req_of: dict, ids: list) -> list[StepOutput]:
    """The fake worker: each sampled row (in row order; a verified decode's k + 1 rows one
    after the other) answered with its request's recorded token at the row's position, its
    last one a stop when it was. A row past the recorded tokens can only follow a stop row
    in the same verified run, and is never kept."""
    out, nth, last = [], 0, None
    for seq_id in ids:
        nth = nth + 1 if seq_id == last else 0
        last = seq_id
        r = req_of[seq_id]
        at = len(sched.tokens(seq_id)) - len(r.prompt) + nth
        if at >= len(r.output):
            out.append(StepOutput(seq_id, 0, True))
        else:
            out.append(StepOutput(seq_id, r.output[at], r.stops and at == len(r.output) - 1))
    return out


_ID, _TOKEN, _STOP = attrgetter("id"), attrgetter("token"), attrgetter("stop")
