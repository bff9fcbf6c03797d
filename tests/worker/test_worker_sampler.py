"""The sampler on synthetic logits, and the null runner."""
from __future__ import annotations

import math

import torch

from core.ipc.protocol import F64, I32, I64
from worker.handmade import Part, make_batch
from worker.load import make_runner
from worker.null import NullRunner, null_token
from worker.sampler import SampleParams, mix, sample
from worker.preset_tokenizer import EOS_ID


def params(n, temperature=1.0, top_p=1.0, top_k=0, seed=0, gen=None) -> SampleParams:
    def t(x, dtype):
        return torch.tensor(x if isinstance(x, list) else [x] * n, dtype=dtype)
    return SampleParams(t(temperature, torch.float64), t(top_p, torch.float64),
                        t(top_k, torch.int32), t(seed, torch.int64),
                        t(gen if gen is not None else list(range(n)), torch.int32))


def test_mix_is_stable_and_spreads():
    assert mix(1, 2) == mix(1, 2)
    assert len({mix(s, k) for s in range(30) for k in range(30)}) == 900
    assert all(0 <= mix(s, k) < 2**63 for s in (-5, 0, 2**63 - 1) for k in (0, 7))


def test_greedy_rows_are_argmax_and_others_untouched():
    logits = torch.randn(5, 50, generator=torch.Generator().manual_seed(0))
    p = params(5, temperature=[0.0, 1.0, 0.0, 1.0, 0.0])
    out = sample(logits, p)
    assert out.dtype == torch.long and out.shape == (5,)
    for r in (0, 2, 4):
        assert out[r] == logits[r].argmax()


def test_top_k_and_top_p_restrict_the_support():
    logits = torch.randn(1, 100, generator=torch.Generator().manual_seed(1)).repeat(300, 1)
    top5 = set(logits[0].topk(5).indices.tolist())
    got = sample(logits, params(300, temperature=2.0, top_k=5, seed=9))
    assert set(got.tolist()) <= top5 and len(set(got.tolist())) > 1
    probs = (logits[0] / 2.0).softmax(-1)
    order = probs.argsort(descending=True)
    before = probs[order].cumsum(0) - probs[order]
    nucleus = set(order[before < 0.5].tolist())
    got = sample(logits, params(300, temperature=2.0, top_p=0.5, seed=9))
    assert set(got.tolist()) <= nucleus and len(set(got.tolist())) > 1


def test_frequencies_follow_the_softmax():
    n = 4000
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).repeat(n, 1)
    got = sample(logits, params(n, seed=5))
    want = logits[0].softmax(-1)
    freq = torch.bincount(got, minlength=4).double() / n
    assert (freq - want).abs().max() < 4 * math.sqrt(0.25 / n)


def test_a_row_depends_only_on_its_seed_and_index():
    logits = torch.randn(1, 64, generator=torch.Generator().manual_seed(2))
    one = sample(logits, params(1, seed=77, gen=[3]))
    crowd = torch.cat([torch.randn(6, 64), logits])
    p = params(7, seed=[1, 2, 3, 4, 5, 6, 77], gen=[0, 1, 2, 3, 4, 5, 3])
    assert sample(crowd, p)[-1] == one


def test_null_runner_is_deterministic_cheap_and_never_eos():
    r = make_runner("null", num_blocks=32)
    assert isinstance(r, NullRunner)
    assert (r.info.model, r.info.num_blocks, r.info.eos_ids) == ("null", 32, [EOS_ID])
    assert r.info.vocab_size == 512
    batch = make_batch([Part([5, 6, 7], 2, 1, [0]), Part([1, 2], 0, 2, [1])], 16)
    got = r.execute(batch)
    assert isinstance(got, I32) and list(got) == [null_token(7, 2, 512), null_token(2, 1, 512)]
    assert r.execute(batch) == got
    toks = {null_token(t, p, 512) for t in range(512) for p in range(40)}
    assert EOS_ID not in toks and len(toks) > 400 and max(toks) < 512
    assert r.logits(batch).argmax(-1).tolist() == list(got)


def test_sample_params_read_the_packed_arrays():
    batch = make_batch([Part([1, 2], 0, 2, [0])], 16)
    batch.temperature, batch.top_p, batch.top_k = F64([0.5]), F64([0.9]), I32([3])
    batch.seeds, batch.gen_index = I64([-3]), I32([4])
    p = SampleParams.from_batch(batch)
    assert p.temperature.tolist() == [0.5] and p.top_k.tolist() == [3]
    assert p.seeds.tolist() == [-3] and p.gen_index.tolist() == [4]
