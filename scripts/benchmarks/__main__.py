"""`scripts/bench` without a known NAME: the usage line and each benchmark in one line."""
import ast
import sys
from pathlib import Path

HERE = Path(__file__).parent
# One line each; a benchmark missing here shows its docstring's first line.
SUMMARY = {
    "bandwidth": "memory bandwidth: a STREAM-like triad and a read-only sum, 1 and more threads",
    "chaos": "the soak's workload over time, some over HTTP, while processes are killed",
    "compare": "tl-engine against plain transformers (and llama.cpp): one model, one workload",
    "curve": "what CurveZMQ costs per request at 64 in flight, with and without --curve",
    "forward": "worker-only decode speed: the paged runner against stock transformers",
    "invariant": "the cost of --batch-invariant on the mixed workload",
    "log": "what the step log costs the step loop, replay speed, bytes per token",
    "memory": "the worker's resident memory: a quantized GGUF on its blocks against float32",
    "overhead": "where a step's time goes outside the model",
    "prefix": "the prefix cache on and off over shared-prefix workloads",
    "quality": "perplexity of a GGUF model: the engine, transformers and llama.cpp",
    "scale": "data-parallel replicas and tensor-parallel ranks on the mixed workload",
    "sched": "the scheduler's hot path with few and many waiting requests",
    "serve": "a seeded workload through AsyncClient: throughput, TTFT, TPOT",
    "speculative": "n-gram speculative decoding on and off on the trained model, copy-heavy and chat",
    "structured": "every request under its own JSON schema against the same ones free",
    "soak": "many requests with aborts and preemption; nothing may be lost",
    "tool_calls": "tool_choice auto, required, named on the trained model: usable calls that end",
    "whatif": "what-if replay's predictions against live runs",
}


def names() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.py")
                  if not p.stem.startswith("_") and p.stem != "common")


def summary(name: str) -> str:
    if name in SUMMARY:
        return SUMMARY[name]
    doc = ast.get_docstring(ast.parse((HERE / f"{name}.py").read_text())) or ""
    return (doc.splitlines() or [""])[0]


def usage() -> str:
    width = max(map(len, names()))
    lines = [f"  {n:<{width}}  {summary(n)}" for n in names()]
    return "\n".join(["usage: scripts/bench NAME [args]   (scripts/bench NAME --help: its options)",
                      "", "benchmarks:", *lines])


if __name__ == "__main__":
    print(usage(), file=sys.stderr)
    sys.exit(2)
