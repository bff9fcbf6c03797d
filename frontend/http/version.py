"""GET /version: the package's version, as vLLM answers it ({"version": "0.1.0"})."""
from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

PACKAGE = "tl-engine"
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def package_version() -> str:
    """The installed distribution's version; a checkout run from its directory without
    being installed reads its pyproject.toml; "unknown" where neither is there."""
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        pass
    try:
        return tomllib.loads(PYPROJECT.read_text())["project"]["version"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"
