#!/usr/bin/env bash
# The long chaos runs (not part of the default test run): the exactly-once
# copier over 100,000 records while copiers and every service are kill -9'd.
#   ONCELOG_CHAOS_SEED=N ONCELOG_CHAOS_RECORDS=N bash scripts/chaos.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/pytest -m slow -s tests/chaos "$@"
