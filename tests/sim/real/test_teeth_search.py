"""tests/sim/real/teeth.py: how the teeth tests find seeds that catch a bug.

Goal: a stale list of seeds (the schedule moved under it) does not fail a
teeth test while other CI seeds still catch the bug for the right reason,
and says which seeds to list instead; a bug that no seed catches for the
right reason still fails it; a list that still works costs no extra run.

Method: search_teeth with a fake run (a SimResult per seed, made by hand).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest

from tests.sim.real.simulation import SimResult
from tests.sim.real.teeth import search_teeth

REASONS = ("lost write",)


def fake_run(outcomes: dict[int, str], ran: list[int]) -> Callable[[int], SimResult]:
    """seed -> failure text ("" passes); records the seeds run, in order."""
    def run(seed: int) -> SimResult:
        ran.append(seed)
        failure = outcomes.get(seed, "")
        return SimResult(seed=seed, steps_asked=10, steps=10, ok=not failure, failure=failure)
    return run


def test_a_list_that_still_catches_runs_only_its_seeds() -> None:
    ran: list[int] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = search_teeth("bug", fake_run({3: "lost write", 5: "lost write"}, ran),
                             [3, 5], range(1, 10), REASONS)
    assert [r.seed for r in found.caught] == [3, 5] and ran == [3, 5]


def test_a_stale_seed_is_replaced_by_the_next_one_that_catches_and_named() -> None:
    ran: list[int] = []
    outcomes = {3: "lost write", 5: "", 7: "something else", 8: "lost write: offset 4"}
    with pytest.warns(UserWarning, match=r"bug: the listed seeds \[5\] no longer catch it; "
                                         r"\[3, 8\] do: list those"):
        found = search_teeth("bug", fake_run(outcomes, ran), [3, 5], range(1, 10), REASONS)
    assert [r.seed for r in found.caught] == [3, 8]
    # Listed first, then the others in order, none twice; 7 failed for
    # another reason and does not count.
    assert ran == [3, 5, 1, 2, 4, 6, 7, 8]
    assert [r.seed for r in found.missed] == [5, 1, 2, 4, 6, 7]


def test_a_bug_no_seed_catches_for_the_right_reason_comes_up_short() -> None:
    ran: list[int] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = search_teeth("bug", fake_run({3: "copied twice", 4: "copied twice"}, ran),
                             [3, 4], range(1, 6), REASONS)
    assert found.caught == [] and ran == [3, 4, 1, 2, 5]
