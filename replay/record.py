"""Record step logs offline: seeded workloads run through the Engine with a step log.

Used for the golden logs under tests/fixtures (python -m replay.record DIR re-records them
when a scheduling change is intended) and by tests that need a log without a live group.
"""
from __future__ import annotations

import random
import sqlite3
import sys
from dataclasses import dataclass, field
from pathlib import Path

from core.config import CoreConfig, log_meta
from core.ipc.protocol import ModelInfo, SamplingParams
from core.sched import AdmitError, Request
from core.steplog import StepLog


@dataclass(frozen=True)
class Scenario:
    """Arrivals (step, prompt, max_tokens, priority) and aborts (step, nth request)."""
    name: str
    cfg: CoreConfig
    info: ModelInfo
    arrivals: list = field(hash=False)
    aborts: list = field(default=(), hash=False)


def _cfg(**kw) -> CoreConfig:
    """The golden logs were recorded without the prefix cache and without overlap."""
    return CoreConfig("-", "-", "-", "-", **{"prefix_cache": False, "overlap": False, **kw})


def _info(num_blocks: int, block_size: int = 4) -> ModelInfo:
    return ModelInfo(model="null", num_blocks=num_blocks, block_size=block_size,
                     max_model_len=256, vocab_size=512, eos_ids=[0])


def _arrivals(seed: int, n: int, spread: int, prompt=(2, 40), out=(1, 24), prios=(0,)):
    rng = random.Random(seed)
    return sorted((rng.randrange(spread), [rng.randrange(1, 512) for _ in range(rng.randint(*prompt))],
                   rng.randint(*out), rng.choice(prios)) for _ in range(n))


def _shared(seed: int, n: int, spread: int, prefixes: int = 3, prios=(0, 0, 2)):
    """Arrivals whose prompts start with one of a few shared prefixes (prefix-cache hits)."""
    rng = random.Random(seed)
    heads = [[rng.randrange(1, 512) for _ in range(rng.randint(8, 30))] for _ in range(prefixes)]
    return sorted((rng.randrange(spread), rng.choice(heads) + [rng.randrange(1, 512) for _ in
                   range(rng.randint(1, 12))], rng.randint(1, 16), rng.choice(prios))
                  for _ in range(n))


SCENARIOS = {
    "preempt": Scenario("preempt", _cfg(max_seqs=8, max_batch_tokens=64, max_chunk=16),
                        _info(24), _arrivals(1, 24, 10)),
    "priority": Scenario("priority", _cfg(max_seqs=4, max_batch_tokens=48, aging_steps=4),
                         _info(64), _arrivals(2, 30, 40, prios=(0, 0, 3, 8))),
    "aborts": Scenario("aborts", _cfg(max_seqs=6, max_batch_tokens=40, prefill="whole"),
                       _info(40), _arrivals(3, 20, 15),
                       aborts=[(3, 0), (5, 4), (8, 7), (9, 7), (12, 15), (14, 99)]),
    "prefix": Scenario("prefix", _cfg(max_seqs=6, max_batch_tokens=48, max_chunk=16,
                                      aging_steps=4, prefix_cache=True),
                       _info(30), _shared(4, 30, 30), aborts=[(6, 2), (11, 9)]),
}


def record(sc: Scenario, path: Path, runner=None) -> dict[int, list[int]]:
    """Run the scenario to the end with a step log at `path`; outputs by request id."""
    from worker.null import NullRunner
    runner = runner or NullRunner(num_blocks=sc.info.num_blocks, block_size=sc.info.block_size)
    log = StepLog(str(path), log_meta(sc.cfg, sc.info))
    engine = sc.cfg.make_engine(sc.info, log)
    engine.runner = runner
    ids: list[int] = []
    arrivals, aborts = list(sc.arrivals), list(sc.aborts)
    try:
        while arrivals or aborts or engine.busy():
            step = engine.step_no
            while arrivals and arrivals[0][0] <= step:
                _, prompt, max_tokens, prio = arrivals.pop(0)
                try:
                    ids.append(engine.add(Request(prompt, max_tokens, prio), SamplingParams()))
                except AdmitError:
                    pass
            while aborts and aborts[0][0] <= step:
                _, nth = aborts.pop(0)
                if nth < len(ids):
                    engine.abort(ids[nth])
            engine.step()
    finally:
        log.close()
    return ids


def main(argv=None) -> int:
    out = Path((argv or sys.argv[1:] or ["tests/fixtures"])[0])
    out.mkdir(parents=True, exist_ok=True)
    for name, sc in SCENARIOS.items():
        path = out / f"golden_{name}.db"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        record(sc, path)
        with sqlite3.connect(path) as conn:  # one self-contained file, no -wal beside it
            conn.execute("PRAGMA journal_mode=DELETE")
        print(f"recorded {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
