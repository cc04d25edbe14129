#!/usr/bin/env bash
# The main job: starts a local oncelog cluster (each service its own process)
# and runs the quick-start pipeline demo against it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/quickstart.py "$@"
