"""Re-run a step log and stop at the first step that differs from it.

Scheduler-only: a fresh engine built from `meta` gets the logged inputs at their steps and
the logged tokens back as the worker's answer; every ScheduleOutput and state hash must
match. With a model: the worker re-runs each rebuilt ForwardBatch and its sampled tokens
must equal the logged ones bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from core.batch import sampled_ids
from core.config import engine_from_meta
from core.engine import schedule_json
from core.ipc.protocol import SamplingParams
from core.logrecords import StepRecord
from core.sched import AdmitError, Request
from replay.logfile import LogFile
from replay.progress import Progress


@dataclass
class Divergence:
    step: int
    what: str        # "schedule" | "outputs" | "tokens" | "hash" | "input" | "steps"
    diffs: list[str] = field(default_factory=list)


@dataclass
class Verdict:
    steps: int
    divergence: Divergence | None = None

    @property
    def ok(self) -> bool:
        return self.divergence is None


def _apply_inputs(engine, log: LogFile, step: int) -> Divergence | None:
    for kind, seq_id in log.inputs.get(step, ()):
        if kind == "add":
            r = log.requests[seq_id]
            s = dict(r["sampling"])
            ignore_eos = s.pop("ignore_eos", False)
            try:
                got = engine.add(Request(r["prompt_tokens"], r["max_tokens"], r["priority"]),
                                 SamplingParams(**s), ignore_eos=ignore_eos,
                                 request_id=r["client_request_id"] or "")
            except AdmitError as e:
                return Divergence(step, "input", [f"request {seq_id} was refused: {e!r}"])
            if got != seq_id:
                return Divergence(step, "input", [f"add gave id {got}, the log says {seq_id}"])
        elif kind in ("abort", "stop"):  # to the scheduler a stop string's end is an abort
            if not engine.abort(seq_id):
                return Divergence(step, "input", [f"request {seq_id} was not running to {kind}"])
        elif kind == "restart":
            engine.restart()
    return None  # "abandon" is applied by the step before it (replay/ahead.py)


def _diff_schedule(got: dict, want: dict) -> list[str]:
    out = []
    for key in ("prefill", "decode", "preempted", "cached"):
        if got.get(key, []) != want.get(key, []):
            out.append(f"{key}: replay {got.get(key, [])} != log {want.get(key, [])}")
    return out


def check_plan(engine, row: StepRecord, runner):
    """Plan the row's step: (batch, the logged tokens or None for an abandoned step,
    Divergence or None)."""
    batch = engine.plan(build=runner is not None)
    got = schedule_json(engine.last_schedule, engine.last_hits)
    if got != row.schedule:
        return batch, None, Divergence(row.step, "schedule", _diff_schedule(got, row.schedule))
    logged = [tok for _, tok, _ in row.outputs]
    ids = sampled_ids(engine.last_schedule)
    if not logged and ids:
        logged = None  # the worker died during this step: the core abandoned it
    elif [o[0] for o in row.outputs] != ids:
        return batch, None, Divergence(row.step, "outputs", [
            f"the log's outputs are for requests {[o[0] for o in row.outputs]}, the replay"
            f" samples {ids}"])
    return batch, logged, None


def check_tokens(batch, logged, row: StepRecord, runner) -> Divergence | None:
    if batch is not None and batch.num_seqs and logged is not None:
        tokens = list(runner.execute(batch))
        if tokens != logged:
            bad = [f"request {o[0]}: replay token {t} != log {o[1]}"
                   for t, o in zip(tokens, row.outputs) if t != o[1]]
            return Divergence(row.step, "tokens", bad)
    return None


def check_hash(engine, row: StepRecord) -> Divergence | None:
    if engine.last_hash != row.hash:
        return Divergence(row.step, "hash", [f"state hash {engine.last_hash} != log {row.hash}"])
    return None


def _check_step(engine, row: StepRecord, runner) -> Divergence | None:
    batch, logged, div = check_plan(engine, row, runner)
    div = div or check_tokens(batch, logged, row, runner)
    if div is not None:
        return div
    engine.commit(logged)
    return check_hash(engine, row)


def verify(log: LogFile, runner=None, progress: bool = False) -> Verdict:
    engine = engine_from_meta(log.meta, runner)
    ahead = None
    if engine.overlap:
        from replay.ahead import Ahead  # it uses this module's checks
        ahead = Ahead(engine, log, runner)
    n = 0
    bar = Progress(log.num_steps(), "verify", enabled=progress)
    for row in log.steps():
        if row.step != n:
            return Verdict(n, Divergence(n, "steps", [f"step {n} missing (next is {row.step})"]))
        div = _apply_inputs(engine, log, row.step) or (
            ahead.check(row) if ahead else _check_step(engine, row, runner))
        if div is not None:
            bar.close()
            return Verdict(div.step, div)
        n += 1
        bar.update(n)
    bar.close()
    div = None if ahead is None else _apply_inputs(engine, log, n) or ahead.drain()
    return Verdict(n if div is None else div.step, div)
