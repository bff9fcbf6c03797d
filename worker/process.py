"""The worker process: ForwardBatch in, StepResult out; stateless apart from the KV cache."""
from __future__ import annotations

import os
import sys
import time

import zmq

from core.batch import fill_ahead
from core.ipc.channel import Channel
from core.ipc.protocol import (ForwardBatch, GrammarReady, PrepareGrammar, ProtocolError,
                               Shutdown, WorkerReady)
from worker.grammar_builds import GrammarBuilds
from worker.malloc import IdleTrim
from worker.step_pulse import StepPulse


def _log(msg: str) -> None:
    print(f"[worker] {msg}", file=sys.stderr, flush=True)


# A file: one "step ms mask_ms" line per batch run (benchmarks): the worker's time from
# receiving the batch to its result, and the part of it in the constrained rows' grammars.
TIMES_ENV = "TL_WORKER_TIMES"


def _grammar_s(runner) -> float:
    """Seconds the runner has spent in its grammars (worker/grammar.py); the null runner
    has none."""
    g = getattr(runner, "grammars", None)
    return g.spent_s if g is not None else 0.0


def _builds(runner, ctx: zmq.Context, to_core: str) -> GrammarBuilds | None:
    """The thread that builds grammars off the step path; None for the null runner, which
    has no grammars (it answers PrepareGrammar at once)."""
    g = getattr(runner, "grammars", None)
    if g is None:
        return None
    return GrammarBuilds(g, lambda: Channel(ctx, zmq.PUSH, to_core, bind=False), os.getpid())


def serve(runner, ctx: zmq.Context, to_core: str, from_core: str) -> None:
    """Report readiness, then answer every ForwardBatch until Shutdown; PrepareGrammar
    between them starts a grammar's build off the step path (worker/grammar_builds.py)."""
    out = Channel(ctx, zmq.PUSH, to_core, bind=False, max_bytes=1 << 30)
    inp = Channel(ctx, zmq.PULL, from_core, bind=False,
                  accept=(ForwardBatch, PrepareGrammar, Shutdown), max_bytes=1 << 30)
    times = open(os.environ[TIMES_ENV], "a", buffering=1) if os.environ.get(TIMES_ENV) else None
    builds = _builds(runner, ctx, to_core)
    pulse = StepPulse(lambda: Channel(ctx, zmq.PUSH, to_core, bind=False), os.getpid())
    try:
        out.send(WorkerReady(info=runner.info, pid=os.getpid()))
        last = None   # the last StepResult: an overlapped batch's placeholders come from it
        idle = IdleTrim()
        while True:
            idle.wait(inp.poll)
            try:
                msg = inp.recv()
            except ProtocolError as e:
                _log(f"dropped a bad frame: {e}")
                continue
            if isinstance(msg, Shutdown):
                return
            if isinstance(msg, PrepareGrammar):
                if builds is None or (not builds.prepare(msg) and builds.grammars.holds(msg.key)):
                    out.send(GrammarReady(key=msg.key, pid=os.getpid()))
                continue
            t0 = time.perf_counter()
            mask0 = _grammar_s(runner)
            if not fill_ahead(msg, *((last.step, last.tokens) if last else (-1, None))):
                _log(f"step {msg.step} wants the tokens of step {msg.prev_step}, which this"
                     " worker did not run: a stale batch, run on zeros")
            pulse.begin(msg.step)
            last = runner.run(msg)
            pulse.end()
            idle.step_ran()
            if times is not None:
                times.write(f"{msg.step} {(time.perf_counter() - t0) * 1e3:.3f} "
                            f"{(_grammar_s(runner) - mask0) * 1e3:.3f}\n")
            out.send(last)
    finally:
        pulse.close()
        if builds is not None:
            builds.close()
        if times is not None:
            times.close()
        out.close()
        inp.close()
