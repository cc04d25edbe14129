"""The write side of a sink in one Spark task: rows to records, inside one
transaction per writer and micro-batch.

Both sinks (the `foreachBatch` helper and `format("oncelog")`) write a
micro-batch the same way. Writer N of application A is the transactional
producer `A-N`; its transaction holds the writer's rows and, as a
transactional offset of the sink-side group `A`, the micro-batch id:
offset `batch_id + 1` for partition N of the output topic. So the group's
committed offset of (topic, N) is the next micro-batch writer N has not
written, and it becomes visible exactly when the writer's records do. (A
`format("oncelog")` sink given no app_id derives A from the checkpoint
location, and its group is `A-QUERY_ID`: `SinkOptions.group`.)

A writer's steps, in this order:

1. `init_transactions()` — fences any earlier producer with the same id (a
   zombie task attempt): its open transaction is aborted, one it had
   already decided to commit is completed first.
2. Read the group's committed offset of (topic, N), waiting while one is
   pending. If it is past `batch_id`, this micro-batch was written before
   (a replay): write nothing.
3. Send the rows, add the batch id as a transactional offset, then commit
   (or, for the two-phase-commit sink, prepare and leave the commit to the
   driver).

Input rows follow Spark's Kafka sink: `value` (binary or string, required),
optional `key` (binary or string), `headers`
(array<struct<key: string, value: binary>>), `topic` (string; null or
absent: the sink's topic) and `partition` (int; null or absent: by key, as
the producer chooses). Other columns are ignored, as Spark's Kafka sink
ignores them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    StringType,
    StructField,
    StructType,
)

from oncelog import Consumer, GroupMetadata, Producer, TopicPartition
from oncelog_spark.options import SinkOptions

log = logging.getLogger("oncelog_spark.sink")

# Kafka sink's header type: what `headers` must be.
HEADERS_TYPE = ArrayType(StructType([
    StructField("key", StringType()),
    StructField("value", BinaryType()),
]))
# The columns a sink reads, in the order they are handed to the writers.
SINK_COLUMNS = ("key", "value", "headers", "topic", "partition")
# Bigger batches than the producer's default (16 KiB): a write task sends
# a whole micro-batch at once, and fewer, larger batches cost the store
# and the producer's sender less per record.
WRITER_BATCH_SIZE_BYTES = 256 * 1024
WRITER_LINGER_MS = 5


class SinkInputError(ValueError):
    """The DataFrame given to a sink lacks a column or has one of the wrong type."""


@dataclass(frozen=True, slots=True)
class SinkColumns:
    """Which of the sink's columns the input has (`value` always does)."""

    names: tuple[str, ...]

    @classmethod
    def of(cls, schema: StructType) -> SinkColumns:
        """Checks the input's schema; names the column and type that are wrong."""
        fields = {f.name: f.dataType for f in schema.fields}
        if "value" not in fields:
            raise SinkInputError(
                f"an oncelog sink needs a `value` column (binary or string); the input has "
                f"{', '.join(fields) or 'no columns'}"
            )
        allowed: dict[str, tuple[DataType, ...]] = {
            "key": (BinaryType(), StringType()),
            "value": (BinaryType(), StringType()),
            "headers": (HEADERS_TYPE,),
            "topic": (StringType(),),
            "partition": (IntegerType(),),
        }
        for name, types in allowed.items():
            if name in fields and fields[name] not in types:
                wanted = " or ".join(t.simpleString() for t in types)
                raise SinkInputError(
                    f"column `{name}` of an oncelog sink's input must be {wanted}, got "
                    f"{fields[name].simpleString()}"
                )
        return cls(tuple(name for name in SINK_COLUMNS if name in fields))


@dataclass(frozen=True, slots=True)
class WriterOutcome:
    """What one writer did with one micro-batch."""

    writer: int
    batch_id: int
    records: int
    # The micro-batch had been written by this writer before: nothing sent.
    skipped: bool
    # Where the task's time went, ms (for benchmarks and logs): the
    # producer's start and init_transactions(); the look at the sink-side
    # group; waiting for the input's batches (Spark reading them upstream);
    # handing them to the producer; the batch id's offset and the commit
    # (or prepare), which waits for every record's acknowledgement.
    init_ms: float = 0.0
    check_ms: float = 0.0
    input_ms: float = 0.0
    send_ms: float = 0.0
    commit_ms: float = 0.0


def transactional_id(app_id: str, writer: int) -> str:
    return f"{app_id}-{writer}"


def group_metadata(group_id: str) -> GroupMetadata:
    """The sink-side group: no members, so commits come from outside the
    group protocol (generation -1, no member id)."""
    return GroupMetadata(group_id=group_id, generation_id=-1, member_id="")


def batch_offsets(topic: str, writer: int, batch_id: int) -> dict[TopicPartition, int]:
    """The transactional offset that records `batch_id` as written by `writer`."""
    return {TopicPartition(topic, writer): batch_id + 1}


def next_batches(options: SinkOptions, writers: Sequence[int]) -> dict[int, int]:
    """For each writer, the first micro-batch id it has not written (0: none
    written). Waits while a writer's offset is pending (its transaction not
    yet ended), so the answer is the outcome of every ended transaction.

    A writer's batch ids are offsets of the output topic's partition with
    its number, so a writer beyond the topic's partitions is an error."""
    with Consumer(bootstrap=options.bootstrap, group_id=options.group,
                  **options.security.client_options()) as consumer:
        partitions = len(consumer.partitions_for_topic(options.topic))
        beyond = [w for w in writers if w >= partitions]
        if beyond:
            raise SinkInputError(
                f"the oncelog sink of app_id {options.app_id!r} writes with {max(beyond) + 1} "
                f"writers but its topic {options.topic!r} has {partitions} partitions: each "
                f"writer records its micro-batch ids at the partition with its number. Use at "
                f"most {partitions} writers (with format(\"oncelog\"): Spark partitions; "
                f"repartition the stream) or a topic with more partitions"
            )
        tps = [TopicPartition(options.topic, w) for w in writers]
        committed = consumer.committed(tps)
    return {tp.partition: committed[tp] or 0 for tp in tps}


def check_not_ahead(options: SinkOptions, writer: int, batch_id: int, next_batch: int) -> None:
    """A replay is of the latest micro-batch only, so a writer can be at most
    one micro-batch ahead of the one being written. Further ahead, the
    sink-side group belongs to another run of the query (another checkpoint
    with the same app_id): writing would silently skip micro-batches."""
    if next_batch > batch_id + 1:
        raise SinkInputError(
            f"the oncelog sink of app_id {options.app_id!r}: writer {writer} has already "
            f"written micro-batch {next_batch - 1}, but the query is at micro-batch "
            f"{batch_id}. The app_id was used by a query with another checkpoint; give this "
            f"query its own app_id (or delete group {options.group!r} to start over)"
        )


def new_producer(options: SinkOptions, writer: int, **extra: Any) -> Producer:
    return Producer(
        bootstrap=options.bootstrap,
        transactional_id=transactional_id(options.app_id, writer),
        transaction_timeout_ms=options.transaction_timeout_ms,
        batch_size=WRITER_BATCH_SIZE_BYTES,
        linger_ms=WRITER_LINGER_MS,
        **options.security.client_options(),
        **extra,
    )


def begin_unless_written(
    producer: Producer, options: SinkOptions, writer: int, batch_id: int,
    clock: _Clock | None = None,
) -> bool:
    """Steps 1 and 2: fences earlier attempts, then True when `batch_id`
    still has to be written by this writer (its transaction is begun)."""
    producer.init_transactions()
    if clock is not None:
        clock.lap("init")
    next_batch = next_batches(options, [writer])[writer]
    if clock is not None:
        clock.lap("check")
    check_not_ahead(options, writer, batch_id, next_batch)
    if next_batch > batch_id:
        log.info("app %s writer %d: micro-batch %d was written before; skipping it",
                 options.app_id, writer, batch_id)
        return False
    producer.begin_transaction()
    return True


def send_rows(
    producer: Producer,
    options: SinkOptions,
    columns: SinkColumns,
    batches: Iterable[pa.RecordBatch],
    clock: _Clock | None = None,
) -> int:
    """Sends every row of `batches` in the open transaction; returns how many.
    With a clock, the time spent waiting for each input batch goes to
    "input" and the rest to "send"."""
    if clock is not None:
        batches = clock.timed_input(batches)
    sent = 0
    crash_after = options.test_crash_after_records
    # Only key and value columns: each Arrow batch goes in one send_many()
    # (the same records, without a Python call and a future per row).
    columnar = crash_after is None and set(columns.names) <= {"key", "value"}
    for batch in batches:
        if columnar:
            if batch.num_rows:
                keys = _binary_column(batch, "key") if "key" in columns.names else None
                producer.send_many(options.topic, _binary_column(batch, "value"), keys=keys)
                sent += batch.num_rows
            continue
        for key, value, headers, topic, partition in _rows(batch, columns):
            producer.send(topic or options.topic, value=value, key=key, partition=partition,
                          headers=headers)
            sent += 1
            if crash_after is not None and sent == crash_after:
                _crash_once(producer, options)
    if clock is not None:
        clock.lap("send")
    return sent


def commit_offsets(producer: Producer, options: SinkOptions, writer: int, batch_id: int) -> None:
    """Step 3's offset: the batch id, in the writer's transaction."""
    producer.send_offsets_to_transaction(batch_offsets(options.topic, writer, batch_id),
                                         group_metadata(options.group))


def write_batch(
    options: SinkOptions,
    columns: SinkColumns,
    *,
    writer: int,
    batch_id: int,
    batches: Iterable[pa.RecordBatch],
) -> WriterOutcome:
    """Writer `writer`'s part of micro-batch `batch_id`, committed in one
    transaction with the batch id (the foreachBatch sink's task)."""
    clock = _Clock()
    with new_producer(options, writer) as producer:
        if not begin_unless_written(producer, options, writer, batch_id, clock):
            return WriterOutcome(writer, batch_id, 0, skipped=True, **clock.ms())
        sent = send_rows(producer, options, columns, batches, clock)
        commit_offsets(producer, options, writer, batch_id)
        producer.commit_transaction()
        clock.lap("commit")
    return WriterOutcome(writer, batch_id, sent, skipped=False, **clock.ms())


class _Clock:
    """Laps of a write task, in seconds by name; the time spent waiting for
    input batches is taken out of the lap it falls in."""

    def __init__(self) -> None:
        self._last_s = time.perf_counter()
        self._input_s = 0.0
        self._laps: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now_s = time.perf_counter()
        self._laps[name] = self._laps.get(name, 0.0) + now_s - self._last_s - self._input_s
        self._laps["input"] = self._laps.get("input", 0.0) + self._input_s
        self._input_s = 0.0
        self._last_s = now_s

    def timed_input(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        iterator = iter(batches)
        while True:
            waited_s = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                self._input_s += time.perf_counter() - waited_s
                return
            self._input_s += time.perf_counter() - waited_s
            yield batch

    def ms(self) -> dict[str, float]:
        return {f"{name}_ms": round(s * 1000, 1) for name, s in self._laps.items()}


@dataclass(frozen=True)
class PreparedWrite(WriterCommitMessage):
    """A write task's commit message in the two-phase-commit sink: what the
    driver needs to complete the writer's prepared transaction."""

    writer: int
    batch_id: int
    transactional_id: str
    # "producer_id:epoch" of the prepared transaction; None when the writer
    # had written this micro-batch before (a replay) and prepared nothing.
    prepared: str | None
    records: int


def prepare_batch(
    options: SinkOptions,
    columns: SinkColumns,
    *,
    writer: int,
    batch_id: int,
    batches: Iterable[pa.RecordBatch],
) -> PreparedWrite:
    """Writer `writer`'s part of micro-batch `batch_id`, written with the
    batch id and *prepared* (KIP-939), not committed: the driver completes
    it once every task has prepared (the format("oncelog") sink's task).

    A transaction this writer's id left prepared or open before (an earlier
    attempt whose driver died before completing it) is aborted by
    init_transactions() here, then written again."""
    tid = transactional_id(options.app_id, writer)
    with new_producer(options, writer, transaction_two_phase_commit_enable=True) as producer:
        if not begin_unless_written(producer, options, writer, batch_id):
            return PreparedWrite(writer, batch_id, tid, None, 0)
        sent = send_rows(producer, options, columns, batches)
        commit_offsets(producer, options, writer, batch_id)
        state = producer.prepare_transaction()
        # close() leaves a prepared transaction prepared.
    return PreparedWrite(writer, batch_id, tid, str(state), sent)


def _binary_column(batch: pa.RecordBatch, name: str) -> list[Any]:
    """A key or value column as Python bytes (strings as their UTF-8)."""
    array = batch.column(name)
    if pa.types.is_string(array.type):
        array = array.cast(pa.binary())
    elif pa.types.is_large_string(array.type):
        array = array.cast(pa.large_binary())
    return array.to_pylist()


def _rows(
    batch: pa.RecordBatch, columns: SinkColumns
) -> Iterable[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]] | None,
                    str | None, int | None]]:
    n = batch.num_rows
    none: list[Any] = [None] * n

    def column(name: str) -> list[Any]:
        if name not in columns.names:
            return none
        return _binary_column(batch, name)

    headers = [
        [(h["key"], h["value"]) for h in hs] if hs else None for hs in column("headers")
    ]
    return zip(column("key"), column("value"), headers, column("topic"), column("partition"),
               strict=True)


def _crash_once(producer: Producer, options: SinkOptions) -> None:
    """Test hook: the first task to get here (no marker yet) makes sure its
    records are in the log inside its open transaction, then dies as a
    crashed executor would: no abort, no close."""
    marker = options.test_crash_marker
    if marker is None:
        return
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    producer.flush()
    os.write(fd, f"{os.getpid()}\n".encode())
    os.close(fd)
    log.warning("test hook: crashing the write task after its records were sent (%s)",
                Path(marker).name)
    os._exit(17)

