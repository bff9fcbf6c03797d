"""`scripts/bench compare --peer llamacpp`'s bandwidth figures and llama.cpp's ceiling.

Bytes per token: what one decode step of one request reads of the GGUF's weights. Every
tensor of the file once, but the token embedding, of which the step looks up one row; the
output head whole (a tied head, with no output.weight, is the embedding tensor read whole,
counted once). The KV cache read is left out: it grows with the context, the weights do
not. Bytes per token over TPOT p50 at concurrency 1 is the bandwidth a system draws, and
its fraction of the triad (scripts/benchmarks/bandwidth.py, run at compare's start on the
same threads as llama.cpp) says how near the memory's limit it runs.

llama-batched-bench: llama.cpp's own batched generation without a server, at each level the
workload's mean prompt and output lengths, its TG tok/s (generated tokens of the whole
batch per second of generation) as the ceiling llama-server's figures could reach.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

from worker.gguf_index import read_index

EMBEDDING = "token_embd.weight"
OUTPUT = "output.weight"


def bytes_per_token(gguf: str | Path) -> dict:
    """{bytes_per_token, weight_bytes, tied}: the GGUF's tensor bytes one decode step reads."""
    tensors = {t.name: t for t in read_index(gguf).tensors}
    embd = tensors.get(EMBEDDING)
    tied = OUTPUT not in tensors
    rest = sum(t.n_bytes for name, t in tensors.items() if name != EMBEDDING)
    if embd is None:
        looked_up = 0
    elif tied:
        looked_up = embd.n_bytes   # the head reads it whole; its looked-up row is in that
    else:
        looked_up = embd.n_bytes // embd.dims[-1]   # one row of dims[-1]
    return {"bytes_per_token": rest + looked_up,
            "weight_bytes": sum(t.n_bytes for t in tensors.values()), "tied": tied}


def drawn(bytes_token: int, tpot_ms: float | None, triad_gb_s: float) -> dict:
    """A system's bandwidth at concurrency 1 (GB/s) and its fraction of the triad's."""
    if not tpot_ms:
        return {"gb_s": None, "fraction": None}
    gb_s = bytes_token / (tpot_ms / 1e3) / 1e9
    return {"gb_s": gb_s, "fraction": gb_s / triad_gb_s if triad_gb_s else None}


def batched_bench_args(binary: Path, gguf: Path, prompt: int, output: int,
                       levels: list[int], threads: int) -> list[str]:
    """The same KV type as llama-server's (f32), room for the largest level's batch."""
    ctx = max(levels) * (prompt + output)
    return [str(binary), "-m", str(gguf), "-c", str(ctx), "-npp", str(prompt),
            "-ntg", str(output), "-npl", ",".join(map(str, levels)), "-t", str(threads),
            "-tb", str(threads), "-ctk", "f32", "-ctv", "f32", "--output-format", "jsonl"]


def parse_batched_bench(text: str) -> dict[int, float]:
    """{parallel sequences: TG tok/s} from llama-batched-bench's jsonl lines (others are
    its log and are stepped over)."""
    out = {}
    for line in text.splitlines():
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        if "pl" in row and "speed_tg" in row:
            out[int(row["pl"])] = float(row["speed_tg"])
    return out


# llama-batched-bench prints its rows through llama.cpp's log thread, which now and then
# loses the last row at exit (exit status 0, nothing on stderr: its c2 row of
# test_compare_peer_llamacpp_tiny went missing in 4 of 10 runs of the same arguments), so
# a level without a row is run again, alone, up to this many runs in all.
BATCHED_BENCH_TRIES = 3


def batched_bench(binary: Path, gguf: Path, workload: dict, levels: list[int],
                  threads: int, log: Path) -> dict[int, float]:
    """Run llama-batched-bench at the workload's mean lengths; its TG tok/s per level
    (a level whose row never came: absent)."""
    out: dict[int, float] = {}
    missing = list(levels)
    with open(log, "w") as err:
        for _ in range(BATCHED_BENCH_TRIES):
            args = batched_bench_args(binary, gguf, round(workload["prompt_len_mean"]),
                                      round(workload["output_len_mean"]), missing, threads)
            done = subprocess.run(args, stdout=subprocess.PIPE, stderr=err, text=True,
                                  stdin=subprocess.DEVNULL)
            if done.returncode != 0:
                raise RuntimeError(f"llama-batched-bench exited {done.returncode}; see {log}")
            rows = parse_batched_bench(done.stdout)
            out.update({c: rows[c] for c in missing if c in rows})
            missing = [c for c in missing if c not in out]
            if not missing:
                break
    return {c: out[c] for c in levels if c in out}
