"""API keys on the gateway (frontend/http/auth.py, api_keys.py; docs/security.md "API keys").

One group serves with three keys, one from each source (--api-key, an --api-key-file,
$TL_API_KEY); a second gateway on the same frontend runs with --protect-metrics. The keys
are made per run, so finding one in a log or a command line is a leak, not a coincidence.
"""
from __future__ import annotations

import hashlib
import os
import secrets
import sqlite3
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from frontend.client import Client, ClientError
from frontend.http.api_keys import KeyProblem, api_keys, collect, file_keys
from scripts import ROOT
from scripts.group.harness import start_group
from tests.conftest import verify_log
from tests.frontend.test_http import http, start_gateway, stop_gateway
from core.ipc.protocol import WIRE, Generate, encode
from tests.group.test_cache_isolation import BLOCK, PIN, assert_isolated, http_sender, note
from tests.group.test_hostile_values import exchange
from tests.waiting import wait_until

KEY_FLAG, KEY_FILE, KEY_ENV = (f"tl-{name}-{secrets.token_urlsafe(18)}"
                               for name in ("flag", "file", "env"))
KEYS = (KEY_FLAG, KEY_FILE, KEY_ENV)
GUARDED = [("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}),
           ("POST", "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
           ("GET", "/v1/models", None), ("POST", "/tokenize", {"prompt": "hi"}),
           ("POST", "/detokenize", {"tokens": [1, 2]}), ("GET", "/tokenizer_info", None),
           ("POST", "/v1/embeddings", {"input": "hi"}),
           ("POST", "/v1/score", {"text_1": "a", "text_2": "b"}),
           ("POST", "/v1/rerank", {"query": "a", "documents": ["b"]}),
           ("GET", "/v1/no-such-route", None)]


def short(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("keyed")
    (tmp / "keys").write_text(f"# the file's key\n\n  {KEY_FILE}  \n# {KEY_FLAG}x\n")
    g = start_group(tmp, ["--http-port", "0", "--api-key", KEY_FLAG,
                          "--api-key-file", str(tmp / "keys")],   # scope: key, the default
                    env={"TL_API_KEY": KEY_ENV})
    try:
        yield g
    finally:
        code = g.stop()
    assert code == 0, g.tail()
    r = verify_log(g.log)   # replay reads the key_hash column and checks it
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture(scope="module")
def protected(keyed, tmp_path_factory):
    """A second gateway on the group's frontend, its one key from $TL_API_KEY."""
    tmp = tmp_path_factory.mktemp("protected")
    with pytest.MonkeyPatch.context() as mp:   # the child copies the environment at start
        mp.setenv("TL_API_KEY", KEY_ENV)
        proc, url = start_gateway(keyed.address, tmp, "--protect-metrics",
                                  "--log-level", "DEBUG")
    try:
        yield url, tmp / "http.stderr"
    finally:
        stop_gateway(proc)


def assert_401(status: int, headers, body) -> None:
    assert status == 401, body
    assert headers["WWW-Authenticate"] == "Bearer"
    assert set(body) == {"error"} and body["error"]["code"] == "invalid_api_key", body
    assert body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("method,path,body", GUARDED, ids=[p for _, p, _ in GUARDED])
def test_guarded_routes_refuse_a_missing_wrong_or_malformed_key(keyed, method, path, body):
    last_byte = KEY_FILE[:-1] + ("a" if KEY_FILE[-1] != "a" else "b")
    for headers in ({}, bearer("wrong"), bearer(last_byte), bearer(KEY_FILE + "x"),
                    {"Authorization": f"Basic {KEY_FILE}"}, {"Authorization": KEY_FILE},
                    {"Authorization": "Bearer "}):
        assert_401(*http(method, keyed.http + path, body, headers))


def test_each_listed_key_is_served(keyed):
    for key in KEYS:
        with openai.OpenAI(base_url=keyed.http + "/v1", api_key=key, max_retries=0) as oai:
            r = oai.completions.create(model="tiny", prompt="hi", max_tokens=2, temperature=0)
            assert r.usage.completion_tokens >= 1
        status, _, toks = http("POST", keyed.http + "/tokenize", {"prompt": "hi"},
                               {"Authorization": f"bearer  {key}"})
        assert status == 200 and toks["tokens"], toks
    with openai.OpenAI(base_url=keyed.http + "/v1", api_key="nope", max_retries=0) as oai:
        with pytest.raises(openai.AuthenticationError):
            oai.models.list()


def test_another_key_learns_nothing_under_scope_key(keyed):
    """--prefix-cache-scope key: each key its own cache (docs/security.md), so a second key's
    guesses at the first key's PIN all find the same cached_tokens."""
    assert_isolated(http_sender(keyed, bearer(KEY_FLAG)), http_sender(keyed, bearer(KEY_FILE)),
                    "Per key.")


def test_with_keys_the_default_scope_is_per_key(keyed):
    argv = Path(f"/proc/{keyed.pid_of('-m frontend --')}/cmdline").read_bytes().split(b"\0")
    assert argv[argv.index(b"--prefix-cache-scope") + 1] == b"key"


def test_a_zmq_client_cannot_claim_a_key(keyed):
    """A ZeroMQ client that sends a key's short hash, bare or with a forged proof, gets a
    400 naming key_hash (frontend/caller.py); as the anonymous client it is, it finds none
    of the key's blocks, while the key itself still does."""
    prompt = note("Claimed.", PIN)
    victim = http_sender(keyed, bearer(KEY_FLAG))
    assert victim(prompt) == 0
    with Client(keyed.address, timeout=30) as c:
        with pytest.raises(ClientError) as e:
            c.generate(prompt, max_tokens=2, key_hash=short(KEY_FLAG))
        assert e.value.code == 400 and e.value.param == "key_hash", e.value
        for proof in ("0" * 64, hashlib.sha256(b"guess").hexdigest()):
            forged = Generate("forged", prompt, max_tokens=2, key_hash=short(KEY_FLAG),
                              key_proof=proof, wire=WIRE)
            (reply,) = exchange(keyed, encode(forged), "forged")
            assert (reply["t"], reply["code"], reply["param"]) == ("error", 400, "key_hash")
        assert c.generate(prompt, max_tokens=2).cached_tokens == 0
    assert victim(prompt) >= BLOCK


def test_health_and_metrics_stay_open_by_default(keyed):
    assert http("GET", keyed.http + "/health")[0] == 200
    assert http("GET", keyed.http + "/metrics")[0] == 200


def test_protect_metrics_closes_health_and_metrics(protected):
    url, _ = protected
    for path in ("/health", "/metrics"):
        assert_401(*http("GET", url + path))
        assert http("GET", url + path, headers=bearer(KEY_ENV))[0] == 200


def test_the_step_log_holds_the_keys_hash_and_replies_name_only_the_file(keyed):
    status, _, reply = http("POST", keyed.http + "/v1/completions",
                            {"prompt": "hash me", "max_tokens": 2, "user": "keyed-1"},
                            bearer(KEY_FILE))
    assert status == 200, reply
    assert reply["tl"]["log"] == keyed.log.name and not os.path.isabs(reply["tl"]["log"])
    with Client(keyed.address, timeout=30) as c:
        c.generate("no key", max_tokens=2, user="zmq-1")
        with pytest.raises(ClientError) as e:
            c.generate("bad", max_tokens=2, key_hash="NOT-HEX")
        assert e.value.code == 400 and e.value.param == "key_hash"

    def rows():
        with sqlite3.connect(f"file:{keyed.log}?mode=ro", uri=True) as conn:
            got = dict(conn.execute("SELECT user, key_hash FROM requests WHERE user IN"
                                    " ('keyed-1', 'zmq-1')").fetchall())
        return got if len(got) == 2 else None
    assert wait_until(rows, what="both requests logged") == {"keyed-1": short(KEY_FILE),
                                                             "zmq-1": None}


def test_keys_never_leave_in_logs_argv_or_metrics(keyed, protected):
    """After the tests above (failures included): no key in serve's or the gateways'
    stderr, the step log, /metrics, or the gateway's command line; only the gateway's
    environment holds them."""
    for key in KEYS:
        http("POST", keyed.http + "/v1/completions", {"prompt": "x", "max_tokens": 1},
             bearer(key))
    _, _, metrics = http("GET", keyed.http + "/metrics")
    gateway = keyed.pid_of("frontend.http")
    argv = Path(f"/proc/{gateway}/cmdline").read_bytes().decode()
    texts = {"serve stderr": keyed.stderr.read_text(errors="replace"),
             "protected gateway stderr": protected[1].read_text(errors="replace"),
             "metrics": metrics, "gateway argv": argv,
             **{p.name: p.read_bytes().decode("latin-1")
                for p in keyed.log.parent.glob(keyed.log.name + "*")}}
    assert "frontend.http" in argv
    for needle, holds in (("-m frontend.http", True), ("-m frontend --", False),
                          ("-m core", False), ("-m worker", False)):
        environ = b"\0" + Path(f"/proc/{keyed.pid_of(needle)}/environ").read_bytes()
        assert (b"\0TL_API_KEY=" in environ) == holds, needle
        # the group's secret: the gateway's and the frontend's alone (frontend/caller.py)
        signs = needle in ("-m frontend.http", "-m frontend --")
        assert (b"\0TL_GROUP_SECRET=" in environ) == signs, needle
    for where, text in texts.items():
        for key in KEYS:
            assert key not in text, f"a key in the {where}"


# ------------------------------------------------------------------ without a group


def test_key_file_skips_blanks_and_comments(tmp_path):
    f = tmp_path / "k"
    f.write_text("\n# comment\n  alpha  \n\tbeta\n#gamma\n")
    assert file_keys(str(f)) == ["alpha", "beta"]
    assert collect(["alpha", "delta"], "beta\n\nzeta", str(f)) == ["alpha", "delta", "beta",
                                                                    "zeta"]
    keys = api_keys(["alpha", "beta"])
    assert keys.admits("beta") and not keys.admits("betb") and not keys.admits("")


@pytest.mark.parametrize("content,reason", [("", "holds no key"), ("# only\n\n", "holds no key"),
                                            (None, "cannot read"),
                                            ("ok\nsecret with space\n", "line 2 of")])
def test_a_bad_key_file_is_refused_with_its_reason(tmp_path, content, reason):
    f = tmp_path / "k"
    if content is not None:
        f.write_text(content)
    with pytest.raises(KeyProblem) as e:
        file_keys(str(f))
    assert reason in str(e.value) and "secret" not in str(e.value)


def test_gateway_and_serve_refuse_to_start_on_an_empty_key_file(tmp_path):
    (tmp_path / "empty").write_text("# nothing\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    gw = subprocess.run([sys.executable, "-m", "frontend.http", "--frontend",
                         "tcp://127.0.0.1:9", "--api-key-file", str(tmp_path / "empty")],
                        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert gw.returncode == 2 and "holds no key" in gw.stderr, gw.stderr
    serve = subprocess.run([str(ROOT / "scripts" / "serve"), "--http-port", "0",
                            "--api-key-file", str(tmp_path / "missing")],
                           capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert serve.returncode == 2 and "cannot read --api-key-file" in serve.stderr, serve.stderr


def test_serve_hands_the_keys_to_the_gateway_in_its_environment(monkeypatch):
    from scripts.group.gateway_keys import gateway_env
    from scripts.group.supervisor import parse
    monkeypatch.delenv("TL_API_KEY", raising=False)
    assert gateway_env(parse(["--http-port", "0", "--api-key", "a", "--api-key", "b",
                              "--api-key", "a"])) == ({"TL_API_KEY": "a\nb"}, None)
    assert gateway_env(parse(["--http-port", "0"])) == ({}, None)
    assert "--http-port" in gateway_env(parse(["--api-key", "a"]))[1]
    assert "needs an API key" in gateway_env(parse(["--http-port", "0",
                                                    "--protect-metrics"]))[1]
    monkeypatch.setenv("TL_API_KEY", "has space")
    assert "$TL_API_KEY" in gateway_env(parse(["--http-port", "0"]))[1]
