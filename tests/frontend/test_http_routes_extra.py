"""The gateway's smaller routes and options, in-process against a recording stand-in for the
engine (no engine): GET /v1/models/{id}, GET /version, --served-model-name's 404 for another
model, --allowed-origins' CORS headers and preflights, and a client that disconnects
mid-request counted as an abort. The live checks are in test_http_extras.py."""
from __future__ import annotations

import asyncio
import json
import tomllib

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from frontend.http.api_keys import api_keys
from frontend.http.app import Gateway, make_app
from frontend.http.auth import Guard
from frontend.http.metrics import Metrics
from frontend.http.origins import parse_origins
from scripts import ROOT
from tests.frontend.test_http_api_shapes import FakeChat, Recording, two_tokens
from tests.waiting import until

SITE = "https://app.example"
PREFLIGHT = {"Origin": SITE, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"}
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def gateway(client=None, strict: bool = False, name: str = "m") -> Gateway:
    return Gateway(client or Recording(), name, 64, FakeChat(), Metrics(), 7,
                   strict_model=strict)


def call(gw: Gateway, method: str, path: str, body: dict | None = None, headers=None,
         origins: str = "", guard: Guard | None = None):
    """(status, headers, text) of one request."""
    async def run():
        app = make_app(gw, guard, parse_origins(origins))
        async with TestClient(TestServer(app)) as c:
            r = await c.request(method, path, json=body, headers=headers or {})
            return r.status, r.headers, await r.text()
    return asyncio.run(run())


# ------------------------------------------------------------------ models and version


def test_a_models_card_by_id_and_404_in_openais_shape_for_another():
    gw = gateway(name=HUB_ID)
    status, _, text = call(gw, "GET", f"/v1/models/{HUB_ID}")
    assert status == 200
    card = json.loads(text)
    assert card == {"id": HUB_ID, "object": "model", "created": 7, "owned_by": "tl-engine",
                    "max_model_len": 64}
    assert json.loads(call(gw, "GET", "/v1/models")[2])["data"] == [card]
    status, _, text = call(gw, "GET", "/v1/models/gpt-4o")
    assert status == 404
    assert json.loads(text) == {"error": {
        "message": "The model `gpt-4o` does not exist.", "type": "not_found_error",
        "param": "model", "code": "model_not_found"}}


def test_version_is_the_packages():
    want = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    status, _, text = call(gateway(), "GET", "/version")
    assert status == 200 and text == f'{{"version": "{want}"}}'


def test_a_served_model_name_must_be_named_by_requests():
    client = Recording()
    strict = gateway(client, strict=True, name=HUB_ID)
    for path, body in (("/v1/completions", {"prompt": "hi"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
                       ("/tokenize", {"prompt": "hi"})):
        status, _, text = call(strict, "POST", path, {**body, "model": "smollm2"})
        assert status == 404 and "model_not_found" in text, (path, text)
    assert not client.calls
    for model in (HUB_ID, None):   # its name, or none given
        status, _, text = call(strict, "POST", "/v1/completions",
                               {"prompt": "hi", "max_tokens": 2, "model": model})
        assert status == 200, text
    assert len(client.calls) == 2
    # by default any name passes, as before
    status, _, _ = call(gateway(), "POST", "/v1/completions", {"prompt": "hi", "model": "x"})
    assert status == 200


# ------------------------------------------------------------------ CORS


def test_an_allowed_origins_preflight_is_answered_before_the_key_check():
    guard = Guard(api_keys(["k" * 32]), False)
    status, headers, _ = call(gateway(), "OPTIONS", "/v1/chat/completions", headers=PREFLIGHT,
                              origins=f"{SITE}/, https://other.example", guard=guard)
    assert status == 204
    assert headers["Access-Control-Allow-Origin"] == SITE
    assert headers["Access-Control-Allow-Methods"] == "GET, POST, OPTIONS"
    assert headers["Access-Control-Allow-Headers"] == PREFLIGHT["Access-Control-Request-Headers"]
    # the 401 that follows carries the header too, so the browser can read it
    status, headers, _ = call(gateway(), "POST", "/v1/completions", {"prompt": "hi"},
                              headers={"Origin": SITE}, origins=SITE, guard=guard)
    assert status == 401 and headers["Access-Control-Allow-Origin"] == SITE


def test_other_origins_get_no_cors_headers():
    for origins, origin in (("", SITE), ("https://other.example", SITE)):
        status, headers, _ = call(gateway(), "OPTIONS", "/v1/completions",
                                  headers={**PREFLIGHT, "Origin": origin}, origins=origins)
        assert status == 405 and "Access-Control-Allow-Origin" not in headers
        status, headers, _ = call(gateway(), "POST", "/v1/completions", {"prompt": "hi"},
                                  headers={"Origin": origin}, origins=origins)
        assert status == 200 and "Access-Control-Allow-Origin" not in headers


def test_allowed_origins_get_the_header_on_streams_and_errors():
    for body in ({"prompt": "hi", "stream": True}, {"prompt": "hi", "n": 99}):
        status, headers, _ = call(gateway(), "POST", "/v1/completions", body,
                                  headers={"Origin": SITE}, origins="*")
        assert status in (200, 400)
        assert headers["Access-Control-Allow-Origin"] == SITE and "Origin" in headers["Vary"]
    status, headers, _ = call(gateway(), "OPTIONS", "/v1/models",
                              headers={**PREFLIGHT, "Access-Control-Request-Headers": "a b"},
                              origins="*")
    assert status == 204   # a header list that is not names: the default list instead
    assert headers["Access-Control-Allow-Headers"] == "Authorization, Content-Type, X-TL-Priority"


@pytest.mark.parametrize("bad", ["app.example", "https://a.example/path", "ftp//x"])
def test_an_origin_that_is_not_one_is_refused(bad):
    with pytest.raises(ValueError, match="--allowed-origins"):
        parse_origins(f"{SITE},{bad}")


# ------------------------------------------------------------------ aborts counted


class Hanging(Recording):
    """The first token, then nothing until the client goes."""
    async def _stream(self, kw):
        try:
            yield two_tokens(kw)[0]
            await asyncio.sleep(3600)
        finally:
            self.closed.append(kw["request_id"])


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_disconnects_is_counted_as_an_abort(stream):
    client = Hanging()
    gw = gateway(client)
    aborts = lambda: gw.metrics.registry.get_sample_value(   # noqa: E731
        "tl_requests_finished_total", {"finish_reason": "abort"})

    async def run():
        server = TestServer(make_app(gw), handler_cancellation=True)
        async with TestClient(server) as c:
            body = {"prompt": "hi", "n": 2, "stream": stream}
            try:
                async with asyncio.timeout(0.5):
                    async with c.post("/v1/completions", json=body) as r:
                        await r.content.readany()
                        await asyncio.sleep(3600)
            except (TimeoutError, aiohttp.ClientError):
                pass
            await until(lambda: len(client.closed) == 2, 10, "the engine streams closed")
            await until(lambda: aborts() == 2, 10, "two aborts counted")
    assert aborts() == 0
    asyncio.run(run())
    assert gw.metrics.registry.get_sample_value(
        "tl_requests_finished_total", {"finish_reason": "length"}) == 0


# ------------------------------------------------------------------ serve's flags


def test_serve_passes_the_name_and_origins_to_the_gateway():
    from frontend.http.server import parse_args
    from scripts.group.commands import http_command
    from scripts.group.supervisor import parser
    argv = ["--http-port", "0", "--served-model-name", HUB_ID, "--allowed-origins", SITE]
    cmd = http_command(parser().parse_args(argv), "tcp://x:1", 0)
    args = parse_args(cmd[cmd.index("frontend.http") + 1:])
    assert (args.model_name, args.allowed_origins) == (HUB_ID, SITE)
    cmd = http_command(parser().parse_args(["--http-port", "0"]), "tcp://x:1", 0)
    args = parse_args(cmd[cmd.index("frontend.http") + 1:])
    assert (args.model_name, args.allowed_origins) == (None, None)


@pytest.mark.parametrize("flags", [["--served-model-name", " "], ["--allowed-origins", "nope"]])
def test_serve_and_the_gateway_refuse_a_bad_name_or_origin_before_starting(flags, capsys):
    import subprocess
    import sys
    from scripts.group.supervisor import parse
    with pytest.raises(SystemExit) as e:
        parse(["--http-port", "0", *flags])
    assert e.value.code == 2 and flags[0] in capsys.readouterr().err
    r = subprocess.run([sys.executable, "-m", "frontend.http", "--frontend", "tcp://127.0.0.1:1",
                        "--port", "0", *flags], capture_output=True, text=True, timeout=60,
                       cwd=ROOT)
    assert r.returncode == 2 and flags[0] in r.stderr, r.stderr
