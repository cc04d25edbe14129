"""Server-side partition assignment: balanced and sticky.

Input: each member's subscribed topics and its current target (for
stickiness), and the partition counts of the subscribed topics. Output: a new
target per member such that

* every partition of a subscribed topic has exactly one member, subscribed to
  its topic;
* a member keeps every partition of its current target that is still valid,
  unless balance needs it elsewhere;
* no partition can move to a member with two or more fewer partitions than
  its holder that is also subscribed to it (for members with the same
  subscriptions this means counts differ by at most one).

Deterministic: the same input gives the same output in every process (ties
are broken by member id, partitions are visited in order).
"""

from __future__ import annotations

from collections.abc import Mapping

TP = tuple[str, int]


def assign(
    subscriptions: Mapping[str, frozenset[str]],
    current: Mapping[str, frozenset[TP]],
    partition_counts: Mapping[str, int],
) -> dict[str, frozenset[TP]]:
    members = sorted(subscriptions)
    if not members:
        return {}
    owner: dict[TP, str] = {}
    owned: dict[str, set[TP]] = {m: set() for m in members}
    # 1. Stickiness: keep every still-valid partition (first claimant wins).
    for m in members:
        for tp in sorted(current.get(m, frozenset())):
            topic, partition = tp
            if (topic in subscriptions[m] and 0 <= partition < partition_counts.get(topic, 0)
                    and tp not in owner):
                owner[tp] = m
                owned[m].add(tp)
    # 2. Every unowned partition goes to the least loaded eligible member.
    all_partitions = sorted(
        (topic, p)
        for topic in sorted({t for subs in subscriptions.values() for t in subs})
        for p in range(partition_counts.get(topic, 0))
    )
    eligible: dict[str, list[str]] = {}
    for topic, _ in all_partitions:
        if topic not in eligible:
            eligible[topic] = [m for m in members if topic in subscriptions[m]]
    for tp in all_partitions:
        if tp in owner:
            continue
        target = min(eligible[tp[0]], key=lambda m: (len(owned[m]), m))
        owner[tp] = target
        owned[target].add(tp)
    # 3. Balance: move a partition from a member to an eligible one holding
    # two or more fewer, until none can move. Each move lowers the sum of
    # squared counts, so this ends.
    moved = True
    while moved:
        moved = False
        for tp in all_partitions:
            holder = owner[tp]
            lightest = min(eligible[tp[0]], key=lambda m: (len(owned[m]), m))
            if len(owned[holder]) - len(owned[lightest]) >= 2:
                owned[holder].discard(tp)
                owned[lightest].add(tp)
                owner[tp] = lightest
                moved = True
    return {m: frozenset(owned[m]) for m in members}
