"""A recorded or given traffic re-scheduled by the real scheduler (core/sched.py) under any
configuration, in simulated time (docs/DESIGN.md, "What-if replay").

The loop is the core's (core/process.py): between steps, every request that has arrived by
the time the next step is planned joins the queue; with nothing unfinished the clock jumps to
the next arrival. A timer (replay/stepmodel.py) says how long each step's gap and forward
take; a fake worker answers each sampled row with the request's next recorded token, so each
request finishes by length after exactly its recorded number of tokens.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from core.batch import sampled_ids
from core.config import build_engine, layout_problem
from core.sched import AdmitError, Request, SchedPolicy, Scheduler, SchedulerConfig, StepOutput
from replay.stepmodel import forward_features
from replay.timeline import Step
from replay.trace import TraceError, TraceRequest

KNOBS = ("policy", "aging_steps", "max_seqs", "max_batch_tokens", "num_blocks", "prefill",
         "max_chunk", "preempt_margin")


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


def scheduler_for(meta: dict, knobs: Knobs) -> Scheduler:
    """The log's scheduler (core/config.py engine_from_meta) with the knobs applied."""
    sc = dict(meta["sched_config"])
    sc["policy"] = SchedPolicy[(knobs.policy or sc["policy"]).upper()]
    # without speculation: the step model has no term for drafts, nor a model to verify them
    sc["num_draft"] = 0
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
                req_of[sched.add(Request(list(r.prompt), len(r.output), r.priority,
                                         r.cache_hits, r.cache_salt))] = r
            except AdmitError as e:
                out.refused.append((r.id, str(e)))
        if not sched.has_unfinished():
            clock = start
            continue
        if len(out.steps) >= limit:
            raise TraceError(f"the simulation made no progress after {limit} steps")
        step = _step(sched, req_of, timer, len(out.steps), ready, start, prev)
        out.steps.append(step)
        clock, prev = step.end, len(step.sampled)
        planned_at = step.start if overlap else None
    return out


def _step(sched: Scheduler, req_of: dict, timer, k: int, ready: float, start: float,
          prev: int) -> Step:
    plan = sched.schedule()
    prefill = tuple((c.id, c.start, c.length, c.last) for c in plan.prefill)
    ctx = tuple(len(sched.tokens(i)) for i in plan.decode)
    end = start + timer.forward_s(k, forward_features(prefill, ctx))
    ids = sampled_ids(plan)
    outs = []
    for seq_id in ids:
        r = req_of[seq_id]
        outs.append(StepOutput(seq_id, r.output[len(sched.tokens(seq_id)) - len(r.prompt)]))
    sched.on_step(outs)

    def names(seq_ids) -> tuple:   # the scheduler's ids -> the requests' own
        return tuple(req_of[i].id for i in seq_ids)

    return Step(ready, start, end, tuple((req_of[c[0]].id, *c[1:]) for c in prefill),
                names(plan.decode), ctx, names(plan.preempted), names(ids), prev)
