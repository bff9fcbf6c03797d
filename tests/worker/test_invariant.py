"""The batch-invariant mode (docs/design/cpu-paths.md, "Batch-invariant mode"): 16 requests give the
same tokens and bitwise the same logprobs alone and inside a 64-request mixed batch with
chunked prefill, preemption and prefix-cache hits; greedy and seeded. Also
`scripts/replay request LOG ID --rerun` on such a log."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from core.config import CoreConfig, log_meta
from core.engine import Engine
from core.ipc.protocol import SamplingParams
from core.sched import (Chunked, FreeListBlocks, PrefixCacheBlocks, Request, Scheduler,
                        SchedulerConfig, TokenEvent)
from core.steplog import StepLog
from replay.__main__ import main as replay_main
from replay.logfile import LogFile
from replay.rerun import Rerun
from scripts.group.commands import commands
from scripts.group.supervisor import parse
from worker import native
from worker.linear.dispatch import row_linear
from worker.linear.rows import _plan
from worker.load import make_runner

from tests.checkpoints import make_checkpoint

pytestmark = pytest.mark.skipif(native.kernel() is None,
                                reason="no C compiler: the mode needs the C attention kernel")

GREEDY = SamplingParams(logprobs=0)
SEEDED = SamplingParams(temperature=1.0, top_p=0.9, seed=77, logprobs=0)


@pytest.fixture(scope="module")
def tiny():
    return make_runner("tiny", num_blocks=96, batch_invariant=True)


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory):
    """Near-tied logits: a small init, and LM-head rows in pairs 1e-6 apart (relative), so
    that the best token's twin is within the matmul's batch noise at every step."""
    from safetensors.torch import load_file, save_file
    path = make_checkpoint(tmp_path_factory, "tied", 11, {
        "model_type": "llama", "hidden_size": 128, "intermediate_size": 256,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 512}, init_std=0.02)
    weights = load_file(path / "model.safetensors")
    head = weights["lm_head.weight"]
    g = torch.Generator().manual_seed(0)
    head[1::2] = head[0::2] * (1 + 1e-6 * torch.randn(head[0::2].shape, generator=g))
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path


def workload(vocab: int, n: int = 64, seed: int = 0) -> list[tuple[list[int], int,
                                                                    SamplingParams]]:
    """n requests, half greedy and half seeded; the first ones are those compared."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        sp = GREEDY if i % 2 else replace(SEEDED, seed=77 + i)
        out.append(([rng.randrange(vocab) for _ in range(rng.randrange(3, 70))],
                    rng.randrange(4, 14), sp))
    return out


def generate(runner, reqs, *, num_blocks=None, max_chunk=512, max_batch_tokens=512,
             prefix_cache=False):
    """[(tokens, logprobs)] per request, and the run's (preemptions, prefix hit tokens)."""
    info = runner.info
    cfg = SchedulerConfig(max_seqs=64, max_batch_tokens=max_batch_tokens,
                          max_model_len=info.max_model_len)
    blocks = range(info.num_blocks if num_blocks is None else num_blocks)
    pool = (PrefixCacheBlocks if prefix_cache else FreeListBlocks)(info.block_size, blocks)
    sched = Scheduler(cfg, pool, Chunked(max_chunk))
    eng = Engine(sched, runner, eos_ids=info.eos_ids)
    ids = [eng.add(Request(list(p), n), sp, ignore_eos=True) for p, n, sp in reqs]
    got: dict[int, tuple[list, list]] = {i: ([], []) for i in ids}
    while sched.has_unfinished():
        done = eng.step()
        for ev in done.events:
            if isinstance(ev, TokenEvent):
                got[ev.id][0].append(ev.token)
                got[ev.id][1].append(done.extras.logprobs[ev.id])
    return [got[i] for i in ids], (sched.stats().preemptions,
                                   getattr(pool, "prefix_hit_tokens", 0))


def alone_and_mixed(runner, vocab: int, n: int = 64, compared: int = 16, num_blocks: int = 24):
    """The first `compared` of n requests run alone, and all n together in a tight pool
    (preempting) with chunks of at most 24 tokens and the prefix cache: ahead of them in the
    batch, as many requests that share their first 32 tokens (the cached K/V of a shared
    prefix must equal the request's own)."""
    reqs = workload(vocab, n)
    mine = reqs[:compared]
    sharers = [(p[:32] + q, 4, GREEDY) for (p, _, _), (q, _, _) in
               zip(mine, reqs[compared:2 * compared])]
    alone = [generate(runner, [r])[0][0] for r in mine]
    mixed, (preemptions, hits) = generate(runner, sharers + mine + reqs[2 * compared:],
                                          num_blocks=num_blocks, max_chunk=24,
                                          max_batch_tokens=128, prefix_cache=True)
    assert preemptions > 0 and hits > 0
    return alone, mixed[compared:2 * compared]


def assert_invariant(runner, vocab: int, **size) -> None:
    alone, mixed = alone_and_mixed(runner, vocab, **size)
    for a, m in zip(alone, mixed):
        assert a[0] == m[0]
        assert torch.equal(torch.tensor(a[1], dtype=torch.float64),
                           torch.tensor(m[1], dtype=torch.float64))




@pytest.mark.parametrize("tile", [None, 64])
def test_linear_rows_ignore_the_row_count(tile):
    """Each row as in a call of its own (of ROW_ALIGN rows, or one tile), at any count."""
    layer = torch.nn.Linear(40, 96)
    if tile is None:
        tile = _plan(layer.weight, layer.bias)   # padding suffices on the CPUs measured
    w, b = layer.weight.detach(), layer.bias.detach()
    x = torch.randn(300, 40)
    one = torch.cat([row_linear(x[i:i + 1], w, b, tile) for i in range(300)])
    for m in (1, 2, 3, 5, 7, 9, 11, 64, 299, 300):
        assert torch.equal(row_linear(x[:m], w, b, tile), one[:m])
        assert torch.equal(row_linear(x[300 - m:], w, b, tile), one[300 - m:])


def test_tiny_alone_equals_mixed_bitwise_small(tiny):
    """The default suite's share: 4 requests alone and among 16."""
    assert_invariant(tiny, 512, n=16, compared=4, num_blocks=12)


@pytest.mark.slow
def test_tiny_alone_equals_mixed_bitwise(tiny):
    assert_invariant(tiny, 512)


@pytest.mark.slow
def test_near_tied_alone_equals_mixed_bitwise(tied_dir):
    assert_invariant(make_runner(str(tied_dir), num_blocks=96, batch_invariant=True), 512)


def test_the_mode_refuses_what_it_cannot_do(tmp_path_factory):
    with pytest.raises(ValueError, match="null model"):
        make_runner("null", batch_invariant=True)
    window = make_checkpoint(tmp_path_factory, "win", 4, {
        "model_type": "mistral", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 1,
        "vocab_size": 320, "sliding_window": 64})
    with pytest.raises(ValueError, match="sliding window"):
        make_runner(str(window), num_blocks=8, batch_invariant=True)
    with pytest.raises(ValueError, match="C attention kernel"):
        make_runner("tiny", num_blocks=8, dtype="bfloat16", batch_invariant=True)


def test_serve_passes_the_flag_to_every_worker(capsys):
    a = parse(["--batch-invariant", "--dp", "2"])
    cmds = commands(a, "/tmp/x", None)
    assert all("--batch-invariant" in cmds[w] for w in ("worker0", "worker1"))
    assert "--batch-invariant" not in cmds["core0"]
    assert "--batch-invariant" not in commands(parse([]), "/tmp/x", None)["worker"]
    with pytest.raises(SystemExit):
        parse(["--batch-invariant", "--tp", "2"])
    assert "--tp 1" in capsys.readouterr().err


def record(runner, path: str, reqs) -> None:
    """A step log of `reqs` run together, as the core writes it."""
    cfg = CoreConfig("a", "b", "c", "d", max_seqs=64, max_batch_tokens=128, max_chunk=24,
                     prefix_cache=False, log=path)
    log = StepLog(path, log_meta(cfg, runner.info))
    eng = cfg.make_engine(runner.info, log=log)
    eng.runner = runner
    for p, n, sp in reqs:
        eng.add(Request(list(p), n), sp, ignore_eos=True)
    eng.run()
    log.close()


def test_replay_request_rerun_matches_an_invariant_log(tiny, tmp_path, capsys):
    path = str(tmp_path / "inv.db")
    reqs = [(p, n, SamplingParams(temperature=sp.temperature, top_p=sp.top_p, seed=sp.seed))
            for p, n, sp in workload(512, 6, seed=3)]
    record(tiny, path, reqs)
    assert LogFile(path).meta["model_info"]["batch_invariant"] is True
    assert replay_main(["request", path, "4", "--rerun"]) == 0
    out = capsys.readouterr().out
    assert "all" in out and "match" in out and "(batch-invariant" in out
    assert replay_main(["request", path, "99", "--rerun"]) == 2
    assert replay_main(["verify", "--with-model", path]) == 0


def test_rerun_names_the_first_differing_token():
    assert Rerun([1, 2, 3], [1, 2, 3]).first_difference() is None
    assert Rerun([1, 2, 3], [1, 5, 3]).first_difference() == 1
    assert Rerun([1, 2, 3], [1, 2]).first_difference() == 2   # the re-run stopped early


def test_dense_linears_alone_equal_mixed(monkeypatch):
    """Without packed weights (TL_PACKED=0) the mode pads MKL's calls instead."""
    monkeypatch.setenv("TL_PACKED", "0")
    runner = make_runner("tiny", num_blocks=96, batch_invariant=True)
    assert not any(isinstance(m.weight, torch.Tensor) and m.weight.layout == torch._mkldnn
                   for m in runner.model.modules() if isinstance(m, torch.nn.Linear))
    assert_invariant(runner, 512, n=16, compared=4, num_blocks=12)
