"""A follower one fetch behind a partition written all the time stays in
the ISR; one that stops copying leaves it.

Goal: Kafka's rule for when a follower was last caught up
(replica.lag.time.max.ms), on a real store runtime. Under steady load a
follower never asks from the leader's log end itself — by the time its
next fetch arrives, more has been appended — yet it copied everything
there was when it last asked. Judged only by "asked from the log end", it
left the ISR after the lag time (30 s) under any steady load, and with
min.insync.replicas 2 the leader then refused every write
(NOT_ENOUGH_REPLICAS): at 1,000 partitions and four producers the
producers spent most of a run retrying that (bench/scale.py's partitions
case, docs/performance.md).

Method: the leader's runtime in memory (replicated mode, the metadata in the
in-memory metadata store) with a clock the test moves. For 60 simulated
seconds a batch is appended every second; follower 1 then fetches from where
the log ended at its previous fetch (one round behind), follower 2 never
copies anything. The leader's own shrink decision
(core/replicas.py's lagging_followers, with the partition's fields, as the
replica manager calls it) must name follower 2 and not follower 1.
"""

from __future__ import annotations

import asyncio

from oncelog.wire.records import encode_batch
from services.common.metadata.cluster import ClusterLayout
from services.common.metadata.store import MemoryMetadataStore
from services.partition_store.api import ProduceItem, ReplicaFetchItem, TopicSpec
from services.partition_store.core.replicas import (
    FollowerFetch,
    PartitionState,
    caught_up_ms,
    lagging_followers,
)
from services.partition_store.replication.metadata_link import MetadataLink
from services.partition_store.runtime import StoreConfig, StoreRuntime
from services.partition_store.storage.memory import MemoryStore

LAYOUT = ClusterLayout(stores=("s0:1", "s1:1", "s2:1"), transaction_state_partitions=1,
                       consumer_offsets_partitions=1)
START_MS = 1_700_000_000_000
LAG_TIME_MAX_MS = 30_000
SECONDS = 60


def test_caught_up_at_the_log_end_or_at_where_it_ended_at_the_previous_fetch() -> None:
    before = FollowerFetch(leader_end_offset=10, at_ms=1_000)
    # From the log end: caught up now.
    assert caught_up_ms(fetch_offset=12, leader_end_offset=12, now_ms=2_000,
                        previous=before) == 2_000
    # Behind the log end, but at least where it ended at the previous fetch.
    assert caught_up_ms(fetch_offset=10, leader_end_offset=12, now_ms=2_000,
                        previous=before) == 1_000
    # Behind both: no news.
    assert caught_up_ms(fetch_offset=9, leader_end_offset=12, now_ms=2_000,
                        previous=before) is None
    # A first fetch behind the log end says nothing yet.
    assert caught_up_ms(fetch_offset=10, leader_end_offset=12, now_ms=2_000,
                        previous=None) is None


def test_a_follower_one_round_behind_stays_in_sync_and_a_stuck_one_leaves() -> None:
    async def run() -> None:
        clock_ms = [START_MS]
        link = MetadataLink(MemoryMetadataStore(clock_ms=lambda: clock_ms[0]), layout=LAYOUT,
                            node_id=0, clock_ms=lambda: clock_ms[0])
        runtime = StoreRuntime(
            MemoryStore(), StoreConfig(node_id=0, layout=LAYOUT, replicated=True),
            controller=link, clock_ms=lambda: clock_ms[0])
        await runtime.start()
        await link.keep_registered("s0:1")
        [created] = await link.create_topics(
            [TopicSpec("t", 1, {"min.insync.replicas": "2"}, 3)], validate_only=False)
        assert created.error is None
        view = await link.refresh()
        assert await link.update_state("t", 0, view.state_revisions[("t", 0)],
                                       PartitionState((0, 1, 2), 0, 1, (0, 1, 2)))
        await runtime.refresh_catalog()
        leader = runtime.partition("t", 0)
        assert leader.is_leader
        # Answered only once follower 2 copies them, which it never does.
        pending: list[asyncio.Future[object]] = []
        fetch_from = 0  # follower 1's log end: what it got at its previous fetch
        for second in range(SECONDS):
            clock_ms[0] = START_MS + second * 1000
            end_before = leader.log.durable_end_offset
            pending.append(asyncio.ensure_future(runtime.produce(
                [ProduceItem("t", 0, encode_batch([(None, b"r%d" % second, None,
                                                    clock_ms[0])]))],
                timeout_ms=SECONDS * 1000)))
            while leader.log.durable_end_offset == end_before:
                await asyncio.sleep(0.001)  # the group commit
            clock_ms[0] += 500
            # Follower 1 asks from its end, one batch short of the log end.
            [answer] = await runtime.replica_fetch(
                1, [ReplicaFetchItem("t", 0, fetch_from, current_leader_epoch=1)],
                max_wait_ms=0)
            assert answer.error is None and answer.batches
            fetch_from = leader.log.durable_end_offset
        assert fetch_from == SECONDS
        lagging = lagging_followers(
            isr=leader.state.isr, leader=0, last_caught_up_ms=leader.last_caught_up_ms,
            now_ms=clock_ms[0], lag_time_max_ms=LAG_TIME_MAX_MS,
            follower_end_offsets=leader.follower_end_offsets,
            leader_end_offset=leader.log.durable_end_offset)
        assert lagging == {2}
        for future in pending:
            future.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await runtime.close()

    asyncio.run(run())
