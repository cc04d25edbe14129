#!/usr/bin/env bash
# The long chaos runs (not part of the default test run):
# * the exactly-once copier over 100,000 records while copiers and every
#   service are kill -9'd (tests/chaos/test_copier_chaos.py);
# * a Jepsen-style transactional workload on a replicated cluster (3 stores,
#   RF 3, a 3-member etcd) under 200 random kill -9s and pauses of any store,
#   coordinator or etcd member (tests/chaos/test_replicated_txn_chaos.py).
#   ONCELOG_CHAOS_SEED=N ONCELOG_CHAOS_RECORDS=N ONCELOG_CHAOS_FAULTS=N bash scripts/chaos.sh
# * rolling restarts under load, round after round, then a kill -9 of each
#   store to compare how long leadership takes to move
#   (tests/chaos/test_rolling_restart_soak.py; ONCELOG_ROLLING_ROUNDS=N).
#   bash scripts/chaos.sh -k replicated      # one of them
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/pytest -m slow -s tests/chaos "$@"
