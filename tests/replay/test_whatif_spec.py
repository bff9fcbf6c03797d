"""What-if with speculative decoding (docs/design/whatif.md, "Speculative decoding in a
what-if"): a log recorded without speculation, predicted with it, drafts and keeps exactly
what a real offline run with speculation does over the same requests, step for step, in a
roomy pool and in one that preempts, with stop tokens inside verified decodes; each
request's tokens are unchanged; a log that cannot tell what speculation would do is
refused."""
from __future__ import annotations

import json
import random
import time
from dataclasses import replace

import pytest

from core.config import CoreConfig, log_meta
from core.ipc.protocol import SamplingParams
from core.sched import Request
from core.steplog import StepLog
from replay.__main__ import main as replay_main
from replay.logfile import LogFile
from replay.record import SCENARIOS, record
from replay.runmetrics import draft_counts
from replay.simulate import Knobs, scheduler_for, simulate
from replay.stepmodel import RecordedTimes
from replay.timeline import recorded
from replay.trace import from_log
from replay.whatif import recorded_figures
from worker import native
from worker.load import make_runner

from tests.checkpoints import echo_checkpoint

pytestmark = pytest.mark.skipif(native.kernel() is None,
                                reason="no C compiler: the batch-invariant mode needs it")

POOLS = {"roomy": 96, "tight": 14}   # KV blocks of 16 tokens; 14 preempts


@pytest.fixture(scope="module")
def echo(tmp_path_factory):
    return make_runner(str(echo_checkpoint(tmp_path_factory)), num_blocks=96,
                       batch_invariant=True)


def workload(vocab: int, n: int = 24) -> list[tuple[list[int], int, SamplingParams]]:
    """Greedy (the echo model copies: drafts accepted) and seeded at temperature 8 (it
    strays: drafts rejected), copy-heavy prompts and not; some requests opt out or use a
    penalty, which the live core never drafts for."""
    rng = random.Random(5)
    out = []
    for i in range(n):
        sp = (SamplingParams() if i % 2 else
              SamplingParams(temperature=8.0, top_p=0.95, seed=100 + i))
        if i % 8 == 3:
            sp = SamplingParams(speculative=False)
        elif i % 8 == 5:
            sp = SamplingParams(presence_penalty=0.5)
        phrase = [rng.randrange(vocab) for _ in range(rng.randrange(4, 12))]
        prompt = phrase * 3 if i % 4 < 2 else [rng.randrange(vocab) for _ in range(20)]
        out.append((prompt, rng.randrange(6, 24), sp))
    return out


def record_offline(runner, path, speculative: str | None, blocks: int,
                   stops: dict[int, int]) -> LogFile:
    """Every request arrives at once (so the simulation's clock cannot reorder them);
    request i stops at token stops[i]. Without speculation the engine overlaps (the
    default), with it it cannot."""
    cfg = CoreConfig("-", "-", "-", "-", max_seqs=8, max_batch_tokens=64, max_chunk=16,
                     speculative=speculative, spec_max_batch=8)
    info = replace(runner.info, num_blocks=blocks)
    log = StepLog(str(path), log_meta(cfg, info))
    engine = cfg.make_engine(info, log)
    engine.runner = runner
    now = time.time()
    try:
        for i, (prompt, n, sp) in enumerate(workload(info.vocab_size)):
            if i in stops:
                sp = replace(sp, stop_token_ids=[stops[i]])
            engine.add(Request(prompt, n), sp, ignore_eos=True, arrival_time=now)
        engine.run()
    finally:
        log.close()
    return LogFile(str(path))


@pytest.fixture(scope="module")
def probe(echo, tmp_path_factory) -> LogFile:
    """The workload without speculation nor stop tokens."""
    return record_offline(echo, tmp_path_factory.mktemp("probe") / "p.db", None, 96, {})


@pytest.fixture(scope="module")
def stops(probe) -> dict[int, int]:
    """For each seeded request, a token it generates mid-way twice in a row (found by the
    probe): stopped there, its stop token is one a verified draft can carry."""
    out = {}
    for i, t in recorded(probe).tokens.items():
        j = next((j for j in range(4, len(t) - 1) if t[j] == t[j + 1] and t[j] not in t[:j]),
                 None)
        if i % 2 == 0 and j is not None:
            out[i] = t[j]
    assert len(out) >= 4
    return out


@pytest.fixture(scope="module", params=list(POOLS))
def runs(request, echo, stops, tmp_path_factory) -> tuple[LogFile, LogFile]:
    """(without speculation, with it): the same requests, the same pool."""
    d = tmp_path_factory.mktemp(request.param)
    blocks = POOLS[request.param]
    return (record_offline(echo, d / "off.db", None, blocks, stops),
            record_offline(echo, d / "on.db", "ngram", blocks, stops))


class Constant:
    """Every step takes 1 s: with every request there at once, timing cannot matter."""
    def gap_s(self, k, prev):
        return 0.0

    def forward_s(self, k, features):
        return 1.0


def shape(steps) -> list:
    return [(s.prefill, s.decode, s.preempted, s.sampled, s.drafts, s.verified) for s in steps]


def stops_in_verified_decodes(log: LogFile) -> int:
    return sum(1 for row in log.steps() for seq_id, _, stop in row.outputs
               if stop and seq_id in dict(row.schedule.get("drafts", ())))


def test_predicted_speculation_is_the_real_run_step_for_step(runs, stops):
    off, on = runs
    rec_off, rec_on = recorded(off), recorded(on)
    sim = simulate(scheduler_for(off.meta, Knobs(speculative="ngram")), from_log(off, rec_off),
                   Constant())
    plain = simulate(scheduler_for(off.meta, Knobs()), from_log(off, rec_off), Constant())
    assert shape(sim.steps) == shape(rec_on.steps)
    assert draft_counts(sim.steps) == draft_counts(rec_on.steps)
    # the tokens the simulated scheduler took are the recorded ones, and the real run's
    assert sim.tokens == {i: t for i, t in rec_off.tokens.items() if t} == \
           {i: t for i, t in rec_on.tokens.items() if t}
    drafted, kept = map(sum, zip(*draft_counts(sim.steps).values()))
    assert 0 < kept < drafted and len(sim.steps) < len(plain.steps)
    assert rec_off.stopped == rec_on.stopped == set(stops)
    assert stops_in_verified_decodes(on) > 0
    ineligible = {i for i in rec_off.tokens if i % 8 in (3, 5)}
    assert ineligible and not ineligible & set(draft_counts(sim.steps))
    if off.meta["num_blocks"] == POOLS["tight"]:
        assert sum(len(s.preempted) for s in sim.steps) > 0


def test_whatif_reports_the_real_runs_acceptance(runs, tmp_path, capsys):
    """Through the command, with the step-time model fitted on the log without drafts."""
    off, on = runs
    out = tmp_path / "w.json"
    assert replay_main(["whatif", off.path, "--speculative", "ngram", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    real = recorded_figures(on)
    assert doc["recorded"]["draft_tokens"] == 0 and doc["recorded"]["acceptance"] is None
    for key in ("draft_tokens", "accepted_tokens", "acceptance", "steps"):
        assert doc["predicted"][key] == real[key], key
    assert doc["predicted"]["steps"] < doc["recorded"]["steps"]
    text = capsys.readouterr().out
    assert "speculative ngram" in text and "acceptance" in text
    assert "costs a decode row's" in text


def test_a_speculative_log_reproduces_itself_and_runs_without(runs):
    """Its own configuration (the default) with its recorded times is its schedule, drafts
    and all; `--speculative off` predicts it without drafts."""
    _, on = runs
    rec = recorded(on)
    reqs = from_log(on, rec)
    sim = simulate(scheduler_for(on.meta, Knobs()), reqs, RecordedTimes(rec.steps))
    assert shape(sim.steps) == shape(rec.steps)
    off = simulate(scheduler_for(on.meta, Knobs(speculative="off")), reqs, Constant())
    assert not draft_counts(off.steps) and len(off.steps) > len(sim.steps)


@pytest.fixture(scope="module")
def plain_log(tmp_path_factory) -> str:
    """A log of the null model: no batch-invariant mode."""
    path = tmp_path_factory.mktemp("null") / "null.db"
    record(SCENARIOS["priority"], path)
    return str(path)


@pytest.mark.parametrize("args,why", [
    (["--speculative", "draft:/m"], "a draft model's drafts need the model"),
    (["--num-draft", "2"], "add --speculative ngram"),
    (["--speculative", "ngram", "--num-draft", "0"], "--num-draft must be in [1, "),
    (["--speculative", "ngram", "--spec-max-batch", "0"], "--spec-max-batch must be at least"),
])
def test_what_speculation_cannot_predict_is_refused(probe, args, why, capsys):
    assert replay_main(["whatif", probe.path, *args]) == 2
    err = capsys.readouterr().err
    assert why in err and "Traceback" not in err


def test_a_log_without_the_batch_invariant_mode_is_refused(plain_log, capsys):
    assert replay_main(["whatif", plain_log, "--speculative", "ngram"]) == 2
    err = capsys.readouterr().err
    assert "batch-invariant" in err and "Traceback" not in err
    assert replay_main(["whatif", plain_log]) == 0   # without speculation it predicts


def test_a_trace_has_no_tokens_to_draft_from(probe, tmp_path, capsys):
    csv = tmp_path / "t.csv"
    assert replay_main(["trace", probe.path, "-o", str(csv)]) == 0
    assert replay_main(["whatif", "--trace", str(csv), "--step-model", probe.path,
                        "--speculative", "ngram"]) == 2
    assert "no tokens to draft from" in capsys.readouterr().err


def test_a_log_a_draft_model_drafted_is_predicted_only_another_way(tmp_path_factory, capsys):
    """Its drafts need the draft model: as it ran it is refused; off or by n-grams, predicted.
    Its own verify (without the models) takes the drafts from the log."""
    path = str(echo_checkpoint(tmp_path_factory, "echo-self"))
    draft = str(echo_checkpoint(tmp_path_factory, "echo-draft", 11))
    runner = make_runner(path, num_blocks=96, batch_invariant=True, draft=draft)
    log = record_offline(runner, tmp_path_factory.mktemp("drafted") / "d.db",
                         f"draft:{draft}", 96, {})
    assert log.meta["sched_config"]["draft_model"] is True
    assert any("drafts" in r.schedule for r in log.steps())
    assert replay_main(["verify", log.path]) == 0
    assert replay_main(["whatif", log.path]) == 2
    assert "draft model" in capsys.readouterr().err
    assert replay_main(["whatif", log.path, "--speculative", "off"]) == 0
    assert replay_main(["whatif", log.path, "--speculative", "ngram"]) == 0
