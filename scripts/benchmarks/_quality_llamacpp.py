"""llama.cpp's side of `scripts/bench quality`: `llama-perplexity` on the GGUF file itself
over the same windows, and `llama-server`'s greedy tokens for the agreement check.

llama-perplexity tokenizes the text itself (no way to hand it ids), so the run saves what it
evaluated (`--kl-divergence-base FILE`: a header, then the ids of every window) and those ids
must equal ours, or the figure is refused. `-c ctx -b ctx` makes it evaluate one window per
pass, exactly our windows (docs/design/benchmarks.md, "Quality").

Both tools run with `--no-repack` (NO_REPACK): on a CPU with AMX, ggml repacks Q4_0/Q4_1
weights for its AMX kernels, which crash on this machine's Xeon (SIGSEGV in
ggml_backend_amx_mul_mat; llama.cpp issue #20824) and are known to compute wrong results
for these types (llama.cpp PR #16315); without repacking the weights stay in the file's own
layout and go through ggml's ordinary CPU kernels.
"""
from __future__ import annotations

import asyncio
import re
import struct
import subprocess
from pathlib import Path

from scripts.benchmarks import _llamacpp_get as get
from scripts.benchmarks import _llamacpp_serve as serve

NO_REPACK = "--no-repack"
_FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")


def read_base_tokens(path: Path) -> tuple[int, list[int]]:
    """(ctx, the ids of every window) from a --kl-divergence-base file: "_logits_", then
    int32 n_ctx, n_vocab, n_chunk, then n_chunk * n_ctx int32 ids (perplexity.cpp)."""
    with open(path, "rb") as f:
        if f.read(8) != b"_logits_":
            raise ValueError(f"{path}: not a llama-perplexity logits file")
        n_ctx, _n_vocab, n_chunk = struct.unpack("<iii", f.read(12))
        ids = struct.unpack(f"<{n_ctx * n_chunk}i", f.read(4 * n_ctx * n_chunk))
    return n_ctx, list(ids)


def parse_final(output: str) -> float:
    m = _FINAL.search(output)
    if m is None:
        raise RuntimeError("llama-perplexity printed no final estimate:\n" + output[-2000:])
    return float(m.group(1))


def perplexity(gguf: Path, text_file: Path, ctx: int, want: list[list[int]],
               workdir: Path, threads: int) -> dict:
    """llama-perplexity's PPL over `text_file` (it drops one trailing newline, as our text
    does), checked to have evaluated exactly the windows `want`."""
    binary = get.ensure_tool("llama-perplexity")
    base, log = workdir / "llamacpp.logits", workdir / "llama-perplexity.log"
    cmd = [str(binary), "-m", str(gguf), "-f", str(text_file), "-c", str(ctx), "-b", str(ctx),
           "--chunks", str(len(want)), "-t", str(threads), "-tb", str(threads),
           "-ctk", "f32", "-ctv", "f32", NO_REPACK, "--kl-divergence-base", str(base)]
    try:
        with open(log, "w") as out:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL).returncode
        text = log.read_text(errors="replace")
        if rc != 0:
            raise RuntimeError(f"llama-perplexity exited {rc}:\n{text[-2000:]}")
        got_ctx, ids = read_base_tokens(base)
    finally:
        base.unlink(missing_ok=True)
    flat = [t for w in want for t in w]
    if got_ctx != ctx or ids != flat:
        first = next((i for i, (a, b) in enumerate(zip(ids, flat)) if a != b),
                     min(len(ids), len(flat)))
        raise RuntimeError(f"llama-perplexity evaluated other tokens than ours (ctx "
                           f"{got_ctx} vs {ctx}, {len(ids)} vs {len(flat)} ids, first "
                           f"difference at {first}): its tokenizer splits the text otherwise")
    return {"ppl": parse_final(text), "windows": len(ids) // ctx, "same_tokens": True,
            "args": [{str(gguf): gguf.name, str(text_file): text_file.name,
                      str(base): "FILE"}.get(x, x) for x in cmd[1:]]}


def eog_ids(gguf: Path) -> list[int]:
    """The ids llama.cpp ends a generation on: EOS and the usual end-of-turn texts."""
    get.ensure_gguf_package()
    from gguf import GGUFReader
    r = GGUFReader(str(gguf))
    texts = r.fields["tokenizer.ggml.tokens"]
    out = {i for i, d in enumerate(texts.data)
           if bytes(texts.parts[d]).decode(errors="replace") in get.EOG_TEXTS}
    eos = r.fields.get("tokenizer.ggml.eos_token_id")
    if eos is not None:
        out.add(int(eos.contents()))
    return sorted(out)


async def _all(url: str, prompts: list[list[int]], n: int, slots: int) -> list[list[int]]:
    import aiohttp
    gate = asyncio.Semaphore(slots)
    conn = aiohttp.TCPConnector(limit=slots, force_close=True)

    async def one(s, prompt):
        body = {"prompt": prompt, "n_predict": n, "temperature": 0.0, "top_k": 1,
                "repeat_penalty": 1.0, "return_tokens": True, "cache_prompt": False,
                "stream": False}
        async with gate, s.post(f"{url}/completion", json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"llama-server: HTTP {r.status}: {(await r.text())[:200]}")
            return list((await r.json())["tokens"])

    async with aiohttp.ClientSession(connector=conn) as s:
        return await asyncio.gather(*(one(s, p) for p in prompts))


def greedy(gguf: Path, prompts: list[list[int]], n: int, workdir: Path, threads: int,
           slots: int = 4) -> list[list[int]]:
    """llama-server's first n greedy tokens of each prompt (ids in, ids out)."""
    binary = get.ensure_server()
    ctx = -(-(max(map(len, prompts)) + n) // 256) * 256
    args = serve.server_args(binary, gguf, serve.free_port(), slots, ctx, threads)
    server = serve.Server([*args, NO_REPACK], workdir / "llama-server.log")
    try:
        server.wait_ready()
        return asyncio.run(_all(server.url, prompts, n, slots))
    finally:
        server.stop()
