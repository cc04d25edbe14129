"""The group coordinator's runtime against an in-memory partition store.

Goal: what makes the runtime safe when two processes believe they own the same
`__consumer_offsets` partition, or when others write to it:
* a replacement coordinator claims the partition with a higher coordinator
  epoch; the old one (a zombie that has not noticed) is fenced at its next
  write — it answers NOT_COORDINATOR and its write does not land;
* a marker written by a transaction coordinator between two of our writes
  makes the conditional append miss; the runtime catches up (replaying the
  marker: pending offsets materialize) and writes again, without reloading.

Method: two GroupCoordinatorRuntime instances sharing one in-memory log that
encodes real record batches (conditional appends, markers as control
batches), a fake clock; no processes, no sockets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any

import pytest

from oncelog import records
from oncelog.errors import ErrorCode
from services.common.kernel.errors import ServiceError
from services.common.metadata.cluster import ClusterLayout
from services.common.rpc.store_client import RawRead, TxnWriter
from services.group_coordinator.runtime import GroupConfig, GroupCoordinatorRuntime


class MemoryOffsetsStore:
    """One __consumer_offsets partition as stored batches, with the partition
    store's conditional append."""

    def __init__(self) -> None:
        self.batches: list[bytes] = []
        self.end = 0

    async def append(self, topic: str, partition: int,
                     entries: Sequence[tuple[bytes | None, bytes | None]], *,
                     expected_log_end_offset: int | None = None, now_ms: int | None = None,
                     producer: TxnWriter | None = None) -> int:
        if expected_log_end_offset is not None and expected_log_end_offset != self.end:
            raise ServiceError(ErrorCode.LOG_END_OFFSET_MISMATCH,
                               f"log ends at {self.end}, not {expected_log_end_offset}")
        rows = [(k, v, None, now_ms or 0) for k, v in entries]
        if producer is None:
            batch = records.encode_batch(rows, base_offset=self.end)
        else:
            batch = records.encode_batch(
                rows, producer_id=producer.producer_id,
                producer_epoch=producer.producer_epoch, base_sequence=producer.base_sequence,
                transactional=True, base_offset=self.end)
        base = self.end
        self.batches.append(batch)
        self.end += len(entries)
        return base

    def marker(self, producer_id: int, producer_epoch: int, commit: bool) -> None:
        self.batches.append(records.encode_control_batch(
            marker=records.MARKER_COMMIT if commit else records.MARKER_ABORT,
            coordinator_epoch=0, producer_id=producer_id, producer_epoch=producer_epoch,
            timestamp_ms=0, base_offset=self.end,
        ))
        self.end += 1

    async def read_batches(self, topic: str, partition: int, from_offset: int, *,
                           max_wait_ms: int = 0, max_bytes: int = 8 << 20) -> RawRead:
        out = [b for b in self.batches if records.read_header(b).next_offset > from_offset]
        if not out:
            # A long poll with nothing new waits, as the store's does.
            await asyncio.sleep(max_wait_ms / 1000)
        return RawRead(out, self.end, self.end)

    async def partition_counts(self, topics: Sequence[str]) -> dict[str, int]:
        return {t: 4 for t in topics if t == "in"}


LAYOUT = ClusterLayout(stores=("s",), group_coordinators=("g",), consumer_offsets_partitions=1)


def runtime(store: MemoryOffsetsStore) -> GroupCoordinatorRuntime:
    return GroupCoordinatorRuntime(layout=LAYOUT, node_id=0, store=store,
                                   now_ms=lambda: 1_000, config=GroupConfig(tail_wait_ms=10))


async def loaded(rt: GroupCoordinatorRuntime) -> None:
    await rt.start()
    for _ in range(200):
        if all(p.loaded for p in rt.partitions.values()):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never loaded")


def commit(rt: GroupCoordinatorRuntime, offset: int) -> Coroutine[Any, Any, None]:
    return rt.commit_offsets(group_id="g", member_id="", generation_id=-1,
                             partitions=[(("in", 0), offset, "")])


def test_a_replaced_coordinator_is_fenced_at_its_next_write() -> None:
    async def scenario() -> None:
        store = MemoryOffsetsStore()
        old = runtime(store)
        await loaded(old)
        await commit(old, 5)
        # The old process stalls (its tail is stopped too); a replacement
        # takes the partition over with a higher coordinator epoch.
        await old.stop()
        new = runtime(store)
        await loaded(new)
        written = store.end
        with pytest.raises(ServiceError) as info:
            await commit(old, 9)
        assert info.value.code is ErrorCode.NOT_COORDINATOR
        assert store.end == written, "the zombie's write did not land"
        assert new.fetch_offsets(group_id="g", partitions=[("in", 0)],
                                 require_stable=False)[0].offset == 5
        await commit(new, 7)
        await new.stop()

    asyncio.run(scenario())


def test_a_marker_between_writes_is_caught_up_on_not_mistaken_for_a_new_owner() -> None:
    async def scenario() -> None:
        store = MemoryOffsetsStore()
        rt = runtime(store)
        await loaded(rt)
        await rt.txn_commit_offsets(transactional_id="t", group_id="g", producer_id=7,
                                    producer_epoch=0, member_id="", generation_id=-1,
                                    partitions=[(("in", 1), 42, "")])
        assert rt.fetch_offsets(group_id="g", partitions=[("in", 1)],
                                require_stable=True)[0].error is not None
        # The transaction coordinator's COMMIT marker lands, then we write.
        store.marker(7, 1, commit=True)
        await commit(rt, 3)
        fetched = {f.tp: f.offset for f in rt.fetch_offsets(
            group_id="g", partitions=[], require_stable=True)}
        assert fetched == {("in", 0): 3, ("in", 1): 42}
        assert not rt.partitions[0].fenced
        await rt.stop()

    asyncio.run(scenario())
