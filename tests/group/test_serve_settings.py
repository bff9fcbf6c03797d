"""Settings the model cannot take are refused before any process starts: scripts/serve
exits 2 with one line naming why (worker/settings.py), as for its other bad settings, and a
worker started with them anyway, or one that fails while loading, says so in one line and
exits 2: never a traceback from inside loading."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scripts.group.supervisor import main as serve_main
from worker.load import resolve_model

# tiny: 4 attention heads, 2 KV heads, 2048 positions
REFUSED = {
    "tp 3": (["--tp", "3"], "--tp 3 does not divide the model's 4 attention heads"),
    "tp 4": (["--tp", "4"], "--tp 4 does not divide the model's 2 KV heads"),
    "tp 2, null model": (["--tp", "2", "--model", "null"], "the null model has no weights"),
    "tp 2, kv-memory 1": (["--tp", "2", "--kv-memory", "1"],
                          "the KV pool must hold at least one block"),
    "tp 2, max-model-len 99999": (["--tp", "2", "--max-model-len", "99999"],
                                  "max_model_len 99999 exceeds the model's limit 2048"),
    "kv-memory 1": (["--kv-memory", "1"], "the KV pool must hold at least one block"),
    "max-model-len 99999": (["--max-model-len", "99999"], "exceeds the model's limit 2048"),
    "num-blocks 1e12": (["--num-blocks", str(10 ** 12)], "num_blocks must be in [1, "),
    "block-size 2**31": (["--num-blocks", "4", "--block-size", str(2 ** 31)],
                         "block_size must be in [1, "),
}


@pytest.mark.parametrize("case", REFUSED)
def test_serve_refuses_before_starting_anything(case, capsys):
    args, why = REFUSED[case]
    assert serve_main(["--no-log", "--address", "tcp://127.0.0.1:0", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("serve: ") and why in err, err


def test_serve_refusal_from_the_command_line():
    r = subprocess.run([sys.executable, "-m", "scripts.group.supervisor", "--no-log",
                        "--address", "tcp://127.0.0.1:0", "--tp", "3"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "does not divide the model's 4 attention heads" in r.stderr
    assert r.stdout == ""   # no `ready`: nothing was started


def worker(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "worker", "--to-core", "ipc:///nowhere-in",
                           "--from-core", "ipc:///nowhere-out", *args],
                          capture_output=True, text=True, timeout=180)


def test_a_worker_started_with_them_says_why_in_one_line():
    r = worker("--tp", "2", "--kv-memory", "1")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("[worker] cannot start: the KV pool must hold at least one")


def test_a_worker_that_fails_while_loading_says_why_in_one_line(tmp_path):
    """A checkpoint whose config reads but whose weights are missing."""
    config = json.loads((resolve_model("tiny") / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    r = worker("--model", str(tmp_path), "--num-blocks", "8")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("[worker]")]
    assert len(lines) == 1 and lines[0].startswith("[worker] cannot start: "), r.stderr
