"""The exactly-once sink for `foreachBatch`:

    from oncelog_spark import exactly_once_writer

    query = (df.writeStream
             .foreachBatch(exactly_once_writer(bootstrap, "ledger", "ledger-app", 2))
             .option("checkpointLocation", CHECKPOINT)
             .start())

Each micro-batch is written by a fixed number of writers: its rows are
hash-partitioned (on key, value, topic and partition) into `num_writers`
Spark partitions, so a replayed micro-batch — the same input read again —
sends each row to the same writer as the first time. Writer N writes its
rows in one transaction of the transactional producer `APP_ID-N`, together
with the micro-batch id as a transactional offset of the sink-side group
`APP_ID` (writing.py). So:

* a micro-batch that Spark replays after a crash (its id is already
  committed by a writer) is not written again by that writer;
* a failed task attempt that is retried fences its predecessor: the retry's
  `init_transactions()` aborts whatever the predecessor left open, and the
  predecessor can no longer commit.

Before starting any task the driver asks the group which writers already
wrote the micro-batch; when all have, the whole micro-batch is skipped.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql import DataFrame

from oncelog_spark.options import OptionError, SinkOptions
from oncelog_spark.writing import (
    SinkColumns,
    WriterOutcome,
    check_not_ahead,
    next_batches,
    write_batch,
)

# What each write task reports to the driver: one row per writer.
_TIMINGS = ("init_ms", "check_ms", "input_ms", "send_ms", "commit_ms")
OUTCOME_SCHEMA = ("writer int, batch_id long, records long, skipped boolean, "
                  + ", ".join(f"{name} double" for name in _TIMINGS))
_OUTCOME_ARROW_SCHEMA = pa.schema([
    ("writer", pa.int32()), ("batch_id", pa.int64()), ("records", pa.int64()),
    ("skipped", pa.bool_()), *((name, pa.float64()) for name in _TIMINGS),
])
# Columns that decide a row's writer: everything that makes the record what
# it is, so equal input gives equal placement.
_PLACEMENT_COLUMNS = ("key", "value", "topic", "partition")


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """What one call of the sink did with a micro-batch."""

    batch_id: int
    # One per writer that ran (none when the driver skipped the micro-batch).
    writers: tuple[WriterOutcome, ...]
    # Where the call's time went: the driver's look at the sink-side group
    # (which writers already wrote the micro-batch), then the write job
    # (0 when the micro-batch was skipped). For benchmarks and logs.
    check_ms: float = 0.0
    write_ms: float = 0.0

    @property
    def records(self) -> int:
        return sum(w.records for w in self.writers)

    @property
    def replayed(self) -> bool:
        """Every writer had written this micro-batch before: nothing was sent."""
        return all(w.skipped for w in self.writers)


class ExactlyOnceWriter:
    """The `foreachBatch` function (call it with a micro-batch and its id).
    `last` is what the latest call did."""

    def __init__(self, options: SinkOptions, num_writers: int) -> None:
        if type(num_writers) is not int or num_writers < 1:
            raise OptionError(f"num_writers must be a positive int, got {num_writers!r}")
        self.options = options
        self.num_writers = num_writers
        self.last: BatchOutcome | None = None

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        if type(batch_id) is not int or batch_id < 0:
            raise ValueError(f"batch_id must be an int >= 0, got {batch_id!r}")
        columns = SinkColumns.of(df.schema)
        opts = self.options
        started_s = time.perf_counter()
        written = next_batches(opts, range(self.num_writers))
        checked_s = time.perf_counter()
        check_ms = (checked_s - started_s) * 1000
        for writer, next_batch in written.items():
            check_not_ahead(opts, writer, batch_id, next_batch)
        if all(next_batch > batch_id for next_batch in written.values()):
            self.last = BatchOutcome(batch_id, tuple(
                WriterOutcome(w, batch_id, 0, skipped=True) for w in sorted(written)
            ), check_ms=check_ms)
            return
        task = functools.partial(_write_task, opts, columns, batch_id, self.num_writers)
        placement = [name for name in _PLACEMENT_COLUMNS if name in columns.names]
        rows = (df.select(*columns.names)
                .repartition(self.num_writers, *placement)
                .mapInArrow(task, OUTCOME_SCHEMA)
                .collect())
        write_ms = (time.perf_counter() - checked_s) * 1000
        outcomes = tuple(sorted(
            (WriterOutcome(r.writer, r.batch_id, r.records, r.skipped,
                           **{name: r[name] for name in _TIMINGS}) for r in rows),
            key=lambda o: o.writer,
        ))
        if [o.writer for o in outcomes] != list(range(self.num_writers)):
            # Spark runs one task per shuffle partition, empty ones included;
            # anything else means rows may have gone unwritten.
            raise RuntimeError(
                f"oncelog sink: micro-batch {batch_id} reported writers "
                f"{[o.writer for o in outcomes]}, expected 0..{self.num_writers - 1}"
            )
        self.last = BatchOutcome(batch_id, outcomes, check_ms=check_ms, write_ms=write_ms)


def exactly_once_writer(
    bootstrap: str,
    topic: str,
    app_id: str,
    num_writers: int,
    *,
    transaction_timeout_ms: int | None = None,
    options: Mapping[str, str] | None = None,
) -> ExactlyOnceWriter:
    """A `foreachBatch` function that writes each micro-batch to `topic`
    exactly once, with `num_writers` transactional writers (at most the
    topic's partition count). `app_id` names the transactional ids
    (`APP_ID-N`) and the sink-side group; give each query its own, and keep
    it with the query's checkpoint. `options` takes further sink options by
    name, as strings (docs/spark.md)."""
    given = dict(options or {})
    given.update(bootstrap=bootstrap, topic=topic, app_id=app_id)
    if transaction_timeout_ms is not None:
        given["transaction_timeout_ms"] = str(transaction_timeout_ms)
    return ExactlyOnceWriter(SinkOptions.parse(given), num_writers)


def _write_task(
    options: SinkOptions,
    columns: SinkColumns,
    batch_id: int,
    num_writers: int,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """One writer, in a Spark task: its number is the task's partition."""
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("the oncelog sink's write task runs outside a Spark task")
    writer = context.partitionId()
    if not 0 <= writer < num_writers:
        raise RuntimeError(
            f"oncelog sink: write task of partition {writer}, but there are {num_writers} "
            f"writers"
        )
    outcome = write_batch(options, columns, writer=writer, batch_id=batch_id, batches=batches)
    yield pa.RecordBatch.from_pylist(
        [{"writer": outcome.writer, "batch_id": outcome.batch_id, "records": outcome.records,
          "skipped": outcome.skipped, **{name: getattr(outcome, name) for name in _TIMINGS}}],
        schema=_OUTCOME_ARROW_SCHEMA,
    )
