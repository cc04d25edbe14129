"""A follower on its way back into the ISR holds the high watermark from the
moment its leader asks for it, on a real store runtime (in memory) in
replicated mode with the metadata in the in-memory metadata store.

Goal: no acknowledged record is lost when the controller elects a follower
the leader has just added to the ISR. The mixed-fault soak lost seven
acknowledged records that way: store 2 led with ISR {2, 0}, wrote store 1's
return into the ISR, and went on computing its HW over {2, 0} until its
own view caught up; the HW passed store 1's log end; then store 2 was cut
from etcd, the controller elected store 1 from the new ISR, and the other
replicas truncated to its log end. Kafka's rule (KIP-497, the "maximal
ISR") is the fix: from the moment the leader asks, the HW waits for the
followers it asked to add, until the outcome is its state.

Method: store 1 leads with ISR {1, 2}; store 0 has fetched up to offset 3
(the HW) and asks to rejoin; three more records are written. The ISR
change is made by the replica fetcher manager's own ISR pass, with the metadata
write held open while store 2 fetches everything: the HW must stay at
store 0's end (3), not move to 6. After the new state is applied, store 0
fetching the log end moves the HW to 6. A refused write (the revision
moved) gives the HW back to the ISR it has.
"""

from __future__ import annotations

import asyncio
from typing import Any

from oncelog.wire.records import encode_batch
from services.common.metadata.cluster import ClusterLayout
from services.common.metadata.store import MemoryMetadataStore
from services.partition_store.api import ProduceItem, ReplicaFetchItem, TopicSpec
from services.partition_store.core.replicas import PartitionState
from services.partition_store.replication.fetcher import ReplicaFetcherManager
from services.partition_store.replication.metadata_link import MetadataLink
from services.partition_store.runtime import StoreConfig, StoreRuntime
from services.partition_store.storage.memory import MemoryStore

LAYOUT = ClusterLayout(stores=("s0:1", "s1:1", "s2:1"), transaction_state_partitions=1,
                       consumer_offsets_partitions=1)
NOW_MS = 1_700_000_000_000
LEADER, REJOINING, IN_SYNC = 1, 0, 2


async def _started() -> tuple[StoreRuntime, MetadataLink, ReplicaFetcherManager]:
    store = MemoryMetadataStore(clock_ms=lambda: NOW_MS)
    link = MetadataLink(store, layout=LAYOUT, node_id=LEADER, clock_ms=lambda: NOW_MS)
    runtime = StoreRuntime(
        MemoryStore(), StoreConfig(node_id=LEADER, layout=LAYOUT, replicated=True),
        controller=link, clock_ms=lambda: NOW_MS)
    await runtime.start()
    await link.keep_registered("s1:1")
    # The rejoining store is alive (registered), as the ISR pass requires.
    other = MetadataLink(store, layout=LAYOUT, node_id=REJOINING, clock_ms=lambda: NOW_MS)
    await other.keep_registered("s0:1")
    [created] = await link.create_topics(
        [TopicSpec("t", 1, {"min.insync.replicas": "1"}, 3)], validate_only=False)
    assert created.error is None
    view = await link.refresh()
    assert await link.update_state("t", 0, view.state_revisions[("t", 0)],
                                   PartitionState((0, 1, 2), LEADER, 1, (1, 2)))
    await runtime.refresh_catalog()
    await link.refresh()
    # Its leader link is never used: the test drives the ISR pass alone.
    manager = ReplicaFetcherManager(runtime, link, leaders=None,  # type: ignore[arg-type]
                             address="s1:1")
    return runtime, link, manager


async def _produce(runtime: StoreRuntime, count: int) -> None:
    batch = encode_batch([(None, b"v%d" % i, None, NOW_MS) for i in range(count)])
    [outcome] = await runtime.produce([ProduceItem("t", 0, batch)], timeout_ms=0)
    assert outcome.error is None, outcome.error


async def _replica_fetch(runtime: StoreRuntime, replica: int, offset: int) -> None:
    [out] = await runtime.replica_fetch(
        replica, [ReplicaFetchItem("t", 0, offset, current_leader_epoch=1)], max_wait_ms=0)
    assert out.error is None, out.error


async def _three_written_and_a_follower_asking_to_rejoin(runtime: StoreRuntime) -> None:
    produced = asyncio.ensure_future(_produce(runtime, 3))
    await asyncio.sleep(0.05)
    await _replica_fetch(runtime, IN_SYNC, 3)
    await produced
    # Store 0 holds what the ISR holds (the HW, 3): it may rejoin, and asks.
    await _replica_fetch(runtime, REJOINING, 3)
    # Three more, acknowledged by nobody yet: only store 2 will fetch them.
    asyncio.ensure_future(_produce(runtime, 3))
    await asyncio.sleep(0.05)
    assert runtime.partition("t", 0).log.log_end_offset == 6


def test_a_follower_being_added_to_the_isr_holds_the_high_watermark() -> None:
    async def run() -> None:
        runtime, link, manager = await _started()
        leader = runtime.partition("t", 0)
        await _three_written_and_a_follower_asking_to_rejoin(runtime)
        write = link.update_state
        seen: list[int] = []

        async def update_state(*args: Any, **kwargs: Any) -> bool:
            # While the write is on its way, store 2 copies everything.
            await _replica_fetch(runtime, IN_SYNC, 6)
            seen.append(leader.log.high_watermark)
            return await write(*args, **kwargs)

        link.update_state = update_state  # type: ignore[method-assign]
        assert await manager._maintain_isr()
        assert seen == [3], "the HW passed the log end of a follower joining the ISR"
        assert leader.log.high_watermark == 3
        await runtime.refresh_catalog()
        assert leader.state.isr == (0, 1, 2) and not leader.isr_additions_in_flight
        await _replica_fetch(runtime, REJOINING, 6)
        assert leader.log.high_watermark == 6
        await runtime.close()

    asyncio.run(run())


def test_a_refused_isr_change_gives_the_high_watermark_back() -> None:
    async def run() -> None:
        runtime, link, manager = await _started()
        leader = runtime.partition("t", 0)
        await _three_written_and_a_follower_asking_to_rejoin(runtime)

        async def refused(*args: Any, **kwargs: Any) -> bool:
            await _replica_fetch(runtime, IN_SYNC, 6)
            assert leader.log.high_watermark == 3
            return False  # the revision moved: nothing was written

        link.update_state = refused  # type: ignore[method-assign]
        assert not await manager._maintain_isr()
        assert leader.state.isr == (1, 2) and not leader.isr_additions_in_flight
        assert leader.log.high_watermark == 6
        await runtime.close()

    asyncio.run(run())
