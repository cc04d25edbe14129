"""Our record batches are Kafka's: the record codecs of two Kafka clients
that no one here wrote read what we write, and we read what they write.

Goal: with every compression codec, batches built by kafka-python's
`DefaultRecordBatchBuilder` and by aiokafka's builders (its C extension and
its pure-Python one) decode through oncelog.wire.records to exactly the
records they were given (offsets, timestamps before the first one
included, null and empty keys and values, headers with null values and
UTF-8 keys, values long enough for multi-byte varints), with their header
fields; what compaction does to them (retain_records: the kept records
compressed again with the same codec) still reads in their readers. The
other way, their readers take our batches of every codec, CRC and all, and
read our control batches as COMMIT/ABORT markers with the coordinator
epoch. Also: raw snappy (what librdkafka writes) and the log-append-time
bit read as Kafka reads them.

Method: build with their builders, read with ours; build with ours, read
with their readers; compare with the input rows. A codec a client cannot
build here (kafka-python needs python-snappy and lz4 for those two) is
covered by the other client. Neither client builds control batches (only a
broker writes them), so for markers only the direction ours -> theirs runs.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import cramjam
import pytest

from oncelog import records as codec
from oncelog.wire.compression import Codec

kafka_records = pytest.importorskip("kafka.record.default_records")
kafka_codec = pytest.importorskip("kafka.codec")
aiokafka_records = pytest.importorskip("aiokafka.record.default_records")
aiokafka_control = pytest.importorskip("aiokafka.record.control_record")

Row = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]
BASE_TS = 1_700_000_000_000

NO_HEADERS: list[tuple[str, bytes | None]] = []
ROWS: list[Row] = [
    (b"key-0", b"value-0" * 20, NO_HEADERS, BASE_TS),
    (None, b"no key" * 30, [("trace", b"abc"), ("null", None)], BASE_TS + 5),
    (b"tombstone", None, NO_HEADERS, BASE_TS - 1_000),  # before the first: a negative delta
    (b"", b"", [("", b"")], BASE_TS + 70_000),  # a delta of three varint bytes
    ("\u00e9t\u00e9".encode(), b"\x00" * 20_000, [("cl\u00e9-\u65e5\u672c", b"h" * 300)],
     BASE_TS + 1),
    (None, None, NO_HEADERS, BASE_TS + 2),
]
ROWS += [(b"k%d" % (i % 7), b"v%d" % i * 10, NO_HEADERS, BASE_TS + i) for i in range(200)]

PRODUCER = {"producer_id": 4242, "producer_epoch": 7, "base_sequence": 100}


def _kafka_python_codecs() -> list[Codec]:
    available = {Codec.NONE: True, Codec.GZIP: kafka_codec.has_gzip(),
                 Codec.SNAPPY: kafka_codec.has_snappy(), Codec.LZ4: kafka_codec.has_lz4(),
                 Codec.ZSTD: kafka_codec.has_zstd()}
    return [c for c, ok in available.items() if ok]


def _builders() -> list[Any]:
    out = [pytest.param(kafka_records.DefaultRecordBatchBuilder, c,
                        id=f"kafka-python-{c.name.lower()}") for c in _kafka_python_codecs()]
    for name, cls in (("aiokafka", aiokafka_records.DefaultRecordBatchBuilder),
                      ("aiokafka-py", aiokafka_records._DefaultRecordBatchBuilderPy)):
        out += [pytest.param(cls, c, id=f"{name}-{c.name.lower()}") for c in Codec]
    return out


def _readers() -> list[Any]:
    out = [pytest.param(kafka_records.DefaultRecordBatch, c, id=f"kafka-python-{c.name.lower()}")
           for c in _kafka_python_codecs()]
    for name, cls in (("aiokafka", aiokafka_records.DefaultRecordBatch),
                      ("aiokafka-py", aiokafka_records._DefaultRecordBatchPy)):
        out += [pytest.param(cls, c, id=f"{name}-{c.name.lower()}") for c in Codec]
    return out


def _theirs(builder: Callable[..., Any], compression: Codec, rows: list[Row]) -> bytes:
    batch = builder(magic=2, compression_type=int(compression), is_transactional=True,
                    batch_size=1 << 24, **PRODUCER)
    for offset, (key, value, headers, ts) in enumerate(rows):
        assert batch.append(offset, ts, key, value, headers) is not None
    return bytes(batch.build())


def _read_theirs(reader: Callable[[bytes], Any], batch: bytes) -> list[tuple[Any, ...]]:
    parsed = reader(batch)
    assert parsed.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in parsed]


def _ours(batch: bytes, **kwargs: int) -> list[tuple[Any, ...]]:
    return [(r.offset, r.timestamp_ms, r.key, r.value, r.headers)
            for r in codec.iter_records(batch, **kwargs)]


def _rows_as_read(rows: list[Row], base_offset: int = 0) -> list[tuple[Any, ...]]:
    return [(base_offset + i, ts, key, value, tuple(headers))
            for i, (key, value, headers, ts) in enumerate(rows)]


@pytest.mark.parametrize(("builder", "compression"), _builders())
def test_we_read_what_their_builders_write(builder: Callable[..., Any],
                                           compression: Codec) -> None:
    batch = codec.with_base_offset(_theirs(builder, compression, ROWS), 5_000)
    header = codec.validate_batch(batch, max_size_bytes=len(batch))
    assert header.compression is compression
    assert header.is_transactional and not header.is_control
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (4242, 7, 100)
    assert (header.record_count, header.last_offset_delta) == (len(ROWS), len(ROWS) - 1)
    assert header.max_timestamp_ms == max(r[3] for r in ROWS)
    assert _ours(batch) == _rows_as_read(ROWS, 5_000)
    assert _ours(batch, min_offset=5_150) == _rows_as_read(ROWS, 5_000)[150:]
    assert list(codec.iter_record_fields(batch)) == _rows_as_read(ROWS, 5_000)
    assert [(k.offset, k.key, k.is_tombstone) for k in codec.iter_record_keys(batch)] == [
        (5_000 + i, key, value is None) for i, (key, value, _h, _t) in enumerate(ROWS)]
    assert codec.first_null_key_offset(batch) == 5_001


@pytest.mark.parametrize(("builder", "compression"), _builders())
def test_what_compaction_keeps_of_their_batch_reads_in_their_readers(
        builder: Callable[..., Any], compression: Codec) -> None:
    batch = _theirs(builder, compression, ROWS)
    keep = {0, 2, 4, 150, len(ROWS) - 1}
    kept = codec.retain_records(batch, keep)
    header = codec.validate_batch(kept, max_size_bytes=len(kept), compacted=True)
    assert header.compression is compression
    want = [r for r in _rows_as_read(ROWS) if r[0] in keep]
    assert _ours(kept) == want
    for reader in (kafka_records.DefaultRecordBatch, aiokafka_records.DefaultRecordBatch):
        if reader is kafka_records.DefaultRecordBatch and compression not in (
                _kafka_python_codecs()):
            continue
        assert _read_theirs(reader, kept) == want
    # Nothing kept: a header alone, no codec (as Kafka's cleaner writes it).
    empty = codec.retain_records(batch, ())
    assert codec.read_header(empty).compression is Codec.NONE
    assert _read_theirs(aiokafka_records.DefaultRecordBatch, empty) == []
    assert _ours(empty) == []


@pytest.mark.parametrize(("reader", "compression"), _readers())
def test_their_readers_read_what_we_write(reader: Callable[[bytes], Any],
                                          compression: Codec) -> None:
    rows = [(k, v, h or None, ts) for k, v, h, ts in ROWS]
    batch = codec.encode_batch(rows, compression=compression, transactional=True, **PRODUCER)
    assert codec.read_header(batch).compression is compression
    assert _read_theirs(reader, batch) == _rows_as_read(ROWS)
    parsed = reader(batch)
    assert (parsed.producer_id, parsed.producer_epoch, parsed.base_sequence) == (4242, 7, 100)
    assert parsed.is_transactional and parsed.compression_type == compression


@pytest.mark.parametrize(("marker", "epoch"), [(codec.MARKER_COMMIT, 3), (codec.MARKER_ABORT, 0)])
def test_their_readers_read_our_markers(marker: int, epoch: int) -> None:
    batch = codec.encode_control_batch(marker=marker, coordinator_epoch=epoch, producer_id=9,
                                       producer_epoch=2, timestamp_ms=BASE_TS,
                                       base_offset=77, leader_epoch=4)
    parsed = kafka_records.DefaultRecordBatch(batch)
    assert parsed.validate_crc() and parsed.is_control_batch and parsed.is_transactional
    [record] = list(parsed)
    assert (record.offset, record.type, record.version) == (77, marker, 0)
    for cls in (aiokafka_records.DefaultRecordBatch, aiokafka_records._DefaultRecordBatchPy):
        parsed = cls(batch)
        assert parsed.validate_crc() and parsed.is_control_batch
        [record] = list(parsed)
        control = aiokafka_control.ControlRecord.parse(record.key)
        assert (control.version, control.type_) == (0, marker)
        # Kafka's EndTransactionMarker value: int16 version 0, int32 coordinator epoch.
        assert struct.unpack(">hi", record.value) == (0, epoch)


def test_raw_snappy_reads_as_librdkafka_writes_it() -> None:
    rows = [(k, v, h or None, ts) for k, v, h, ts in ROWS]
    plain = codec.encode_batch(rows)
    raw = bytes(cramjam.snappy.compress_raw(plain[codec.HEADER_SIZE_BYTES:]))
    assert not raw.startswith(b"\x82SNAPPY")
    batch = _with_attributes(plain[:codec.HEADER_SIZE_BYTES] + raw, int(Codec.SNAPPY))
    assert codec.read_header(batch).compression is Codec.SNAPPY
    assert _ours(batch) == _rows_as_read(ROWS)
    assert _read_theirs(aiokafka_records.DefaultRecordBatch, batch) == _rows_as_read(ROWS)


def test_log_append_time_gives_every_record_the_max_timestamp() -> None:
    rows = [(k, v, h or None, ts) for k, v, h, ts in ROWS[:10]]
    batch = _with_attributes(codec.encode_batch(rows), codec.ATTR_LOG_APPEND_TIME)
    max_ts = codec.read_header(batch).max_timestamp_ms
    theirs = _read_theirs(kafka_records.DefaultRecordBatch, batch)
    assert [r[1] for r in theirs] == [max_ts] * 10
    assert _ours(batch) == theirs
    assert [r.offset for r in codec.iter_records(batch, min_offset=4)] == list(range(4, 10))


def _with_attributes(batch: bytes, attributes: int) -> bytes:
    """The batch with these attributes, its length and CRC made right."""
    buf = bytearray(batch)
    struct.pack_into(">i", buf, 8, len(buf) - 12)
    struct.pack_into(">h", buf, codec.ATTRIBUTES_POS, attributes)
    struct.pack_into(">I", buf, codec.CRC_POS, codec.crc32c(memoryview(buf)[codec.CRC_START:]))
    return bytes(buf)
