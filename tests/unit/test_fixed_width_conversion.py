"""Batches of the first (fixed-width) record format become the same batches
in Kafka's format, once, whatever stops the rewrite.

Goal: converting a batch keeps every header field (base offset, leader
epoch, attributes, last_offset_delta, timestamps, producer fields,
record_count) and every record (offset, timestamp, key, value, headers),
and gives exactly the bytes today's encoder writes for the same records;
damaged bytes, and batches already in Kafka's format, are refused rather
than converted. A store's rewrite (format_upgrade.upgrade_log_format)
converts every stored batch once, updates the partition meta and the
compaction state by the bytes it saved, writes the `F` key last, and,
stopped between two chunks, goes on after the last one written: nothing
converted twice, nothing skipped.

Method: the batches are the fixture tests/fixtures/fixed_width_batches.json,
written by the fixed-width encoder itself; what each should decode to comes
from the inputs the fixture recorded, not from a decoder. Stores are
MemoryStores laid out as the old store laid them out (tests/support); a
stop between chunks is a store whose writes fail after the first N.
"""

from __future__ import annotations

import pytest

from oncelog import records as codec
from services.partition_store.core.codec import (
    decode_offset,
    decode_partition_meta,
    encode_offset,
)
from services.partition_store.core.compaction import decode_compaction_state
from services.partition_store.core.fixed_width import (
    FixedWidthFormatError,
    convert_fixed_width_batch,
    read_fixed_width_batch,
)
from services.partition_store.core.topics import TopicRecord
from services.partition_store.format_upgrade import (
    LOG_FORMAT_VARINT,
    log_format,
    upgrade_log_format,
)
from services.partition_store.storage import keys
from services.partition_store.storage.memory import MemoryStore
from services.partition_store.storage.port import WriteGroup
from tests.support.fixed_width_store import (
    Case,
    ExpectedRecord,
    Placed,
    load_cases,
    write_partition,
    write_topic,
)

CASES = load_cases()
HEADER_FIELDS = ("base_offset", "partition_leader_epoch", "attributes", "last_offset_delta",
                 "base_timestamp_ms", "max_timestamp_ms", "producer_id", "producer_epoch",
                 "base_sequence", "record_count")


def decoded(batch: bytes) -> list[ExpectedRecord]:
    return [ExpectedRecord(r.offset, r.timestamp_ms, r.key, r.value, r.headers)
            for r in codec.iter_records(batch)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_converted_batch_keeps_its_header_and_records(name: str) -> None:
    case = CASES[name]
    new = convert_fixed_width_batch(case.batch)
    header = codec.validate_batch(new, max_size_bytes=len(new), compacted=True)
    old = codec.read_header(case.batch)
    for field in HEADER_FIELDS:
        assert getattr(header, field) == getattr(old, field), field
    if case.control is not None:
        assert codec.control_marker(new) == case.control
    else:
        assert decoded(new) == list(case.records)
    # Kafka's readers read it too (a check that no one here wrote).
    kafka = pytest.importorskip("kafka.record.default_records")
    reader = kafka.DefaultRecordBatch(new)
    assert reader.validate_crc()
    if case.control is None:
        assert [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in reader] == [
            (r.offset, r.timestamp_ms, r.key, r.value, r.headers) for r in case.records]


@pytest.mark.parametrize("name", sorted(
    n for n, c in CASES.items() if c.control is None and not n.startswith("compacted")))
def test_a_converted_batch_is_what_the_encoder_writes_today(name: str) -> None:
    case = CASES[name]
    old = codec.read_header(case.batch)
    rows = [(r.key, r.value, list(r.headers) or None, r.timestamp_ms) for r in case.records]
    today = codec.stamp_batch(codec.encode_batch(
        rows, producer_id=old.producer_id, producer_epoch=old.producer_epoch,
        base_sequence=old.base_sequence, transactional=old.is_transactional,
    ), base_offset=old.base_offset, leader_epoch=old.partition_leader_epoch)
    assert convert_fixed_width_batch(case.batch) == today


@pytest.mark.parametrize("name", ["control_commit", "control_abort"])
def test_a_converted_marker_is_what_the_store_writes_today(name: str) -> None:
    case = CASES[name]
    old = codec.read_header(case.batch)
    assert case.control is not None
    today = codec.encode_control_batch(
        marker=case.control[0], coordinator_epoch=case.control[1],
        producer_id=old.producer_id, producer_epoch=old.producer_epoch,
        timestamp_ms=old.base_timestamp_ms, base_offset=old.base_offset,
        leader_epoch=old.partition_leader_epoch,
    )
    assert convert_fixed_width_batch(case.batch) == today


def test_damaged_and_already_converted_batches_are_refused() -> None:
    plain = CASES["plain"].batch
    flipped = bytearray(plain)
    flipped[-3] ^= 0x01
    with pytest.raises(FixedWidthFormatError, match="CRC32C"):
        convert_fixed_width_batch(bytes(flipped))
    # A batch in Kafka's format: intact, but its records do not read as
    # fixed-width ones, so a rewrite could never convert a batch twice.
    for case in CASES.values():
        new = convert_fixed_width_batch(case.batch)
        if codec.read_header(new).record_count:
            with pytest.raises(FixedWidthFormatError):
                read_fixed_width_batch(new)
    gzip = codec.encode_batch([(b"k", b"v" * 500, None, 1)], compression=codec.Codec.GZIP)
    with pytest.raises(FixedWidthFormatError, match="never compressed"):
        convert_fixed_width_batch(gzip)


# ------------------------------------------------------------- the rewrite


class StopsAfter(MemoryStore):
    """A MemoryStore whose writes fail after the first `writes`: a process
    stopped there (what was written stays, as RocksDB's WAL keeps it)."""

    def __init__(self, writes: int) -> None:
        super().__init__()
        self.writes_left = writes

    def write(self, group: WriteGroup) -> None:
        if self.writes_left == 0:
            raise RuntimeError("stopped")
        self.writes_left -= 1
        super().write(group)


def _old_store(store: MemoryStore) -> dict[tuple[int, int], list[Placed]]:
    """Two topics: a plain one with every data case, and a compacted one
    (cleaned up to the middle of its log) with many batches."""
    plain = TopicRecord.build(name="old", topic_id=1, partitions=2, overrides={},
                              internal=False)
    compacted = TopicRecord.build(name="kept", topic_id=2, partitions=1,
                                  overrides={"cleanup.policy": "compact"}, internal=False)
    write_topic(store, plain)
    write_topic(store, compacted)
    data: list[Case] = [c for n, c in sorted(CASES.items()) if not n.startswith("compacted")]
    return {
        (1, 0): write_partition(store, 1, 0, data),
        (1, 1): write_partition(store, 1, 1, [CASES["plain"]] * 3, leader_epoch=4),
        (2, 0): write_partition(store, 2, 0, [CASES["plain"], CASES["compacted_gaps"],
                                              CASES["compacted_empty"]] * 20,
                                clean_offset=5 * 20),
    }


def _check_converted(store: MemoryStore, layout: dict[tuple[int, int], list[Placed]]) -> None:
    for (topic_id, partition), placed in layout.items():
        size = 0
        below_clean = 0
        state_raw = store.get(keys.compaction_key(topic_id, partition))
        clean_offset = (decode_compaction_state(state_raw, what="K").clean_offset
                        if state_raw is not None else None)
        for p in placed:
            value = store.get(keys.log_key(topic_id, partition, p.base_offset))
            assert value == convert_fixed_width_batch(p.stored)
            size += len(value)
            if clean_offset is not None and p.base_offset < clean_offset:
                below_clean += len(value)
        meta = store.get(keys.meta_key(topic_id, partition))
        assert meta is not None
        assert decode_partition_meta(meta, what="M") == (0, size)
        if state_raw is not None:
            state = decode_compaction_state(
                store.get(keys.compaction_key(topic_id, partition)) or b"", what="K")
            assert state.clean_bytes == below_clean
    assert log_format(store) == LOG_FORMAT_VARINT
    assert store.get(keys.LOG_FORMAT_UPGRADE) is None


def test_the_rewrite_converts_every_batch_and_updates_sizes() -> None:
    store = MemoryStore()
    layout = _old_store(store)
    total = sum(len(v) for v in layout.values())
    before = sum(len(p.stored) for v in layout.values() for p in v)
    report = upgrade_log_format(store, chunk_bytes=2_000)
    assert report.batches_converted == total and report.batches_kept == 0
    assert report.chunks > 3 and report.bytes_before == before > report.bytes_after
    _check_converted(store, layout)
    # Done once: the next start reads nothing.
    assert upgrade_log_format(store).already_current


@pytest.mark.parametrize("stop_after", [1, 2, 5])
def test_a_rewrite_stopped_between_chunks_goes_on_after_the_last_one(stop_after: int) -> None:
    store = StopsAfter(writes=10_000)
    layout = _old_store(store)
    total = sum(len(v) for v in layout.values())
    store.writes_left = stop_after
    with pytest.raises(RuntimeError, match="stopped"):
        upgrade_log_format(store, chunk_bytes=2_000)
    assert log_format(store) is None
    assert store.get(keys.LOG_FORMAT_UPGRADE) is not None
    store.writes_left = 10_000
    report = upgrade_log_format(store, chunk_bytes=2_000)
    # The first run's chunks are not read again (a batch converted twice
    # would count here as kept: it no longer reads as fixed-width).
    assert report.resumed
    assert report.batches_kept == 0
    assert 0 < report.batches_converted < total
    _check_converted(store, layout)


def test_an_empty_store_is_marked_current_at_once() -> None:
    store = MemoryStore()
    report = upgrade_log_format(store)
    assert (report.already_current, report.chunks, report.batches_converted) == (False, 0, 0)
    assert log_format(store) == LOG_FORMAT_VARINT


def test_a_damaged_batch_is_kept_as_it_was_and_counted() -> None:
    store = MemoryStore()
    layout = _old_store(store)
    victim = layout[(1, 1)][1]
    key = keys.log_key(1, 1, victim.base_offset)
    damaged = bytearray(victim.stored)
    damaged[-2] ^= 0x40
    store.put_raw(key, bytes(damaged))
    report = upgrade_log_format(store)
    assert report.batches_kept == 1
    assert store.get(key) == bytes(damaged)
    neighbour = layout[(1, 1)][2]
    assert store.get(keys.log_key(1, 1, neighbour.base_offset)) == convert_fixed_width_batch(
        neighbour.stored)


def test_an_unknown_format_version_stops_the_store() -> None:
    store = MemoryStore()
    store.put_raw(keys.LOG_FORMAT, encode_offset(3))
    with pytest.raises(RuntimeError, match="log format version is 3"):
        upgrade_log_format(store)
    assert decode_offset(store.get(keys.LOG_FORMAT) or b"", what="F") == 3
