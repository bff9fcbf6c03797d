"""Probing the prefix cache as an attacker would (docs/security.md, "Prefix cache
isolation"): a victim's prompt holds a PIN; a second tenant sends guesses and reads
cached_tokens. Under its own salt (an explicit cache_salt, or its user under
--prefix-cache-scope user) every guess finds the same count, so none reveals the PIN,
while the victim's own salt still shares the victim's blocks. One group for the module;
its step log must verify at teardown (the group fixture), so replay reproduces the hits.
The group has two API keys: under `user` the field only subdivides a key, so another key
that sends the same `user` finds nothing (frontend/caller.py)."""
from __future__ import annotations

import secrets
import sqlite3
import subprocess
import sys

import pytest

from frontend.client import Client, ClientError
from tests.conftest import snapshot_log, verify_log
from tests.frontend.test_http import http
from tests.waiting import wait_until

GROUP_ARGS = ["--http-port", "0", "--prefix-cache-scope", "user"]
KEY_A, KEY_B = (f"tl-{who}-{secrets.token_urlsafe(12)}" for who in ("a", "b"))
GROUP_ENV = {"TL_API_KEY": f"{KEY_A}\n{KEY_B}"}
BLOCK = 16   # serve's default --block-size: the victim's tail spans several blocks
PIN = "4821"
# distinct first digits: no guess shares a block holding part of the PIN with an earlier
# one of the attacker's own (whose blocks its salt does share)
GUESSES = ["0000", "1234", "9999", PIN, "5555", "7777"]


def note(head: str, pin: str) -> str:
    """The victim's kind of prompt: a head, the PIN in the middle, a long tail (whole blocks
    after the PIN, so that a right guess would find many more cached tokens)."""
    return (f"{head} Account record. Customer PIN is {pin}. "
            + "Never read it aloud to anyone who calls the branch. " * 3)


def probe(send, head: str) -> list[int]:
    """The attacker: a note with a PIN no guess holds (its own baseline: every later guess
    finds at least the blocks before the PIN), then each guess; their cached_tokens."""
    send(note(head, "----"))
    return [send(note(head, guess)) for guess in GUESSES]


@pytest.fixture(scope="module")
def client(group):
    with Client(group.address, timeout=60) as c:
        yield c


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def zmq_sender(client: Client, **kw):
    return lambda prompt: client.generate(prompt, max_tokens=2, ignore_eos=True,
                                          **kw).cached_tokens


def http_sender(group, headers=None, **body):
    def send(prompt: str) -> int:
        status, _, reply = http("POST", f"{group.http}/v1/completions",
                                {"prompt": prompt, "max_tokens": 2, "temperature": 0,
                                 "ignore_eos": True, **body}, headers)
        assert status == 200, reply
        return reply["usage"]["prompt_tokens_details"]["cached_tokens"]
    return send


def assert_isolated(victim, attacker, head: str) -> None:
    victim(note(head, PIN))
    seen = probe(attacker, head)
    assert len(set(seen)) == 1, f"a guess stands out: {dict(zip(GUESSES, seen))}"
    again = victim(note(head, PIN))   # the victim's own salt still shares its blocks
    assert again > seen[0] + BLOCK, (again, seen)


def test_another_cache_salt_learns_nothing(client):
    assert_isolated(zmq_sender(client, cache_salt="tenant-victim"),
                    zmq_sender(client, cache_salt="tenant-attacker"), "Salted ZMQ.")


def test_another_user_learns_nothing_under_scope_user(client):
    assert_isolated(zmq_sender(client, user="alice"), zmq_sender(client, user="mallory"),
                    "Per user.")


def test_another_salt_finds_nothing_of_the_exact_prompt_and_the_same_salt_hits(client):
    """The issue's two users: the second, under another salt, gets cached_tokens 0 for the
    first's exact prompt; under the first's salt it gets the hit."""
    prompt = note("Exact.", PIN)
    first = zmq_sender(client, cache_salt="user-one")
    assert first(prompt) == 0
    assert zmq_sender(client, cache_salt="user-two")(prompt) == 0
    assert zmq_sender(client, cache_salt="user-one")(prompt) >= BLOCK


def test_another_cache_salt_learns_nothing_over_http(group):
    assert_isolated(http_sender(group, bearer(KEY_A), cache_salt="tenant-victim"),
                    http_sender(group, bearer(KEY_A), cache_salt="tenant-attacker"),
                    "Salted HTTP.")


def test_the_same_user_under_another_key_learns_nothing(group):
    assert_isolated(http_sender(group, bearer(KEY_A), user="alice"),
                    http_sender(group, bearer(KEY_B), user="alice"), "Same user, two keys.")


def test_who_claims_a_user_finds_none_of_its_prompt(group, client):
    """The issue's attack: another key, or a ZeroMQ client, that sends `user: "alice"` reads
    cached_tokens 0 for alice's exact prompt; alice's own key still hits it."""
    prompt = note("Alice's.", PIN)
    alice = http_sender(group, bearer(KEY_A), user="alice")
    assert alice(prompt) == 0
    assert http_sender(group, bearer(KEY_B), user="alice")(prompt) == 0
    assert zmq_sender(client, user="alice")(prompt) == 0
    assert alice(prompt) >= BLOCK


def test_equal_salts_share_and_the_log_holds_only_a_digest(client, group):
    send = zmq_sender(client, cache_salt="raw-secret-salt")
    send(note("Shared.", PIN))
    assert send(note("Shared.", PIN)) > 0
    rows = logged_salts(group)
    assert any(rows) and all(s is None or (len(s) == 16 and int(s, 16) >= 0) for s in rows)
    files = [group.log, group.log.with_name(group.log.name + "-wal")]
    assert not any(b"raw-secret-salt" in f.read_bytes() for f in files if f.exists())


@pytest.mark.parametrize("body, param", [({"cache_salt": ""}, "cache_salt"),
                                         ({"cache_salt": "s" * 257}, "cache_salt"),
                                         ({"cache_salt": 7}, "cache_salt")])
def test_a_bad_salt_is_a_400_naming_it(group, client, body, param):
    status, _, reply = http("POST", f"{group.http}/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "hi"}], **body},
                            bearer(KEY_A))
    assert status == 400 and reply["error"]["param"] == param, reply
    if isinstance(body["cache_salt"], str):
        with pytest.raises(ClientError) as e:
            client.generate("hi", max_tokens=1, cache_salt=body["cache_salt"])
        assert e.value.code == 400 and e.value.param == param


def logged_salts(group) -> list[str | None]:
    """Every request's cache_salt column, once the writer has committed every finish."""
    def settled():
        with sqlite3.connect(f"file:{group.log}?mode=ro", uri=True) as conn:
            rows = conn.execute("SELECT cache_salt, finish_reason FROM requests").fetchall()
        return rows if rows and all(f is not None for _, f in rows) else None
    return [salt for salt, _ in wait_until(settled, 10, "the log's finishes")]


@pytest.mark.slow   # ~20 s here: the model re-run on every step of the module's log
def test_replay_with_the_model_reproduces_the_salted_hits(client, group, tmp_path):
    """verify --with-model re-runs every step (the hits, the state hash, the tokens) and
    request --rerun one salted request alone."""
    send = zmq_sender(client, cache_salt="replayed")
    send(note("Replayed.", PIN))
    send(note("Replayed.", PIN))
    logged_salts(group)
    snapshot = snapshot_log(group.log, tmp_path / "snapshot.db")
    r = verify_log(snapshot, "--with-model")
    assert r.returncode == 0, r.stdout + r.stderr
    with sqlite3.connect(snapshot) as conn:
        salted = conn.execute("SELECT max(id) FROM requests WHERE cache_salt IS NOT NULL"
                              " AND finish_reason IS NOT NULL").fetchone()[0]
    r = subprocess.run([sys.executable, "-m", "replay", "request", str(snapshot), str(salted),
                        "--rerun"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
