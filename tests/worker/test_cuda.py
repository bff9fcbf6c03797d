"""On a CUDA device (skipped without one: CI has none; run there by hand, docs/design/worker.md,
"Worker"): the worker's greedy tokens equal transformers' generate on the same device and
weights, alone on scattered blocks and batched; a group serves with --device cuda (greedy,
seeded sampling with penalties and logprobs, prompt logprobs, grammars' masks), and its log
replays with the model on the device."""
from __future__ import annotations

import re

import pytest
import torch
from transformers import AutoModelForCausalLM

from frontend.client import Client
from scripts.group.harness import start_group
from tests.conftest import check_stopped
from tests.worker.test_worker_engine import GREEDY, alone, prompts, run_engine, stock_greedy
from worker.load import make_runner, resolve_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

SAMPLED = dict(temperature=0.9, top_p=0.9, top_k=50, seed=7, presence_penalty=0.5,
               repetition_penalty=1.2, logprobs=3, prompt_logprobs=2)
CHOICES = ["red", "green", "blue"]
REGEX = r"[0-9]{3}-[a-z]{2}"


@pytest.fixture(scope="module", params=["tiny", "smol"])
def pair(request):
    """(the engine's runner, transformers' own model) for a preset, both on cuda, float32."""
    runner = make_runner(request.param, device="cuda", num_blocks=128)
    stock = AutoModelForCausalLM.from_pretrained(resolve_model(request.param),
                                                 attn_implementation="sdpa").to("cuda").eval()
    return runner, stock


def test_the_runner_is_on_cuda(pair):
    runner, _ = pair
    assert runner.info.device.startswith("cuda") and runner.kv.device.type == "cuda"


def test_greedy_on_cuda_matches_transformers_generate_on_cuda(pair):
    runner, stock = pair
    odd_blocks = range(runner.info.num_blocks - 1, 0, -2)   # scattered block tables
    for p in prompts(runner.info.vocab_size):
        assert alone(runner, p, 12, blocks=odd_blocks) == stock_greedy(stock, p, 12), len(p)


def test_batched_on_cuda_equals_alone(pair):
    runner, _ = pair
    ps = prompts(runner.info.vocab_size, (5, 33, 70, 18), seed=1)
    want = [alone(runner, p, 16) for p in ps]
    got, _ = run_engine(runner, [(p, 16, GREEDY) for p in ps])
    assert got == want


def test_a_group_serves_on_cuda_and_its_log_replays_with_the_model(tmp_path):
    offline = make_runner("tiny", device="cuda", num_blocks=64)
    p = prompts(offline.info.vocab_size, (9,), seed=5)[0]
    g = start_group(tmp_path, ["--model", "tiny", "--device", "cuda"])
    try:
        with Client(g.address, timeout=120) as c:
            got = c.generate(p, max_tokens=10, ignore_eos=True).token_ids
            sampled = [c.generate(p, max_tokens=12, ignore_eos=True, **SAMPLED)
                       for _ in range(2)]
            picked = c.generate("pick", max_tokens=20, structured_outputs={"choice": CHOICES})
            shaped = c.generate("id", max_tokens=20, structured_outputs={"regex": REGEX})
    finally:   # the replay re-runs every request above on the device, token for token
        check_stopped(g, verify=((), ("--with-model",)))
    assert got == alone(offline, p, 10)
    one, two = sampled
    assert one.token_ids == two.token_ids   # seeded: the same draws on the device
    assert len(one.logprobs) == 12 and len(one.prompt_logprobs) == len(p)
    assert picked.text in CHOICES and re.fullmatch(REGEX, shaped.text), (picked.text, shaped.text)
