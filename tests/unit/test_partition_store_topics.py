"""Topic names and configuration, and the checks on produced batches.

Goal: Kafka's topic-name rules, the config keys and value ranges, the
rules for growing a topic (CreatePartitions: only up, never an internal
topic, the same id and config after), and the order and codes of the
store's batch checks (empty -> INVALID_RECORD, too
large -> MESSAGE_TOO_LARGE, damaged -> CORRUPT_MESSAGE), each with a message
naming what was wrong.

Method: tables over the pure validators.
"""

from __future__ import annotations

import struct

import pytest

from oncelog.errors import ErrorCode
from oncelog.records import (
    CRC_POS,
    CRC_START,
    HEADER_SIZE_BYTES,
    LAST_OFFSET_DELTA_POS,
    MARKER_ABORT,
    RECORD_COUNT_POS,
    crc32c,
    encode_batch,
    encode_control_batch,
)
from services.partition_store.core.batches import check_produce_batch
from services.partition_store.core.outcomes import Rejection
from services.partition_store.core.topics import (
    TopicConfig,
    TopicRecord,
    decode_topic_record,
    encode_topic_record,
    grow_topic,
    parse_config,
    validate_new_topic,
)


@pytest.mark.parametrize(
    ("name", "partitions", "config", "code", "fragment"),
    [
        ("ok.topic_name-1", 3, {}, None, ""),
        ("a" * 249, 1, {}, None, ""),
        ("", 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION, "empty"),
        ("a" * 250, 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION, "250 characters"),
        (".", 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION, "not allowed"),
        ("..", 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION, "not allowed"),
        ("has space", 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION, "' '"),
        ("slash/topic", 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION, "'/'"),
        ("ünïcode", 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION, "'ü'"),
        ("__internal", 1, {}, ErrorCode.INVALID_TOPIC_EXCEPTION, "reserved"),
        ("t", 0, {}, ErrorCode.INVALID_PARTITIONS, "got 0"),
        ("t", -2, {}, ErrorCode.INVALID_PARTITIONS, "got -2"),
        ("t", 10_001, {}, ErrorCode.INVALID_PARTITIONS, "got 10001"),
        ("t", 1, {"retention.ms": "-1", "retention.bytes": "0",
                  "max.message.bytes": str(HEADER_SIZE_BYTES),
                  "cleanup.policy": "compact,delete"}, None, ""),
        ("t", 1, {"segment.ms": "1"}, ErrorCode.INVALID_CONFIG, "'segment.ms'"),
        ("t", 1, {"retention.ms": "soon"}, ErrorCode.INVALID_CONFIG, "not an integer"),
        ("t", 1, {"retention.ms": "-2"}, ErrorCode.INVALID_CONFIG, "retention.ms=-2"),
        ("t", 1, {"retention.bytes": "-5"}, ErrorCode.INVALID_CONFIG, "retention.bytes=-5"),
        ("t", 1, {"max.message.bytes": str(HEADER_SIZE_BYTES - 1)}, ErrorCode.INVALID_CONFIG,
         f"max.message.bytes={HEADER_SIZE_BYTES - 1}"),
        ("t", 1, {"max.message.bytes": str(16 * 1024 * 1024 + 1)}, ErrorCode.INVALID_CONFIG,
         "max.message.bytes"),
        ("t", 1, {"cleanup.policy": "shred"}, ErrorCode.INVALID_CONFIG, "cleanup.policy"),
        ("t", 1, {"cleanup.policy": "delete,delete"}, ErrorCode.INVALID_CONFIG,
         "cleanup.policy"),
        ("t", 1, {"delete.retention.ms": "0", "min.cleanable.dirty.ratio": "0.1"}, None, ""),
        ("t", 1, {"delete.retention.ms": "-1"}, ErrorCode.INVALID_CONFIG,
         "delete.retention.ms=-1"),
        ("t", 1, {"min.cleanable.dirty.ratio": "1.5"}, ErrorCode.INVALID_CONFIG,
         "between 0.0 and 1.0"),
        ("t", 1, {"min.cleanable.dirty.ratio": "nan"}, ErrorCode.INVALID_CONFIG,
         "between 0.0 and 1.0"),
        ("t", 1, {"min.cleanable.dirty.ratio": "half"}, ErrorCode.INVALID_CONFIG,
         "not a number"),
    ],
)
def test_validate_new_topic(
    name: str, partitions: int, config: dict[str, str], code: ErrorCode | None, fragment: str
) -> None:
    result = validate_new_topic(name, partitions, config)
    if code is None:
        assert isinstance(result, TopicConfig)
    else:
        assert isinstance(result, Rejection)
        assert result.code == code
        assert fragment in result.message


def test_internal_names_allowed_for_the_store_itself() -> None:
    assert isinstance(validate_new_topic("__consumer_offsets", 8, {}, allow_internal=True),
                      TopicConfig)


def test_config_defaults_and_record_round_trip() -> None:
    config = parse_config({})
    assert isinstance(config, TopicConfig)
    assert config.retention_ms == 7 * 24 * 3600 * 1000
    assert config.deletes
    compact = parse_config({"cleanup.policy": "compact"})
    assert isinstance(compact, TopicConfig) and not compact.deletes
    record = TopicRecord.build(name="t", topic_id=9, partitions=4,
                               overrides={"retention.ms": "5"}, internal=False)
    assert decode_topic_record(encode_topic_record(record)) == record
    assert record.config.retention_ms == 5


_PAYMENTS = TopicRecord.build(name="payments", topic_id=7, partitions=2,
                              overrides={"retention.ms": "5"}, internal=False)


@pytest.mark.parametrize(
    ("record", "count", "code", "fragments"),
    [
        # Kafka's rules, in its order: unknown topic first, then the count.
        (None, 5, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ("'payments'", "does not exist")),
        (_PAYMENTS, 2, ErrorCode.INVALID_PARTITIONS, ("already has 2 partitions",)),
        (_PAYMENTS, 1, ErrorCode.INVALID_PARTITIONS, ("has 2 partitions", "1 would not be")),
        (_PAYMENTS, 0, ErrorCode.INVALID_PARTITIONS, ("has 2 partitions", "0 would not be")),
        (_PAYMENTS, -3, ErrorCode.INVALID_PARTITIONS, ("-3 would not be",)),
        (_PAYMENTS, 10_001, ErrorCode.INVALID_PARTITIONS, ("1..10000", "got 10001")),
        # Internal topics never change, whatever the count (even a valid one).
        (TopicRecord.build(name="__consumer_offsets", topic_id=3, partitions=8, overrides={},
                           internal=True), 16,
         ErrorCode.INVALID_REQUEST, ("'__consumer_offsets' is internal", "8 partitions")),
    ],
)
def test_grow_topic_refusals(record: TopicRecord | None, count: int, code: ErrorCode,
                             fragments: tuple[str, ...]) -> None:
    result = grow_topic("payments" if record is None else record.name, record, count)
    assert isinstance(result, Rejection)
    assert result.code == code
    for fragment in fragments:
        assert fragment in result.message


def test_grow_topic_keeps_id_and_config() -> None:
    for count in (3, 5, 10_000):
        result = grow_topic("payments", _PAYMENTS, count)
        assert result == TopicRecord.build(name="payments", topic_id=7, partitions=count,
                                           overrides={"retention.ms": "5"}, internal=False)
    # The catalog record of the grown topic round-trips like any other.
    grown = grow_topic("payments", _PAYMENTS, 5)
    assert isinstance(grown, TopicRecord)
    assert decode_topic_record(encode_topic_record(grown)) == grown
    # Checking changed nothing in the record it was given.
    assert _PAYMENTS.partitions == 2


def test_compaction_config_and_internal_topics_always_compacted() -> None:
    defaults = parse_config({})
    assert isinstance(defaults, TopicConfig)
    assert (defaults.delete_retention_ms, defaults.min_cleanable_dirty_ratio) == (86_400_000, 0.5)
    assert not defaults.compacts
    both = parse_config({"cleanup.policy": "compact,delete", "min.cleanable.dirty.ratio": "0.25"})
    assert isinstance(both, TopicConfig) and both.compacts and both.deletes
    assert both.as_strings()["cleanup.policy"] == "compact,delete"
    assert both.as_strings()["min.cleanable.dirty.ratio"] == "0.25"
    # An internal topic whose catalog entry says "delete" is compacted anyway.
    legacy = TopicRecord.build(name="__transaction_state", topic_id=2, partitions=8,
                               overrides={"cleanup.policy": "delete"}, internal=True)
    assert legacy.compacted and not legacy.deletes
    user = TopicRecord.build(name="t", topic_id=3, partitions=1, overrides={}, internal=False)
    assert not user.compacted and user.deletes


def test_compacted_topics_refuse_records_without_a_key() -> None:
    keyed = _batch(2)
    assert not isinstance(check_produce_batch(
        keyed, topic_partition="t-1", max_message_bytes=1000, require_keys=True), Rejection)
    mixed = encode_batch([(b"k", b"v", None, 1), (None, b"v", None, 1)],
                         producer_id=4, producer_epoch=0, base_sequence=0)
    result = check_produce_batch(mixed, topic_partition="t-1", max_message_bytes=1000,
                                 require_keys=True)
    assert isinstance(result, Rejection)
    assert result.code is ErrorCode.INVALID_RECORD
    assert "compacted" in result.message and "record 1 of the batch" in result.message
    # The same batch is fine where keys are not required.
    assert not isinstance(check_produce_batch(
        mixed, topic_partition="t-1", max_message_bytes=1000), Rejection)


def _batch(count: int = 2) -> bytes:
    return encode_batch([(b"k", b"v" * 10, None, 1) for _ in range(count)],
                        producer_id=4, producer_epoch=0, base_sequence=0)


def _with_zero_records() -> bytes:
    raw = bytearray(_batch(1))
    struct.pack_into(">i", raw, LAST_OFFSET_DELTA_POS, -1)
    struct.pack_into(">i", raw, RECORD_COUNT_POS, 0)
    struct.pack_into(">I", raw, CRC_POS, crc32c(bytes(raw[CRC_START:])))
    return bytes(raw)


def _bad_crc() -> bytes:
    raw = bytearray(_batch())
    raw[-1] ^= 0xFF
    return bytes(raw)


@pytest.mark.parametrize(
    ("name", "batch", "limit", "code", "fragment"),
    [
        ("empty bytes", b"", 1000, ErrorCode.INVALID_RECORD, "empty"),
        ("zero records", _with_zero_records(), 1000, ErrorCode.INVALID_RECORD, "no records"),
        ("too large", _batch(), 60, ErrorCode.MESSAGE_TOO_LARGE, "max.message.bytes of 60"),
        ("short", b"\x00" * 10, 1000, ErrorCode.CORRUPT_MESSAGE, "shorter"),
        ("bad crc", _bad_crc(), 1000, ErrorCode.CORRUPT_MESSAGE, "CRC32C"),
        ("truncated", _batch()[:-4], 1000, ErrorCode.CORRUPT_MESSAGE, "length"),
        ("control batch", encode_control_batch(marker=MARKER_ABORT, coordinator_epoch=0,
                                               producer_id=4, producer_epoch=1, timestamp_ms=1),
         1000, ErrorCode.INVALID_RECORD, "WriteTxnMarkers"),
    ],
)
def test_check_produce_batch(
    name: str, batch: bytes, limit: int, code: ErrorCode, fragment: str
) -> None:
    result = check_produce_batch(batch, topic_partition="t-1", max_message_bytes=limit)
    assert isinstance(result, Rejection), name
    assert result.code == code
    assert fragment in result.message
    assert "t-1" in result.message


def test_check_produce_batch_accepts_a_good_batch() -> None:
    result = check_produce_batch(_batch(3), topic_partition="t-1", max_message_bytes=1000)
    assert not isinstance(result, Rejection)
    assert result.record_count == 3
