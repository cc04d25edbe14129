"""Teeth that outlast a change of schedule: a deliberately broken runtime
must be caught, for the right reason, on as many seeds as its list names:
the listed seeds first, then the rest of the CI seeds in order.

Why: a seed's schedule moves whenever a run draws differently from its
generator (a new timer, one more message), so a list of seeds that caught a
bug goes stale with changes that have nothing to do with that bug; the
lists were found again by hand several times (the comments above each
TEETH say when). Now a stale list costs the time to search on, and a
warning names the seeds that catch the bug today, to be listed instead. The
test fails only when too few CI seeds catch the bug for the right reason:
that the checker lost its teeth is what the test is for.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from tests.sim.real.simulation import SimResult


@dataclass
class Catch:
    """What the search found: the runs that failed for one of the reasons
    (at most as many as wanted), and every other run, in the order run."""

    caught: list[SimResult] = field(default_factory=list)
    missed: list[SimResult] = field(default_factory=list)


def catches(result: SimResult, reasons: Sequence[str]) -> bool:
    return not result.ok and any(reason in result.failure for reason in reasons)


def search_teeth(bug: str, run: Callable[[int], SimResult], listed: Sequence[int],
                 candidates: Iterable[int], reasons: Sequence[str]) -> Catch:
    """Runs `listed`, then the `candidates` not listed, until len(listed)
    runs have failed for one of `reasons`. Warns when a listed seed no
    longer catches `bug`, naming the seeds that did."""
    found = Catch()
    tried: set[int] = set()
    for seed in [*listed, *candidates]:
        if seed in tried:
            continue
        tried.add(seed)
        result = run(seed)
        (found.caught if catches(result, reasons) else found.missed).append(result)
        if len(found.caught) >= len(listed):
            break
    stale = [r.seed for r in found.missed if r.seed in listed]
    if stale and len(found.caught) >= len(listed):
        warnings.warn(f"{bug}: the listed seeds {stale} no longer catch it; "
                      f"{sorted(r.seed for r in found.caught)} do: list those",
                      stacklevel=2)
    return found
