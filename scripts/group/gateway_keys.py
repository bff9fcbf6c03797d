"""How serve's API keys (its "security" group, api_keys.add_key_args) reach the gateway.

serve reads every key itself (frontend/http/api_keys.py), so that an unreadable or empty
--api-key-file stops serve before any process starts, and hands them to the gateway in its
environment (TL_API_KEY, one per line): its command line, which `ps` shows to every user of
the machine, never holds a key. No other child sees the variable (procs.PRIVATE_ENV).
"""
from __future__ import annotations

import argparse
import os

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
