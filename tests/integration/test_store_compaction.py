"""Compaction (cleanup.policy=compact) on the partition store, on real
RocksDB, in process.

Goal: a compaction pass keeps exactly what Kafka's cleaner keeps — checked
against an oracle computed from what was written — and the store stays
correct around it: the log shrinks; every key's newest value is read at its
original offset; a fetch inside a removed range gets the next surviving
batch, never OFFSET_OUT_OF_RANGE; the log start stays; nothing at or above
the first uncleanable offset (an open transaction's first offset) changes by
a byte; aborted records go, read_committed keeps every key's newest
committed value, and an ABORT marker and its aborted-index entry go only
after delete.retention.ms and only when the producer wrote after it;
tombstones go after delete.retention.ms counted from their first cleaning;
producer state (dedup of the last batch, the producer table) survives
compaction and a restart; a crash between two chunks of a pass leaves a
consistent log, and finishing the pass gives the same bytes as a pass that
was never interrupted; compacted topics refuse records without a key.

Method: StoreRuntime over RocksStore in tmp_path, driven with asyncio.run,
with an injected clock. "Crash" is close(take_snapshots=False) (everything
written is in RocksDB; no shutdown snapshot), as in test_store_runtime.py.
The mid-pass crash drives cleaner.compact_partition on a recovered
PartitionRuntime with a writer that stops after the first chunk. Real
processes and kill -9 are in test_compaction_cluster.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from oncelog.errors import ErrorCode
from oncelog.records import (
    CRC_POS,
    CRC_START,
    HEADER_SIZE_BYTES,
    MARKER_ABORT,
    MARKER_COMMIT,
    crc32c,
    encode_batch,
    iter_records,
    read_header,
)
from services.common.metadata.cluster import ClusterLayout
from services.partition_store.api import (
    FetchItem,
    MarkerItem,
    OffsetQuery,
    ProduceItem,
    ProduceOutcome,
    TopicSpec,
)
from services.partition_store.core.topics import decode_topic_record
from services.partition_store.log.cleaner import compact_partition
from services.partition_store.log.cleaning import compaction_due, first_uncleanable_offset
from services.partition_store.log.loader import recover_partition
from services.partition_store.log.partition import Isolation, PartitionRuntime
from services.partition_store.log.reads import EARLIEST_TIMESTAMP
from services.partition_store.runtime import StoreConfig, StoreRuntime
from services.partition_store.storage import keys
from services.partition_store.storage.port import WriteGroup
from services.partition_store.storage.rocksdb import RocksStore

LAYOUT = ClusterLayout(stores=("127.0.0.1:1",))
NOW_MS = 1_700_000_000_000
HOUR_MS = 3_600_000
TOPIC = "state"
COMMITTED = Isolation.READ_COMMITTED
UNCOMMITTED = Isolation.READ_UNCOMMITTED

Rec = tuple[int, bytes | None, bytes | None]  # offset, key, value


class Clock:
    def __init__(self) -> None:
        self.now_ms = NOW_MS

    def __call__(self) -> int:
        return self.now_ms


def run(coro_fn: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(coro_fn())  # type: ignore[arg-type]


async def _open(path: Path, clock: Clock, **overrides: object) -> StoreRuntime:
    config: dict[str, object] = {
        "node_id": 0, "layout": LAYOUT, "snapshot_interval_batches": 10_000,
        "snapshot_interval_ms": 10 * HOUR_MS, "retention_check_interval_ms": 10 * HOUR_MS,
        "compaction_interval_ms": 10 * HOUR_MS, "unsafe_skip_txn_verification": True,
    }
    config.update(overrides)
    runtime = StoreRuntime(RocksStore(path), StoreConfig(**config),  # type: ignore[arg-type]
                           clock_ms=clock)
    await runtime.start()
    return runtime


async def create(rt: StoreRuntime, **config: str) -> None:
    overrides = {"cleanup.policy": "compact", **{k.replace("_", "."): v
                                                 for k, v in config.items()}}
    [out] = await rt.create_topics([TopicSpec(TOPIC, 1, overrides)], validate_only=False)
    assert out.error is None, out.error


@dataclass
class Writer:
    """A producer id with its epoch and next sequence (-1: not idempotent)."""

    pid: int = -1
    epoch: int = 0
    seq: int = 0

    def batch(self, *rows: tuple[bytes | None, bytes | None], txn: bool = False) -> bytes:
        data = encode_batch([(k, v, None, NOW_MS) for k, v in rows], producer_id=self.pid,
                            producer_epoch=self.epoch,
                            base_sequence=self.seq if self.pid >= 0 else -1, transactional=txn)
        if self.pid >= 0:
            self.seq += len(rows)
        return data


async def send(rt: StoreRuntime, data: bytes) -> ProduceOutcome:
    [out] = await rt.produce([ProduceItem(TOPIC, 0, data)], transactional_id="tid")
    return out


async def send_ok(rt: StoreRuntime, writer: Writer, *rows: tuple[bytes | None, bytes | None],
                  txn: bool = False) -> int:
    out = await send(rt, writer.batch(*rows, txn=txn))
    assert out.error is None, out.error
    return out.base_offset


async def end_txn(rt: StoreRuntime, writer: Writer, marker_type: int) -> int:
    [out] = await rt.write_txn_markers([MarkerItem(
        producer_id=writer.pid, producer_epoch=writer.epoch + 1, control_type=marker_type,
        coordinator_epoch=0, partitions=((TOPIC, 0),), transactional_id="tid",
    )])
    assert out.error is None, out.error
    writer.epoch += 1
    writer.seq = 0
    return out.offset


async def read(rt: StoreRuntime, isolation: Isolation = UNCOMMITTED, start: int = 0
               ) -> list[Rec]:
    """Every record a consumer loop reads from `start`, as (offset, key, value)."""
    offset = start
    out: list[Rec] = []
    while True:
        [fetched] = await rt.fetch([FetchItem(TOPIC, 0, offset)], isolation=isolation)
        assert fetched.error is None, fetched.error
        for data in fetched.batches:
            out.extend((r.offset, r.key, r.value) for r in iter_records(data, min_offset=offset))
        if fetched.next_fetch_offset == offset:
            return out
        offset = fetched.next_fetch_offset


def stored(part: PartitionRuntime) -> dict[int, bytes]:
    """Every stored batch of the partition: base offset -> bytes."""
    return {h.base_offset: v for h, v in part.read_stored(0, part.log.log_end_offset)}


def stored_in(store: RocksStore, topic_id: int) -> dict[int, bytes]:
    prefix = keys.partition_prefix(keys.LOG, topic_id, 0)
    return {keys.log_key_offset(k): v for k, v in store.scan(prefix, keys.next_prefix(prefix))}


def newest_per_key(records: list[Rec]) -> dict[bytes | None, Rec]:
    newest: dict[bytes | None, Rec] = {}
    for rec in records:
        newest[rec[1]] = rec
    return newest


def expected_survivors(written: list[Rec], end: int, *, tombstones_go: bool) -> list[Rec]:
    """The oracle: below `end`, each key's newest record (tombstones only while
    they must stay); from `end` on, everything."""
    newest_below = newest_per_key([r for r in written if r[0] < end])
    return [r for r in written if r[0] >= end or (
        newest_below[r[1]] == r and not (tombstones_go and r[2] is None))]


def test_pass_keeps_newest_per_key_at_original_offsets_and_survives_restart(
    tmp_path: Path,
) -> None:
    path = tmp_path / "db"
    clock = Clock()

    async def body() -> None:
        rt = await _open(path, clock)
        await create(rt)
        producer = Writer(pid=5)
        written: list[Rec] = []
        for i in range(150):
            rows: list[tuple[bytes | None, bytes | None]] = [
                (b"k%d" % ((2 * i + j) % 10), b"v%d" % (2 * i + j)) for j in range(2)]
            if i == 10:
                rows = [(b"gone", b"here"), (b"k4", b"x")]
            if i == 60:
                rows = [(b"gone", None), (b"k4", None)]   # tombstones; k4 comes back
            base = await send_ok(rt, producer, *rows)
            written.extend((base + j, k, v) for j, (k, v) in enumerate(rows))
        part = rt.partition(TOPIC, 0)
        size_before = part.log.size_bytes
        assert await read(rt) == written
        last_base = part.last_batch_base_offset
        assert first_uncleanable_offset(part) == last_base == 298

        [report] = await rt.run_compaction_once()
        assert report.end_offset == last_base
        expected = expected_survivors(written, last_base, tombstones_go=False)
        after = await read(rt)
        assert after == expected
        # Every key's newest value, at its original offset.
        assert newest_per_key(after) == newest_per_key(written)
        assert (120, b"gone", None) in after      # the tombstone stays (1 day)
        assert (20, b"gone", b"here") not in after
        on_disk = stored(part)
        assert part.log.size_bytes == sum(len(v) for v in on_disk.values()) < size_before // 10
        assert report.removed_bytes == size_before - part.log.size_bytes
        # A fetch inside a removed range gets the next surviving batch; the
        # log start stays.
        first_kept = min(on_disk)
        assert first_kept > 0 and 0 not in on_disk
        [gap] = await rt.fetch([FetchItem(TOPIC, 0, 1)])
        assert gap.error is None and gap.log_start_offset == 0
        assert read_header(gap.batches[0]).base_offset >= 1
        [earliest] = await rt.list_offsets([OffsetQuery(TOPIC, 0, EARLIEST_TIMESTAMP)],
                                           isolation=UNCOMMITTED)
        assert earliest.offset == 0
        # Producer state: a retry of the last batch is still a duplicate; the
        # producer goes on at its next sequence.
        producer.seq -= 2
        retry = await send(rt, producer.batch((b"k8", b"v298"), (b"k9", b"v299")))
        assert retry.error is None and retry.duplicate and retry.base_offset == 298
        entries = part.producers.entries()
        state = part.compaction
        await rt.close(take_snapshots=False)

        rt = await _open(path, clock)
        part = rt.partition(TOPIC, 0)
        assert await read(rt) == expected
        assert part.log.size_bytes == sum(len(v) for v in stored(part).values())
        assert part.compaction == state
        assert part.producers.entries() == entries
        # Compaction took a snapshot at the log end first: nothing to replay.
        assert part.recovery_replayed_batches == 0
        assert (await send_ok(rt, producer, (b"k1", b"after"))) == 300
        # Nothing new is due (one batch written since the pass).
        assert await rt.run_compaction_once() == []
        await rt.close()

    run(body)


def _corrupt_every_snapshot(path: Path, topic_id: int) -> int:
    store = RocksStore(path)
    try:
        prefix = keys.partition_prefix(keys.SNAPSHOT, topic_id, 0)
        group = WriteGroup()
        for key, value in store.scan(prefix, keys.next_prefix(prefix)):
            group.put(key, value[:-1] + bytes([value[-1] ^ 0x5A]))
        store.write(group)
        return len(group)
    finally:
        store.close()


def test_recovery_past_the_snapshots_replays_the_compacted_log(tmp_path: Path) -> None:
    """With every snapshot damaged, recovery replays the compacted log from
    its start, across the gaps; producer state comes from the batches that
    compaction kept for it (each active producer's last batch, emptied)."""
    path = tmp_path / "db"
    clock = Clock()

    async def body() -> None:
        rt = await _open(path, clock)
        await create(rt)
        quiet, busy = Writer(pid=6, epoch=2), Writer(pid=5)
        await send_ok(rt, quiet, (b"k", b"quiet-1"))
        quiet_last = await send_ok(rt, quiet, (b"k", b"quiet-2"))
        for i in range(20):
            await send_ok(rt, busy, (b"k", b"busy-%d" % i))
        [report] = await rt.run_compaction_once()
        part = rt.partition(TOPIC, 0)
        kept = stored(part)
        # The quiet producer's records are all superseded: its first batch
        # went, its last one stays as a header without records.
        assert 0 not in kept and quiet_last in kept
        assert read_header(kept[quiet_last]).record_count == 0
        assert report.batches_rewritten == 1
        entries = part.producers.entries()
        records = await read(rt)
        topic_id = part.topic.topic_id
        await rt.close()
        assert _corrupt_every_snapshot(path, topic_id) >= 1

        rt = await _open(path, clock)
        part = rt.partition(TOPIC, 0)
        assert part.recovery_snapshot_offset is None
        assert part.recovery_replayed_batches == len(kept)
        assert await read(rt) == records
        recovered = {e.producer_id: e for e in part.producers.entries()}
        for entry in entries:
            assert (recovered[entry.producer_id].producer_epoch,
                    recovered[entry.producer_id].last_sequence) == (
                entry.producer_epoch, entry.last_sequence)
        # Both producers go on: a retry of the quiet one's last batch is a
        # duplicate at its offset, and its next sequence is accepted.
        quiet.seq -= 1
        retry = await send(rt, quiet.batch((b"k", b"quiet-2")))
        assert retry.error is None and retry.duplicate and retry.base_offset == quiet_last
        assert (await send(rt, quiet.batch((b"k", b"quiet-3")))).error is None
        assert (await send(rt, busy.batch((b"k", b"busy-20")))).error is None
        await rt.close()

    run(body)


def test_tombstones_go_after_delete_retention_from_their_first_cleaning(tmp_path: Path) -> None:
    clock = Clock()

    async def body() -> None:
        rt = await _open(tmp_path / "db", clock)
        await create(rt, delete_retention_ms=str(HOUR_MS))
        writer = Writer()
        await send_ok(rt, writer, (b"gone", b"v"), (b"kept", b"v"))
        await send_ok(rt, writer, (b"gone", None))
        await send_ok(rt, writer, (b"last", b"v"))          # the uncleanable newest batch
        [first] = await rt.run_compaction_once()
        assert first.tombstones_removed == 0
        assert await read(rt) == [(1, b"kept", b"v"), (2, b"gone", None), (3, b"last", b"v")]
        part = rt.partition(TOPIC, 0)
        assert part.compaction.next_removal_ms == NOW_MS + HOUR_MS
        clock.now_ms = NOW_MS + HOUR_MS - 1
        assert not compaction_due(part, clock.now_ms)
        [early] = await rt.run_compaction_once(force=True)
        assert early.tombstones_removed == 0
        clock.now_ms = NOW_MS + HOUR_MS
        assert compaction_due(part, clock.now_ms)
        [due] = await rt.run_compaction_once()
        assert due.tombstones_removed == 1
        assert await read(rt) == [(1, b"kept", b"v"), (3, b"last", b"v")]
        await rt.close(take_snapshots=False)
        rt = await _open(tmp_path / "db", clock)
        assert await read(rt) == [(1, b"kept", b"v"), (3, b"last", b"v")]
        assert rt.partition(TOPIC, 0).compaction.next_removal_ms == -1
        await rt.close()

    run(body)


def test_transactions_open_untouched_aborted_removed_markers_after_retention(
    tmp_path: Path,
) -> None:
    path = tmp_path / "db"
    clock = Clock()

    async def body() -> None:
        rt = await _open(path, clock)
        await create(rt, delete_retention_ms="0")
        committer, aborter, plain, opener = Writer(pid=1), Writer(pid=2), Writer(pid=3), Writer(4)
        await send_ok(rt, committer, (b"k1", b"a1"), (b"k2", b"a2"), txn=True)        # 0-1
        await send_ok(rt, aborter, (b"k1", b"b1"), (b"k3", b"b3"), txn=True)          # 2-3
        await end_txn(rt, committer, MARKER_COMMIT)                                   # 4
        abort_offset = await end_txn(rt, aborter, MARKER_ABORT)                       # 5
        await send_ok(rt, plain, (b"k2", b"c2"))                                      # 6
        await send_ok(rt, aborter, (b"k5", b"later"))                                 # 7
        open_first = await send_ok(rt, opener, (b"k1", b"d1"), txn=True)              # 8
        await send_ok(rt, plain, (b"k3", b"e3"))                                      # 9
        part = rt.partition(TOPIC, 0)
        assert (abort_offset, open_first) == (5, 8)
        assert part.log.last_stable_offset == first_uncleanable_offset(part) == 8
        committed_before = await read(rt, COMMITTED)
        tail_before = {o: v for o, v in stored(part).items() if o >= 8}

        [first] = await rt.run_compaction_once()
        assert first.end_offset == 8
        assert first.aborted_records_removed == 2
        on_disk = stored(part)
        # Nothing at or above the LSO changed by a byte.
        assert {o: v for o, v in on_disk.items() if o >= 8} == tail_before
        # The aborted records are gone even for read_uncommitted; the marker
        # stays this pass (not yet delete.retention.ms after its cleaning).
        uncommitted = await read(rt)
        assert (2, b"k1", b"b1") not in uncommitted and (3, b"k3", b"b3") not in uncommitted
        assert 5 in on_disk and part.aborted.get(5) is not None
        committed_after = await read(rt, COMMITTED)
        assert set(committed_after) <= set(committed_before)
        assert newest_per_key(committed_after) == newest_per_key(committed_before)
        assert committed_after == [(0, b"k1", b"a1"), (6, b"k2", b"c2"), (7, b"k5", b"later")]

        # Second pass: the ABORT marker has had its delete.retention.ms (0),
        # its records are gone and its producer wrote after it: it goes, with
        # its aborted-index entry (memory and disk).
        [second] = await rt.run_compaction_once(force=True)
        assert second.markers_removed == 1
        on_disk = stored(part)
        assert 5 not in on_disk and part.aborted.get(5) is None
        # The COMMIT marker stays: a record of its transaction (k1=a1) survives.
        assert 4 in on_disk
        assert await read(rt, COMMITTED) == committed_after

        # The open transaction commits; now its record supersedes k1=a1, and
        # the first transaction's marker can go too (its producer wrote after
        # it, below the end of the pass).
        await end_txn(rt, opener, MARKER_COMMIT)                                      # 10
        await send_ok(rt, committer, (b"k7", b"x"))                                   # 11
        await send_ok(rt, plain, (b"k6", b"tail"))                                    # 12
        [third] = await rt.run_compaction_once(force=True)
        assert third.end_offset == 12
        final = await read(rt, COMMITTED)
        assert [(o, k, v) for o, k, v in final if k == b"k1"] == [(8, b"k1", b"d1")]
        assert 4 not in stored(part)
        entries, aborted = part.producers.entries(), part.aborted.entries()
        await rt.close(take_snapshots=False)

        rt = await _open(path, clock)
        part = rt.partition(TOPIC, 0)
        assert await read(rt, COMMITTED) == final
        assert part.producers.entries() == entries
        # The aborted index was loaded from disk: the removed entry's key is gone.
        assert part.aborted.entries() == aborted and part.aborted.get(5) is None
        await rt.close()

    run(body)


def test_compacted_topic_refuses_records_without_a_key(tmp_path: Path) -> None:
    async def body() -> None:
        rt = await _open(tmp_path / "db", Clock())
        await create(rt)
        out = await send(rt, Writer().batch((b"k", b"v"), (None, b"no key")))
        assert out.error is not None and out.error.code is ErrorCode.INVALID_RECORD
        assert "without a key" in out.error.message
        assert rt.partition(TOPIC, 0).log.log_end_offset == 0
        await rt.close()

    run(body)


def test_a_damaged_batch_stops_only_its_partition(tmp_path: Path) -> None:
    """A stored batch whose CRC holds but whose records do not decode (a
    broken writer): compaction of that partition stops with an error in the
    log; other partitions are still compacted, and the store keeps serving."""
    path = tmp_path / "db"
    clock = Clock()

    async def body() -> None:
        rt = await _open(path, clock)
        await create(rt)
        [other] = await rt.create_topics(
            [TopicSpec("other", 1, {"cleanup.policy": "compact"})], validate_only=False)
        assert other.error is None
        for i in range(4):
            await send_ok(rt, Writer(), (b"k", b"v%d" % i))
            [out] = await rt.produce([ProduceItem("other", 0, Writer().batch((b"k", b"v")))])
            assert out.error is None
        topic_id = rt.partition(TOPIC, 0).topic.topic_id
        await rt.close()
        store = RocksStore(path)
        try:
            key = keys.log_key(topic_id, 0, 1)
            raw = bytearray(store.get(key) or b"")
            struct.pack_into(">i", raw, HEADER_SIZE_BYTES, 1 << 20)   # record length
            struct.pack_into(">I", raw, CRC_POS, crc32c(bytes(raw[CRC_START:])))
            group = WriteGroup()
            group.put(key, bytes(raw))
            store.write(group)
        finally:
            store.close()

        rt = await _open(path, clock)
        reports = await rt.run_compaction_once()
        assert [r.topic_partition for r in reports] == ["other-0"]
        assert rt.partition("other", 0).log.size_bytes < rt.partition(TOPIC, 0).log.size_bytes
        assert (await send(rt, Writer().batch((b"k", b"after")))).error is None
        await rt.close()

    run(body)


async def _fill(path: Path, clock: Clock) -> int:
    """120 updates of 6 keys in single-record batches, then a clean shutdown.
    Returns the topic id."""
    rt = await _open(path, clock)
    await create(rt)
    writer = Writer(pid=8)
    for i in range(120):
        await send_ok(rt, writer, (b"k%d" % (i % 6), b"v%d" % i))
    topic_id = rt.partition(TOPIC, 0).topic.topic_id
    await rt.close()
    return topic_id


async def _pass_over(path: Path, clock: Clock, *, stop_after_chunks: int | None) -> int:
    """One compaction pass over TOPIC's partition on a closed store, as the
    runtime runs it (snapshot first, chunks written in order); with
    stop_after_chunks, the process "dies" before writing the next chunk.
    Returns the chunks written."""
    store = RocksStore(path)
    try:
        catalog = store.get(keys.catalog_key(TOPIC))
        assert catalog is not None
        part = recover_partition(decode_topic_record(catalog), 0, store,
                                 now_ms=clock.now_ms, producer_id_expiration_ms=HOUR_MS)
        chunks = 0

        def submit(group: WriteGroup, on_durable: Callable[[], None]) -> asyncio.Future[None]:
            nonlocal chunks
            if stop_after_chunks is not None and chunks >= stop_after_chunks:
                raise _Crash()
            chunks += 1
            store.write(group)
            on_durable()
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            future.set_result(None)
            return future

        snapshot = part.build_snapshot(now_ms=clock.now_ms, force=True)
        assert snapshot is not None
        store.write(snapshot)
        with contextlib.suppress(_Crash):
            await compact_partition(part, submit=submit, now_ms=clock.now_ms,
                                    end_offset=first_uncleanable_offset(part), max_keys=1000,
                                    chunk_bytes=256)
        return chunks
    finally:
        store.close()


def test_crash_between_chunks_then_the_pass_completes_as_if_never_interrupted(
    tmp_path: Path,
) -> None:
    clock = Clock()

    async def body() -> None:
        whole, broken = tmp_path / "whole", tmp_path / "broken"
        topic_id = await _fill(whole, clock)
        assert await _fill(broken, clock) == topic_id
        assert await _pass_over(whole, clock, stop_after_chunks=None) > 2
        assert await _pass_over(broken, clock, stop_after_chunks=1) == 1
        # After the crash: the store recovers, every key's newest value reads
        # as before, and the batches are each whole (old or rewritten).
        rt = await _open(broken, clock)
        half = await read(rt)
        assert {k: (o, v) for o, k, v in half}.items() >= {
            (b"k%d" % (i % 6), (i, b"v%d" % i)) for i in range(114, 120)}
        await rt.close()
        rt = await _open(whole, clock)
        compacted = await read(rt)
        await rt.close()
        # Half done: fewer records than written, more than a whole pass leaves.
        assert len(compacted) < len(half) < 120
        # Another pass finishes the job: byte for byte what the uninterrupted
        # pass produced.
        await _pass_over(broken, clock, stop_after_chunks=None)
        a, b = RocksStore(whole), RocksStore(broken)
        try:
            assert stored_in(a, topic_id) == stored_in(b, topic_id)
            for key in (keys.meta_key(topic_id, 0), keys.compaction_key(topic_id, 0)):
                assert a.get(key) == b.get(key)
        finally:
            a.close()
            b.close()

    run(body)


class _Crash(Exception):
    """The process died here."""


def test_crash_in_a_later_pass_keeps_the_dirty_ratio_exact(tmp_path: Path) -> None:
    """A crash between chunks of a second pass: the clean offset stays, but
    the clean bytes already count what the written chunks removed below it,
    so the next pass is due at once (not after as much again is written)."""
    clock = Clock()
    path = tmp_path / "db"

    async def body() -> None:
        await _fill(path, clock)
        await _pass_over(path, clock, stop_after_chunks=None)
        rt = await _open(path, clock)
        writer = Writer(pid=9)
        for i in range(60):
            await send_ok(rt, writer, (b"k%d" % (i % 6), b"w%d" % i))
        await rt.close()
        assert await _pass_over(path, clock, stop_after_chunks=1) == 1
        rt = await _open(path, clock)
        part = rt.partition(TOPIC, 0)
        below = sum(len(v) for o, v in stored(part).items() if o < part.compaction.clean_offset)
        assert part.compaction.clean_bytes == below
        assert compaction_due(part, clock.now_ms)
        assert [r.topic_partition for r in await rt.run_compaction_once()] == [f"{TOPIC}-0"]
        # Each key's newest value below the newest batch (offset 179), and that batch.
        assert await read(rt) == [
            (173, b"k5", b"w53"), *((174 + i, b"k%d" % i, b"w%d" % (54 + i)) for i in range(5)),
            (179, b"k5", b"w59"),
        ]
        await rt.close()

    run(body)
