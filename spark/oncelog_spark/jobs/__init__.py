"""Spark jobs that run as their own process: `python -m oncelog_spark.jobs.NAME`.

Each job module has `main(argv) -> int`, builds its session with
`oncelog_spark.build_session` (which sets what Spark's Python workers need),
and stops its streaming query cleanly on SIGINT/SIGTERM. A job killed with
SIGKILL instead restarts from its checkpoint, continuing after the last
completed micro-batch.

* `export` — copies topics to Parquet files, exactly once (the oncelog source
  into Spark's file sink, which commits each micro-batch's files in its own
  log under the output directory).
"""
