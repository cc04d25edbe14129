"""The encoded record batch: oncelog's unit of produce, storage and fetch.

A batch travels and is stored as one opaque byte string. Servers read only the
fixed header (and check the CRC); clients encode and decode the records. The
format is Kafka's record batch v2 (magic 2), byte for byte, so a batch passes
between a Kafka client and the log unchanged, both ways. The header,
big-endian:

    offset  size  field
         0     8  base_offset             assigned by the store; 0 when produced
         8     4  batch_length            bytes after this field
        12     4  partition_leader_epoch  set by the store: the leader epoch of the
                                          replica that appended the batch; -1 when
                                          produced (NO_PARTITION_LEADER_EPOCH)
        16     1  magic                   BATCH_MAGIC
        17     4  crc                     CRC32C of every byte from offset 21 to the end
        21     2  attributes              bits 0-2: compression codec, bit 3: log
                                          append time, bit 4: transactional,
                                          bit 5: control
        23     4  last_offset_delta       record_count - 1
        27     8  base_timestamp_ms
        35     8  max_timestamp_ms
        43     8  producer_id             -1: no producer state
        51     2  producer_epoch
        53     4  base_sequence           -1: not idempotent
        57     4  record_count
        61     -  records (compressed as one block when the codec is not 0)

Each record, where varint is a zigzag base-128 varint (as Kafka's ByteUtils
writes it: 1 byte for -64..63) and varlong the same for 64-bit values:

    varint   length of the rest of the record
    int8     attributes (0; unused)
    varlong  timestamp_delta_ms      (from base_timestamp_ms)
    varint   offset_delta
    varint   key_length (-1: null)   then the key bytes
    varint   value_length (-1: null) then the value bytes
    varint   header_count            then per header:
             varint key_length, utf-8 key, varint value_length (-1: null), value

Compression (oncelog.wire.compression): codecs 1 gzip, 2 snappy, 3 lz4 and
4 zstd compress the records part as one block; `record_count` counts the
records inside. Ids 5-7 are refused (UnsupportedCodecError).

The CRC leaves out base_offset and partition_leader_epoch (as Kafka's does),
so the store sets both without recomputing it (`stamp_batch`). Whatever epoch a
producer writes is overwritten when the store stamps the batch, as Kafka's
broker does.

Compaction (the store's log cleaner) rewrites a stored batch with some of
its records left out, as Kafka does: the header keeps its base offset,
partition_leader_epoch, last_offset_delta, producer fields and timestamps,
record_count shrinks, and the records that remain keep their offset deltas,
so offsets have gaps and a batch may hold no record at all (kept only for
its producer fields; such a batch says codec 0). What remains is compressed
again with the batch's codec. Only `validate_batch(..., compacted=True)`
accepts such a batch; a produced batch never has gaps.

A control batch (COMMIT/ABORT marker) holds one record whose key is
(int16 version 0, int16 marker type) and whose value is
(int16 version 0, int32 coordinator_epoch): Kafka's EndTransactionMarker.

Speed: this module is the SDK's per-record path (the producer encodes, the
consumer decodes), and varints cost more in Python than struct does. The
common record (a value, no headers, small lengths and deltas) therefore
takes table look-ups instead of function calls: `_VARINT` (and its
variants) hold the encoding of every value below VARINT_TABLE_SIZE,
`_UNZIGZAG` and `_UNZIGZAG_2` the value of every one- and two-byte varint;
anything else goes through `_varint` and `_read_varint`. A reader that
unpacks every record takes plain tuples (`iter_record_fields`): making a
named tuple per record costs about as much as parsing the record.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, NamedTuple, TypeVar

import crc32c as _crc32c

from .compression import (
    ATTR_COMPRESSION_MASK,
    Codec,
    CompressionError,
    UnknownCodecError,
    codec_of,
    compress,
    decompress,
)
from .limits import MAX_UNCOMPRESSED_RECORDS_BYTES

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
ATTRIBUTES_POS = 21
LAST_OFFSET_DELTA_POS = 23
PRODUCER_ID_POS = 43
BASE_SEQUENCE_POS = 53
RECORD_COUNT_POS = 57
# The leader epoch of a batch no store has stamped (what producers write).
NO_PARTITION_LEADER_EPOCH = -1
# Bit 3: every record's timestamp is the batch's max_timestamp_ms (a broker
# that stamps LogAppendTime writes it; this codec reads it, never writes it).
ATTR_LOG_APPEND_TIME = 0x08
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
CONTROL_RECORD_VERSION = 0

_HEADER = struct.Struct(">qiibIhiqqqhii")
# The fields before the CRC'd part: base_offset, batch_length,
# partition_leader_epoch, magic, crc.
_PREFIX = struct.Struct(">qiibI")
# The fields the CRC covers up to the records.
_CRC_HEADER = struct.Struct(">hiqqqhii")
_BASE_OFFSET = struct.Struct(">q")
# base_offset, batch_length, partition_leader_epoch: what stamp_batch writes.
_STAMP = struct.Struct(">qii")
_I32 = struct.Struct(">i")
_CONTROL_KEY = struct.Struct(">hh")
_CONTROL_VALUE = struct.Struct(">hi")
_ATTRIBUTES = struct.Struct(">h")

if not (
    _PREFIX.size == CRC_START == ATTRIBUTES_POS
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


class UnsupportedCodecError(BatchFormatError):
    """The batch names a compression codec id that is none of Kafka's (5-7).
    The bytes are intact: the batch can never be read, so it is refused as an
    invalid record rather than as damage that a retry might cure."""


def crc32c(data: bytes | memoryview) -> int:
    return int(_crc32c.crc32c(data))


def next_sequence(sequence: int, count: int = 1) -> int:
    """The sequence `count` after `sequence`, wrapping after MAX_SEQUENCE to 0."""
    return (sequence + count) % (MAX_SEQUENCE + 1)


# ----------------------------------------------------------------- varints


def _varint(value: int) -> bytes:
    """`value` (a signed 64-bit integer) as a zigzag varint."""
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it) of the zigzag varint at `pos`, of any
    length up to 10 bytes (a varlong). IndexError past the end of data."""
    raw = 0
    shift = 0
    while True:
        byte = data[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
        if shift > 63:
            raise BatchFormatError(f"varint at byte {pos - 10} is longer than 10 bytes")


def _unzigzag(raw: int) -> int:
    return (raw >> 1) ^ -(raw & 1)


# The encoding of 0..VARINT_TABLE_SIZE-1 (lengths and deltas of the common
# record: at most two bytes each), its size, the same after the record's
# attributes byte (0) for timestamp deltas, and after a null key (-1) for
# value lengths; and of -1 (a null key or value).
VARINT_TABLE_SIZE = 1 << 13
_VARINT = [_varint(n) for n in range(VARINT_TABLE_SIZE)]
_VARINT_SIZE = [len(v) for v in _VARINT]
_NULL = _varint(-1)
_AFTER_ATTRIBUTES = [b"\x00" + v for v in _VARINT]
_AFTER_NULL_KEY = [_NULL + v for v in _VARINT]
# The value of a one-byte varint (0x00-0x7f), and of a two-byte one by its
# first byte (0x80-0xff) and its second (0x00-0x7f): look-ups instead of a
# shift, a mask and an or per byte.
_UNZIGZAG = [_unzigzag(raw) for raw in range(0x80)]
_UNZIGZAG_2: list[list[int | None]] = [[] for _ in range(0x80)] + [
    [_unzigzag((first & 0x7F) | (second << 7)) if second < 0x80 else None
     for second in range(0x100)]
    for first in range(0x80, 0x100)
]


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
    def compression(self) -> Codec:
        """The codec of the records part; UnsupportedCodecError for ids 5-7."""
        try:
            return codec_of(self.attributes)
        except UnknownCodecError as exc:
            raise UnsupportedCodecError(str(exc)) from None

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


# ---------------------------------------------------------------- encoding


def encode_batch(
    records: Sequence[tuple[bytes | None, bytes | None, Sequence[Header] | None, int]],
    *,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    transactional: bool = False,
    base_offset: int = 0,
    compression: Codec = Codec.NONE,
) -> bytes:
    """Encodes (key, value, headers, timestamp_ms) tuples into one batch,
    its records compressed with `compression`: encode_columns, given the
    records as rows."""
    if not records:
        raise BatchFormatError("a record batch needs at least one record")
    keys, values, headers, timestamps = zip(*records, strict=True)
    return encode_columns(
        list(keys), list(values), list(timestamps),
        list(headers) if any(headers) else None,
        producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=base_sequence,
        transactional=transactional, base_offset=base_offset, compression=compression,
    )


def encode_columns(
    keys: list[bytes | None],
    values: list[bytes | None],
    timestamps: list[int],
    headers: list[Sequence[Header] | None] | None = None,
    *,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    transactional: bool = False,
    base_offset: int = 0,
    compression: Codec = Codec.NONE,
) -> bytes:
    """Encodes records given as columns (record i is keys[i], values[i],
    timestamps[i] and headers[i]; `headers` None: no record has any) into
    one batch, its records compressed with `compression`. A batch that
    compression would make larger goes out uncompressed (codec 0): every
    reader reads both, and it keeps a batch of incompressible records within
    the size the producer counted for it.

    This is the producer's hot path (its batches hold their records as these
    columns: no tuple per record): a record with a value and no headers
    (the common case) is a few table look-ups and one extend; the rest go
    through _encode_record.
    """
    count = len(values)
    if not count:
        raise BatchFormatError("a record batch needs at least one record")
    if len(keys) != count or len(timestamps) != count or (
            headers is not None and len(headers) != count):
        raise ValueError(
            f"columns of different lengths: {len(keys)} keys, {count} values, "
            f"{len(timestamps)} timestamps, {None if headers is None else len(headers)} headers")
    base_ts = min(timestamps)
    max_ts = max(timestamps)
    parts: list[bytes] = []
    extend = parts.extend
    varint = _VARINT
    size = _VARINT_SIZE
    after_attributes = _AFTER_ATTRIBUTES
    after_null_key = _AFTER_NULL_KEY
    for delta in range(count):
        key = keys[delta]
        value = values[delta]
        ts_delta = timestamps[delta] - base_ts
        if value is None or (headers is not None and headers[delta]):
            parts.append(_encode_record(delta, key, value,
                                        None if headers is None else headers[delta], ts_delta))
            continue
        try:
            value_len = len(value)
            # length, attributes + timestamp delta, offset delta, key
            # length (+ key), value length, value, header count (0). The
            # length counts the bytes after itself: the 1s are the
            # attributes, a null key and the header count.
            if key is None:
                extend((
                    varint[3 + size[ts_delta] + size[delta] + size[value_len] + value_len],
                    after_attributes[ts_delta], varint[delta], after_null_key[value_len],
                    value, b"\x00",
                ))
            else:
                key_len = len(key)
                extend((
                    varint[2 + size[ts_delta] + size[delta] + size[key_len] + key_len
                           + size[value_len] + value_len],
                    after_attributes[ts_delta], varint[delta], varint[key_len], key,
                    varint[value_len], value, b"\x00",
                ))
        except (IndexError, OverflowError):
            # A delta or length beyond the tables: the general form. (Compiled
            # by mypyc, an index beyond a C integer raises OverflowError.)
            parts.append(_encode_record(delta, key, value, None, ts_delta))
    body = b"".join(parts)
    attributes = ATTR_TRANSACTIONAL if transactional else 0
    if compression is not Codec.NONE:
        packed = compress(compression, body)
        if len(packed) < len(body):
            body = packed
            attributes |= compression
    return _finish(
        body, attributes, count, base_ts, max_ts,
        producer_id, producer_epoch, base_sequence, base_offset,
    )


def _encode_record(delta: int, key: bytes | None, value: bytes | None,
                   headers: Sequence[Header] | None, timestamp_delta_ms: int) -> bytes:
    """One record in the general form (null value, headers, large numbers)."""
    parts = [
        b"\x00", _varint(timestamp_delta_ms), _varint(delta),
        _NULL if key is None else _varint(len(key)), key or b"",
        _NULL if value is None else _varint(len(value)), value or b"",
        _varint(len(headers) if headers else 0),
    ]
    for hkey, hvalue in headers or ():
        encoded_key = hkey.encode()
        parts.append(_varint(len(encoded_key)))
        parts.append(encoded_key)
        if hvalue is None:
            parts.append(_NULL)
        else:
            parts.append(_varint(len(hvalue)))
            parts.append(hvalue)
    body = b"".join(parts)
    return _varint(len(body)) + body


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
    record = _encode_record(
        0, _CONTROL_KEY.pack(CONTROL_RECORD_VERSION, marker),
        _CONTROL_VALUE.pack(CONTROL_RECORD_VERSION, coordinator_epoch), None, 0,
    )
    return _finish(
        record, ATTR_TRANSACTIONAL | ATTR_CONTROL, 1, timestamp_ms, timestamp_ms,
        producer_id, producer_epoch, NO_SEQUENCE, base_offset, leader_epoch=leader_epoch,
    )


def rebuild_batch(
    header: BatchHeader,
    records: Iterable[tuple[int, int, bytes | None, bytes | None, Sequence[Header] | None]],
) -> bytes:
    """A batch with `header`'s fields (base offset, partition_leader_epoch,
    attributes but the codec, last_offset_delta, timestamps, producer
    fields) holding these records, given as (offset delta, timestamp delta
    in ms, key, value, headers), uncompressed; record_count, length and CRC
    computed. For batches converted from another record format: offsets and
    timestamps stay exactly as they were."""
    parts = [
        _encode_record(delta, key, value, headers, timestamp_delta_ms)
        for delta, timestamp_delta_ms, key, value, headers in records
    ]
    tail = _CRC_HEADER.pack(
        header.attributes & ~ATTR_COMPRESSION_MASK, header.last_offset_delta,
        header.base_timestamp_ms, header.max_timestamp_ms, header.producer_id,
        header.producer_epoch, header.base_sequence, len(parts),
    ) + b"".join(parts)
    return _assemble(
        tail, base_offset=header.base_offset, leader_epoch=header.partition_leader_epoch
    )


def _finish(
    body: bytes, attributes: int, count: int, base_ts: int, max_ts: int,
    producer_id: int, producer_epoch: int, base_sequence: int, base_offset: int,
    *, leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
) -> bytes:
    """The batch of these records: the header's fields, then `body`, copied
    once (the CRC is computed over the header's part and the body apart)."""
    crc_header = _CRC_HEADER.pack(
        attributes, count - 1, base_ts, max_ts,
        producer_id, producer_epoch, base_sequence, count,
    )
    crc = int(_crc32c.crc32c(body, _crc32c.crc32c(crc_header)))
    batch_length = len(crc_header) + len(body) + _PREFIX.size - 12
    return b"".join((
        _PREFIX.pack(base_offset, batch_length, leader_epoch, BATCH_MAGIC, crc), crc_header, body,
    ))


def _assemble(tail: bytes, *, base_offset: int, leader_epoch: int) -> bytes:
    """The whole batch: the fields before the CRC'd part, then `tail` (from
    attributes to the end), whose CRC this computes."""
    batch_length = len(tail) + _PREFIX.size - 12
    return _PREFIX.pack(base_offset, batch_length, leader_epoch, BATCH_MAGIC, crc32c(tail)) + tail


# ------------------------------------------------------------------ header


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
    """Checks everything a store checks before appending: sizes, magic, CRC,
    counts, the codec id. The records themselves are not decoded.

    With compacted=True (a reader of stored batches) a batch that compaction
    rewrote passes too: 0 <= record_count <= last_offset_delta + 1.
    Raises BatchFormatError naming the first problem found
    (UnsupportedCodecError for a codec id of 5-7 in an intact batch).
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
    # Last: the bytes are intact, so an unknown codec is the batch's
    # meaning, not damage (UnsupportedCodecError).
    _ = header.compression
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


# ---------------------------------------------------------------- decoding


def _records_part(batch: bytes | memoryview, header: BatchHeader) -> tuple[bytes, int, int]:
    """(data, start, end): the bytes that hold the records, decompressed when
    the batch is compressed, and where the records lie in them. `data` ends
    where the records do, so a read past them raises IndexError."""
    end = 12 + header.batch_length
    if end > len(batch) or end < HEADER_SIZE_BYTES:
        raise BatchFormatError(
            f"record batch length field says {header.batch_length} bytes follow it, "
            f"but {len(batch) - 12} do"
        )
    codec = header.compression
    if codec is Codec.NONE:
        # Slicing bytes copies once; a memoryview slice would first make a
        # view and then a copy (a consumer decodes every record, so it shows).
        if isinstance(batch, bytes) and len(batch) == end:
            return batch, HEADER_SIZE_BYTES, end
        return bytes(batch[:end]), HEADER_SIZE_BYTES, end
    if header.record_count == 0:
        # Compaction leaves an emptied batch uncompressed; any other writer's
        # is read as holding nothing, whatever its (absent) records part.
        return b"", 0, 0
    try:
        data = decompress(
            codec, memoryview(batch)[HEADER_SIZE_BYTES:end],
            max_bytes=MAX_UNCOMPRESSED_RECORDS_BYTES,
        )
    except CompressionError as exc:
        raise BatchFormatError(
            f"record batch at offset {header.base_offset}: {exc}"
        ) from None
    return data, 0, len(data)


def iter_records(batch: bytes | memoryview, *, min_offset: int = 0) -> Iterator[Record]:
    """Decodes the records of a batch (of any codec), skipping those below
    min_offset."""
    # tuple.__new__ called by map, not by Python code: Record without its
    # own __new__ and without a call per record in the loop that parses.
    records: Iterator[Record] = map(
        _new_tuple, repeat(Record), iter_record_fields(batch, min_offset=min_offset)
    )
    return records


RecordFields = tuple[int, int, bytes | None, bytes | None, tuple[Header, ...]]
# What take_records makes: the consumer's record type (a named tuple).
_Record = TypeVar("_Record", bound=tuple[Any, ...])


def iter_record_fields(batch: bytes | memoryview, *, min_offset: int = 0) -> Iterator[RecordFields]:
    """What iter_records yields, as plain (offset, timestamp_ms, key, value,
    headers) tuples: a reader that unpacks every record (the consumer)
    saves the named tuple, which costs as much to make as parsing the
    record does.

    The consumer's per-record hot path: each varint is read inline, one- and
    two-byte ones through the _UNZIGZAG and _UNZIGZAG_2 tables (the second
    says None for a longer one); a longer one, a record with headers, and
    every error take the slow paths.
    """
    header = read_header(batch)
    if header.attributes & ATTR_LOG_APPEND_TIME:
        yield from _log_append_time_fields(batch, header, min_offset)
        return
    data, pos, end = _records_part(batch, header)
    base = header.base_offset
    base_ts = header.base_timestamp_ms
    count = header.record_count
    if min_offset > base:
        pos, count = _skip_below(data, pos, count, base, min_offset)
    unzigzag = _UNZIGZAG
    unzigzag_2 = _UNZIGZAG_2
    read_varint = _read_varint
    # None from _UNZIGZAG_2: a varint longer than two bytes (read_varint's).
    length: int | None
    ts_delta: int | None
    delta: int | None
    key_len: int | None
    value_len: int | None
    try:
        for _ in range(count):
            # length (the record ends at next_pos)
            raw = data[pos]
            if raw < 0x80:
                pos += 1
                next_pos = pos + unzigzag[raw]
            else:
                length = unzigzag_2[raw][data[pos + 1]]
                if length is None:
                    length, pos = read_varint(data, pos)
                else:
                    pos += 2
                next_pos = pos + length
            # attributes (unused, skipped), then the timestamp delta
            raw = data[pos + 1]
            if raw < 0x80:
                timestamp_ms = base_ts + unzigzag[raw]
                pos += 2
            else:
                ts_delta = unzigzag_2[raw][data[pos + 2]]
                if ts_delta is None:
                    ts_delta, pos = read_varint(data, pos + 1)
                else:
                    pos += 3
                timestamp_ms = base_ts + ts_delta
            # offset delta
            raw = data[pos]
            if raw < 0x80:
                offset = base + unzigzag[raw]
                pos += 1
            else:
                delta = unzigzag_2[raw][data[pos + 1]]
                if delta is None:
                    delta, pos = read_varint(data, pos)
                else:
                    pos += 2
                offset = base + delta
            # key: 1 is the varint -1, a null key; any negative length is
            # one, as Kafka reads it
            raw = data[pos]
            if raw == 1:
                key = None
                pos += 1
            else:
                if raw < 0x80:
                    key_len = unzigzag[raw]
                    pos += 1
                else:
                    key_len = unzigzag_2[raw][data[pos + 1]]
                    if key_len is None:
                        key_len, pos = read_varint(data, pos)
                    else:
                        pos += 2
                if key_len < 0:
                    key = None
                else:
                    key = data[pos:pos + key_len]
                    pos += key_len
            # value
            raw = data[pos]
            if raw < 0x80:
                value_len = unzigzag[raw]
                pos += 1
            else:
                value_len = unzigzag_2[raw][data[pos + 1]]
                if value_len is None:
                    value_len, pos = read_varint(data, pos)
                else:
                    pos += 2
            if value_len < 0:
                value = None
            else:
                value_end = pos + value_len
                value = data[pos:value_end]
                pos = value_end
            # headers: a zero count that ends the record, or the slow path
            if pos + 1 == next_pos and data[pos] == 0:
                pos = next_pos
                yield offset, timestamp_ms, key, value, ()
                continue
            record_start = pos
            headers, pos = _read_headers(data, pos)
            if pos != next_pos:
                raise BatchFormatError(
                    f"record ending at byte {next_pos} of the records has a field running "
                    f"to byte {pos} (from byte {record_start})"
                )
            yield offset, timestamp_ms, key, value, headers
    except IndexError:
        raise BatchFormatError(
            f"record at byte {pos} runs past the end of its batch"
        ) from None
    if pos != end:
        raise BatchFormatError(
            f"record batch holds {end - pos} bytes after its {header.record_count} records"
        )


def _skip_below(data: bytes, pos: int, count: int, base: int,
                min_offset: int) -> tuple[int, int]:
    """(position, records left) of the first of `count` records from `pos`
    whose offset is min_offset or more (offset deltas may have gaps)."""
    try:
        while count:
            length, body = _read_varint(data, pos)
            _ts_delta, after_ts = _read_varint(data, body + 1)
            delta, _after = _read_varint(data, after_ts)
            if base + delta >= min_offset:
                break
            pos = body + length
            count -= 1
    except IndexError:
        raise BatchFormatError(f"record at byte {pos} runs past the end of its batch") from None
    return pos, count


# Records as columns: offsets, timestamps (ms), keys, values and headers;
# item i of each list is record i.
RecordColumns = tuple[list[int], list[int], list[bytes | None], list[bytes | None],
                      list[tuple[Header, ...]]]


def iter_buffered_fields(batches: deque[bytes], min_offset: int = 0) -> Iterator[RecordFields]:
    """The records of a queue of fetched batches (a consumer's buffer), as
    iter_record_fields yields them, from `min_offset` on; control batches
    give none. Each batch leaves the queue as its first record is read, so
    batches appended meanwhile (fetched ahead) are read too, and each starts
    after the last one begun (a store may answer a fetch with a batch that
    begins before the fetch offset: its head is skipped).

    Here, beside iter_record_fields, so that where this module is compiled
    the consumer's per-record step from one record to the next is too."""
    while batches:
        batch = batches.popleft()
        header = read_header(batch)
        if not header.attributes & ATTR_CONTROL:
            yield from iter_record_fields(batch, min_offset=min_offset)
        min_offset = max(min_offset, header.base_offset + header.last_offset_delta + 1)


def take_records(records: Iterator[RecordFields], limit: int, topic: str, partition: int,
                 record_type: type[_Record]) -> tuple[list[_Record], bool]:
    """Up to `limit` (>= 1) of `records` as `record_type` tuples of (topic,
    partition, offset, key, value, headers, timestamp_ms) (the consumer's
    ConsumerRecord), and whether `records` ran out before the limit.

    The consumer's hand-out (Consumer.poll): here, so that where this module
    is compiled the per-record loop is too. Each tuple is made as a named
    tuple's own constructor would make it, without its per-call overhead."""
    out: list[_Record] = []
    new_tuple = tuple.__new__
    for offset, timestamp_ms, key, value, headers in records:
        out.append(new_tuple(record_type,
                             (topic, partition, offset, key, value, headers, timestamp_ms)))
        if len(out) >= limit:
            return out, False
    return out, True


def take_columns(records: Iterator[RecordFields], limit: int) -> tuple[RecordColumns, bool]:
    """Up to `limit` (>= 1) of `records` (what iter_record_fields yields) as
    columns, and whether `records` ran out before the limit.

    The consumer's columnar hand-out (Consumer.poll_columns): here, so that
    where this module is compiled the per-record loop is too, and a caller
    that reads keys and values by the column makes no object per record."""
    offsets: list[int] = []
    timestamps_ms: list[int] = []
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    headers: list[tuple[Header, ...]] = []
    for offset, timestamp_ms, key, value, record_headers in records:
        offsets.append(offset)
        timestamps_ms.append(timestamp_ms)
        keys.append(key)
        values.append(value)
        headers.append(record_headers)
        if len(offsets) >= limit:
            return (offsets, timestamps_ms, keys, values, headers), False
    return (offsets, timestamps_ms, keys, values, headers), True


def _log_append_time_fields(batch: bytes | memoryview, header: BatchHeader,
                            min_offset: int) -> Iterator[RecordFields]:
    """The records of a batch whose records all take its max_timestamp_ms
    (attributes bit 3): read as the same batch without the bit, their
    timestamps replaced. Rare: no producer writes one."""
    plain = bytearray(batch)
    _ATTRIBUTES.pack_into(plain, ATTRIBUTES_POS, header.attributes & ~ATTR_LOG_APPEND_TIME)
    max_ts = header.max_timestamp_ms
    for offset, _ts, key, value, headers in iter_record_fields(bytes(plain),
                                                               min_offset=min_offset):
        yield offset, max_ts, key, value, headers


def _read_headers(data: bytes, pos: int) -> tuple[tuple[Header, ...], int]:
    count, pos = _read_varint(data, pos)
    if count < 0:
        raise BatchFormatError(f"record at byte {pos} has {count} headers")
    headers = []
    for _ in range(count):
        key_len, pos = _read_varint(data, pos)
        if key_len < 0:
            raise BatchFormatError(f"record header key at byte {pos} has length {key_len}")
        raw_key = data[pos:pos + key_len]
        if len(raw_key) != key_len:
            raise IndexError(pos)
        try:
            key = raw_key.decode()
        except UnicodeDecodeError as exc:
            raise BatchFormatError(f"record header key at byte {pos} is not UTF-8: {exc}") from None
        pos += key_len
        value_len, pos = _read_varint(data, pos)
        value = None
        if value_len >= 0:
            value = data[pos:pos + value_len]
            pos += value_len
        headers.append((key, value))
    return tuple(headers), pos


@dataclass(frozen=True, slots=True)
class RecordKey:
    """What compaction needs of a record: its offset, key, and whether its
    value is null (a tombstone)."""

    offset: int
    key: bytes | None
    is_tombstone: bool


# Where one record lies in the records part: (offset delta, start, end,
# key start, key length, value start, value length); a length of -1: null.
# A plain tuple: compaction walks every record of the batches it cleans.
_Span = tuple[int, int, int, int, int, int, int]


def _record_spans(data: bytes, pos: int, end: int, count: int) -> Iterator[_Span]:
    """The span of each of `count` records from `pos`, checking that each
    lies inside [pos, end) and that its fields fill it exactly. Varints are
    read inline as in iter_record_fields (which walks the records itself:
    it is the consumer's hot path, and this is compaction's)."""
    unzigzag = _UNZIGZAG
    unzigzag_2 = _UNZIGZAG_2
    read_varint = _read_varint
    length: int | None
    delta: int | None
    key_len: int | None
    value_len: int | None
    start = pos
    try:
        for _ in range(count):
            start = pos
            raw = data[pos]
            if raw < 0x80:
                length = unzigzag[raw]
                pos += 1
            else:
                length = unzigzag_2[raw][data[pos + 1]]
                if length is None:
                    length, pos = read_varint(data, pos)
                else:
                    pos += 2
            next_pos = pos + length
            if length < 0 or next_pos > end:
                raise BatchFormatError(
                    f"record at byte {start} says {length} bytes, {end - pos} remain"
                )
            # attributes, then the timestamp delta (skipped)
            raw = data[pos + 1]
            if raw < 0x80:
                pos += 2
            elif data[pos + 2] < 0x80:
                pos += 3
            else:
                _ts_delta, pos = read_varint(data, pos + 1)
            raw = data[pos]
            if raw < 0x80:
                delta = unzigzag[raw]
                pos += 1
            else:
                delta = unzigzag_2[raw][data[pos + 1]]
                if delta is None:
                    delta, pos = read_varint(data, pos)
                else:
                    pos += 2
            raw = data[pos]
            if raw < 0x80:
                key_len = unzigzag[raw]
                pos += 1
            else:
                key_len = unzigzag_2[raw][data[pos + 1]]
                if key_len is None:
                    key_len, pos = read_varint(data, pos)
                else:
                    pos += 2
            key_start = pos
            if key_len > 0:
                pos += key_len
            raw = data[pos]
            if raw < 0x80:
                value_len = unzigzag[raw]
                pos += 1
            else:
                value_len = unzigzag_2[raw][data[pos + 1]]
                if value_len is None:
                    value_len, pos = read_varint(data, pos)
                else:
                    pos += 2
            value_start = pos
            if value_len > 0:
                pos += value_len
            if pos + 1 == next_pos and data[pos] == 0:
                pos = next_pos
            else:
                if pos >= next_pos:
                    raise BatchFormatError(
                        f"record at byte {start} runs past its length {length}"
                    )
                _headers, pos = _read_headers(data, pos)
                if pos != next_pos:
                    raise BatchFormatError(
                        f"record at byte {start} says {length} bytes but holds "
                        f"{pos - next_pos + length}"
                    )
            yield delta, start, next_pos, key_start, key_len, value_start, value_len
    except IndexError:
        raise BatchFormatError(
            f"record at byte {start} runs past the end of its batch"
        ) from None
    if pos != end:
        raise BatchFormatError(f"record batch holds {end - pos} bytes after its {count} records")


def _spans_of(batch: bytes | memoryview) -> tuple[BatchHeader, bytes, Iterator[_Span]]:
    header = read_header(batch)
    data, pos, end = _records_part(batch, header)
    return header, data, _record_spans(data, pos, end, header.record_count)


def iter_record_keys(batch: bytes | memoryview) -> Iterator[RecordKey]:
    """The key and tombstone flag of every record, without copying values."""
    header, data, spans = _spans_of(batch)
    base = header.base_offset
    for delta, _start, _end, key_start, key_len, _value_start, value_len in spans:
        key = None if key_len < 0 else data[key_start:key_start + key_len]
        yield RecordKey(base + delta, key, value_len < 0)


def first_null_key_offset(batch: bytes | memoryview) -> int | None:
    """The offset of the first record without a key, None when every record
    has one (compacted topics accept only keyed records)."""
    header, _data, spans = _spans_of(batch)
    for delta, _start, _end, _key_start, key_len, _value_start, _value_len in spans:
        if key_len < 0:
            return header.base_offset + delta
    return None


def retain_records(batch: bytes | memoryview, offsets: Collection[int]) -> bytes:
    """The batch with only the records at `offsets`: their bytes unchanged
    (compressed again with the batch's codec), the header's base offset,
    partition_leader_epoch, last_offset_delta, producer fields and
    timestamps kept, record_count and length updated, the CRC recomputed.
    An empty `offsets` leaves a batch of no records (its header only, codec
    0, as Kafka's log cleaner writes it)."""
    header, data, spans = _spans_of(batch)
    base = header.base_offset
    wanted = set(offsets)
    kept = [data[start:end] for delta, start, end, _ks, _kl, _vs, _vl in spans
            if base + delta in wanted]
    if len(kept) != len(wanted):
        raise BatchFormatError(
            f"batch at offset {base} holds {len(kept)} of the {len(wanted)} offsets to retain"
        )
    body = b"".join(kept)
    attributes = header.attributes
    if kept:
        body = compress(header.compression, body)
    else:
        attributes &= ~ATTR_COMPRESSION_MASK
    tail = _CRC_HEADER.pack(
        attributes, header.last_offset_delta, header.base_timestamp_ms,
        header.max_timestamp_ms, header.producer_id, header.producer_epoch,
        header.base_sequence, len(kept),
    ) + body
    return _assemble(tail, base_offset=base, leader_epoch=header.partition_leader_epoch)


def control_marker(batch: bytes | memoryview) -> tuple[int, int]:
    """(marker type, coordinator_epoch) of a control batch, read as Kafka's
    EndTransactionMarker: a key of at least 4 bytes and a value of at least 6,
    versions not negative."""
    header, data, spans = _spans_of(batch)
    if not header.is_control:
        raise BatchFormatError("not a control batch")
    span = next(spans, None)
    if span is None:
        raise BatchFormatError(f"control batch at offset {header.base_offset} has no record")
    _delta, _start, _end, key_start, key_len, value_start, value_len = span
    if key_len < _CONTROL_KEY.size or value_len < _CONTROL_VALUE.size:
        raise BatchFormatError(
            f"control record at offset {header.base_offset} has a {key_len}-byte key "
            f"and a {value_len}-byte value, expected at least {_CONTROL_KEY.size} "
            f"and {_CONTROL_VALUE.size}"
        )
    key_version, marker = _CONTROL_KEY.unpack_from(data, key_start)
    value_version, coordinator_epoch = _CONTROL_VALUE.unpack_from(data, value_start)
    if key_version < 0 or value_version < 0:
        raise BatchFormatError(
            f"control record at offset {header.base_offset} has version {key_version} "
            f"(key) and {value_version} (value); neither may be negative"
        )
    return marker, coordinator_epoch
