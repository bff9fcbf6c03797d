"""llama.cpp's side of `scripts/bench speculative`: llama-server on the same GGUF file, once
plain and once drafting by the engine's method: its own prompt lookup (`--spec-type
ngram-simple`: the last NGRAM_N tokens looked up, --num-draft tokens drafted) or the same
draft model's GGUF file (`--spec-type draft-simple`); two systems the benchmark drives in its
turns beside the engine's two."""
from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from scripts.benchmarks import _llamacpp_get as get
from scripts.benchmarks import _llamacpp_serve as serve
from scripts.benchmarks import common as bl

# llama.cpp's prompt lookup: the last NGRAM_N tokens looked up, up to --num-draft drafted
# (ours tries 3, 2 then 1 tokens; its ngram-simple takes one size)
NGRAM_N = 3


def spec_args(num_draft: int, draft: Path | None = None) -> list[str]:
    """Prompt lookup, or with `draft` (a GGUF file) that draft model, greedy, as ours."""
    if draft is not None:
        return ["--spec-type", "draft-simple", "--spec-draft-model", str(draft),
                "--spec-draft-n-max", str(num_draft), "--spec-draft-n-min", "0"]
    return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(NGRAM_N),
            "--spec-ngram-simple-size-m", str(num_draft), "--spec-draft-n-max", str(num_draft)]


class LlamaServers:
    """The two llama-servers (plain, drafting), one slot each: they serve level 1 only."""

    def __init__(self, gguf: Path, num_draft: int, ctx: int, draft: Path | None = None):
        self.binary = get.ensure_server()
        self.logdir = Path(tempfile.mkdtemp(prefix="tl-bench-speculative-llamacpp-"))
        self.servers: dict[str, serve.Server] = {}
        try:
            for name, extra in (("llamacpp-off", []), ("llamacpp-on", spec_args(num_draft, draft))):
                args = serve.server_args(self.binary, gguf, serve.free_port(), 1, ctx,
                                         serve.threads()) + extra
                self.servers[name] = serve.Server(args, self.logdir / f"{name}.log")
                self.servers[name].wait_ready()
        except BaseException:
            self.stop()
            raise

    def run(self, name: str, reqs: list[bl.Req]) -> bl.RunResult:
        return asyncio.run(serve.drive(self.servers[name].url, reqs, 1, progress=False))

    def stop(self) -> None:
        for s in self.servers.values():
            s.stop()
