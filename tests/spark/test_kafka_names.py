"""A job ported from `format("kafka")`: Spark's Kafka option names in real
queries, and the sink's default app_id across restarts.

Goal: under Spark, a batch read written with Kafka's names
(`kafka.bootstrap.servers`, `subscribe`, `startingOffsets`/`endingOffsets`
JSON, `kafka.isolation.level`, `failOnDataLoss`, `includeHeaders`) returns
exactly the rows of the same read with oncelog's names, and an unsupported
Kafka option fails the read with its reason. A streaming query written with
Kafka's names (`subscribePattern`, `startingOffsets`, `maxOffsetsPerTrigger`,
...) into `format("oncelog")` with no app_id writes every input record
exactly once (read_committed) across a restart from its checkpoint that
replays its last micro-batch, and picks up a topic its pattern comes to
match; the restarted query writes under the same transactional ids (same
producer id, later epoch: it fenced its predecessor) and keeps its batch
ids in the group named by its app_id and query id. A new query started on
a deleted checkpoint's path (same app_id, new query id) is not mistaken for
a replay: it writes all its input again, its first micro-batch included.

Method: the shared Spark session and module cluster. The restart is a real
second run of the query on the same checkpoint after its last `commits/N`
was removed (a driver that died after the sink committed and before Spark
recorded it); outputs are counted per unique value; transactions are
looked up with Admin.describe_transaction, the batch ids with
Admin.list_group_offsets; nothing is left open or hanging.
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from oncelog import Admin, Producer, TopicPartition
from oncelog.testing import LocalCluster
from oncelog_spark import default_app_id
from tests.spark.rows import collect, expected
from tests.spark.sinks import (
    assert_nothing_left_open,
    forget_last_commit,
    run_available_now,
    values_in,
    write_input,
)
from tests.support.writing import ABORTED, COMMITTED, PLAIN, send_all, write_transaction


def test_a_batch_read_with_kafka_names_reads_what_oncelog_names_read(
    spark: SparkSession, shared_cluster: LocalCluster, topic_name: str
) -> None:
    bootstrap = shared_cluster.bootstrap
    with Admin(bootstrap=bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2)
    with Producer(bootstrap=bootstrap, transactional_id=f"{topic_name}-w") as txn, \
            Producer(bootstrap=bootstrap) as plain:
        txn.init_transactions()
        written = write_transaction(txn, topic_name, 0, [b"c0", b"c1", b"c2"],
                                    outcome=COMMITTED, headers=[("h", b"v")])
        written += write_transaction(txn, topic_name, 1, [b"x0"], outcome=ABORTED)
        written += send_all(plain, topic_name, 1, [b"p0", b"p1"], outcome=PLAIN, key=b"k")
    starting = json.dumps({topic_name: {"0": 1, "1": -2}})
    ending = json.dumps({topic_name: {"0": -1, "1": -1}})

    def read(**options: str) -> DataFrame:
        reader = spark.read.format("oncelog")
        for name, value in options.items():
            reader = reader.option(name, value)
        return reader.load()

    kafka = read(**{"kafka.bootstrap.servers": bootstrap, "subscribe": topic_name,
                    "startingOffsets": starting, "endingOffsets": ending,
                    "kafka.isolation.level": "read_committed", "failOnDataLoss": "true",
                    "includeHeaders": "true"})
    ours = read(bootstrap=bootstrap, topics=topic_name, starting_offsets=starting,
                ending_offsets=ending, isolation_level="read_committed")
    want = [w for w in written if w.outcome in (COMMITTED, PLAIN) and w.value != b"c0"]
    assert collect(kafka) == expected(want)
    assert collect(ours) == expected(want)
    pattern = read(**{"kafka.bootstrap.servers": bootstrap,
                      "subscribePattern": re.escape(topic_name),
                      "startingOffsets": starting})
    assert collect(pattern) == expected(want)

    with pytest.raises(PySparkException, match="option 'assign' of Spark's Kafka source"):
        read(**{"kafka.bootstrap.servers": bootstrap,
                "assign": json.dumps({topic_name: [0]})}).collect()


def write_plain(bootstrap: str, topic: str, partitions: int, count: int) -> list[bytes]:
    with Admin(bootstrap=bootstrap) as admin:
        admin.create_topic(topic, partitions=partitions)
    values = [f"{topic}-{i}".encode() for i in range(count)]
    with Producer(bootstrap=bootstrap) as producer:
        for value in values:
            producer.send(topic, value=value)
    return values


def test_the_default_app_id_names_the_query_across_restarts(
    spark: SparkSession, shared_cluster: LocalCluster, output: str, tmp_path: Path
) -> None:
    bootstrap = shared_cluster.bootstrap
    sent = write_input(bootstrap, f"{output}-in-a", 100)        # two partitions
    checkpoint = tmp_path / "checkpoint"
    app_id = default_app_id(str(checkpoint))

    def run() -> StreamingQuery:
        # Only Kafka's names, as the job had them with format("kafka"); no app_id.
        return run_available_now(
            spark.readStream.format("oncelog")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribePattern", re.escape(output) + "-in-.*")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "40")
            .option("failOnDataLoss", "true")
            .option("kafka.isolation.level", "read_committed")
            .load()
            .selectExpr("key", "value", "headers")
            .writeStream.format("oncelog")
            .option("kafka.bootstrap.servers", bootstrap).option("topic", output)
            .option("checkpointLocation", str(checkpoint))
        )

    first = run()
    assert values_in(bootstrap, output) == Counter(sent)
    with Admin(bootstrap=bootstrap) as admin:
        before = admin.describe_transaction(f"{app_id}-0")
        group = f"{app_id}-{first.id}"
        batch_ids = admin.list_group_offsets(group)
        assert admin.list_group_offsets(app_id) == {}
    last = forget_last_commit(checkpoint)
    assert last >= 2, "maxOffsetsPerTrigger should make several micro-batches"
    assert max(o.offset for o in batch_ids.values()) == last + 1
    assert {tp.topic for tp in batch_ids} == {output}

    # Restarted: the last micro-batch runs again (every writer finds its
    # batch id and skips it), then a topic the pattern now matches is read.
    later = write_plain(bootstrap, f"{output}-in-b", 1, 20)
    second = run()
    assert second.id == first.id
    assert (checkpoint / "commits" / str(last)).exists(), "the micro-batch ran again"
    assert values_in(bootstrap, output) == Counter(sent + later), "each record once"
    with Admin(bootstrap=bootstrap) as admin:
        after = admin.describe_transaction(f"{app_id}-0")
        assert after.producer_id == before.producer_id
        assert after.producer_epoch > before.producer_epoch, "the same id, used again"
        grown = admin.list_group_offsets(group)
        assert grown[TopicPartition(output, 0)].offset > last + 1
    assert_nothing_left_open(bootstrap, app_id, output)

    # Started over on a new checkpoint at the same path: a new query, whose
    # first micro-batch must not be taken for a replay of the old one's.
    shutil.rmtree(checkpoint)
    third = run()
    assert third.id != first.id
    assert values_in(bootstrap, output) == Counter((sent + later) * 2), "all written again"
    with Admin(bootstrap=bootstrap) as admin:
        assert admin.list_group_offsets(f"{app_id}-{third.id}")
        assert admin.describe_transaction(f"{app_id}-0").producer_id == before.producer_id
    assert_nothing_left_open(bootstrap, app_id, output)
