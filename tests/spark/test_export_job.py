"""The export job as its own OS process (`python -m oncelog_spark.jobs.export`).

Goal: a Spark job started as a separate process — its own JVM, its own
Python workers, set up only by `oncelog_spark.build_session` — reads an
oncelog topic through the source and leaves exactly the committed records
in its Parquet output (never an aborted one), exits 0 when its
AvailableNow run is done, and exits 2 with a usage message for bad
arguments.

Method: a LocalCluster and a topic with a committed and an aborted
transaction and non-transactional records; the job runs once with
--available-now and a small --max-records-per-trigger (several
micro-batches); its output is read with the shared Spark session through
the file sink's log (`spark.read.parquet`), and compared with the offsets
the producer's futures reported. The copy test starts a second JVM (~30 s
on a 2-core machine), so it is marked slow: `pytest -m slow tests/spark`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from oncelog import Admin, Producer
from oncelog.testing import LocalCluster
from tests.spark.rows import collect, expected
from tests.support.writing import ABORTED, COMMITTED, PLAIN, send_all, write_transaction

# Failure guard for a job that never exits (not a timing assumption).
JOB_TIMEOUT_S = 240


def run_job(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "oncelog_spark.jobs.export", *args],
        capture_output=True, text=True, timeout=JOB_TIMEOUT_S, check=False,
    )


@pytest.mark.slow
def test_export_copies_the_committed_records_once(
    spark: SparkSession, shared_cluster: LocalCluster, topic_name: str, tmp_path: Path
) -> None:
    bootstrap = shared_cluster.bootstrap
    with Admin(bootstrap=bootstrap) as admin:
        admin.create_topic(topic_name, partitions=2)
    with Producer(bootstrap=bootstrap, transactional_id="export-writer") as txn, \
            Producer(bootstrap=bootstrap) as plain:
        txn.init_transactions()
        written = write_transaction(txn, topic_name, 0, [b"a0", b"a1", b"a2"],
                                    outcome=COMMITTED, headers=[("h", b"v")])
        written += write_transaction(txn, topic_name, 1, [b"x0", b"x1"], outcome=ABORTED)
        written += send_all(plain, topic_name, 1, [b"b0", b"b1"], outcome=PLAIN, key=b"k")
    output = tmp_path / "out"

    done = run_job("--bootstrap", bootstrap, "--topics", topic_name, "--output", str(output),
                   "--checkpoint", str(tmp_path / "checkpoint"), "--available-now",
                   "--max-records-per-trigger", "3")

    assert done.returncode == 0, done.stderr[-3000:]
    want = [w for w in written if w.outcome in (COMMITTED, PLAIN)]
    assert collect(spark.read.parquet(str(output))) == expected(want)


def test_bad_usage_exits_2() -> None:
    done = run_job("--topics", "t")
    assert done.returncode == 2
    assert "--bootstrap" in done.stderr
