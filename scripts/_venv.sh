# Sourced by every scripts/* entry point: make .venv at the repo root if missing,
# install torch (CPU build, exact pin) first, then the project editable with its extras.
# A ready .venv is detected by a stamp holding the hash of pyproject.toml.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
STAMP="$VENV/.tl-installed"
want="$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV" || exit 1
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "setting up $VENV (first run only)..." >&2
  log="$VENV/install.log"
  { "$VENV/bin/python" -m pip install --upgrade pip &&
    "$VENV/bin/python" -m pip install torch==2.13.0 &&
    "$VENV/bin/python" -m pip install -e "$ROOT[test]"; } >"$log" 2>&1 ||
    { tail -n 30 "$log" >&2; echo "install failed: see $log" >&2; exit 1; }
  echo "$want" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
