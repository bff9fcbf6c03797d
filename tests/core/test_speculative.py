"""Speculative decoding in the core (docs/design/scheduler.md, "Speculative decoding"), with a fake
model whose next token is a function of the last one, so that prompt lookup is often right:
the proposer, the same tokens with speculation on and off, the budget, block rollback,
stops inside an accepted run, aborts and a lost worker with drafts in flight, the rules
that turn speculation off, and replay of a speculative log."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from core.config import CoreConfig, engine_from_meta, log_meta
from core.ipc.protocol import I32, SamplingParams
from core.ngram import propose
from core.sched import FinishReason, Finished, Request, TokenEvent
from core.speculate import Drafting
from core.step_events import step_messages
from core.steplog import StepLog
from replay.logfile import LogFile
from replay.timeline import recorded
from replay.verify import verify
from replay.whatif import predict
from worker.null import NullRunner

EOS = 256


class Cycle(NullRunner):
    """Next token = f(last token) over a short cycle (EOS where (id, k) is in `stops`),
    for the row each sample row names, sample_offset included."""

    def __init__(self, stops=(), **kw):
        super().__init__(**kw)
        self.info = replace(self.info, batch_invariant=True)
        self.stops = set(stops)
        self.tokens_per_step: list[int] = []

    def execute(self, batch):
        self.tokens_per_step.append(batch.num_tokens)
        qs, ids = batch.query_start, batch.input_ids
        back = batch.sample_offset or [0] * len(batch.sample_rows)
        out = I32((ids[qs[r + 1] - 1 - b] * 7 + 3) % 31 + 1
                  for r, b in zip(batch.sample_rows, back))
        for j, r in enumerate(batch.sample_rows):
            if (batch.seq_ids[r], batch.gen_index[j]) in self.stops:
                out[j] = EOS
        return out


CYCLE = [15, 16, 23, 10, 12, 26, 31, 4, 1, 11, 19, 13, 2, 18, 6]   # Cycle's, from 6 on


def engine(runner, log_path=None, **kw):
    cfg = CoreConfig("-", "-", "-", "-", **{"max_seqs": 16, "max_batch_tokens": 64,
                                            "max_chunk": 16, "speculative": "ngram",
                                            "spec_max_batch": 16, **kw})
    log = StepLog(str(log_path), log_meta(cfg, runner.info)) if log_path else None
    eng = cfg.make_engine(runner.info, log)
    eng.runner = runner
    return eng


def workload(n=24, seed=0):
    rng = random.Random(seed)
    return [([rng.randrange(1, 32) for _ in range(rng.randint(2, 30))], rng.randint(1, 40),
             SamplingParams(temperature=0.7, seed=i) if i % 3 == 0 else SamplingParams())
            for i in range(n)]


def run(eng, reqs, ignore_eos=True, each_step=None) -> dict:
    ids = [eng.add(Request(p, n), sp, ignore_eos=ignore_eos) for p, n, sp in reqs]
    out: dict[int, list[int]] = {i: [] for i in ids}
    while eng.busy():
        for ev in eng.step().events:
            if isinstance(ev, TokenEvent):
                out[ev.id].append(ev.token)
        if each_step is not None:
            each_step(eng)
    return out


def test_propose_takes_the_longest_suffix_and_its_latest_match():
    assert propose([1, 2, 3, 9, 1, 2, 3, 8, 5, 2, 3], 3) == [8, 5, 2]   # "2 3", latest
    assert propose([4, 1, 2, 3, 7, 1, 2, 3], 2) == [7, 1]               # "1 2 3"
    assert propose([1, 2, 1, 2], 5) == [1, 2, 1, 2, 1]                  # periodic past the end
    assert propose([5, 7, 7, 7], 3) == [7, 7, 7]
    assert propose([1, 2, 3], 4) == [] and propose([5], 2) == []
    assert propose([1, 1, 1], 0) == []


def _scan(tokens, k):
    """propose's rule as a plain scan."""
    for n in range(min(3, len(tokens) - 1), 0, -1):
        for i in range(len(tokens) - 2, n - 2, -1):
            if tokens[i - n + 1:i + 1] == tokens[len(tokens) - n:]:
                ahead = tokens[i + 1:]
                return (ahead * k)[:k]
    return []


def test_propose_is_the_plain_scan_even_where_bytes_match_across_tokens():
    rng = random.Random(4)
    for _ in range(2000):   # multiples of 300 share bytes with small ids at other offsets
        toks = [rng.randrange(4) * rng.choice((1, 300, 65536)) for _ in range(rng.randint(1, 40))]
        k = rng.randint(1, 5)
        assert propose(toks, k) == _scan(toks, k)


def test_drafts_adapt_to_acceptance():
    d = Drafting(num_draft=8, max_batch=4)
    assert d.adapt(8, 8, 3) == 4 and d.adapt(1, 1, 0) == 1
    assert d.adapt(2, 2, 2) == 4 and d.adapt(8, 8, 8) == 8 and d.adapt(3, 0, 0) == 3
    assert d.step_speculates(4) and not d.step_speculates(5)


@pytest.mark.parametrize("num_blocks", [256, 24])
def test_tokens_equal_without_speculation(num_blocks):
    runner = Cycle(num_blocks=num_blocks, block_size=4)
    reqs = workload()
    plain = run(engine(runner, speculative=None), reqs)
    B = 4

    def tables_hold_no_rejected_draft(eng):
        s = eng.sched
        for r in s._running:
            assert len(s.blocks.block_table(r.id)) <= -(-r.num_tokens // B)

    spec_eng = engine(runner)
    got = run(spec_eng, reqs, each_step=tables_hold_no_rejected_draft)
    s = spec_eng.sched
    assert got == plain
    assert 0 < s.accepted_tokens < s.draft_tokens
    assert s.stats().free_blocks == num_blocks
    if num_blocks == 24:
        assert s.stats().preemptions > 0


def test_a_decode_with_k_drafts_counts_k_plus_1_against_the_budget():
    runner = Cycle(num_blocks=64, block_size=4)
    eng = engine(runner, max_batch_tokens=5, num_draft=4)
    run(eng, [([3, 4, 3, 4, 3, 4], 20, SamplingParams())] * 3)
    assert max(runner.tokens_per_step) == 5
    assert eng.sched.draft_tokens > 0


def test_a_stop_token_inside_an_accepted_run_ends_the_request_there(tmp_path):
    stops = {(0, 9), (1, 13), (2, 3)}
    reqs = [(CYCLE, 30, SamplingParams())] * 3   # every draft right: the stops fall inside runs
    plain = run(engine(Cycle(stops, num_blocks=64, block_size=4), speculative=None), reqs,
                ignore_eos=False)
    eng = engine(Cycle(stops, num_blocks=64, block_size=4), tmp_path / "stop.db")
    got = run(eng, reqs, ignore_eos=False)
    eng.log.close()
    assert got == plain
    assert [len(got[i]) for i in range(3)] == [10, 14, 4] and got[0][-1] == EOS
    assert eng.sched.accepted_tokens > 0 and eng.sched.stats().free_blocks == 64
    assert verify(LogFile(str(tmp_path / "stop.db"))).ok


def _drafted_step(eng) -> tuple:
    """Plan steps until one has drafts: (its batch, the drafted ids)."""
    while True:
        batch = eng.plan()
        if eng.last_schedule.drafts:
            return batch, list(eng.last_schedule.drafts)
        eng.commit(eng.runner.execute(batch))


def test_a_lost_worker_with_drafts_in_flight_loses_no_request(tmp_path):
    runner = Cycle(num_blocks=64, block_size=4)
    reqs = workload(8, seed=2)
    plain = run(engine(runner, speculative=None), reqs)
    path = tmp_path / "lost.db"
    eng = engine(runner, path)
    ids = [eng.add(Request(p, n), sp, ignore_eos=True) for p, n, sp in reqs]
    _drafted_step(eng)
    eng.lose_worker()          # the step verifying drafts is lost: its slots come back
    eng.restart()              # and every request recomputes
    while eng.busy():
        eng.step()
    eng.log.close()
    assert eng.sched.stats().free_blocks == 64
    lf = LogFile(str(path))
    assert {i: lf.requests[i]["output_tokens"] for i in ids} == plain
    assert verify(lf).ok and verify(lf, runner).ok


def test_an_abort_with_drafts_in_flight_frees_its_blocks():
    """The scheduler's contract lets an abort come between schedule and on_step (the core
    queues a mid-step abort to after the step, so this is the harder case)."""
    runner = Cycle(num_blocks=64, block_size=4)
    reqs = workload(8, seed=2)
    plain = run(engine(runner, speculative=None), reqs)
    eng = engine(runner)
    ids = [eng.add(Request(p, n), sp, ignore_eos=True) for p, n, sp in reqs]
    batch, drafted = _drafted_step(eng)
    victim = drafted[0]
    assert eng.abort(victim)
    eng.commit(runner.execute(batch))
    outs = {i: list(eng.live[i].output) for i in ids if i in eng.live}
    while eng.busy():
        for e in eng.step().events:
            if isinstance(e, TokenEvent):
                outs[e.id].append(e.token)
    assert eng.sched.stats().free_blocks == 64
    assert outs == {i: plain[i] for i in ids if i != victim}


def test_no_drafts_for_requests_that_opt_out_or_whose_logits_read_their_history():
    runner = Cycle(num_blocks=64, block_size=4)
    eng = engine(runner)
    out = [SamplingParams(speculative=False), SamplingParams(repetition_penalty=1.2),
           SamplingParams(min_tokens=2), SamplingParams()]
    ids = [eng.add(Request(CYCLE, 12), sp, ignore_eos=True) for sp in out]
    drafted = set()
    while eng.busy():
        eng.step()
        drafted.update(eng.last_schedule.drafts)
    assert drafted == {ids[3]}


def test_a_large_batch_does_not_speculate():
    runner = Cycle(num_blocks=64, block_size=4)
    eng = engine(runner, spec_max_batch=2)
    ids = [eng.add(Request([3, 4, 3, 4], 10 + 4 * i), SamplingParams(), ignore_eos=True)
           for i in range(4)]
    while eng.busy():
        running = eng.sched.stats().running
        eng.step()
        if eng.last_schedule.drafts:
            assert running <= 2
    assert eng.sched.draft_tokens > 0 and ids


def test_off_the_batch_invariant_mode_nothing_is_drafted():
    runner = Cycle(num_blocks=64, block_size=4)
    runner.info = replace(runner.info, batch_invariant=False)
    eng = engine(runner)
    assert eng.overlap and not eng.sched.cfg.num_draft


def test_a_speculative_log_replays_and_an_old_meta_reads_as_off(tmp_path):
    runner = Cycle(num_blocks=64, block_size=4)
    path = tmp_path / "spec.db"
    eng = engine(runner, path, max_seqs=4)   # steps enough for what-if's step-time fit
    run(eng, workload(12, seed=5))
    eng.log.close()
    lf = LogFile(str(path))
    assert any("drafts" in r.schedule and "accepted" in r.schedule for r in lf.steps())
    assert verify(lf).ok and verify(lf, runner).ok
    rec = recorded(lf)   # what-if reads it as the tokens each request kept, and predicts
    assert sum(len(t) for t in rec.tokens.values()) == sum(   # a run without speculation
        len(r["output_tokens"]) for r in lf.requests.values())
    assert predict(lf).doc["predicted"]
    meta = dict(lf.meta, sched_config={k: v for k, v in lf.meta["sched_config"].items()
                                       if k not in ("num_draft", "spec_max_batch")})
    assert engine_from_meta(meta).sched.cfg.num_draft == 0


def test_a_step_of_several_tokens_per_request_goes_out_one_token_per_request_a_message():
    events = [TokenEvent(0, 5), TokenEvent(0, 6), TokenEvent(1, 9), TokenEvent(0, 7),
              Finished(1, FinishReason.LENGTH), TokenEvent(2, 1)]
    msgs, ended = step_messages(events, {0: 10, 1: 11}, None, {1: {"x": 1}})
    assert [(list(m.fids), list(m.tokens)) for m in msgs] == [
        ([10, 11], [5, 9]), ([10], [6]), ([10], [7])]
    assert [m.finished for m in msgs] == [[], [], [[11, "length", {"x": 1}]]]
    assert ended == [1]
    msgs, _ = step_messages([Finished(0, FinishReason.STOP)], {0: 10}, None, {})
    assert len(msgs) == 1 and msgs[0].finished == [[10, "stop", None]]
