"""A venv of its own for each outside eval, load or client tool, made on first use in the cache.

$TL_CACHE_DIR/tools/<name>-<version>-<key>/ (default ~/.cache/tl-engine): a venv whose .pth
file puts the project's site-packages behind its own, so torch and transformers are the
project's (never a second, CUDA torch from the registry: a constraints file pins both to the
versions the project's venv holds) and pip adds only what the tool needs besides. The key
hashes that site-packages path and its torch/transformers versions, so a rebuilt or moved
project venv gets a fresh tool venv. A `.ready` stamp marks a whole install; a lock keeps two
runs from installing at once; a failed install raises ToolInstallFailed with pip's last lines.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from worker.presets import cache_root

PINNED = ("torch", "transformers")   # the project's, shared with every tool venv


@dataclass(frozen=True)
class Tool:
    name: str
    version: str
    extras: str = ""    # e.g. "[api,hf]"

    @property
    def requirement(self) -> str:
        return f"{self.name}{self.extras}=={self.version}"


LM_EVAL = Tool("lm_eval", "0.4.13", "[api,hf]")
GUIDELLM = Tool("guidellm", "0.8.1")
# client libraries apps call the gateway with (tests/clients/)
LANGCHAIN_OPENAI = Tool("langchain-openai", "1.8.1")
LITELLM = Tool("litellm", "1.110.2")


class ToolInstallFailed(RuntimeError):
    """pip could not install the tool (no registry, a conflict): the message says why."""


def base_site() -> Path:
    return Path(sysconfig.get_paths()["purelib"]).resolve()   # .venv may be a link


def home(tool: Tool) -> Path:
    pins = "|".join(f"{p}=={metadata.version(p)}" for p in PINNED)
    key = hashlib.sha256(f"{base_site()}|{pins}|{tool.requirement}".encode()).hexdigest()[:12]
    return cache_root().parent / "tools" / f"{tool.name}-{tool.version}-{key}"


def bin_dir(tool: Tool) -> Path:
    """The tool venv's bin/, installed first if missing (ToolInstallFailed if that fails)."""
    venv = home(tool)
    if not (venv / ".ready").is_file():
        with _locked(venv.parent, venv.name):
            if not (venv / ".ready").is_file():
                _install(tool, venv)
    return venv / "bin"


def run_logged(cmd: list[str], cwd: Path, out: Path, name: str, timeout: float,
               error: type[Exception], env: dict | None = None) -> None:
    """Run a tool's command offline (no hub look-ups; its datasets cache under out), its
    output to out/NAME.log; raises `error` with the log's end when it exits non-zero."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               HF_DATASETS_CACHE=str(out / "hf-datasets"), TOKENIZERS_PARALLELISM="false",
               **(env or {}))
    env.pop("PYTHONPATH", None)   # the tool venv sees the project's packages through its .pth
    log = out / f"{name}.log"
    with open(log, "w") as f:
        rc = subprocess.run(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT,
                            timeout=timeout).returncode
    if rc != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(True)[-30:])
        raise error(f"{name} exited {rc}; the end of {log}:\n{tail}")


def _install(tool: Tool, venv: Path) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    log = venv.parent / f"{venv.name}.log"
    print(f"installing {tool.requirement} into {venv} (once; log {log})", file=sys.stderr,
          flush=True)
    with open(log, "w") as out:
        _run([sys.executable, "-m", "venv", str(venv)], out, log, tool)
        site = Path(subprocess.check_output(
            [str(venv / "bin" / "python"), "-c",
             "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip())
        (site / "_tl_project.pth").write_text(f"{base_site()}\n")
        pins = venv / "constraints.txt"
        pins.write_text("".join(f"{p}=={metadata.version(p)}\n" for p in PINNED))
        _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
              "-c", str(pins), tool.requirement], out, log, tool)
    (venv / ".ready").write_text(tool.requirement + "\n")


def _run(cmd: list[str], out, log: Path, tool: Tool) -> None:
    out.write(f"$ {' '.join(cmd)}\n")
    out.flush()
    rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        out.flush()
        tail = "".join(log.read_text(errors="replace").splitlines(True)[-20:])
        raise ToolInstallFailed(f"installing {tool.requirement} failed (exit {rc}); "
                                f"the end of {log}:\n{tail}")


@contextmanager
def _locked(folder: Path, name: str):
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f".{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
