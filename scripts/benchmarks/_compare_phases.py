"""The four systems of `scripts/bench compare` (without --peer), each runnable round by round:
`run(part, label)` runs one round's slice of the workload and returns its Round; `result()`
is the whole run's figures over the rounds it ran; `close()` frees what it holds.

The HF model is the same checkpoint directory with attn_implementation="sdpa", fp32, under
torch.inference_mode, loaded once and shared by the three transformers phases.
"""
from __future__ import annotations

import asyncio
import math
import os
import time
from dataclasses import dataclass, field

from scripts.benchmarks import _compare_shared as cs
from scripts.benchmarks import common as bl

CB_PAGE = 32
CB_MAX_BATCH_TOKENS = 512


@dataclass
class Round:
    outputs: list                # one per request of the slice; None where it was not run
    wall: float


@dataclass
class Rounds:
    """A phase's rounds so far, as one run."""
    outputs: list = field(default_factory=list)
    walls: list = field(default_factory=list)

    def add(self, r: Round) -> Round:
        self.outputs += r.outputs
        self.walls.append(r.wall)
        return r

    def figures(self) -> dict:
        ran = [o for o in self.outputs if o is not None]
        toks, wall = sum(len(o) for o in ran), sum(self.walls)
        return {"outputs": self.outputs, "output_tokens": toks, "wall_s": wall,
                "round_wall_s": self.walls, "tok_s": toks / wall if wall > 0 else float("nan"),
                "requests_run": len(ran)}


class Engine:
    """The process group, started once (a KV pool the whole workload fits), every round's
    slice sent at once."""

    def __init__(self, a, reqs):
        self.a, self.done, self.runs = a, Rounds(), []
        self.group, self.args = cs.start_engine(a, reqs)

    def run(self, part, label: str) -> Round:
        run = asyncio.run(bl.drive(self.group.address, part, progress=self.a.progress,
                                   label=label, timeout=1800, temperature=0.0,
                                   ignore_eos=True))
        self.runs.append(run)
        return self.done.add(Round([t.tokens if t.error is None else None for t in run.traces],
                                   run.wall))

    def result(self) -> dict:
        out = self.done.figures()
        if self.runs:
            run = cs.merged(self.runs)
            m = bl.metrics(run)
            out.update({k: m[k] for k in ("errors", "first_errors", "preemptions", "steps",
                                          "ttft_ms", "tpot_ms")}, **cs.prefix_hits(run))
        return {**out, "serve_args": self.args,
                "step_log": str(self.group.log) if self.group.log else None}

    def close(self) -> None:
        self.group.stop()


def load_hf(path: str):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                 attn_implementation="sdpa",
                                                 local_files_only=True).eval()
    # EOS is ignored: with it unset, generate always runs to max_new_tokens.
    model.generation_config.eos_token_id = None
    return model


def _greedy_config(model, max_new_tokens: int):
    from transformers import GenerationConfig
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    return GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens,
                            eos_token_id=None, pad_token_id=pad), pad


def _generate(model, rows: list[list[int]], max_new: int) -> list[list[int]]:
    """Left-padded greedy generate; the new tokens of each row."""
    import torch
    cfg, pad = _greedy_config(model, max_new)
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)
    return [row[width:].tolist() for row in out]


class Sequential:
    """transformers `generate`, one request at a time, on the first `per_round` requests of
    each round's slice; tok/s over them, the wall extrapolated to the whole workload."""

    def __init__(self, a, model, reqs, n_rounds: int):
        self.a, self.model, self.reqs, self.done = a, model, reqs, Rounds()
        self.per_round = max(1, math.ceil(a.sequential / n_rounds))
        _generate(model, [r.prompt for r in cs.warmup(reqs)], 4)

    def run(self, part, label: str) -> Round:
        head = part[:self.per_round]
        bar = bl.Progress(len(head), label, self.a.progress)
        outputs, t0 = [], time.perf_counter()
        for r in head:
            outputs.append(_generate(self.model, [r.prompt], r.max_tokens)[0])
            bar.tick()
        wall = time.perf_counter() - t0
        return self.done.add(Round(outputs + [None] * (len(part) - len(head)), wall))

    def result(self) -> dict:
        out = self.done.figures()
        total = sum(r.max_tokens for r in self.reqs)
        out["extrapolated_wall_s"] = out["wall_s"] * total / max(1, out["output_tokens"])
        out["note"] = (f"the first {self.per_round} requests of each round's slice "
                       f"({out['requests_run']} of {len(self.reqs)}); tok/s over them, wall "
                       "extrapolated to the whole workload by output tokens")
        return out

    def close(self) -> None:
        pass


class Static:
    """transformers `generate` on left-padded static batches of a.batch within each slice:
    each batch runs to its longest request; only each request's own tokens count."""

    def __init__(self, a, model, reqs):
        self.a, self.model, self.done, self.generated, self.batches = a, model, Rounds(), 0, 0
        _generate(model, [r.prompt for r in cs.warmup(reqs)], 4)

    def run(self, part, label: str) -> Round:
        batches = [part[i:i + self.a.batch] for i in range(0, len(part), self.a.batch)]
        bar = bl.Progress(len(batches), label, self.a.progress)
        outputs, t0 = [], time.perf_counter()
        for b in batches:
            longest = max(r.max_tokens for r in b)
            got = _generate(self.model, [r.prompt for r in b], longest)
            outputs += [g[:r.max_tokens] for g, r in zip(got, b)]
            self.generated += longest * len(b)
            bar.tick()
        self.batches += len(batches)
        return self.done.add(Round(outputs, time.perf_counter() - t0))

    def result(self) -> dict:
        return {**self.done.figures(), "batch_size": self.a.batch, "batches": self.batches,
                "generated_tokens": self.generated,
                "note": "left-padded batches within each round's slice; each batch runs to "
                        "its longest request; only each request's own max_tokens count"}

    def close(self) -> None:
        pass


class ContinuousBatching:
    """transformers' continuous batching (init_continuous_batching + add_request, sdpa),
    a manager per round, set up and warmed before the round's clock starts and stopped
    after it, so that nothing of it runs during the other systems' turns."""

    def __init__(self, a, model, reqs):
        self.a, self.model, self.reqs, self.done = a, model, reqs, Rounds()
        self.setup, self.config = 0.0, None

    def run(self, part, label: str) -> Round:
        import torch
        with torch.inference_mode():
            t0 = time.perf_counter()
            mgr = _cb_manager(self.model, self.reqs)
            try:
                mgr.warmup()
                mgr.start()
                _cb_round(mgr, cs.warmup(self.reqs), "warm", bl.Progress(0, enabled=False))
                self.setup += time.perf_counter() - t0
                outputs, wall = _cb_round(mgr, part, f"r{len(self.done.outputs)}-",
                                          bl.Progress(len(part), label, self.a.progress))
            finally:
                mgr.stop(block=True, timeout=30)
                self.model.destroy_cached_continuous_batching_manager()
        cfg = mgr.continuous_batching_config
        self.config = {"page_size": cfg.page_size, "num_blocks": cfg.num_blocks,
                       "max_batch_tokens": cfg.max_batch_tokens,
                       "attn": self.model.config._attn_implementation}
        return self.done.add(Round(outputs, wall))

    def result(self) -> dict:
        return {**self.done.figures(), "setup_s": self.setup, "config": self.config}

    def close(self) -> None:
        pass


def _cb_manager(model, reqs):
    from transformers import ContinuousBatchingConfig
    gen, _ = _greedy_config(model, max(r.max_tokens for r in reqs))
    gen.eos_token_id = -1  # CB: -1 disables EOS
    cbc = ContinuousBatchingConfig(page_size=CB_PAGE, num_blocks=cs.blocks(reqs, CB_PAGE),
                                   max_batch_tokens=CB_MAX_BATCH_TOKENS,
                                   auto_switch_to_flash=False)
    return model.init_continuous_batching(generation_config=gen, continuous_batching_config=cbc)


def _cb_collect(mgr, ids: list[str], bar: bl.Progress, timeout: float) -> dict:
    done, deadline = {}, time.monotonic() + timeout
    while len(done) < len(ids):
        res = mgr.get_result(timeout=1)
        if res is not None and res.is_finished():
            if res.error is not None:
                raise RuntimeError(f"request {res.request_id} failed: {res.error}")
            done[res.request_id] = list(res.generated_tokens)
            bar.tick()
        elif res is None and not mgr.is_running():
            raise RuntimeError("transformers' CB generation thread stopped unexpectedly")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(done)}/{len(ids)} CB requests done after {timeout}s")
    return done


def _cb_round(mgr, reqs, tag: str, bar: bl.Progress) -> tuple[list, float]:
    t0 = time.perf_counter()
    ids = [mgr.add_request(r.prompt, request_id=f"{tag}{i}", max_new_tokens=r.max_tokens,
                           eos_token_id=-1) for i, r in enumerate(reqs)]
    done = _cb_collect(mgr, ids, bar, timeout=3600)
    return [done[i] for i in ids], time.perf_counter() - t0
