"""The controller and the stores' metadata writes (replication/metadata_link.py) against
the in-memory metadata store, which has etcd's semantics (the same contract
tests run against both: test_metadata_store.py).

Goal: the decisions that must never be taken twice or on stale knowledge
are guarded — one controller at a time; a leader change, an ISR change and a
restarted store's fence each commit only on the revision they were decided
on; a dead leader is replaced from the ISR, a dead follower leaves it;
unclean election happens only when asked for and is counted; a partition
with no live in-sync replica goes offline and comes back with its last
in-sync replica; a topic grows (CreatePartitions) in one guarded
transaction, its new partitions placed as a new topic's; a stopping store
(controlled shutdown) gives the controller role up and its leaderships move
to other in-sync replicas at a new epoch with the ISR kept, while it lives.

Method: MetadataLinks of three "stores" over one MemoryMetadataStore with a
hand-driven clock; leases expire when the clock passes them.
"""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import REGISTRY

from oncelog.wire.errors import ErrorCode
from oncelog.wire.placement import stable_hash
from services.common.metadata.cluster import ClusterLayout
from services.common.metadata.store import METADATA_TXN_OPS_MAX, MemoryMetadataStore
from services.partition_store.api import NewPartitions, TopicSpec
from services.partition_store.core.replicas import (
    NO_LEADER,
    PREFERRED_LEADER_REJOIN_DELAY_MS,
    PartitionState,
    assign_replicas,
    initial_state,
)
from services.partition_store.replication.metadata_link import ClusterView, MetadataLink

LAYOUT = ClusterLayout(stores=("s0:1", "s1:1", "s2:1"), transaction_state_partitions=1,
                       consumer_offsets_partitions=1)
TTL_S = 2


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000

    def __call__(self) -> int:
        return self.now_ms


def _links(clock: Clock, *, unclean: bool = False, rebalance_interval_ms: int = 300_000,
           ) -> tuple[MemoryMetadataStore, list[MetadataLink]]:
    store = MemoryMetadataStore(clock_ms=clock)
    links = [MetadataLink(store.another_client(), layout=LAYOUT, node_id=i, lease_ttl_s=TTL_S,
                          unclean_leader_election=unclean,
                          leader_imbalance_check_interval_ms=rebalance_interval_ms,
                          clock_ms=clock) for i in range(3)]
    return store, links


async def _register_all(links: list[MetadataLink]) -> None:
    for i, link in enumerate(links):
        await link.keep_registered(f"s{i}:1")


def _unclean_total() -> float:
    return REGISTRY.get_sample_value("oncelog_store_unclean_leader_elections_total") or 0.0


async def _state(link: MetadataLink, topic: str = "t") -> PartitionState:
    view = await link.refresh()
    return view.states[(topic, 0)]


def test_one_controller_and_a_dead_leader_replaced_from_the_isr() -> None:
    async def run() -> None:
        clock = Clock()
        store, links = _links(clock)
        await _register_all(links)
        [outcome] = await links[1].create_topics([TopicSpec("t", 1, {}, 3)],
                                                 validate_only=False)
        assert outcome.error is None
        first = await _state(links[0])
        assert len(first.replicas) == 3 and first.isr == first.replicas
        # Every store tries to become controller in the same round: one wins.
        for link in links:
            await link.refresh()
        for link in links:
            await link.run_controller_once()
        controllers = {(await link.refresh()).controller for link in links}
        assert len(controllers) == 1
        controller = links[controllers.pop()]  # type: ignore[index]
        # The leader's store stops renewing; the others keep their leases.
        dead = first.leader
        clock.now_ms += (TTL_S + 1) * 1000
        for i, link in enumerate(links):
            if i != dead:
                await link.keep_registered(f"s{i}:1")
        store.expire_leases()
        if controller is links[dead]:
            # The controller died with it: another store takes over.
            for link in links:
                if link is not controller:
                    await link.refresh()
                    await link.run_controller_once()
        else:
            await controller.refresh()
            assert await controller.run_controller_once() >= 1
        after = await _state(links[(dead + 1) % 3])
        assert after.leader != dead and after.leader in first.isr
        assert after.leader_epoch == first.leader_epoch + 1
        assert dead not in after.isr

    asyncio.run(run())


def test_a_dead_follower_leaves_the_isr_and_stale_decisions_lose() -> None:
    async def run() -> None:
        clock = Clock()
        store, links = _links(clock)
        await _register_all(links)
        await links[0].create_topics([TopicSpec("t", 1, {}, 3)], validate_only=False)
        for link in links:
            await link.refresh()
        await links[0].run_controller_once()
        state = await _state(links[0])
        follower = next(r for r in state.replicas if r != state.leader)
        # A stale writer: decided on the revision before the controller's change.
        stale_revision = links[state.leader].view.state_revisions[("t", 0)]
        clock.now_ms += (TTL_S + 1) * 1000
        for i, link in enumerate(links):
            if i != follower:
                await link.keep_registered(f"s{i}:1")
        store.expire_leases()
        for link in links:
            if link is not links[follower]:
                await link.refresh()
                await link.run_controller_once()
        shrunk = await _state(links[0])
        assert follower not in shrunk.isr and shrunk.leader == state.leader
        assert shrunk.leader_epoch == state.leader_epoch
        # The leader's own ISR change on the old revision is refused.
        assert not await links[state.leader].update_state(
            "t", 0, stale_revision, PartitionState(state.replicas, state.leader,
                                                   state.leader_epoch, (state.leader,)))
        assert await _state(links[0]) == shrunk

    asyncio.run(run())


def test_offline_without_an_in_sync_replica_unless_unclean_is_asked_for() -> None:
    async def run(unclean: bool) -> PartitionState:
        clock = Clock()
        store, links = _links(clock, unclean=unclean)
        await _register_all(links)
        await links[0].create_topics([TopicSpec("t", 1, {}, 3)], validate_only=False)
        view = await links[0].refresh()
        state = view.states[("t", 0)]
        # Only the leader is in sync, then it dies.
        narrow = PartitionState(state.replicas, state.leader, state.leader_epoch,
                                (state.leader,))
        assert await links[0].update_state("t", 0, view.state_revisions[("t", 0)], narrow)
        clock.now_ms += (TTL_S + 1) * 1000
        alive = [i for i in range(3) if i != state.leader]
        for i in alive:
            await links[i].keep_registered(f"s{i}:1")
        store.expire_leases()
        for i in alive:
            await links[i].refresh()
            await links[i].run_controller_once()
        return await _state(links[alive[0]])

    before = _unclean_total()
    offline = asyncio.run(run(False))
    assert offline.leader == NO_LEADER and len(offline.isr) == 1
    assert _unclean_total() == before
    unclean = asyncio.run(run(True))
    assert unclean.leader != NO_LEADER and unclean.isr == (unclean.leader,)
    assert _unclean_total() == before + 1


def test_a_restarted_store_fences_itself_before_acting() -> None:
    async def run() -> None:
        clock = Clock()
        _store, links = _links(clock)
        await _register_all(links)
        await links[0].create_topics([TopicSpec("t", 1, {}, 3)], validate_only=False)
        state = await _state(links[0])
        leader = state.leader
        # The leader restarts (a new process: a new link, a new lease).
        again = MetadataLink(links[0].store, layout=LAYOUT, node_id=leader, lease_ttl_s=TTL_S,
                             clock_ms=clock)
        await again.keep_registered(f"s{leader}:1")
        assert await again.fence_restarted_self() == 1
        fenced = await _state(links[0])
        assert fenced.leader == NO_LEADER and leader not in fenced.isr
        assert fenced.leader_epoch == state.leader_epoch + 1
        for link in links:
            await link.refresh()
            await link.run_controller_once()
        elected = await _state(links[0])
        assert elected.leader in fenced.isr and elected.leader_epoch == state.leader_epoch + 2

    asyncio.run(run())


def test_leadership_goes_back_to_the_preferred_replica_at_the_next_imbalance_check() -> None:
    """Not when the preferred replica rejoins the ISR (every move is a leader
    change clients must follow), but at the controller's next imbalance
    check, as Kafka's auto leader rebalance does."""
    async def run() -> None:
        clock = Clock()
        interval_ms = 10_000
        _store, links = _links(clock, rebalance_interval_ms=interval_ms)
        await _register_all(links)
        await links[0].create_topics([TopicSpec("t", 1, {}, 3)], validate_only=False)
        for link in links:
            await link.refresh()
            await link.run_controller_once()
        controller = links[(await links[0].refresh()).controller]  # type: ignore[index]
        first = await _state(links[0])
        preferred = first.leader
        # The preferred leader is elsewhere and in sync again (as after a
        # failover and the store's return).
        view = await links[0].refresh()
        moved = PartitionState(first.replicas, first.replicas[1], first.leader_epoch + 1,
                               first.isr)
        assert await links[0].update_state("t", 0, view.state_revisions[("t", 0)], moved)
        async def step() -> int:
            # Less than a lease TTL, every lease renewed: one controller throughout.
            clock.now_ms += 500
            for i, link in enumerate(links):
                await link.keep_registered(f"s{i}:1")
            await controller.refresh()
            return await controller.run_controller_once()

        started_ms = clock.now_ms
        while clock.now_ms - started_ms < interval_ms - 1_000:
            assert await step() == 0
        assert await _state(links[0]) == moved, "moved back before the imbalance check"
        changed = [await step() for _ in range(4)]
        assert sorted(changed) == [0, 0, 0, 1]
        back = await _state(links[0])
        assert back.leader == preferred and back.leader_epoch == moved.leader_epoch + 1

    asyncio.run(run())


def test_a_store_that_comes_back_gets_its_preferred_leaderships_back_soon() -> None:
    """A store whose lease ended and came back leads its preferred
    partitions again within seconds once it is in sync (not at the periodic
    check minutes later), and a store that is back only a moment moves
    nothing."""
    async def run() -> None:
        clock = Clock()
        _store, links = _links(clock, rebalance_interval_ms=300_000)
        await _register_all(links)
        await links[0].create_topics([TopicSpec("t", 1, {}, 3)], validate_only=False)
        for link in links:
            await link.refresh()
            await link.run_controller_once()
        first = await _state(links[0])
        preferred = first.leader
        others = [i for i in range(3) if i != preferred]

        async def step(alive: list[int]) -> int:
            clock.now_ms += 500
            for i in alive:
                await links[i].keep_registered(f"s{i}:1")
            for i in alive:
                await links[i].refresh()
                await links[i].run_controller_once()
            return 0

        # The preferred leader's lease runs out: another replica leads.
        for _ in range(2 * TTL_S * 2 + 2):
            await step(others)
        failed_over = await _state(links[0])
        assert failed_over.leader in others and preferred not in failed_over.isr
        # It comes back, and its leader takes it into the ISR again (the
        # replica fetcher manager's job, done here by hand).
        view = await links[0].refresh()
        rejoined = PartitionState(failed_over.replicas, failed_over.leader,
                                  failed_over.leader_epoch, (*failed_over.isr, preferred))
        assert await links[0].update_state("t", 0, view.state_revisions[("t", 0)], rejoined)
        await step([0, 1, 2])
        assert (await _state(links[0])).leader == failed_over.leader, "moved at once"
        started_ms = clock.now_ms
        while (await _state(links[0])).leader != preferred:
            assert clock.now_ms - started_ms < 3 * PREFERRED_LEADER_REJOIN_DELAY_MS, \
                "the preferred leader did not get its leadership back soon"
            await step([0, 1, 2])

    asyncio.run(run())


def test_growing_a_topic_places_new_partitions_and_loses_to_a_concurrent_change() -> None:
    """CreatePartitions on a replicated cluster: one transaction writes the
    record's new count and each new partition's state, placed as a new
    topic's partitions would be with the topic's replication factor, every
    replica in sync; the existing partitions' states are left alone; a
    decision taken on a stale read of the topic loses and is taken again."""
    async def run() -> None:
        clock = Clock()
        _store, links = _links(clock)
        await _register_all(links)
        [made] = await links[0].create_topics([TopicSpec("t", 2, {}, 2)], validate_only=False)
        view = await links[0].refresh()
        # An existing partition's leader changed since creation: growing
        # must not reset it.
        moved = PartitionState(view.states[("t", 0)].replicas,
                               view.states[("t", 0)].replicas[1], 1,
                               view.states[("t", 0)].isr)
        assert await links[0].update_state("t", 0, view.state_revisions[("t", 0)], moved)

        [checked] = await links[1].create_partitions([NewPartitions("t", 4)],
                                                     validate_only=True)
        assert (checked.error, checked.topic_id) == (None, made.topic_id)
        assert (await links[1].refresh()).topics["t"].partitions == 2

        # Link 2 decides on a read taken before link 1 grows the topic to 4
        # and partition 2's leader moves: its first commit must lose.
        stale = await links[2].refresh()
        [grown] = await links[1].create_partitions([NewPartitions("t", 4)], validate_only=False)
        assert (grown.error, grown.topic_id) == (None, made.topic_id)
        view = await links[1].refresh()
        moved2 = PartitionState(view.states[("t", 2)].replicas,
                                view.states[("t", 2)].replicas[1], 1,
                                view.states[("t", 2)].isr)
        assert await links[1].update_state("t", 2, view.state_revisions[("t", 2)], moved2)
        reads: list[int] = []
        real_refresh = links[2].refresh

        async def stale_first() -> ClusterView:
            reads.append(len(reads))
            return stale if len(reads) == 1 else await real_refresh()

        links[2].refresh = stale_first  # type: ignore[method-assign]
        [again] = await links[2].create_partitions([NewPartitions("t", 6)], validate_only=False)
        assert again.error is None
        assert len(reads) == 2, "the stale decision was not refused"

        view = await links[0].refresh()
        assert view.topics["t"].partitions == 6
        assert view.topics["t"].topic_id == made.topic_id
        placed = assign_replicas(first_store_index=stable_hash("t"), partitions=6,
                                 stores=[0, 1, 2], replication_factor=2)
        assert view.states[("t", 0)] == moved
        assert view.states[("t", 2)] == moved2
        for p in (1, 3, 4, 5):
            assert view.states[("t", p)] == initial_state(placed[p]), p
        # Shrinking and an unknown topic are refused; nothing changes.
        outcomes = await links[0].create_partitions(
            [NewPartitions("t", 3), NewPartitions("nowhere", 3), NewPartitions("t", 9)],
            validate_only=False)
        assert [o.error.code if o.error else None for o in outcomes] == [
            ErrorCode.INVALID_REQUEST, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            ErrorCode.INVALID_REQUEST]
        [smaller] = await links[0].create_partitions([NewPartitions("t", 3)],
                                                     validate_only=False)
        assert smaller.error is not None and smaller.error.code == ErrorCode.INVALID_PARTITIONS
        assert "has 6 partitions; 3 would not be an increase" in smaller.error.message
        assert (await links[0].refresh()).topics["t"].partitions == 6

    asyncio.run(run())


def test_growing_by_more_partitions_than_one_transaction_holds_goes_in_whole_steps() -> None:
    """etcd takes at most METADATA_TXN_OPS_MAX writes per transaction (the
    memory store enforces the same): 1 -> 300 partitions lands as several
    growths, each with its record and its partitions' states, and ends with
    every partition placed."""
    async def run() -> None:
        clock = Clock()
        _store, links = _links(clock)
        await _register_all(links)
        [made] = await links[0].create_topics([TopicSpec("wide", 1, {}, 3)],
                                              validate_only=False)
        counts: list[int] = []
        client = links[1].store
        real_commit = client.commit

        async def watching(*args: Any, **kwargs: Any) -> bool:
            done = await real_commit(*args, **kwargs)
            counts.append((await links[0].refresh()).topics["wide"].partitions)
            return done

        client.commit = watching  # type: ignore[method-assign]
        [grown] = await links[1].create_partitions([NewPartitions("wide", 300)],
                                                   validate_only=False)
        client.commit = real_commit  # type: ignore[method-assign]
        assert (grown.error, grown.topic_id) == (None, made.topic_id)
        assert len(counts) == 3 and counts[-1] == 300, counts
        steps = [b - a for a, b in zip([1, *counts], counts, strict=False)]
        step = METADATA_TXN_OPS_MAX - 1
        assert steps == [step, step, 300 - 1 - 2 * step], steps
        view = await links[0].refresh()
        placed = assign_replicas(first_store_index=stable_hash("wide"), partitions=300,
                                 stores=[0, 1, 2], replication_factor=3)
        assert sorted(p for t, p in view.states if t == "wide") == list(range(300))
        assert all(view.states[("wide", p)] == initial_state(placed[p]) for p in range(300))

    asyncio.run(run())


def test_a_stopping_store_gives_up_the_controller_role_and_its_leaderships_move() -> None:
    """Kafka's controlled shutdown, the metadata side: the stopping store
    (here the controller) resigns and asks; the next controller moves every
    partition it leads to another in-sync replica at the next epoch with the
    ISR unchanged (it still copies as a follower), keeps the one it leads
    alone, gives it nothing back while it stops (not even at an imbalance
    check), and the request ends with its lease."""
    async def run() -> None:
        clock = Clock()
        interval_ms = 1_000
        _store, links = _links(clock, rebalance_interval_ms=interval_ms)
        await _register_all(links)
        await links[0].create_topics([TopicSpec("t", 3, {}, 3)], validate_only=False)
        for link in links:
            await link.refresh()
            await link.run_controller_once()
        stopping = (await links[0].refresh()).controller
        assert stopping is not None
        before = {key: s for key, s in (await links[0].refresh()).states.items()
                  if key[0] == "t"}
        led = sorted(key for key, s in before.items() if s.leader == stopping)
        assert len(led) == 1  # three partitions spread over three stores
        # A second partition it leads whose followers fell out of the ISR.
        view = await links[0].refresh()
        alone_key = next(key for key, s in before.items() if s.leader != stopping)
        alone = PartitionState(before[alone_key].replicas, stopping,
                               before[alone_key].leader_epoch + 1, (stopping,))
        assert await links[0].update_state(*alone_key, view.state_revisions[alone_key], alone)

        await links[stopping].begin_controlled_shutdown()
        view = await links[0].refresh()
        assert view.controller is None and view.shutting_down == {stopping}
        others = [link for i, link in enumerate(links) if i != stopping]

        async def step() -> None:
            clock.now_ms += 500
            for i, link in enumerate(links):
                await link.keep_registered(f"s{i}:1")
            for link in links:
                await link.refresh()
                await link.run_controller_once()

        await step()
        view = await links[0].refresh()
        assert view.controller in {i for i in range(3) if i != stopping}
        for key in led:
            moved = view.states[key]
            assert moved.leader != stopping and moved.leader in before[key].isr
            assert moved.leader_epoch == before[key].leader_epoch + 1
            assert moved.isr == before[key].isr  # shrinking nothing
        assert view.states[alone_key] == alone  # no other in-sync replica: it stays
        now_led = {key: s for key, s in view.states.items() if s.leader == stopping}
        assert links[stopping].leaderships_to_hand_over(now_led) == []
        # It never takes the role back, and the imbalance check (its
        # preferred partitions are led elsewhere) gives it nothing back.
        for _ in range(4):
            await step()
        view = await links[0].refresh()
        assert view.controller != stopping
        assert {key for key, s in view.states.items() if s.leader == stopping} == {alone_key}
        # The request lives and dies with its lease: the stopping store ends.
        await links[stopping].close()
        await others[0].refresh()
        assert others[0].view.shutting_down == set()

    asyncio.run(run())
