"""python -m core: the core process (started by scripts/serve)."""
import argparse
import sys

import zmq

from core.config import add_sched_args, config_from_args, spec_problem
from core.frontend_link import keys
from core.ipc.curve import CurveKeyError
from core.ipc.lifeline import die_with_parent, sigterm_as_interrupt
from core.process import CoreLoop, Refused
from core.worker_link import WorkerLost

SWITCH_INTERVAL_S = 0.0005


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m core")
    for name in ("--worker-in", "--worker-out"):
        p.add_argument(name, required=True)
    p.add_argument("--frontend-in", help="where to bind the PULL the frontend sends to")
    p.add_argument("--frontend-out", help="where to bind the PUSH the frontend reads")
    p.add_argument("--join", help="instead: connect to this frontend's --replica-address")
    p.add_argument("--curve", default=None, metavar="DIR",
                   help="with --join: CURVE to the frontend, as the first key pair in"
                        " DIR/replicas (docs/security.md)")
    p.add_argument("--log", default=None)
    p.add_argument("--log-errors", choices=["stop", "serve"], default="stop",
                   help="when the log cannot be written: refuse new requests (stop) or"
                        " serve on and record the steps lost as a gap (serve)")
    add_sched_args(p)
    a = p.parse_args(argv)
    if (a.join is None) == (a.frontend_in is None or a.frontend_out is None):
        p.error("give --frontend-in and --frontend-out, or --join")
    if a.curve and not a.join:
        p.error("--curve goes with --join")
    try:
        keys(a.curve)
    except CurveKeyError as e:
        print(f"[core] {e}", file=sys.stderr, flush=True)
        return 2
    if a.speculative and (why := spec_problem(a)):
        p.error(why)
    cfg = config_from_args(a)
    die_with_parent()
    sigterm_as_interrupt()
    # The step loop lets the GIL go at every socket call; taking it back from the step log's
    # writer thread can wait a whole switch interval (5 ms by default), longer than a step.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    ctx = zmq.Context()
    loop = CoreLoop(cfg, ctx)
    try:
        loop.run()
    except WorkerLost as e:
        print(f"[core] worker lost: {e}", file=sys.stderr, flush=True)
        return 3
    except Refused as e:
        print(f"[core] the frontend refused this replica: {e}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 0
    finally:
        loop.close()
        ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
