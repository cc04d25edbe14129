"""What a newly elected leader tells readers while its high watermark still
trails the old leader's, on a real store runtime (in memory) in replicated
mode with the metadata in the in-memory metadata store.

Goal: a leader change never moves a reader backwards or makes it start over.
A new leader learns where its followers are only on their next fetch, so for
a moment its HW can be below the old leader's. Two faults came from that:
1. A consumer already at the old HW fetched from the new leader, was told
   OFFSET_OUT_OF_RANGE, and reset its position (to the start of the log: an
   exactly-once copier read and copied its whole input again).
2. A "latest" ListOffsets answered the trailing HW, so an acknowledged
   record was past the end offset a reader took.
Kafka's rules are the fix: a fetch may start anywhere up to the log end and
reads only below the HW; a leader whose HW has not reached the start of its
own leader epoch answers ListOffsets with the retriable OFFSET_NOT_AVAILABLE
(KIP-207).

Method: node 1 follows and copies six records while the old leader's HW it
hears is 3; then it is elected (ISR {1, 2}). Before store 2 fetches from it,
the test asks for offsets and fetches at, inside and past its log; then
store 2 fetches at the log end and the same questions get the full answers.
"""

from __future__ import annotations

import asyncio

from oncelog.wire.errors import ErrorCode
from oncelog.wire.records import encode_batch, iter_records, stamp_batch
from services.common.metadata.cluster import ClusterLayout
from services.common.metadata.store import MemoryMetadataStore
from services.partition_store.api import FetchItem, OffsetQuery, ReplicaFetchItem, TopicSpec
from services.partition_store.core.replicas import PartitionState
from services.partition_store.log.partition import Isolation
from services.partition_store.replication.metadata_link import MetadataLink
from services.partition_store.runtime import StoreConfig, StoreRuntime
from services.partition_store.storage.memory import MemoryStore

LAYOUT = ClusterLayout(stores=("s0:1", "s1:1", "s2:1"), transaction_state_partitions=1,
                       consumer_offsets_partitions=1)
NOW_MS = 1_700_000_000_000
LATEST = -1


def _stored(base_offset: int, records: int, epoch: int) -> bytes:
    batch = encode_batch([(None, b"v%d" % (base_offset + i), None, NOW_MS)
                          for i in range(records)])
    return stamp_batch(batch, base_offset=base_offset, leader_epoch=epoch)


async def _set_state(runtime: StoreRuntime, link: MetadataLink, state: PartitionState) -> None:
    view = await link.refresh()
    assert await link.update_state("t", 0, view.state_revisions[("t", 0)], state)
    await runtime.refresh_catalog()


async def _latest(runtime: StoreRuntime) -> tuple[ErrorCode | None, int]:
    [out] = await runtime.list_offsets([OffsetQuery("t", 0, LATEST)],
                                       isolation=Isolation.READ_UNCOMMITTED)
    return (out.error.code if out.error else None), out.offset


async def _fetch(runtime: StoreRuntime, offset: int) -> tuple[ErrorCode | None, list[int]]:
    [out] = await runtime.fetch([FetchItem("t", 0, offset)])
    offsets = [r.offset for b in out.batches for r in iter_records(b, min_offset=offset)]
    return (out.error.code if out.error else None), offsets


def test_a_new_leader_behind_its_epoch_start_neither_resets_readers_nor_moves_ends_back(
        ) -> None:
    async def run() -> None:
        link = MetadataLink(MemoryMetadataStore(clock_ms=lambda: NOW_MS), layout=LAYOUT,
                            node_id=1, clock_ms=lambda: NOW_MS)
        runtime = StoreRuntime(
            MemoryStore(), StoreConfig(node_id=1, layout=LAYOUT, replicated=True),
            controller=link, clock_ms=lambda: NOW_MS)
        await runtime.start()
        await link.keep_registered("s1:1")
        [created] = await link.create_topics(
            [TopicSpec("t", 1, {"min.insync.replicas": "1"}, 3)], validate_only=False)
        assert created.error is None
        await _set_state(runtime, link, PartitionState((0, 1, 2), 0, 1, (0, 1, 2)))
        follower = runtime.follower_partition("t", 0)
        assert follower is not None
        written = runtime.append_replicated(
            follower, [_stored(0, 3, 1), _stored(3, 3, 1)], leader_high_watermark=3)
        assert written is not None
        await written
        assert (follower.log.log_end_offset, follower.log.high_watermark) == (6, 3)

        # Elected: the old leader may have acknowledged all six (HW 6).
        await _set_state(runtime, link, PartitionState((0, 1, 2), 1, 2, (1, 2)))
        leader = runtime.partition("t", 0)
        assert leader.is_leader and leader.log.high_watermark == 3
        code, _offset = await _latest(runtime)
        assert code is ErrorCode.OFFSET_NOT_AVAILABLE, "an end offset that went backwards"
        # A reader at the old HW (or anywhere up to the log end) is not
        # out of range; it just gets nothing yet.
        assert await _fetch(runtime, 6) == (None, [])
        assert await _fetch(runtime, 4) == (None, [])
        assert await _fetch(runtime, 1) == (None, [1, 2])
        code, _ = await _fetch(runtime, 7)
        assert code is ErrorCode.OFFSET_OUT_OF_RANGE

        # Store 2 fetches at the log end: the HW reaches the epoch start.
        [caught_up] = await runtime.replica_fetch(
            2, [ReplicaFetchItem("t", 0, 6, current_leader_epoch=2)], max_wait_ms=0)
        assert caught_up.error is None
        assert leader.log.high_watermark == 6
        assert await _latest(runtime) == (None, 6)
        assert await _fetch(runtime, 4) == (None, [4, 5])
        await runtime.close()

    asyncio.run(run())
