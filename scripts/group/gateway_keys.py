"""serve's API key flags (the "security" group) and how the keys reach the gateway.

serve reads every key itself (frontend/http/api_keys.py), so that an unreadable or empty
--api-key-file stops serve before any process starts, and hands them to the gateway in its
environment (TL_API_KEY, one per line): its command line, which `ps` shows to every user of
the machine, never holds a key. No other child sees the variable (procs.PRIVATE_ENV).
"""
from __future__ import annotations

import argparse
import os

from frontend.http.api_keys import ENV, KeyProblem, collect


def add_key_args(group) -> None:
    group.add_argument("--api-key", action="append", default=None, metavar="KEY",
                       help="with --http-port: a key clients must send as `Authorization:"
                            f" Bearer KEY` (repeatable; ${ENV} and --api-key-file add more;"
                            " a flag shows in `ps`, the other two do not)")
    group.add_argument("--api-key-file", default=None, metavar="PATH",
                       help="API keys, one per line (blank lines and # lines skipped)")
    group.add_argument("--protect-metrics", action="store_true",
                       help="/health and /metrics need an API key too")


def gateway_env(a: argparse.Namespace) -> tuple[dict[str, str], str | None]:
    """The gateway's own variables (its keys), or the reason serve cannot start."""
    flagged = a.api_key or a.api_key_file or a.protect_metrics
    if a.http_port is None:
        return {}, ("--api-key, --api-key-file and --protect-metrics guard the HTTP gateway:"
                    " pass --http-port too" if flagged else None)
    try:
        keys = collect(a.api_key, os.environ.get(ENV), a.api_key_file)
    except KeyProblem as e:
        return {}, str(e)
    if a.protect_metrics and not keys:
        return {}, "--protect-metrics needs an API key"
    return ({ENV: "\n".join(keys)} if keys else {}), None
