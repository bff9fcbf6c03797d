"""The command line of every process scripts/serve starts: each replica's core and worker
(their ipc:// endpoints, step log names), the frontend, the gateway, and the ranks a
machine runs for --nnodes."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from core.config import draft_of
from scripts import ROOT

SCHED_FLAGS = ("max_seqs", "max_batch_tokens", "max_waiting", "policy", "aging_steps",
               "max_model_len", "preempt_margin", "prefill", "max_chunk", "seed", "step_timeout")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def replica_names(dp: int) -> list[tuple[str, str]]:
    """Each replica's (core, worker) process names: plain with one replica, as before."""
    return [("core", "worker")] if dp == 1 else [(f"core{k}", f"worker{k}") for k in range(dp)]


def replica_log(log: str | None, k: int, dp: int, generation: int = 0) -> str | None:
    """P itself with one replica; P.r{k}.suffix with more; after the n-th restart of the
    replica, .{n} before the suffix as well (a step log is never reopened)."""
    if log is None or (dp == 1 and not generation):
        return log
    p = Path(log)
    tag = (f".r{k}" if dp > 1 else "") + (f".{generation}" if generation else "")
    return str(p.with_name(f"{p.stem}{tag}{p.suffix}"))


def replica_commands(a: argparse.Namespace, ipc: str, log: str | None,
                     k: int) -> tuple[list[str], list[str]]:
    ep = {e: f"ipc://{ipc}/{e}{k if a.dp > 1 else ''}"
          for e in ("fe_in", "fe_out", "wk_in", "wk_out")}
    py = [sys.executable, "-m"]
    sched = [x for n in SCHED_FLAGS if getattr(a, n) is not None
             for x in (_flag(n), str(getattr(a, n)))]
    to_frontend = (["--join", a.join, *curve_args(a)] if a.join else
                   ["--frontend-in", ep["fe_in"], "--frontend-out", ep["fe_out"]])
    core = py + ["core", *to_frontend, "--worker-in", ep["wk_in"],
                 "--worker-out", ep["wk_out"]] + sched
    if log:
        core += ["--log", replica_log(log, k, a.dp), "--log-errors", a.log_errors]
    if not a.prefix_cache:
        core.append("--no-prefix-cache")
    if not a.overlap:
        core.append("--no-overlap")
    if a.speculative:
        core += ["--speculative", a.speculative, "--num-draft", str(a.num_draft),
                 "--spec-max-batch", str(a.spec_max_batch)]
    worker = py + ["worker", "--to-core", ep["wk_in"], "--from-core", ep["wk_out"],
                   *worker_args(a)]
    return core, worker


def worker_args(a: argparse.Namespace) -> list[str]:
    """What every rank of a worker is started with, on any machine."""
    out = ["--model", a.model, "--device", a.device, "--dtype", a.dtype,
           "--block-size", str(a.block_size), "--threads", str(a.threads)]
    if a.tp != 1:
        out += ["--tp", str(a.tp)]
    if a.nnodes > 1:
        out += ["--dist-init", a.dist_init, "--nnodes", str(a.nnodes)]
    if a.batch_invariant is not None:
        out.append("--batch-invariant" if a.batch_invariant else "--no-batch-invariant")
    if a.dequantize:
        out.append("--dequantize")
    if draft := draft_of(getattr(a, "speculative", None)):
        out += ["--draft", draft]
    if a.quantize:
        out += ["--quantize", a.quantize]
    if a.prefill_bf16:
        out.append("--prefill-bf16")
    if a.int8_activations:
        out.append("--int8-activations")
    for n in ("num_blocks", "kv_memory", "max_model_len"):
        if getattr(a, n) is not None:
            out += [_flag(n), str(getattr(a, n))]
    return out


def rank_commands(a: argparse.Namespace) -> dict[str, list[str]]:
    """serve --node-rank K (K > 0): this machine's share of the --tp ranks, nothing else."""
    per_node = a.tp // a.nnodes
    return {f"rank{r}": [sys.executable, "-m", "worker", *worker_args(a), "--rank", str(r)]
            for r in range(a.node_rank * per_node, (a.node_rank + 1) * per_node)}


def commands(a: argparse.Namespace, ipc: str, log: str | None) -> dict[str, list[str]]:
    cmds: dict[str, list[str]] = {}
    frontend = [sys.executable, "-m", "frontend", "--address", a.address]
    for k, (core, worker) in enumerate(replica_names(a.dp)):
        cmds[core], cmds[worker] = replica_commands(a, ipc, log, k)
        if a.join:
            continue
        frontend += ["--core-in", cmds[core][cmds[core].index("--frontend-in") + 1],
                     "--core-out", cmds[core][cmds[core].index("--frontend-out") + 1]]
    frontend += ["--max-frame-bytes", str(a.max_frame_bytes),
                 "--drain-timeout", str(a.drain_timeout),
                 "--max-inflight-per-client", str(a.max_inflight_per_client),
                 "--max-compile-ms", str(a.max_compile_ms),
                 "--new-constraints-per-s", str(a.new_constraints_per_s),
                 # unset only before main() picks the default (gateway_keys.default_scope)
                 "--prefix-cache-scope", a.prefix_cache_scope or "global"]
    if a.allow_remote:
        frontend.append("--allow-remote")
    if a.insecure_remote:
        frontend.append("--insecure-remote")
    frontend += curve_args(a)
    if a.replica_address:
        frontend += ["--replica-address", a.replica_address]
    return cmds if a.join else {**cmds, "frontend": frontend}


def http_command(a: argparse.Namespace, frontend_addr: str, port: int,
                 log: str | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "frontend.http", "--frontend", frontend_addr,
           "--host", a.http_host, "--port", str(port),
           "--responses-store", responses_store(a, log),
           "--responses-max", str(a.responses_max),
           "--responses-max-age", str(a.responses_max_age),
           "--drain-timeout", str(a.drain_timeout),
           "--max-inflight-per-client", str(a.max_inflight_per_client),
           "--max-compile-ms", str(a.max_compile_ms)]
    # the API keys go in the gateway's environment (gateway_keys.py), never on argv
    cmd += ["--protect-metrics"] if a.protect_metrics else []
    if a.allow_special_tokens:
        cmd.append("--allow-special-tokens")
    if a.served_model_name:
        cmd += ["--served-model-name", a.served_model_name]
    if a.allowed_origins:
        cmd += ["--allowed-origins", a.allowed_origins]
    return cmd + (["--allow-remote"] if a.allow_remote else []) + curve_args(a)


def responses_store(a: argparse.Namespace, log: str | None) -> str:
    """The gateway's stored responses: --responses-store, else beside the step log
    (steps.db -> steps.responses.db), else (--no-log) in memory."""
    if a.responses_store:
        return a.responses_store
    if log is None:
        return ":memory:"
    stem, dot, suffix = log.rpartition(".")
    return f"{stem}.responses.{suffix}" if dot and "/" not in suffix else log + ".responses"


def curve_args(a: argparse.Namespace) -> list[str]:
    return ["--curve", a.curve] if a.curve else []


def tcp_address(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def default_log() -> str:
    runs = ROOT / "runs"
    runs.mkdir(exist_ok=True)
    return str(runs / time.strftime(f"%Y%m%d-%H%M%S-{os.getpid()}.db"))
