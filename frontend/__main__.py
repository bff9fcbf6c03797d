"""`python -m frontend`: run the frontend process (see frontend/process.py).

Prints `READY <address>` on stdout once the core is ready and the tokenizer loaded.
SIGTERM/SIGINT drain: new requests get 503, in-flight ones finish or are aborted after
--drain-timeout seconds, then the process exits 0.
"""
from __future__ import annotations

import argparse
import logging
import signal
import sys

import zmq

from core.ipc.channel import is_loopback
from core.ipc.curve import CurveKeyError, bind_problem
from core.ipc.lifeline import die_with_parent, exit_now
from frontend.caller import group_secret
from core.ipc.protocol import DEFAULT_ADDRESS, DEFAULT_MAX_FRAME_BYTES
from frontend.cache_salt import SCOPES
from frontend.compile_check import DEFAULT_MAX_COMPILE_MS
from frontend.constraint_budget import DEFAULT_NEW_CONSTRAINTS_PER_S
from frontend.process import Frontend, FrontendConfig
from frontend.torchless import forbid_torch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m frontend", description=__doc__.split("\n")[0])
    p.add_argument("--core-in", required=True, action="append",
                   help="endpoint the core binds a PULL on (requests go there); once per"
                        " engine replica, in the order of --core-out")
    p.add_argument("--core-out", required=True, action="append",
                   help="endpoint the core binds a PUSH on (events come from there)")
    p.add_argument("--address", default=DEFAULT_ADDRESS,
                   help="where clients connect; tcp://127.0.0.1:0 picks a free port")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow binding a non-loopback address")
    p.add_argument("--curve", default=None, metavar="DIR",
                   help="CURVE on --address and --replica-address: only the keys listed in DIR"
                        " (scripts/serve keygen) may connect (docs/security.md)")
    p.add_argument("--insecure-remote", action="store_true",
                   help="with --allow-remote and no --curve: bind a non-loopback address anyway")
    p.add_argument("--replica-address", default=None,
                   help="accept engine replicas that join from elsewhere (serve --join) here")
    p.add_argument("--max-frame-bytes", type=int, default=DEFAULT_MAX_FRAME_BYTES)
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds in-flight requests get to finish after SIGTERM/SIGINT")
    p.add_argument("--max-inflight-per-client", type=int, default=1024,
                   help="requests one client may have unfinished at once (more get 429)")
    p.add_argument("--max-compile-ms", type=int, default=DEFAULT_MAX_COMPILE_MS,
                   help="a constraint whose compile takes longer is refused (400)")
    p.add_argument("--new-constraints-per-s", type=float, default=DEFAULT_NEW_CONSTRAINTS_PER_S,
                   help="new (not yet compiled) constraints one client may send a second,"
                        " in bursts of 8 seconds' worth; more get 429 (docs/structured.md)")
    p.add_argument("--prefix-cache-scope", choices=SCOPES, default="global",
                   help="which requests share prefix cache blocks (docs/security.md)")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    forbid_torch()
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(),
                        format="frontend %(levelname)s %(message)s")
    for addr in filter(None, (args.address, args.replica_address)):
        if why := bind_problem(addr, allow_remote=args.allow_remote, curve=bool(args.curve),
                               insecure_remote=args.insecure_remote):
            print(f"frontend: {why}", file=sys.stderr)
            return 2
        if not is_loopback(addr) and not args.curve:
            logging.warning("binding %s: the engine is reachable from other hosts "
                            "(no authentication: --insecure-remote)", addr)
    if len(args.core_in) != len(args.core_out):
        print("frontend: give --core-in and --core-out once per replica each", file=sys.stderr)
        return 2
    if (args.max_frame_bytes < 1 or args.drain_timeout < 0 or args.max_inflight_per_client < 1
            or args.max_compile_ms < 1 or not args.new_constraints_per_s > 0):
        print("frontend: --max-frame-bytes, --max-inflight-per-client and --max-compile-ms"
              " must be >= 1, --new-constraints-per-s > 0 and --drain-timeout >= 0",
              file=sys.stderr)
        return 2
    die_with_parent()   # a frontend whose supervisor is gone must not hold its address
    try:
        fe = Frontend(FrontendConfig(list(zip(args.core_in, args.core_out)), args.address,
                                     args.max_frame_bytes, args.drain_timeout,
                                     args.max_inflight_per_client, args.replica_address,
                                     args.max_compile_ms, args.prefix_cache_scope,
                                     args.curve, args.new_constraints_per_s,
                                     group_secret()))
    except CurveKeyError as e:
        print(f"frontend: {e}", file=sys.stderr)
        return 2
    except zmq.ZMQError as e:
        print(f"frontend: cannot open {args.address} or {args.replica_address}: {e}",
              file=sys.stderr)
        return 1
    signal.set_wakeup_fd(fe.wakeup.write_fd(), warn_on_full_buffer=False)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: fe.request_stop())
    try:
        return fe.run()
    finally:
        signal.set_wakeup_fd(-1)
        fe.close()


if __name__ == "__main__":
    exit_now(main())
