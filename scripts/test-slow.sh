#!/usr/bin/env bash
# The slow tests outside tests/chaos (which has scripts/chaos.sh): the
# benchmarks' smoke runs at their slower sizes, the simulation's slower teeth
# seeds, doc examples that start a JVM each. Not part of the default run
# (scripts/test.sh), which keeps to its time budget.
#   bash scripts/test-slow.sh                 # all of them
#   bash scripts/test-slow.sh -k teeth        # some
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
status=0
.venv/bin/pytest -m slow --ignore=tests/chaos "$@" || status=$?
# Exit status 5 is "no tests collected": a selection with none.
if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then exit "$status"; fi
