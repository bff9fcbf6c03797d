#!/usr/bin/env python
"""Scheduler hot path: mean schedule() + on_step() time per step with 256 running decodes,
once with 10 and once with 10,000 waiting requests (which must not slow a step down); and,
in runs of their own, build_batch's time (core/batch.py) on the same steps."""
from __future__ import annotations

import argparse
import gc
import sys
import time


from core import cli
from core.batch import build_batch
from scripts.benchmarks import _provenance as prov
from scripts.benchmarks import common as bl
from core.sched import (FreeListBlocks, Request, SchedPolicy, Scheduler,
                        SchedulerConfig, StepOutput)

BLOCK = 16
PROMPT = 8


def build(running: int, waiting: int, steps: int, policy: SchedPolicy) -> Scheduler:
    """`running` requests decoding for at least `steps` more steps, `waiting` queued."""
    max_tokens = steps + 64
    per_req = -(-(PROMPT + max_tokens) // BLOCK)
    cfg = SchedulerConfig(max_seqs=running, max_batch_tokens=max(2048, running * PROMPT),
                          max_waiting=running + waiting, policy=policy,
                          max_model_len=PROMPT + max_tokens + 1)
    sched = Scheduler(cfg, FreeListBlocks(BLOCK, range(running * per_req)))
    for i in range(running + waiting):
        prompt = [(i * 7 + j) % 1000 for j in range(PROMPT)]
        sched.add(Request(prompt, max_tokens, priority=(i % 3) if i < running else 0))
    return sched


def measure(running: int, waiting: int, steps: int, policy: SchedPolicy,
            batch: bool = False) -> float:
    """Mean microseconds per step, schedule() + on_step(); with `batch`, build_batch's alone."""
    sched = build(running, waiting, steps + 2, policy)
    out = sched.schedule()  # admits the running set
    sched.on_step([StepOutput(c.id, 1) for c in out.prefill])
    outputs = [StepOutput(i, 1) for i in range(running)]
    sched.on_step(outputs)  # nothing sampled in between: ignored
    gc_was = gc.isenabled()
    gc.disable()
    try:
        clock = time.perf_counter_ns
        total = 0
        for step in range(steps):
            if batch:
                out = sched.schedule()
                t0 = clock()
                build_batch(step, out, sched, {})
                total += clock() - t0
                sched.on_step(outputs)
            else:
                t0 = clock()
                out = sched.schedule()
                sched.on_step(outputs)
                total += clock() - t0
            assert len(out.decode) == running and not out.prefill, "bench setup broken"
    finally:
        if gc_was:
            gc.enable()
    s = sched.stats()
    assert s.running == running and s.waiting == waiting and s.preemptions == 0
    return total / steps / 1000


def main() -> int:
    ap = cli.parser(description=__doc__)
    ap.add_argument("--running", type=int, default=256, help="running decodes each step")
    ap.add_argument("--waiting", type=int, nargs=2, default=[10, 10_000], metavar=("FEW", "MANY"),
                    help="the two waiting-queue sizes compared")
    ap.add_argument("--steps", type=int, default=500, help="timed steps per repeat")
    ap.add_argument("--repeats", type=int, default=5, help="best mean of this many repeats")
    ap.add_argument("--policy", choices=["fcfs", "priority"], default="priority",
                    help="the scheduling policy")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    prov.add_allow_dirty(ap)
    args = ap.parse_args()
    start = prov.begin("sched", args.json, args.allow_dirty)
    policy = SchedPolicy(args.policy)
    few, many = args.waiting
    runs: dict[int, list[float]] = {few: [], many: []}
    batch_runs: list[float] = []
    for _ in range(args.repeats):  # interleaved, so a noisy moment hits both alike
        for w in (few, many):
            runs[w].append(measure(args.running, w, args.steps, policy))
        batch_runs.append(measure(args.running, few, args.steps, policy, batch=True))
    res = {w: min(r) for w, r in runs.items()}
    for w in (few, many):
        print(f"{args.running} decodes, {w:>6} waiting: {res[w]:8.1f} us/step "
              f"(best of {args.repeats}; all: {', '.join(f'{x:.1f}' for x in runs[w])})")
    print(f"build_batch, {args.running} decodes: {min(batch_runs):8.1f} us/step "
          f"(best of {args.repeats}; all: {', '.join(f'{x:.1f}' for x in batch_runs)})")
    ratio = res[many] / res[few]
    print(f"ratio {many}/{few} waiting: {ratio:.3f}")
    if args.json:
        bl.write_json(args.json, prov.stamp(
            {"running": args.running, "steps": args.steps, "repeats": args.repeats,
             "policy": args.policy, "us_per_step": {str(k): v for k, v in res.items()},
             "all_runs": {str(k): v for k, v in runs.items()}, "ratio": ratio,
             "build_batch_us": min(batch_runs)}, start, None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
