"""Overlapped scheduling (core/overlap.py, docs/design/overlap.md "Overlapped scheduling"): the same
tokens as the plain step loop, no token past a finish, max_tokens, aborts and a lost worker
with a step in flight, and logs that replay verifies."""
from __future__ import annotations

import random
import sqlite3
from dataclasses import replace

import pytest

from core.config import CoreConfig, log_meta
from core.ipc.protocol import SamplingParams
from core.sched import Finished, Request, TokenEvent
from core.steplog import StepLog
from replay.logfile import LogFile
from replay.record import SCENARIOS, record
from replay.verify import verify
from worker.null import NullRunner, null_token

SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=11)


class StopAt(NullRunner):
    """The null model, but request `id` samples EOS as its generated token number k for
    each (id, k) in `stops`."""

    def __init__(self, stops=(), **kw):
        super().__init__(**kw)
        self.stops = set(stops)

    def execute(self, batch):
        out = super().execute(batch)
        for j, r in enumerate(batch.sample_rows):
            if (batch.seq_ids[r], batch.gen_index[j]) in self.stops:
                out[j] = self.info.eos_ids[0]
        return out


def engine(runner, overlap: bool, log_path=None, **kw):
    """An engine as the core makes it (max_seqs 8, 64-token steps, 16-token chunks),
    logging to log_path if given (close it with eng.log.close())."""
    cfg = CoreConfig("-", "-", "-", "-", **{"max_seqs": 8, "max_batch_tokens": 64,
                                            "max_chunk": 16, "overlap": overlap, **kw})
    log = StepLog(str(log_path), log_meta(cfg, runner.info)) if log_path else None
    eng = cfg.make_engine(runner.info, log)
    eng.runner = runner
    return eng


def workload(n=10, seed=0, vocab=300):
    rng = random.Random(seed)
    return [([rng.randrange(1, vocab) for _ in range(rng.randint(3, 40))], rng.randint(1, 12),
             SEEDED if i % 2 else SamplingParams()) for i in range(n)]


def run(eng, reqs, ignore_eos=True) -> dict:
    ids = [eng.add(Request(p, n), sp, ignore_eos=ignore_eos) for p, n, sp in reqs]
    out = eng.run()
    return {i: out[i] for i in ids}


@pytest.fixture(scope="module")
def tiny():
    from worker.load import make_runner
    return make_runner("tiny", num_blocks=40, block_size=4)


class Seeded(NullRunner):
    """The null model, its token also a function of each row's seed and generated-token
    index: a batch column that differed under overlap would change the tokens."""

    def execute(self, batch):
        out = super().execute(batch)
        vocab = self.info.vocab_size
        for j in range(len(out)):
            out[j] = null_token(out[j] ^ batch.seeds[j] & 0xFFFF, batch.gen_index[j], vocab)
        return out


@pytest.mark.parametrize("blocks", [64, 14])   # 14: preemptions by recompute
def test_tokens_equal_the_plain_loop(blocks):
    runner = Seeded(num_blocks=blocks, block_size=4)
    reqs = workload(12, seed=blocks)
    plain = run(engine(runner, False), reqs)
    eng = engine(runner, True)
    assert run(eng, reqs) == plain
    assert [len(t) for t in plain.values()] == [n for _, n, _ in reqs]
    assert (eng.sched.stats().preemptions > 0) == (blocks == 14)


@pytest.mark.slow
def test_tokens_equal_the_plain_loop_on_a_real_model(tiny):
    """Greedy and seeded rows, chunked prefills and preemptions (few blocks)."""
    reqs = workload(6, vocab=tiny.info.vocab_size)
    plain = run(engine(tiny, False), reqs)
    assert run(engine(tiny, True), reqs) == plain
    assert [len(t) for t in plain.values()] == [n for _, n, _ in reqs]  # max_tokens held


def test_a_stop_at_step_n_gets_no_token_of_step_n_plus_1(tmp_path):
    runner = StopAt({(0, 2), (1, 0)}, num_blocks=64, block_size=4)
    reqs = [([5, 6, 7], 10, SamplingParams()), ([8, 9], 10, SamplingParams()),
            ([4, 4, 4, 4, 4], 6, SamplingParams())]
    plain = run(engine(runner, False), reqs, ignore_eos=False)
    eng = engine(runner, True, tmp_path / "stop.db")
    got = run(eng, reqs, ignore_eos=False)
    eng.log.close()
    assert got == plain
    assert len(got[0]) == 3 and got[0][-1] == runner.info.eos_ids[0] and len(got[1]) == 1
    assert len(got[2]) == 6
    lf = LogFile(str(tmp_path / "stop.db"))
    rows = list(lf.steps())
    # request 0 stopped at the step sampling its token 2; it ran once more, discarded
    stop_step = next(r.step for r in rows if [0, runner.info.eos_ids[0], True] in r.outputs)
    assert 0 in rows[stop_step + 1].schedule["decode"]
    assert verify(lf).ok


@pytest.mark.parametrize("end", ["stop", "abort"])
def test_logprobs_stay_in_place_when_a_request_ends_with_its_row_in_flight(end):
    """Request a ends (a stop token, or an abort) while a step holding its row, which asked
    for 2 alternatives, is in flight: b's 3 alternatives still start with b's token."""
    runner = StopAt({(0, 1)} if end == "stop" else (), num_blocks=64, block_size=4)
    eng = engine(runner, True)
    a = eng.add(Request([5, 6, 7], 6), SamplingParams(logprobs=2), ignore_eos=end == "abort")
    b = eng.add(Request([8, 9], 6), SamplingParams(logprobs=3), ignore_eos=True)
    tops = []
    while eng.busy():
        if end == "abort" and eng.inflight is not None and eng.step_no == 4:
            eng.abort(a)
        done = eng.step()
        events = done.events
        tops += [(ev.token, done.extras.top[b]) for ev in events
                 if isinstance(ev, TokenEvent) and ev.id == b]
    assert len(tops) == 6
    assert all(len(top) == 3 and top[0][0] == tok for tok, top in tops)


def test_max_tokens_holds_the_last_token_out_of_the_next_step(tmp_path):
    runner = NullRunner(num_blocks=64, block_size=4)
    eng = engine(runner, True, tmp_path / "len.db")
    got = run(eng, [([3, 1, 4], n, SamplingParams()) for n in (1, 2, 5)])
    eng.log.close()
    assert [len(t) for t in got.values()] == [1, 2, 5]
    lf = LogFile(str(tmp_path / "len.db"))
    sampled: dict[int, int] = {}
    for row in lf.steps():
        for seq_id, _, _ in row.outputs:
            sampled[seq_id] = sampled.get(seq_id, 0) + 1
    assert sampled == {0: 1, 1: 2, 2: 5}   # never a row past max_tokens
    assert verify(lf).ok


def test_abort_with_its_step_in_flight(tmp_path):
    runner = NullRunner(num_blocks=64, block_size=4)
    eng = engine(runner, True, tmp_path / "abort.db")
    a = eng.add(Request([1, 2, 3], 20), ignore_eos=True)
    b = eng.add(Request([7, 8], 20), ignore_eos=True)
    for _ in range(4):
        eng.step()
    assert eng.inflight is not None and a in eng.inflight.ids
    before = len(eng.live[a].output)
    assert eng.abort(a)
    events = eng.step().events   # settles the step that sampled `a`: its token is dropped
    assert all(ev.id != a for ev in events)
    assert eng.sched.tokens(a) is None
    out = eng.run()
    eng.log.close()
    assert len(out[b]) == 20 and before < 20
    assert eng.sched.stats().free_blocks == eng.sched.stats().total_blocks
    assert verify(LogFile(str(tmp_path / "abort.db"))).ok


@pytest.mark.parametrize("settled", [False, True])
def test_a_lost_worker_with_a_step_in_flight_loses_no_request(tmp_path, settled):
    """The worker dies while step N runs with N+1 planned (settled=False), or after N's
    tokens came back and N+1 was launched (settled=True): every request still ends with
    the tokens of an undisturbed run."""
    runner = NullRunner(num_blocks=64, block_size=4)
    reqs = workload(6, seed=3)
    plain = run(engine(runner, False), reqs)
    path = tmp_path / f"lost{settled}.db"
    eng = engine(runner, True, path)
    ids = [eng.add(Request(p, n), sp, ignore_eos=True) for p, n, sp in reqs]
    done: dict[int, list[int]] = {}
    for _ in range(5):
        _collect(eng, eng.step, done)
    local = eng._local      # the in-process runner the offline steps ran on
    if settled:
        eng.plan()          # planned, never submitted: lost with the worker once launched
        f = eng.inflight
        result = local.collect(f.step, len(f.ids))
        _collect(eng, lambda: eng.settle(result.tokens, result), done)
        eng.launch()
    eng.plan()          # the next step is planned; the one in flight is lost
    eng.settle(None)
    eng.abandon()
    eng.restart()
    local.lose()        # a new worker: nothing queued, no tokens remembered
    assert eng.inflight is None
    while eng.busy():
        _collect(eng, eng.step, done)
    eng.log.close()
    assert {i: done[i] for i in ids} == plain
    assert verify(LogFile(str(path))).ok


def _collect(eng, act, done):
    """act() and the outputs of the requests it finished."""
    outs = {i: live.output for i, live in eng.live.items()}
    for ev in act().events:
        if isinstance(ev, Finished):
            done[ev.id] = outs[ev.id]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_overlapped_scenarios_verify(tmp_path, name):
    """The replay scenarios (preemption, priorities, aborts, the prefix cache) overlapped."""
    sc = SCENARIOS[name]
    path = tmp_path / f"{name}.db"
    record(replace(sc, cfg=replace(sc.cfg, overlap=True)), path)
    lf = LogFile(str(path))
    assert lf.meta["overlap"] is True
    v = verify(lf)
    assert v.ok, v.divergence


@pytest.mark.slow
def test_overlapped_log_verifies_with_the_model(tmp_path, tiny):
    from replay.record import Scenario, _arrivals, _cfg
    sc = Scenario("tiny", _cfg(max_seqs=4, max_batch_tokens=32, max_chunk=8, overlap=True,
                               prefix_cache=True), tiny.info, _arrivals(5, 8, 6, out=(1, 6)))
    path = tmp_path / "tiny.db"
    record(sc, path, runner=tiny)
    v = verify(LogFile(str(path)), runner=tiny)
    assert v.ok, v.divergence
    with sqlite3.connect(path) as c:   # a corrupted token is caught
        step, outs = c.execute("SELECT step, outputs FROM steps WHERE outputs != '[]'"
                               " ORDER BY step LIMIT 1").fetchone()
        import json
        o = json.loads(outs)
        o[0][1] = (o[0][1] + 1) % tiny.info.vocab_size
        c.execute("UPDATE steps SET outputs = ? WHERE step = ?", (json.dumps(o), step))
    v = verify(LogFile(str(path)), runner=tiny)
    assert not v.ok and v.divergence.step == step


def test_the_next_batch_is_sent_before_the_step_in_flight_returns(tmp_path):
    """The core sends N+1 as soon as it is planned, so the worker never waits a round trip
    for it: a worker that holds each answer until the next batch is there (or a second has
    passed) finds it there for every step but the last."""
    import os
    import threading

    import zmq

    from core.batch import fill_ahead
    from core.ipc.channel import Channel
    from core.ipc.protocol import I32, AddRequest, ForwardBatch, StepEvents
    from core.process import CoreLoop

    ctx = zmq.Context()
    ep = [f"ipc://{tmp_path}/{k}" for k in ("fe_in", "fe_out", "wk_in", "wk_out")]
    cfg = CoreConfig(*ep, max_seqs=4, max_batch_tokens=64, overlap=True, step_timeout=30.0)
    loop = CoreLoop(cfg, ctx)
    runner = NullRunner(num_blocks=64, block_size=4)
    loop.engine, loop.info = cfg.make_engine(runner.info, None), runner.info
    loop.worker.pid = os.getpid()   # the thread below is the worker
    frontend = Channel(ctx, zmq.PULL, ep[1], bind=False)
    to_core = Channel(ctx, zmq.PUSH, ep[2], bind=False)
    from_core = Channel(ctx, zmq.PULL, ep[3], bind=False, accept=(ForwardBatch,))
    held, had_next, stop = [], [], threading.Event()

    def worker():
        last = None
        while not stop.is_set():
            if not held:
                if from_core.poll(50):
                    held.append(from_core.recv())
                continue
            if len(held) < 2 and from_core.poll(1000):
                held.append(from_core.recv())
            had_next.append(len(held) == 2)
            batch = held.pop(0)
            fill_ahead(batch, *((last.step, last.tokens) if last else (-1, None)))
            last = runner.run(batch)
            to_core.send(last)
    t = threading.Thread(target=worker, daemon=True)
    t.start()
    try:
        loop.add(AddRequest(1, "", I32([5, 6, 7]), 12, 0, SamplingParams(), True))
        while loop.engine.busy():
            loop.step()
        tokens = []
        while frontend.poll(200):
            msg = frontend.recv()
            if isinstance(msg, StepEvents):
                tokens += list(msg.tokens)
        assert len(tokens) == 12
        assert len(had_next) == 12 and all(had_next[:-1]), had_next
    finally:
        stop.set()
        t.join(5)
        for c in (frontend, to_core, from_core):
            c.close()
        loop.close()
        ctx.term()
