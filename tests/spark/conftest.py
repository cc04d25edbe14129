"""Spark fixtures: one real local Spark session for the whole test run.

A session takes 10–15 s to start (a JVM, then Python workers on first use),
so every Spark test shares one, built by the package's own
`oncelog_spark.build_session` (which registers the oncelog source and points
Spark's Python workers at this interpreter). The same JVM is also a Spark
Connect server (`connect_server_config`, on a free port), so
`connect_spark` — a Spark Connect client session of that server — costs no
JVM of its own. Tests that need a cluster use the module-scoped
`shared_cluster` from tests/conftest.py; `output` is a fresh output topic
on it for the sink tests.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from pyspark.sql import SparkSession

from oncelog.testing import LocalCluster
from oncelog_spark import build_session, register
from oncelog_spark.session import connect_server_config
from tests.spark.sinks import create_output

if TYPE_CHECKING:
    from pyspark.sql.connect.session import SparkSession as ConnectSession

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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="session")
def connect_port() -> int:
    """Where the shared session serves Spark Connect clients."""
    return free_port()


@pytest.fixture(scope="session")
def spark(connect_port: int) -> Iterator[SparkSession]:
    config = {**TEST_CONFIG, **connect_server_config(port=connect_port)}
    session = build_session("oncelog-tests", master=MASTER, config=config)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def connect_spark(spark: SparkSession, connect_port: int) -> Iterator[ConnectSession]:
    """A Spark Connect client of the shared session's server, with the
    oncelog source registered as a user of Spark Connect registers it."""
    # The Connect client needs packages a classic session does not.
    pytest.importorskip("zstandard", reason="the Spark Connect client needs zstandard")
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    session = ConnectSession.builder.remote(f"sc://127.0.0.1:{connect_port}").getOrCreate()
    register(session)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def output(shared_cluster: LocalCluster, topic_name: str) -> str:
    """A sink tests' output topic (OUTPUT_PARTITIONS partitions)."""
    return create_output(shared_cluster.bootstrap, topic_name)
