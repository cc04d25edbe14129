"""The replica decisions of core/replicas.py: placement, leader election, ISR
changes, the high watermark and leader-epoch checks, and the moves of a
controlled shutdown.

Goal: each rule of Kafka's in-sync-replica protocol that the controller and
the leaders apply holds case by case, including the ones that decide whether
an acknowledged record can be lost (who may lead, when the HW may move).

Method: tables of (state, input, expected) run through the pure functions.
"""

from __future__ import annotations

import pytest

from services.partition_store.core.replicas import (
    NO_LEADER,
    PartitionState,
    ReplicaStateError,
    assign_replicas,
    begin_reassignment,
    check_leader_epoch,
    default_replication_factor,
    effective_min_insync,
    elect_leader,
    elect_preferred,
    expand_isr,
    fence_replica,
    high_watermark,
    in_sync_everywhere,
    initial_state,
    is_unclean,
    lagging_followers,
    leaderships_to_hand_over,
    move_leader_off,
    plan_preferred_elections,
    replication_factor_of,
    shrink_isr,
)


def _state(replicas: tuple[int, ...], leader: int, epoch: int,
           isr: tuple[int, ...]) -> PartitionState:
    return PartitionState(replicas, leader, epoch, isr)


def test_replication_factor_of_a_partition_being_moved_is_its_target() -> None:
    assert replication_factor_of(_state((0, 1), 0, 0, (0, 1))) == 2
    moving = begin_reassignment(_state((0, 1), 0, 0, (0, 1)), (2, 3, 4))
    assert len(moving.replicas) == 5
    assert replication_factor_of(moving) == 3


def test_placement_spreads_leaders_and_copies() -> None:
    lists = assign_replicas(first_store_index=1, partitions=4, stores=[0, 1, 2],
                            replication_factor=3)
    assert lists == [(1, 2, 0), (2, 0, 1), (0, 1, 2), (1, 2, 0)]
    assert assign_replicas(first_store_index=0, partitions=2, stores=[2, 0, 1],
                           replication_factor=2) == [(0, 1), (1, 2)]
    with pytest.raises(ValueError, match="replication factor 4"):
        assign_replicas(first_store_index=0, partitions=1, stores=[0, 1, 2],
                        replication_factor=4)
    # Partitions added to a topic (CreatePartitions) are placed as if the
    # topic had been created with them.
    assert assign_replicas(first_store_index=1, partitions=2, stores=[0, 1, 2],
                           replication_factor=3, first_partition=2) == lists[2:]
    assert assign_replicas(first_store_index=1, partitions=3, stores=[0, 1, 2, 3],
                           replication_factor=2, first_partition=5) == [(2, 3), (3, 0), (0, 1)]
    assert [default_replication_factor(n) for n in (1, 2, 3, 5)] == [1, 2, 3, 3]
    assert [effective_min_insync(2, rf) for rf in (1, 2, 3)] == [1, 2, 2]
    assert initial_state((2, 0, 1)) == _state((2, 0, 1), 2, 0, (2, 0, 1))


@pytest.mark.parametrize(
    ("state", "live", "unclean", "expected"),
    [
        # The leader is alive: nothing to do.
        (_state((0, 1, 2), 0, 3, (0, 1, 2)), {0, 1, 2}, False, None),
        # Leader gone: the first live ISR member in replica order, epoch + 1,
        # dead members leave the ISR.
        (_state((0, 1, 2), 0, 3, (0, 1, 2)), {1, 2}, False, _state((0, 1, 2), 1, 4, (1, 2))),
        (_state((0, 1, 2), 0, 3, (0, 2)), {1, 2}, False, _state((0, 1, 2), 2, 4, (2,))),
        # Only an out-of-sync replica is alive: offline (ISR kept), unless unclean.
        (_state((0, 1, 2), 0, 3, (0,)), {1, 2}, False,
         _state((0, 1, 2), NO_LEADER, 4, (0,))),
        (_state((0, 1, 2), 0, 3, (0,)), {2}, True, _state((0, 1, 2), 2, 4, (2,))),
        # Offline stays offline (no epoch churn) until an ISR member returns.
        (_state((0, 1, 2), NO_LEADER, 4, (0,)), {1, 2}, False, None),
        (_state((0, 1, 2), NO_LEADER, 4, (0,)), {0, 1}, False, _state((0, 1, 2), 0, 5, (0,))),
    ],
)
def test_leader_election(state: PartitionState, live: set[int], unclean: bool,
                         expected: PartitionState | None) -> None:
    after = elect_leader(state, live, unclean=unclean)
    assert after == expected
    if after is not None and after.online:
        assert is_unclean(state, after) is (after.leader not in state.isr)


def test_preferred_leader_election_needs_the_preferred_in_sync() -> None:
    moved = _state((0, 1, 2), 1, 4, (1, 2, 0))
    assert elect_preferred(moved, {0, 1, 2}) == _state((0, 1, 2), 0, 5, (1, 2, 0))
    assert elect_preferred(_state((0, 1, 2), 1, 4, (1, 2)), {0, 1, 2}) is None
    assert elect_preferred(moved, {1, 2}) is None
    assert elect_preferred(_state((0, 1, 2), 0, 4, (0, 1)), {0, 1, 2}) is None


def test_leadership_moves_back_only_to_stores_above_the_imbalance_threshold() -> None:
    # Store 0 prefers p0..p9 and leads 9 of them (10 % led elsewhere: not
    # above the threshold); store 1 prefers p10, p11 and leads neither.
    states = {f"p{i}": _state((0, 1, 2), 0, 1, (0, 1, 2)) for i in range(9)}
    states["p9"] = _state((0, 1, 2), 1, 2, (0, 1, 2))
    states["p10"] = _state((1, 2, 0), 2, 3, (1, 2, 0))
    states["p11"] = _state((1, 2, 0), 0, 3, (2, 0))      # 1 not in sync
    states["p12"] = _state((2, 0, 1), NO_LEADER, 4, (2,))  # offline: not counted
    plan = plan_preferred_elections(states, {0, 1, 2}, imbalance_pct=10)
    assert plan == {"p10": _state((1, 2, 0), 1, 4, (1, 2, 0))}
    assert set(plan_preferred_elections(states, {0, 1, 2}, imbalance_pct=9)) == {"p9", "p10"}
    assert plan_preferred_elections(states, {0, 2}, imbalance_pct=0) == {
        "p9": _state((0, 1, 2), 0, 3, (0, 1, 2))}


@pytest.mark.parametrize(
    ("state", "leaving", "live", "expected"),
    [
        # The first other in-sync replica in replica order leads at the next
        # epoch; the ISR stays whole, the stopping leader in it.
        (_state((0, 1, 2), 0, 3, (0, 1, 2)), {0}, {0, 1, 2}, _state((0, 1, 2), 1, 4, (0, 1, 2))),
        (_state((0, 1, 2), 0, 3, (0, 2)), {0}, {0, 1, 2}, _state((0, 1, 2), 2, 4, (0, 2))),
        # Not a dead store, not another store that is stopping too.
        (_state((0, 1, 2), 0, 3, (0, 1, 2)), {0}, {0, 2}, _state((0, 1, 2), 2, 4, (0, 1, 2))),
        (_state((0, 1, 2), 0, 3, (0, 1, 2)), {0, 1}, {0, 1, 2},
         _state((0, 1, 2), 2, 4, (0, 1, 2))),
        # No other in-sync replica that could lead: the partition stays.
        (_state((0, 1, 2), 0, 3, (0,)), {0}, {0, 1, 2}, None),
        (_state((0, 1, 2), 0, 3, (0, 1, 2)), {0, 1, 2}, {0, 1, 2}, None),
        (_state((0, 1, 2), 0, 3, (0, 1)), {0}, {0, 2}, None),
        # The leader is not stopping; an offline partition has nobody to move.
        (_state((0, 1, 2), 1, 3, (0, 1, 2)), {0}, {0, 1, 2}, None),
        (_state((0, 1, 2), NO_LEADER, 3, (0,)), {0}, {0, 1, 2}, None),
    ],
)
def test_controlled_shutdown_moves_leadership_to_another_in_sync_replica(
        state: PartitionState, leaving: set[int], live: set[int],
        expected: PartitionState | None) -> None:
    assert move_leader_off(state, leaving, live) == expected


def test_a_stopping_store_waits_only_for_what_can_move() -> None:
    states = {
        "moves": _state((0, 1, 2), 0, 1, (0, 1, 2)),
        "alone": _state((0, 1, 2), 0, 1, (0,)),
        "elsewhere": _state((1, 2, 0), 1, 1, (1, 2, 0)),
        "follower-dead": _state((0, 1), 0, 1, (0, 1)),
    }
    assert leaderships_to_hand_over(states, 0, live={0, 1, 2}, leaving=()) == [
        "moves", "follower-dead"]
    # The one whose only other in-sync replica is gone (or stopping) stays.
    assert leaderships_to_hand_over(states, 0, live={0, 2}, leaving=()) == ["moves"]
    assert leaderships_to_hand_over(states, 0, live={0, 1, 2}, leaving={1, 2}) == []


def test_in_sync_everywhere_counts_partitions_that_can_be_in_sync() -> None:
    caught_up = [_state((0, 1, 2), 0, 1, (0, 1, 2)), _state((1, 2), 1, 1, (1,))]
    assert in_sync_everywhere(caught_up, 0)
    assert not in_sync_everywhere([*caught_up, _state((2, 0, 1), 2, 4, (2, 1))], 0)
    # Offline (nobody to copy from) or being moved here: not waited for.
    assert in_sync_everywhere([*caught_up, _state((2, 0, 1), NO_LEADER, 4, (2,))], 0)
    moving = PartitionState((1, 0, 2), 1, 2, (1, 2), target=(1, 0))
    assert in_sync_everywhere([*caught_up, moving], 0)


def test_isr_changes_never_drop_the_leader_and_keep_replica_order() -> None:
    state = _state((0, 1, 2), 1, 2, (0, 1, 2))
    assert shrink_isr(state, {0, 1}) == _state((0, 1, 2), 1, 2, (1, 2))
    assert shrink_isr(state, set()) is None
    small = _state((0, 1, 2), 1, 2, (1,))
    assert expand_isr(small, 2) == _state((0, 1, 2), 1, 2, (1, 2))
    assert expand_isr(_state((0, 1, 2), 1, 2, (1, 2)), 0) == state
    assert expand_isr(state, 0) is None
    assert expand_isr(state, 7) is None


@pytest.mark.parametrize(
    ("current", "leader_end", "isr", "ends", "expected"),
    [
        (0, 10, (0,), {}, 10),                 # alone in the ISR: its durable end
        (0, 10, (0, 1, 2), {1: 7, 2: 9}, 7),   # the least over the ISR
        (8, 10, (0, 1, 2), {1: 7, 2: 9}, 8),   # never back
        (3, 10, (0, 1), {}, 3),                # a member that has not fetched holds it
        (0, 10, (0, 1), {1: 12, 2: 0}, 10),    # a follower cannot be ahead; outsiders ignored
    ],
)
def test_high_watermark(current: int, leader_end: int, isr: tuple[int, ...],
                        ends: dict[int, int], expected: int) -> None:
    assert high_watermark(current=current, leader=0, leader_end_offset=leader_end, isr=isr,
                          follower_end_offsets=ends) == expected


def test_lagging_followers() -> None:
    assert lagging_followers(isr=(0, 1, 2), leader=0, last_caught_up_ms={1: 100, 2: 900},
                             now_ms=1_000, lag_time_max_ms=500) == {1}
    # A follower never heard from since the leader took over counts from then.
    assert lagging_followers(isr=(0, 1), leader=0, last_caught_up_ms={}, now_ms=1_000,
                             lag_time_max_ms=500) == set()
    # One that holds the leader's whole log stays, however long ago it last
    # fetched (an idle partition's follower sends nothing for it); one short
    # of it by one offset leaves.
    assert lagging_followers(isr=(0, 1, 2), leader=0, last_caught_up_ms={1: 0, 2: 0},
                             now_ms=60_000, lag_time_max_ms=500,
                             follower_end_offsets={1: 40, 2: 39},
                             leader_end_offset=40) == {2}


def test_leader_epoch_checks() -> None:
    assert check_leader_epoch(known=None, current=4) is None
    assert check_leader_epoch(known=-1, current=4) is None
    assert check_leader_epoch(known=4, current=4) is None
    assert check_leader_epoch(known=3, current=4) == "fenced"
    assert check_leader_epoch(known=5, current=4) == "unknown"


@pytest.mark.parametrize(
    "bad",
    [
        dict(replicas=(), leader=0, leader_epoch=0, isr=()),
        dict(replicas=(0, 0), leader=0, leader_epoch=0, isr=(0,)),
        dict(replicas=(0, 1), leader=2, leader_epoch=0, isr=(0, 1)),
        dict(replicas=(0, 1), leader=1, leader_epoch=0, isr=(0,)),
        dict(replicas=(0, 1), leader=0, leader_epoch=0, isr=(0, 3)),
        dict(replicas=(0, 1), leader=0, leader_epoch=-1, isr=(0,)),
    ],
)
def test_states_that_break_the_rules_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ReplicaStateError):
        PartitionState(**bad)  # type: ignore[arg-type]


def test_json_round_trip_and_garbage() -> None:
    state = _state((2, 0, 1), 0, 7, (0, 2))
    assert PartitionState.from_json(state.to_json()) == state
    for text in ("", "{}", '{"replicas": [0], "leader": "x", "leader_epoch": 0, "isr": [0]}'):
        with pytest.raises(ReplicaStateError):
            PartitionState.from_json(text)


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        # A restarted follower leaves the ISR; the leader stays.
        (_state((0, 1, 2), 0, 4, (0, 1, 2)), _state((0, 1, 2), 0, 4, (0, 2))),
        # A restarted leader: a new epoch, no leader, for the controller to fill.
        (_state((1, 0, 2), 1, 4, (1, 0, 2)), _state((1, 0, 2), NO_LEADER, 5, (0, 2))),
        # The only in-sync copy stays in the ISR; as leader, the epoch moves on.
        (_state((1, 0, 2), 1, 4, (1,)), _state((1, 0, 2), NO_LEADER, 5, (1,))),
        (_state((0, 1, 2), NO_LEADER, 4, (1,)), None),
        # Not in the ISR: nothing to do.
        (_state((0, 1, 2), 0, 4, (0, 2)), None),
    ],
)
def test_a_restarted_replica_is_fenced(state: PartitionState,
                                       expected: PartitionState | None) -> None:
    assert fence_replica(state, 1) == expected
