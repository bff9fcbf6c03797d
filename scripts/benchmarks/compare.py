#!/usr/bin/env python
"""tl-engine against plain transformers on one machine, one model, one workload.

    scripts/bench compare --model smol --requests 256 --json compare.json
    scripts/bench compare --quick                     # 32 requests
    scripts/bench compare --peer llamacpp             # vs llama-server, mixed-64 at 1,8,64

The workload "mixed" (common.MIXED): random.Random(0), prompt length uniform 16-512,
output length uniform 16-256, random token ids away from EOS, greedy, EOS ignored, every
request at t=0. It runs through:
  1. tl-engine: the whole process group (scripts/serve, fp32) through AsyncClient;
  2. transformers `generate`, one request at a time, on a prefix of the workload
     (--sequential requests), its tokens/s extrapolated to the whole;
  3. transformers `generate` on left-padded static batches of --batch requests: each batch
     runs to its longest max_new_tokens, only each request's own tokens count;
  4. transformers' continuous batching (init_continuous_batching + add_request, page_size
     32, num_blocks sized to the workload, max_batch_tokens 512, sdpa), warmed up first.
The HF model is the same checkpoint directory with attn_implementation="sdpa", fp32,
under torch.inference_mode. Greedy agreement with the engine's tokens is reported per
baseline (left padding changes numerics slightly: reported, not required). A phase that
fails records its error in the JSON and the others go on.
"""
from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path


from scripts.benchmarks import common as bl

PHASES = ("engine", "hf_sequential", "hf_static", "hf_cb")
LABELS = {"engine": "tl-engine (process group)", "hf_sequential": "HF generate, one at a time",
          "hf_static": "HF generate, static batches", "hf_cb": "HF continuous batching"}
ENGINE_BLOCK = 16
CB_PAGE = 32
CB_MAX_BATCH_TOKENS = 512


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/bench compare", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smol")
    p.add_argument("--requests", type=int, default=None,
                   help="default 256; 64 with --peer (mixed-64)")
    p.add_argument("--quick", action="store_true", help="32 requests, 4 sequential")
    p.add_argument("--peer", choices=("llamacpp",),
                   help="instead of the transformers phases: llama.cpp's llama-server, side "
                        "by side at each --concurrency (built and cached on first use)")
    p.add_argument("--concurrency", default="1,8,64",
                   help="with --peer: comma-separated requests in flight (default 1,8,64)")
    p.add_argument("--agree-first", type=int, default=16,
                   help="with --peer: greedy agreement over each request's first N tokens")
    p.add_argument("--sequential", type=int, default=8,
                   help="requests of the workload's prefix run one at a time (default 8)")
    p.add_argument("--batch", type=int, default=32, help="static batch size")
    p.add_argument("--skip", default="",
                   help=f"comma-separated phases to skip: {','.join(PHASES)}")
    p.add_argument("--engine-args", default="",
                   help='extra scripts/serve flags, given with "=": --engine-args="--no-log"')
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    a = p.parse_args(argv)
    if a.quick:
        a.requests, a.sequential = 32, min(a.sequential, 4)
    if a.requests is None:
        a.requests = 64 if a.peer else 256
    try:
        a.concurrency = sorted({int(c) for c in a.concurrency.split(",") if c.strip()})
    except ValueError:
        p.error(f"--concurrency: want comma-separated integers, got {a.concurrency!r}")
    if not a.concurrency or a.concurrency[0] < 1:
        p.error("--concurrency: want at least one level, each >= 1")
    if a.requests < 1 or a.agree_first < 1:
        p.error("--requests and --agree-first must be >= 1")
    a.skip = {s for s in a.skip.split(",") if s}
    if a.skip - set(PHASES):
        p.error(f"unknown phase(s) in --skip: {', '.join(sorted(a.skip - set(PHASES)))}")
    return a


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _blocks(reqs, size: int, spare: int = 1) -> int:
    return sum(math.ceil((len(r.prompt) + r.max_tokens) / size) + spare for r in reqs)


def _result(outputs: list, wall: float, counted: int | None = None) -> dict:
    toks = sum(len(o) for o in outputs if o is not None)
    return {"outputs": outputs, "output_tokens": toks, "wall_s": wall,
            "tok_s": toks / wall if wall > 0 else float("nan"),
            "requests_run": counted if counted is not None else len(outputs)}


# ---------------------------------------------------------------- 1. tl-engine

def start_engine(a, reqs):
    """The process group (fp32, a KV pool the whole workload fits), warmed up; and its args."""
    from scripts.group.harness import start_group
    extra = a.engine_args.split()
    log = "--no-log" not in extra
    extra = [x for x in extra if x != "--no-log"]
    args = ["--model", a.model, "--dtype", "float32",
            "--num-blocks", str(_blocks(reqs, ENGINE_BLOCK)), *extra]
    g = start_group(Path(tempfile.mkdtemp(prefix="tl-bench-compare-")), args, log=log)
    try:
        warm = [bl.Req(r.prompt[:32], 4) for r in reqs[:2]]
        asyncio.run(bl.drive(g.address, warm, progress=False, ignore_eos=True))
    except BaseException:
        g.stop()
        raise
    return g, args


def run_engine(a, reqs) -> dict:
    g, args = start_engine(a, reqs)
    try:
        run = asyncio.run(bl.drive(g.address, reqs, progress=a.progress, label="tl-engine",
                                   timeout=1800, temperature=0.0, ignore_eos=True))
    finally:
        g.stop()
    m = bl.metrics(run)
    out = _result([t.tokens if t.error is None else None for t in run.traces], run.wall)
    out.update(serve_args=args, step_log=str(g.log) if g.log else None,
               errors=m["errors"], first_errors=m["first_errors"],
               preemptions=m["preemptions"], steps=m["steps"],
               ttft_ms=m["ttft_ms"], tpot_ms=m["tpot_ms"])
    return out


# ---------------------------------------------------------------- HF model

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
    out = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)
    return [row[width:].tolist() for row in out]


# ---------------------------------------------------------------- 2. sequential

def run_sequential(a, model, reqs) -> dict:
    import torch
    part = reqs[:max(1, a.sequential)]
    with torch.inference_mode():
        _generate(model, [reqs[0].prompt[:32]], 4)  # warm-up
        bar = bl.Progress(len(part), "HF sequential", a.progress)
        outputs, t0 = [], time.perf_counter()
        for r in part:
            outputs.append(_generate(model, [r.prompt], r.max_tokens)[0])
            bar.tick()
        wall = time.perf_counter() - t0
    out = _result(outputs, wall)
    total = sum(r.max_tokens for r in reqs)
    out["extrapolated_wall_s"] = wall * total / max(1, out["output_tokens"])
    out["note"] = (f"first {len(part)} of {len(reqs)} requests; tok/s over them, "
                   "wall extrapolated to the whole workload by output tokens")
    return out


# ---------------------------------------------------------------- 3. static batches

def run_static(a, model, reqs) -> dict:
    import torch
    batches = [reqs[i:i + a.batch] for i in range(0, len(reqs), a.batch)]
    with torch.inference_mode():
        _generate(model, [r.prompt[:32] for r in reqs[:2]], 4)  # warm-up
        bar = bl.Progress(len(batches), f"HF static x{a.batch}", a.progress)
        outputs, generated, t0 = [], 0, time.perf_counter()
        for b in batches:
            longest = max(r.max_tokens for r in b)
            got = _generate(model, [r.prompt for r in b], longest)
            outputs += [g[:r.max_tokens] for g, r in zip(got, b)]
            generated += longest * len(b)
            bar.tick()
        wall = time.perf_counter() - t0
    out = _result(outputs, wall)
    out.update(batch_size=a.batch, batches=len(batches), generated_tokens=generated,
               note="left-padded; each batch runs to its longest request; "
                    "only each request's own max_tokens count")
    return out


# ---------------------------------------------------------------- 4. transformers CB

def _cb_manager(model, reqs):
    from transformers import ContinuousBatchingConfig
    gen, _ = _greedy_config(model, max(r.max_tokens for r in reqs))
    gen.eos_token_id = -1  # CB: -1 disables EOS
    cbc = ContinuousBatchingConfig(page_size=CB_PAGE, num_blocks=_blocks(reqs, CB_PAGE),
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


def run_cb(a, model, reqs) -> dict:
    import torch
    with torch.inference_mode():
        mgr = _cb_manager(model, reqs)
        t_setup = time.perf_counter()
        mgr.warmup()
        mgr.start()
        try:
            warm = [bl.Req(r.prompt[:32], 4) for r in reqs[:2]]
            _cb_round(mgr, warm, "warm", bl.Progress(0, enabled=False))
            setup = time.perf_counter() - t_setup
            outputs, wall = _cb_round(mgr, reqs, "r", bl.Progress(len(reqs), "HF CB", a.progress))
        finally:
            mgr.stop(block=True, timeout=30)
            model.destroy_cached_continuous_batching_manager()
    out = _result(outputs, wall)
    cfg = mgr.continuous_batching_config
    out.update(setup_s=setup, config={"page_size": cfg.page_size, "num_blocks": cfg.num_blocks,
                                      "max_batch_tokens": cfg.max_batch_tokens,
                                      "attn": model.config._attn_implementation})
    return out


# ---------------------------------------------------------------- agreement, report

def agreement(engine: list, other: list) -> dict:
    """Fraction of requests (that both ran) with identical tokens, and the mean fraction
    of each request's tokens before the first difference."""
    pairs = [(e, o) for e, o in zip(engine, other) if e is not None and o is not None]
    if not pairs:
        return {"compared": 0, "equal_frac": None, "prefix_frac": None}
    def prefix(e, o):
        n = next((i for i, (x, y) in enumerate(zip(e, o)) if x != y), min(len(e), len(o)))
        return n / max(len(e), len(o), 1)
    return {"compared": len(pairs), "equal_frac": sum(e == o for e, o in pairs) / len(pairs),
            "prefix_frac": sum(prefix(e, o) for e, o in pairs) / len(pairs)}


def phase(name: str, fn, *args) -> dict:
    _say(f"== {LABELS[name]}")
    t0 = time.perf_counter()
    try:
        out = fn(*args)
    except Exception as e:  # report and go on with the next phase
        traceback.print_exc()
        out = {"error": f"{type(e).__name__}: {e}", "outputs": None}
    out["phase_s"] = time.perf_counter() - t0
    return out


def run_all(a, reqs, path: str) -> dict:
    res = {}
    if "engine" not in a.skip:
        res["engine"] = phase("engine", run_engine, a, reqs)
    hf = [n for n in PHASES[1:] if n not in a.skip]
    if hf:
        try:
            model = load_hf(path)
        except Exception as e:
            return {**res, **{n: {"error": f"loading the HF model: {e}", "outputs": None}
                              for n in hf}}
        fns = {"hf_sequential": run_sequential, "hf_static": run_static, "hf_cb": run_cb}
        for n in hf:
            res[n] = phase(n, fns[n], a, model, reqs)
    return res


def summary(a, reqs, tokens, res: dict) -> dict:
    tok_s = {n: res.get(n, {}).get("tok_s") for n in PHASES}
    doc = {f"{n}_tok_s": tok_s[n] for n in PHASES}
    eng = tok_s["engine"]
    doc["ratios"] = {f"engine_over_{n}": (eng / tok_s[n] if eng and tok_s[n] else None)
                     for n in PHASES[1:]}
    eng_out = res.get("engine", {}).get("outputs")
    doc["agreement"] = {n: agreement(eng_out, res[n]["outputs"])
                        for n in PHASES[1:] if eng_out and res.get(n, {}).get("outputs")}
    doc["phases"] = {n: {k: v for k, v in r.items() if k != "outputs"} for n, r in res.items()}
    doc["workload"] = {**bl.MIXED, **bl.describe(reqs), "token_range": list(tokens),
                       "sequential_prefix": min(a.sequential, len(reqs)),
                       "static_batch": a.batch}
    doc["model"] = a.model
    doc["dtype"] = "float32"
    doc["threads"] = _threads()
    doc["machine"] = bl.machine()
    return doc


def _threads() -> int | None:
    try:
        import torch
        return torch.get_num_threads()
    except ImportError:
        return None


def report(doc: dict) -> str:
    rows = []
    for n in PHASES:
        ph = doc["phases"].get(n)
        if ph is None:
            continue
        if "error" in ph:
            rows.append((LABELS[n], "error", "", "", ph["error"][:60]))
            continue
        ratio = doc["ratios"].get(f"engine_over_{n}")
        ag = doc["agreement"].get(n, {})
        eq = ag.get("equal_frac")
        rows.append((LABELS[n], f"{ph['tok_s']:.1f}", f"{ph['wall_s']:.1f}",
                     "1.00" if n == "engine" else (f"{ratio:.2f}" if ratio else "-"),
                     "-" if eq is None else f"{eq:.2f} of {ag['compared']}"))
    m, w = doc["machine"], doc["workload"]
    head = (f"  {doc['model']} fp32, workload mixed: {w['requests']} requests, "
            f"{w['max_output_tokens']} output tokens; {m['cores']} cores, "
            f"{doc['threads']} torch threads")
    return head + "\n" + bl.table(rows, ("system", "tok/s", "wall s", "engine / it",
                                         "greedy agreement"))


def main(argv=None) -> int:
    a = parse(argv)
    facts = bl.model_facts(a.model)
    tokens = bl.safe_token_range(facts["vocab_size"], facts["eos_ids"])
    reqs = bl.mixed_workload(a.requests, tokens)
    if a.peer:
        from scripts.benchmarks import _compare_peer
        return _compare_peer.main(a, reqs, tokens, facts)
    res = run_all(a, reqs, facts["path"])
    doc = summary(a, reqs, tokens, res)
    print(report(doc))
    if a.json:
        bl.write_json(a.json, doc)
    return 0 if all("error" not in r for r in res.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
