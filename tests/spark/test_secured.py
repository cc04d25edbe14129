"""The Spark source and the two-phase-commit sink on a TLS + ACL cluster.

Goal: a streaming query reads with `format("oncelog")` and writes with the
exactly-once sink as a least-privilege principal over TLS — the security
options reach every client the source and the sink make, on the driver and
in the executors — and every row is in the output exactly once, through a
write task that dies half-way and is retried; the principal holds only
Read on the input topic; Write and Read on the output topic (the sink keeps
its batch ids as the offsets of its group on the output's partitions) and
Read on its group; Write and TwoPhaseCommit on its transactional ids
(prefixed); nothing else. Without the options, the query fails saying the
cluster serves TLS.

Method: one LocalCluster(security=True) for the module and the shared Spark
session (local[2,2]); Trigger.AvailableNow with the sink's crash hook; the
ACLs are granted, and waited for, as the super user, who also writes the
input and reads the output back (read_committed).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession

from oncelog import AclFilter, Producer
from oncelog.testing import LocalCluster
from tests.spark.sinks import OUTPUT_PARTITIONS, RUN_TIMEOUT_S, run_available_now
from tests.support.secure_clients import admin_of, allow, grant, read_committed

PRINCIPAL = "User:spark-job"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("spark-secured") / "cluster",
                      security=True) as cluster:
        yield cluster


def spark_options(cluster: LocalCluster) -> dict[str, str]:
    """The job's connection: Kafka's name for the protocol, ours for the files."""
    cfg = cluster.client_config(PRINCIPAL.removeprefix("User:"))
    return {"kafka.security.protocol": "SSL", "ssl_cafile": cfg["ssl_cafile"],
            "ssl_certfile": cfg["ssl_certfile"], "ssl_keyfile": cfg["ssl_keyfile"]}


def input_stream(spark: SparkSession, cluster: LocalCluster, topic: str,
                 options: dict[str, str]) -> DataFrame:
    reader = (spark.readStream.format("oncelog").option("bootstrap", cluster.bootstrap)
              .option("topics", topic).option("starting_offsets", "earliest")
              .option("max_records_per_trigger", "60"))
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load().selectExpr("key", "value", "headers")


def test_a_least_privilege_query_writes_each_row_once(
    spark: SparkSession, secured: LocalCluster, tmp_path: Path
) -> None:
    source, output, app_id = "sec-in", "sec-out", "sec-app"
    with admin_of(secured) as admin:
        admin.create_topic(source, partitions=2)
        admin.create_topic(output, partitions=OUTPUT_PARTITIONS)
    sent = [f"p-{i}".encode() for i in range(150)]
    with Producer(bootstrap=secured.bootstrap, **secured.client_config("admin")) as producer:
        for i, value in enumerate(sent):
            producer.send(source, key=f"acct-{i % 9}".encode(), value=value)
    needed = [
        *allow(PRINCIPAL, "topic", source, "read"),
        *allow(PRINCIPAL, "topic", output, "write", "read"),
        *allow(PRINCIPAL, "group", app_id, "read"),
        *allow(PRINCIPAL, "transactional_id", f"{app_id}-", "write", "two_phase_commit",
               pattern_type="prefixed"),
    ]
    grant(secured, needed)
    options = spark_options(secured)
    marker = tmp_path / "crashed"

    writer = (input_stream(spark, secured, source, options).writeStream.format("oncelog")
              .option("bootstrap", secured.bootstrap).option("topic", output)
              .option("app_id", app_id).option("checkpointLocation", str(tmp_path / "ck"))
              .option("test_crash_after_records", "20")
              .option("test_crash_marker", str(marker)))
    for name, setting in options.items():
        writer = writer.option(name, setting)
    run_available_now(writer)

    assert marker.exists(), "a write task died half-way"
    written = Counter(r.value for r in read_committed(secured, output, OUTPUT_PARTITIONS))
    assert written == Counter(sent), "each row once"
    with admin_of(secured) as admin:
        assert sorted(admin.describe_acls(AclFilter(principal=PRINCIPAL)), key=str) == \
            sorted(needed, key=str), "the job holds these ACLs and nothing else"


def test_without_the_security_options_the_query_says_the_cluster_serves_tls(
    spark: SparkSession, secured: LocalCluster, tmp_path: Path
) -> None:
    source = "sec-plain-in"
    with admin_of(secured) as admin:
        admin.create_topic(source, partitions=1)
    query = (input_stream(spark, secured, source, {}).writeStream.format("oncelog")
             .option("bootstrap", secured.bootstrap).option("topic", "sec-plain-out")
             .option("app_id", "sec-plain").option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(availableNow=True).start())
    with pytest.raises(StreamingQueryException, match="serves TLS, and this client connects "
                                                      "in plain text"):
        query.awaitTermination(RUN_TIMEOUT_S)
