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
# * --soak MINUTES: only the soak that mixes every kind of fault (kill -9,
#   pauses, every kind of network partition, a full disk, etcd member loss,
#   rolling restarts) for MINUTES minutes under an idempotent producer, a
#   transactional producer and a read-process-write copier, then prints the
#   figures (tests/chaos/test_mixed_fault_soak.py; needs root for network
#   namespaces and tmpfs mounts).
#   ONCELOG_CHAOS_SEED=N bash scripts/chaos.sh --soak 30
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--soak" ]]; then
    if [[ $# -lt 2 || ! "$2" =~ ^[0-9]+([.][0-9]+)?$ ]]; then
        echo "usage: bash scripts/chaos.sh --soak MINUTES [pytest arguments]" >&2
        exit 2
    fi
    export ONCELOG_SOAK_MINUTES="$2"
    shift 2
    bash scripts/setup.sh
    exec .venv/bin/pytest -m slow -s tests/chaos/test_mixed_fault_soak.py "$@"
fi
bash scripts/setup.sh
exec .venv/bin/pytest -m slow -s tests/chaos "$@"
