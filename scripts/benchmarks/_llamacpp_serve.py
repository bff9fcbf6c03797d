"""Run llama-server on a GGUF and drive it with token-id prompts over its HTTP API.

One server per concurrency level: `-np N` slots of `ctx` tokens each (`-c N*ctx`),
continuous batching, f32 KV cache, one thread per core, host prompt cache off (the
workload shares no prefixes). Requests go to /completion with the prompt as a list of ids,
greedy (temperature 0), n_predict = max_tokens, ignore_eos, streamed with return_tokens, so
every Trace has the same meaning as the engine's (docs/design/benchmarks.md, "llama.cpp as a peer").
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
from pathlib import Path

from scripts.benchmarks import common as bl


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_args(binary: Path, gguf: Path, port: int, slots: int, ctx: int,
                threads: int) -> list[str]:
    return [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "-np", str(slots), "-c", str(slots * ctx), "--cont-batching",
            "-t", str(threads), "-tb", str(threads), "-ctk", "f32", "-ctv", "f32",
            "--cache-ram", "0", "--no-webui", "--metrics"]


class Server:
    """llama-server as a child process; `stop` (idempotent) ends it, always call it."""

    def __init__(self, args: list[str], log: Path):
        self.args, self.log = args, log
        self.port = int(args[args.index("--port") + 1])
        self.url = f"http://127.0.0.1:{self.port}"
        with open(log, "w") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_ready(self, timeout: float = 300) -> None:
        """Until /health says ok; RuntimeError with the log's end if the server exits."""
        import urllib.error
        import urllib.request
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"llama-server not ready after {timeout}s:\n{self.tail()}")

    def tail(self, lines: int = 15) -> str:
        return "".join(self.log.read_text(errors="replace").splitlines(True)[-lines:])

    def stop(self, timeout: float = 15) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _body(req: bl.Req) -> dict:
    """Greedy, streamed; EOS ignored unless the request's options say otherwise."""
    return {"prompt": req.prompt, "n_predict": req.max_tokens, "temperature": 0.0,
            "ignore_eos": req.options.get("ignore_eos", True), "stream": True,
            "return_tokens": True, "cache_prompt": False}


async def _one(session, url: str, req: bl.Req, gate: asyncio.Semaphore,
               bar: bl.Progress) -> bl.Trace:
    async with gate:
        tr = bl.Trace(time.perf_counter())
        decoded = 0
        try:
            async with session.post(f"{url}/completion", json=_body(req)) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
                async for line in resp.content:
                    if not line.startswith(b"data: "):
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        raise RuntimeError(str(chunk["error"])[:200])
                    # tokens_predicted counts tokens the stream may not carry (see module doc)
                    n = chunk.get("tokens_predicted", decoded) - decoded
                    if n > 0:
                        tr.deltas.append((time.perf_counter(), n))
                        decoded += n
                    tr.tokens.extend(chunk.get("tokens") or ())
                    if chunk.get("stop"):
                        tr.finish_reason = chunk.get("stop_type")
        except Exception as e:  # counted like the engine's failed requests
            tr.error = f"{type(e).__name__}: {e}"
        tr.end = time.perf_counter()
        tr.ids_partial = tr.error is None and len(tr.tokens) != decoded
        bar.tick()
        return tr


async def drive(url: str, reqs: list[bl.Req], concurrency: int, *, progress: bool = True,
                label: str = "llama.cpp", timeout: float = 3600) -> bl.RunResult:
    """Every request, at most `concurrency` in flight, streamed to the end."""
    import aiohttp
    gate = asyncio.Semaphore(concurrency)
    # a fresh connection per request: llama-server's httplib may close a kept-alive one
    # after a streamed response, and a reused closed one fails the next request
    conn = aiohttp.TCPConnector(limit=concurrency, force_close=True)
    async with aiohttp.ClientSession(connector=conn,
                                     timeout=aiohttp.ClientTimeout(total=timeout)) as s:
        bar = bl.Progress(len(reqs), label, progress)
        t0 = time.perf_counter()
        traces = await asyncio.gather(*(_one(s, url, r, gate, bar) for r in reqs))
    wall = max((t.end for t in traces), default=t0) - t0
    return bl.RunResult(list(traces), wall, {}, {})


def threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
