"""The engine loop without sockets: scheduler + a runner, one step at a time.

The core process drives the same object (plan -> remote worker -> commit); the offline
mode calls `step()` with an in-process runner; replay feeds recorded inputs to it. External
inputs (adds, aborts, restarts) are applied between steps and are recorded with the step
they precede, which together with stateless sampling makes a run replayable.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field, replace
from operator import attrgetter

from core.batch import build_batch, sampled_ids
from core.bounds import INT32_MAX, SEED_MASK
from core.first_samples import FirstSamples
from core.ipc.protocol import ForwardBatch, SamplingParams
from core.logrecords import FORMAT, EmbeddingRecord, PromptLogprobsRecord, StepRecord
from core.prompt_logprobs import PromptLogprobs
from core.request_metrics import RequestClock
from core.step_times import StepTimes
from core.sched import (Finished, InvalidRequest, Request, ScheduleOutput, Scheduler,
                        StepOutput, TokenEvent)
from core.speculate import PENDING, kept_rows
from core.state_hash import schedule_json, state_hash
from core.step_commit import StepCommit, embeddings_of, extras_of
from core.step_driver import LocalRunner, PlanFailed, drive
from core.table_growth import KeptTables, TableLedger



def check_ranges(req: Request, sampling: SamplingParams) -> None:
    """What the batch's int32/int64 columns and the log's integers can hold. The frontend
    checks tighter bounds (vocabulary, max_model_len); this keeps a value that slipped past
    it from failing later, inside a step or the log writer, where it would hurt others."""
    t, p, k, s = sampling.temperature, sampling.top_p, sampling.top_k, sampling.seed
    if not isinstance(req.max_tokens, int) or not 1 <= req.max_tokens <= SEED_MASK:
        raise InvalidRequest(f"max_tokens must be in [1, 2**63), got {req.max_tokens!r}",
                             "max_tokens")
    if not isinstance(t, (int, float)) or not 0 <= t < float("inf"):
        raise InvalidRequest(f"temperature must be finite and >= 0, got {t!r}", "temperature")
    if not isinstance(p, (int, float)) or not 0 < p <= 1:
        raise InvalidRequest(f"top_p must be in (0, 1], got {p!r}", "top_p")
    if not isinstance(k, int) or not 0 <= k <= INT32_MAX:
        raise InvalidRequest(f"top_k must be in [0, 2**31), got {k!r}", "top_k")
    if s is not None and (not isinstance(s, int) or not 0 <= s <= SEED_MASK):
        raise InvalidRequest(f"seed must be in [0, 2**63), got {s!r}", "seed")
    n = sampling.prompt_logprobs
    if n is not None and (not isinstance(n, int) or not 0 <= n <= INT32_MAX):
        raise InvalidRequest(f"prompt_logprobs must be in [0, 2**31), got {n!r}",
                             "prompt_logprobs")


def derive_seed(engine_seed: int, seq_id: int) -> int:
    """The seed of a sampled request that brought none: a function of (--seed, id)."""
    h = hashlib.blake2b(f"{engine_seed}:{seq_id}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & SEED_MASK


def _fill_drafts(drafts: dict, flat: list[int]) -> None:
    """The worker's draft-model drafts (StepResult.drafts) in place of the PENDING ones,
    in decode order: the order of the batch's draft_seqs. None PENDING: replay has filled
    them from the log (Engine.fill_drafts) and checked the worker's against them."""
    pending = [i for i, d in drafts.items() if d and d[0] == PENDING]
    wanted = sum(len(drafts[i]) for i in pending)
    if pending and wanted != len(flat):
        raise ValueError(f"worker returned {len(flat)} drafts for {wanted} placeholders")
    o = 0
    for i in pending:
        drafts[i], o = flat[o:o + len(drafts[i])], o + len(drafts[i])


def speculative(sampling: SamplingParams) -> bool:
    """Whether a request may be verified with drafts: not when it opted out, nor when a
    row's logits depend on the tokens before it in ways the drafts' rows would not see
    (penalties, min_tokens bans, a grammar; docs/design/scheduler.md, "Speculative decoding")."""
    return (sampling.speculative is True and not sampling.penalized
            and not sampling.min_tokens and sampling.constraint is None)


class NullLog:
    """The step log's interface; this one records nothing and is always healthy.

    `problem`, `refusal()` and `abort_reason()` are None or a one-line reason: the log
    cannot be written / a new request must be refused / the requests in flight must be
    aborted (core/steplog.py)."""

    problem = None

    path = None
    def add_request(self, seq_id, request_id, arrival, req, sampling, ignore_eos,
                    user=None, arrival_time=None, key_hash=None): pass
    def input(self, step, kind, seq_id): pass
    def step(self, record: StepRecord): pass
    def prompt_logprobs(self, record: PromptLogprobsRecord): pass
    def embedding(self, record: EmbeddingRecord): pass
    def finish(self, seq_id, step, reason, output_tokens): pass
    def flush(self): pass
    def close(self): pass
    def refusal(self) -> str | None: return None
    def abort_reason(self) -> str | None: return None


@dataclass
class _Live:
    sampling: SamplingParams
    stop_ids: frozenset[int]      # tokens that finish it: EOS (unless ignore_eos), stop_token_ids
    clock: RequestClock
    output: list[int] = field(default_factory=list)


class Engine:
    overlap = False   # core/overlap.py's OverlapEngine plans a step while the last one runs

    def __init__(self, sched: Scheduler, runner=None, *, eos_ids=(), seed: int = 0, log=None,
                 log_format: int = FORMAT):
        self.sched, self.runner = sched, runner
        # the state hash of this log format (replay of an older log computes the old one)
        self._ledger = TableLedger() if log_format >= 3 else None
        self.eos_ids = frozenset(eos_ids)
        self.seed = seed
        self.log = log or NullLog()
        self.live: dict[int, _Live] = {}
        self.last_hash = ""
        self.step_ms_total = 0.0  # time spent inside plan..commit, summed over steps
        self.step_times = StepTimes()   # the same, per step, as a histogram
        self.last_schedule: ScheduleOutput | None = None
        self.last_hits: list[list[int]] = []   # the last plan's prefix-cache hits
        self._planned: tuple[ScheduleOutput, int, float] | None = None
        # seq_id -> its live entry's sampling / stop_ids: plain dicts, read per row per step
        self._sampling: dict[int, SamplingParams] = {}
        self._tables = KeptTables()
        self._firsts = FirstSamples()
        self._stop_ids: dict[int, frozenset[int]] = {}
        self.prompt_lp = PromptLogprobs()
        self._spans: list = []                          # the planned step's prompt positions
        self._local: LocalRunner | None = None          # offline: `runner` as a step runner

    def busy(self) -> bool:
        """Some request is unfinished (or, overlapped, a step is in flight)."""
        return self.sched.has_unfinished()

    @property
    def step_no(self) -> int:
        return self.sched.stats().steps

    # ---- inputs, applied between steps

    def add(self, req: Request, sampling: SamplingParams | None = None, *,
            ignore_eos: bool = False, request_id: str = "", user: str | None = None,
            arrival_time: float | None = None, key_hash: str | None = None) -> int:
        """Admit to the queue; raises the scheduler's AdmitError unchanged. arrival_time:
        wall clock when the core received it (read mid-step, it is added after the step);
        key_hash: the API key's short hash the gateway gave it (logged only)."""
        sampling = sampling or SamplingParams()
        check_ranges(req, sampling)
        if req.embed and (sampling.prompt_logprobs is not None or sampling.constraint is not None):
            raise InvalidRequest("an embedding has no prompt_logprobs or constraint", "embed")
        if sampling.prompt_logprobs is not None:   # a cached prefix has no logits to give
            req = replace(req, cache_hits=False)
        if not speculative(sampling):
            req = replace(req, speculative=False)
        seq_id = self.sched.add(req)
        if sampling.prompt_logprobs is not None:
            self.prompt_lp.add(seq_id, sampling.prompt_logprobs, len(req.prompt))
        if sampling.temperature > 0 and sampling.seed is None:
            sampling = replace(sampling, seed=derive_seed(self.seed, seq_id))
        step = self.step_no
        stops = frozenset(sampling.stop_token_ids or ()).union(() if ignore_eos else self.eos_ids)
        self._sampling[seq_id], self._stop_ids[seq_id] = sampling, stops
        self.live[seq_id] = _Live(sampling, stops,
                                  RequestClock(time.monotonic(), step, req.priority))
        self.log.add_request(seq_id, request_id, step, req, sampling, ignore_eos, user,
                             arrival_time, key_hash)
        self.log.input(step, "add", seq_id)
        return seq_id

    def abort(self, seq_id: int) -> bool:
        """True when seq_id was unfinished (and is now aborted)."""
        return self._end(seq_id, "abort", None) is not None

    def stop(self, seq_id: int, num_tokens: int) -> dict | None:
        """A stop string ended seq_id after num_tokens generated tokens: it finishes with
        reason "stop" and that many tokens. Its metrics, or None when it was finished."""
        return self._end(seq_id, "stop", num_tokens)

    def _end(self, seq_id: int, kind: str, num_tokens: int | None) -> dict | None:
        live = self._pop(seq_id)
        if live is None:
            return None
        self.sched.abort(seq_id)
        step = self.step_no
        self.log.input(step, kind, seq_id)
        self.log.finish(seq_id, step, kind, live.output[:num_tokens])
        return self._figures(seq_id, live)

    def _figures(self, seq_id: int, live: _Live) -> dict:
        path = self.log.path
        return live.clock.figures(path, seq_id if path is not None else None)

    def abort_all(self) -> None:
        """Shutting down: every unfinished request is aborted (and its blocks freed)."""
        for seq_id in list(self.live):
            self.abort(seq_id)

    def constraints(self) -> list:
        """Each unfinished request's constraint (None where it has none)."""
        return [live.sampling.constraint for live in self.live.values()]

    def restart(self) -> list[int]:
        """A new worker: every running request is preempted and later recomputed."""
        self.log.input(self.step_no, "restart", None)
        return self.sched.preempt_all()

    # ---- one step

    def plan(self, build: bool = True) -> ForwardBatch | None:
        """Schedule one step and build its batch (skipped with build=False: replay
        without a model needs only the schedule)."""
        t0 = time.perf_counter()
        out = self.sched.schedule()
        step = self.step_no - 1
        self._planned = (out, step, t0)   # set first: a batch that fails to build is abandoned
        self.last_schedule = out
        self.last_hits = list(self.sched.last_hits)
        self._clock(out, step)
        self._spans = self.prompt_lp.spans(out, len(out.decode))
        if not build:
            return None
        batch = build_batch(step, out, self.sched, self._sampling, self._stop_ids,
                            self._tables, self._firsts)
        if self._spans:
            self.prompt_lp.fill(batch, self._spans, self.sched.tokens)
        return batch

    def commit(self, tokens, result=None, pooled=()) -> StepCommit:
        """Apply the worker's tokens for the planned step; returns all the step produced
        (the scheduler's events, finished requests' metrics, logprobs from `result`, the
        worker's StepResult).

        tokens=None abandons the step (its worker died): no outputs; the restart that
        follows preempts every running request, which then recomputes. `pooled`: replay
        without a model (result None): the requests whose vectors the log holds."""
        out, step, t0 = self._planned
        self._planned = None
        abandoned = tokens is None
        ids = sampled_ids(out) if not abandoned else []
        tokens = tokens if not abandoned else []
        if len(ids) != len(tokens):
            raise ValueError(f"worker returned {len(tokens)} tokens for {len(ids)} rows")
        done = StepCommit(extras=extras_of(ids, result, self._sampling),
                          prompt_logprobs=self._deliver(self._spans,
                                                        None if abandoned else result),
                          embeddings=[] if abandoned else embeddings_of(out.pooled, result,
                                                                        pooled))
        outputs, outs = self._outputs(ids, tokens)
        if out.drafts and result is not None and len(result.drafts):
            _fill_drafts(out.drafts, list(result.drafts))
        if out.drafts and outputs:
            outputs, done.accepted = self._verify(out.drafts, outputs)
        done.events = self.sched.on_step(outputs, [i for i, _ in done.embeddings])
        if abandoned:
            self._forget_cache()
        self._record(step, out, outs, t0, done)
        done.finished = self._finish(done.events, step)
        return done

    def fill_drafts(self, logged: list) -> None:
        """Replay: the planned step's drafts the worker's draft model proposed, from the
        log's schedule ([[id, drafts], ...]) where they have the planned shape."""
        drafts = self._planned[0].drafts
        for seq_id, d in logged:
            mine = drafts.get(seq_id)
            if mine and mine[0] == PENDING and len(mine) == len(d):
                drafts[seq_id] = list(d)

    def abandon(self) -> None:
        """Drop the planned step: its batch failed to build, or its worker died."""
        self.commit(None)

    def lose_worker(self) -> None:
        """The worker died: what it was given is lost (a restart follows)."""
        self.commit(None)

    def step(self) -> StepCommit:
        """One step on the in-process runner (core/step_driver.py drives it)."""
        if self._local is None or self._local.model is not self.runner:
            self._local = LocalRunner(self.runner)
        try:
            return drive(self, self._local)
        except PlanFailed as e:   # offline, a batch that cannot be built is the caller's
            raise e.cause

    def run(self, max_steps: int | None = None) -> dict[int, list[int]]:
        """Step until nothing is unfinished; the generated tokens of each finished request."""
        done: dict[int, list[int]] = {}
        n = 0
        while self.busy() and (max_steps is None or n < max_steps):
            outs = {seq_id: live.output for seq_id, live in self.live.items()}
            for ev in self.step().events:
                if isinstance(ev, Finished):
                    done[ev.id] = outs.get(ev.id, [])
            n += 1
        return done

    # ---- internals

    def _deliver(self, spans: list, result) -> list:
        if not spans or result is None or not hasattr(result, "prompt_logprobs"):
            return []
        return self.prompt_lp.deliver(spans, result)

    def _forget_cache(self) -> None:
        """An abandoned step advanced its chunks' positions without writing their K/V: no
        block it touched may be served from the prefix cache, so the cache forgets every
        key (replay abandons the same steps and forgets the same way)."""
        drop = getattr(self.sched.blocks, "drop_cached", None)
        if drop is not None:
            drop()

    def _clock(self, out: ScheduleOutput, step: int) -> None:
        cfg = self.sched.cfg
        for c in out.prefill:
            live = self.live.get(c.id)
            if live is not None:
                live.clock.admit(step, cfg, c.start)
        for seq_id in out.preempted:
            live = self.live.get(seq_id)
            if live is not None:
                live.clock.preemptions += 1

    def _record(self, step: int, out: ScheduleOutput, outs: list, t0: float,
                done: StepCommit, hits=None) -> None:
        """outs: [id, token, stop] per sampled row; `done`: the step's products so far
        (its accepted drafts and prompt logprobs are logged); `hits`: the step's
        prefix-cache hits (default: the last plan's)."""
        doc = schedule_json(out, self.last_hits if hits is None else hits, done.accepted)
        snapshot = self.sched.snapshot()
        if self._ledger is not None:   # tables as lengths and appends (core/table_growth.py)
            *counters, running = snapshot
            snapshot = (*counters, *self._ledger.entries(running))
        summary = getattr(self.sched.blocks, "summary", None)
        if summary is not None:   # the cache's state too (absent without one: old hashes hold)
            snapshot = (*snapshot, summary())
        self.last_hash = state_hash(self.last_hash, snapshot, doc, outs)
        for seq_id, first, entries in done.prompt_logprobs:   # committed with the step
            self.log.prompt_logprobs(PromptLogprobsRecord(step, seq_id, first, entries))
        for seq_id, vector in done.embeddings:
            if vector is not None:   # None: replayed without a model
                self.log.embedding(EmbeddingRecord(step, seq_id, len(vector),
                                                   hashlib.sha256(vector).hexdigest()))
        st = self.sched.stats()
        ms = (time.perf_counter() - t0) * 1e3
        self.step_ms_total += ms
        self.step_times.observe(ms)
        self.log.step(StepRecord(step, time.time(), ms, doc, outs, st.free_blocks, st.running,
                                 st.waiting, self.last_hash))

    def _verify(self, drafts: dict, outputs: list[StepOutput]) -> tuple[list, list]:
        """The outputs each decode with drafts keeps (core/speculate.py) and [[id, drafts
        kept], ...]; counts its drafts (its metrics)."""
        kept, accepted = kept_rows(drafts, outputs, _ID, _TOKEN, _STOP)
        for seq_id, n in accepted:
            live = self.live.get(seq_id)
            if live is not None:
                live.clock.drafted(len(drafts[seq_id]), n)
        return kept, accepted

    def _pop(self, seq_id: int) -> _Live | None:
        self._sampling.pop(seq_id, None)
        self._stop_ids.pop(seq_id, None)
        self.prompt_lp.drop(seq_id)
        return self.live.pop(seq_id, None)

    def _outputs(self, ids, tokens) -> tuple[list[StepOutput], list]:
        """The StepOutputs of a step's tokens, and the same as the log's [id, token, stop]."""
        stops = self._stop_ids.get
        flags = [t in stops(i, ()) for i, t in zip(ids, tokens)]
        return list(map(StepOutput, ids, tokens, flags)), list(zip(ids, tokens, flags))

    def _finish(self, events: list, step: int) -> dict[int, dict]:
        """Outputs grow by the step's tokens; finished requests are logged and forgotten.
        Returns each finished request's metrics."""
        figures = {}
        live_of = self.live.get
        for ev in events:
            if type(ev) is TokenEvent:
                live = live_of(ev.id)
                if live is not None:
                    live.output.append(ev.token)
            else:
                live = self._pop(ev.id)
                if live is not None:
                    self.log.finish(ev.id, step, ev.reason.value, live.output)
                    figures[ev.id] = self._figures(ev.id, live)
        return figures


_ID, _TOKEN, _STOP = attrgetter("id"), attrgetter("token"), attrgetter("stop")
