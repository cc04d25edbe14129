"""Copies oncelog topics to Parquet files, exactly once:

    python -m oncelog_spark.jobs.export --bootstrap 127.0.0.1:9092 --topics payments \\
        --output ./payments-parquet --checkpoint ./payments-checkpoint [--available-now]

A streaming query from the oncelog source (read_committed by default) into
Spark's file sink. The file sink lists the files of every completed
micro-batch in `OUTPUT/_spark_metadata`, and readers that go through it
(`spark.read.parquet(OUTPUT)`) see each record once even when the job was
killed mid-batch and restarted from the same checkpoint: the batch is
written again and only one copy is ever committed.

With --available-now the job reads what is there when it starts and exits;
without, it runs until SIGINT/SIGTERM, then stops its query cleanly. Exit
status: 0 when the query ended cleanly, 1 when it failed (the error is
printed), 2 for bad usage.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from oncelog_spark.jobs._running import await_query
from oncelog_spark.session import build_session


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m oncelog_spark.jobs.export",
        description="Copy oncelog topics to Parquet files, exactly once.",
    )
    parser.add_argument("--bootstrap", required=True, help="host:port of a partition store")
    parser.add_argument("--topics", required=True, help="comma-separated topic names")
    parser.add_argument("--output", required=True, help="directory of the Parquet files")
    parser.add_argument("--checkpoint", required=True,
                        help="the query's checkpoint directory (keep it to resume)")
    parser.add_argument("--starting-offsets", default="earliest",
                        help="where a new query starts: earliest (default), latest or JSON")
    parser.add_argument("--isolation-level", default="read_committed",
                        choices=["read_committed", "read_uncommitted"])
    parser.add_argument("--max-records-per-trigger", type=int, default=None,
                        help="offsets per micro-batch at most")
    parser.add_argument("--available-now", action="store_true",
                        help="read what is there now, then exit")
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    spark = build_session("oncelog-export", master=args.master)
    try:
        reader = (
            spark.readStream.format("oncelog")
            .option("bootstrap", args.bootstrap)
            .option("topics", args.topics)
            .option("starting_offsets", args.starting_offsets)
            .option("isolation_level", args.isolation_level)
        )
        if args.max_records_per_trigger is not None:
            reader = reader.option("max_records_per_trigger", str(args.max_records_per_trigger))
        writer = (
            reader.load().writeStream.format("parquet")
            .option("path", args.output)
            .option("checkpointLocation", args.checkpoint)
        )
        if args.available_now:
            writer = writer.trigger(availableNow=True)
        return await_query(writer.start(), "export")
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
