"""Hostile step logs at replay: a value no engine could have logged (JSON nested past the
parser, a KV layout past the engine's bounds, a token past the vocabulary, sampling fields
the frontend refuses) is damage, one line on stderr naming the row and the column and exit 2,
for every scripts/replay command, never a traceback and never a divergence (exit 1).

The log is a real one: written in-process by the engine over the tiny model, so that
`verify --with-model` and `request --rerun` run the model on what they read."""
from __future__ import annotations

import json
import random
import shutil
import sqlite3
from pathlib import Path

import pytest

from core.config import CoreConfig, log_meta
from core.ipc.protocol import SamplingParams
from core.sched import Request
from core.steplog import StepLog
from replay.__main__ import main as replay_main
from tests.logfaults import new_log

SAMPLINGS = (SamplingParams(), SamplingParams(temperature=0.8, top_k=20, seed=5, logprobs=2),
             SamplingParams(temperature=1.0, top_p=0.9))


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """14 requests over the tiny model, enough steps for whatif's fit (30)."""
    from worker.load import make_runner
    runner = make_runner("tiny", num_blocks=64, block_size=4)
    path = tmp_path_factory.mktemp("logs") / "tiny.db"
    cfg = CoreConfig("-", "-", "-", "-", max_seqs=3, max_batch_tokens=32, max_chunk=16,
                     overlap=False)
    log = StepLog(str(path), log_meta(cfg, runner.info))
    engine = cfg.make_engine(runner.info, log=log)
    engine.runner = runner
    rng = random.Random(0)
    for i in range(14):
        prompt = [rng.randrange(1, 512) for _ in range(rng.randint(3, 20))]
        engine.add(Request(prompt, 8), SAMPLINGS[i % 3], ignore_eos=True)
    engine.run()
    log.close()
    with sqlite3.connect(path) as conn:  # self-contained: copies need no -wal
        conn.execute("PRAGMA journal_mode=DELETE")
    return path


def commands(path: Path, good: Path, tmp_path: Path) -> dict[str, list[str]]:
    """Every scripts/replay command (with the model where one can run it) on `path`."""
    p = str(path)
    return {"verify": ["verify", p], "verify --with-model": ["verify", "--with-model", p],
            "summary": ["summary", p], "request": ["request", p, "1"],
            "request --rerun": ["request", p, "1", "--rerun"],
            "diff": ["diff", str(good), p], "plot": ["plot", p, "-o", str(tmp_path / "t.png")],
            "whatif": ["whatif", p], "trace": ["trace", p, "-o", str(tmp_path / "t.csv")]}


COMMANDS = list(commands(Path("x"), Path("y"), Path("z")))
DEEP = "[" * 100_000 + "]" * 100_000


def sampling(field: str, value):
    return ("requests", "sampling", "id=1", lambda doc: {**doc, field: value})


# case: (table, column, row, how the value changes), the words that name row and column
CASES = {
    "deep JSON in meta": (("meta", "value", "key='sched_config'", lambda _: DEEP),
                          ["meta 'sched_config'", "nested too deeply"]),
    **{f"deep JSON in requests.{c}": (("requests", c, "id=1", lambda _: DEEP),
                                      [f"request 1: {c}", "nested too deeply"])
       for c in ("prompt_tokens", "sampling", "output_tokens")},
    **{f"deep JSON in steps.{c}": (("steps", c, "step=3", lambda _: DEEP),
                                   [f"step 3: {c}", "nested too deeply"])
       for c in ("schedule", "outputs")},
    "num_blocks 1e12": (("meta", "value", "key='num_blocks'", lambda _: 10 ** 12),
                        ["meta", "num_blocks"]),
    "block_size 1e9": (("meta", "value", "key='block_size'", lambda _: 10 ** 9),
                       ["meta", "block_size"]),
    "top_k 2**40": (sampling("top_k", 2 ** 40), ["request 1: sampling", "top_k"]),
    "seed 2**80": (sampling("seed", 2 ** 80), ["request 1: sampling", "seed"]),
    "NaN temperature": (sampling("temperature", float("nan")),
                        ["request 1: sampling", "temperature"]),
    "logprobs 1e6": (sampling("logprobs", 10 ** 6), ["request 1: sampling", "logprobs"]),
    # SQLite keeps an infinite REAL; whatif's clock never reached it (a hang)
    "inf wall_time": (("steps", "wall_time", "step=5", lambda _: float("inf")),
                      ["step 5: wall_time", "not a finite number"]),
    "inf arrival_time": (("requests", "arrival_time", "id=2", lambda _: float("inf")),
                         ["request 2: arrival_time", "not a finite number"]),
    # an API key's short hash is bounded hex; anything else a log holds is damage
    "key_hash not hex": (("requests", "key_hash", "id=2", lambda _: "K" * 100),
                         ["request 2: key_hash", "hex digits"]),
    # finite but past any clock: the what-if fit overflowed on it
    "wall_time 1e300": (("steps", "wall_time", "step=5", lambda _: 1e300),
                        ["step 5: wall_time", "outside [0, 2**32)"]),
    "duration_ms -1": (("steps", "duration_ms", "step=5", lambda _: -1.0),
                       ["step 5: duration_ms", "outside [0, 2**32)"]),
    # more free blocks than the pool holds: summary's KV sparkline indexed past its scale
    "free_blocks 2**31": (("steps", "free_blocks", "step=5", lambda _: 2 ** 31),
                          ["step 5: free_blocks", "more than 64"]),
}
# columns that are not JSON
SCALARS = {"wall_time", "duration_ms", "arrival_time", "free_blocks", "key_hash"}


def token(column: str, t: int):
    """Request 1's first prompt or output token, or step 3's first output's, made t."""
    if column == "outputs":
        return ("steps", "outputs", "step=3", lambda doc: [[doc[0][0], t, doc[0][2]]] + doc[1:])
    return ("requests", column, "id=1", lambda doc: [t] + doc[1:])


for _t in (2 ** 40, 512):   # past int32; the vocabulary's size (ids are 0..511)
    for _col, _row in (("prompt_tokens", "request 1:"), ("output_tokens", "request 1:"),
                       ("outputs", "step 3:")):
        CASES[f"token {_t} in {_col}"] = (token(_col, _t), [f"{_row} {_col}", str(_t)])


def hostile(good: Path, tmp_path: Path, table: str, column: str, where: str, change) -> Path:
    path = tmp_path / "hostile.db"
    shutil.copy(good, path)
    with sqlite3.connect(path) as conn:
        (old,) = conn.execute(f"SELECT {column} FROM {table} WHERE {where}").fetchone()
        if column in SCALARS:
            new = change(old)
        else:
            new = change(json.loads(old))
            new = new if new is DEEP else json.dumps(new)
        conn.execute(f"UPDATE {table} SET {column}=? WHERE {where}", (new,))
    return path


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", CASES)
def test_a_hostile_value_is_one_line_and_exit_2(case, command, good, tmp_path, capsys):
    change, words = CASES[case]
    path = hostile(good, tmp_path, *change)
    assert replay_main(commands(path, good, tmp_path)[command]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {path}: "), err
    assert all(w in err for w in words), (words, err)


@pytest.mark.parametrize("command", COMMANDS)
def test_the_untouched_log_passes_every_command(command, good, tmp_path, capsys):
    assert replay_main(commands(good, good, tmp_path)[command]) == 0, capsys.readouterr().err


def test_a_log_without_steps_verifies_as_empty(tmp_path, capsys):
    """A restarted replica that never ran a step leaves a log of its meta alone."""
    path = tmp_path / "steps.db"
    new_log(path).close()
    assert replay_main(["verify", str(path)]) == 0
    assert capsys.readouterr().out == "ok: 0 steps verified\n"
