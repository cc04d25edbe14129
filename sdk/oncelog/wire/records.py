"""The encoded record batch: oncelog's unit of produce, storage and fetch.

A batch travels and is stored as one opaque byte string. Servers read only the
fixed header (and check the CRC); clients encode and decode the records. The
layout follows Kafka's record batch v2 (magic 2), partition_leader_epoch
included, big-endian:

    offset  size  field
         0     8  base_offset             assigned by the store; 0 when produced
         8     4  batch_length            bytes after this field
        12     4  partition_leader_epoch  set by the store: the leader epoch of the
                                          replica that appended the batch; -1 when
                                          produced (NO_PARTITION_LEADER_EPOCH)
        16     1  magic                   BATCH_MAGIC
        17     4  crc                     CRC32C of every byte from offset 21 to the end
        21     2  attributes              bit 4: transactional, bit 5: control
        23     4  last_offset_delta       record_count - 1
        27     8  base_timestamp_ms
        35     8  max_timestamp_ms
        43     8  producer_id             -1: no producer state
        51     2  producer_epoch
        53     4  base_sequence           -1: not idempotent
        57     4  record_count
        61     -  records

This is format v2 with the partition_leader_epoch field (a 61-byte header).
Batches of the earlier layout (57 bytes, no epoch, same magic) do not parse
as this one and nothing converts them: there was no installed base to carry
over.

Each record, fixed-width (cheaper to encode in Python than varints):

    int32  length of the rest of the record
    int32  offset_delta
    int64  timestamp_delta_ms         (from base_timestamp_ms)
    int32  key_length (-1: null)      then the key bytes
    int32  value_length (-1: null)    then the value bytes
    int32  header_count               then per header:
           int32 key_length, utf-8 key, int32 value_length (-1: null), value

The CRC leaves out base_offset and partition_leader_epoch (as Kafka's does),
so the store sets both without recomputing it (`stamp_batch`). Whatever epoch a
producer writes is overwritten when the store stamps the batch, as Kafka's
broker does.

Compaction (the store's log cleaner) rewrites a stored batch with some of
its records left out, as Kafka does: the header keeps its base offset,
partition_leader_epoch, last_offset_delta, producer fields and timestamps,
record_count shrinks, and the records that remain keep their offset deltas,
so offsets have gaps and a batch may hold no record at all (kept only for
its producer fields). Only `validate_batch(..., compacted=True)` accepts
such a batch; a produced batch never has gaps.

A control batch (COMMIT/ABORT marker) holds one record whose key is
(int16 version, int16 marker type) and whose value is
(int16 version, int32 coordinator_epoch).
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import crc32c as _crc32c

BATCH_MAGIC = 2
HEADER_SIZE_BYTES = 61
# Byte positions of the header fields that code patches in place (the store
# stamps offset and epoch; the producer restamps its identity; tests damage a
# field on purpose). Nothing else should spell a position out.
PARTITION_LEADER_EPOCH_POS = 12
MAGIC_POS = 16
CRC_POS = 17
# The first byte the CRC covers (attributes).
CRC_START = 21
LAST_OFFSET_DELTA_POS = 23
PRODUCER_ID_POS = 43
BASE_SEQUENCE_POS = 53
RECORD_COUNT_POS = 57
# The leader epoch of a batch no store has stamped (what producers write).
NO_PARTITION_LEADER_EPOCH = -1
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
# The batch header holds the producer epoch as an int16.
MAX_PRODUCER_EPOCH = 2**15 - 1
NO_SEQUENCE = -1
# Sequence numbers are non-negative int32 values that wrap to 0 after this.
MAX_SEQUENCE = 2**31 - 1

MARKER_ABORT = 0
MARKER_COMMIT = 1

_HEADER = struct.Struct(">qiibIhiqqqhii")
# The fields before the CRC'd part: base_offset, batch_length,
# partition_leader_epoch, magic, crc.
_PREFIX = struct.Struct(">qiibI")
# The fields the CRC covers up to the records.
_CRC_HEADER = struct.Struct(">hiqqqhii")
_BASE_OFFSET = struct.Struct(">q")
# base_offset, batch_length, partition_leader_epoch: what stamp_batch writes.
_STAMP = struct.Struct(">qii")
_REC_FIXED = struct.Struct(">iiqi")  # length, offset_delta, timestamp_delta, key_length
# The same followed by value_length, for records with a null key.
_REC_NULL_KEY = struct.Struct(">iiqii")
_I32 = struct.Struct(">i")
_CONTROL_KEY = struct.Struct(">hh")
_CONTROL_VALUE = struct.Struct(">hi")
_NULL = _I32.pack(-1)
_NO_HEADERS = _I32.pack(0)

if not (
    _PREFIX.size == CRC_START
    and _PREFIX.size + _CRC_HEADER.size == _HEADER.size == HEADER_SIZE_BYTES
    and struct.calcsize(">qi") == PARTITION_LEADER_EPOCH_POS
    and struct.calcsize(">qii") == MAGIC_POS
    and struct.calcsize(">qiib") == CRC_POS
    and struct.calcsize(">qiibIh") == LAST_OFFSET_DELTA_POS
    and struct.calcsize(">qiibIhiqq") == PRODUCER_ID_POS
    and struct.calcsize(">qiibIhiqqqh") == BASE_SEQUENCE_POS
    and struct.calcsize(">qiibIhiqqqhi") == RECORD_COUNT_POS
):
    raise RuntimeError("records.py: the header positions do not match the header layout")

Header = tuple[str, bytes | None]


class BatchFormatError(ValueError):
    """The bytes are not a well-formed record batch; the message says what is wrong."""


def crc32c(data: bytes | memoryview) -> int:
    return int(_crc32c.crc32c(data))


def next_sequence(sequence: int, count: int = 1) -> int:
    """The sequence `count` after `sequence`, wrapping after MAX_SEQUENCE to 0."""
    return (sequence + count) % (MAX_SEQUENCE + 1)


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The fixed header of an encoded batch."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp_ms: int
    max_timestamp_ms: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return next_sequence(self.base_sequence, self.last_offset_delta)

    @property
    def size_bytes(self) -> int:
        return 12 + self.batch_length


class Record(NamedTuple):
    """One decoded record, as a reader sees it. A named tuple, not a frozen
    dataclass: a reader makes one per record, and a frozen dataclass costs
    three times as much to create (each field goes through
    object.__setattr__)."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]


# Record(...) without the named tuple's own __new__, a Python function that
# repacks its arguments: half the cost, for code that makes one per record.
_new_tuple = tuple.__new__


def encode_batch(
    records: Sequence[tuple[bytes | None, bytes | None, Sequence[Header] | None, int]],
    *,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    transactional: bool = False,
    base_offset: int = 0,
) -> bytes:
    """Encodes (key, value, headers, timestamp_ms) tuples into one batch.

    This is the producer's hot path: records with a value and no headers (the
    common case) take one struct.pack each; the rest go through _encode_record.
    """
    if not records:
        raise BatchFormatError("a record batch needs at least one record")
    timestamps = [r[3] for r in records]
    base_ts = min(timestamps)
    max_ts = max(timestamps)
    parts: list[bytes] = []
    extend = parts.extend
    pack_null_key = _REC_NULL_KEY.pack
    pack_with_key = _REC_FIXED.pack
    i32 = _I32.pack
    for delta, (key, value, headers, ts) in enumerate(records):
        if headers or value is None:
            parts.append(_encode_record(delta, key, value, headers, ts - base_ts))
            continue
        value_len = len(value)
        # length counts everything after the length field itself: 16 fixed
        # bytes, the key, 4 + value, and 4 for the (zero) header count.
        if key is None:
            extend((pack_null_key(24 + value_len, delta, ts - base_ts, -1, value_len),
                    value, _NO_HEADERS))
        else:
            key_len = len(key)
            extend((pack_with_key(24 + key_len + value_len, delta, ts - base_ts, key_len),
                    key, i32(value_len), value, _NO_HEADERS))
    body = b"".join(parts)
    attributes = ATTR_TRANSACTIONAL if transactional else 0
    return _finish(
        body, attributes, len(records), base_ts, max_ts,
        producer_id, producer_epoch, base_sequence, base_offset,
    )


def _encode_record(delta: int, key: bytes | None, value: bytes | None,
                   headers: Sequence[Header] | None, timestamp_delta_ms: int) -> bytes:
    """One record in the general form (null value, headers)."""
    i32 = _I32.pack
    key_len = -1 if key is None else len(key)
    value_len = -1 if value is None else len(value)
    hparts = [i32(len(headers) if headers else 0)]
    for hkey, hvalue in headers or ():
        hk = hkey.encode()
        hparts.append(i32(len(hk)))
        hparts.append(hk)
        if hvalue is None:
            hparts.append(_NULL)
        else:
            hparts.append(i32(len(hvalue)))
            hparts.append(hvalue)
    hblob = b"".join(hparts)
    length = 16 + max(key_len, 0) + 4 + max(value_len, 0) + len(hblob)
    return b"".join((
        _REC_FIXED.pack(length, delta, timestamp_delta_ms, key_len),
        key or b"",
        _NULL if value is None else i32(value_len) + value,
        hblob,
    ))


def encode_control_batch(
    *,
    marker: int,
    coordinator_epoch: int,
    producer_id: int,
    producer_epoch: int,
    timestamp_ms: int,
    base_offset: int = 0,
    leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """A control batch carrying one COMMIT or ABORT marker, written by the
    store at `leader_epoch` (its partition_leader_epoch)."""
    key = _CONTROL_KEY.pack(0, marker)
    value = _CONTROL_VALUE.pack(0, coordinator_epoch)
    record = (
        _REC_FIXED.pack(16 + len(key) + 4 + len(value) + 4, 0, 0, len(key))
        + key + _I32.pack(len(value)) + value + _NO_HEADERS
    )
    return _finish(
        record, ATTR_TRANSACTIONAL | ATTR_CONTROL, 1, timestamp_ms, timestamp_ms,
        producer_id, producer_epoch, NO_SEQUENCE, base_offset, leader_epoch=leader_epoch,
    )


def _finish(
    body: bytes, attributes: int, count: int, base_ts: int, max_ts: int,
    producer_id: int, producer_epoch: int, base_sequence: int, base_offset: int,
    *, leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    tail = _CRC_HEADER.pack(
        attributes, count - 1, base_ts, max_ts,
        producer_id, producer_epoch, base_sequence, count,
    ) + body
    return _assemble(tail, base_offset=base_offset, leader_epoch=leader_epoch)


def _assemble(tail: bytes, *, base_offset: int, leader_epoch: int) -> bytes:
    """The whole batch: the fields before the CRC'd part, then `tail` (from
    attributes to the end), whose CRC this computes."""
    batch_length = len(tail) + _PREFIX.size - 12
    return _PREFIX.pack(base_offset, batch_length, leader_epoch, BATCH_MAGIC, crc32c(tail)) + tail


def read_header(batch: bytes | memoryview) -> BatchHeader:
    """Parses the fixed header without checking the CRC or the records."""
    if len(batch) < HEADER_SIZE_BYTES:
        raise BatchFormatError(
            f"record batch is {len(batch)} bytes, shorter than the "
            f"{HEADER_SIZE_BYTES}-byte header"
        )
    return BatchHeader(*_HEADER.unpack_from(batch, 0))


def validate_batch(
    batch: bytes | memoryview, *, max_size_bytes: int, compacted: bool = False
) -> BatchHeader:
    """Checks everything a store checks before appending: sizes, magic, CRC, counts.

    With compacted=True (a reader of stored batches) a batch that compaction
    rewrote passes too: 0 <= record_count <= last_offset_delta + 1.
    Raises BatchFormatError naming the first problem found.
    """
    if len(batch) > max_size_bytes:
        raise BatchFormatError(
            f"record batch is {len(batch)} bytes, over the limit of {max_size_bytes}"
        )
    header = read_header(batch)
    if header.magic != BATCH_MAGIC:
        raise BatchFormatError(f"record batch magic is {header.magic}, expected {BATCH_MAGIC}")
    if header.batch_length != len(batch) - 12:
        raise BatchFormatError(
            f"record batch length field says {header.batch_length} bytes follow it, "
            f"but {len(batch) - 12} do"
        )
    actual_crc = crc32c(memoryview(batch)[CRC_START:])
    if actual_crc != header.crc:
        raise BatchFormatError(
            f"record batch CRC32C is {actual_crc:#010x}, header says {header.crc:#010x}"
        )
    if compacted:
        if not 0 <= header.record_count <= header.last_offset_delta + 1:
            raise BatchFormatError(
                f"record batch has {header.record_count} records, expected 0.."
                f"{header.last_offset_delta + 1} (last_offset_delta "
                f"{header.last_offset_delta})"
            )
    elif header.record_count < 1:
        raise BatchFormatError(f"record batch has {header.record_count} records, need at least 1")
    elif header.last_offset_delta != header.record_count - 1:
        raise BatchFormatError(
            f"record batch last_offset_delta is {header.last_offset_delta}, "
            f"expected record_count - 1 = {header.record_count - 1}"
        )
    if header.base_sequence < NO_SEQUENCE:
        raise BatchFormatError(f"record batch base_sequence {header.base_sequence} is negative")
    if header.producer_id >= 0 and header.base_sequence == NO_SEQUENCE and not header.is_control:
        raise BatchFormatError(
            f"record batch from producer {header.producer_id} has no base_sequence"
        )
    if header.producer_id < NO_PRODUCER_ID:
        raise BatchFormatError(f"record batch producer_id {header.producer_id} is invalid")
    if header.is_transactional and header.producer_id < 0:
        raise BatchFormatError("a transactional record batch needs a producer_id")
    return header


def with_base_offset(batch: bytes, base_offset: int) -> bytes:
    """The same batch with its base_offset field set (the CRC does not cover it).
    Its partition_leader_epoch stays as it was: the store uses stamp_batch."""
    return _BASE_OFFSET.pack(base_offset) + batch[8:]


def stamp_batch(batch: bytes | memoryview, *, base_offset: int, leader_epoch: int) -> bytes:
    """The same batch with base_offset and partition_leader_epoch set, as the
    store appends it (neither is covered by the CRC, so it stays valid).
    One copy of the batch."""
    (batch_length,) = _I32.unpack_from(batch, 8)
    return b"".join((
        _STAMP.pack(base_offset, batch_length, leader_epoch),
        memoryview(batch)[MAGIC_POS:],
    ))


def iter_records(batch: bytes | memoryview, *, min_offset: int = 0) -> Iterator[Record]:
    """Decodes the records of a batch, skipping those below min_offset."""
    header = read_header(batch)
    # Slicing bytes copies once; a memoryview slice would first make a view
    # and then a copy (a consumer decodes every record, so it shows).
    data = batch if isinstance(batch, bytes) else bytes(batch)
    pos = HEADER_SIZE_BYTES
    end = 12 + header.batch_length
    base = header.base_offset
    base_ts = header.base_timestamp_ms
    unpack_fixed = _REC_FIXED.unpack_from
    unpack_i32 = _I32.unpack_from
    for _ in range(header.record_count):
        if pos + 20 > end:
            raise BatchFormatError(f"record at byte {pos} runs past the end of its batch")
        length, delta, ts_delta, key_len = unpack_fixed(data, pos)
        next_pos = pos + 4 + length
        if next_pos > end:
            raise BatchFormatError(f"record at byte {pos} runs past the end of its batch")
        offset = base + delta
        if offset < min_offset:
            pos = next_pos
            continue
        p = pos + 20
        key = None
        if key_len >= 0:
            key = data[p : p + key_len]
            p += key_len
        (value_len,) = unpack_i32(data, p)
        p += 4
        value = None
        if value_len >= 0:
            value = data[p : p + value_len]
            p += value_len
        (header_count,) = unpack_i32(data, p)
        p += 4
        headers: tuple[Header, ...] = ()
        if header_count:
            hs = []
            for _h in range(header_count):
                (hk_len,) = unpack_i32(data, p)
                p += 4
                hk = data[p : p + hk_len].decode()
                p += hk_len
                (hv_len,) = unpack_i32(data, p)
                p += 4
                hv = None
                if hv_len >= 0:
                    hv = data[p : p + hv_len]
                    p += hv_len
                hs.append((hk, hv))
            headers = tuple(hs)
        yield _new_tuple(Record, (offset, base_ts + ts_delta, key, value, headers))
        pos = next_pos


@dataclass(frozen=True, slots=True)
class RecordKey:
    """What compaction needs of a record: its offset, key, and whether its
    value is null (a tombstone)."""

    offset: int
    key: bytes | None
    is_tombstone: bool


def _record_spans(batch: bytes | memoryview) -> Iterator[tuple[int, int, int, int]]:
    """(offset delta, start, end, key length) of each record's bytes, checking
    that each lies inside the batch. iter_records walks the records itself:
    it is the consumer's per-record hot path, and going through this
    generator costs it about 15 %."""
    header = read_header(batch)
    pos = HEADER_SIZE_BYTES
    end = 12 + header.batch_length
    unpack_fixed = _REC_FIXED.unpack_from
    for _ in range(header.record_count):
        if pos + 20 > end:
            raise BatchFormatError(f"record at byte {pos} runs past the end of its batch")
        length, delta, _ts_delta, key_len = unpack_fixed(batch, pos)
        next_pos = pos + 4 + length
        if next_pos > end or pos + 24 + max(key_len, 0) > next_pos:
            raise BatchFormatError(f"record at byte {pos} runs past the end of its batch")
        yield delta, pos, next_pos, key_len
        pos = next_pos


def iter_record_keys(batch: bytes | memoryview) -> Iterator[RecordKey]:
    """The key and tombstone flag of every record, without copying values."""
    base = read_header(batch).base_offset
    mv = memoryview(batch)
    for delta, start, _end, key_len in _record_spans(mv):
        p = start + 20
        key = None if key_len < 0 else bytes(mv[p : p + key_len])
        (value_len,) = _I32.unpack_from(mv, p + max(key_len, 0))
        yield RecordKey(base + delta, key, value_len < 0)


def first_null_key_offset(batch: bytes | memoryview) -> int | None:
    """The offset of the first record without a key, None when every record
    has one (compacted topics accept only keyed records)."""
    base = read_header(batch).base_offset
    for delta, _start, _end, key_len in _record_spans(batch):
        if key_len < 0:
            return base + delta
    return None


def retain_records(batch: bytes | memoryview, offsets: Collection[int]) -> bytes:
    """The batch with only the records at `offsets`: their bytes unchanged,
    the header's base offset, partition_leader_epoch, last_offset_delta,
    producer fields and timestamps kept, record_count and length updated, the
    CRC recomputed.
    An empty `offsets` leaves a batch of no records (its header only)."""
    header = read_header(batch)
    mv = memoryview(batch)
    base = header.base_offset
    wanted = set(offsets)
    kept = [
        mv[start:end] for delta, start, end, _key_len in _record_spans(mv)
        if base + delta in wanted
    ]
    if len(kept) != len(wanted):
        raise BatchFormatError(
            f"batch at offset {base} holds {len(kept)} of the {len(wanted)} offsets to retain"
        )
    tail = _CRC_HEADER.pack(
        header.attributes, header.last_offset_delta, header.base_timestamp_ms,
        header.max_timestamp_ms, header.producer_id, header.producer_epoch,
        header.base_sequence, len(kept),
    ) + b"".join(kept)
    return _assemble(tail, base_offset=base, leader_epoch=header.partition_leader_epoch)


def control_marker(batch: bytes | memoryview) -> tuple[int, int]:
    """(marker type, coordinator_epoch) of a control batch."""
    header = read_header(batch)
    if not header.is_control:
        raise BatchFormatError("not a control batch")
    (_length, _delta, _ts, key_len) = _REC_FIXED.unpack_from(batch, HEADER_SIZE_BYTES)
    p = HEADER_SIZE_BYTES + 20
    _version, marker = _CONTROL_KEY.unpack_from(batch, p)
    p += key_len + 4
    _vversion, coordinator_epoch = _CONTROL_VALUE.unpack_from(batch, p)
    return marker, coordinator_epoch
