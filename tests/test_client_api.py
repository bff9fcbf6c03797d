"""The client without an engine: signatures, light imports, request building, timeouts."""
from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from frontend.client import AsyncClient, Client, ClientError
from frontend.client.common import make_generate
from tests.fake_core import REPO


def test_client_imports_no_heavy_modules():
    code = ("import sys, frontend.client; "
            "bad = {'torch', 'transformers', 'tokenizers'} & set(sys.modules); "
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
