#!/usr/bin/env bash
# Runs random seeds of the real-runtime simulation (tests/sim/real) for a
# while and prints every failing seed with the command that replays it.
#
#   bash scripts/simulate.sh --minutes 10 [--steps 5000] [--bug NAME] [--replicated] [--fsync]
#
# --replicated runs the seeds on three replicated stores (RF 3, min ISR 2)
# with replication's faults (tests/sim/real/test_replicated_sim.py).
# --fsync runs stores that sync before acknowledging, whose machines crash
# at any moment, several at once (tests/sim/real/test_fsync_sim.py).
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=5
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --minutes) minutes="$2"; shift 2 ;;
    --steps|--bug) extra+=("$1" "$2"); shift 2 ;;
    --replicated|--fsync) extra+=("$1"); shift ;;
    *) echo "usage: $0 [--minutes N] [--steps N] [--bug NAME] [--replicated] [--fsync]" >&2
       exit 2 ;;
  esac
done
bash scripts/setup.sh >/dev/null
deadline=$(( $(date +%s) + minutes * 60 ))
# Chunks of 20 seeds from a random start, so parallel runs rarely overlap.
start=$(( (RANDOM << 15 | RANDOM) % 100000000 + 1000 ))
failed=0
runs=0
while [[ $(date +%s) -lt $deadline ]]; do
  end=$(( start + 19 ))
  if ! out=$(.venv/bin/python -m tests.sim.real --seeds "$start..$end" "${extra[@]}" 2>&1); then
    failed=1
    grep -E "FAILED|replay:" <<<"$out" || true
  fi
  runs=$(( runs + 20 ))
  start=$(( end + 1 ))
done
echo "simulate.sh: $runs seeds in $minutes min; $([[ $failed == 0 ]] && echo 'no failure' || echo 'FAILURES above')"
exit $failed
