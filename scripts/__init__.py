"""Python behind the entry points in scripts/: the process group (`scripts.group`) and the
benchmarks (`scripts.benchmarks`). The bash files beside this one are the entry points."""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent   # the repository
