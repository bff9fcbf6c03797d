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
worker are stopped. A child still running --drain-timeout + 10 s after its SIGTERM (5 s for
core and worker) gets SIGKILL, whatever it is doing; a second SIGINT/SIGTERM kills at once.
Every child dies with serve (PR_SET_PDEATHSIG SIGKILL, core/ipc/lifeline.py), so even a
serve killed with -9 leaves no orphan.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from urllib.parse import urlsplit

from core.ipc.channel import is_loopback
from core.ipc.curve import REPLICAS, CurveKeyError, bind_problem, load_peer, load_server
from core.ipc.lifeline import REJOIN
from core.config import spec_problem
from scripts.group.gateway_keys import child_env, default_scope, gateway_env
from scripts.group.commands import (commands, default_log, http_command, rank_commands,
                                    replica_log, replica_names, tcp_address)
from scripts.group.options import parse, parser  # noqa: F401  (scripts/serve's, read here too)
from scripts.group.procs import Children
from worker.load import model_problem
from worker.threads import LoadProbe, cores, wait_for_workers

FRONTEND_GRACE_S = 0.5  # after the core's death, time for the frontend to answer 503s
                        # (it checks the core's pid every 0.25 s)


def main(argv=None) -> int:
    probe = LoadProbe()   # first: its window is serve's own start (docs/design/processes.md)
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
    a.prefix_cache_scope = default_scope(a, keys_env)
    stop = {"sig": None, "hurry": False}

    def on_signal(sig, frame):   # the second one kills what the first is still waiting for
        stop.update(hurry=stop["sig"] is not None, sig=sig)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    wait = wait_for_workers(a.threads, cores(), probe.others)
    if a.node_rank > 0:
        return run_ranks(a, stop, wait)
    log = None if a.no_log else (a.log or default_log())
    ipc = tempfile.mkdtemp(prefix="tl-")
    replica_cores = tuple(core for core, _ in replica_names(a.dp))
    cmds = commands(a, ipc, log)
    group = Children(cmds, piped=replica_cores if a.join else ("frontend", "http"),
                     env={**child_env(keys_env), **workers_env(cmds, wait)})
    group.hurried = lambda: stop["hurry"]
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


def workers_env(cmds: dict[str, list[str]], wait: dict[str, str]) -> dict[str, dict]:
    """Each worker process's (replica or rank) wait policy, as procs.Children's env."""
    return {name: dict(wait) for name in cmds if name.startswith(("worker", "rank"))}


RESTARTABLE = ("worker", "frontend", "http")


def restartable(name: str, a) -> bool:
    """A core is restarted only where other replicas serve meanwhile."""
    return (name.rstrip("0123456789") in RESTARTABLE
            or ((a.dp > 1 or a.join) and name.startswith("core")))


def run_ranks(a, stop, wait: dict[str, str]) -> int:
    """serve --node-rank K: start this machine's ranks and keep them up. When one dies the
    group on node 0 is restarting (a rank's death fails rank 0's next collective, and rank
    0's death fails every rank's), so all of them start again and meet the new rank 0."""
    cmds = rank_commands(a)
    group = Children(cmds, piped=(), env=workers_env(cmds, wait))
    group.hurried = lambda: stop["hurry"]
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
        group.cmds["http"] = http_command(a, addr, a.http_port, log)
        group.spawn("http")
        http = group.wait_ready(a.startup_timeout, "http")
        if http is None:
            return report_death(group, "before ready")
        group.cmds["http"] = http_command(a, addr, urlsplit(http).port, log)
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
