"""The engine loop without sockets: scheduler + a runner, one step at a time.

The core process drives the same object (plan -> remote worker -> commit); the offline
mode calls `step()` with an in-process runner; replay feeds recorded inputs to it. External
inputs (adds, aborts, restarts) are applied between steps and are recorded with the step
they precede, which together with stateless sampling makes a run replayable.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import msgpack

from core.batch import build_batch, sampled_ids
from core.ipc.protocol import ForwardBatch, SamplingParams
from core.logrecords import StepRecord
from core.sched import (Finished, InvalidRequest, Request, ScheduleOutput, Scheduler,
                        StepOutput, TokenEvent)

SEED_MASK = (1 << 63) - 1
INT32_MAX = (1 << 31) - 1


def check_ranges(req: Request, sampling: SamplingParams) -> None:
    """What the batch's int32/int64 columns and the log's integers can hold. The frontend
    checks tighter bounds (vocabulary, max_model_len); this keeps a value that slipped past
    it from failing later, inside a step or the log writer, where it would hurt others."""
    t, p, k, s = sampling.temperature, sampling.top_p, sampling.top_k, sampling.seed
    if not isinstance(req.max_tokens, int) or not 1 <= req.max_tokens <= SEED_MASK:
        raise InvalidRequest(f"max_tokens must be in [1, 2**63), got {req.max_tokens!r}")
    if not isinstance(t, (int, float)) or not 0 <= t < float("inf"):
        raise InvalidRequest(f"temperature must be finite and >= 0, got {t!r}")
    if not isinstance(p, (int, float)) or not 0 < p <= 1:
        raise InvalidRequest(f"top_p must be in (0, 1], got {p!r}")
    if not isinstance(k, int) or not 0 <= k <= INT32_MAX:
        raise InvalidRequest(f"top_k must be in [0, 2**31), got {k!r}")
    if s is not None and (not isinstance(s, int) or not 0 <= s <= SEED_MASK):
        raise InvalidRequest(f"seed must be in [0, 2**63), got {s!r}")


def derive_seed(engine_seed: int, seq_id: int) -> int:
    """The seed of a sampled request that brought none: a function of (--seed, id)."""
    h = hashlib.blake2b(f"{engine_seed}:{seq_id}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & SEED_MASK


def schedule_json(out: ScheduleOutput) -> dict:
    return {"prefill": [[c.id, c.start, c.length, c.last] for c in out.prefill],
            "decode": list(out.decode), "preempted": list(out.preempted)}


def state_hash(prev: str, snapshot, sched_doc: dict, outputs: list) -> str:
    """The previous hash chained with the scheduler's state after the step (msgpack is
    a canonical, fast serialization of these plain tuples, lists, ints and bools)."""
    h = hashlib.blake2b(prev.encode(), digest_size=16)
    h.update(msgpack.packb((snapshot, sched_doc, outputs)))
    return h.hexdigest()


class NullLog:
    """The step log's interface; this one records nothing and is always healthy.

    `problem`, `refusal()` and `abort_reason()` are None or a one-line reason: the log
    cannot be written / a new request must be refused / the requests in flight must be
    aborted (core/steplog.py)."""

    problem = None

    def add_request(self, seq_id, request_id, arrival, req, sampling, ignore_eos): pass
    def input(self, step, kind, seq_id): pass
    def step(self, record: StepRecord): pass
    def finish(self, seq_id, step, reason, output_tokens): pass
    def flush(self): pass
    def close(self): pass
    def refusal(self) -> str | None: return None
    def abort_reason(self) -> str | None: return None


@dataclass
class _Live:
    sampling: SamplingParams
    ignore_eos: bool
    prompt_len: int
    output: list[int] = field(default_factory=list)


class _SamplingView:
    """seq_id -> SamplingParams over the live table, without copying it every step."""

    def __init__(self, live: dict):
        self.live = live

    def get(self, seq_id: int, default=None):
        live = self.live.get(seq_id)
        return live.sampling if live is not None else default


class Engine:
    def __init__(self, sched: Scheduler, runner=None, *, eos_ids=(), seed: int = 0, log=None):
        self.sched, self.runner = sched, runner
        self.eos_ids = frozenset(eos_ids)
        self.seed = seed
        self.log = log or NullLog()
        self.live: dict[int, _Live] = {}
        self.last_hash = ""
        self.step_ms_total = 0.0  # time spent inside plan..commit, summed over steps
        self.last_schedule: ScheduleOutput | None = None
        self._planned: tuple[ScheduleOutput, int, float] | None = None
        self._sampling = _SamplingView(self.live)

    @property
    def step_no(self) -> int:
        return self.sched.stats().steps

    # ---- inputs, applied between steps

    def add(self, req: Request, sampling: SamplingParams | None = None, *,
            ignore_eos: bool = False, request_id: str = "") -> int:
        """Admit to the queue; raises the scheduler's AdmitError unchanged."""
        sampling = sampling or SamplingParams()
        check_ranges(req, sampling)
        seq_id = self.sched.add(req)
        if sampling.temperature > 0 and sampling.seed is None:
            sampling = SamplingParams(sampling.temperature, sampling.top_p, sampling.top_k,
                                      derive_seed(self.seed, seq_id))
        self.live[seq_id] = _Live(sampling, ignore_eos, len(req.prompt))
        step = self.step_no
        self.log.add_request(seq_id, request_id, step, req, sampling, ignore_eos)
        self.log.input(step, "add", seq_id)
        return seq_id

    def abort(self, seq_id: int) -> bool:
        """True when seq_id was unfinished (and is now aborted)."""
        live = self.live.pop(seq_id, None)
        if live is None:
            return False
        self.sched.abort(seq_id)
        step = self.step_no
        self.log.input(step, "abort", seq_id)
        self.log.finish(seq_id, step, "abort", live.output)
        return True

    def abort_all(self) -> None:
        """Shutting down: every unfinished request is aborted (and its blocks freed)."""
        for seq_id in list(self.live):
            self.abort(seq_id)

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
        return build_batch(step, out, self.sched, self._sampling) if build else None

    def commit(self, tokens) -> list:
        """Apply the worker's tokens for the planned step; returns the scheduler's events.

        tokens=None abandons the step (its worker died): no outputs; the restart that
        follows preempts every running request, which then recomputes."""
        out, step, t0 = self._planned
        self._planned = None
        ids = sampled_ids(out) if tokens is not None else []
        tokens = tokens if tokens is not None else []
        if len(ids) != len(tokens):
            raise ValueError(f"worker returned {len(tokens)} tokens for {len(ids)} rows")
        eos = self.eos_ids
        outputs = [StepOutput(seq_id, tok, tok in eos and self._stops_on_eos(seq_id))
                   for seq_id, tok in zip(ids, tokens)]
        events = self.sched.on_step(outputs)
        self._record(step, out, outputs, t0)
        self._finish(events, step)
        return events

    def step(self) -> list:
        batch = self.plan()
        tokens = self.runner.execute(batch) if batch.num_seqs else []
        return self.commit(tokens)

    def run(self, max_steps: int | None = None) -> dict[int, list[int]]:
        """Step until nothing is unfinished; the generated tokens of each finished request."""
        done: dict[int, list[int]] = {}
        n = 0
        while self.sched.has_unfinished() and (max_steps is None or n < max_steps):
            outs = {seq_id: live.output for seq_id, live in self.live.items()}
            for ev in self.step():
                if isinstance(ev, Finished):
                    done[ev.id] = outs.get(ev.id, [])
            n += 1
        return done

    # ---- internals

    def _stops_on_eos(self, seq_id: int) -> bool:
        live = self.live.get(seq_id)
        return live is not None and not live.ignore_eos

    def _record(self, step: int, out: ScheduleOutput, outputs: list, t0: float) -> None:
        doc = schedule_json(out)
        outs = [[o.id, o.token, o.stop] for o in outputs]
        self.last_hash = state_hash(self.last_hash, self.sched.snapshot(), doc, outs)
        st = self.sched.stats()
        ms = (time.perf_counter() - t0) * 1e3
        self.step_ms_total += ms
        self.log.step(StepRecord(step, time.time(), ms, doc, outs, st.free_blocks, st.running,
                                 st.waiting, self.last_hash))

    def _finish(self, events: list, step: int) -> None:
        live_of = self.live.get
        for ev in events:
            if type(ev) is TokenEvent:
                live = live_of(ev.id)
                if live is not None:
                    live.output.append(ev.token)
            else:
                live = self.live.pop(ev.id, None)
                if live is not None:
                    self.log.finish(ev.id, step, ev.reason.value, live.output)
