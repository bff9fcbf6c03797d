"""Speculative decoding on a real model (docs/design/scheduler.md, "Speculative decoding"): with the
batch-invariant mode, 64 requests, greedy and seeded, copy-heavy and not, give the same
tokens and bitwise the same logprobs (and top alternatives) with speculation on and off,
in a roomy pool and in a tight one that preempts; drafts are accepted and rejected; every
block comes back."""
from __future__ import annotations

import random

import pytest

from core.config import build_engine
from core.ipc.protocol import SamplingParams
from core.sched import Request, SchedulerConfig, TokenEvent
from worker import native
from worker.load import make_runner

from tests.checkpoints import echo_checkpoint

pytestmark = pytest.mark.skipif(native.kernel() is None,
                                reason="no C compiler: the mode needs the C attention kernel")


@pytest.fixture(scope="module")
def echo(tmp_path_factory):
    return make_runner(str(echo_checkpoint(tmp_path_factory)), num_blocks=96,
                       batch_invariant=True)


def workload(vocab: int, n: int = 64) -> list[tuple[list[int], int, SamplingParams]]:
    """Half greedy, half seeded (at temperatures where the echo model strays now and then
    or often); every other pair's prompt repeats one phrase (copy-heavy)."""
    rng = random.Random(5)
    out = []
    for i in range(n):
        sp = (SamplingParams(logprobs=2) if i % 2 else
              SamplingParams(temperature=8.0 + 4 * (i % 4 == 0), top_p=0.95, seed=100 + i,
                             logprobs=2))
        phrase = [rng.randrange(vocab) for _ in range(rng.randrange(4, 12))]
        prompt = phrase * 3 if i % 4 < 2 else [rng.randrange(vocab) for _ in range(20)]
        out.append((prompt, rng.randrange(6, 24), sp))
    return out


def generate(runner, reqs, num_draft: int, num_blocks: int, max_batch_tokens: int = 256,
             draft_model: bool = False):
    """draft_model: the runner's draft model proposes (tests/worker/test_draft_model.py)."""
    info = runner.info
    cfg = SchedulerConfig(max_seqs=64, max_batch_tokens=max_batch_tokens,
                          max_model_len=info.max_model_len, num_draft=num_draft,
                          spec_max_batch=64, draft_model=draft_model)
    eng = build_engine(cfg, "chunked", 32, info.block_size, num_blocks, info.eos_ids, 0,
                       runner, prefix_cache=True)
    ids = [eng.add(Request(list(p), n), sp, ignore_eos=True) for p, n, sp in reqs]
    got: dict[int, list] = {i: [] for i in ids}
    while eng.busy():
        nth: dict[int, int] = {}
        done = eng.step()
        for ev in done.events:
            if isinstance(ev, TokenEvent):
                k = nth[ev.id] = nth.get(ev.id, -1) + 1
                lp, top = done.extras.at(ev.id, k)
                got[ev.id].append((ev.token, lp, top))
    st = eng.sched.stats()
    return [got[i] for i in ids], st, eng.sched


@pytest.mark.parametrize("num_blocks", [96, 20])
def test_speculation_changes_no_token_nor_logprob(echo, num_blocks):
    reqs = workload(echo.info.vocab_size)
    plain, st0, _ = generate(echo, reqs, 0, num_blocks)
    spec, st1, sched = generate(echo, reqs, 4, num_blocks)
    assert spec == plain   # tokens, logprobs (float equality is bitwise here) and tops
    assert 0 < sched.accepted_tokens < sched.draft_tokens
    assert st1.steps < st0.steps
    assert st1.free_blocks == st0.free_blocks == num_blocks
    if num_blocks == 20:
        assert st1.preemptions > 0
