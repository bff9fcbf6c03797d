"""The engine with overlapped scheduling: step N+1 is planned while the worker runs step N
(docs/design/overlap.md, "Overlapped scheduling").

A step's life: `plan` (schedule, build the batch) -> `launch` (the scheduler advances it
with placeholder tokens; the step is now in flight) -> `settle` (its real tokens arrive,
after the next step was planned: they replace the placeholders, finish requests, and the
step is logged). The caller's order, which the core, the offline `step` and replay all keep:

    plan N+1, settle N (or roll it back), launch N+1 (or abandon it)

A step with nothing to run is committed at launch. Rows are logged at settle, so the state
hash of step N is taken after N+1 was planned.
"""
from __future__ import annotations

from dataclasses import dataclass

from core.batch import sampled_ids
from core.engine import Engine
from core.ipc.protocol import ForwardBatch
from core.sched import ScheduleOutput
from core.step_commit import StepCommit, embeddings_of, extras_of

ABANDON = "abandon"   # the input logged when a planned step is dropped without launching


@dataclass(frozen=True)
class InFlight:
    """A launched step waiting for its tokens."""
    out: ScheduleOutput
    step: int
    t0: float                # when it was planned (its log row's duration runs from there)
    ids: list[int]           # its sample rows' requests, in the worker's token order
    hits: list               # its admissions' prefix-cache hits, for its log row
    spans: list              # its prompt-logprob positions (core/prompt_logprobs.py)


class OverlapEngine(Engine):
    overlap = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.inflight: InFlight | None = None
        self._gone: list[int] = []   # ended requests whose sampling a row in flight may need

    def busy(self) -> bool:
        return self.inflight is not None or self.sched.has_unfinished()

    def plan(self, build: bool = True) -> ForwardBatch | None:
        batch = super().plan(build)
        if batch is not None and self.inflight is not None:
            batch.prev_step = self.inflight.step
        return batch

    def launch(self) -> StepCommit:
        """The planned step goes to the worker. One with nothing to run commits at once
        (its events, none of them tokens); else it is in flight and settles later."""
        out, step, t0 = self._planned
        if not out.decode and not out.prefill:
            return self.commit([])
        self._planned = None
        ids = sampled_ids(out)
        self.sched.on_step_ahead(ids)
        self.inflight = InFlight(out, step, t0, ids, self.last_hits, self._spans)
        return StepCommit()

    def abandon(self) -> None:
        """Drop the planned step without launching it (its batch failed to build, or the
        step in flight before it was lost); logged, so that replay does the same."""
        self.log.input(self.step_no, ABANDON, None)
        self.commit(None)

    def lose_worker(self) -> None:
        """The step in flight is rolled back, the planned one abandoned."""
        if self.inflight is not None:
            self.settle(None)
        if self._planned is not None:
            self.abandon()

    def settle(self, tokens, result=None, pooled=()) -> StepCommit:
        """The in-flight step's tokens (None: it was lost with its worker, and its
        placeholders are rolled back); logs the step, returns what it produced. `pooled`:
        as Engine.commit's."""
        f, self.inflight = self.inflight, None
        gone, self._gone = self._gone, []
        ids, outs = f.ids, []
        done = StepCommit()
        if tokens is None:
            self.sched.rollback(f.step)
            self._forget_cache()
        else:
            if len(ids) != len(tokens):
                raise ValueError(f"worker returned {len(tokens)} tokens for {len(ids)} rows")
            done.extras = extras_of(ids, result, self._sampling)
            done.prompt_logprobs = self._deliver(f.spans, result)
            done.embeddings = embeddings_of(f.out.pooled, result, pooled)
            outputs, outs = self._outputs(ids, tokens)
            done.events = self.sched.settle(f.step, outputs, [i for i, _ in done.embeddings])
        self._record(f.step, f.out, outs, f.t0, done, f.hits)
        done.finished = self._finish(done.events, f.step)
        for seq_id in gone:
            self._sampling.pop(seq_id, None)
        return done

    def _pop(self, seq_id: int):
        """As Engine's, but the request's sampling stays until the step in flight (and,
        for one ending in a settle, the next one) settles: its row there may have asked
        for logprobs, whose count lays out the result's alternatives."""
        self._gone.append(seq_id)
        self._stop_ids.pop(seq_id, None)
        self.prompt_lp.drop(seq_id)
        return self.live.pop(seq_id, None)
