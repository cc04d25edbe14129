"""Batches of oncelog's first record format, read once to be converted.

Until Kafka's varint records replaced it, a batch held Kafka's v2 header
(unchanged since: oncelog.wire.records) followed by fixed-width records:

    int32  length of the rest of the record
    int32  offset_delta
    int64  timestamp_delta_ms         (from base_timestamp_ms)
    int32  key_length (-1: null)      then the key bytes
    int32  value_length (-1: null)    then the value bytes
    int32  header_count               then per header:
           int32 key_length, utf-8 key, int32 value_length (-1: null), value

Batches of that format were never compressed. Nothing reads them but the
store's one-time rewrite (format_upgrade.py), which turns each into the
same batch in Kafka's format: `convert_fixed_width_batch`.
"""

from __future__ import annotations

import struct

from oncelog.wire.compression import ATTR_COMPRESSION_MASK
from oncelog.wire.records import (
    HEADER_SIZE_BYTES,
    BatchFormatError,
    BatchHeader,
    Header,
    rebuild_batch,
    validate_batch,
)

# length, offset_delta, timestamp_delta_ms, key_length: the fixed start of a record.
_RECORD_START = struct.Struct(">iiqi")
_I32 = struct.Struct(">i")

FixedWidthRecord = tuple[int, int, bytes | None, bytes | None, tuple[Header, ...]]


class FixedWidthFormatError(ValueError):
    """The bytes are not a well-formed batch of the fixed-width format."""


def read_fixed_width_batch(batch: bytes) -> tuple[BatchHeader, list[FixedWidthRecord]]:
    """The header and the (offset delta, timestamp delta, key, value,
    headers) of every record of an intact fixed-width batch (CRC, length and
    counts checked first)."""
    try:
        header = validate_batch(batch, max_size_bytes=len(batch), compacted=True)
    except BatchFormatError as exc:
        raise FixedWidthFormatError(str(exc)) from None
    if header.attributes & ATTR_COMPRESSION_MASK:
        raise FixedWidthFormatError(
            f"attributes {header.attributes:#06x} name a compression codec; "
            "fixed-width batches were never compressed"
        )
    end = len(batch)
    pos = HEADER_SIZE_BYTES
    records: list[FixedWidthRecord] = []
    try:
        for _ in range(header.record_count):
            length, delta, ts_delta, key_len = _RECORD_START.unpack_from(batch, pos)
            next_pos = pos + 4 + length
            if length < _RECORD_START.size + 4 or next_pos > end:
                raise FixedWidthFormatError(
                    f"record at byte {pos} says {length} bytes, {end - pos - 4} remain"
                )
            p = pos + _RECORD_START.size
            key, p = _field(batch, p, key_len)
            (value_len,) = _I32.unpack_from(batch, p)
            value, p = _field(batch, p + 4, value_len)
            (header_count,) = _I32.unpack_from(batch, p)
            p += 4
            if header_count < 0:
                raise FixedWidthFormatError(f"record at byte {pos} has {header_count} headers")
            headers: list[Header] = []
            for _h in range(header_count):
                (hkey_len,) = _I32.unpack_from(batch, p)
                hkey, p = _field(batch, p + 4, hkey_len)
                if hkey is None:
                    raise FixedWidthFormatError(f"record at byte {pos} has a null header key")
                (hvalue_len,) = _I32.unpack_from(batch, p)
                hvalue, p = _field(batch, p + 4, hvalue_len)
                headers.append((hkey.decode(), hvalue))
            if p != next_pos:
                raise FixedWidthFormatError(
                    f"record at byte {pos} says {length} bytes but holds {p - pos - 4}"
                )
            records.append((delta, ts_delta, key, value, tuple(headers)))
            pos = next_pos
    except (struct.error, UnicodeDecodeError) as exc:
        raise FixedWidthFormatError(f"record at byte {pos}: {exc}") from None
    if pos != end:
        raise FixedWidthFormatError(
            f"batch holds {end - pos} bytes after its {header.record_count} records"
        )
    return header, records


def _field(batch: bytes, pos: int, length: int) -> tuple[bytes | None, int]:
    """The `length` bytes at `pos` (-1: null) and the position after them."""
    if length == -1:
        return None, pos
    if length < 0 or pos + length > len(batch):
        raise FixedWidthFormatError(f"field at byte {pos} says {length} bytes")
    return batch[pos:pos + length], pos + length


def convert_fixed_width_batch(batch: bytes) -> bytes:
    """The same batch in Kafka's record format: every header field kept
    (base offset, partition_leader_epoch, attributes, last_offset_delta,
    timestamps, producer fields, record_count), every record's offset,
    timestamp, key, value and headers kept; new length and CRC."""
    header, records = read_fixed_width_batch(batch)
    return rebuild_batch(header, records)
