"""Where a state partition's coordinator is (ClusterLayout).

Goal: coordinators of their own, or in only some stores, own what the
layout gives them (p % coordinators), wherever the partition is led. With a
coordinator of a kind in every store, the coordinator of a partition is
the one in the store that leads it now, and none while nobody leads it
(a retriable COORDINATOR_NOT_AVAILABLE). A question for every coordinator
(a listing) goes to all of them, or, where they follow leadership and the
live stores are known, to those in live stores, and to all of them when no
store is live in the asker's view.

Method: layouts built by hand; `leader_of` is a dict lookup.
"""

from __future__ import annotations

import asyncio

import pytest

from oncelog.errors import ErrorCode
from oncelog.wire.placement import store_of_coordinator, store_of_group_coordinator
from services.common.kernel.errors import ServiceError
from services.common.metadata.cluster import (
    CONSUMER_OFFSETS_TOPIC,
    TRANSACTION_STATE_TOPIC,
    ClusterLayout,
    LeaderOf,
)

STORES = ("s0:1", "s1:1", "s2:1")


def in_stores() -> ClusterLayout:
    """One coordinator of each kind per store, placed as LocalCluster and
    the Helm chart place them."""
    return ClusterLayout(
        stores=STORES,
        coordinators=tuple(STORES[store_of_coordinator(c, 3)] for c in range(3)),
        group_coordinators=tuple(STORES[store_of_group_coordinator(g, 3)] for g in range(3)),
        transaction_state_partitions=6, consumer_offsets_partitions=6)


def leaders(by_partition: dict[tuple[str, int], int]) -> LeaderOf:
    async def leader_of(topic: str, partition: int) -> int:
        return by_partition.get((topic, partition), -1)
    return leader_of


def test_coordinators_of_their_own_keep_the_layouts_owner() -> None:
    layout = ClusterLayout(stores=STORES, coordinators=("c0:1", "c1:1"),
                           group_coordinators=("g0:1",), transaction_state_partitions=4)
    assert not layout.coordinators_follow_leaders
    assert not layout.group_coordinators_follow_leaders
    led_by_2 = leaders({(TRANSACTION_STATE_TOPIC, 3): 2, (CONSUMER_OFFSETS_TOPIC, 0): 2})
    assert asyncio.run(layout.coordinator_now(3, led_by_2)) == 1
    assert asyncio.run(layout.group_coordinator_now(0, led_by_2)) == 0
    assert layout.coordinators_to_ask({0}) == [0, 1]


def test_a_coordinator_in_only_some_stores_keeps_the_layouts_owner() -> None:
    layout = ClusterLayout(stores=STORES, coordinators=(STORES[1],))
    assert not layout.coordinators_follow_leaders
    assert asyncio.run(layout.coordinator_now(
        2, leaders({(TRANSACTION_STATE_TOPIC, 2): 0}))) == 0


def test_a_coordinator_in_every_store_is_where_its_partition_is_led() -> None:
    layout = in_stores()
    assert layout.coordinators_follow_leaders and layout.group_coordinators_follow_leaders
    for partition in range(6):
        preferred = store_of_coordinator(layout.coordinator_for_partition(partition), 3)
        # Led by its preferred store: the layout's owner.
        at_home = leaders({(TRANSACTION_STATE_TOPIC, partition): preferred})
        assert asyncio.run(layout.coordinator_now(partition, at_home)) == (
            layout.coordinator_for_partition(partition))
        # Led elsewhere: the coordinator in that store.
        other = (preferred + 1) % 3
        moved = leaders({(TRANSACTION_STATE_TOPIC, partition): other})
        node = asyncio.run(layout.coordinator_now(partition, moved))
        assert layout.coordinators[node] == STORES[other]
        group_moved = leaders({(CONSUMER_OFFSETS_TOPIC, partition): other})
        group_node = asyncio.run(layout.group_coordinator_now(partition, group_moved))
        assert layout.group_coordinators[group_node] == STORES[other]


def test_no_leader_means_no_coordinator_for_now() -> None:
    layout = in_stores()
    with pytest.raises(ServiceError) as raised:
        asyncio.run(layout.coordinator_now(1, leaders({})))
    assert raised.value.code is ErrorCode.COORDINATOR_NOT_AVAILABLE
    assert f"{TRANSACTION_STATE_TOPIC}-1" in raised.value.message
    # A store the layout does not list (one that joined later) runs none.
    with pytest.raises(ServiceError):
        asyncio.run(layout.coordinator_now(1, leaders({(TRANSACTION_STATE_TOPIC, 1): 7})))


def test_a_listing_asks_the_coordinators_of_live_stores() -> None:
    layout = in_stores()
    assert layout.coordinators_to_ask(None) == [0, 1, 2]
    dead = store_of_coordinator(1, 3)
    live = {s for s in range(3) if s != dead}
    assert layout.coordinators_to_ask(live) == [0, 2]
    group_dead = store_of_group_coordinator(2, 3)
    assert layout.group_coordinators_to_ask(
        {s for s in range(3) if s != group_dead}) == [0, 1]
    # Nobody live in this view: every one, rather than none.
    assert layout.coordinators_to_ask(set()) == [0, 1, 2]
