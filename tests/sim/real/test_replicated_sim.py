"""The real-runtime simulation on replicated stores: CI seeds, determinism, teeth.

Goal: every change to replication (services/partition_store: the replica
manager, the metadata link and controller, the partition's high watermark
and truncation, the store's recovery) runs under a fixed set of seeds in
which three stores keep every partition (data, input, output and the
coordinators' internal topics) in three replicas with min.insync.replicas
2, their metadata in one shared in-memory etcd, while stores crash and
restart, lose the writes their machine had not written back, come back with
an empty disk, pause past their lease, are cut off from the other stores or
from etcd, and etcd is out of reach for a while; and the exactly-once
checker judges the transactional and read-process-write workload end to
end, with replication's own checks (checker.ReplicaChecker: replicas that
agree byte for byte below their high watermark, no high watermark beyond
the leader's log end, every replica in sync after quiescing).

Method: each CI seed is one `run_seed(seed, replicated=True)`; a failure
prints the seed, the trace's tail and the one command that replays it.
Determinism is checked by running one seed twice in this process, and under
two string-hash seeds in two processes. The
teeth test runs each of replication's deliberately broken runtimes
(simulation.REPLICATION_BUGS) on the seeds listed in TEETH and requires the
checker to fail them for the right reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sim.real.simulation import REPLICATION_BUGS, SimResult, replay_command, run_seed
from tests.sim.real.teeth import search_teeth

# Fixed seeds for the default run (~3 s each on the 2-vCPU machine).
CI_SEEDS = list(range(1, 13))
REPO = Path(__file__).resolve().parents[3]


def _explain(result: SimResult, *, bug: str | None = None) -> str:
    replay = replay_command(result.seed, steps=result.steps_asked, bug=bug, replicated=True)
    return (f"{result.summary()}\n{result.trace_tail}\nFAILED: {result.failure}\n"
            f"replay: {replay}")


@pytest.mark.parametrize("seed", CI_SEEDS, ids=lambda s: f"seed{s}")
def test_replicated_seed(seed: int) -> None:
    result = run_seed(seed, replicated=True)
    assert result.ok, _explain(result)


def test_replicated_without_faults_commits_transactions() -> None:
    """Without faults the workload runs on replicated stores (leaders,
    followers and acks=all work at all)."""
    result = run_seed(3, faults=False, replicated=True)
    assert result.ok, _explain(result)
    assert result.committed >= 10 and result.fenced == 0, result.summary()


# Also implied by the next test (one seed, two processes, two hash seeds:
# the same trace), which the default run keeps; this one runs with the slow
# tests.
@pytest.mark.slow
def test_replicated_replay_is_deterministic() -> None:
    first, second = run_seed(9, replicated=True), run_seed(9, replicated=True)

    def events(r: SimResult) -> tuple[object, ...]:
        return (r.ok, r.steps, r.messages, r.committed, r.aborted, r.faults, r.trace_tail)

    assert events(first) == events(second)


def test_replicated_replay_does_not_depend_on_the_string_hash_seed() -> None:
    """The replay command runs in a process of its own: no choice of the
    replication code or of the simulation may follow the order of a
    hash-ordered set."""
    outputs = []
    for hash_seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        outputs.append(subprocess.run(
            [sys.executable, "-m", "tests.sim.real", "--seed", "5", "--replicated", "--verbose"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
        ).stdout)
    traces = [[line for line in out.splitlines() if line.startswith("#")] for out in outputs]
    assert traces[0] == traces[1] and traces[0] and "seed 5: ok" in outputs[0]


# Teeth: each deliberately broken piece of replication (simulation.BUGS),
# CI seeds where the checker catches it, and what the failure must say. The
# seeds move whenever a run draws differently from its generator; find them
# again with `.venv/bin/python -m tests.sim.real --seeds 1..12 --replicated
# --bug NAME` (they moved when the stores began asking the coordinators
# about transactions open past their timeout, and again when the
# transaction coordinator began to write in batches).
TEETH: dict[str, tuple[list[int], tuple[str, ...]]] = {
    # The leader acknowledges what only it has: a new leader lacks what a
    # follower already counts as committed.
    "hw-ignores-followers": ([5, 7], ("beyond the log end",)),
    # A deposed leader keeps its own tail as a follower: the replicas
    # diverge below the HW.
    "no-follower-truncation": ([2, 3], ("the replicas diverged",)),
    # A replica outside the ISR leads and lacks acknowledged records.
    "elect-outside-isr": ([1, 11], ("beyond the log end",)),
}


@pytest.mark.parametrize("bug", sorted(TEETH))
def test_the_checker_catches_broken_replication(bug: str) -> None:
    """Teeth: with the deliberately broken piece patched in, as many CI
    seeds as TEETH lists fail, for the right reason (the listed ones first;
    tests/sim/real/teeth.py)."""
    seeds, reasons = TEETH[bug]
    assert set(seeds) <= set(CI_SEEDS)
    found = search_teeth(bug, lambda seed: run_seed(seed, bug=bug, replicated=True), seeds,
                         CI_SEEDS, reasons)
    assert len(found.caught) >= len(seeds), [_explain(r, bug=bug) for r in found.missed[:3]]


def test_every_replication_bug_has_teeth() -> None:
    """(append-after-leadership-moved is caught by its scripted schedule,
    test_scripted.py.)"""
    assert set(TEETH) | {"append-after-leadership-moved"} == REPLICATION_BUGS
