"""scripts/bench overhead's reading of a run: its step log's steady steps (the step time,
the worker's own time for them), the log replayed in-process to time the engine's work and
a runner's forward, and the in-process costs of the codec, the null worker and logging."""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from scripts.benchmarks import _worker_times as wt
from scripts.benchmarks import common as bl

WARM_STEPS = 5        # full-batch steps skipped at the start


def mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


# ---------------------------------------------------------------- reading the log

def rows_of(log_path) -> list:
    from replay.logfile import LogFile
    log = LogFile(str(log_path))
    try:
        return list(log.steps())
    finally:
        log.close()


def full_batch(rows: list) -> int:
    """The batch of the steady state: the largest decode-only batch size that ran for at
    least 50 steps (or as long as any did). It is the request count when every request
    ran together; less when some reached the engine after others had finished."""
    from collections import Counter
    counts = Counter(len(r.schedule["decode"]) for r in rows if not r.schedule["prefill"])
    if not counts:
        return 0
    enough = min(50, max(counts.values()))
    return max(n for n, c in counts.items() if c >= enough)


def is_full(row, batch: int) -> bool:
    return not row.schedule["prefill"] and len(row.schedule["decode"]) == batch


def worker_ms(times: Path, rows: list) -> float:
    """The worker's mean time per batch over the steps `rows` (a "step ms" line each)."""
    by_step = {t.step: t.ms for t in wt.read(times)}
    missing = [r.step for r in rows if r.step not in by_step]
    if missing:
        raise RuntimeError(f"the worker's times lack steps {missing[:5]}")
    return mean(by_step[r.step] for r in rows)


def log_step_ms(rows: list, batch: int, worker_times: Path | None = None) -> dict:
    """Mean wall-time delta between consecutive full-batch steps, and their duration_ms;
    with `worker_times`, the worker's mean time for the same steps (worker_ms)."""
    full = [r for r in rows if is_full(r, batch)][WARM_STEPS:]
    deltas = [(b.wall_time - a.wall_time) * 1e3 for a, b in zip(full, full[1:])
              if b.step == a.step + 1]
    if len(deltas) < 10:
        raise RuntimeError(f"only {len(deltas)} consecutive full-batch steps: raise --steps")
    fig = {"step_ms": mean(deltas), "step_ms_p50": bl.percentile(deltas, 50),
           "duration_ms": mean(r.duration_ms for r in full), "steady_steps": len(deltas)}
    if worker_times is not None:
        fig["worker_ms"] = worker_ms(worker_times, full)
    return fig


@dataclass
class Window:
    """The steady steps in wall time (the step log's clock, time.time()): from the first
    to the last measured full-batch step; `steps` and `deltas` (one per request that got
    a token in a step) are those after t0 up to t1."""
    t0: float
    t1: float
    steps: int
    deltas: int

    @property
    def seconds(self) -> float:
        return self.t1 - self.t0


def steady_window(rows: list, batch: int) -> Window:
    full = [r for r in rows if is_full(r, batch)][WARM_STEPS:]
    if len(full) < 2:
        raise RuntimeError("fewer than two steady full-batch steps: raise --steps")
    first, last = full[0], full[-1]
    inside = [r for r in rows if first.step < r.step <= last.step]
    deltas = sum(len({seq_id for seq_id, _, _ in r.outputs}) for r in inside)
    return Window(first.wall_time, last.wall_time, len(inside), deltas)


def arrival_spread(log_path) -> int:
    """Steps between the first and the last add of the measured requests (the first two
    adds are the warm-up)."""
    from replay.logfile import LogFile
    log = LogFile(str(log_path))
    try:
        adds = sorted(s for s, items in log.inputs.items() for k, _ in items if k == "add")
    finally:
        log.close()
    return adds[-1] - adds[2] if len(adds) > 2 else 0


# ---------------------------------------------------------------- replaying the log

@dataclass
class Replayed:
    engine_ms: list = field(default_factory=list)      # plan + commit, full-batch steps
    forward_ms: list = field(default_factory=list)     # runner.execute, full-batch steps
    batch: object = None                               # one full-batch ForwardBatch
    events: list = field(default_factory=list)         # its scheduler events
    mismatches: int = 0                                # steps whose tokens differ from the log
    total_s: float = 0.0                               # the whole replay, log closed
    steps: int = 0


def replay(log_path, batch: int, runner=None, log_to: str | None = None) -> Replayed:
    """Re-run the log's steps in-process (as replay/verify does), timing the engine's own
    work and, with a runner, runner.execute, on the full-batch steps. `log_to`: write a
    new step log there as the core would (its cost lands in total_s)."""
    from core.config import engine_from_meta
    from core.steplog import StepLog
    from replay.logfile import LogFile
    from replay.verify import _apply_inputs

    log = LogFile(str(log_path))
    out = Replayed()
    rows = list(log.steps())
    start = time.perf_counter()
    steplog = StepLog(log_to, log.meta) if log_to else None
    try:
        engine = engine_from_meta(log.meta, log=steplog)
        one = _replay_ahead if engine.overlap else _replay_step
        ahead: dict = {"pending": None, "prev": (-1, None)}
        for row in rows:
            _apply_inputs(engine, log, row.step)
            one(engine, row, runner, is_full(row, batch), out, ahead)
        if steplog is not None:
            steplog.close()
    finally:
        log.close()
    out.total_s, out.steps = time.perf_counter() - start, len(rows)
    out.engine_ms, out.forward_ms = out.engine_ms[WARM_STEPS:], out.forward_ms[WARM_STEPS:]
    return out


def _replay_step(engine, row, runner, full: bool, out: Replayed, _ahead) -> None:
    logged = [tok for _, tok, _ in row.outputs]
    t0 = time.perf_counter()
    fb = engine.plan()
    t1 = time.perf_counter()
    if runner is not None and fb.num_seqs:
        tokens = list(runner.execute(fb))
        out.mismatches += tokens != logged
    t2 = time.perf_counter()
    events = engine.commit(logged).events
    t3 = time.perf_counter()
    if full:
        out.engine_ms.append(((t1 - t0) + (t3 - t2)) * 1e3)
        if runner is not None:
            out.forward_ms.append((t2 - t1) * 1e3)
        if out.batch is None and len(out.engine_ms) > WARM_STEPS:
            out.batch, out.events = fb, events


def _replay_ahead(engine, row, runner, full: bool, out: Replayed, ahead: dict) -> None:
    """An overlapped log in the core's order (replay/ahead.py): plan this row's step,
    run and settle the one before it, launch this one. The engine's time is plan + settle
    + launch; the forward's, the step before's batch."""
    from core.batch import fill_ahead
    t0 = time.perf_counter()
    fb = engine.plan()
    forward_s, events = 0.0, []
    if ahead["pending"] is not None:
        prow, pfb = ahead["pending"]
        logged = [tok for _, tok, _ in prow.outputs]
        if runner is not None and pfb.num_seqs:
            fill_ahead(pfb, *ahead["prev"])
            t = time.perf_counter()
            tokens = list(runner.execute(pfb))
            forward_s = time.perf_counter() - t
            out.mismatches += tokens != logged
        ahead["prev"] = (prow.step, logged)
        events = engine.settle(logged).events
    engine.launch()
    ahead["pending"] = (row, fb) if engine.inflight is not None else None
    if full:
        out.engine_ms.append((time.perf_counter() - t0 - forward_s) * 1e3)
        if runner is not None:
            out.forward_ms.append(forward_s * 1e3)
        if out.batch is None and len(out.engine_ms) > WARM_STEPS:
            out.batch, out.events = fb, events


# ---------------------------------------------------------------- in-process costs

def _timed_ms(fn, reps: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) * 1e3 / reps


def step_events(events: list):
    """The StepEvents the core publishes for a step's scheduler events (fid = seq_id here)."""
    from core.ipc.protocol import I32, StepEvents
    from core.sched import Finished, TokenEvent
    fids, toks, fin = I32(), I32(), []
    for ev in events:
        if isinstance(ev, TokenEvent):
            fids.append(ev.id)
            toks.append(ev.token)
        elif isinstance(ev, Finished):
            fin.append([ev.id, ev.reason.value])
    return StepEvents(fids=fids, tokens=toks, finished=fin)


def codec_ms(fb, events: list, reps: int = 200) -> dict:
    """msgpack costs of one step's messages, timed in this process."""
    from core.ipc.protocol import ForwardBatch, I32, StepEvents, StepResult, decode, encode
    res = StepResult(step=fb.step, tokens=I32([1] * len(fb.sample_rows)))
    ev = step_events(events)
    b_fb, b_sr, b_ev = encode(fb), encode(res), encode(ev)
    lim = 1 << 30
    return {"forward_batch_bytes": len(b_fb), "step_events_bytes": len(b_ev),
            "forward_batch_encode": _timed_ms(lambda: encode(fb), reps),
            "forward_batch_decode": _timed_ms(lambda: decode(b_fb, (ForwardBatch,), lim), reps),
            "step_result_encode": _timed_ms(lambda: encode(res), reps),
            "step_result_decode": _timed_ms(lambda: decode(b_sr, (StepResult,), lim), reps),
            "step_events_encode": _timed_ms(lambda: encode(ev), reps),
            "step_events_decode": _timed_ms(lambda: decode(b_ev, (StepEvents,), lim), reps)}


def null_execute_ms(fb, reps: int = 200) -> float:
    from worker.null import NullRunner
    r = NullRunner()
    return _timed_ms(lambda: r.execute(fb), reps)


def logging_inproc_ms(log_path, batch: int, bare: Replayed) -> float:
    """Per step: replaying the log while writing a new step log, minus replaying it bare
    (the writer thread's work and the loop's appends, run to completion)."""
    with tempfile.TemporaryDirectory() as tmp:
        logged = replay(log_path, batch, log_to=str(Path(tmp) / "steps.db"))
    return (logged.total_s - bare.total_s) * 1e3 / max(1, bare.steps)
