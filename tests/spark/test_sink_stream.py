"""The two-phase-commit sink, `writeStream.format("oncelog")`.

Goal: Spark's commit protocol drives a true two-phase commit — tasks
prepare, the driver's commit completes, abort aborts — and every row is
visible exactly once under read_committed: through a streaming query whose
write task dies half-way (retried by Spark) and which is then replayed from
its checkpoint; when the driver's commit is repeated; when the driver died
before completing (the next attempt aborts what was prepared and writes
again, and the stale state can no longer commit); when it died half-way
through completing (completed writers skip the replay); and after an
abort (Spark's own, after a task refused a Spark partition beyond the
topic's partitions). Nothing is left prepared or open, and the
hanging-transaction tool finds nothing; a wrong input fails the query
with a message saying what to change. (The driver process killed between the tasks' prepare and
its commit, then restarted from its checkpoint, is the main job's chaos:
tests/spark/test_payments_pipeline.py.)

Method: one LocalCluster and the shared Spark session (local[2,2]). The
query test runs the oncelog source into the sink with Trigger.AvailableNow,
with the sink's test hook killing the first write task half-way, then
removes the last `commits/N` file from the checkpoint (a driver that died
after completing, before Spark's commit log) and runs the query again. The
commit-protocol tests call the task side (`prepare_batch`) and the driver
side (`complete_batch`, `abort_batch`) directly, in the order a crash
leaves them. Outputs are counted per unique value.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from oncelog import Admin, Producer
from oncelog.testing import LocalCluster
from oncelog_spark.options import SinkOptions
from oncelog_spark.stream_sink import PreparedWriteLostError, abort_batch, complete_batch
from oncelog_spark.writing import PreparedWrite, SinkColumns, next_batches, prepare_batch
from tests.spark.sinks import (
    OUTPUT_PARTITIONS,
    RUN_TIMEOUT_S,
    arrow_values,
    assert_nothing_left_open,
    forget_last_commit,
    input_stream,
    run_available_now,
    values_in,
    write_input,
)


def start_query(spark: SparkSession, bootstrap: str, source: str, output: str, app_id: str,
                checkpoint: Path, **sink_options: str) -> None:
    writer = (
        input_stream(spark, bootstrap, source, max_records_per_trigger=60)
        .writeStream.format("oncelog")
        .option("bootstrap", bootstrap).option("topic", output).option("app_id", app_id)
        .option("checkpointLocation", str(checkpoint))
    )
    for name, value in sink_options.items():
        writer = writer.option(name, value)
    run_available_now(writer)


def test_a_query_writes_each_row_once_through_a_task_retry_and_a_replay(
    spark: SparkSession, shared_cluster: LocalCluster, output: str, tmp_path: Path
) -> None:
    bootstrap = shared_cluster.bootstrap
    source = f"{output}-in"
    sent = write_input(bootstrap, source, 150)
    checkpoint = tmp_path / "checkpoint"
    app_id = f"{output}-app"
    marker = tmp_path / "crashed"

    start_query(spark, bootstrap, source, output, app_id, checkpoint,
                test_crash_after_records="20", test_crash_marker=str(marker))

    assert marker.exists(), "a write task died half-way"
    assert values_in(bootstrap, output) == Counter(sent)
    options = SinkOptions.parse({"bootstrap": bootstrap, "topic": output, "app_id": app_id})
    assert_nothing_left_open(bootstrap, app_id, output)

    # The driver "dies" after completing the last micro-batch and before
    # Spark's commit log has it: Spark runs that micro-batch again.
    last = forget_last_commit(checkpoint)
    assert last >= 1, "max_records_per_trigger should make several micro-batches"
    assert set(next_batches(options, [0, 1]).values()) <= {0, last + 1}
    start_query(spark, bootstrap, source, output, app_id, checkpoint)

    assert (checkpoint / "commits" / str(last)).exists(), "the micro-batch ran again"
    assert values_in(bootstrap, output) == Counter(sent), "each row once"
    assert_nothing_left_open(bootstrap, app_id, output)


def test_wrong_setups_fail_with_what_to_change_and_leave_nothing_open(
    spark: SparkSession, shared_cluster: LocalCluster, output: str, tmp_path: Path
) -> None:
    bootstrap = shared_cluster.bootstrap
    source = f"{output}-in"
    with Admin(bootstrap=bootstrap) as admin:
        admin.create_topic(source, partitions=OUTPUT_PARTITIONS + 1)
    with Producer(bootstrap=bootstrap) as producer:
        for i in range(40):
            producer.send(source, value=f"v{i}".encode(), partition=i % (OUTPUT_PARTITIONS + 1))
    app_id = f"{output}-app"

    def start(df: DataFrame, name: str) -> StreamingQuery:
        return (df.writeStream.format("oncelog")
                .option("bootstrap", bootstrap).option("topic", output)
                .option("app_id", app_id)
                .option("checkpointLocation", str(tmp_path / name))
                .trigger(availableNow=True).start())

    stream = input_stream(spark, bootstrap, source, max_records_per_trigger=1000)
    with pytest.raises(StreamingQueryException, match="needs a `value` column"):
        start(stream.select("key"), "no-value").awaitTermination(RUN_TIMEOUT_S)
    # One Spark partition per input partition: one more than the output has.
    query = start(stream, "too-many")
    with pytest.raises(StreamingQueryException,
                       match=rf"writes with {OUTPUT_PARTITIONS + 1} writers .* has "
                             rf"{OUTPUT_PARTITIONS} partitions"):
        query.awaitTermination(RUN_TIMEOUT_S)
    # The tasks that had prepared were aborted by Spark's abort().
    assert values_in(bootstrap, output) == Counter()
    assert_nothing_left_open(bootstrap, app_id, output)


# ------------------------------------------------- the commit protocol, step by step

COLUMNS = SinkColumns(("value",))


@pytest.fixture
def options(shared_cluster: LocalCluster, output: str) -> SinkOptions:
    return SinkOptions.parse({"bootstrap": shared_cluster.bootstrap, "topic": output,
                              "app_id": f"{output}-app"})


def prepare(options: SinkOptions, batch_id: int, rows: dict[int, list[bytes]]
            ) -> list[PreparedWrite]:
    return [prepare_batch(options, COLUMNS, writer=w, batch_id=batch_id,
                          batches=arrow_values(values)) for w, values in sorted(rows.items())]


def test_prepared_writes_are_invisible_until_completed_and_a_repeated_commit_is_a_no_op(
    options: SinkOptions
) -> None:
    rows = {0: [b"a0", b"a1"], 1: [b"b0"]}
    messages = prepare(options, 0, rows)
    assert [m.prepared is not None for m in messages] == [True, True]
    assert values_in(options.bootstrap, options.topic) == Counter()

    assert complete_batch(options, messages, 0) == 3
    assert complete_batch(options, messages, 0) == 3, "the same answer, nothing written"

    assert values_in(options.bootstrap, options.topic) == Counter([b"a0", b"a1", b"b0"])
    assert next_batches(options, [0, 1]) == {0: 1, 1: 1}
    assert_nothing_left_open(options.bootstrap, options.app_id, options.topic)


def test_a_driver_that_died_before_completing_leaves_nothing_behind(
    options: SinkOptions
) -> None:
    rows = {0: [b"a0", b"a1"], 1: [b"b0"]}
    stale = prepare(options, 0, rows)     # the driver dies: nobody completes these

    # The restarted query runs micro-batch 0 again: each task aborts what its
    # writer left prepared and writes again.
    fresh = prepare(options, 0, rows)
    with pytest.raises(PreparedWriteLostError, match="were aborted before the driver"):
        complete_batch(options, stale, 0)
    complete_batch(options, fresh, 0)

    assert values_in(options.bootstrap, options.topic) == Counter([b"a0", b"a1", b"b0"])
    assert_nothing_left_open(options.bootstrap, options.app_id, options.topic)


def test_a_driver_that_died_half_way_through_its_commit_is_completed_by_the_replay(
    options: SinkOptions
) -> None:
    rows = {0: [b"a0", b"a1"], 1: [b"b0", b"b1"]}
    first = prepare(options, 0, rows)
    complete_batch(options, first[:1], 0)          # writer 0 completed, then the crash

    replay = prepare(options, 0, rows)
    assert replay[0].prepared is None and replay[0].records == 0, "writer 0 skips"
    assert replay[1].prepared is not None and replay[1].records == 2
    complete_batch(options, replay, 0)

    assert values_in(options.bootstrap, options.topic) == Counter([b"a0", b"a1", b"b0", b"b1"])
    assert_nothing_left_open(options.bootstrap, options.app_id, options.topic)


def test_abort_aborts_every_writer_of_the_micro_batch(options: SinkOptions) -> None:
    prepared = prepare(options, 0, {0: [b"a0"], 2: [b"c0"]})
    # Task 1 failed (no message); tasks 0 and 2 prepared.
    abort_batch(options, [prepared[0], None, prepared[1]], 0)

    assert values_in(options.bootstrap, options.topic) == Counter()
    assert_nothing_left_open(options.bootstrap, options.app_id, options.topic)
    with pytest.raises(PreparedWriteLostError):
        complete_batch(options, prepared, 0)
    # The micro-batch, run again, is written once.
    complete_batch(options, prepare(options, 0, {0: [b"a0"], 2: [b"c0"]}), 0)
    assert values_in(options.bootstrap, options.topic) == Counter([b"a0", b"c0"])
