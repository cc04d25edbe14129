"""Spark integration for oncelog (Spark 4's Python Data Source API).

    from oncelog_spark import build_session, register

    spark = build_session("my-job")                  # or register(existing_session)
    df = (spark.readStream.format("oncelog")
          .option("bootstrap", "127.0.0.1:9092").option("topics", "payments").load())
    (df.writeStream.format("oncelog").option("bootstrap", "127.0.0.1:9092")
       .option("topic", "copy").option("app_id", "copier")
       .option("checkpointLocation", "/tmp/copier").start())

The package lives in `spark/oncelog_spark/` and is installed beside `oncelog`
(docs/spark.md says why it is a package of its own). Modules:

* `source.py` — the data source: `format("oncelog")` for spark.read,
  spark.readStream and writeStream; its batch and stream readers.
* `reading.py` — reading one offset range in a Spark task, as Arrow batches.
* `offsets.py` — offsets JSON, ranges and per-trigger limits (pure logic).
* `options.py` — the source's and sinks' options, parsed and checked (with
  Spark's Kafka names where they mean the same); the sink's default app_id.
* `cluster.py` — partitions and end offsets, asked from the cluster.
* `session.py` — a SparkSession set up for oncelog.
* `stream_sink.py` — the two-phase-commit sink, `writeStream.format("oncelog")`:
  tasks prepare, the driver's commit completes.
* `sink.py` — the exactly-once sink for `foreachBatch` (`exactly_once_writer`).
* `writing.py` — a sink's write side in a Spark task: rows to records, one
  transaction per writer and micro-batch, the batch id as its offset.
"""

from __future__ import annotations

try:
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401
except ModuleNotFoundError as _exc:
    # The SDK alone (`pip install oncelog`) does not bring Spark.
    raise ModuleNotFoundError(
        f"oncelog_spark needs {_exc.name}, which comes with the spark extra: "
        "pip install 'oncelog[spark]'", name=_exc.name) from _exc

from oncelog_spark.options import default_app_id
from oncelog_spark.reading import SCHEMA
from oncelog_spark.session import build_session, configure_environment, register
from oncelog_spark.sink import BatchOutcome, ExactlyOnceWriter, exactly_once_writer
from oncelog_spark.source import FORMAT_NAME, OncelogDataSource

__all__ = [
    "FORMAT_NAME",
    "SCHEMA",
    "BatchOutcome",
    "ExactlyOnceWriter",
    "OncelogDataSource",
    "build_session",
    "configure_environment",
    "default_app_id",
    "exactly_once_writer",
    "register",
]
