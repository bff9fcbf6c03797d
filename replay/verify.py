"""Re-run a step log and stop at the first step that differs from it.

Scheduler-only: a fresh engine built from `meta` gets the logged inputs at their steps and
the logged tokens back as the worker's answer; every ScheduleOutput and state hash must
match. With a model: the worker re-runs each rebuilt ForwardBatch and its sampled tokens,
and the prompt logprobs the step delivered, must equal the logged ones bit for bit.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from core.config import engine_from_meta
from core.ipc.protocol import SamplingParams
from core.sched import AdmitError, Request
from replay.ahead import Ahead
from replay.checks import Divergence, check_step
from replay.logfile import LogFile
from replay.progress import Progress


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
            embed = s.pop("embed", False)
            try:
                got = engine.add(Request(r["prompt_tokens"], r["max_tokens"], r["priority"],
                                         cache_salt=r["cache_salt"], embed=embed),
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


def verify(log: LogFile, runner=None, progress: bool = False) -> Verdict:
    engine = engine_from_meta(log.meta, runner)
    prompt = log.prompt_logprobs() if runner is not None else {}
    embedded = log.embeddings()
    ahead = None
    if engine.overlap:
        ahead = Ahead(engine, log, runner, prompt, embedded)
    n = 0
    bar = Progress(log.num_steps(), "verify", enabled=progress and sys.stderr.isatty())
    for row in log.steps():
        if row.step != n:
            return Verdict(n, Divergence(n, "steps", [f"step {n} missing (next is {row.step})"]))
        div = _apply_inputs(engine, log, row.step) or (
            ahead.check(row) if ahead else check_step(engine, row, runner, prompt, embedded))
        if div is not None:
            bar.close()
            return Verdict(div.step, div)
        n += 1
        bar.update(n)
    bar.close()
    div = None if ahead is None else _apply_inputs(engine, log, n) or ahead.drain()
    return Verdict(n if div is None else div.step, div)
