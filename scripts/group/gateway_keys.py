"""How serve's API keys (its "security" group, api_keys.add_key_args) reach the gateway.

serve reads every key itself (frontend/http/api_keys.py), so that an unreadable or empty
--api-key-file stops serve before any process starts, and hands them to the gateway in its
environment (TL_API_KEY, one per line): its command line, which `ps` shows to every user of
the machine, never holds a key. No other child sees the variable (procs.PRIVATE_ENV).

serve also makes one secret per group (TL_GROUP_SECRET) for the gateway and the frontend
alone: the gateway signs the key hash it forwards with each request, and the frontend takes
a key hash only with that signature (frontend/caller.py), so no other ZeroMQ client can name
a key. With keys the prefix cache's default scope is `key` (docs/security.md).
"""
from __future__ import annotations

import argparse
import os
import secrets

from frontend.caller import GROUP_SECRET_ENV
from frontend.http.api_keys import ENV, KeyProblem, collect


def gateway_env(a: argparse.Namespace) -> tuple[dict[str, str], str | None]:
    """The gateway's own variables (its keys), or the reason serve cannot start."""
    flagged = a.api_key or a.api_key_file or a.protect_metrics
    if a.http_port is None:
        return {}, ("--api-key, --api-key-file and --protect-metrics guard the HTTP gateway:"
                    " pass --http-port too" if flagged else None)
    try:
        keys = collect(a.api_key, os.environ.get(ENV), a.api_key_file, a.protect_metrics)
    except KeyProblem as e:
        return {}, str(e)
    return ({ENV: "\n".join(keys)} if keys else {}), None


def child_env(keys_env: dict[str, str]) -> dict[str, dict[str, str]]:
    """Each child's own variables (procs.Children's env): the keys for the gateway, and a
    fresh group secret for the gateway and the frontend."""
    secret = {GROUP_SECRET_ENV: secrets.token_hex(32)}
    return {"http": {**keys_env, **secret}, "frontend": secret}


def default_scope(a: argparse.Namespace, keys_env: dict[str, str]) -> str:
    """--prefix-cache-scope as given; unset: per key with API keys, else global."""
    return a.prefix_cache_scope or ("key" if keys_env.get(ENV) else "global")
