"""Which requests may share prefix cache blocks (docs/security.md, "Prefix cache
isolation"): the digest the frontend sends the core in place of a request's salts.

A request's salts are its explicit `cache_salt` and, by `--prefix-cache-scope`, its caller's
proven identity (frontend/caller.py: the API key the gateway checked, or the CURVE key) under
`key`, and that identity with its `user` field under `user`: the field only subdivides an
identity, so two keys that send the same `user` never share. The core
starts the request's chain of block keys from the digest (core/prefix_cache.py), so only
requests of equal digests share blocks. The raw salt never leaves this process: the core
and its step log see only 16 hex characters of a sha256.
"""
from __future__ import annotations

from hashlib import sha256

from core.ipc.protocol import Generate

SCOPES = ("global", "key", "user")
DIGEST_CHARS = 16


def _implicit(msg: Generate, scope: str, identity: str | None) -> list[tuple[str, str | None]]:
    """The salts the scope adds (None where the request has none): nothing under global."""
    if scope == "user":
        return [("id", identity), ("user", msg.user)]
    if scope == "key":
        return [("id", identity)]
    return []


def salt_digest(msg: Generate, scope: str, identity: str | None) -> str | None:
    """The digest of msg's salts under scope, `identity` being who sent it by proof
    (frontend/caller.py, None if anonymous); None for an unsalted request (it shares blocks
    with every other unsalted one)."""
    parts = [("salt", msg.cache_salt), *_implicit(msg, scope, identity)]
    given = [(name, value) for name, value in parts if value is not None]
    if not given:
        return None
    h = sha256()
    for name, value in given:   # length-prefixed: no two lists of parts encode alike
        raw = value.encode("utf-8", "surrogatepass")
        h.update(f"{name}:{len(raw)}:".encode() + raw)
    return h.hexdigest()[:DIGEST_CHARS]
