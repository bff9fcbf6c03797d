"""Step log and replay on offline runs: schema, verify, corruption, golden logs, bad files."""
from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from replay.__main__ import main as replay_main
from replay.logfile import LogFile
from replay.record import SCENARIOS, record
from replay.verify import verify
from tests import FIXTURES



@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("logs")
    out = {}
    for name, sc in SCENARIOS.items():
        out[name] = d / f"{name}.db"
        record(sc, out[name])
    return out


def copy(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / src.name
    shutil.copy(src, dst)
    return dst


def sql(path: Path, query: str, *args) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute(query, args)


def test_schema_is_readable_as_it_is(logs):
    conn = sqlite3.connect(logs["preempt"])
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"meta", "requests", "inputs", "steps"} <= tables
    meta = {k: json.loads(v) for k, v in conn.execute("SELECT key, value FROM meta")}
    assert meta["block_size"] == 4 and meta["sched_config"]["max_seqs"] == 8
    sched = json.loads(conn.execute("SELECT schedule FROM steps WHERE step=0").fetchone()[0])
    assert set(sched) == {"prefill", "decode", "preempted"}
    outs = json.loads(conn.execute("SELECT outputs FROM steps WHERE step=0").fetchone()[0])
    assert all(len(o) == 3 for o in outs)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert stat.S_IMODE(os.stat(logs["preempt"]).st_mode) == 0o600


def test_every_scenario_verifies(logs):
    for name, path in logs.items():
        v = verify(LogFile(str(path)))
        assert v.ok, (name, v.divergence)
        assert v.steps == LogFile(str(path)).num_steps() > 10


def test_preempt_scenario_preempts(logs):
    rows = list(LogFile(str(logs["preempt"])).steps())
    assert sum(len(r.schedule["preempted"]) for r in rows) > 0


def test_changed_schedule_is_caught_and_named(logs, tmp_path):
    path = copy(logs["preempt"], tmp_path)
    sql(path, "UPDATE steps SET schedule=? WHERE step=5",
        json.dumps({"prefill": [], "decode": [], "preempted": []}))
    v = verify(LogFile(str(path)))
    assert not v.ok and v.divergence.step == 5 and v.divergence.what == "schedule"


def test_changed_token_is_caught(logs, tmp_path):
    path = copy(logs["preempt"], tmp_path)
    conn = sqlite3.connect(path)
    outs = json.loads(conn.execute("SELECT outputs FROM steps WHERE step=7").fetchone()[0])
    conn.close()
    outs[0][1] = (outs[0][1] + 1) % 512
    sql(path, "UPDATE steps SET outputs=? WHERE step=7", json.dumps(outs))
    v = verify(LogFile(str(path)))
    assert not v.ok and v.divergence.step == 7


def test_changed_token_is_caught_with_the_model(logs, tmp_path):
    from worker.null import NullRunner
    path = copy(logs["aborts"], tmp_path)
    conn = sqlite3.connect(path)
    outs = json.loads(conn.execute("SELECT outputs FROM steps WHERE step=4").fetchone()[0])
    conn.close()
    outs[-1][1] = (outs[-1][1] + 1) % 512
    sql(path, "UPDATE steps SET outputs=? WHERE step=4", json.dumps(outs))
    sc = SCENARIOS["aborts"]
    runner = NullRunner(num_blocks=sc.info.num_blocks, block_size=sc.info.block_size)
    assert verify(LogFile(str(logs["aborts"])), runner).ok
    v = verify(LogFile(str(path)), NullRunner(num_blocks=40, block_size=4))
    assert not v.ok and (v.divergence.step, v.divergence.what) == (4, "tokens")


def test_dropped_input_is_caught(logs, tmp_path):
    path = copy(logs["aborts"], tmp_path)
    sql(path, "DELETE FROM inputs WHERE kind='abort' AND step=(SELECT min(step) FROM inputs"
              " WHERE kind='abort')")
    v = verify(LogFile(str(path)))
    assert not v.ok


def test_cli_names_the_first_divergent_step(logs, tmp_path, capsys):
    path = copy(logs["priority"], tmp_path)
    sql(path, "UPDATE steps SET hash='x' WHERE step=9")
    assert replay_main(["verify", str(path)]) == 1
    out = capsys.readouterr().out
    assert "DIVERGED at step 9 (hash)" in out and ">> step 9" in out


GOLDEN = ["preempt", "priority", "aborts", "prefix"]


@pytest.mark.parametrize("fmt, folder", [(3, FIXTURES), (2, FIXTURES / "format2")])
@pytest.mark.parametrize("name", GOLDEN)
def test_golden_logs_replay(name, fmt, folder, tmp_path):
    """A change to scheduling decisions fails here with the step it changed.
    Re-record after an intended change: python -m replay.record tests/fixtures
    The format 2 logs (the state hash over whole tables) were recorded before format 3."""
    log = LogFile(str(copy(folder / f"golden_{name}.db", tmp_path)))
    assert log.meta["format"] == fmt
    v = verify(log)
    assert v.ok, f"golden log {name} diverges: {v.divergence}"


@pytest.mark.parametrize("name", GOLDEN)
def test_log_formats_differ_in_the_hash_alone(name, tmp_path):
    """The same scenario in both formats: the same steps, other hashes."""
    rows = []
    for d in (FIXTURES / "format2", FIXTURES):
        (tmp_path / d.name).mkdir()
        rows.append(list(LogFile(str(copy(d / f"golden_{name}.db", tmp_path / d.name))).steps()))
    old_rows, new_rows = rows
    strip = lambda rows: [(r.step, r.schedule, r.outputs, r.free_blocks) for r in rows]
    assert strip(old_rows) == strip(new_rows)
    assert all(a.hash != b.hash for a, b in zip(old_rows, new_rows))


def test_golden_logs_match_their_scenarios(logs, tmp_path):
    """Recording a scenario today gives the golden log's steps exactly."""
    for name, path in logs.items():
        golden = LogFile(str(copy(FIXTURES / f"golden_{name}.db", tmp_path)))
        fresh = LogFile(str(path))
        assert [r.hash for r in golden.steps()] == [r.hash for r in fresh.steps()], name


def test_truncated_log_replays_to_its_last_step(logs, tmp_path):
    path = copy(logs["preempt"], tmp_path)
    sql(path, "DELETE FROM steps WHERE step >= 20")
    v = verify(LogFile(str(path)))
    assert v.ok and v.steps == 20


def test_bad_files_get_clear_errors(tmp_path, logs, capsys):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    cut = tmp_path / "cut.db"
    cut.write_bytes(logs["preempt"].read_bytes()[:5000])
    future = copy(logs["preempt"], tmp_path)
    sql(future, "UPDATE meta SET value='99' WHERE key='format'")
    for path, words in [(junk, "not a step log"), (other, "not a step log"),
                        (cut, "step log"), (future, "format 99"),
                        (tmp_path / "missing.db", "no such file")]:
        assert replay_main(["verify", str(path)]) == 2, path
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err, err


def test_reports(logs, tmp_path, capsys):
    path = str(logs["aborts"])
    assert replay_main(["summary", path]) == 0
    out = capsys.readouterr().out
    assert "requests  20" in out and "aborts 3" in out and "priority" in out
    assert replay_main(["request", path, "2"]) == 0
    out = capsys.readouterr().out
    assert "arrived" in out and "finished" in out
    assert replay_main(["diff", path, path]) == 0
    other = copy(logs["aborts"], tmp_path)
    sql(other, "UPDATE steps SET free_blocks=free_blocks+1 WHERE step=11")
    assert replay_main(["diff", path, str(other)]) == 1
    assert "step 11 differs" in capsys.readouterr().out


def test_scripts_replay_runs_as_a_command(logs):
    r = subprocess.run([sys.executable, "-m", "replay", "verify", str(logs["preempt"])],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("ok:"), r.stderr


def test_plot_lanes_cover_each_request(logs):
    from replay.plot import lanes
    log = LogFile(str(logs["preempt"]))
    segs = lanes(log)
    assert set(segs) == set(log.requests)
    states = {s for ss in segs.values() for _, _, s in ss}
    assert {"waiting", "running", "preempted"} <= states
    for seq_id, ss in segs.items():
        assert ss[0][0] == log.requests[seq_id]["arrival_step"]
        assert all(a <= b for a, b, _ in ss)


def test_plot_writes_a_png(logs, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "t.png"
    assert replay_main(["plot", str(logs["preempt"]), "-o", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_with_model_refuses_a_device_this_machine_lacks(logs, tmp_path, capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    path = copy(logs["aborts"], tmp_path)
    with sqlite3.connect(path) as conn:
        info = json.loads(conn.execute("SELECT value FROM meta WHERE key='model_info'").fetchone()[0])
        conn.execute("UPDATE meta SET value=? WHERE key='model_info'",
                     (json.dumps({**info, "device": "cuda:0"}),))
    assert replay_main(["verify", "--with-model", str(path)]) == 3
    err = capsys.readouterr().err
    assert "made on cuda:0" in err and "no CUDA device" in err and "--device cpu" in err
    assert replay_main(["verify", "--with-model", "--device", "cpu", str(path)]) == 0
    assert "tokens may differ" in capsys.readouterr().err


def test_a_cache_that_decides_differently_diverges_at_its_step(logs, tmp_path):
    path = copy(logs["prefix"], tmp_path)
    with sqlite3.connect(path) as conn:
        step, doc = next((r[0], json.loads(r[1])) for r in conn.execute(
            "SELECT step, schedule FROM steps ORDER BY step") if '"cached"' in r[1])
    doc["cached"][0][1] -= 1
    sql(path, "UPDATE steps SET schedule=? WHERE step=?", json.dumps(doc), step)
    v = verify(LogFile(str(path)))
    assert not v.ok and (v.divergence.step, v.divergence.what) == (step, "schedule")
    assert v.divergence.diffs[0].startswith("cached: replay")
    sql(path, "UPDATE meta SET value='false' WHERE key='prefix_cache'")
    assert verify(LogFile(str(path))).divergence.step == 0   # the cache's state is hashed
