"""python -m scripts.evaltools {install,lm-eval,guidellm,client}: the tools by hand against a
running gateway (scripts/serve --model smollm2 --http-port 8000), as the slow tests run them."""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from scripts.evaltools import guidellm, lmeval
from scripts.evaltools.clients import run_flow
from scripts.evaltools.toolenv import GUIDELLM, LANGCHAIN_OPENAI, LITELLM, LM_EVAL, bin_dir

CLIENTS = {"langchain": (LANGCHAIN_OPENAI, "langchain_flows.py"),
           "litellm": (LITELLM, "litellm_flows.py")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.evaltools")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install", help="install every tool into the cache; print their bin/")
    lm = sub.add_parser("lm-eval", help="the project's tasks through the gateway")
    lm.add_argument("http", help="the gateway's base URL, e.g. http://127.0.0.1:8000")
    lm.add_argument("--hf", metavar="GGUF", type=Path,
                    help="also lm-eval's own hf model on this GGUF (multiple choice only)")
    gl = sub.add_parser("guidellm", help="guidellm's constant-rate benchmark")
    gl.add_argument("http")
    gl.add_argument("--tokenizer", required=True, type=Path,
                    help="a tokenizer directory, or the GGUF file to take it from")
    gl.add_argument("--seconds", type=int, default=guidellm.Load.seconds)
    gl.add_argument("--rate", type=float, default=guidellm.Load.rate)
    cl = sub.add_parser("client", help="one flow of a client library (tests/clients/)")
    cl.add_argument("library", choices=sorted(CLIENTS))
    cl.add_argument("flow", help="a name in the script's FLOWS, e.g. tools_required")
    cl.add_argument("http", help="the gateway's base URL, e.g. http://127.0.0.1:8000")
    for s in (lm, gl):
        s.add_argument("--out", type=Path, default=None, help="output folder (default: a temp one)")
    a = p.parse_args(argv)
    if a.cmd == "install":
        for tool in (LM_EVAL, GUIDELLM, LANGCHAIN_OPENAI, LITELLM):
            print(tool.requirement, bin_dir(tool))
        return 0
    if a.cmd == "client":
        print(json.dumps(run_flow(*CLIENTS[a.library], a.http + "/v1", a.flow), indent=1))
        return 0
    out = a.out or Path(tempfile.mkdtemp(prefix=f"tl-{a.cmd}-"))
    if a.cmd == "lm-eval":
        gw = lmeval.run("local-completions", lmeval.gateway_args(a.http),
                        [lmeval.GENERATE, lmeval.CHOICE], out / "gateway")
        print(json.dumps({"gateway": lmeval.results(gw)}, indent=1))
        if a.hf:
            hf = lmeval.run("hf", lmeval.hf_args(a.hf.parent, a.hf.name), [lmeval.CHOICE],
                            out / "hf")
            print(json.dumps({"hf": lmeval.results(hf)}, indent=1))
    else:
        tok = a.tokenizer
        if tok.suffix == ".gguf":
            tok = guidellm.save_tokenizer(tok, out / "tokenizer")
        report = guidellm.run(a.http, tok, out, guidellm.Load(a.seconds, a.rate))
        print(guidellm.summary(report))
    print(f"output: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
