"""Who sent a Generate, as far as something proves it: the gateway's signed API key hash, or
the CURVE key of the connection (docs/security.md, "Prefix cache isolation").

The prefix cache's `user` and `key` scopes salt a request with this identity, never with a
field the caller merely writes. Two proofs exist:

- **The gateway's key_hash.** The gateway checked the API key; it forwards the key's short
  hash with an HMAC-SHA256 over the request id and the hash, keyed by the group's secret,
  which serve hands the gateway and the frontend alone in their environment (GROUP_SECRET_ENV).
  A key_hash without a valid proof is refused with a 400 naming `key_hash`: a client that
  sends one expects a key's isolation and its step-log attribution, and must not get a 200
  with neither (nor, worse, another key's cache).
- **The CURVE key.** Under --curve the ZAP handler (frontend/zap.py) names each connection's
  key; libzmq attaches the name to every frame as its User-Id, which no client can set.

A request with neither is anonymous: under `key` it shares the unsalted cache with every other
anonymous request, under `user` its `user` field alone separates it from other anonymous
ones (nothing authenticates such a caller, so that separation only keeps cooperating callers
apart).
"""
from __future__ import annotations

import hashlib
import hmac
import os

import zmq

from core.ipc.protocol import Generate
from frontend.validate import InvalidField

GROUP_SECRET_ENV = "TL_GROUP_SECRET"   # hex; serve's, given to the gateway and frontend only
PROOF_CHARS = 64                      # an HMAC-SHA256 in hex
UNPROVEN = ("key_hash is the gateway's: it is accepted only with the gateway's proof that it "
            "checked the key")


def group_secret(environ=os.environ) -> bytes | None:
    """The group's secret from the environment; None when unset or blank."""
    raw = environ.get(GROUP_SECRET_ENV, "").strip()
    return raw.encode() if raw else None


def key_proof(secret: bytes, request_id: str, key_hash: str) -> str:
    """The gateway's proof that `key_hash` is the hash of a key it admitted for this request."""
    text = f"{len(request_id)}:{request_id}:{key_hash}".encode("utf-8", "surrogatepass")
    return hmac.new(secret, text, hashlib.sha256).hexdigest()


def sign(msg: Generate, secret: bytes | None) -> Generate:
    """msg with its key_hash proven (the gateway's client calls it before sending); without a
    secret the key_hash is dropped, since the frontend would refuse it unproven."""
    if msg.key_hash is not None:
        if secret is None:
            msg.key_hash = None
        else:
            msg.key_proof = key_proof(secret, msg.request_id, msg.key_hash)
    return msg


def proven_key(msg: Generate, secret: bytes | None) -> str | None:
    """msg's key_hash if its proof holds, None if it has none; InvalidField otherwise."""
    if msg.key_hash is None:
        if msg.key_proof is not None:
            raise InvalidField("key_proof comes only with a key_hash", "key_proof")
        return None
    proof = msg.key_proof
    if (secret is None or not isinstance(proof, str) or len(proof) != PROOF_CHARS
            or not hmac.compare_digest(proof, key_proof(secret, msg.request_id, msg.key_hash))):
        raise InvalidField(UNPROVEN, "key_hash")
    return msg.key_hash


def curve_user(frame: zmq.Frame | None) -> str | None:
    """The ZAP handler's name for the key the frame came with; None without CURVE."""
    if frame is None:
        return None
    try:
        return frame.get("User-Id") or None
    except zmq.ZMQError:   # no ZAP handler on this socket: nothing names the peer
        return None


def identity(msg: Generate, frame: zmq.Frame | None, secret: bytes | None) -> str | None:
    """Who sent msg, by proof only: "key:HASH" (an API key the gateway checked) before
    "curve:NAME" (the connection's CURVE key), else None. InvalidField for an unproven
    key_hash."""
    key = proven_key(msg, secret)
    if key is not None:
        return f"key:{key}"
    name = curve_user(frame)
    return None if name is None else f"curve:{name}"
