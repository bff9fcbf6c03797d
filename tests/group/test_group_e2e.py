"""The whole process group on the tiny preset: 64 concurrent requests complete with the KV
pool back at baseline, equality with transformers `generate`, preemption, errors, garbage
frames, finish reasons.

One group per module (a small KV pool so that 64 requests preempt); its step log is
verified in the fixture's teardown.
"""
from __future__ import annotations

import asyncio
import random

import msgpack
import pytest
import zmq

from frontend.client import AsyncClient, Client, ClientError

# 40 blocks of 16 positions: 640 positions for 64 concurrent requests -> preemption
GROUP_ARGS = ["--num-blocks", "40", "--max-seqs", "32", "--max-waiting", "512"]


@pytest.fixture(scope="module")
def hf_model():
    import torch
    from transformers import AutoModelForCausalLM

    from worker.load import resolve_model
    m = AutoModelForCausalLM.from_pretrained(resolve_model("tiny"), attn_implementation="sdpa",
                                             dtype=torch.float32)
    return m.eval()


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    import torch
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, eos_token_id=None,
                             do_sample=False, attention_mask=torch.ones(1, len(prompt), dtype=torch.long))
    return out[0, len(prompt):].tolist()


def prompts(n: int, seed: int = 0, lo: int = 1, hi: int = 120) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(0, 256) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


async def _milestone(address: str):
    rng = random.Random(1)
    # every 8th request (i % 8 == 3) is long and aborted after its second token
    reqs = [(p, 300 if i % 8 == 3 else rng.randint(4, 40), rng.choice([0, 0, 5, -3, 100]))
            for i, p in enumerate(prompts(64, 1))]
    async with AsyncClient(address, timeout=120) as c:
        async def run(i, p, n, prio):
            got = []
            async for d in c.stream(p, max_tokens=n, priority=prio, ignore_eos=True,
                                    request_id=f"m{i}"):
                got.extend(d.token_ids)
                if i % 8 == 3 and len(got) >= 2:
                    await c.abort(f"m{i}")
                if d.finish_reason:
                    return d.finish_reason, got
        results = await asyncio.gather(*(run(i, *r) for i, r in enumerate(reqs)))
        for _ in range(100):
            stats = await c.stats()
            if stats["running"] == 0 and stats["waiting"] == 0:
                break
            await asyncio.sleep(0.05)
    return reqs, results, stats


def test_milestone_64_concurrent_requests_and_kv_back_at_baseline(group):
    reqs, results, stats = asyncio.run(_milestone(group.address))
    for i, ((p, n, _), (reason, got)) in enumerate(zip(reqs, results)):
        if i % 8 == 3:
            assert reason == "abort" and len(got) < n
        else:
            assert reason == "length" and len(got) == n, i
    assert stats["free_blocks"] == stats["total_blocks"] == 40
    assert stats["preemptions"] > 0


def test_greedy_equals_transformers_generate_under_preemption(group, hf_model):
    ps = prompts(6, seed=7, lo=1, hi=200)
    n = 24

    async def all_at_once():
        async with AsyncClient(group.address, timeout=120) as c:
            return await asyncio.gather(*(c.generate(p, max_tokens=n, ignore_eos=True) for p in ps))
    results = asyncio.run(all_at_once())
    for p, r in zip(ps, results):
        assert r.token_ids == hf_greedy(hf_model, p, n)
        assert r.prompt_token_ids == p


def test_text_prompt_stream_concatenates_to_generate(group):
    with Client(group.address, timeout=60) as c:
        r = c.generate("The quick brown fox", max_tokens=20, ignore_eos=True)
        deltas = list(c.stream("The quick brown fox", max_tokens=20, ignore_eos=True))
    assert "".join(d.text for d in deltas) == r.text
    assert sum((d.token_ids for d in deltas), []) == r.token_ids
    assert deltas[-1].finish_reason == "length" and all(d.finish_reason is None for d in deltas[:-1])
    assert r.prompt_token_ids == list("The quick brown fox".encode())


def test_stop_string_cuts_the_output(group):
    with Client(group.address, timeout=60) as c:
        full = c.generate("stop strings", max_tokens=30, ignore_eos=True)
        assert len(full.text) > 6
        stop = full.text[4:6]
        r = c.generate("stop strings", max_tokens=30, stop=[stop], ignore_eos=True)
    assert r.finish_reason == "stop"
    assert r.text == full.text[:full.text.index(stop)]
    assert stop not in r.text


def test_bad_requests_get_400_and_413(group):
    bad = [dict(prompt=""), dict(prompt=[]), dict(prompt="x", max_tokens=0),
           dict(prompt="x", temperature=-1.0), dict(prompt="x", top_p=0.0),
           dict(prompt="x", top_p=1.5), dict(prompt="x", top_k=-1),
           dict(prompt="x", priority=1001), dict(prompt=[1] * 2048),
           dict(prompt=[10**9])]
    with Client(group.address, timeout=30) as c:
        for kw in bad:
            with pytest.raises(ClientError) as e:
                c.generate(**kw)
            assert e.value.code == 400, kw
        with pytest.raises(ClientError) as e:
            c.generate("x" * 2_000_000, max_tokens=1)
        assert e.value.code == 413
        # too large for the pool of 40 blocks: NeverFits from the core
        with pytest.raises(ClientError) as e:
            c.generate([5] * 700, max_tokens=1000)
        assert e.value.code == 400 and "blocks" in e.value.message
        assert c.generate("still serving", max_tokens=3, ignore_eos=True).finish_reason == "length"


def test_unknown_field_gets_400(group):
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.connect(group.address)
    try:
        s.send(msgpack.packb({"t": "generate", "request_id": "u", "prompt": "x", "bogus": 1}))
        assert s.poll(10_000)
        reply = msgpack.unpackb(s.recv())
        assert reply["t"] == "error" and reply["code"] == 400 and "bogus" in reply["message"]
    finally:
        s.close(0)
        ctx.term()


def test_garbage_frames_do_not_stop_any_process(group):
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.connect(group.address)
    junk = [b"", b"\xc1", b"\x00" * 100, msgpack.packb([1, 2, 3]), msgpack.packb({"t": 5}),
            msgpack.packb({"t": "generate"}), msgpack.packb({"t": "forward", "step": 1}),
            msgpack.packb({"t": "generate", "request_id": 1, "prompt": {}}),
            b"\xff" * 3_000_000]
    try:
        for frame in junk:
            s.send(frame)
        s.send_multipart([b"a", b"b", b"c"])
    finally:
        s.close(linger=30_000)   # term() returns once every frame is sent
        ctx.term()
    with Client(group.address, timeout=30) as c:
        r = c.generate("after the junk", max_tokens=4, ignore_eos=True)
        assert r.finish_reason == "length" and len(r.token_ids) == 4
        pids = c.stats()["pids"]
    assert set(pids) == {"frontend", "core", "worker"}
    assert group.alive()


def test_abort_and_max_tokens_finish_reasons(group):
    with Client(group.address, timeout=60) as c:
        it = c.stream([1, 2, 3], max_tokens=500, ignore_eos=True, request_id="ab1")
        assert next(it).finish_reason is None
        c.abort("ab1")
        assert list(it)[-1].finish_reason == "abort"
        assert c.generate([1, 2, 3], max_tokens=5, ignore_eos=True).finish_reason == "length"
        with pytest.raises(ClientError) as e:
            c.generate("x", max_tokens=3, request_id="")
        assert e.value.code == 400


def test_stats_shape(group):
    with Client(group.address, timeout=30) as c:
        st = c.stats()
    for k in ("running", "waiting", "free_blocks", "total_blocks", "steps", "preemptions",
              "max_model_len", "pids"):
        assert k in st
    assert st["total_blocks"] == 40 and st["max_model_len"] == 2048
