"""`python -m frontend.http`: the OpenAI-compatible HTTP gateway, a client of the frontend.

aiohttp (not FastAPI + uvicorn): one dependency that streams, cancels a handler whose client
disconnected and drains in-flight requests on shutdown, on the asyncio loop AsyncClient uses.

Routes: POST /v1/completions, POST /v1/chat/completions, POST /v1/responses,
GET /v1/responses/{id}, GET /v1/models, GET /v1/models/{id}, POST /tokenize, POST /detokenize,
GET /tokenizer_info, GET /version, /health, /metrics (frontend/http/app.py). --allowed-origins
adds CORS (cors.py). A body
must arrive within --body-timeout seconds (408 and the connection closes otherwise). Prints `READY
http://HOST:PORT` on stdout once the engine answers stats(), the chat template is loaded
and the port is bound (--port 0 picks a free one).
SIGTERM/SIGINT: stop accepting connections, let in-flight requests finish (up to
--drain-timeout), then exit 0.
With API keys (--api-key, $TL_API_KEY, --api-key-file) every route but /health and /metrics
needs `Authorization: Bearer KEY` (auth.py; --protect-metrics closes those two as well).
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import socket
import sys
import time

from aiohttp import web

from core.ipc.channel import is_loopback_host
from core.ipc.curve import CurveKeyError, load_peer
from core.ipc.lifeline import die_with_parent
from frontend.caller import GROUP_SECRET_ENV, group_secret
from frontend.client import ClientError
from frontend.compile_check import DEFAULT_MAX_COMPILE_MS, CompileCheck
from frontend.http.pool import DEFAULT_CAP, ClientPool
from frontend.http.api_keys import ENV, KeyProblem, add_key_args, api_keys, collect
from frontend.http import log_filter
from frontend.http.app import BODY_TIMEOUT_S, Gateway, make_app
from frontend.http.auth import Guard
from frontend.http.chat import ChatTemplate
from frontend.http.origins import parse_origins
from frontend.http.malloc_trim import HeapTrim
from frontend.http.metrics import Metrics
from frontend.http.render_bound import TemplateRefused
from frontend.http.responses_store import ResponsesStore, add_store_args
from frontend.torchless import forbid_torch

log = logging.getLogger("http")

RETRY_S = 0.2
REAP_S = 10.0   # how often idle engine clients are closed and the heap trimmed


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m frontend.http",
                                description=__doc__.split("\n")[0])
    p.add_argument("--frontend", required=True, help="the frontend's address (tcp://...)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow binding a non-loopback host")
    p.add_argument("--curve", default=None, metavar="DIR",
                   help="CURVE to the frontend, as the operator (DIR/server.key_secret)")
    p.add_argument("--served-model-name", "--model-name", dest="model_name", default=None,
                   help="the model's name in replies and /v1/models, which a request's `model`"
                        " must then be (404 otherwise); default: serve's --model, any `model`"
                        " accepted")
    p.add_argument("--allowed-origins", default=None, metavar="ORIGINS",
                   help="comma-separated browser origins (scheme://host[:port], or *) that"
                        " get CORS headers and preflight answers (default: none)")
    p.add_argument("--request-timeout", type=float, default=600.0,
                   help="seconds a request may wait for the engine's next answer")
    p.add_argument("--body-timeout", type=float, default=BODY_TIMEOUT_S,
                   help="seconds a request's body may take to arrive (408 and close after)")
    p.add_argument("--max-inflight-per-client", type=int, default=DEFAULT_CAP,
                   help="engine requests one user (identity.py) may have unfinished at once "
                        "(more get 429); at most the frontend's own cap")
    p.add_argument("--max-compile-ms", type=int, default=DEFAULT_MAX_COMPILE_MS,
                   help="a tool's schema whose compile takes longer is refused (400)")
    p.add_argument("--allow-special-tokens", action="store_true",
                   help="a chat message's text that spells a special token of the model is "
                        "that control token (default: read as text; docs/security.md)")
    add_store_args(p, "tl-responses.db", "made on first use; :memory: keeps them in memory")
    p.add_argument("--startup-timeout", type=float, default=120.0)
    p.add_argument("--drain-timeout", type=float, default=30.0)
    p.add_argument("--log-level", default="WARNING")
    add_key_args(p.add_argument_group("security"))
    return p.parse_args(argv)


def guard_of(args: argparse.Namespace) -> Guard | None:
    """The keys the routes need, or None without any; raises KeyProblem."""
    keys = collect(args.api_key, os.environ.get(ENV), args.api_key_file, args.protect_metrics)
    return Guard(api_keys(keys), args.protect_metrics) if keys else None


def operator_keys(curve: str | None) -> dict:
    """The gateway runs beside the frontend: with CURVE it presents the server's own key
    pair, the operator's, which stats() for /health and /metrics needs."""
    if curve is None:
        return {}
    server, pair = load_peer(curve, None)
    return {"server_key": server, "client_key": (pair.public, pair.secret)}


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def wait_for_engine(client: ClientPool, timeout: float) -> dict:
    """The first stats() answer; the frontend says 503 until its core is ready."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            async with asyncio.timeout(max(0.1, deadline - time.monotonic())):
                return await client.stats()
        except (TimeoutError, ClientError) as e:
            if time.monotonic() >= deadline:
                raise ClientError(503, f"the engine at {client.address} is not ready: {e}")
        await asyncio.sleep(RETRY_S)


async def serve(args: argparse.Namespace, sock: socket.socket, guard: Guard | None) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    secret = group_secret()
    if guard is not None and secret is None:
        log.warning("%s is not set: the frontend cannot tell API keys apart (their requests "
                    "are anonymous to it; scripts/serve sets it)", GROUP_SECRET_ENV)
    client = ClientPool(args.frontend, args.request_timeout, args.max_inflight_per_client,
                        operator_keys(args.curve), secret)
    try:
        stats = await wait_for_engine(client, args.startup_timeout)
        chat = await loop.run_in_executor(None, ChatTemplate.load, stats["tokenizer"],
                                          args.allow_special_tokens)
        if chat.builtin:
            log.warning("the tokenizer has no chat template: using a built-in ChatML one")
        gw = Gateway(client, args.model_name or stats["model"], stats["max_model_len"], chat,
                     Metrics(), int(time.time()), args.body_timeout,
                     CompileCheck(args.max_compile_ms),
                     ResponsesStore(args.responses_store, args.responses_max,
                                    args.responses_max_age),
                     strict_model=args.model_name is not None,
                     hidden_size=int(stats.get("hidden_size") or 0))
        app = make_app(gw, guard, parse_origins(args.allowed_origins))
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                               shutdown_timeout=args.drain_timeout)
        await runner.setup()
        try:
            await web.SockSite(runner, sock).start()
            gc.freeze()   # as the frontend does once ready (frontend/process.py _on_model)
            print(f"READY {url_of(sock)}", flush=True)
            stopped, trim = asyncio.ensure_future(stop.wait()), HeapTrim()
            while not stopped.done():
                await asyncio.wait([stopped], timeout=REAP_S)
                await client.reap()
                trim()
            log.info("draining")
        finally:
            await runner.cleanup()  # stops listening, then awaits in-flight handlers
            gw.responses.close()
        return 0
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    forbid_torch()
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(),
                        format="http %(levelname)s %(message)s")
    log_filter.install()
    if not is_loopback_host(args.host) and not args.allow_remote:
        print(f"http: {args.host} is not a loopback host; pass --allow-remote to bind it",
              file=sys.stderr)
        return 2
    if args.model_name is not None and not args.model_name.strip():
        print("http: --served-model-name must not be empty", file=sys.stderr)
        return 2
    if (args.body_timeout <= 0 or args.max_inflight_per_client < 1 or args.max_compile_ms < 1
            or args.responses_max < 1 or args.responses_max_age <= 0):
        print("http: --body-timeout, --max-inflight-per-client, --max-compile-ms,"
              " --responses-max and --responses-max-age must be > 0", file=sys.stderr)
        return 2
    try:
        parse_origins(args.allowed_origins)
        guard = guard_of(args)
    except (KeyProblem, ValueError) as e:
        print(f"http: {e}", file=sys.stderr)
        return 2
    # SIGKILL, not SIGTERM: a gateway whose loop is stuck never runs its SIGTERM handler
    # (issue 50: a template bomb left it orphaned at 95% CPU after serve was killed)
    die_with_parent()
    try:
        sock = bind(args.host, args.port)
    except OSError as e:
        print(f"http: cannot bind {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    try:
        return asyncio.run(serve(args, sock, guard))
    except ClientError as e:
        print(f"http: {e.message}", file=sys.stderr)
        return 1
    except (CurveKeyError, TemplateRefused) as e:
        print(f"http: {e}", file=sys.stderr)
        return 2
    finally:
        sock.close()


if __name__ == "__main__":
    sys.exit(main())
