"""Reading one offset range in a Spark task: records to Arrow batches.

Runs inside Spark's Python workers, one call per input partition. The SDK's
Consumer does the fetching (assign + seek, never a group), so the
store's read_committed filtering applies unchanged.

A range [start, end) is done when the consumer's *position* reaches `end`,
not when end - start records were read: under read_committed the store
leaves out aborted records and transaction markers, and the consumer's
position jumps over them (to the store's next fetch offset), so a range can
hold fewer records than offsets, or none. Records at or past `end` that
arrive in the same fetch are dropped: the next range starts there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from oncelog import Consumer, ConsumerRecord, errors
from oncelog_spark.offsets import OffsetRange
from oncelog_spark.options import SourceOptions

# The same columns as Spark's Kafka source (without its timestampType).
SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("headers", ArrayType(StructType([
        StructField("key", StringType()),
        StructField("value", BinaryType()),
    ]))),
])

# Spark checks the Arrow schema of every batch a source returns against the
# one it derives from SCHEMA (timestamps in UTC microseconds); derive it the
# same way so they cannot drift apart.
ARROW_SCHEMA = to_arrow_schema(SCHEMA, timezone="UTC")

log = logging.getLogger("oncelog_spark.source")

# Records per Arrow batch handed to Spark (Spark's own default for Arrow
# batches is 10,000 rows).
RECORDS_PER_ARROW_BATCH = 10_000
# How long one poll waits for records before the no-progress clock is checked.
_POLL_WAIT_S = 0.5


def read_range(options: SourceOptions, rng: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Records of `rng` under the query's isolation level, as Arrow batches
    of ARROW_SCHEMA."""
    tp = rng.topic_partition
    builder = _BatchBuilder()
    # auto_offset_reset "none": a start offset that is no longer in the log
    # (retention removed it) must fail the task, or with fail_on_data_loss
    # false be skipped knowingly, not silently read from elsewhere.
    with Consumer(
        bootstrap=options.bootstrap,
        isolation_level=options.isolation_level,
        auto_offset_reset="none",
        max_poll_records=RECORDS_PER_ARROW_BATCH,
        **options.security.client_options(),
    ) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, rng.start)
        position = rng.start
        progress_at_s = time.monotonic()
        while position < rng.end:
            try:
                records = consumer.poll(timeout=_POLL_WAIT_S)
            except errors.OffsetOutOfRangeError as exc:
                skip_to = _skip_lost(consumer, options, rng, position, exc)
                if skip_to >= rng.end:
                    break
                consumer.seek(tp, skip_to)
                position = skip_to
                progress_at_s = time.monotonic()
                continue
            for record in records:
                if record.offset >= rng.end:
                    break
                builder.add(record)
            if builder.full:
                yield builder.take()
            new_position = consumer.position(tp)
            if new_position > position:
                position = new_position
                progress_at_s = time.monotonic()
            elif (time.monotonic() - progress_at_s) * 1000 > options.poll_timeout_ms:
                raise errors.KafkaTimeoutError(
                    f"oncelog source: {tp.topic}-{tp.partition} stayed at offset {position} "
                    f"for {options.poll_timeout_ms} ms while reading [{rng.start}, {rng.end}) "
                    f"from {options.bootstrap} (is the partition store up?)"
                )
    if builder.size:
        yield builder.take()


def _skip_lost(
    consumer: Consumer,
    options: SourceOptions,
    rng: OffsetRange,
    position: int,
    exc: errors.OncelogError,
) -> int:
    """Where to go on when `position` is no longer in the partition's log:
    its earliest offset (retention removed what was before), or the end of
    the range when the log now ends below `position` (the topic was
    recreated). Raises when fail_on_data_loss is true."""
    tp = rng.topic_partition
    if options.fail_on_data_loss:
        raise errors.error_for(
            errors.ErrorCode.OFFSET_OUT_OF_RANGE,
            f"oncelog source: cannot read {tp.topic}-{tp.partition} offsets "
            f"[{rng.start}, {rng.end}): {exc.message}. The records are no longer in the log "
            f"(retention) or the topic was recreated. Set option fail_on_data_loss (Kafka: "
            f"failOnDataLoss) to false to skip them with a warning",
        ) from None
    earliest = consumer.beginning_offsets([tp])[tp]
    if position < earliest:
        skip_to = min(earliest, rng.end)
        log.warning("oncelog source: %s-%d offsets [%d, %d) are no longer in the log "
                    "(retention); skipping them (fail_on_data_loss is false)",
                    tp.topic, tp.partition, position, skip_to)
        return skip_to
    log.warning("oncelog source: %s-%d ends below offset %d (the topic was recreated); "
                "skipping offsets [%d, %d) (fail_on_data_loss is false)",
                tp.topic, tp.partition, position, position, rng.end)
    return rng.end


class _BatchBuilder:
    """Columns of records not yet handed to Spark."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.topics: list[str] = []
        self.partitions: list[int] = []
        self.offsets: list[int] = []
        self.timestamps_us: list[int] = []
        self.headers: list[list[dict[str, object]]] = []

    @property
    def size(self) -> int:
        return len(self.offsets)

    @property
    def full(self) -> bool:
        return self.size >= RECORDS_PER_ARROW_BATCH

    def add(self, record: ConsumerRecord) -> None:
        self.keys.append(record.key)
        self.values.append(record.value)
        self.topics.append(record.topic)
        self.partitions.append(record.partition)
        self.offsets.append(record.offset)
        self.timestamps_us.append(record.timestamp_ms * 1000)
        self.headers.append([{"key": k, "value": v} for k, v in record.headers])

    def take(self) -> pa.RecordBatch:
        types = [field.type for field in ARROW_SCHEMA]
        columns = [self.keys, self.values, self.topics, self.partitions, self.offsets,
                   self.timestamps_us, self.headers]
        batch = pa.RecordBatch.from_arrays(
            [pa.array(column, type=t) for column, t in zip(columns, types, strict=True)],
            schema=ARROW_SCHEMA,
        )
        self._reset()
        return batch
