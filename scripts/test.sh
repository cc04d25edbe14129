#!/usr/bin/env bash
# The test command: installs what it needs, then lints, type-checks and runs
# the default test suite (long soak/chaos/benchmark runs have their own commands).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== ruff"
.venv/bin/ruff check .
echo "== mypy"
.venv/bin/mypy
echo "== pytest"
.venv/bin/pytest -m "not slow" "$@"
