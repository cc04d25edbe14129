"""The record batch codec round-trips what producers write and rejects what a
store must not accept.

Method: encode batches (null keys and values, empty values, headers with
unicode keys and null values, large batches, producer fields), decode them
with iter_records and read_header, and compare; check the bytes of records
against ones written out by hand from Kafka's record layout; then corrupt
one field at a time of a valid batch and check that validate_batch (or the
record reader) names the problem.
"""

from __future__ import annotations

import struct

import pytest

from oncelog import ConsumerRecord
from oncelog import records as codec
from oncelog._batching import record_size_bytes, restamp_batch
from oncelog.wire import records as records_module


def roundtrip(
    rows: list[tuple[bytes | None, bytes | None, list[codec.Header] | None, int]],
) -> list[codec.Record]:
    batch = codec.encode_batch(rows)
    header = codec.validate_batch(batch, max_size_bytes=len(batch))
    assert header.record_count == len(rows)
    return list(codec.iter_records(batch))


def test_null_key_and_value_and_empty_value() -> None:
    got = roundtrip([(None, None, None, 10), (b"", b"", None, 11), (b"k", None, None, 12)])
    assert [(r.key, r.value) for r in got] == [(None, None), (b"", b""), (b"k", None)]
    assert [r.offset for r in got] == [0, 1, 2]
    assert [r.timestamp_ms for r in got] == [10, 11, 12]
    assert all(r.headers == () for r in got)


def test_headers_with_unicode_keys_and_null_values() -> None:
    headers: list[codec.Header] = [("trace-id", b"abc"), ("clé-ü-日本", None), ("", b"")]
    got = roundtrip([(b"k", b"v", headers, 5)])
    assert got[0].headers == tuple(headers)


def test_a_batch_decodes_the_same_from_bytes_and_from_a_memoryview() -> None:
    headers: list[codec.Header] = [("h", b"x"), ("n", None)]
    batch = codec.encode_batch([(b"k", b"v", headers, 5), (None, None, None, 6)])
    want = list(codec.iter_records(batch))
    for view in (memoryview(batch), memoryview(b"pad" + batch)[3:]):
        got = list(codec.iter_records(view))
        assert got == want
        assert all(type(r.key) in (bytes, type(None)) and type(r.value) in (bytes, type(None))
                   for r in got)


def test_a_consumer_record_reads_like_kafka_pythons_and_cannot_change() -> None:
    record = ConsumerRecord("t", 1, 7, b"k", b"v", (("h", b"x"),), 9)
    assert (record.topic, record.partition, record.offset, record.key, record.value,
            record.headers, record.timestamp_ms) == ("t", 1, 7, b"k", b"v", (("h", b"x"),), 9)
    with pytest.raises(AttributeError):
        record.value = b"w"  # type: ignore[misc]
    assert record._replace(value=b"w").value == b"w"
    assert record == ConsumerRecord("t", 1, 7, b"k", b"v", (("h", b"x"),), 9)


def test_timestamps_out_of_order_keep_their_values() -> None:
    got = roundtrip([(None, b"a", None, 500), (None, b"b", None, 100), (None, b"c", None, 300)])
    assert [r.timestamp_ms for r in got] == [500, 100, 300]


def test_large_batch_and_min_offset() -> None:
    rows: list[tuple[bytes | None, bytes | None, list[codec.Header] | None, int]] = [
        (b"key-%d" % i, b"x" * (i % 300), None, 1_000 + i) for i in range(20_000)
    ]
    batch = codec.with_base_offset(codec.encode_batch(rows), 1_000_000)
    header = codec.validate_batch(batch, max_size_bytes=len(batch))
    assert header.base_offset == 1_000_000
    assert header.last_offset == 1_000_000 + 19_999
    got = list(codec.iter_records(batch, min_offset=1_019_990))
    assert [r.offset for r in got] == list(range(1_019_990, 1_020_000))
    assert got[-1].value == b"x" * (19_999 % 300)


def test_producer_fields_and_sequence_wrap() -> None:
    batch = codec.encode_batch(
        [(None, b"a", None, 1), (None, b"b", None, 2), (None, b"c", None, 3)],
        producer_id=77, producer_epoch=3, base_sequence=codec.MAX_SEQUENCE - 1,
        transactional=True,
    )
    header = codec.validate_batch(batch, max_size_bytes=len(batch))
    assert (header.producer_id, header.producer_epoch) == (77, 3)
    assert header.is_transactional and not header.is_control
    # Sequences 2^31 - 2, 2^31 - 1, then 0: they wrap after 2^31 - 1.
    assert header.last_sequence == 0


def test_record_size_bytes_bounds_the_encoded_size() -> None:
    # The producer counts record_size_bytes before it knows the offset and
    # timestamp deltas: it must never be below what encoding takes, with the
    # largest deltas, lengths that need 3-byte varints, and many headers.
    cases: list[tuple[bytes | None, bytes | None, list[codec.Header] | None]] = [
        (None, None, None), (b"key", b"value" * 10, None),
        (b"", b"", [("h", b"v"), ("\u00fc", None)]),
        (b"k" * 9000, b"v" * 70_000, [("x" * 9000, b"y" * 9000)]),
        (None, b"v", [(f"h{i}", b"") for i in range(200)]),
    ]
    # Small fillers put the case's last record at an offset delta that needs
    # a 3-byte varint without encoding 9,000 copies of its 70 KB value.
    filler: list[tuple[bytes | None, bytes | None, list[codec.Header] | None, int]] = [
        (None, None, None, 5)] * 9000
    for key, value, headers in cases:
        rows = [(key, value, headers, 0), (key, value, headers, -(2**62)),
                (key, value, headers, 2**62), *filler, (key, value, headers, 2**62)]
        batch = codec.encode_batch(rows)
        bound = codec.HEADER_SIZE_BYTES + sum(record_size_bytes(k, v, h) for k, v, h, _t in rows)
        assert len(batch) <= bound
        one = codec.encode_batch([(key, value, headers, 0)])
        assert len(one) <= codec.HEADER_SIZE_BYTES + record_size_bytes(key, value, headers)
    # A typical record takes 9 bytes besides its key and value, not 28.
    typical = codec.encode_batch([(None, b"x" * 100, None, 7)])
    assert len(typical) == codec.HEADER_SIZE_BYTES + 9 + 100


def test_records_are_kafkas_bytes() -> None:
    # Written out from Kafka's DefaultRecord layout (zigzag varints): length,
    # attributes, timestamp delta, offset delta, key length and key, value
    # length and value, header count, headers.
    batch = codec.encode_batch([
        (b"k", b"v", None, 1000),
        (None, b"", [("h", None), ("\u00e9", b"xy")], 1064),
        (b"", None, None, 999),
    ])
    header = codec.read_header(batch)
    assert (header.base_timestamp_ms, header.max_timestamp_ms) == (999, 1064)
    assert batch[codec.HEADER_SIZE_BYTES:] == bytes([
        # 8 bytes (zigzag 16): attributes 0, ts delta 1 (zigzag 2), offset 0,
        # key 1 (2) "k", value 1 (2) "v", no headers
        0x10, 0x00, 0x02, 0x00, 0x02, 0x6B, 0x02, 0x76, 0x00,
        # 16 bytes (32): ts delta 65 (zigzag 130: 0x82 0x01), offset 1 (2), null
        # key (1), empty value (0), 2 headers (4): "h" null, "\u00e9" (2 bytes) "xy"
        0x20, 0x00, 0x82, 0x01, 0x02, 0x01, 0x00, 0x04,
        0x02, 0x68, 0x01,
        0x04, 0xC3, 0xA9, 0x04, 0x78, 0x79,
        # 6 bytes (12): ts delta 0, offset 2 (4), empty key (0), null value (1)
        0x0C, 0x00, 0x00, 0x04, 0x00, 0x01, 0x00,
    ])
    assert [(r.offset, r.timestamp_ms, r.key, r.value, r.headers)
            for r in codec.iter_records(batch)] == [
        (0, 1000, b"k", b"v", ()),
        (1, 1064, None, b"", (("h", None), ("\u00e9", b"xy"))),
        (2, 999, b"", None, ()),
    ]


@pytest.mark.parametrize("value", [0, 1, -1, 63, -64, 64, -65, 8191, 8192, 2**31 - 1,
                                   -(2**31), 2**62, 2**63 - 1, -(2**63)])
def test_varints_round_trip_at_every_width(value: int) -> None:
    encoded = records_module._varint(value)
    raw = (value << 1) ^ (value >> 63)
    assert len(encoded) == max(1, (raw.bit_length() + 6) // 7)
    assert records_module._read_varint(encoded + b"\xff", 0) == (value, len(encoded))
    # As the offset and timestamp deltas of real batches (the fast path
    # takes the small ones, the general form the rest).
    if 0 <= value < 2**31:
        rows = [(None, b"a", None, 0), (None, b"b", None, value)]
        assert [r.timestamp_ms for r in codec.iter_records(codec.encode_batch(rows))] == [0, value]


def test_restamp_changes_identity_and_keeps_a_valid_crc() -> None:
    batch = codec.encode_batch([(None, b"a", None, 1), (None, b"b", None, 2)],
                               producer_id=5, producer_epoch=0, base_sequence=40)
    again = restamp_batch(batch, producer_id=5, producer_epoch=1, base_sequence=0)
    header = codec.validate_batch(again, max_size_bytes=len(again))
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (5, 1, 0)
    assert again[codec.HEADER_SIZE_BYTES:] == batch[codec.HEADER_SIZE_BYTES:]
    assert again == codec.encode_batch([(None, b"a", None, 1), (None, b"b", None, 2)],
                                       producer_id=5, producer_epoch=1, base_sequence=0)


def _valid() -> bytes:
    return codec.encode_batch([(b"k", b"v", None, 1), (b"k2", b"v2", None, 2)],
                              producer_id=1, producer_epoch=0, base_sequence=0)


def _with_crc(buf: bytearray) -> bytes:
    struct.pack_into(">I", buf, codec.CRC_POS, codec.crc32c(memoryview(buf)[codec.CRC_START:]))
    return bytes(buf)


def test_validate_rejects_bad_magic() -> None:
    buf = bytearray(_valid())
    buf[codec.MAGIC_POS] = 1
    with pytest.raises(codec.BatchFormatError, match="magic is 1"):
        codec.validate_batch(bytes(buf), max_size_bytes=1 << 20)


def test_validate_rejects_bad_crc() -> None:
    buf = bytearray(_valid())
    buf[-1] ^= 0xFF
    with pytest.raises(codec.BatchFormatError, match="CRC32C"):
        codec.validate_batch(bytes(buf), max_size_bytes=1 << 20)


def test_validate_rejects_wrong_length_field() -> None:
    buf = bytearray(_valid())
    struct.pack_into(">i", buf, 8, len(buf))  # should be len - 12
    with pytest.raises(codec.BatchFormatError, match="length field"):
        codec.validate_batch(bytes(buf), max_size_bytes=1 << 20)


def test_validate_rejects_truncated_and_oversized() -> None:
    batch = _valid()
    with pytest.raises(codec.BatchFormatError, match="shorter than"):
        codec.validate_batch(batch[:20], max_size_bytes=1 << 20)
    with pytest.raises(codec.BatchFormatError, match="over the limit"):
        codec.validate_batch(batch, max_size_bytes=len(batch) - 1)


def test_validate_rejects_inconsistent_counts() -> None:
    buf = bytearray(_valid())
    struct.pack_into(">i", buf, codec.LAST_OFFSET_DELTA_POS, 5)  # != record_count - 1
    with pytest.raises(codec.BatchFormatError, match="last_offset_delta"):
        codec.validate_batch(_with_crc(buf), max_size_bytes=1 << 20)
    buf = bytearray(_valid())
    struct.pack_into(">i", buf, codec.RECORD_COUNT_POS, 0)  # record_count 0
    with pytest.raises(codec.BatchFormatError, match="0 records"):
        codec.validate_batch(_with_crc(buf), max_size_bytes=1 << 20)


def test_validate_rejects_producer_without_sequence() -> None:
    buf = bytearray(_valid())
    struct.pack_into(">i", buf, codec.BASE_SEQUENCE_POS, -1)
    with pytest.raises(codec.BatchFormatError, match="no base_sequence"):
        codec.validate_batch(_with_crc(buf), max_size_bytes=1 << 20)


def test_iter_records_rejects_a_record_running_past_the_batch() -> None:
    buf = bytearray(_valid())
    buf[-1] = 0x02  # the last record's header count: 1 header, whose bytes are missing
    with pytest.raises(codec.BatchFormatError, match="runs past"):
        list(codec.iter_records(_with_crc(buf)))


@pytest.mark.parametrize("length_byte", [0x7E, 0x02])
def test_iter_records_rejects_a_record_whose_length_disagrees(length_byte: int) -> None:
    # The first record's length varint: 63 (past its fields) or 1 (short of them).
    buf = bytearray(_valid())
    buf[codec.HEADER_SIZE_BYTES] = length_byte
    for read in (codec.iter_records, codec.iter_record_keys):
        with pytest.raises(codec.BatchFormatError, match="record"):
            list(read(_with_crc(buf)))


def test_iter_records_rejects_bytes_after_the_last_record() -> None:
    buf = bytearray(_valid()) + b"\x00"
    struct.pack_into(">i", buf, 8, len(buf) - 12)
    with pytest.raises(codec.BatchFormatError, match="1 bytes after its 2 records"):
        list(codec.iter_records(_with_crc(buf)))


def test_encode_refuses_an_empty_batch() -> None:
    with pytest.raises(codec.BatchFormatError):
        codec.encode_batch([])


def test_retain_records_keeps_offsets_header_fields_and_record_bytes() -> None:
    rows: list[tuple[bytes | None, bytes | None, list[codec.Header] | None, int]] = [
        (b"a", b"1", None, 10), (None, b"2", [("h", b"x")], 11), (b"c", None, None, 12),
        (b"d", b"4", None, 13),
    ]
    batch = codec.with_base_offset(codec.encode_batch(
        rows, producer_id=3, producer_epoch=2, base_sequence=40, transactional=True), 100)
    assert [(k.offset, k.key, k.is_tombstone) for k in codec.iter_record_keys(batch)] == [
        (100, b"a", False), (101, None, False), (102, b"c", True), (103, b"d", False)]
    assert codec.first_null_key_offset(batch) == 101
    kept = codec.retain_records(batch, {101, 103})
    header = codec.validate_batch(kept, max_size_bytes=len(kept), compacted=True)
    original = codec.read_header(batch)
    assert header.record_count == 2
    assert (header.base_offset, header.last_offset_delta, header.producer_id,
            header.producer_epoch, header.base_sequence, header.attributes,
            header.base_timestamp_ms, header.max_timestamp_ms) == (
        original.base_offset, original.last_offset_delta, original.producer_id,
        original.producer_epoch, original.base_sequence, original.attributes,
        original.base_timestamp_ms, original.max_timestamp_ms)
    got = list(codec.iter_records(kept))
    assert [(r.offset, r.key, r.value, r.headers, r.timestamp_ms) for r in got] == [
        (101, None, b"2", (("h", b"x"),), 11), (103, b"d", b"4", (), 13)]
    assert [r.offset for r in codec.iter_records(kept, min_offset=102)] == [103]
    # A produced batch never has gaps: the strict check refuses this one.
    with pytest.raises(codec.BatchFormatError, match="last_offset_delta"):
        codec.validate_batch(kept, max_size_bytes=len(kept))
    empty = codec.retain_records(batch, ())
    assert codec.validate_batch(empty, max_size_bytes=len(empty), compacted=True).record_count == 0
    assert list(codec.iter_records(empty)) == []
    with pytest.raises(codec.BatchFormatError, match="1 of the 2 offsets"):
        codec.retain_records(batch, {100, 99})


def test_compacted_validation_still_checks_counts() -> None:
    buf = bytearray(codec.encode_batch([(b"k", b"v", None, 1)] * 2))
    struct.pack_into(">i", buf, codec.RECORD_COUNT_POS, 3)  # more records than offsets
    with pytest.raises(codec.BatchFormatError, match="expected 0..2"):
        codec.validate_batch(_with_crc(buf), max_size_bytes=1 << 20, compacted=True)


def test_header_fields_sit_where_the_layout_says() -> None:
    batch = codec.stamp_batch(
        codec.encode_batch([(b"k", b"v", None, 100), (None, b"w", None, 90)],
                           producer_id=77, producer_epoch=3, base_sequence=40,
                           transactional=True),
        base_offset=1_000, leader_epoch=12,
    )
    header = codec.read_header(batch)

    def at(fmt: str, pos: int) -> int:
        return int(struct.unpack_from(fmt, batch, pos)[0])

    # 7 bytes per record besides its key and value, as
    # test_records_are_kafkas_bytes spells out.
    assert len(batch) == codec.HEADER_SIZE_BYTES + (7 + 2) + (7 + 1)
    assert at(">q", 0) == header.base_offset == 1_000
    assert at(">i", 8) == header.batch_length == len(batch) - 12
    assert at(">i", codec.PARTITION_LEADER_EPOCH_POS) == header.partition_leader_epoch == 12
    assert at(">b", codec.MAGIC_POS) == header.magic == codec.BATCH_MAGIC
    assert at(">I", codec.CRC_POS) == header.crc == codec.crc32c(batch[codec.CRC_START:])
    assert at(">h", codec.CRC_START) == header.attributes == codec.ATTR_TRANSACTIONAL
    assert at(">i", codec.LAST_OFFSET_DELTA_POS) == header.last_offset_delta == 1
    assert at(">q", codec.PRODUCER_ID_POS) == header.producer_id == 77
    assert at(">h", codec.PRODUCER_ID_POS + 8) == header.producer_epoch == 3
    assert at(">i", codec.BASE_SEQUENCE_POS) == header.base_sequence == 40
    assert at(">i", codec.RECORD_COUNT_POS) == header.record_count == 2
    assert (header.base_timestamp_ms, header.max_timestamp_ms) == (90, 100)


def test_a_produced_batch_carries_no_leader_epoch() -> None:
    batch = codec.encode_batch([(None, b"a", None, 1)])
    assert codec.read_header(batch).partition_leader_epoch == codec.NO_PARTITION_LEADER_EPOCH
    assert codec.read_header(codec.with_base_offset(batch, 5)).partition_leader_epoch == -1


@pytest.mark.parametrize("leader_epoch", [0, 1, 2**31 - 1, codec.NO_PARTITION_LEADER_EPOCH])
def test_stamp_batch_sets_offset_and_epoch_and_keeps_the_crc_valid(leader_epoch: int) -> None:
    batch = codec.encode_batch([(b"k", b"v", [("h", b"x")], 5), (None, None, None, 6)],
                               producer_id=4, producer_epoch=1, base_sequence=9)
    stamped = codec.stamp_batch(batch, base_offset=300, leader_epoch=leader_epoch)
    header = codec.validate_batch(stamped, max_size_bytes=len(stamped))
    assert (header.base_offset, header.partition_leader_epoch) == (300, leader_epoch)
    # Only the two fields changed; the CRC'd part and the length are the producer's.
    assert len(stamped) == len(batch)
    assert stamped[8:codec.PARTITION_LEADER_EPOCH_POS] == batch[8:codec.PARTITION_LEADER_EPOCH_POS]
    assert stamped[codec.MAGIC_POS:] == batch[codec.MAGIC_POS:]
    assert header.crc == codec.read_header(batch).crc
    assert [r.offset for r in codec.iter_records(stamped)] == [300, 301]
    # The same as with_base_offset then the epoch, and stamping again overwrites.
    assert codec.read_header(codec.with_base_offset(stamped, 7)).partition_leader_epoch == (
        leader_epoch)
    again = codec.stamp_batch(stamped, base_offset=0, leader_epoch=3)
    assert codec.read_header(again).partition_leader_epoch == 3
    assert codec.stamp_batch(again, base_offset=300, leader_epoch=leader_epoch) == stamped
    # A memoryview stamps the same.
    assert codec.stamp_batch(memoryview(batch), base_offset=300,
                             leader_epoch=leader_epoch) == stamped


def test_the_crc_does_not_cover_the_leader_epoch() -> None:
    # As in Kafka: a store stamps the epoch without recomputing the CRC.
    buf = bytearray(_valid())
    struct.pack_into(">i", buf, codec.PARTITION_LEADER_EPOCH_POS, 42)
    assert codec.validate_batch(bytes(buf), max_size_bytes=1 << 20).partition_leader_epoch == 42


def test_control_batches_carry_the_leader_epoch() -> None:
    def marker(**kwargs: int) -> bytes:
        return codec.encode_control_batch(marker=codec.MARKER_COMMIT, coordinator_epoch=6,
                                          producer_id=8, producer_epoch=2, timestamp_ms=50,
                                          base_offset=70, **kwargs)

    default = codec.validate_batch(marker(), max_size_bytes=1 << 20)
    assert default.partition_leader_epoch == codec.NO_PARTITION_LEADER_EPOCH
    stamped = marker(leader_epoch=9)
    header = codec.validate_batch(stamped, max_size_bytes=1 << 20)
    assert (header.partition_leader_epoch, header.base_offset) == (9, 70)
    assert header.is_control and header.is_transactional
    assert codec.control_marker(stamped) == (codec.MARKER_COMMIT, 6)
    assert codec.stamp_batch(marker(), base_offset=70, leader_epoch=9) == stamped


def test_retain_records_keeps_the_leader_epoch() -> None:
    batch = codec.stamp_batch(
        codec.encode_batch([(b"a", b"1", None, 10), (b"b", b"2", None, 11)]),
        base_offset=100, leader_epoch=5,
    )
    for offsets in ({101}, set()):
        kept = codec.retain_records(batch, offsets)
        header = codec.validate_batch(kept, max_size_bytes=len(kept), compacted=True)
        assert (header.partition_leader_epoch, header.base_offset) == (5, 100)


def test_columns_encode_as_the_same_rows_do() -> None:
    """encode_columns (the producer's path: a batch keeps its records as
    columns) writes exactly the bytes encode_batch writes for the same
    records given as rows, and refuses columns of different lengths."""
    rows: list[tuple[bytes | None, bytes | None, list[codec.Header] | None, int]] = [
        (None, b"v" * 100, None, 1_000), (b"k", b"", None, 1_003),
        (None, None, [("h", b"1")], 999), (b"k" * 300, b"x" * 20_000, None, 1_000 + 10**9),
    ]
    as_rows = codec.encode_batch(rows, producer_id=7, producer_epoch=1, base_sequence=40)
    as_columns = codec.encode_columns(
        [r[0] for r in rows], [r[1] for r in rows], [r[3] for r in rows], [r[2] for r in rows],
        producer_id=7, producer_epoch=1, base_sequence=40)
    assert as_columns == as_rows
    without_headers = rows[:2]
    assert codec.encode_columns([r[0] for r in without_headers],
                                [r[1] for r in without_headers],
                                [r[3] for r in without_headers]) == codec.encode_batch(
                                    without_headers)
    with pytest.raises(ValueError, match="different lengths"):
        codec.encode_columns([None], [b"a", b"b"], [1, 2])
    with pytest.raises(codec.BatchFormatError, match="at least one record"):
        codec.encode_columns([], [], [])
