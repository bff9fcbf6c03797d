"""A fake model for scheduler tests, and a driver that checks invariants every step.

The next token is a known function of the whole sequence so far, so every answer is known
in advance (`continuation`). The fake reads that sequence back through a simulated paged KV
cache: each chunk and decode writes its tokens into the slots of the request's block
table, and sampling reads positions 0..n-1 back from those slots. A scheduler that skips
a recompute, hands one block to two requests or schedules a position without a block
therefore gets a wrong token, exactly as a real model would.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Callable, Mapping, Sequence

from core.sched import (Finished, FinishReason, PrefixHooks, Request, ScheduleOutput,
                        Scheduler, StepOutput, TokenEvent, WholePrompt)

VOCAB = 1000
_UNWRITTEN = -1


def next_token(seq: Sequence[int], vocab: int = VOCAB) -> int:
    return hash(tuple(seq)) % vocab  # int hashing is not randomized: stable across runs


def continuation(prompt: Sequence[int], max_tokens: int, max_model_len: int,
                 eos: int | None = None, vocab: int = VOCAB) -> tuple[list[int], FinishReason]:
    """What a request must produce, whatever the batching: the unconstrained answer."""
    seq = list(prompt)
    out: list[int] = []
    while True:
        t = next_token(seq, vocab)
        seq.append(t)
        out.append(t)
        if t == eos:
            return out, FinishReason.STOP
        if len(out) >= max_tokens or len(seq) >= max_model_len:
            return out, FinishReason.LENGTH


class FakeModel:
    def __init__(self, vocab: int = VOCAB, eos: int | None = None):
        self.vocab = vocab
        self.eos = eos
        self.kv: dict[int, int] = {}  # slot -> token; freed blocks keep stale tokens

    def forward(self, sched: Scheduler, out: ScheduleOutput) -> list[StepOutput]:
        """One StepOutput per sampling row: every decode and every last chunk."""
        res = []
        for ch in out.prefill:
            toks = sched.tokens(ch.id)
            assert ch.length >= 1 and ch.start + ch.length <= len(toks), ch
            assert ch.last == (ch.start + ch.length == len(toks)), ch
            self._write(sched, ch.id, ch.start, toks[ch.start:ch.start + ch.length])
            if ch.last:
                res.append(self._sample(sched, ch.id, len(toks)))
        for seq_id in out.decode:
            toks = sched.tokens(seq_id)
            self._write(sched, seq_id, len(toks) - 1, toks[-1:])
            res.append(self._sample(sched, seq_id, len(toks)))
        return res

    def _slot(self, sched: Scheduler, seq_id: int, pos: int) -> int:
        B = sched.blocks.block_tokens()
        table = sched.blocks.block_table(seq_id)
        assert pos // B < len(table), f"request {seq_id}: position {pos} has no block"
        return table[pos // B] * B + pos % B

    def _write(self, sched: Scheduler, seq_id: int, start: int, toks: Sequence[int]) -> None:
        for i, t in enumerate(toks):
            self.kv[self._slot(sched, seq_id, start + i)] = t

    def _sample(self, sched: Scheduler, seq_id: int, n: int) -> StepOutput:
        seq = [self.kv.get(self._slot(sched, seq_id, p), _UNWRITTEN) for p in range(n)]
        t = next_token(seq, self.vocab)
        return StepOutput(seq_id, t, stop=(t == self.eos))


@dataclass
class RunResult:
    ids: list[int] = field(default_factory=list)                     # in add order
    outputs: dict[int, list[int]] = field(default_factory=dict)      # from TokenEvents
    reasons: dict[int, FinishReason] = field(default_factory=dict)
    admitted_at: dict[int, int] = field(default_factory=dict)        # first chunk's step
    finished_at: dict[int, int] = field(default_factory=dict)
    schedules: list[ScheduleOutput] = field(default_factory=list)
    steps: int = 0


Arrivals = Mapping[int, Sequence[Request]] | Callable[[int], Sequence[Request]]


def run(sched: Scheduler, fake: FakeModel, max_steps: int, arrivals: Arrivals | None = None,
        until_idle: bool = True, aborts: Mapping[int, Sequence[int]] | None = None) -> RunResult:
    """schedule -> fake forward -> on_step until nothing is left (and no arrivals remain)
    or max_steps, checking the scheduler's invariants at every step. `aborts` maps a step
    to indices into the requests added so far, aborted before that step's schedule."""
    arrive = _arrivals(arrivals)
    last_arrival = max(arrivals) if isinstance(arrivals, Mapping) and arrivals else -1
    res = RunResult()
    for step in range(max_steps):
        for req in arrive(step):
            seq_id = sched.add(req)
            res.ids.append(seq_id)
            res.outputs[seq_id] = []
        for k in (aborts or {}).get(step, ()):
            if k < len(res.ids):
                sched.abort(res.ids[k])
        if until_idle and not sched.has_unfinished() and step > last_arrival:
            break
        before = {e[0]: e for e in sched.snapshot()[6]}
        out = sched.schedule()
        check_schedule(sched, out, before)
        for ch in out.prefill:
            res.admitted_at.setdefault(ch.id, step)
        outputs = fake.forward(sched, out)
        events = sched.on_step(outputs)
        _record(res, step, outputs, events)
        check_blocks(sched)
        res.schedules.append(out)
        res.steps = step + 1
    return res


def _arrivals(arrivals: Arrivals | None) -> Callable[[int], Sequence[Request]]:
    if arrivals is None:
        return lambda step: ()
    if isinstance(arrivals, Mapping):
        return lambda step: arrivals.get(step, ())
    return arrivals


def _record(res: RunResult, step: int, outputs: list[StepOutput], events: list) -> None:
    sampled = {o.id: o.token for o in outputs}
    for ev in events:
        if isinstance(ev, TokenEvent):
            assert sampled[ev.id] == ev.token, ev
            res.outputs.setdefault(ev.id, []).append(ev.token)
        else:
            assert isinstance(ev, Finished), ev
            assert ev.id not in res.reasons, f"{ev.id} finished twice"
            res.reasons[ev.id] = ev.reason
            res.finished_at[ev.id] = step


def check_schedule(sched: Scheduler, out: ScheduleOutput, before: dict) -> None:
    cfg = sched.cfg
    ids = [ch.id for ch in out.prefill] + list(out.decode)
    assert len(ids) == len(set(ids)), f"a request scheduled twice: {out}"
    assert len(ids) <= cfg.max_seqs
    tokens = len(out.decode) + sum(ch.length for ch in out.prefill)
    runs_alone = len(ids) == 1 and out.prefill and isinstance(sched.prefill_policy, WholePrompt)
    assert tokens <= cfg.max_batch_tokens or runs_alone, f"{tokens} tokens: {out}"
    running = {e[0]: e for e in sched.snapshot()[6]}
    assert len(running) <= cfg.max_seqs
    B = sched.blocks.block_tokens()
    for seq_id in out.decode:
        _, n, c, table = running[seq_id]
        assert n - c == 1 and len(table) * B >= n, (seq_id, n, c, table)
    for ch in out.prefill:
        _, n, c, table = running[ch.id]
        assert ch.start == c and len(table) * B >= ch.start + ch.length, (ch, running[ch.id])
        if ch.id in before and ch.id not in out.preempted:
            assert before[ch.id][2] == c
    for seq_id in out.preempted:
        assert seq_id not in running or seq_id in {ch.id for ch in out.prefill}


def check_blocks(sched: Scheduler) -> None:
    """free + held == total, only running requests hold blocks, and no block is held twice
    except, by a prefix cache, a full block at the same position of equal prefixes that
    every holder has computed past (so none writes it)."""
    blocks = sched.blocks
    running = {e[0]: e for e in sched.snapshot()[6]}
    holders: dict[int, list[tuple[int, int]]] = {}
    for seq_id in sched.unfinished():
        for i, b in enumerate(blocks.block_table(seq_id)):
            holders.setdefault(b, []).append((seq_id, i))
    assert all(not blocks.block_table(seq_id) for seq_id in sched.unfinished()
               if seq_id not in running)
    shares = isinstance(blocks, PrefixHooks)
    B = blocks.block_tokens()
    for b, hs in holders.items():
        if len(hs) > 1:
            assert shares, f"block {b} is held twice: {hs}"
            assert len({i for _, i in hs}) == 1, f"block {b} at different positions: {hs}"
            end = (hs[0][1] + 1) * B
            assert all(running[seq_id][2] >= end for seq_id, _ in hs), f"{b} written: {hs}"
            assert len({tuple(sched.tokens(seq_id)[:end]) for seq_id, _ in hs}) == 1, hs
    assert blocks.free_blocks() + len(holders) == blocks.total_blocks()
