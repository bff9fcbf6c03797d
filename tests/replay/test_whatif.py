"""What-if replay (replay/whatif.py and its parts): the recorded configuration with the
recorded step times reproduces the recorded schedule exactly; knobs change what they must;
the step-time fit recovers known coefficients; bad input is a clear exit 2."""
from __future__ import annotations

import json
import random
import shutil
import sqlite3
from pathlib import Path

import pytest

from core.ipc.protocol import SamplingParams
from core.sched import Request
from core.steplog import StepLog
from core.config import log_meta
from replay.__main__ import main as replay_main
from replay.logfile import LogFile
from replay.record import SCENARIOS, Scenario, _cfg, _info
from replay.runmetrics import metrics, percentile
from replay.simulate import Knobs, scheduler_for, simulate
from replay.stepmodel import (FORWARD, GAP, KNOTS, MIN_STEPS, WORK, RecordedTimes, fit, forward_features,
                              gap_features, dot)
from replay.timeline import Step, recorded
from replay.trace import TraceError, from_log, read_csv, write_csv
from tests import FIXTURES



class Tokens:
    """A worker that answers every sampled row with a token that is never EOS."""
    def execute(self, batch):
        return [7] * len(batch.sample_rows)


def record_like_core(sc: Scenario, path: Path) -> Path:
    """The scenario driven as core/process.py drives the engine: a step only while something
    is unfinished; when idle, the next arrivals are added at once."""
    log = StepLog(str(path), log_meta(sc.cfg, sc.info))
    engine = sc.cfg.make_engine(sc.info, log)
    engine.runner = Tokens()
    arrivals = list(sc.arrivals)
    try:
        while arrivals or engine.sched.has_unfinished():
            due = engine.step_no if engine.sched.has_unfinished() else arrivals[0][0]
            while arrivals and arrivals[0][0] <= due:
                _, prompt, max_tokens, prio = arrivals.pop(0)
                engine.add(Request(prompt, max_tokens, prio), SamplingParams())
            engine.step()
    finally:
        log.close()
    return path


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> dict[str, LogFile]:
    d = tmp_path_factory.mktemp("whatif")
    return {name: LogFile(str(record_like_core(SCENARIOS[name], d / f"{name}.db")))
            for name in ("preempt", "priority", "prefix")}


def run(log: LogFile, knobs=Knobs(), timer=None):
    rec = recorded(log)
    reqs = from_log(log, rec)
    return rec, simulate(scheduler_for(log.meta, knobs), reqs, timer or RecordedTimes(rec.steps))


def shape(steps):
    return [(s.prefill, s.decode, s.preempted, s.sampled) for s in steps]


@pytest.mark.parametrize("name", ["preempt", "priority", "prefix"])
def test_recorded_configuration_and_times_reproduce_the_schedule(logs, name):
    rec, sim = run(logs[name])
    assert shape(sim.steps) == shape(rec.steps)
    assert [s.end for s in sim.steps] == pytest.approx([s.end for s in rec.steps], abs=1e-9)
    assert sim.refused == []
    if name == "preempt":
        assert sum(len(s.preempted) for s in sim.steps) > 0


def test_a_changed_schedule_would_be_seen(logs):
    """The comparison above can fail: one knob changed is another schedule."""
    log = logs["priority"]
    rec, sim = run(log, Knobs(max_batch_tokens=16), fit(recorded(log).steps))
    assert shape(sim.steps) != shape(rec.steps)


def test_recorded_figures_equal_predicted_with_recorded_times(logs):
    rec, sim = run(logs["priority"])
    reqs = from_log(logs["priority"], rec)
    arrivals, prios = {r.id: r.arrival_s for r in reqs}, {r.id: r.priority for r in reqs}
    assert metrics(sim.steps, arrivals, prios) == metrics(rec.steps, arrivals, prios)


def running(steps) -> int:
    return max(len(s.decode) + len(s.prefill) for s in steps)


def test_fewer_seats_run_fewer_sequences(logs):
    rec, sim = run(logs["preempt"], Knobs(max_seqs=2), fit(recorded(logs["preempt"]).steps))
    assert running(rec.steps) > 2 and running(sim.steps) <= 2
    assert sum(len(s.sampled) for s in sim.steps) == sum(len(s.sampled) for s in rec.steps)


def first_admissions(steps) -> list[int]:
    seen = []
    for s in steps:
        seen += [c[0] for c in s.prefill if c[0] not in seen]
    return seen


def test_fcfs_admits_in_arrival_order(logs):
    log = logs["priority"]
    rec = recorded(log)
    order = sorted(rec.arrivals, key=lambda i: (rec.arrivals[i], i))
    assert first_admissions(rec.steps) != order     # priorities reorder the recorded run
    _, sim = run(log, Knobs(policy="fcfs"), fit(rec.steps))
    assert first_admissions(sim.steps) == order


def synthetic_steps(forward, gap, n=200, seed=3, drafts=False) -> list[Step]:
    """`drafts`: some decodes are verified with 1..4 drafts."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for _ in range(n):
        prefill = tuple((i, rng.randrange(0, 300), rng.randrange(1, 200), True)
                        for i in range(rng.randrange(0, 4)))
        ctx = tuple(rng.randrange(10, 900) for _ in range(rng.randrange(0 if prefill else 1, 30)))
        ks = tuple(rng.choice((0, 0, 1, 2, 4)) for _ in ctx) if drafts else ()
        prev = rng.randrange(0, 30)
        start = t + dot(gap, gap_features(prev))
        end = start + dot(forward, forward_features(prefill, ctx, ks))
        out.append(Step(t, start, end, prefill, tuple(range(len(ctx))), ctx, (), (), prev,
                        True, ks))
        t = end
    return out


def coefficients(*work: float, knots=None) -> tuple:
    """A forward model: WORK's coefficients, then the knots' (0 unless given)."""
    assert len(work) == len(WORK)
    return work + (knots or (0.0,) * len(KNOTS))


def test_fit_recovers_known_coefficients():
    forward = coefficients(2e-3, 1e-5, 4e-6, 3e-4, 5e-5, 2e-5, 8e-5)
    gap = (3e-4, 1e-6)
    model = fit(synthetic_steps(forward, gap, drafts=True))
    assert model.verify_steps > 100
    assert model.forward == pytest.approx(forward, rel=1e-6)
    assert model.gap == pytest.approx(gap, rel=1e-6)
    assert model.r2 == pytest.approx(1.0) and model.mape < 1e-6
    assert len(model.forward) == len(FORWARD) and len(model.gap) == len(GAP)


def test_without_verified_decodes_a_verify_row_costs_a_decode_row():
    """A log made without speculation has no verify_rows to fit: the column is all zeros,
    and the model prices a verified decode's rows as decode rows (docs/design/whatif.md)."""
    model = fit(synthetic_steps(coefficients(2e-3, 1e-5, 4e-6, 3e-4, 5e-5, 2e-5, 0.0),
                                (3e-4, 1e-6)))
    decode, verify = WORK.index("decode_rows"), WORK.index("verify_rows")
    assert model.verify_steps == 0 and model.forward[verify] == model.forward[decode] > 0
    assert "no verified decodes" in model.describe()
    # a decode with 3 drafts costs as 4 decodes of contexts c..c+3 (the knots aside)
    one = forward_features((), (100,), (3,))
    four = forward_features((), (100, 101, 102, 103))
    assert dot(model.forward[:len(WORK)], one) == pytest.approx(dot(model.forward[:len(WORK)], four))


def test_fit_keeps_coefficients_non_negative():
    """A feature whose true cost is 0 and that noise would make negative comes out 0."""
    steps = synthetic_steps(coefficients(1e-3, 1e-5, 0.0, 0.0, 5e-5, 0.0, 0.0), (1e-4, 0.0))
    rng = random.Random(1)
    noisy = [Step(s.ready, s.start, s.start + (s.end - s.start) * rng.uniform(0.97, 1.03),
                  s.prefill, s.decode, s.decode_ctx, s.preempted, s.sampled, s.prev_sampled)
             for s in steps]
    model = fit(noisy)
    assert min(model.forward[:len(WORK)]) >= 0 and min(model.gap) >= 0
    assert model.forward[1] == pytest.approx(1e-5, rel=0.2)


def test_fit_follows_a_cost_that_bends_with_the_token_count():
    """Flat while the weights are read (up to 16 tokens), then rising: the piecewise part
    recovers it where one slope per token could not."""
    bend = tuple(3e-4 if k == 16 else 0.0 for k in KNOTS)
    steps = synthetic_steps(coefficients(2e-2, 0.0, 0.0, 0.0, 0.0, 1e-5, 0.0, knots=bend),
                            (0.0, 0.0), n=300)
    model = fit(steps)
    assert model.mape < 1e-6
    assert model.forward[FORWARD.index("tokens_over_16")] == pytest.approx(3e-4, rel=1e-4)


def test_too_short_a_log_is_refused(tmp_path, capsys):
    sc = Scenario("short", _cfg(max_seqs=4), _info(64), [(0, [5, 6, 7], 3, 0)])
    path = record_like_core(sc, tmp_path / "short.db")
    with pytest.raises(TraceError, match=f"at least {MIN_STEPS}"):
        fit(recorded(LogFile(str(path))).steps)
    assert replay_main(["whatif", str(path)]) == 2
    err = capsys.readouterr().err
    assert "usable steps" in err and f"at least {MIN_STEPS}" in err and "Traceback" not in err


def test_trace_csv_round_trip(logs, tmp_path):
    log = logs["priority"]
    reqs = from_log(log, recorded(log))
    write_csv(reqs, str(tmp_path / "t.csv"))
    back = read_csv(str(tmp_path / "t.csv"))
    assert [(r.arrival_s, len(r.prompt), len(r.output), r.priority) for r in back] == \
           [(r.arrival_s, len(r.prompt), len(r.output), r.priority) for r in reqs]


def test_cli_whatif_json_and_trace(logs, tmp_path, capsys):
    path = logs["priority"].path
    assert replay_main(["whatif", path, "--max-seqs", "2", "--policy", "fcfs",
                        "--json", str(tmp_path / "w.json")]) == 0
    doc = json.loads((tmp_path / "w.json").read_text())
    keys = {"throughput_tok_s", "makespan_s", "ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50",
            "tpot_ms_p99", "queue_ms_p50", "queue_ms_p99", "preemptions", "by_priority",
            "steps", "draft_tokens", "accepted_tokens", "acceptance"}
    assert set(doc) == {"recorded", "predicted", "fit"} and set(doc["fit"]) == {"r2", "mape"}
    assert set(doc["recorded"]) == keys == set(doc["predicted"])
    for figs in doc["predicted"]["by_priority"].values():
        assert set(figs) == {"n", "queue_ms_mean", "ttft_ms_p50"}
    assert "max_seqs 2" in capsys.readouterr().out
    csv = tmp_path / "t.csv"
    assert replay_main(["trace", path, "-o", str(csv)]) == 0
    assert replay_main(["whatif", "--trace", str(csv), "--step-model", path,
                        "--load", "2", "--json", str(tmp_path / "t.json")]) == 0
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["recorded"] is None and doc["predicted"]["makespan_s"] > 0
    assert replay_main(["whatif", path, "--fit"]) == 0
    assert "prefill_tokens" in capsys.readouterr().out


def test_old_logs_without_arrival_times_still_simulate(tmp_path, capsys):
    path = tmp_path / "p.db"
    shutil.copy(FIXTURES / "golden_priority.db", path)
    assert replay_main(["whatif", str(path), "--json", str(tmp_path / "j.json")]) == 0
    assert json.loads((tmp_path / "j.json").read_text())["predicted"]["makespan_s"] > 0


@pytest.mark.parametrize("text,why", [("a,b\n1,2\n", "first line"),
                                      ("arrival_s,prompt_tokens,output_tokens,priority\n"
                                       "0.5,x,3,0\n", "not numbers"),
                                      ("arrival_s,prompt_tokens,output_tokens,priority\n"
                                       "0.5,0,3,0\n", "prompt_tokens >= 1")])
def test_bad_traces_are_refused(logs, tmp_path, capsys, text, why):
    csv = tmp_path / "bad.csv"
    csv.write_text(text)
    assert replay_main(["whatif", "--trace", str(csv), "--step-model", logs["preempt"].path]) == 2
    assert why in capsys.readouterr().err


def test_bad_configuration_and_arguments_are_refused(logs, capsys):
    path = logs["preempt"].path
    assert replay_main(["whatif", path, "--max-seqs", "-1"]) == 2
    assert "max_seqs" in capsys.readouterr().err
    assert replay_main(["whatif", path, "--max-chunk", "0"]) == 2
    assert "must be a positive int" in capsys.readouterr().err
    for blocks in (0, 10 ** 12):   # past the engine's bound (core/config.py), not a MemoryError
        assert replay_main(["whatif", path, "--num-blocks", str(blocks)]) == 2
        assert "num_blocks must be in [1, " in capsys.readouterr().err
    assert replay_main(["whatif"]) == 2
    assert replay_main(["whatif", path, "--load", "0"]) == 2


def test_percentile_interpolates():
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([5], 99) == 5
    assert percentile([], 50) is None


def test_plot_draws_both_timelines(logs, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "w.png"
    assert replay_main(["whatif", logs["preempt"].path, "--max-seqs", "2", "--plot", str(out)]) == 0
    assert out.stat().st_size > 1000


def test_hiccups_stay_out_of_the_slopes_but_in_the_total():
    # verify_rows as decode_rows: the fit gives it that without verified decodes
    forward, gap = coefficients(2e-3, 1e-5, 4e-6, 3e-4, 5e-5, 2e-5, 5e-5), (3e-4, 1e-6)
    steps = synthetic_steps(forward, gap)
    slow = {3: 2.5, 50: 0.8}     # a warm-up and a pause, in seconds
    steps = [Step(s.ready, s.start, s.end + slow.get(k, 0.0), s.prefill, s.decode,
                  s.decode_ctx, s.preempted, s.sampled, s.prev_sampled)
             for k, s in enumerate(steps)]
    model = fit(steps)
    assert model.forward[1:] == pytest.approx(forward[1:], rel=1e-6)
    total = sum(model.gap_s(0, s.prev_sampled) + model.forward_s(0, forward_features(
        s.prefill, s.decode_ctx)) for s in steps)
    assert total == pytest.approx(sum(s.end - s.ready for s in steps), rel=1e-9)


@pytest.mark.slow  # starts a group
def test_a_live_log_is_reproduced_step_for_step(tmp_path):
    """Arrivals stamped when the core reads them (mid-step too) put each request before the
    same step in the simulation as in the live run."""
    from scripts.benchmarks import whatif as bench
    a, serve_args = bench.parse(["--model", "tiny", "--quick", "--no-progress"])
    reqs, prios = bench.workload(a, (1, 500))
    log = tmp_path / "a" / "steps.db"
    log.parent.mkdir()
    # a plain log: an overlapped one plans each step a step ahead, which the simulation only
    # approximates (test_overlap_delays_an_arrival_by_a_step)
    assert bench.run_live(a, serve_args, "--max-seqs 6 --no-overlap", reqs, prios, log,
                          "A") == []
    rec, sim = run(LogFile(str(log)))
    assert len(rec.arrivals) == len(reqs) and shape(sim.steps) == shape(rec.steps)


def test_fit_recovers_known_coefficients_from_a_log(logs, tmp_path):
    """A recorded log whose times are rewritten from known coefficients, the features taken
    from the real scheduler re-running the log (not from replay/timeline.py's bookkeeping)."""
    from core.config import engine_from_meta
    from replay.verify import _apply_inputs
    forward, gap = coefficients(1.5e-3, 2e-5, 3e-6, 4e-4, 6e-5, 1e-5, 6e-5), (2e-4, 3e-6)
    path = tmp_path / "synthetic.db"
    shutil.copy(logs["preempt"].path, path)
    log = LogFile(str(path))
    engine = engine_from_meta(log.meta)
    times, arrivals, end, prev = [], {}, 1000.0, 0
    for row in log.steps():
        for kind, seq_id in log.inputs.get(row.step, ()):
            arrivals[seq_id] = end          # it arrived as the previous step ended
        assert _apply_inputs(engine, log, row.step) is None
        engine.plan(build=False)
        out = engine.last_schedule
        ctx = [len(engine.sched.tokens(i)) for i in out.decode]
        prefill = [(c.id, c.start, c.length, c.last) for c in out.prefill]
        engine.commit([o[1] for o in row.outputs])
        start = end + dot(gap, gap_features(prev))
        end = start + dot(forward, forward_features(prefill, ctx))
        times.append((row.step, end, (end - start) * 1e3))
        prev = len(row.outputs) if row.running + row.waiting else 0
    with sqlite3.connect(path) as conn:
        conn.executemany("UPDATE steps SET wall_time=?, duration_ms=? WHERE step=?",
                         [(e, d, k) for k, e, d in times])
        conn.executemany("UPDATE requests SET arrival_time=? WHERE id=?",
                         [(t, i) for i, t in arrivals.items()])
    model = fit(recorded(LogFile(str(path))).steps)
    assert model.forward == pytest.approx(forward, rel=1e-4)
    assert model.gap == pytest.approx(gap, rel=1e-4)


class Constant:
    """Every step takes 1 s and no gap."""
    def gap_s(self, k, prev):
        return 0.0

    def forward_s(self, k, features):
        return 1.0


def test_overlap_delays_an_arrival_by_a_step(logs):
    """Overlapped, step k is planned while step k-1 runs: a request arriving during step 1
    (t in (1, 2)) joins step 3 rather than step 2."""
    from replay.trace import TraceRequest
    reqs = [TraceRequest(0, 0.0, (1, 2, 3), tuple(range(8))),
            TraceRequest(1, 1.5, (4, 5, 6), (7, 8))]

    def first_step_of(overlap: bool) -> int:
        sim = simulate(scheduler_for(logs["preempt"].meta, Knobs()), reqs, Constant(), overlap)
        return next(k for k, st in enumerate(sim.steps) if any(c[0] == 1 for c in st.prefill))
    assert (first_step_of(False), first_step_of(True)) == (2, 3)


def test_an_overlapped_timeline_has_no_overlapping_steps(tmp_path):
    """Each step of an overlapped log starts when the one before it settled."""
    from replay.timeline import _unoverlap
    from types import SimpleNamespace as Row
    rows = [Row(wall_time=1.0), Row(wall_time=2.0), Row(wall_time=2.5)]
    starts = [0.5, 0.8, 2.1]     # step 1 was planned while step 0 ran
    _unoverlap(rows, starts)
    assert starts == [0.5, 1.0, 2.1]
