#!/usr/bin/env bash
# Creates .venv and installs oncelog with its development tools into it.
# Safe to run again: it reinstalls only when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON_BIN="${PYTHON_BIN:-python3}"
if ! "$PYTHON_BIN" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "oncelog needs Python 3.11 or newer as '$PYTHON_BIN'" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  if ! "$PYTHON_BIN" -m venv .venv 2>/dev/null; then
    # Debian splits venv out of the interpreter package.
    if command -v apt-get >/dev/null; then
      apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
    fi
    "$PYTHON_BIN" -m venv .venv
  fi
fi
stamp=".venv/.oncelog-installed"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "== installing oncelog and its tools into .venv"
  .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
  .venv/bin/python -m pip install -q -e '.[dev]' 2>&1 | grep -v '^WARNING: Location' || true
  .venv/bin/python -c 'import oncelog, services, rocksdict, grpc' 
  echo "$want" > "$stamp"
fi

# The Node.js client example (examples/node) and its test need node and npm.
# Its packages are installed here, from the committed lockfile, so the test
# itself needs no network; again only when the lockfile changed.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  if command -v apt-get >/dev/null; then
    echo "== installing nodejs and npm"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
  else
    echo "warning: node and npm are missing (examples/node and its test need them)" >&2
  fi
fi
if command -v npm >/dev/null; then
  node_stamp="examples/node/node_modules/.oncelog-installed"
  node_want="$(sha256sum examples/node/package-lock.json | cut -d' ' -f1)"
  if [ ! -f "$node_stamp" ] || [ "$(cat "$node_stamp")" != "$node_want" ]; then
    echo "== installing the Node.js example's packages (npm ci)"
    # No install scripts: the example has no native code to build.
    (cd examples/node && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
    echo "$node_want" > "$node_stamp"
  fi
fi
