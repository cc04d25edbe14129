"""What the sink tests share: input and output topics, a query run to its
end, a replay set up in a checkpoint, the output's read_committed contents
counted per value, and the check that a sink left nothing open."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from oncelog import Admin, Producer
from oncelog.admin import OPEN_TRANSACTION_STATES
from tests.support.reading import read_all

# Output topics of the sink tests have this many partitions (so at most
# this many writers).
OUTPUT_PARTITIONS = 3


def create_output(bootstrap: str, topic: str) -> str:
    with Admin(bootstrap=bootstrap) as admin:
        admin.create_topic(topic, partitions=OUTPUT_PARTITIONS)
    return topic


def values_in(bootstrap: str, topic: str, *, isolation_level: str = "read_committed"
              ) -> Counter[bytes]:
    """How often each value is in the output topic, for readers at `isolation_level`."""
    records = read_all(bootstrap, topic, OUTPUT_PARTITIONS, isolation_level=isolation_level)
    return Counter(r.value for r in records if r.value is not None)


def assert_nothing_left_open(bootstrap: str, app_id: str, topic: str) -> None:
    """No transaction of the sink is open or prepared, and the
    hanging-transaction tool finds nothing on its topic."""
    with Admin(bootstrap=bootstrap) as admin:
        left = [t for t in admin.list_transactions(states=OPEN_TRANSACTION_STATES)
                if t.transactional_id.startswith(f"{app_id}-")]
        assert left == []
        assert admin.find_hanging_transactions(topics=[topic]) == []


def arrow_values(values: list[bytes]) -> Iterator[pa.RecordBatch]:
    """A write task's input: one Arrow batch with a `value` column."""
    yield pa.RecordBatch.from_pydict({"value": values},
                                     schema=pa.schema([("value", pa.binary())]))


# Failure guard for a run that never ends (not a timing assumption).
RUN_TIMEOUT_S = 180


def write_input(bootstrap: str, topic: str, count: int) -> list[bytes]:
    """A two-partition input topic with `count` keyed records of unique
    values (each with a header); returns the values."""
    with Admin(bootstrap=bootstrap) as admin:
        admin.create_topic(topic, partitions=2)
    sent = [f"p-{i}".encode() for i in range(count)]
    with Producer(bootstrap=bootstrap) as producer:
        for i, value in enumerate(sent):
            producer.send(topic, key=f"acct-{i % 9}".encode(), value=value,
                          headers=[("n", str(i).encode())])
    return sent


def input_stream(spark: SparkSession, bootstrap: str, topic: str,
                 max_records_per_trigger: int) -> DataFrame:
    """The input topic from its beginning, as the sinks' columns."""
    return (
        spark.readStream.format("oncelog")
        .option("bootstrap", bootstrap).option("topics", topic)
        .option("starting_offsets", "earliest")
        .option("max_records_per_trigger", str(max_records_per_trigger))
        .load()
        .selectExpr("key", "value", "headers")
    )


def run_available_now(writer: DataStreamWriter) -> StreamingQuery:
    """Starts the query with Trigger.AvailableNow and waits until it is done."""
    query = writer.trigger(availableNow=True).start()
    finished = query.awaitTermination(RUN_TIMEOUT_S)
    if not finished:
        query.stop()
    assert finished, f"the AvailableNow run did not finish within {RUN_TIMEOUT_S} s"
    assert query.exception() is None
    return query


def forget_last_commit(checkpoint: Path) -> int:
    """Removes the newest micro-batch from the checkpoint's commit log, as if
    the driver died after the sink committed it and before Spark recorded
    it: the next run of the query runs it again. Returns its id."""
    commits = checkpoint / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink(missing_ok=True)
    return last
