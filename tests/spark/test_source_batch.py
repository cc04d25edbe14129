"""Batch reads (`spark.read.format("oncelog")`) against a real cluster.

Goal: a batch read returns exactly the records it should, with every column
right — under read_committed the committed and non-transactional records
below each partition's last stable offset, never an aborted record, a marker
or anything at or after an open transaction's first offset; under
read_uncommitted every record up to the high watermark, aborted and open
ones included, markers excluded. Offset ranges given as JSON stop at their
end even when the end falls inside or right after a stretch the store
filters out (aborted records, markers), and a partition whose log ends with
an aborted transaction is read to the end without hanging. Bad options fail
the query with a message naming the option.

Method: one LocalCluster (real processes) and the shared real Spark session
(tests/spark/conftest.py). One topic, three partitions, written once per
module with every kind of outcome: a committed, an aborted and an open
transaction, and non-transactional records before and after them. The
expected rows come from the offsets the producer's futures reported, never
from reading the log back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from oncelog import Admin, Producer
from oncelog.testing import LocalCluster
from tests.spark.rows import collect, expected
from tests.support.writing import (
    ABORTED,
    COMMITTED,
    OPEN,
    PLAIN,
    Written,
    send_all,
    write_transaction,
)

TOPIC = "ledger"


@dataclass(frozen=True)
class Layout:
    bootstrap: str
    written: list[Written]

    def named(self, partition: int, *values: bytes) -> list[Written]:
        wanted = set(values)
        return [w for w in self.written if w.partition == partition and w.value in wanted]

    def offset_of(self, partition: int, value: bytes) -> int:
        (w,) = self.named(partition, value)
        return w.offset


@pytest.fixture(scope="module")
def layout(shared_cluster: LocalCluster) -> Iterator[Layout]:
    """Partition 0: committed A, aborted B, plain C, committed D.
    Partition 1: committed G, aborted H (the log ends with its abort marker).
    Partition 2: plain I, open transaction E, plain F after E's first offset."""
    bootstrap = shared_cluster.bootstrap
    with Admin(bootstrap=bootstrap) as admin:
        admin.create_topic(TOPIC, partitions=3)
    written: list[Written] = []
    headers = [("source", b"batch-test"), ("empty", None)]
    with Producer(bootstrap=bootstrap, transactional_id="batch-writer") as txn, \
            Producer(bootstrap=bootstrap, transactional_id="batch-open",
                     transaction_timeout_ms=600_000) as open_txn, \
            Producer(bootstrap=bootstrap) as plain:
        txn.init_transactions()
        open_txn.init_transactions()
        written += write_transaction(txn, TOPIC, 0, [b"A0", b"A1", b"A2"], outcome=COMMITTED,
                                     key=b"acct-1", headers=headers)
        written += write_transaction(txn, TOPIC, 0, [b"B0", b"B1"], outcome=ABORTED)
        written += send_all(plain, TOPIC, 0, [b"C0", b"C1"], outcome=PLAIN, key=b"acct-2")
        written += write_transaction(txn, TOPIC, 0, [b"D0", b"D1"], outcome=COMMITTED)
        written += write_transaction(txn, TOPIC, 1, [b"G0", b"G1"], outcome=COMMITTED)
        written += write_transaction(txn, TOPIC, 1, [b"H0", b"H1", b"H2"], outcome=ABORTED)
        written += send_all(plain, TOPIC, 2, [b"I0", b"I1"], outcome=PLAIN)
        written += write_transaction(open_txn, TOPIC, 2, [b"E0", b"E1"], outcome=OPEN)
        written += send_all(plain, TOPIC, 2, [b"F0", b"F1"], outcome=PLAIN)
        yield Layout(bootstrap, written)
        open_txn.abort_transaction()


def read(spark: SparkSession, layout: Layout, **options: str) -> DataFrame:
    reader = spark.read.format("oncelog").option("bootstrap", layout.bootstrap) \
        .option("topics", TOPIC)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def test_read_committed_returns_exactly_the_committed_records(
    spark: SparkSession, layout: Layout
) -> None:
    open_start = min(w.offset for w in layout.written if w.outcome == OPEN)
    want = [
        w for w in layout.written
        if w.outcome in (COMMITTED, PLAIN)
        and not (w.partition == 2 and w.offset >= open_start)
    ]
    got = collect(read(spark, layout))  # read_committed is the default
    assert got == expected(want)
    # The rows name what the reader must never see, so a wrong filter fails
    # the comparison above for a reason one can read here too.
    values = {row[4] for row in got}
    assert not values & {b"B0", b"B1", b"H0", b"H1", b"H2", b"E0", b"E1", b"F0", b"F1"}


def test_read_uncommitted_returns_every_record(spark: SparkSession, layout: Layout) -> None:
    got = collect(read(spark, layout, isolation_level="read_uncommitted"))
    assert got == expected(layout.written)


def test_offset_ranges_stop_at_their_end_across_filtered_offsets(
    spark: SparkSession, layout: Layout
) -> None:
    # Partition 0 from the first aborted record up to (not including) C1:
    # under read_committed only C0, although the range starts in filtered
    # offsets (B0, B1 and the abort marker). Partition 1 from H0 to its end:
    # aborted records and a marker only, so nothing under read_committed.
    # Partition 2 from earliest to I1 (exclusive): I0.
    start = {TOPIC: {"0": layout.offset_of(0, b"B0"), "1": layout.offset_of(1, b"H0"),
                     "2": -2}}
    end = {TOPIC: {"0": layout.offset_of(0, b"C1"), "1": -1, "2": layout.offset_of(2, b"I1")}}
    options = {"starting_offsets": json.dumps(start), "ending_offsets": json.dumps(end)}

    committed = collect(read(spark, layout, **options))
    assert committed == expected(layout.named(0, b"C0") + layout.named(2, b"I0"))

    uncommitted = collect(read(spark, layout, isolation_level="read_uncommitted", **options))
    assert uncommitted == expected(
        layout.named(0, b"B0", b"B1", b"C0")
        + layout.named(1, b"H0", b"H1", b"H2")
        + layout.named(2, b"I0")
    )


def test_empty_range_reads_no_rows(spark: SparkSession, layout: Layout) -> None:
    end = {TOPIC: {"0": 0, "1": 0, "2": 0}}
    assert collect(read(spark, layout, ending_offsets=json.dumps(end))) == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"isolation_level": "read_commited"}, "option 'isolation_level' must be one of"),
        ({"ending_offsets": json.dumps({TOPIC: {"0": 1, "1": 1}})}, "missing ledger-2"),
        ({"ending_offsets": json.dumps({TOPIC: {"0": 10_000, "1": 1, "2": 1}})},
         "offset 10000 of ledger-0 is past its end"),
        ({"topics": "no-such-topic"}, "no-such-topic do not exist"),
        ({"starting_offsets": json.dumps({TOPIC: {"0": 2, "1": 0, "2": 0}}),
          "ending_offsets": json.dumps({TOPIC: {"0": 1, "1": 0, "2": 0}})},
         "end offset 1 of ledger-0 is below its start offset 2"),
    ],
)
def test_bad_options_fail_with_a_clear_error(
    spark: SparkSession, layout: Layout, options: dict[str, str], message: str
) -> None:
    # One case per place an error can arise (parsing the options, checking
    # them against the cluster, planning ranges); every parsing mistake is
    # covered in tests/unit/test_spark_offsets.py.
    with pytest.raises(PySparkException, match=message):
        read(spark, layout, **options).collect()


def test_another_schema_is_refused(spark: SparkSession, layout: Layout) -> None:
    df = spark.read.format("oncelog").schema("value string").option("bootstrap", layout.bootstrap) \
        .option("topics", TOPIC).load()
    with pytest.raises(PySparkException, match="fixed schema"):
        df.collect()
