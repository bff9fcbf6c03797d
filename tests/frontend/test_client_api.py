"""The client without an engine: signatures, light imports, request building, timeouts."""
from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys

import pytest

from frontend.client import AsyncClient, Client, ClientError
from frontend.client.common import make_generate
from tests.fake_core import REPO


def test_client_imports_no_heavy_modules():
    code = ("import sys; from frontend.client import Client; "
            "bad = {'torch', 'transformers', 'tokenizers', 'zmq.asyncio'} & set(sys.modules); "
            "sys.exit(f'imported {sorted(bad)}' if bad else 0)")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


def test_unknown_keyword_is_type_error(tmp_path):
    with Client(f"ipc://{tmp_path}/none", timeout=0.1) as c:
        with pytest.raises(TypeError):
            c.generate("x", max_token=3)
        with pytest.raises(TypeError):
            c.stream("x", temprature=1.0)
    ac = AsyncClient(f"ipc://{tmp_path}/none")
    with pytest.raises(TypeError):
        ac.stream("x", bogus=1)
    asyncio.run(ac.close())


PUBLIC_PARAMS = {"prompt": inspect.Parameter.empty, "max_tokens": 16, "temperature": 0.0,
                 "top_p": 1.0, "top_k": 0, "seed": None, "stop": None, "priority": 0,
                 "ignore_eos": False, "request_id": None}
# issue 14's fields: keyword-only, after the pinned positional ones
KEYWORD_PARAMS = {"logprobs": None, "min_p": 0.0, "presence_penalty": 0.0,
                  "frequency_penalty": 0.0, "repetition_penalty": 1.0, "min_tokens": 0,
                  "stop_token_ids": None, "include_stop_str_in_output": False,
                  "skip_special_tokens": True, "add_special_tokens": True, "user": None,
                  "max_tokens_must_fit": False, "prompt_logprobs": None,
                  "response_format": None, "structured_outputs": None, "key_hash": None,
                  "cache_salt": None, "speculative": True}
REQUEST_METHODS = [Client.generate, Client.stream, AsyncClient.generate, AsyncClient.stream]


@pytest.mark.parametrize("method", REQUEST_METHODS, ids=lambda m: m.__qualname__)
def test_request_methods_show_the_pinned_signature(method):
    params = list(inspect.signature(method).parameters.values())
    assert params[0].name == "self"
    positional = [p for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    keyword = [p for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]
    assert len(positional) + len(keyword) == len(params)
    assert {p.name: p.default for p in positional[1:]} == PUBLIC_PARAMS
    assert {p.name: p.default for p in keyword} == KEYWORD_PARAMS
    assert method.__name__ in ("generate", "stream")
    assert inspect.iscoroutinefunction(method) == (method is AsyncClient.generate)


def test_request_methods_take_the_pinned_arguments(tmp_path, monkeypatch):
    """Positions, keywords and defaults reach the Generate as the signature says; an unknown
    keyword is a TypeError, for all four methods."""
    sent = []

    def record(self, msg):
        sent.append(msg)
        return iter(())

    async def record_async(self, msg):
        sent.append(msg)
        return
        yield

    monkeypatch.setattr(Client, "_start", record)
    monkeypatch.setattr(Client, "_deltas", lambda self, request_id: iter(()))
    monkeypatch.setattr(Client, "_stream", record)
    monkeypatch.setattr(AsyncClient, "_stream", record_async)
    addr = f"ipc://{tmp_path}/none"
    with Client(addr, timeout=0.1) as c:
        list(c.stream("a", 3, 0.5, top_k=2, request_id="s"))
        c.generate([1, 2], stop="x", priority=-4)
        for method in (c.generate, c.stream):
            with pytest.raises(TypeError):
                method("x", bogus=1)
            with pytest.raises(TypeError):
                method()

    async def main():
        async with AsyncClient(addr, timeout=0.1) as ac:
            await ac.generate("b", 5, seed=7, ignore_eos=True)
            [d async for d in ac.stream(prompt="c")]
            with pytest.raises(TypeError):
                await ac.generate("x", bogus=1)
            with pytest.raises(TypeError):
                ac.stream("x", bogus=1)

    asyncio.run(main())
    got = [(g.prompt, g.max_tokens, g.temperature, g.top_k, g.seed, g.stop, g.priority,
            g.ignore_eos) for g in sent]
    assert got == [("a", 3, 0.5, 2, None, None, 0, False),
                   ([1, 2], 16, 0.0, 0, None, ["x"], -4, False),
                   ("b", 5, 0.0, 0, 7, None, 0, True),
                   ("c", 16, 0.0, 0, None, None, 0, False)]
    assert sent[0].request_id == "s" and len(sent[1].request_id) == 32


def test_make_generate_normalizes():
    g = make_generate((1, 2), 16, 0.0, 1.0, 0, None, "end", 0, False, None)
    assert g.prompt == [1, 2] and g.stop == ["end"]
    assert len(g.request_id) == 32 and int(g.request_id, 16) >= 0
    g2 = make_generate("p", 16, 0.0, 1.0, 0, None, ("a", "b"), 0, False, "mine")
    assert g2.stop == ["a", "b"] and g2.request_id == "mine"


def test_no_engine_times_out_with_503(tmp_path):
    with Client(f"ipc://{tmp_path}/none", timeout=0.2) as c:
        for call in (lambda: c.generate("x"), c.stats, lambda: next(c.stream("x"))):
            with pytest.raises(ClientError) as e:
                call()
            assert e.value.code == 503 and "0.2" in e.value.message


def test_async_no_engine_times_out_with_503(tmp_path):
    async def main():
        async with AsyncClient(f"ipc://{tmp_path}/none", timeout=0.2) as c:
            with pytest.raises(ClientError) as e:
                await c.generate("x")
            assert e.value.code == 503
            with pytest.raises(ClientError):
                await c.stats()

    asyncio.run(main())
