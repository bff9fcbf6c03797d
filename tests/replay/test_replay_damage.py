"""Replay tells damage from divergence: a damaged log is one line on stderr and exit 2 for
every subcommand, a divergence or difference exit 1 (real logs from the offline engine,
damaged with sqlite3)."""
from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from replay.__main__ import main as replay_main
from replay.record import SCENARIOS, record


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("logs") / "aborts.db"
    record(SCENARIOS["aborts"], path)
    with sqlite3.connect(path) as conn:  # self-contained: copies need no -wal
        conn.execute("PRAGMA journal_mode=DELETE")
    return path


def damaged(good: Path, tmp_path: Path, *queries: str) -> Path:
    path = tmp_path / "damaged.db"
    shutil.copy(good, path)
    with sqlite3.connect(path) as conn:
        for q in queries:
            conn.execute(q)
    return path


DAMAGE = {
    "no table": (["DROP TABLE inputs"], "no table inputs"),
    "no column": (["ALTER TABLE steps DROP COLUMN hash"], "table steps has no column hash"),
    "bad JSON in steps": (["UPDATE steps SET schedule='{oops' WHERE step=3"],
                          "step 3: schedule is not JSON"),
    "bad JSON in requests": (["UPDATE requests SET sampling='[1,' WHERE id=2"],
                             "request 2: sampling is not JSON"),
    "bad JSON in meta": (["UPDATE meta SET value='{' WHERE key='sched_config'"],
                         "meta 'sched_config' is not JSON"),
    "deleted request": (["DELETE FROM requests WHERE id=3"],
                        "names request 3, which the requests table lacks"),
    "deleted meta key": (["DELETE FROM meta WHERE key='seed'"], "meta has no key 'seed'"),
    "text for a number in steps": (["UPDATE steps SET free_blocks='many' WHERE step=4"],
                                   "step 4: free_blocks is 'many', not an integer"),
    "text for a number in requests": (["UPDATE requests SET max_tokens='lots' WHERE id=1"],
                                      "request 1: max_tokens is 'lots', not an integer"),
    "text for a number in meta": (["UPDATE meta SET value='\"x\"' WHERE key='num_blocks'"],
                                  "meta num_blocks is 'x', not an integer"),
    "empty prompt": (["UPDATE requests SET prompt_tokens='[]' WHERE id=2"],
                     "request 2: empty prompt"),
    "wrong shape": (["UPDATE steps SET outputs='[[1, 2]]' WHERE step=5"],
                    "step 5: outputs holds [1, 2], not [int, int, bool]"),
    "unknown sampling key": (["UPDATE requests SET sampling='{\"warmth\": 1}' WHERE id=0"],
                             "request 0: sampling has an unknown key 'warmth'"),
    "unknown input kind": (["UPDATE inputs SET kind='poke' WHERE step=(SELECT min(step) FROM inputs)"],
                           "kind is 'poke', not one of"),
    "a gap": (["INSERT INTO gaps VALUES (4, 9, 50, 'step log: database or disk is full')"],
              "steps 4..9 were not logged"),
}


def commands(path: Path, good: Path, tmp_path: Path) -> list[list[str]]:
    cmds = [["verify", str(path)], ["summary", str(path)], ["request", str(path), "1"],
            ["diff", str(good), str(path)], ["diff", str(path), str(good)]]
    try:
        import matplotlib  # noqa: F401
        cmds.append(["plot", str(path), "-o", str(tmp_path / "t.png")])
    except ImportError:
        pass
    return cmds


@pytest.mark.parametrize("kind", DAMAGE)
def test_damage_is_one_line_and_exit_2_everywhere(kind, good, tmp_path, capsys):
    queries, words = DAMAGE[kind]
    path = damaged(good, tmp_path, *queries)
    for argv in commands(path, good, tmp_path):
        assert replay_main(argv) == 2, (kind, argv)
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, (argv, err)
        assert err.startswith(f"error: {path}: ")


def test_damage_from_the_command_line(good, tmp_path):
    path = damaged(good, tmp_path, "DELETE FROM requests WHERE id=3")
    r = subprocess.run([sys.executable, "-m", "replay", "verify", str(path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr and "request 3" in r.stderr


def test_a_divergence_stays_exit_1(good, tmp_path, capsys):
    path = damaged(good, tmp_path, "UPDATE steps SET hash='x' WHERE step=6")
    assert replay_main(["verify", str(path)]) == 1
    assert "DIVERGED at step 6 (hash)" in capsys.readouterr().out


def test_an_output_too_few_diverges(good, tmp_path, capsys):
    with sqlite3.connect(good) as conn:
        step, outs = conn.execute("SELECT step, outputs FROM steps"
                                  " ORDER BY length(outputs) DESC").fetchone()
    outs = json.loads(outs)
    assert len(outs) > 1
    path = damaged(good, tmp_path, f"UPDATE steps SET outputs='{json.dumps(outs[1:])}'"
                                   f" WHERE step={step}")
    assert replay_main(["verify", str(path)]) == 1
    assert f"DIVERGED at step {step} (outputs)" in capsys.readouterr().out


def test_a_request_the_engine_refuses_diverges(good, tmp_path, capsys):
    long = json.dumps(list(range(1, 400)))  # longer than the scenario's max_model_len
    path = damaged(good, tmp_path, f"UPDATE requests SET prompt_tokens='{long}' WHERE id=4")
    assert replay_main(["verify", str(path)]) == 1
    assert "request 4 was refused" in capsys.readouterr().out


def test_diff_compares_the_requests(good, tmp_path, capsys):
    path = damaged(good, tmp_path, "UPDATE requests SET max_tokens=max_tokens+1 WHERE id=3")
    assert replay_main(["diff", str(good), str(path)]) == 1
    out = capsys.readouterr().out
    assert "request 3 differs" in out and "max_tokens" in out
    path = damaged(good, tmp_path, "UPDATE inputs SET step=step+1 WHERE kind='abort'")
    assert replay_main(["diff", str(good), str(path)]) == 1
    assert "inputs before step" in capsys.readouterr().out


def test_a_log_from_before_the_optional_columns_still_reads(good, tmp_path, capsys):
    """Logs made before `user`, `arrival_time` and `key_hash` existed lack those columns."""
    path = damaged(good, tmp_path, *(f"ALTER TABLE requests DROP COLUMN {c}"
                                     for c in ("user", "arrival_time", "key_hash")))
    assert replay_main(["verify", str(path)]) == 0, capsys.readouterr()
    assert replay_main(["request", str(path), "1"]) == 0
