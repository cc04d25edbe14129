"""The checks a produced batch passes before the append rules see it.

Order and codes (every message names the partition and the sizes or fields):
* zero bytes, or a well-formed batch with record_count 0: INVALID_RECORD
  (an empty batch is a client bug, not damaged bytes);
* more bytes than the topic's max.message.bytes: MESSAGE_TOO_LARGE;
* anything records.validate_batch refuses (short header, wrong magic, length
  field, CRC, counts, sequence fields): CORRUPT_MESSAGE;
* an intact batch whose attributes name a compression codec of 5-7 (none of
  Kafka's): INVALID_RECORD, not CORRUPT_MESSAGE, which Kafka's clients
  retry: the same bytes would be refused for ever;
* a control batch: INVALID_RECORD (markers come only through WriteTxnMarkers);
* on a compacted topic, a record without a key: INVALID_RECORD (Kafka's
  "Compacted topic cannot accept message without key": compaction keeps the
  newest record per key, and a record without one has no place in that).
  Only here are records decoded on produce (decompressed first when the
  batch is compressed); records that do not decode: CORRUPT_MESSAGE.

Not checked: partition_leader_epoch. Producers write -1, but whatever a
batch carries is overwritten when the store appends it (records.stamp_batch
sets the leader's epoch), as Kafka's broker overwrites it; the CRC does not
cover it, so refusing a batch for it would only punish a client for a field
it does not own.
"""

from __future__ import annotations

from oncelog.wire.errors import ErrorCode
from oncelog.wire.records import (
    CRC_START,
    HEADER_SIZE_BYTES,
    BatchFormatError,
    BatchHeader,
    UnsupportedCodecError,
    crc32c,
    first_null_key_offset,
    read_header,
    validate_batch,
)

from .outcomes import Rejection


def check_produce_batch(
    batch: bytes, *, topic_partition: str, max_message_bytes: int, require_keys: bool = False
) -> BatchHeader | Rejection:
    size = len(batch)
    if size == 0:
        return Rejection(
            ErrorCode.INVALID_RECORD, f"{topic_partition}: the batch is empty (0 bytes)"
        )
    if size > max_message_bytes:
        return Rejection(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"{topic_partition}: the batch is {size} bytes, over the topic's "
            f"max.message.bytes of {max_message_bytes}",
        )
    try:
        header = validate_batch(batch, max_size_bytes=max_message_bytes)
    except UnsupportedCodecError as exc:
        return Rejection(ErrorCode.INVALID_RECORD, f"{topic_partition}: {exc}")
    except BatchFormatError as exc:
        if _is_intact_but_empty(batch):
            return Rejection(
                ErrorCode.INVALID_RECORD, f"{topic_partition}: the batch has no records"
            )
        return Rejection(ErrorCode.CORRUPT_MESSAGE, f"{topic_partition}: {exc}")
    if header.is_control:
        return Rejection(
            ErrorCode.INVALID_RECORD,
            f"{topic_partition}: control batches are written only through WriteTxnMarkers",
        )
    if require_keys:
        try:
            offset = first_null_key_offset(batch)
        except BatchFormatError as exc:
            return Rejection(ErrorCode.CORRUPT_MESSAGE, f"{topic_partition}: {exc}")
        if offset is not None:
            index = offset - header.base_offset
            return Rejection(
                ErrorCode.INVALID_RECORD,
                f"{topic_partition}: the topic is compacted and cannot accept a record "
                f"without a key (record {index} of the batch has none)",
            )
    return header


def _is_intact_but_empty(batch: bytes) -> bool:
    if len(batch) < HEADER_SIZE_BYTES:
        return False
    header = read_header(batch)
    return (
        header.record_count <= 0
        and header.batch_length == len(batch) - 12
        and crc32c(memoryview(batch)[CRC_START:]) == header.crc
    )


def stored_batch_damage(value: bytes | memoryview) -> str | None:
    """Why a batch read back from storage is not the one that was written
    (too short for its header, or its CRC32C does not match), None when it
    is intact. Checked on every batch a fetch or a replica fetch reads, so
    damaged bytes are never served nor copied."""
    if len(value) < HEADER_SIZE_BYTES:
        return f"the stored batch is {len(value)} bytes, shorter than its header"
    header = read_header(value)
    actual = crc32c(memoryview(value)[CRC_START:])
    if actual != header.crc:
        return f"the stored batch's CRC32C is {actual:#010x}, its header says {header.crc:#010x}"
    return None
