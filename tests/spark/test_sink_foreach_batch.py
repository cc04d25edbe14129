"""The exactly-once `foreachBatch` sink (`oncelog_spark.exactly_once_writer`).

Goal: every input row reaches the output topic exactly once, for
read_committed readers, when Spark replays a micro-batch that the sink had
already written (a crash between the sink's commit and Spark's own commit
log), and when a write task dies half-way through its transaction and Spark
retries it; a zombie producer with a writer's transactional id cannot
commit once a newer attempt started; and wrong setups (too many writers for
the topic, a bad column, an app_id that belongs to another checkpoint) fail
with an error that says what to change.

Method: one LocalCluster and the shared Spark session (local[2,2], so a
failed task is retried once). Rows carry a unique value; the output is read
back with the SDK's Consumer under read_committed and counted per value.
The replay is Spark's own: a query runs with Trigger.AvailableNow from the
oncelog source, then its last `commits/N` file is removed from the
checkpoint, as if the driver died right after the sink committed, and the
query is run again. The half-way failure is the sink's test hook: the first
write task to send 10 records flushes them into its open transaction and
kills its own Python worker (os._exit), leaving the transaction open.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from oncelog import Producer, errors
from oncelog.testing import LocalCluster
from oncelog_spark import BatchOutcome, ExactlyOnceWriter, exactly_once_writer
from oncelog_spark.options import SinkOptions
from oncelog_spark.writing import SinkColumns, SinkInputError, next_batches, write_batch
from tests.spark.sinks import (
    OUTPUT_PARTITIONS,
    arrow_values,
    assert_nothing_left_open,
    forget_last_commit,
    input_stream,
    run_available_now,
    values_in,
    write_input,
)


def rows(spark: SparkSession, n: int, prefix: str) -> DataFrame:
    return spark.createDataFrame(
        [(f"acct-{i % 7}", f"{prefix}-{i}") for i in range(n)], "key string, value string"
    )


class Recorder:
    """A foreachBatch function around the sink that keeps each call's outcome."""

    def __init__(self, sink: ExactlyOnceWriter) -> None:
        self.sink = sink
        self.calls: list[BatchOutcome] = []

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        self.sink(df, batch_id)
        assert self.sink.last is not None
        self.calls.append(self.sink.last)


def run_query(spark: SparkSession, bootstrap: str, source: str, checkpoint: Path,
              recorder: Recorder) -> None:
    run_available_now(
        input_stream(spark, bootstrap, source, max_records_per_trigger=40)
        .writeStream.foreachBatch(recorder)
        .option("checkpointLocation", str(checkpoint))
    )


def test_a_replayed_micro_batch_is_written_once(
    spark: SparkSession, shared_cluster: LocalCluster, output: str, tmp_path: Path
) -> None:
    bootstrap = shared_cluster.bootstrap
    source = f"{output}-in"
    sent = write_input(bootstrap, source, 100)
    checkpoint = tmp_path / "checkpoint"
    app_id = f"{output}-app"

    first = Recorder(exactly_once_writer(bootstrap, output, app_id, 2))
    run_query(spark, bootstrap, source, checkpoint, first)
    assert len(first.calls) >= 2, "max_records_per_trigger should make several micro-batches"
    assert all(not call.replayed for call in first.calls)
    assert values_in(bootstrap, output) == Counter(sent)

    # The driver "dies" after the sink committed the last micro-batch and
    # before Spark recorded it: Spark runs that micro-batch again.
    last = forget_last_commit(checkpoint)
    assert last == first.calls[-1].batch_id
    again = Recorder(exactly_once_writer(bootstrap, output, app_id, 2))
    run_query(spark, bootstrap, source, checkpoint, again)

    assert [call.batch_id for call in again.calls] == [last], "Spark replays the last batch"
    assert again.calls[0].replayed and again.calls[0].records == 0
    assert values_in(bootstrap, output) == Counter(sent), "each row once"
    assert next_batches(first.sink.options, range(2)) == {0: last + 1, 1: last + 1}
    assert_nothing_left_open(bootstrap, app_id, output)


def test_a_task_that_dies_half_way_is_retried_and_writes_once(
    spark: SparkSession, shared_cluster: LocalCluster, output: str, tmp_path: Path
) -> None:
    bootstrap = shared_cluster.bootstrap
    marker = tmp_path / "crashed"
    sink = exactly_once_writer(
        bootstrap, output, f"{output}-app", OUTPUT_PARTITIONS,
        options={"test_crash_after_records": "10", "test_crash_marker": str(marker)},
    )
    df = rows(spark, 120, "r")

    sink(df, 0)

    assert marker.exists(), "a write task died half-way"
    assert sink.last is not None and sink.last.records == 120
    expected = Counter(f"r-{i}".encode() for i in range(120))
    assert values_in(bootstrap, output) == expected
    # The dead attempt's records are in the log, in a transaction that its
    # retry aborted: read_uncommitted sees them, read_committed never.
    uncommitted = values_in(bootstrap, output, isolation_level="read_uncommitted")
    assert sum(uncommitted.values()) >= 120 + 10

    # Spark replays micro-batch 0 and then runs 1: 0 is skipped by every
    # writer, 1 is written.
    sink(df, 0)
    assert sink.last is not None and sink.last.replayed
    sink(rows(spark, 30, "s"), 1)
    assert values_in(bootstrap, output) == expected + Counter(f"s-{i}".encode() for i in range(30))
    assert_nothing_left_open(bootstrap, sink.options.app_id, output)


def test_a_zombie_attempt_cannot_commit_after_its_retry_started(
    shared_cluster: LocalCluster, output: str
) -> None:
    bootstrap = shared_cluster.bootstrap
    options = SinkOptions.parse({"bootstrap": bootstrap, "topic": output,
                                 "app_id": f"{output}-app"})
    columns = SinkColumns(("value",))
    with Producer(bootstrap=bootstrap, transactional_id=f"{output}-app-1") as zombie:
        zombie.init_transactions()
        zombie.begin_transaction()
        zombie.send(output, value=b"zombie", partition=1).result()

        retry = write_batch(options, columns, writer=1, batch_id=0,
                            batches=arrow_values([b"a", b"b"]))

        assert retry.records == 2 and not retry.skipped
        with pytest.raises(errors.ProducerFencedError):
            zombie.send(output, value=b"late", partition=1).result()
        with pytest.raises(errors.ProducerFencedError):
            zombie.commit_transaction()
    assert values_in(bootstrap, output) == Counter([b"a", b"b"])
    # The same writer and micro-batch again (a second retry): nothing written.
    again = write_batch(options, columns, writer=1, batch_id=0, batches=arrow_values([b"a", b"b"]))
    assert again.skipped and again.records == 0
    assert values_in(bootstrap, output) == Counter([b"a", b"b"])


def test_wrong_setups_fail_with_what_to_change(
    spark: SparkSession, shared_cluster: LocalCluster, output: str
) -> None:
    bootstrap = shared_cluster.bootstrap
    df = rows(spark, 3, "x")
    with pytest.raises(SinkInputError, match=r"writes with 4 writers .* has 3 partitions"):
        exactly_once_writer(bootstrap, output, f"{output}-a", 4)(df, 0)
    with pytest.raises(SinkInputError, match="needs a `value` column"):
        exactly_once_writer(bootstrap, output, f"{output}-b", 1)(df.select("key"), 0)
    with pytest.raises(SinkInputError, match="`partition` .* must be int, got bigint"):
        exactly_once_writer(bootstrap, output, f"{output}-c", 1)(
            df.selectExpr("value", "CAST(1 AS BIGINT) AS partition"), 0)
    # A query with a fresh checkpoint reusing the app_id of one that has
    # written micro-batches 0..4.
    used = exactly_once_writer(bootstrap, output, f"{output}-d", 1)
    for batch_id in range(5):
        used(df, batch_id)
    with pytest.raises(SinkInputError, match="give this query its own app_id"):
        exactly_once_writer(bootstrap, output, f"{output}-d", 1)(df, 0)
    assert sum(values_in(bootstrap, output).values()) == 5 * 3
    # Nothing is written to a topic that does not exist.
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        exactly_once_writer(bootstrap, f"{output}-nope", f"{output}-e", 1)(df, 0)
