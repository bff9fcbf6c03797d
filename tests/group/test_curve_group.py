"""scripts/serve --curve DIR as a whole group on the null model: serve passes the keys on,
so a listed client streams, the gateway (the operator's key) answers /health and /metrics
and its completions, and a plain client gets nothing (docs/security.md, "CurveZMQ"). Under
--prefix-cache-scope user each CURVE key is an identity of its own (frontend/caller.py)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from frontend.client import Client, ClientError
from scripts import ROOT
from scripts.group import keygen
from scripts.group.harness import start_group
from tests.frontend.test_frontend_lifecycle import free_port
from tests.frontend.test_http import http
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def curved_group(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("curve-group")
    keys = tmp / "keys"
    assert keygen.main([str(keys), "--clients", "2"]) == 0
    where = f"tcp://127.0.0.1:{free_port()}"
    g = start_group(tmp, ["--model", "null", "--curve", str(keys), "--http-port", "0",
                          "--replica-address", where, "--prefix-cache-scope", "user"],
                    log=False)
    try:
        yield g, keys, where
    finally:
        g.stop()


def test_a_listed_client_streams_and_a_plain_one_is_refused(curved_group):
    g, keys, _ = curved_group
    with Client(g.address, server_key=str(keys / "server.key"),
                client_key=str(keys / "clients" / "client0.key_secret")) as c:
        r = c.generate([1, 2, 3], max_tokens=6, ignore_eos=True)
        assert len(r.token_ids) == 6 and r.finish_reason == "length"
        with pytest.raises(ClientError) as e:
            c.stats()
        assert e.value.code == 403
    with Client(g.address, timeout=1.5) as plain:
        with pytest.raises(ClientError) as e:
            plain.generate([1, 2, 3], max_tokens=2)
        assert e.value.code == 503
    # the frontend's ZAP thread logs the refusal from a socket monitor's event: it may come
    # after the client has given up (CI's loaded machine, once)
    wait_until(lambda: "refused 1 connection(s)" in g.stderr.read_text(), 10,
               "the frontend's refusal line")


def test_the_gateway_talks_to_a_curve_frontend_as_the_operator(curved_group):
    g, _, _ = curved_group
    assert http("GET", g.http + "/health")[0] == 200
    status, _, text = http("GET", g.http + "/metrics")
    assert status == 200 and "tl_" in text
    status, _, body = http("POST", g.http + "/v1/completions",
                           {"prompt": [1, 2, 3], "max_tokens": 3, "ignore_eos": True})
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 3


def listed(g, keys, name: str) -> Client:
    return Client(g.address, timeout=30, server_key=str(keys / "server.key"),
                  client_key=str(keys / "clients" / f"{name}.key_secret"))


def test_each_curve_key_has_its_own_cache_whatever_user_it_names(curved_group):
    """client1 naming client0's user finds none of client0's prompt; client0 still hits
    its own. The identity is the key the ZAP handler admitted (the frame's User-Id)."""
    g, keys, _ = curved_group
    prompt = list(range(100, 164))   # four whole blocks of serve's default 16
    with listed(g, keys, "client0") as c0, listed(g, keys, "client1") as c1:
        def send(c, **kw):
            return c.generate(prompt, max_tokens=2, ignore_eos=True, **kw).cached_tokens
        assert send(c0, user="alice") == 0
        assert send(c1, user="alice") == 0
        assert send(c1) == 0
        assert send(c0, user="alice") >= 16


def operator(g, keys) -> Client:
    return Client(g.address, timeout=30, server_key=str(keys / "server.key"),
                  client_key=str(keys / "server.key_secret"))


def test_a_replica_joins_with_its_key_and_one_with_another_cannot(curved_group, tmp_path):
    g, keys, where = curved_group
    stranger = tmp_path / "stranger"
    assert keygen.main([str(stranger)]) == 0   # a replicas/ pair the frontend never listed
    (stranger / "server.key").unlink()   # it knows the frontend's public key, not a pair
    (stranger / "server.key").write_bytes((keys / "server.key").read_bytes())
    # it stops on the refusal itself, in one line, long before its startup timeout
    other = subprocess.run([sys.executable, "-m", "scripts.group.supervisor", "--model", "null",
                            "--no-log", "--join", where, "--curve", str(stranger),
                            "--startup-timeout", "120"], cwd=ROOT, capture_output=True,
                           text=True, timeout=90)
    assert other.returncode != 0 and "ready joined" not in other.stdout, other.stderr[-2000:]
    assert "refused this replica's CURVE key" in other.stderr, other.stderr[-2000:]
    with operator(g, keys) as op:   # the frontend serves on, alone
        assert len(op.stats()["replicas"]) == 1
    (tmp_path / "j").mkdir()
    joined = start_group(tmp_path / "j", ["--model", "null", "--join", where, "--curve",
                                          str(keys)], log=False)
    try:
        with operator(g, keys) as op:
            wait_until(lambda: len(op.stats()["replicas"]) == 2, 60, "the replica to join")
    finally:
        joined.stop()
