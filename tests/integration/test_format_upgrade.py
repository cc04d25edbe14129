"""A store written in the first (fixed-width) record format is rewritten
once on start, and then serves its log as if it had always been in Kafka's.

Goal: after a store starts on a database of the old format, every record
reads back through the store and the SDK exactly as it was written (offset,
timestamp, key, value, headers), read_committed still hides the aborted
transaction, ListOffsets by time finds records in converted batches,
producer state rebuilt from the converted log still deduplicates a retry,
compaction still keeps each key's newest record at its offset, and the next
start does not rewrite anything again. A kill -9 in the middle of the
rewrite (after its first chunk) leaves a store that finishes the rewrite on
the next start, with nothing converted twice and nothing lost.

Method: the old database is laid out in the test from the fixture batches
(tests/fixtures/fixed_width_batches.json, written by the fixed-width
encoder) through the storage layer (tests/support/fixed_width_store.py).
In process: StoreRuntime over RocksStore, driven with asyncio.run. Real
processes: LocalCluster on the laid-out data directory, the store started
first with the crash point `format_upgrade.after_chunk` armed (it SIGKILLs
itself there), the half-rewritten database inspected, then the cluster
started and read with oncelog.Consumer under both isolation levels.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Sequence
from pathlib import Path

from oncelog import ConsumerRecord
from oncelog import records as codec
from oncelog.testing import LocalCluster
from services.common.kernel.crashpoints import ENV_VAR as CRASH_POINTS_ENV
from services.common.metadata.cluster import ClusterLayout
from services.partition_store.api import FetchItem, OffsetQuery, ProduceItem
from services.partition_store.core.codec import decode_partition_meta
from services.partition_store.core.fixed_width import (
    FixedWidthFormatError,
    convert_fixed_width_batch,
    read_fixed_width_batch,
)
from services.partition_store.core.topics import TopicRecord
from services.partition_store.format_upgrade import (
    LOG_FORMAT_VARINT,
    UPGRADE_CHUNK_BYTES,
    log_format,
    upgrade_log_format,
)
from services.partition_store.log.partition import Isolation
from services.partition_store.runtime import StoreConfig, StoreRuntime
from services.partition_store.storage import keys
from services.partition_store.storage.rocksdb import RocksStore
from tests.support.fixed_width_store import (
    ExpectedRecord,
    Placed,
    expected_records,
    load_cases,
    write_partition,
    write_topic,
)
from tests.support.reading import read_all

CASES = load_cases()
LAYOUT = ClusterLayout(stores=("127.0.0.1:1",))
NOW_MS = 1_700_000_000_000
HOUR_MS = 3_600_000
# The producer whose transaction the fixture aborts.
ABORTED_PRODUCER = 3000
MIXED = ["plain", "nulls_empties_headers", "idempotent", "transactional", "control_commit",
         "transactional_aborted", "control_abort", "large_fields", "plain"]


def _mixed_topic(store: RocksStore, name: str, topic_id: int) -> list[Placed]:
    write_topic(store, TopicRecord.build(name=name, topic_id=topic_id, partitions=1,
                                         overrides={}, internal=False))
    return write_partition(store, topic_id, 0, [CASES[n] for n in MIXED], leader_epoch=0)


def _as_expected(records: Sequence[codec.Record | ConsumerRecord]) -> list[ExpectedRecord]:
    return [ExpectedRecord(r.offset, r.timestamp_ms, r.key, r.value, tuple(r.headers))
            for r in records]


async def _open(path: Path) -> StoreRuntime:
    config = StoreConfig(
        node_id=0, layout=LAYOUT, snapshot_interval_batches=10_000,
        snapshot_interval_ms=10 * HOUR_MS, retention_check_interval_ms=10 * HOUR_MS,
        compaction_interval_ms=10 * HOUR_MS, unsafe_skip_txn_verification=True,
    )
    runtime = StoreRuntime(RocksStore(path), config, clock_ms=lambda: NOW_MS)
    await runtime.start()
    return runtime


async def _read(rt: StoreRuntime, topic: str, isolation: Isolation) -> list[codec.Record]:
    offset = 0
    out: list[codec.Record] = []
    while True:
        [fetched] = await rt.fetch([FetchItem(topic, 0, offset)], isolation=isolation)
        assert fetched.error is None, fetched.error
        for data in fetched.batches:
            out.extend(codec.iter_records(data, min_offset=offset))
        if fetched.next_fetch_offset == offset:
            return out
        offset = fetched.next_fetch_offset


def test_a_converted_store_reads_deduplicates_and_compacts_as_before(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = RocksStore(path)
    placed = _mixed_topic(store, "old", 1)
    write_topic(store, TopicRecord.build(name="kept", topic_id=2, partitions=1,
                                         overrides={"cleanup.policy": "compact"},
                                         internal=False))
    kept = write_partition(store, 2, 0, [CASES["plain"]] * 10)
    store.close()

    async def body() -> None:
        rt = await _open(path)
        try:
            everything = expected_records(placed)
            assert _as_expected(await _read(rt, "old", Isolation.READ_UNCOMMITTED)) == everything
            committed = expected_records(placed, aborted_producers=[ABORTED_PRODUCER])
            assert len(committed) < len(everything)
            assert _as_expected(await _read(rt, "old", Isolation.READ_COMMITTED)) == committed

            # By time: the first record at or after each record's timestamp.
            for want in everything[::3]:
                [found] = await rt.list_offsets(
                    [OffsetQuery("old", 0, want.timestamp_ms)],
                    isolation=Isolation.READ_UNCOMMITTED)
                first = min((r for r in everything if r.timestamp_ms >= want.timestamp_ms),
                            key=lambda r: r.offset)
                assert (found.offset, found.timestamp_ms) == (first.offset, first.timestamp_ms)

            # Producer 1000's batch (sequences 42-44) sent again, in Kafka's
            # format: the state rebuilt from the converted log knows it.
            idempotent = next(p for p in placed if p.case.name == "idempotent")
            retry = codec.encode_batch(
                [(r.key, r.value, None, r.timestamp_ms) for r in idempotent.records],
                producer_id=1000, producer_epoch=3, base_sequence=42)
            [out] = await rt.produce([ProduceItem("old", 0, retry)])
            assert out.error is None, out.error
            assert (out.duplicate, out.base_offset) == (True, idempotent.base_offset)

            # Compaction: below the newest batch (never cleaned: it fixes the
            # log end), each of k0..k4 keeps its newest record, at its offset.
            [report] = await rt.run_compaction_once(force=True)
            assert (report.end_offset, report.records_removed) == (kept[-1].base_offset, 5 * 8)
            assert _as_expected(await _read(rt, "kept", Isolation.READ_UNCOMMITTED)) == (
                kept[-2].records + kept[-1].records)
        finally:
            await rt.close()

    asyncio.run(body())
    reopened = RocksStore(path)
    try:
        assert log_format(reopened) == LOG_FORMAT_VARINT
        assert upgrade_log_format(reopened).already_current
    finally:
        reopened.close()


def test_kill_9_in_the_middle_of_the_rewrite(tmp_path: Path) -> None:
    store_dir = tmp_path / "partition_store-0" / "rocksdb"
    store = RocksStore(store_dir)
    mixed = _mixed_topic(store, "old", 1)
    # Enough bytes for several chunks of the rewrite.
    bulk_case = CASES["large_fields"]
    bulk_batches = 3 * UPGRADE_CHUNK_BYTES // len(bulk_case.batch) + 1
    write_topic(store, TopicRecord.build(name="bulk", topic_id=2, partitions=1, overrides={},
                                         internal=False))
    bulk = write_partition(store, 2, 0, [bulk_case] * bulk_batches)
    old_values = {keys.log_key(1, 0, p.base_offset): p.stored for p in mixed}
    old_values.update({keys.log_key(2, 0, p.base_offset): p.stored for p in bulk})
    store.close()

    with LocalCluster(tmp_path, group_coordinators=0, start=False) as cluster:
        cluster.restart("partition_store", 0, wait=False,
                        env={CRASH_POINTS_ENV: "format_upgrade.after_chunk"})
        assert cluster.wait_exit("partition_store", 0) == -signal.SIGKILL

        # Half done: some batches in Kafka's format, the others as they were,
        # `U` naming where the rewrite stopped, no `F`.
        half = RocksStore(store_dir)
        try:
            assert log_format(half) is None
            assert half.get(keys.LOG_FORMAT_UPGRADE) is not None
            converted = 0
            for key, value in half.scan(keys.LOG_START, keys.LOG_END):
                if value == old_values[key]:
                    read_fixed_width_batch(value)
                else:
                    assert value == convert_fixed_width_batch(old_values[key])
                    converted += 1
            assert 0 < converted < len(old_values)
        finally:
            half.close()

        cluster.start()
        got = read_all(cluster.bootstrap, "old", 1)
        assert _as_expected(got) == expected_records(mixed)
        got = read_all(cluster.bootstrap, "old", 1, isolation_level="read_committed")
        assert _as_expected(got) == expected_records(mixed, aborted_producers=[ABORTED_PRODUCER])
        got = read_all(cluster.bootstrap, "bulk", 1)
        assert _as_expected(got) == expected_records(bulk)
        cluster.stop()

    # Every batch converted exactly once, the sizes in the partition meta.
    done = RocksStore(store_dir)
    try:
        assert log_format(done) == LOG_FORMAT_VARINT
        assert done.get(keys.LOG_FORMAT_UPGRADE) is None
        sizes: dict[tuple[int, int], int] = {}
        for key, value in done.scan(keys.LOG_START, keys.LOG_END):
            topic_partition = keys.log_key_partition(key)
            if key in old_values:
                assert value == convert_fixed_width_batch(old_values[key])
            if codec.read_header(value).record_count:
                try:
                    read_fixed_width_batch(value)
                except FixedWidthFormatError:
                    pass
                else:
                    raise AssertionError(f"batch under {key!r} is still fixed-width")
            sizes[topic_partition] = sizes.get(topic_partition, 0) + len(value)
        for (topic_id, partition), size in sizes.items():
            meta = done.get(keys.meta_key(topic_id, partition))
            assert meta is not None
            assert decode_partition_meta(meta, what="M")[1] == size
    finally:
        done.close()
