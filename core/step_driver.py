"""The step, driven once: plan -> forward -> commit, or overlapped (plan N+1 while the
worker runs N), over a runner that is local (a model in this process: offline mode and
tests) or remote (the worker process: the core's loop). `drive` picks the loop written
for the engine, as vLLM's core does with its `step_fn`; replay drives the same engine
calls with its checks between them (replay/checks.py, replay/ahead.py).

A runner has two calls: `submit(batch)` hands a step over; `collect(step, rows)` returns
that step's StepResult (the remote one raises WorkerDied when the worker is gone).
"""
from __future__ import annotations

from collections import deque

from core.batch import fill_ahead
from core.step_commit import StepCommit


class PlanFailed(Exception):
    """The planned step's batch could not be built (a bug). `settled`: what the step
    settled before it (overlapped), which the caller still delivers."""

    def __init__(self, cause: Exception, settled: StepCommit | None = None):
        super().__init__(repr(cause))
        self.cause, self.settled = cause, settled or StepCommit()


def drive(engine, runner) -> StepCommit:
    step_fn = overlapped_step if engine.overlap else sync_step
    return step_fn(engine, runner)


def _plan(engine):
    try:
        return engine.plan(), None
    except Exception as e:   # a bug must fail the step's requests, not the engine
        return None, e


def sync_step(engine, runner) -> StepCommit:
    batch, failed = _plan(engine)
    if failed is not None:
        raise PlanFailed(failed)
    if not batch.num_seqs:
        return engine.commit([])
    runner.submit(batch)
    result = runner.collect(batch.step, len(batch.sample_rows))
    return engine.commit(result.tokens, result)


def overlapped_step(engine, runner) -> StepCommit:
    """Plan N+1 and submit it at once (it waits in the worker's queue), then collect and
    settle N, then launch N+1 (docs/design/overlap.md, "Overlapped scheduling")."""
    batch, failed = _plan(engine)
    if batch is not None and batch.num_seqs:
        runner.submit(batch)
    settled = StepCommit()
    if engine.inflight is not None:
        f = engine.inflight
        result = runner.collect(f.step, len(f.ids))
        settled = engine.settle(result.tokens, result)
    if failed is not None:
        raise PlanFailed(failed, settled)
    return settled.then(engine.launch())


class LocalRunner:
    """A model in this process (`run(batch)` -> StepResult, or a test runner's
    `execute(batch)` -> tokens). Submitted batches run when collected, oldest first; an
    overlapped batch's placeholders are filled from the step before it, as the worker
    fills them from its last result."""

    def __init__(self, model):
        self.model = model
        self._queue: deque = deque()
        self._prev: tuple[int, object] = (-1, None)   # the last run step and its tokens

    def submit(self, batch) -> None:
        self._queue.append(batch)

    def lose(self) -> None:
        """The model is replaced (a test's lost worker): nothing submitted survives, and
        the new one remembers no tokens."""
        self._queue.clear()
        self._prev = (-1, None)

    def collect(self, step: int, rows: int):
        batch = self._queue.popleft()
        if batch.step != step:
            raise ValueError(f"collected step {step}, but step {batch.step} was submitted")
        fill_ahead(batch, *self._prev)
        run = getattr(self.model, "run", None)
        result = run(batch) if run is not None else _Tokens(self.model.execute(batch))
        self._prev = (batch.step, result.tokens)
        return result


class _Tokens:
    """A test runner's bare tokens as a StepResult (no logprobs, no drafts)."""
    logprobs = drafts = ()

    def __init__(self, tokens):
        self.tokens = tokens
