"""Streaming reads (`spark.readStream.format("oncelog")`) stopped and
restarted from their checkpoint.

Goal: across runs of one query sharing a checkpoint, every committed record
is read exactly once — none twice, none skipped — and each run starts exactly
where the previous run's last completed micro-batch ended; read_committed
never lets an aborted record through, and holds back an open transaction
(and the records after it on its partition) until it commits, then reads
them in the next run. max_records_per_trigger splits a backlog into several
micro-batches.

Method: one LocalCluster and the shared real Spark session. Three runs of
the same query (same options, same checkpoint directory), each started anew:
run 1 with Trigger.AvailableNow and a small max_records_per_trigger over a
first set of records; run 2 with the default trigger, processAllAvailable()
and stop(), over a second set that includes an open transaction; run 3 with
Trigger.AvailableNow after that transaction committed. A foreachBatch
function collects (batch id, rows) in this process. Expectations come from
the offsets the producer's futures reported.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from oncelog import Admin, Producer
from oncelog.testing import LocalCluster
from tests.spark.rows import RecordRow, as_tuples, expected, select_columns
from tests.support.writing import (
    ABORTED,
    COMMITTED,
    OPEN,
    PLAIN,
    Written,
    send_all,
    write_transaction,
)

# Failure guard for a run that never ends (not a timing assumption).
RUN_TIMEOUT_S = 180
MAX_RECORDS_PER_TRIGGER = 4


class Collector:
    """foreachBatch target: what each micro-batch delivered, in order."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, list[RecordRow]]] = []

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        self.batches.append((batch_id, as_tuples(select_columns(df).collect())))

    def rows(self) -> list[RecordRow]:
        """Every row delivered, sorted by (topic, partition, offset)."""
        return sorted(row for _, rows in self.batches for row in rows)

    def batch_ids(self) -> list[int]:
        return [batch_id for batch_id, _ in self.batches]


@pytest.fixture
def topic(shared_cluster: LocalCluster, topic_name: str) -> str:
    with Admin(bootstrap=shared_cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2)
    return topic_name


@pytest.fixture
def producers(shared_cluster: LocalCluster) -> Iterator[tuple[Producer, Producer, Producer]]:
    """A transactional producer, one for a transaction left open, and an
    idempotent one."""
    bootstrap = shared_cluster.bootstrap
    with Producer(bootstrap=bootstrap, transactional_id="stream-writer") as txn, \
            Producer(bootstrap=bootstrap, transactional_id="stream-open",
                     transaction_timeout_ms=600_000) as open_txn, \
            Producer(bootstrap=bootstrap) as plain:
        txn.init_transactions()
        open_txn.init_transactions()
        yield txn, open_txn, plain


def start_query(spark: SparkSession, bootstrap: str, topic: str, checkpoint: Path,
                collector: Collector, *, available_now: bool) -> StreamingQuery:
    writer = (
        spark.readStream.format("oncelog")
        .option("bootstrap", bootstrap)
        .option("topics", topic)
        .option("starting_offsets", "earliest")
        .option("max_records_per_trigger", str(MAX_RECORDS_PER_TRIGGER))
        .load()
        .writeStream.foreachBatch(collector)
        .option("checkpointLocation", str(checkpoint))
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start()


def run_available_now(spark: SparkSession, bootstrap: str, topic: str, checkpoint: Path,
                      collector: Collector) -> None:
    query = start_query(spark, bootstrap, topic, checkpoint, collector, available_now=True)
    finished = query.awaitTermination(RUN_TIMEOUT_S)
    if not finished:
        query.stop()
    assert finished, f"the AvailableNow run did not finish within {RUN_TIMEOUT_S} s"
    assert query.exception() is None


def committed(written: list[Written]) -> list[Written]:
    return [w for w in written if w.outcome in (COMMITTED, PLAIN)]


def test_restart_from_checkpoint_reads_each_record_once(
    spark: SparkSession, shared_cluster: LocalCluster, topic: str, tmp_path: Path,
    producers: tuple[Producer, Producer, Producer],
) -> None:
    txn, open_txn, plain = producers
    bootstrap = shared_cluster.bootstrap
    checkpoint = tmp_path / "checkpoint"

    # Run 1: a backlog of 9 records to read, in several micro-batches, past
    # an aborted transaction.
    first = write_transaction(txn, topic, 0, [b"a0", b"a1", b"a2", b"a3"], outcome=COMMITTED)
    first += write_transaction(txn, topic, 0, [b"x0", b"x1"], outcome=ABORTED)
    first += send_all(plain, topic, 1, [b"b0", b"b1", b"b2"], outcome=PLAIN, key=b"k")
    first += write_transaction(txn, topic, 1, [b"c0", b"c1"], outcome=COMMITTED,
                               headers=[("h", b"1")])
    run1 = Collector()
    run_available_now(spark, bootstrap, topic, checkpoint, run1)
    assert run1.rows() == expected(committed(first))
    assert len(run1.batches) >= 3, "max_records_per_trigger should split the backlog"
    assert all(len(rows) <= MAX_RECORDS_PER_TRIGGER for _, rows in run1.batches)

    # Run 2: new records, one transaction left open on partition 0 with a
    # record of another producer after it; a running query, stopped.
    second = write_transaction(txn, topic, 1, [b"d0", b"d1"], outcome=COMMITTED)
    held = write_transaction(open_txn, topic, 0, [b"o0", b"o1"], outcome=OPEN)
    after_open = send_all(plain, topic, 0, [b"e0"], outcome=PLAIN)
    second += write_transaction(txn, topic, 1, [b"y0"], outcome=ABORTED)
    run2 = Collector()
    query = start_query(spark, bootstrap, topic, checkpoint, run2, available_now=False)
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None
    assert run2.rows() == expected(committed(second))

    # Run 3: the open transaction commits; the next run reads it and the
    # record that waited behind it, and nothing else.
    open_txn.commit_transaction()
    run3 = Collector()
    run_available_now(spark, bootstrap, topic, checkpoint, run3)
    assert run3.rows() == expected(
        [w for w in held + after_open if w.outcome in (OPEN, PLAIN)]
    )

    # Across the runs: each record once, the batch ids going on from the
    # checkpoint (no micro-batch replayed, none started over).
    everything = run1.rows() + run2.rows() + run3.rows()
    keys = [(topic_, partition, offset) for topic_, partition, offset, *_ in everything]
    assert len(keys) == len(set(keys))
    assert sorted(everything) == expected(committed(first) + committed(second) + held
                                          + after_open)
    ids = run1.batch_ids() + run2.batch_ids() + run3.batch_ids()
    assert ids == sorted(set(ids))
