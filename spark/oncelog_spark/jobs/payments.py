"""Payments to a double-entry ledger, exactly once:

    python -m oncelog_spark.jobs.payments --bootstrap 127.0.0.1:9092 \\
        --checkpoint ./ledger-checkpoint --app-id ledger [--input payments] [--output ledger]

A streaming query reads payment events from `--input` with the oncelog
source (read_committed: aborted payments are never seen) and writes two
ledger entries per payment to `--output` with an exactly-once oncelog sink:
a debit of the payer and a credit of the payee, keyed by account.

The sink is the two-phase-commit `format("oncelog")` (the default; its
tasks prepare, the driver's commit completes) or the `foreachBatch` helper
(`--sink foreach-batch`). Either way at most `--writers` transactional
writers write a micro-batch (at most the output's partitions).

A payment is JSON `{"id": 17, "from": "acct-3", "to": "acct-9",
"amount_cents": 1250}`; an entry is JSON `{"payment_id": 17, "entry":
"debit", "account": "acct-3", "amount_cents": -1250}` (credits positive),
so the entries of any set of whole payments sum to zero. A payment that is
not such JSON fails the query (an exactly-once pipeline does not drop
input quietly).

Killed at any moment (kill -9 included) and started again with the same
checkpoint and app id, it continues where its last completed micro-batch
ended, and the ledger still holds each payment's entries once.

`--progress-file` appends a JSON line per micro-batch (batch id, input rows,
the source's end offsets), for a supervisor to follow the query's progress
across restarts. Exit status: 0 when stopped by SIGINT/SIGTERM, 1 when the
query failed, 2 for bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import (
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
)

from oncelog_spark.jobs._running import await_query
from oncelog_spark.session import build_session
from oncelog_spark.sink import exactly_once_writer

PAYMENT_SCHEMA = "id BIGINT, `from` STRING, `to` STRING, amount_cents BIGINT"
SINKS = ("two-phase", "foreach-batch")


def ledger_entries(payments: DataFrame) -> DataFrame:
    """Rows of the oncelog source (payments) to sink rows (key, value): a
    debit and a credit per payment."""
    parsed = payments.select(
        F.from_json(F.col("value").cast("string"), PAYMENT_SCHEMA, {"mode": "FAILFAST"})
        .alias("p")
    ).select("p.*")

    def entry(kind: str, account: str, amount_cents: Column) -> Column:
        return F.struct(
            F.col("id").alias("payment_id"), F.lit(kind).alias("entry"),
            F.col(account).alias("account"), amount_cents.alias("amount_cents"),
        )

    entries = parsed.select(F.explode(F.array(
        entry("debit", "from", -F.col("amount_cents")),
        entry("credit", "to", F.col("amount_cents")),
    )).alias("e"))
    return entries.select(
        F.col("e.account").alias("key"),
        F.to_json(F.col("e")).alias("value"),
    )


class ProgressFile(StreamingQueryListener):
    """Appends one JSON line per micro-batch Spark reports as done."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def onQueryStarted(self, event: QueryStartedEvent) -> None:
        pass

    def onQueryProgress(self, event: QueryProgressEvent) -> None:
        progress = event.progress
        end = progress.sources[0].endOffset if progress.sources else None
        line = {
            "batch_id": progress.batchId,
            "input_rows": progress.numInputRows,
            "end_offsets": json.loads(end) if end else None,
            "duration_ms": dict(progress.durationMs),
            "time_ms": int(time.time() * 1000),
        }
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")

    def onQueryIdle(self, event: QueryIdleEvent) -> None:
        pass

    def onQueryTerminated(self, event: QueryTerminatedEvent) -> None:
        pass


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m oncelog_spark.jobs.payments",
        description="Payments to a double-entry ledger, exactly once.",
    )
    parser.add_argument("--bootstrap", required=True, help="host:port of a partition store")
    parser.add_argument("--checkpoint", required=True,
                        help="the query's checkpoint directory (keep it to resume)")
    parser.add_argument("--app-id", required=True,
                        help="the sink's transactional ids and group; one per checkpoint")
    parser.add_argument("--input", default="payments", help="topic of payment events")
    parser.add_argument("--output", default="ledger", help="topic of ledger entries")
    parser.add_argument("--sink", choices=SINKS, default=SINKS[0],
                        help="the exactly-once sink to write with")
    parser.add_argument("--writers", type=int, default=2,
                        help="transactional writers per micro-batch (at most the output's "
                             "partitions)")
    parser.add_argument("--max-records-per-trigger", type=int, default=None,
                        help="offsets per micro-batch at most")
    parser.add_argument("--progress-file", type=Path, default=None,
                        help="append a JSON line per completed micro-batch here")
    parser.add_argument("--hold-commit-marker", default=None,
                        help="tests and chaos only (two-phase sink): the sink option "
                             "test_hold_commit_marker")
    parser.add_argument("--master", default="local[2,4]",
                        help="Spark master (default local[2,4]: a failed task is tried 4 times)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.writers < 1:
        _parser().error(f"--writers must be at least 1, got {args.writers}")
    spark = build_session("oncelog-payments", master=args.master,
                          config={"spark.ui.showConsoleProgress": "false"})
    try:
        if args.progress_file is not None:
            spark.streams.addListener(ProgressFile(args.progress_file))
        reader = (
            spark.readStream.format("oncelog")
            .option("bootstrap", args.bootstrap)
            .option("topics", args.input)
            .option("starting_offsets", "earliest")
        )
        if args.max_records_per_trigger is not None:
            reader = reader.option("max_records_per_trigger", str(args.max_records_per_trigger))
        entries = ledger_entries(reader.load())
        if args.sink == "two-phase":
            # One writer per Spark partition: coalesce merges the source's
            # partitions by position, the same way in a replay, so a replayed
            # writer gets the same rows.
            writer = (
                entries.coalesce(args.writers).writeStream.format("oncelog")
                .option("bootstrap", args.bootstrap).option("topic", args.output)
                .option("app_id", args.app_id)
            )
            if args.hold_commit_marker:
                writer = writer.option("test_hold_commit_marker", args.hold_commit_marker)
        else:
            sink = exactly_once_writer(args.bootstrap, args.output, args.app_id, args.writers)
            writer = entries.writeStream.foreachBatch(sink)
        query = (
            writer.option("checkpointLocation", args.checkpoint)
            .queryName("payments-ledger")
            .start()
        )
        return await_query(query, "payments job")
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
