"""python -m worker: the worker process (started by scripts/serve)."""
import argparse
import sys

import zmq

from core.ipc.lifeline import die_with_parent, exit_now, sigterm_as_interrupt
from worker.bf16 import dtype_name
from worker.quantized import quantized_flags_problem
from worker.threads import cores, described, set_wait_policy, threads_problem, use_threads


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m worker")
    p.add_argument("--to-core", help="the core's PULL endpoint for results (rank 0)")
    p.add_argument("--from-core", help="the core's PUSH endpoint for batches (rank 0)")
    p.add_argument("--model", default="tiny")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   type=dtype_name, help="bf16 is bfloat16 (worker/bf16.py)")
    p.add_argument("--num-blocks", type=int, default=None)
    p.add_argument("--kv-memory", type=int, default=None)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (worker/tp.py)")
    p.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=None,
                   help="a request's logits do not depend on its batch (worker/invariant.py);"
                        " default: on where the model allows it")
    p.add_argument("--quantize", choices=["q8_0", "q4_0"], default=None,
                   help="quantize a float checkpoint's linear layers at load (worker/quantized.py)")
    p.add_argument("--dequantize", action="store_true",
                   help="serve a quantized GGUF as float weights of --dtype")
    p.add_argument("--prefill-bf16", action="store_true",
                   help="quantized layers multiply calls of 16 rows or more in bfloat16"
                        " (worker/quantized.py)")
    p.add_argument("--int8-activations", action="store_true",
                   help="quantized layers round their input to int8 (worker/quantized.py)")
    p.add_argument("--draft", default=None, metavar="MODEL",
                   help="a draft model for speculative decoding (worker/draft.py), as --model"
                        " takes it; its vocabulary must be the model's")
    p.add_argument("--threads", type=int, default=None,
                   help="this process's CPU threads (worker/threads.py; default: the cores"
                        " shared among the ranks on this machine)")
    p.add_argument("--rank", type=int, default=0, help="this process's tensor-parallel rank")
    p.add_argument("--dist-init", default=None, metavar="tcp://HOST:PORT",
                   help="torch.distributed's rendezvous (rank 0 hosts it; default: a free"
                        " loopback port)")
    p.add_argument("--nnodes", type=int, default=1, help="machines the ranks are spread over")
    a = p.parse_args(argv)
    if why := _bad_ranks(a):
        p.error(why)
    if a.batch_invariant and a.tp != 1:
        p.error("--batch-invariant runs with --tp 1")
    if why := quantized_flags_problem(a):
        p.error(why)
    if why := threads_problem(a.threads, cores()):
        p.error(why)
    # before torch loads libgomp, which reads it once
    set_wait_policy(threads=a.threads or cores(), ncores=cores())
    die_with_parent()
    interrupts = sigterm_as_interrupt()
    from worker.settings import LOAD_ERRORS, draft_problem, problem, refuse  # torch loads after the lifeline
    if why := problem(a.model, tp=a.tp, dtype=a.dtype, block_size=a.block_size,
                      num_blocks=a.num_blocks, kv_memory=a.kv_memory,
                      max_model_len=a.max_model_len, quantize=a.quantize,
                      dequantize=a.dequantize, device=a.device):
        return refuse(why)
    if a.draft is not None and (why := draft_problem(a.draft, a.tp)):
        return refuse(why)
    if a.tp != 1:
        from worker import tp
        return tp.main(a, sys.argv[1:] if argv is None else list(argv))
    use_threads(a.threads or cores())
    from worker.load import make_runner
    from worker.process import serve
    from worker.registry_models import RegistryUnavailable
    try:
        runner = make_runner(a.model, device=a.device, dtype=a.dtype, num_blocks=a.num_blocks,
                             kv_memory=a.kv_memory, block_size=a.block_size,
                             max_model_len=a.max_model_len, batch_invariant=a.batch_invariant,
                             quantize=a.quantize, dequantize=a.dequantize, draft=a.draft,
                             prefill_bf16=a.prefill_bf16,
                             int8_activations=a.int8_activations)
    except (*LOAD_ERRORS, RegistryUnavailable) as e:   # settings or a model it cannot serve
        return refuse(str(e))
    runner.info.threads = described(a.threads or cores())
    ctx = zmq.Context()
    try:
        with interrupts.end_quietly():
            serve(runner, ctx, a.to_core, a.from_core)
    finally:
        ctx.term()
    return 0


def _bad_ranks(a) -> str | None:
    if a.tp < 1:
        return f"--tp must be at least 1, not {a.tp}"
    if a.nnodes < 1 or a.tp % a.nnodes:
        return f"--nnodes {a.nnodes} must divide --tp {a.tp}"
    if a.nnodes > 1 and not a.dist_init:
        return "--nnodes over 1 needs --dist-init tcp://HOST:PORT"
    if not 0 <= a.rank < a.tp:
        return f"--rank must be in 0..{a.tp - 1}"
    if a.rank == 0 and not (a.to_core and a.from_core):
        return "rank 0 needs --to-core and --from-core"
    return None


if __name__ == "__main__":
    exit_now(main())
