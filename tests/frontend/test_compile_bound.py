"""The compile bound through a group on `tiny` run with --max-compile-ms 20 (docs/structured.md,
"The compile bound"): a constraint whose compile takes longer is a 400 naming its field, on
the engine and through the gateway (a tool's schema too); its verdict is kept, so a repeat is
answered at once. (A stream going on while a slow constraint compiles needs a bound longer than
the compile: tests/group/test_compile_floods.py.)"""
from __future__ import annotations

import json
import time

import openai
import pytest

from frontend.client import Client, ClientError
from tests.frontend import test_http
from tests.frontend.test_compile_check import all_of_any_of

BOUND_MS = 20
GROUP_ARGS = ["--max-compile-ms", str(BOUND_MS)]
SLOW = all_of_any_of(4, 5)        # compiles, in 0.1-0.3 s on the 2-core machine
SLOWER = all_of_any_of(5, 5)      # fails to build, after about a second
MESSAGES = [{"role": "user", "content": "Give me JSON"}]


def json_format(c, **extra) -> dict:
    """`c`'s schema as a response_format, with `extra` keys added to the schema."""
    return {"type": "json_schema",
            "json_schema": {"name": "s", "schema": {**json.loads(c.text), **extra}}}


@pytest.fixture(scope="module")
def engine(group):
    with Client(group.address, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def oai(group, tmp_path_factory):
    proc, url = test_http.start_gateway(group.address, tmp_path_factory.mktemp("http"),
                                        "--max-compile-ms", str(BOUND_MS))
    try:
        with openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as c:
            yield c
    finally:
        assert test_http.stop_gateway(proc) == 0


def refusal(engine, request_id: str, **constraint) -> tuple[ClientError, float]:
    start = time.monotonic()
    with pytest.raises(ClientError) as e:
        engine.generate("x", max_tokens=4, request_id=request_id, **constraint)
    return e.value, time.monotonic() - start


def test_over_the_bound_is_a_400_naming_the_field_and_kept(engine):
    first, took = refusal(engine, "slow-1", structured_outputs={"json": SLOW.text})
    assert (first.code, first.param) == (400, "structured_outputs"), first
    assert f"bound of {BOUND_MS} ms" in first.message
    again, took_again = refusal(engine, "slow-2", structured_outputs={"json": SLOW.text})
    assert again.message == first.message   # the kept verdict, with the first compile's time
    assert took_again < took / 2, (took, took_again)
    r = engine.generate("y", max_tokens=8, structured_outputs={"regex": "[ab]{3}"})
    assert r.finish_reason == "stop" and len(r.text) == 3   # the engine serves on


def test_the_gateway_names_the_field(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4,
                                    response_format=json_format(SLOW))
    assert e.value.param == "response_format" and f"{BOUND_MS} ms" in str(e.value)
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": json.loads(SLOW.text)}}}}
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4,
                                    tools=[tool])
    assert e.value.param == "tools" and f"{BOUND_MS} ms" in str(e.value)
