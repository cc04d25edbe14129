"""A follower's truncation, on a real store runtime (in memory), with the
metadata in the in-memory metadata store.

Goal: two faults the Jepsen-style chaos run found stay fixed.
1. Divergent logs need not share batch boundaries: a truncation offset that
   falls inside a batch removes that batch whole (as Kafka does); before, the
   batch stayed, the log never shrank, and the follower stalled for good.
2. A replica made leader while its truncation waits for the disk must not
   take appends that the truncation then deletes (replicas then disagreed
   below the high watermark and a committed transaction was lost): the
   partition is out of service until it is reopened, then leads with the
   truncated log.

Method: a StoreRuntime (node 1 of 3) in replicated mode; the partition's
state is written to the metadata store by hand; the leader's batches are
handed to append_replicated as a follower would receive them.
"""

from __future__ import annotations

import asyncio

import pytest

from oncelog.wire.errors import ErrorCode
from oncelog.wire.records import encode_batch, stamp_batch
from services.common.kernel.errors import ServiceError
from services.common.metadata.cluster import ClusterLayout
from services.common.metadata.store import MemoryMetadataStore
from services.partition_store.api import ProduceItem, TopicSpec
from services.partition_store.core.replicas import PartitionState
from services.partition_store.replication.metadata_link import MetadataLink
from services.partition_store.runtime import StoreConfig, StoreRuntime
from services.partition_store.storage.memory import MemoryStore

LAYOUT = ClusterLayout(stores=("s0:1", "s1:1", "s2:1"), transaction_state_partitions=1,
                       consumer_offsets_partitions=1)
NOW_MS = 1_700_000_000_000


def _stored(base_offset: int, records: int, epoch: int) -> bytes:
    batch = encode_batch([(None, b"v%d" % (base_offset + i), None, NOW_MS)
                          for i in range(records)])
    return stamp_batch(batch, base_offset=base_offset, leader_epoch=epoch)


async def _follower() -> tuple[StoreRuntime, MetadataLink]:
    link = MetadataLink(MemoryMetadataStore(clock_ms=lambda: NOW_MS), layout=LAYOUT,
                        node_id=1, clock_ms=lambda: NOW_MS)
    runtime = StoreRuntime(MemoryStore(), StoreConfig(node_id=1, layout=LAYOUT, replicated=True),
                           controller=link, clock_ms=lambda: NOW_MS)
    await runtime.start()
    await link.keep_registered("s1:1")
    [created] = await link.create_topics(
        [TopicSpec("t", 1, {"min.insync.replicas": "1"}, 3)], validate_only=False)
    assert created.error is None
    await _set_state(runtime, link, PartitionState((0, 1, 2), 0, 1, (0, 1, 2)))
    return runtime, link


async def _set_state(runtime: StoreRuntime, link: MetadataLink, state: PartitionState) -> None:
    view = await link.refresh()
    assert await link.update_state("t", 0, view.state_revisions[("t", 0)], state)
    await runtime.refresh_catalog()


def test_a_truncation_inside_a_batch_removes_the_batch() -> None:
    async def run() -> None:
        runtime, _link = await _follower()
        part = runtime.follower_partition("t", 0)
        assert part is not None
        written = runtime.append_replicated(part, [_stored(0, 2, 1), _stored(2, 2, 1)],
                                            leader_high_watermark=0)
        assert written is not None
        await written
        assert part.log.log_end_offset == 4
        part = await runtime.truncate_replica(part, 3)
        assert part.log.log_end_offset == 2
        # The follower goes on from the batch boundary it is at now.
        written = runtime.append_replicated(part, [_stored(2, 1, 2)], leader_high_watermark=0)
        assert written is not None
        await written
        assert part.log.log_end_offset == 3
        await runtime.close()

    asyncio.run(run())


def test_a_replica_made_leader_during_its_truncation_takes_no_append_it_would_lose() -> None:
    async def run() -> None:
        runtime, link = await _follower()
        part = runtime.follower_partition("t", 0)
        assert part is not None
        written = runtime.append_replicated(
            part, [_stored(0, 2, 1), _stored(2, 2, 1), _stored(4, 2, 1)], leader_high_watermark=0)
        assert written is not None
        await written
        truncation = asyncio.ensure_future(runtime.truncate_replica(part, 4))
        await asyncio.sleep(0)  # it runs up to its first wait for the disk
        # Elected meanwhile (this replica alone in sync).
        await _set_state(runtime, link, PartitionState((0, 1, 2), 1, 2, (1,)))
        batch = encode_batch([(None, b"new", None, NOW_MS)])
        [refused] = await runtime.produce([ProduceItem("t", 0, batch)], timeout_ms=2_000)
        if not truncation.done():
            assert isinstance(refused.error, ServiceError)
            assert refused.error.code is ErrorCode.NOT_LEADER_OR_FOLLOWER
        leader = await truncation
        assert leader.is_leader and leader.log.log_end_offset == 4
        [taken] = await runtime.produce([ProduceItem("t", 0, batch)], timeout_ms=2_000)
        assert taken.error is None and taken.base_offset == 4
        assert runtime.partition("t", 0).log.high_watermark == 5
        await runtime.close()

    asyncio.run(run())


def test_a_truncation_refuses_a_partition_this_replica_now_leads() -> None:
    async def run() -> None:
        runtime, link = await _follower()
        part = runtime.follower_partition("t", 0)
        assert part is not None
        await _set_state(runtime, link, PartitionState((0, 1, 2), 1, 2, (1,)))
        with pytest.raises(ServiceError) as info:
            await runtime.truncate_replica(part, 0)
        assert info.value.code is ErrorCode.NOT_LEADER_OR_FOLLOWER
        await runtime.close()

    asyncio.run(run())
