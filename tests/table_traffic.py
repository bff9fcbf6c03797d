"""Random traffic through a pool small enough to preempt, so block tables are freed,
allocated anew and grown: what tests of code that keeps tables between steps run over
(core/table_growth.py)."""
from __future__ import annotations

import random

from core.batch import sampled_ids
from core.sched import Chunked, Request, Scheduler, SchedulerConfig, StepOutput

BS = 4


def traffic(pool, seed: int):
    """A scheduler on a 40-block `pool`; prompts share prefixes, so a caching pool hits.
    Yields (step, scheduler, its schedule) after each schedule and (step, scheduler, None)
    after each step's outputs; every request has finished at the end."""
    rng = random.Random(seed)
    sched = Scheduler(SchedulerConfig(max_batch_tokens=24, max_seqs=6), pool(BS, range(40)),
                      Chunked(8))
    heads = [[rng.randrange(1, 9) for _ in range(9)] for _ in range(3)]

    def add(n: int):
        sched.add(Request(rng.choice(heads) + [rng.randrange(1, 9) for _ in range(n)],
                          rng.randrange(1, 40)))
    for _ in range(12):
        add(rng.randrange(0, 12))
    step = 0
    while sched.has_unfinished() and step < 2000:
        out = sched.schedule()
        yield step, sched, out
        sched.on_step([StepOutput(i, rng.randrange(1, 9)) for i in sampled_ids(out)])
        yield step, sched, None
        step += 1
        if step % 7 == 0 and step < 100:
            add(5)
    assert not sched.has_unfinished()
