"""The core process's configuration: a frozen dataclass with its CLI and derived parts."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from core.bounds import INT32_MAX, MAX_NUM_DRAFT
from core.engine import Engine
from core.ipc.protocol import ModelInfo
from core.logrecords import FORMAT
from core.sched import (Chunked, FreeListBlocks, PrefixCacheBlocks, SchedPolicy, Scheduler,
                        SchedulerConfig, WholePrompt)

# The KV layout an engine runs with (its worker's pool, or a step log's meta at replay): a
# slot (block * block_size + offset) and a position (< max_model_len) travel as int32
# (core/batch.py), and the scheduler keeps every free block id as a Python int (~36 bytes
# each), so the pool is bounded in blocks too: 2**24 is ~0.6 GB of core memory.
MAX_NUM_BLOCKS = 1 << 24
MAX_SLOTS = INT32_MAX + 1


def layout_problem(num_blocks: int, block_size: int, max_model_len: int) -> str | None:
    """Why a KV pool of num_blocks blocks of block_size tokens serving max_model_len
    positions is not one the engine runs, or None."""
    if not 1 <= num_blocks <= MAX_NUM_BLOCKS:
        return f"num_blocks must be in [1, {MAX_NUM_BLOCKS}], got {num_blocks}"
    if not 1 <= block_size <= MAX_SLOTS // num_blocks:
        return (f"block_size must be in [1, {MAX_SLOTS // num_blocks}] (num_blocks x"
                f" block_size at most 2**31), got {block_size}")
    if not 1 <= max_model_len <= INT32_MAX:
        return f"max_model_len must be in [1, 2**31), got {max_model_len}"
    return None


@dataclass(frozen=True)
class CoreConfig:
    frontend_in: str | None
    frontend_out: str | None
    worker_in: str
    worker_out: str
    max_seqs: int = 256
    max_batch_tokens: int = 2048
    max_waiting: int = 4096
    policy: str = "priority"
    aging_steps: int | None = 32
    max_model_len: int | None = None
    preempt_margin: int | None = None
    prefill: str = "chunked"
    max_chunk: int = 512
    seed: int = 0
    step_timeout: float = 60.0
    log: str | None = None
    log_errors: str = "stop"   # "stop" | "serve": see core/steplog.py
    prefix_cache: bool = True
    join: str | None = None    # a frontend's --replica-address (core/frontend_link.py)
    curve: str | None = None   # with join: the key directory (core/ipc/curve.py)
    overlap: bool = True      # plan step N+1 while the worker runs N (core/overlap.py)
    speculative: str | None = None   # "ngram" | "draft:MODEL": speculative decoding
    # (docs/design/scheduler.md, "Speculative decoding")
    num_draft: int = 4               # the most drafts per request and step
    spec_max_batch: int = 8          # a step speculates with at most this many running

    def num_drafts(self, info: ModelInfo) -> int:
        """The drafts a request may get (0: no speculation): exact only where a row's
        logits ignore the batch, so off the batch-invariant mode speculation is off; so is
        a draft model's where the worker has none."""
        return 0 if self.speculative is None or self.spec_off(info) else self.num_draft

    def spec_off(self, info: ModelInfo) -> str | None:
        """Why speculation asked for is off with this worker; None when it is on or was
        never asked for."""
        if self.speculative is None:
            return None
        if not info.batch_invariant:
            return ("it is exact only in the batch-invariant mode, which this worker does not"
                    " run (--batch-invariant)")
        if self.draft_model and not info.draft:
            return "the worker has no draft model (worker --draft)"
        return None

    @property
    def draft_model(self) -> bool:
        return (self.speculative or "").startswith("draft:")

    def sched_config(self, info: ModelInfo) -> SchedulerConfig:
        limit = min(info.max_model_len, self.max_model_len or info.max_model_len)
        return SchedulerConfig(max_seqs=self.max_seqs, max_batch_tokens=self.max_batch_tokens,
                               max_waiting=self.max_waiting, policy=SchedPolicy[self.policy.upper()],
                               aging_steps=self.aging_steps, max_model_len=limit,
                               preempt_margin=self.preempt_margin,
                               num_draft=self.num_drafts(info),
                               spec_max_batch=self.spec_max_batch,
                               draft_model=self.draft_model and bool(self.num_drafts(info)))

    def overlapped(self, info: ModelInfo) -> bool:
        """Speculation drafts from settled tokens only, so it runs without overlap."""
        return self.overlap and not self.num_drafts(info)

    def make_engine(self, info: ModelInfo, log=None) -> Engine:
        return build_engine(self.sched_config(info), self.prefill, self.max_chunk,
                            info.block_size, info.num_blocks, info.eos_ids, self.seed, log=log,
                            prefix_cache=self.prefix_cache, overlap=self.overlapped(info))

    def as_dict(self) -> dict:
        return asdict(self)


def add_sched_args(p, kv=None, faults=None) -> None:
    """The scheduling flags, shared by the core process and scripts/serve; `kv` and `faults`:
    the argument groups for the prefix cache's flag and the step timeout (default `p`)."""
    p.add_argument("--max-seqs", type=int, default=256, help="requests running at once")
    p.add_argument("--max-batch-tokens", type=int, default=2048, help="tokens in one step")
    p.add_argument("--max-waiting", type=int, default=4096,
                   help="requests waiting for admission; more get 429")
    p.add_argument("--policy", choices=["fcfs", "priority"], default="priority",
                   help="the order of admission and preemption")
    p.add_argument("--aging-steps", type=int, default=32,
                   help="steps per priority level of aging; 0 = strict priority")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="context limit (default: the model's)")
    p.add_argument("--preempt-margin", type=int, default=None,
                   help="priority levels by which a waiting request preempts a running one"
                        " (default: never)")
    p.add_argument("--prefill", choices=["chunked", "whole"], default="chunked",
                   help="a prompt may span steps (chunked) or runs in one")
    p.add_argument("--max-chunk", type=int, default=512, help="prompt tokens of one chunk")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds sampled requests that bring none (with their seq_id)")
    (faults or p).add_argument("--step-timeout", type=float, default=60.0,
                               help="seconds a step may go silent (no result, no StepAlive) "
                                    "before its worker is replaced")
    (kv or p).add_argument("--no-prefix-cache", dest="prefix_cache", action="store_false",
                           help="turn the prefix cache off (on by default)")
    p.add_argument("--no-overlap", dest="overlap", action="store_false",
                   help="plan each step only after the last one's tokens came back"
                        " (by default step N+1 is planned while the worker runs N)")
    p.add_argument("--speculative", type=speculative_kind, default=None,
                   help="speculative decoding: 'ngram' (prompt lookup) or 'draft:MODEL'"
                        " (a draft model with the same vocabulary, as --model takes it); needs"
                        " the batch-invariant mode and turns overlap off (default: off)")
    p.add_argument("--num-draft", type=int, default=4,
                   help=f"with --speculative, the most drafts per request and step"
                        f" (1..{MAX_NUM_DRAFT})")
    p.add_argument("--spec-max-batch", type=int, default=8,
                   help="with --speculative, a step speculates only while at most this"
                        " many requests run")


def speculative_kind(v: str) -> str:
    """--speculative's value: 'ngram' or 'draft:MODEL'."""
    import argparse
    if v == "ngram" or (v.startswith("draft:") and len(v) > len("draft:")):
        return v
    raise argparse.ArgumentTypeError(f"expected 'ngram' or 'draft:MODEL', got {v!r}")


def draft_of(speculative: str | None) -> str | None:
    """The draft model --speculative names, or None."""
    if speculative and speculative.startswith("draft:"):
        return speculative[len("draft:"):]
    return None


def spec_problem(a) -> str | None:
    """Why --num-draft / --spec-max-batch cannot be served, or None."""
    if not 1 <= a.num_draft <= MAX_NUM_DRAFT:
        return f"--num-draft must be in [1, {MAX_NUM_DRAFT}], got {a.num_draft}"
    if a.spec_max_batch < 1:
        return f"--spec-max-batch must be at least 1, got {a.spec_max_batch}"
    return None


def config_from_args(a) -> CoreConfig:
    return CoreConfig(frontend_in=a.frontend_in, frontend_out=a.frontend_out,
                      worker_in=a.worker_in, worker_out=a.worker_out, max_seqs=a.max_seqs,
                      max_batch_tokens=a.max_batch_tokens, max_waiting=a.max_waiting,
                      policy=a.policy, aging_steps=a.aging_steps or None,
                      max_model_len=a.max_model_len, preempt_margin=a.preempt_margin,
                      prefill=a.prefill, max_chunk=a.max_chunk, seed=a.seed,
                      step_timeout=a.step_timeout, log=a.log, log_errors=a.log_errors,
                      prefix_cache=a.prefix_cache, overlap=a.overlap,
                      join=getattr(a, "join", None), curve=getattr(a, "curve", None),
                      speculative=a.speculative, num_draft=a.num_draft,
                      spec_max_batch=a.spec_max_batch)


def package_versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version
    out = {}
    for pkg in ("tl-engine", "torch", "transformers"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def _git_commit() -> str | None:
    import subprocess
    from pathlib import Path
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def log_meta(cfg: CoreConfig, info: ModelInfo) -> dict:
    """What a step log's `meta` table holds: enough to rebuild the engine (engine_from_meta)."""
    import time
    sc = asdict(cfg.sched_config(info))
    sc["policy"] = sc["policy"].name
    return {"versions": package_versions(), "git_commit": _git_commit(), "model": info.model,
            "dtype": info.dtype, "block_size": info.block_size, "num_blocks": info.num_blocks,
            "model_info": asdict(info), "sched_config": sc,
            "prefill": {"kind": cfg.prefill, "max_chunk": cfg.max_chunk}, "seed": cfg.seed,
            "prefix_cache": cfg.prefix_cache, "overlap": cfg.overlapped(info),
            "start_time": time.time()}


def engine_from_meta(meta: dict, runner=None, log=None) -> Engine:
    """A fresh engine configured exactly as the logged run's (for replay)."""
    sc = dict(meta["sched_config"])
    sc["policy"] = SchedPolicy[sc["policy"]]
    pf = meta["prefill"]
    return build_engine(SchedulerConfig(**sc), pf["kind"], pf["max_chunk"], meta["block_size"],
                        meta["num_blocks"], meta["model_info"]["eos_ids"], meta["seed"],
                        runner, log, prefix_cache=meta.get("prefix_cache", False),
                        overlap=meta.get("overlap", False),
                        log_format=meta.get("format", FORMAT))


def build_engine(sched_config: SchedulerConfig, prefill: str, max_chunk: int, block_size: int,
                 num_blocks: int, eos_ids, seed: int, runner=None, log=None,
                 prefix_cache: bool = False, overlap: bool = False,
                 log_format: int = FORMAT) -> Engine:
    """The engine of CoreConfig.make_engine and engine_from_meta: `prefill` is "chunked"
    (chunks of at most max_chunk tokens) or "whole"; block ids 0..num_blocks-1. Logs made
    before the prefix cache existed have no `prefix_cache` key: they ran without it, and
    logs made before overlapped scheduling have no `overlap` key. `log_format`: the state
    hash is that step log format's (replay of an older log computes the older hash)."""
    policy = Chunked(max_chunk) if prefill == "chunked" else WholePrompt()
    pool = (PrefixCacheBlocks if prefix_cache else FreeListBlocks)(block_size, range(num_blocks))
    sched = Scheduler(sched_config, pool, policy)
    if sched_config.num_draft and overlap:
        raise ValueError("speculative decoding runs without overlap"
                         " (docs/design/scheduler.md#speculative-decoding)")
    from core.overlap import OverlapEngine   # it subclasses Engine, which this module imports
    return (OverlapEngine if overlap else Engine)(sched, runner, eos_ids=eos_ids, seed=seed,
                                                   log=log, log_format=log_format)
