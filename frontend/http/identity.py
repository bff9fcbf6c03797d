"""Whose request this is: the key every per-user bound of the gateway counts under (the
in-flight cap in pool.py, the tokenizing queue in offload.py).

Today the HTTP peer's address. Once the gateway checks API keys, the key is the identity
and this is the one function to change: a user then keeps one count however many
addresses they come from, and users behind one proxy stop sharing theirs.
"""
from __future__ import annotations

from aiohttp import web


def identity(request: web.Request) -> str:
    return request.remote or "-"
