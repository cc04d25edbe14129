#!/usr/bin/env bash
# The main job: the payments pipeline on a local cluster. A generator writes
# payments in transactions (some aborted), a Spark job turns them into a
# double-entry ledger through the exactly-once sink, chaos kill -9s the
# partition store, the coordinator and the Spark driver, and the ledger is
# verified at the end (examples/payments_pipeline.py; --help for options).
# The smaller produce/consume demo is examples/quickstart.py.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/payments_pipeline.py "$@"
