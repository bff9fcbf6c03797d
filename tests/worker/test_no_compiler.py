"""Without a C compiler the worker serves on torch's attention, RMSNorm, rotary embedding
and MLP activation and oneDNN's linear layers:
the kernels' build says why in one line, and the model answers as with them. (The modules
that test the kernels themselves skip then, saying so.)"""
from __future__ import annotations

from worker import native, row_ops
from worker.linear import panels
from worker.handmade import Part, make_batch
from worker.load import make_runner


def test_no_compiler_is_one_line_and_no_library(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))   # nothing on it: no cc, no gcc
    assert native.load(native.SOURCE, "native decode attention unavailable") is None
    assert capsys.readouterr().err == ("[worker] native decode attention unavailable: "
                                       "no C compiler (cc) on PATH\n")


def greedy(runner, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens: one prefill, then decode steps, all in block 0's table."""
    tokens = list(prompt)
    start, length = 0, len(prompt)
    for step in range(n):
        batch = make_batch([Part(tokens, start, length, [0, 1])], runner.info.block_size, step)
        tokens.append(int(runner.execute(batch)[0]))
        start, length = len(tokens) - 1, 1
    return tokens[len(prompt):]


def test_the_worker_runs_without_the_kernels(monkeypatch):
    want = greedy(make_runner("tiny", num_blocks=8), [5, 6, 7], 6)   # kernels if built here
    monkeypatch.setattr(native, "kernel", lambda: None)
    monkeypatch.setattr(panels, "kernel", lambda: None)
    monkeypatch.setattr(row_ops, "kernel", lambda: None)
    runner = make_runner("tiny", num_blocks=8)
    assert not runner.native and runner.graph is None
    kept = [m for m in runner.model.modules()
            if type(m).__name__.endswith(("RMSNorm", "Attention", "MLP", "DecoderLayer"))]
    assert kept and not any("forward" in vars(m) for m in kept)   # transformers' code
    assert greedy(runner, [5, 6, 7], 6) == want
