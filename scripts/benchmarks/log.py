"""scripts/bench log: what the step log costs the step loop, replay speed, bytes per token.

Runs one workload through the offline engine with the null runner (no model work), with
and without a step log, alternating repeats so that machine noise hits both alike; then
replays the log scheduler-only.
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path


from core import cli
from core.config import CoreConfig, log_meta
from core.ipc.protocol import ModelInfo, SamplingParams
from core.sched import Request
from core.steplog import CHECKPOINT_S, StepLog
from replay.logfile import LogFile
from replay.verify import verify
from scripts.benchmarks import _provenance as prov
from scripts.benchmarks import common as bl
from worker.null import NullRunner

INFO = ModelInfo(model="null", num_blocks=4096, block_size=16, max_model_len=2048,
                 vocab_size=512, eos_ids=[])
CFG = CoreConfig("-", "-", "-", "-", max_seqs=64, max_batch_tokens=2048)


def run(n: int, path: Path | None, checkpoint_s: float = CHECKPOINT_S) -> tuple[float, int, int]:
    """(seconds in the step loop, steps, generated tokens)."""
    rng = random.Random(0)
    log = StepLog(str(path), log_meta(CFG, INFO), checkpoint_s=checkpoint_s) if path else None
    engine = CFG.make_engine(INFO, log)
    engine.runner = NullRunner(num_blocks=INFO.num_blocks)
    for _ in range(n):
        prompt = [rng.randrange(1, 512) for _ in range(rng.randint(16, 256))]
        engine.add(Request(prompt, rng.randint(16, 128)), SamplingParams())
    t0 = time.perf_counter()
    steps, toks = 0, 0
    while engine.busy():
        toks += sum(1 for _ in engine.step().events if type(_).__name__ == "TokenEvent")
        steps += 1
    dt = time.perf_counter() - t0
    if log:
        log.close()
    return dt, steps, toks


def main(argv=None) -> int:
    p = cli.parser(prog="scripts/bench log")
    p.add_argument("--requests", type=int, default=256, help="requests in the workload")
    p.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    p.add_argument("--checkpoint-s", type=float, default=CHECKPOINT_S,
                   help="the writer's WAL checkpoint period ('inf': none but SQLite's own)")
    p.add_argument("--json", default=None, help="write the figures here as JSON")
    prov.add_allow_dirty(p)
    a = p.parse_args(argv)
    start = prov.begin("log", a.json, a.allow_dirty)
    tmp = Path(tempfile.mkdtemp(prefix="tl-bench-log-"))
    off, on = [], []
    for i in range(a.repeats):
        off.append(run(a.requests, None))
        on.append(run(a.requests, tmp / f"log{i}.db", a.checkpoint_s))
    best_off = min(off)
    best_on = min(on)
    steps, toks = best_on[1], best_on[2]
    log = LogFile(str(tmp / "log0.db"))
    t0 = time.perf_counter()
    assert verify(log).ok
    replay_s = time.perf_counter() - t0
    size = (tmp / "log0.db").stat().st_size
    fig = {"steps": steps, "tokens": toks,
           "step_us_nolog": best_off[0] / steps * 1e6, "step_us_log": best_on[0] / steps * 1e6,
           "log_overhead": best_on[0] / best_off[0] - 1,
           "replay_steps_per_s": steps / replay_s, "log_bytes_per_token": size / toks}
    print(f"workload: {a.requests} requests, {steps} steps, {toks} tokens (null runner, 64 seqs)")
    print(f"  step loop without log : {fig['step_us_nolog']:8.1f} us/step")
    print(f"  step loop with log    : {fig['step_us_log']:8.1f} us/step"
          f"  (+{fig['log_overhead'] * 100:.1f}%)")
    print(f"  replay (scheduler)    : {fig['replay_steps_per_s']:8.0f} steps/s")
    print(f"  log size              : {fig['log_bytes_per_token']:8.1f} bytes/token")
    if a.json:
        bl.write_json(a.json, prov.stamp(fig, start, "null"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
