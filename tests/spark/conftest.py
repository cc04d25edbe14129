"""Spark fixtures: one real local Spark session for the whole test run.

A session takes 10–15 s to start (a JVM, then Python workers on first use),
so every Spark test shares one, built by the package's own
`oncelog_spark.build_session` (which registers the oncelog source and points
Spark's Python workers at this interpreter). Tests that need a cluster use
the module-scoped `shared_cluster` from tests/conftest.py; `output` is a
fresh output topic on it for the sink tests.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from oncelog.testing import LocalCluster
from oncelog_spark import build_session
from tests.spark.sinks import create_output

# Failure guards, not timing assumptions: a stuck stop or a lost executor
# fails the test run within a minute instead of hanging it.
TEST_CONFIG = {
    "spark.sql.streaming.stopTimeout": "60s",
    "spark.network.timeout": "60s",
    "spark.executor.heartbeatInterval": "10s",
    # Python workers print a traceback when they crash or hang.
    "spark.python.worker.faulthandler.enabled": "true",
    "spark.sql.execution.pyspark.udf.faulthandler.enabled": "true",
}


# Two cores, and a failed task is tried once more (local[N,F]: F attempts),
# as on a cluster (where Spark's default is 4): the sink's tests need a real
# task retry. Local mode ignores spark.task.maxFailures.
MASTER = "local[2,2]"


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = build_session("oncelog-tests", master=MASTER, config=TEST_CONFIG)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def output(shared_cluster: LocalCluster, topic_name: str) -> str:
    """A sink tests' output topic (OUTPUT_PARTITIONS partitions)."""
    return create_output(shared_cluster.bootstrap, topic_name)
