"""Replaying an overlapped log (docs/design/overlap.md, "Overlapped scheduling"): the core
settled step N after planning N+1, so replay plans a row's step, then settles the row
before it with its logged tokens, then launches the row's step (or abandons it where the
log says the core did), in the core's order, and checks each state hash where the core
took it."""
from __future__ import annotations

from core.batch import fill_ahead
from core.overlap import ABANDON
from replay.checks import Divergence, check_hash, check_model_products, check_plan, check_tokens


class Ahead:
    def __init__(self, engine, log, runner=None, prompt: dict | None = None,
                 embedded: dict | None = None):
        self.engine, self.log, self.runner = engine, log, runner
        self.prompt = prompt or {}       # the log's prompt logprobs (LogFile.prompt_logprobs)
        self.embedded = embedded or {}   # the log's embeddings (LogFile.embeddings)
        self.pending = None              # (row, batch, logged tokens) of the launched step
        self.prev: tuple = (-1, None)    # the last settled step and its tokens

    def check(self, row) -> Divergence | None:
        """Plan row's step, settle the step before it, launch (or abandon) row's."""
        engine = self.engine
        batch, logged, div = check_plan(engine, row, self.runner)
        div = div or self.settle()
        if div is not None:
            return div
        if any(kind == ABANDON for kind, _ in self.log.inputs.get(row.step + 1, ())):
            engine.commit(None)
            return check_hash(engine, row)
        engine.launch()
        if engine.inflight is None:   # nothing to run: committed at launch
            return check_hash(engine, row)
        self.pending = (row, batch, logged)
        return None

    def drain(self) -> Divergence | None:
        """The log ends: its last step settled after a plan that has no row."""
        if self.pending is None:
            return None
        self.engine.plan(build=False)
        return self.settle()

    def settle(self) -> Divergence | None:
        if self.pending is None:
            return None
        row, batch, logged = self.pending
        self.pending = None
        result = None
        if batch is not None and logged is not None:
            fill_ahead(batch, *self.prev)   # what the worker filled from its last result
            div, result = check_tokens(batch, logged, row, self.runner)
            if div is not None:
                return div
            self.prev = (row.step, logged)
        vectors = self.embedded.get(row.step, {})
        done = self.engine.settle(logged, result, pooled=vectors)
        div = check_model_products(done, row.step, self.runner, self.prompt, vectors)
        return div or check_hash(self.engine, row)
