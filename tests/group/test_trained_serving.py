"""The trained smollm2 model served end to end: a real question gets its real answer through
the gateway's chat route, and the step log names the GGUF file, whose replay with the model
re-loads that very file (its sha256) and reproduces every token."""
from __future__ import annotations

import json
import sqlite3

import pytest

from replay.model import ModelUnavailable, _check_same_file
from worker.registry_models import REGISTRY

from tests.conftest import verify_log
from tests.frontend.test_http import http

GROUP_ARGS = ["--model", "smollm2", "--http-port", "0"]


def ask(group, question: str, **extra) -> dict:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": question}],
            "max_tokens": 24, "temperature": 0, **extra}
    status, _, reply = http("POST", f"{group.http}/v1/chat/completions", body, timeout=300)
    assert status == 200, reply
    return reply


@pytest.mark.slow   # the smollm2 group: ~50 s on two cores
def test_a_real_question_gets_a_real_answer(group):
    reply = ask(group, "What is the capital of France?")
    assert "Paris" in reply["choices"][0]["message"]["content"]
    assert reply["choices"][0]["finish_reason"] == "stop"   # <|im_end|> is its EOS


@pytest.mark.slow
def test_the_log_names_the_file_and_replays_with_it(group):
    ask(group, "Name three colours.")
    meta = dict(sqlite3.connect(group.log).execute("SELECT key, value FROM meta"))
    checkpoint = json.loads(meta["model_info"])["checkpoint"]
    assert checkpoint["sha256"] == REGISTRY["smollm2"].sha256
    assert checkpoint["tensor_types"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
    r = verify_log(group.log, "--with-model")
    assert r.returncode == 0 and "verified with the model" in r.stdout, r.stdout + r.stderr


def test_replay_refuses_another_file_under_the_logged_name():
    logged = {"path": "/m.gguf", "sha256": "a" * 64}
    _check_same_file(logged, dict(logged))
    with pytest.raises(ModelUnavailable, match="sha256"):
        _check_same_file(logged, {"path": "/m.gguf", "sha256": "b" * 64})
    _check_same_file({"format": "preset", "name": "tiny"}, {})   # nothing to compare
