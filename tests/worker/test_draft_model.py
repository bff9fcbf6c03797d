"""Speculative decoding with a draft model (worker/draft.py; docs/design/scheduler.md,
"Speculative decoding"): 64 requests, greedy and seeded, copy-heavy and not, give the same
tokens and bitwise the same logprobs with a draft model as without speculation, in a roomy
pool and one that preempts; drafts are accepted and rejected; every block comes back. The
draft is an echo model with other layers (it mostly agrees), and the model itself (every
draft accepted)."""
from __future__ import annotations

import pytest

from worker import native
from worker.load import make_runner

from tests.checkpoints import echo_checkpoint
from tests.worker import test_speculative as speculative
from tests.worker.test_speculative import workload

pytestmark = pytest.mark.skipif(native.kernel() is None,
                                reason="no C compiler: the mode needs the C attention kernel")


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return (str(echo_checkpoint(tmp_path_factory)),
            str(echo_checkpoint(tmp_path_factory, "echo-draft", 11)))


@pytest.fixture(scope="module")
def plain(paths):
    return make_runner(paths[0], num_blocks=96, batch_invariant=True)


@pytest.fixture(scope="module")
def drafted(paths):
    return make_runner(paths[0], num_blocks=96, batch_invariant=True, draft=paths[1])


@pytest.fixture(scope="module")
def self_drafted(paths):
    return make_runner(paths[0], num_blocks=96, batch_invariant=True, draft=paths[0])


def generate(runner, reqs, num_draft: int, num_blocks: int, draft_model: bool):
    return speculative.generate(runner, reqs, num_draft, num_blocks, draft_model=draft_model)


@pytest.mark.parametrize("num_blocks", [96, 20])
def test_a_draft_model_changes_no_token_nor_logprob(plain, drafted, num_blocks):
    reqs = workload(plain.info.vocab_size)
    base, st0, _ = generate(plain, reqs, 0, num_blocks, False)
    spec, st1, sched = generate(drafted, reqs, 4, num_blocks, True)
    assert spec == base   # tokens, logprobs (float equality is bitwise here) and tops
    assert 0 < sched.accepted_tokens < sched.draft_tokens
    assert st1.steps < st0.steps
    assert st1.free_blocks == st0.free_blocks == num_blocks
    if num_blocks == 20:
        assert st1.preemptions > 0


def test_the_model_drafting_for_itself_has_every_draft_accepted(plain, self_drafted):
    """Sampled rows too: each draft is sampled with its checking row's seed and index."""
    reqs = workload(plain.info.vocab_size, 16)
    base, _, _ = generate(plain, reqs, 0, 96, False)
    spec, _, sched = generate(self_drafted, reqs, 4, 96, True)
    assert spec == base
    assert sched.draft_tokens > 0 and sched.accepted_tokens == sched.draft_tokens


def test_a_worker_without_a_draft_model_refuses_a_batch_that_needs_one(plain):
    reqs = workload(plain.info.vocab_size, 2)
    with pytest.raises(ValueError, match="no.*draft|none"):
        generate(plain, reqs, 4, 96, True)
