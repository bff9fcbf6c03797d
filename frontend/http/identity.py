"""Whose request this is: the key every per-user bound of the gateway counts under (the
in-flight cap in pool.py, the tokenizing queue in offload.py).

With API keys (auth.py), the key is the identity, by its short hash (api_keys.py): a user
keeps one count however many addresses they come from, and users behind one proxy stop
sharing theirs. Without keys, the HTTP peer's address.
"""
from __future__ import annotations

from aiohttp import web

# auth.py stores the admitted key's short hash in the request under this name
KEY_HASH = "tl_key_hash"


def key_hash(request: web.Request) -> str | None:
    """The short hash of the key the request was admitted with; None without keys."""
    return request.get(KEY_HASH)


def identity(request: web.Request) -> str:
    h = key_hash(request)
    return f"key {h}" if h is not None else (request.remote or "-")
