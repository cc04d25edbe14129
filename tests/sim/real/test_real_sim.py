"""The real-runtime simulation's CI seeds, its determinism, and its teeth.

Goal: every change to a production runtime (the store's, the transaction
coordinator's) runs under a fixed set of seeds of tests/sim/real, where the
unchanged runtimes meet lost, duplicated and delayed messages, crashes,
pauses, coordinator takeovers with zombies and fenced producers, and an
independent checker judges the exactly-once guarantees.

Method: each CI seed is one run of `run_seed`; a failure prints the seed,
the trace's tail and the one command that replays it. Determinism is checked
by running one seed twice (and under two string-hash seeds in two
processes, since the replay command runs in its own process). The "teeth"
tests run a deliberately broken runtime (simulation.BUGS) over a seed budget
and require the checker to catch it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sim.real.simulation import SimResult, replay_command, run_seed

# Fixed seeds for the default run (~0.3 s each).
CI_SEEDS = list(range(1, 41))
REPO = Path(__file__).resolve().parents[3]


def _explain(result: SimResult, *, bug: str | None = None) -> str:
    return (f"{result.summary()}\n{result.trace_tail}\nFAILED: {result.failure}\n"
            f"replay: {replay_command(result.seed, steps=result.steps_asked, bug=bug)}")


@pytest.mark.parametrize("seed", CI_SEEDS, ids=lambda s: f"seed{s}")
def test_seed(seed: int) -> None:
    result = run_seed(seed)
    assert result.ok, _explain(result)


def test_no_faults_commits_transactions() -> None:
    """Without faults every producer commits or aborts a stream of
    transactions (the workload itself works)."""
    result = run_seed(3, faults=False)
    assert result.ok, _explain(result)
    assert result.committed >= 10 and result.fenced == 0, result.summary()


def test_replay_is_deterministic() -> None:
    first, second = run_seed(7), run_seed(7)

    def events(r: SimResult) -> tuple[object, ...]:
        return (r.ok, r.steps, r.messages, r.committed, r.aborted, r.faults, r.trace_tail)

    assert events(first) == events(second)


def test_replay_does_not_depend_on_the_string_hash_seed() -> None:
    """The replay command runs in a process of its own: a run must not
    depend on the order of hash-ordered sets."""
    outputs = []
    for hash_seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        outputs.append(subprocess.run(
            [sys.executable, "-m", "tests.sim.real", "--seed", "5", "--verbose"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
        ).stdout)
    traces = [[line for line in out.splitlines() if line.startswith("#")] for out in outputs]
    assert traces[0] == traces[1] and traces[0] and "seed 5: ok" in outputs[0]


# Seeds of 1..150 where the broken store is caught (46: producers stuck on a
# transaction-log write the store acknowledged and then lost in a crash).
ACK_BEFORE_DURABLE_SEEDS = [46, 52]


def test_checker_catches_a_store_that_acknowledges_before_durable() -> None:
    """Teeth: a store that answers before its group commit wrote the batch
    loses acknowledged writes in a crash; the run must fail."""
    results = [run_seed(seed, bug="ack-before-durable") for seed in ACK_BEFORE_DURABLE_SEEDS]
    assert any(not r.ok for r in results), [r.summary() for r in results]


# Seeds of the CI set where the slow-client-zombie recipe (simulation.py,
# `Simulation._after_add`) exposes a coordinator that answers a store's
# verification without confirming that it still owns the transaction log
# (issue 3): 23, 27 and 32 of 1..40 (each a transaction left open after
# quiescing). Over 1..200: 19 seeds, all recipe seeds. The seeds move when
# anything the run draws from its generator changes (the clients' backoff
# jitter, say): find them again with
# `.venv/bin/python -m tests.sim.real --seeds 1..200 --bug no-confirm-ownership`.
# Two are run here; the scripted schedule in test_scripted.py pins the same
# interleaving exactly, whatever the seeds do.
NO_CONFIRM_OWNERSHIP_SEEDS = [23, 27]


def test_checker_catches_verification_without_confirming_ownership() -> None:
    """Teeth: the seeded search finds issue 3's bug within the CI seed set."""
    assert set(NO_CONFIRM_OWNERSHIP_SEEDS) <= set(CI_SEEDS)
    results = [run_seed(seed, bug="no-confirm-ownership") for seed in NO_CONFIRM_OWNERSHIP_SEEDS]
    assert all(not r.ok for r in results), [r.summary() for r in results]
    assert all("still open after quiescing" in r.failure for r in results), \
        [r.failure for r in results]
