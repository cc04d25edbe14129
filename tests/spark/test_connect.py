"""oncelog_spark from a Spark Connect client.

Goal: a Spark Connect client (`SparkSession.builder.remote("sc://...")`)
registers the oncelog source on its own session (`oncelog_spark.register`,
which sends the class to the server) and uses it as a classic session
does: a batch read returns exactly the committed records, and a streaming
query from the source into `format("oncelog")` — with Spark's Kafka option
names and no app_id — writes each record exactly once under the app_id
derived from its checkpoint, leaving nothing open. The exactly-once
`foreachBatch` sink runs too (its function runs in the server's Python).

Method: the shared session's JVM is also the Spark Connect server
(tests/spark/conftest.py); the client session is `connect_spark`. Outputs
are read back with the SDK under read_committed and counted per value.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame

from oncelog import Admin
from oncelog.testing import LocalCluster
from oncelog_spark import default_app_id, exactly_once_writer
from tests.spark.sinks import (
    assert_nothing_left_open,
    run_available_now,
    values_in,
    write_input,
)

if TYPE_CHECKING:
    from pyspark.sql.connect.session import SparkSession as ConnectSession


def input_stream(spark: ConnectSession, bootstrap: str, topic: str) -> DataFrame:
    return (spark.readStream.format("oncelog")
            .option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
            .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "20")
            .load()
            .selectExpr("key", "value", "headers"))


def test_a_connect_client_reads_and_writes_exactly_once(
    connect_spark: ConnectSession, shared_cluster: LocalCluster, output: str, tmp_path: Path
) -> None:
    bootstrap = shared_cluster.bootstrap
    source = f"{output}-in"
    sent = write_input(bootstrap, source, 50)

    rows = (connect_spark.read.format("oncelog")
            .option("bootstrap", bootstrap).option("topics", source).load()
            .select("value").collect())
    assert sorted(bytes(r.value) for r in rows) == sorted(sent)

    checkpoint = tmp_path / "checkpoint"
    run_available_now(
        input_stream(connect_spark, bootstrap, source)
        .writeStream.format("oncelog")
        .option("kafka.bootstrap.servers", bootstrap).option("topic", output)
        .option("checkpointLocation", str(checkpoint))
    )
    assert values_in(bootstrap, output) == Counter(sent)
    app_id = default_app_id(str(checkpoint))
    with Admin(bootstrap=bootstrap) as admin:
        assert admin.describe_transaction(f"{app_id}-0").producer_id >= 0
    assert_nothing_left_open(bootstrap, app_id, output)


def test_a_connect_client_runs_the_foreach_batch_sink(
    connect_spark: ConnectSession, shared_cluster: LocalCluster, output: str, tmp_path: Path
) -> None:
    bootstrap = shared_cluster.bootstrap
    source = f"{output}-in"
    sent = write_input(bootstrap, source, 50)
    app_id = f"{output}-app"

    run_available_now(
        input_stream(connect_spark, bootstrap, source)
        .writeStream.foreachBatch(exactly_once_writer(bootstrap, output, app_id, 2))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
    )
    assert values_in(bootstrap, output) == Counter(sent)
    assert_nothing_left_open(bootstrap, app_id, output)
