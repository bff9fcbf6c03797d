"""Who sent a Generate, by proof only (frontend/caller.py; docs/security.md "Prefix cache
isolation"): the gateway's signed key_hash, the CURVE key's User-Id, or nobody."""
from __future__ import annotations

import secrets

import pytest
import zmq

from core.ipc.protocol import Generate, decode, encode
from frontend.caller import (GROUP_SECRET_ENV, group_secret, identity, key_proof, proven_key,
                             sign)
from frontend.validate import InvalidField

SECRET = secrets.token_hex(32).encode()
VICTIM = "0123456789ab"


def signed(request_id="r1", key_hash=VICTIM, secret=SECRET) -> Generate:
    return sign(Generate(request_id, "p", key_hash=key_hash), secret)


def test_a_signed_key_hash_is_the_identity_and_survives_the_wire():
    msg = decode(encode(signed()))
    assert identity(msg, None, SECRET) == f"key:{VICTIM}"


@pytest.mark.parametrize("forge", [
    lambda m: setattr(m, "key_proof", None),                          # a client's bare key_hash
    lambda m: setattr(m, "key_proof", "0" * 64),                      # a guessed proof
    lambda m: setattr(m, "key_proof", key_proof(b"other", m.request_id, m.key_hash)),
    lambda m: setattr(m, "request_id", "r2"),                         # a proof replayed
    lambda m: setattr(m, "key_hash", "ba9876543210"),                 # another key, same proof
    lambda m: setattr(m, "key_proof", m.key_proof[:-1]),
    lambda m: setattr(m, "key_proof", 7),
], ids=["bare", "guessed", "other-secret", "replayed", "other-key", "short", "not-a-string"])
def test_an_unproven_key_hash_is_a_400_naming_it(forge):
    msg = signed()
    forge(msg)
    with pytest.raises(InvalidField) as e:
        identity(msg, None, SECRET)
    assert e.value.field == "key_hash"


def test_without_a_group_secret_every_key_hash_is_refused():
    with pytest.raises(InvalidField):
        proven_key(signed(), None)


def test_a_proof_without_a_key_hash_is_refused():
    msg = Generate("r", "p", key_proof="0" * 64)
    with pytest.raises(InvalidField) as e:
        proven_key(msg, SECRET)
    assert e.value.field == "key_proof"


def test_a_gateway_without_a_secret_drops_the_key_hash():
    msg = sign(Generate("r", "p", key_hash=VICTIM), None)
    assert msg.key_hash is None and msg.key_proof is None
    assert identity(msg, None, SECRET) is None


def test_the_secret_comes_from_the_environment_only_when_set():
    assert group_secret({}) is None and group_secret({GROUP_SECRET_ENV: "  "}) is None
    assert group_secret({GROUP_SECRET_ENV: "ab12"}) == b"ab12"


def test_a_frame_without_zap_names_nobody():
    """A plain (non-CURVE) connection's frame has no User-Id: anonymous."""
    ctx = zmq.Context()
    try:
        a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
        a.bind("inproc://caller")
        b.connect("inproc://caller")
        b.send(b"x")
        frame = a.recv(copy=False)
        assert identity(Generate("r", "p", user="alice"), frame, SECRET) is None
        assert identity(Generate("r", "p"), None, SECRET) is None
        a.close(0)
        b.close(0)
    finally:
        ctx.term()
