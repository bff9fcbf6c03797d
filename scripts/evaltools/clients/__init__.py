"""Client libraries' flows (scripts beside this file) run in their tool venvs against a gateway.

Each script runs as an app would: in its own venv (toolenv.py, installed on first use), with
nothing of the project on its path, one flow a process; it prints one JSON object, the flow's
result, as its last line of stdout. run_flow returns that object; a script that fails raises
ClientFlowFailed with its stderr's end, so a test names the library's own error.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from scripts.evaltools.toolenv import Tool, bin_dir

HERE = Path(__file__).resolve().parent


class ClientFlowFailed(RuntimeError):
    """The client script exited non-zero or printed no JSON: the message holds its output."""


def run_flow(tool: Tool, script: str, base_url: str, flow: str, timeout: float = 300) -> dict:
    """`script`'s FLOW against base_url (the gateway's .../v1) with the tool venv's python."""
    python = bin_dir(tool) / "python"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               LITELLM_LOCAL_MODEL_COST_MAP="True")   # litellm: no price list from the web
    env.pop("PYTHONPATH", None)   # the venv sees the project's packages through its .pth only
    proc = subprocess.run([str(python), str(HERE / script), base_url, flow], env=env,
                          capture_output=True, text=True, timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or not lines[-1].startswith("{"):
        tail = "".join(proc.stderr.splitlines(True)[-30:])
        raise ClientFlowFailed(f"{script} {flow} exited {proc.returncode}; stdout's end:\n"
                               f"{proc.stdout[-2000:]}\nstderr's end:\n{tail}")
    return json.loads(lines[-1])
