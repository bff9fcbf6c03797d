"""Issue 14's request fields through a real group on `tiny` (ZMQ client): stop strings and
stop tokens finish "stop" in the reply and in the step log, min_tokens, logprobs,
penalties, user, and each request's metrics pointing into the log."""
from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
import time

import pytest
from transformers import AutoTokenizer

from frontend.client import Client
from tests.conftest import snapshot_log, verify_log
from frontend.tokenizer import Tokenizer
from worker.load import resolve_model
from worker.preset_tokenizer import build_tokenizer

PROMPT = "The quick brown fox"
METRICS = {"queue_ms", "ttft_ms", "e2e_ms", "preemptions", "priority", "cached_tokens",
           "log", "log_id", "draft_tokens", "accepted_tokens"}


@pytest.fixture(scope="module")
def client(group):
    with Client(group.address, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(resolve_model("tiny"))


def logged(group, request_id: str, timeout: float = 10.0) -> dict:
    """The request's finished row in the step log (the writer commits within ~1 s)."""
    deadline = time.monotonic() + timeout
    while True:
        with sqlite3.connect(f"file:{group.log}?mode=ro", uri=True) as conn:
            conn.row_factory = sqlite3.Row
            row = conn.execute("SELECT * FROM requests WHERE client_request_id=?",
                               (request_id,)).fetchone()
            inputs = [r[0] for r in conn.execute(
                "SELECT kind FROM inputs WHERE request_id=? ORDER BY step, seq",
                (row["id"],))] if row else []
        if row is not None and row["finish_reason"] is not None:
            return {**dict(row), "inputs": inputs}
        assert time.monotonic() < deadline, f"{request_id} not finished in the log"
        time.sleep(0.2)


def first_text_stop(tok, tokens: list[int]) -> tuple[str, int]:
    """A 2-character stop string from the middle of the greedy text, and how many tokens
    it takes for the text to contain it."""
    text = tok.decode(tokens)
    for at in range(len(text) // 3, len(text) - 2):
        stop = text[at:at + 2]
        if "\ufffd" not in stop and stop.strip():
            n = next(i for i in range(1, len(tokens) + 1) if stop in tok.decode(tokens[:i]))
            return stop, n
    pytest.skip("no usable stop string in the greedy text")


def test_a_stop_string_finishes_stop_in_the_reply_and_the_log(client, group, tok):
    full = client.generate(PROMPT, max_tokens=40, ignore_eos=True)
    stop, n = first_text_stop(tok, full.token_ids)
    r = client.generate(PROMPT, max_tokens=40, ignore_eos=True, stop=stop, request_id="ss-1")
    assert r.finish_reason == "stop"
    assert r.token_ids == full.token_ids[:n]          # ends with the completing token
    assert r.text == full.text[:full.text.index(stop)]
    row = logged(group, "ss-1")
    assert row["finish_reason"] == "stop" and json.loads(row["output_tokens"]) == r.token_ids
    assert row["inputs"] == ["add", "stop"]
    with_stop = client.generate(PROMPT, max_tokens=40, ignore_eos=True, stop=stop,
                                include_stop_str_in_output=True)
    assert with_stop.text == r.text + stop


def test_stop_token_ids_and_min_tokens(client, group):
    full = client.generate(PROMPT, max_tokens=24, ignore_eos=True)
    t = full.token_ids[3]
    first = full.token_ids.index(t)
    r = client.generate(PROMPT, max_tokens=24, ignore_eos=True, stop_token_ids=[t],
                        request_id="sti-1")
    assert r.finish_reason == "stop" and r.token_ids == full.token_ids[:first + 1]
    assert logged(group, "sti-1")["finish_reason"] == "stop"
    late = client.generate(PROMPT, max_tokens=24, ignore_eos=True, stop_token_ids=[t],
                           min_tokens=first + 3)
    assert t not in late.token_ids[:first + 3]        # banned while under min_tokens
    assert late.token_ids[:first] == full.token_ids[:first]


def test_logprobs_come_with_every_token(client):
    r = client.generate(PROMPT, max_tokens=8, ignore_eos=True, logprobs=3)
    assert len(r.logprobs) == len(r.top_logprobs) == len(r.token_ids) == 8
    for tok_id, lp, top in zip(r.token_ids, r.logprobs, r.top_logprobs):
        assert len(top) == 3 and lp <= 0
        assert max(top.values()) == pytest.approx(lp, abs=1e-6) and top[tok_id] == lp
    plain = client.generate(PROMPT, max_tokens=8, ignore_eos=True)
    assert plain.logprobs is None and plain.token_ids == r.token_ids


def test_penalties_change_a_repetitive_greedy_text(client):
    base = client.generate(PROMPT, max_tokens=32, ignore_eos=True)
    pen = client.generate(PROMPT, max_tokens=32, ignore_eos=True, frequency_penalty=2.0,
                          presence_penalty=2.0, repetition_penalty=2.0)
    assert len(pen.token_ids) == 32
    repeats = len(base.token_ids) - len(set(base.token_ids))
    assert len(pen.token_ids) - len(set(pen.token_ids)) <= repeats
    assert pen.token_ids != base.token_ids or repeats == 0


def test_metrics_point_into_the_log(client, group):
    r = client.generate(PROMPT, max_tokens=5, priority=7, user="alice", request_id="met-1")
    m = r.metrics
    assert set(m) == METRICS
    assert m["log"] == group.log.name and m["priority"] == 7 and m["preemptions"] == 0
    assert 0 <= m["queue_ms"] and 0 <= m["ttft_ms"] <= m["e2e_ms"]
    assert m["cached_tokens"] == r.cached_tokens < len(r.prompt_token_ids)
    row = logged(group, "met-1")
    assert row["id"] == m["log_id"] and row["user"] == "alice"
    path = group.log.parent / m["log"]   # the reply names the file, not the server's path
    out = subprocess.run([sys.executable, "-m", "replay", "request", str(path), str(m["log_id"])],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "met-1" in out.stdout


def test_seeded_sampling_with_the_new_fields_repeats(client):
    kw = dict(max_tokens=12, temperature=0.9, seed=5, min_p=0.05, presence_penalty=0.5,
              logprobs=1, ignore_eos=True)
    a, b = client.generate(PROMPT, **kw), client.generate(PROMPT, **kw)
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    assert all(math.isfinite(x) for x in a.logprobs)


def test_text_prompts_get_the_tokenizers_bos(tmp_path):
    """tokenizer(text) as transformers' pipeline does: a BOS when the tokenizer adds one."""
    from tokenizers import AddedToken, processors
    from transformers import PreTrainedTokenizerFast

    raw = build_tokenizer(300)
    raw.add_special_tokens([AddedToken("<s>", special=True, normalized=False)])
    bos = raw.token_to_id("<s>")
    raw.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>").save_pretrained(tmp_path)
    t = Tokenizer.load(str(tmp_path))
    assert t.encode("hi") == [bos, 104, 105] == AutoTokenizer.from_pretrained(tmp_path)("hi").input_ids
    assert t.encode("hi", add_special_tokens=False) == [104, 105]
    assert t.decode([bos, 104]) == "h" and t.decode([bos, 104], skip_special_tokens=False) == "<s>h"


def test_replay_with_the_model_reproduces_penalties_logprobs_and_siblings(client, group, tmp_path):
    """n sampled siblings of one prompt (own seeds), penalties and logprobs: the worker re-run
    on the rebuilt batches gives every logged token again."""
    kw = dict(max_tokens=10, temperature=0.8, repetition_penalty=1.3, frequency_penalty=0.4,
              logprobs=2, min_tokens=3, ignore_eos=True)
    for i in range(3):
        client.generate(PROMPT, seed=100 + i, request_id=f"sib-{i}", **kw)
    logged(group, "sib-2")
    snapshot = snapshot_log(group.log, tmp_path / "snapshot.db")
    r = verify_log(snapshot, "--with-model")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "with the model on cpu, float32" in r.stdout


def test_a_shared_prefix_is_served_from_the_cache(client):
    system = "You are a terse assistant. " * 6
    first = client.generate(system + "Question one?", max_tokens=6, ignore_eos=True)
    before = client.stats()
    again = client.generate(system + "Question two?", max_tokens=6, ignore_eos=True)
    after = client.stats()
    block = 16
    assert again.cached_tokens >= (len(system) // block - 1) * block > 0
    assert again.cached_tokens % block == 0 and again.metrics["cached_tokens"] == again.cached_tokens
    assert after["prefix_hit_tokens"] - before["prefix_hit_tokens"] == again.cached_tokens
    assert after["prefix_cache"] and after["cached_blocks"] > 0
    assert after["free_blocks"] == after["total_blocks"]     # cached blocks count as free
    assert after["threads"]["count"] >= 1 and after["threads"]["wait"]
    same = client.generate(system + "Question one?", max_tokens=6, ignore_eos=True)
    n = len(same.prompt_token_ids)
    assert same.token_ids == first.token_ids
    assert same.cached_tokens == (n - 1) // block * block    # all but the block of the last token
