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
# Two workers, a test file each (most tests wait on servers more than they
# compute), then the tests marked serial alone (tests/conftest.py says why).
# Exit status 5 is "no tests collected": a selection with none of one kind.
echo "== pytest (two workers)"
status=0
.venv/bin/pytest -m "not slow and not serial" -n 2 --dist loadfile "$@" || status=$?
if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then exit "$status"; fi
echo "== pytest (serial)"
status=0
.venv/bin/pytest -m "serial and not slow" "$@" || status=$?
if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then exit "$status"; fi
