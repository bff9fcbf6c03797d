"""POST /v1/embeddings and Client.embed against a real group on `tiny` (the flags of
test_http_extras.py, so the two share a group): the openai SDK's embeddings.create in float
and base64 equal to the ZMQ clients' vectors, usage, batches of strings and of ids, and
every bad input a 400 naming its field while the engine serves on."""
from __future__ import annotations

import asyncio
import base64
import hashlib
import math
import shutil
import sqlite3
import struct

import openai
import pytest

from frontend.client import AsyncClient, Client
from frontend.client.common import ClientError
from tests.conftest import snapshot_log, verify_log
from tests.waiting import wait_until
from tests.frontend.test_http_extras import GROUP_ARGS, NAME  # noqa: F401  (one group)


@pytest.fixture(scope="module")
def oai(group):
    with openai.OpenAI(base_url=group.http + "/v1", api_key="x", max_retries=0) as c:
        yield c


def test_the_sdk_gets_the_clients_vectors_in_float_and_base64(oai, group):
    texts = ["hello world", "a second, longer input about the sea", "x"]
    with Client(group.address) as c:
        want = c.embed(texts)
        one = c.embed("hello world")
        ids = c.embed([5, 6, 7])
    assert one == want[0] and len(ids) == len(one)
    assert all(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-5 for v in want)
    # the SDK's default asks for base64 and decodes it itself
    for kw in ({"encoding_format": "float"}, {}, {"encoding_format": "base64"}):
        r = oai.embeddings.create(model=NAME, input=texts, **kw)
        assert [d.index for d in r.data] == [0, 1, 2]
        for d, w in zip(r.data, want):
            got = d.embedding
            if isinstance(got, str):   # asked for base64 explicitly: the SDK leaves it
                raw = base64.b64decode(got)
                got = list(struct.unpack(f"<{len(raw) // 4}f", raw))
            assert got == pytest.approx(w, abs=1e-6)
        assert r.usage.prompt_tokens == r.usage.total_tokens > 3
    r = oai.embeddings.create(model=NAME, input=[[5, 6, 7], [9]])
    assert r.data[0].embedding == pytest.approx(ids, abs=1e-6) and r.usage.prompt_tokens == 4
    dims = len(one)
    assert len(oai.embeddings.create(model=NAME, input="hi", dimensions=dims).data[0].embedding) == dims


def test_the_async_client_embeds_too(group):
    async def go():
        async with AsyncClient(group.address) as c:
            return await c.embed(["hello world", "x"]), await c.embed([5, 6, 7])
    with Client(group.address) as c:
        want = c.embed(["hello world", "x"]), c.embed([5, 6, 7])
    assert asyncio.run(go()) == want


@pytest.mark.parametrize("body, field", [
    ({"input": ""}, "input"), ({"input": []}, "input"), ({"input": ["a", ""]}, "input"),
    ({"input": ["a", [1, 2]]}, "input"), ({"input": [[1], []]}, "input"),
    ({"input": [10 ** 9]}, "input"), ({"input": "word " * 5000}, "input"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "a", "dimensions": 3}, "dimensions"), ({"input": 5}, "input"),
])
def test_bad_input_is_a_400_naming_the_field_and_the_engine_serves_on(oai, body, field):
    with pytest.raises(openai.BadRequestError) as e:
        oai.embeddings.create(model=NAME, **body)
    assert e.value.body["param"] == field
    assert len(oai.embeddings.create(model=NAME, input="still here").data) == 1


def test_the_client_refuses_generation_fields_on_an_embedding(group):
    from core.ipc.protocol import WIRE, Generate
    with Client(group.address) as c:
        with pytest.raises(ClientError) as e:
            list(c._stream(Generate("r1", "hi", max_tokens=1, logprobs=1, embed=True, wire=WIRE)))
        assert e.value.code == 400 and e.value.param == "logprobs"
        assert c.generate("hi", max_tokens=3).finish_reason == "length"


def test_the_log_holds_each_vectors_digest_and_replays_with_the_model(group, tmp_path):
    """Each vector served is in the step log as its length and the sha256 of its float32
    bytes; `replay verify --with-model` recomputes them bit for bit, and fails on a digest
    changed in the log."""
    with Client(group.address) as c:
        vectors = c.embed(["log me", "and me too", [9, 8, 7, 6]])
    digests = {hashlib.sha256(struct.pack(f"<{len(v)}f", *v)).hexdigest() for v in vectors}
    snapshot = tmp_path / "snapshot.db"

    def logged() -> list:   # the core writes its log behind the replies
        snapshot.unlink(missing_ok=True)
        with sqlite3.connect(snapshot_log(group.log, snapshot)) as db:
            rows = db.execute("SELECT dims, sha256 FROM embeddings").fetchall()
        return rows if digests <= {h for _, h in rows} else []
    rows = wait_until(logged, what="the vectors in the step log")
    assert {d for d, _ in rows} == {len(vectors[0])}
    tampered = tmp_path / "tampered.db"
    shutil.copy(snapshot, tampered)
    with sqlite3.connect(tampered) as db:
        db.execute("UPDATE embeddings SET sha256 = ? WHERE sha256 = ?",
                   ("0" * 64, next(iter(digests))))
    good, bad = (verify_log(log, "--with-model") for log in (snapshot, tampered))
    assert good.returncode == 0, good.stdout + good.stderr
    assert bad.returncode != 0 and "embeddings" in bad.stdout + bad.stderr, bad.stdout + bad.stderr
