"""Spark's paths through oncelog: the source alone against each exactly-once
sink, on the same input, with Trigger.AvailableNow.

One LocalCluster and one local Spark session (`--master`, default
local[2]) serve the whole run. The input topic (`--records` records of
`--value-bytes`, `--partitions` partitions) is written once with the SDK's
fastest path (`send_many`) before any clock starts. Then, each round, every
case reads the whole input from its beginning with
`readStream.format("oncelog")` (key and value, at most
`--max-records-per-trigger` offsets per micro-batch; 0: no limit, one
micro-batch) and `trigger(availableNow=True)`. The rate of the input's own
writing is printed too: every sink adds such a write to the source's read,
on the same cores.

* `source alone`: into Spark's `noop` sink, which reads every row and
  writes nothing: what the source costs by itself.
* `2PC sink`: `writeStream.format("oncelog")` to an output topic: each task
  writes and prepares its transaction, the driver completes them
  (oncelog_spark/stream_sink.py).
* `foreachBatch sink`: `foreachBatch(exactly_once_writer(...))` to an
  output topic with `--partitions` writers (oncelog_spark/sink.py).

An untimed source-alone query runs first (`--no-warm-up`: none): the
session's first query pays for the JVM's warm-up and the Python workers'
imports. Each query runs on its own checkpoint and app_id; each sink writes to its
own output topic. The clock runs from `start()` until the query has ended
(every micro-batch done). After each run the output is read back under
read_committed and checked: every input record exactly once, or the run
fails; the source alone must have read exactly `--records` rows.

The case order rotates across rounds, so no case always gets the machine
as another left it. The summary gives, per case, the median records/s with
the min-max over rounds, the ratio to the source alone (taken per round,
then the median; the target is 0.9), and the per-micro-batch cost from
Spark's progress events: how many micro-batches, the median
triggerExecution, and each phase's mean per micro-batch (latestOffset,
getBatch, queryPlanning, walCommit, addBatch — which holds the read, the
sink's tasks and its commit —, commitOffsets). For the foreachBatch sink,
whose function runs in this process, also the driver's own look at the
sink-side group before each micro-batch and the write job.

    .venv/bin/python bench/spark.py                          # 3 rounds, 1M x 100 B
    .venv/bin/python bench/spark.py --rounds 1 --records 20000 \
        --max-records-per-trigger 5000 --json /tmp/spark.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Run as a script (`python bench/spark.py`), the repository root is not on
# sys.path; the sibling benchmarks are imported as the package `bench`.
REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from pyspark.sql import DataFrame, SparkSession  # noqa: E402

from bench.pipeline import ID_BYTES, value_of  # noqa: E402
from oncelog import Admin, Consumer, Producer, TopicPartition  # noqa: E402
from oncelog.testing import LocalCluster, wait_for_markers  # noqa: E402
from oncelog_spark import build_session, exactly_once_writer  # noqa: E402
from oncelog_spark.sink import ExactlyOnceWriter  # noqa: E402

INPUT = "spark-in"
SOURCE, TWO_PC, FOREACH = "source alone", "2PC sink", "foreachBatch sink"
CASES = (SOURCE, TWO_PC, FOREACH)
# Spark's progress phases, in the order a micro-batch runs them.
PHASES = ("latestOffset", "getBatch", "queryPlanning", "walCommit", "addBatch",
          "commitOffsets")
# A foreachBatch write task's laps (oncelog_spark.writing.WriterOutcome):
# producer start and init_transactions(), the look at the sink-side group,
# waiting for input batches (Spark reading them), handing them to the
# producer, the offset and commit_transaction().
TASK_LAPS = ("init", "check", "input", "send", "commit")
# Records per send_many() call when filling the input.
FILL_CHUNK = 10_000
# Failure guard for a query that never ends (not a timing assumption).
QUERY_LIMIT_S = 3600
TARGET_RATIO = 0.9
# Settings of a session's start, for the session the script builds itself:
# no progress bar between the result lines; on a loaded machine a Python
# worker may take longer than Spark's default 15 s to connect back, which
# fails the query rather than slow it.
START_CONFIG = {
    "spark.ui.showConsoleProgress": "false",
    "spark.python.authenticate.socketTimeout": "120s",
}


@dataclass
class CaseRun:
    case: str
    round: int
    records: int
    seconds: float
    records_per_s: float
    # Micro-batches that read records, and every trigger's phases (ms, summed
    # over the query; AvailableNow may end with a trigger that reads nothing).
    batches: int
    triggers: int
    trigger_p50_ms: float
    phase_ms: dict[str, float]
    # Wall time outside every trigger: the query's start and stop.
    outside_triggers_ms: float
    # foreachBatch only, summed over micro-batches: the whole function call,
    # and its two parts (the driver's look at the sink-side group; the write job).
    sink_call_ms: float = 0.0
    sink_check_ms: float = 0.0
    sink_write_ms: float = 0.0
    # ... and the write tasks' laps (TASK_LAPS), summed over writers.
    sink_task_ms: dict[str, float] = field(default_factory=dict)


@dataclass
class Summary:
    records_per_s: dict[str, float] = field(default_factory=dict)
    ratio_to_source: dict[str, float] = field(default_factory=dict)
    # The input's writing with send_many, before the rounds.
    fill_records_per_s: float = 0.0


def fill_input(bootstrap: str, records: int, value_bytes: int, partitions: int) -> None:
    """Writes record i (its id in its first bytes) to partition i mod `partitions`."""
    with Producer(bootstrap=bootstrap, linger_ms=5, batch_size=512 * 1024) as producer:
        for p in range(partitions):
            ids = range(p, records, partitions)
            for first in range(0, len(ids), FILL_CHUNK):
                values = [value_of(i, value_bytes) for i in ids[first:first + FILL_CHUNK]]
                producer.send_many(INPUT, values, partition=p)
        producer.flush()


def check_output(bootstrap: str, topic: str, partitions: int, records: int) -> None:
    """Every input record exactly once in `topic`, read under read_committed."""
    seen = bytearray(records)
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    # The sink's last commit returned when it was decided; until its markers
    # land, read_committed's end stops short of it.
    wait_for_markers(bootstrap)
    with Consumer(bootstrap=bootstrap, isolation_level="read_committed",
                  max_poll_records=10_000) as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning(tps)
        ends = consumer.end_offsets(tps)
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for r in consumer.poll(timeout=1.0):
                record_id = int.from_bytes((r.value or b"")[:ID_BYTES], "big")
                if record_id >= records:
                    raise SystemExit(f"{topic}: record {record_id} is not an input record "
                                     f"(the input has {records})")
                if seen[record_id]:
                    raise SystemExit(f"{topic}: input record {record_id} is in it twice")
                seen[record_id] = 1
    missing = records - sum(seen)
    if missing:
        raise SystemExit(f"{topic}: {missing} of {records} input records are not in it")


class TimedWriter:
    """The foreachBatch function, timed: the exactly-once writer's call, and
    within it the driver's look at the sink-side group (`next_batches`)."""

    def __init__(self, writer: ExactlyOnceWriter) -> None:
        self.writer = writer
        self.call_s: list[float] = []
        self.check_ms = self.write_ms = 0.0
        # The write tasks' own laps, summed over writers and micro-batches.
        self.task_ms = dict.fromkeys(TASK_LAPS, 0.0)
        self.records = 0

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        self.writer(df, batch_id)
        self.call_s.append(time.perf_counter() - started)
        last = self.writer.last
        if last is not None:
            self.records += last.records
            self.check_ms += last.check_ms
            self.write_ms += last.write_ms
            for w in last.writers:
                for lap in TASK_LAPS:
                    self.task_ms[lap] += getattr(w, f"{lap}_ms")


def input_stream(spark: SparkSession, bootstrap: str, max_records_per_trigger: int
                 ) -> DataFrame:
    reader = (spark.readStream.format("oncelog").option("bootstrap", bootstrap)
              .option("topics", INPUT).option("starting_offsets", "earliest"))
    if max_records_per_trigger:
        reader = reader.option("max_records_per_trigger", str(max_records_per_trigger))
    return reader.load().select("key", "value")


def run_case(spark: SparkSession, bootstrap: str, case: str, round_no: int,
             args: argparse.Namespace, work_dir: Path) -> CaseRun:
    name = f"{case.split()[0].lower()}-r{round_no}"
    checkpoint = work_dir / f"checkpoint-{name}"
    output = f"spark-out-{name}"
    if case != SOURCE:
        with Admin(bootstrap=bootstrap) as admin:
            admin.create_topic(output, partitions=args.partitions)
    writer = input_stream(spark, bootstrap, args.max_records_per_trigger).writeStream \
        .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
    timed: TimedWriter | None = None
    if case == SOURCE:
        writer = writer.format("noop")
    elif case == TWO_PC:
        writer = (writer.format("oncelog").option("bootstrap", bootstrap)
                  .option("topic", output).option("app_id", f"bench-{name}"))
    else:
        timed = TimedWriter(exactly_once_writer(bootstrap, output, f"bench-{name}",
                                                args.partitions))
        writer = writer.foreachBatch(timed)
    started = time.perf_counter()
    query = writer.start()
    finished = query.awaitTermination(QUERY_LIMIT_S)
    elapsed_s = time.perf_counter() - started
    if not finished:
        query.stop()
        raise SystemExit(f"{case}: the query did not end within {QUERY_LIMIT_S} s")
    if query.exception() is not None:
        raise SystemExit(f"{case}: the query failed: {query.exception()}")
    progress = query.recentProgress
    read = sum(p.numInputRows for p in progress)
    if read != args.records:
        raise SystemExit(f"{case}: the query read {read} rows, expected {args.records} "
                         f"(raise spark.sql.streaming.numRecentProgressUpdates if it "
                         f"kept fewer progress events than micro-batches)")
    if case != SOURCE:
        check_output(bootstrap, output, args.partitions, args.records)
    run = CaseRun(case, round_no, args.records, round(elapsed_s, 2),
                  round(args.records / elapsed_s), **progress_figures(progress, elapsed_s))
    if timed is not None:
        if timed.records != args.records:
            raise SystemExit(f"{case}: the writer wrote {timed.records} records, expected "
                             f"{args.records}")
        run.sink_call_ms = round(sum(timed.call_s) * 1000, 1)
        run.sink_check_ms = round(timed.check_ms, 1)
        run.sink_write_ms = round(timed.write_ms, 1)
        run.sink_task_ms = {lap: round(ms, 1) for lap, ms in timed.task_ms.items()}
    return run


def progress_figures(progress: Sequence[Any], elapsed_s: float) -> dict[str, Any]:
    """Micro-batches and per-phase times from a query's progress events."""
    durations = [dict(p.durationMs) for p in progress]
    triggers = [d.get("triggerExecution", 0) for d in durations]
    phase_ms = {phase: float(sum(d.get(phase, 0) for d in durations)) for phase in PHASES}
    return {
        "batches": sum(1 for p in progress if p.numInputRows > 0),
        "triggers": len(progress),
        "trigger_p50_ms": float(statistics.median(triggers)) if triggers else 0.0,
        "phase_ms": phase_ms,
        "outside_triggers_ms": round(elapsed_s * 1000 - sum(triggers), 1),
    }


def rotated(cases: Sequence[str], round_no: int) -> list[str]:
    """The case order of round `round_no` (1-based): each round starts one later."""
    shift = (round_no - 1) % len(cases)
    return list(cases[shift:]) + list(cases[:shift])


def median_range(values: Iterable[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[0], ordered[-1]


def ratios_to_source(runs: Sequence[CaseRun], case: str) -> list[float]:
    """Per round: the case's records/s over the source alone's."""
    source = {r.round: r.records_per_s for r in runs if r.case == SOURCE}
    return [r.records_per_s / source[r.round] for r in runs
            if r.case == case and r.round in source]


def summarize(runs: Sequence[CaseRun], args: argparse.Namespace) -> Summary:
    summary = Summary()
    limit = (f"at most {args.max_records_per_trigger:,} offsets per micro-batch"
             if args.max_records_per_trigger else "no per-trigger limit")
    print()
    print(f"median (min-max) of {args.rounds} round(s): {args.records:,} records of "
          f"{args.value_bytes} B, {args.partitions} partitions, {limit}, master "
          f"{args.master}; every sink's output checked exactly once")
    print("| case | records/s | / source alone | micro-batches | trigger p50 ms |")
    print("|---|---|---|---|---|")
    for case in CASES:
        mine = [r for r in runs if r.case == case]
        if not mine:
            continue
        median, low, high = median_range(r.records_per_s for r in mine)
        summary.records_per_s[case] = median
        ratio_text = "1"
        if case != SOURCE:
            ratios = ratios_to_source(runs, case)
            if ratios:
                r_median, r_low, r_high = median_range(ratios)
                summary.ratio_to_source[case] = round(r_median, 3)
                verdict = "meets" if r_median >= TARGET_RATIO else "misses"
                ratio_text = (f"{r_median:.2f} ({r_low:.2f}-{r_high:.2f}), {verdict} "
                              f"{TARGET_RATIO}")
        batches = statistics.median(r.batches for r in mine)
        trigger = statistics.median(r.trigger_p50_ms for r in mine)
        print(f"| {case} | {median:,.0f} ({low:,.0f}-{high:,.0f}) | {ratio_text} | "
              f"{batches:g} | {trigger:,.0f} |")
    print()
    print("per micro-batch, mean ms (median over rounds); addBatch holds the read, the "
          "sink's tasks and its commit")
    print("| case | " + " | ".join(PHASES) + " | outside triggers (whole query) |")
    print("|---|" + "---|" * (len(PHASES) + 1))
    for case in CASES:
        mine = [r for r in runs if r.case == case]
        if not mine:
            continue
        cells = [statistics.median(r.phase_ms[p] / max(r.triggers, 1) for r in mine)
                 for p in PHASES]
        outside = statistics.median(r.outside_triggers_ms for r in mine)
        print(f"| {case} | " + " | ".join(f"{c:,.0f}" for c in cells) + f" | {outside:,.0f} |")
    foreach = [r for r in runs if r.case == FOREACH]
    if foreach:
        per_batch = [(r.sink_call_ms / max(r.batches, 1), r.sink_check_ms / max(r.batches, 1),
                      r.sink_write_ms / max(r.batches, 1)) for r in foreach]
        call, check, write = (statistics.median(x[i] for x in per_batch) for i in range(3))
        print(f"foreachBatch function per micro-batch: {call:,.0f} ms, of which the "
              f"driver's look at the sink-side group {check:,.0f} ms and the write job "
              f"{write:,.0f} ms")
        laps = {lap: statistics.median(r.sink_task_ms.get(lap, 0.0) / max(r.batches, 1)
                                       for r in foreach) for lap in TASK_LAPS}
        print("its write tasks per micro-batch, ms summed over writers: "
              + ", ".join(f"{lap} {ms:,.0f}" for lap, ms in laps.items()))
    return summary


def spark_config(args: argparse.Namespace) -> dict[str, str]:
    return {
        # Every micro-batch's progress event is kept, so the row count and
        # the per-phase sums cover the whole query.
        "spark.sql.streaming.numRecentProgressUpdates": "100000",
        "spark.sql.shuffle.partitions": str(args.partitions),
    }


def run(spark: SparkSession, args: argparse.Namespace) -> tuple[list[CaseRun], Summary]:
    """Every round against a fresh LocalCluster, on a session already built."""
    settings = spark_config(args)
    before: dict[str, str | None] = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    args.master = spark.sparkContext.master
    try:
        return _rounds(spark, args)
    finally:
        # A session lent by the caller goes back as it came.
        for key, old in before.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)


def _rounds(spark: SparkSession, args: argparse.Namespace) -> tuple[list[CaseRun], Summary]:
    runs: list[CaseRun] = []
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-spark-") as work, \
            LocalCluster(Path(work) / "cluster") as cluster:
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic(INPUT, partitions=args.partitions)
        fill_started_s = time.perf_counter()
        fill_input(cluster.bootstrap, args.records, args.value_bytes, args.partitions)
        fill_s = time.perf_counter() - fill_started_s
        fill_rate = round(args.records / fill_s)
        # What writing the input costs on this machine, the write half every
        # sink adds to the source's read (not in any case's clock).
        print(f"input written with send_many: {fill_rate:,} records/s", flush=True)
        wait_for_markers(cluster.bootstrap)
        if args.warm_up:
            # The session's first query pays for the JVM's warm-up and the
            # Python workers' imports; no case should.
            run_case(spark, cluster.bootstrap, SOURCE, 0, args, Path(work))
        for round_no in range(1, args.rounds + 1):
            for case in rotated(args.cases, round_no):
                result = run_case(spark, cluster.bootstrap, case, round_no, args, Path(work))
                runs.append(result)
                print(result, flush=True)
    summary = summarize(runs, args)
    summary.fill_records_per_s = fill_rate
    print(f"the input's writing alone (send_many, not in any clock): {fill_rate:,} records/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k != "json"},
                       "runs": [asdict(r) for r in runs], "summary": asdict(summary)},
                      f, indent=2)
    return runs, summary


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--max-records-per-trigger", type=int, default=100_000,
                        help="offsets per micro-batch at most (0: no limit)")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                        help="skip the untimed source-alone query before the rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.value_bytes < ID_BYTES:
        parser.error(f"--value-bytes is {args.value_bytes}; it must be >= {ID_BYTES}")
    if args.records < 1 or args.partitions < 1 or args.rounds < 1:
        parser.error("--records, --partitions and --rounds must be >= 1")
    if args.max_records_per_trigger < 0:
        parser.error("--max-records-per-trigger must be >= 0")
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown or not cases:
        parser.error(f"--cases {args.cases!r}: expected some of {', '.join(CASES)}")
    args.cases = tuple(c for c in CASES if c in cases)
    return args


def main(argv: Sequence[str] | None = None, spark: SparkSession | None = None
         ) -> tuple[list[CaseRun], Summary]:
    """The benchmark; on `spark` when given (left running), else on a
    session of its own (stopped at the end)."""
    args = parse_args(argv)
    if spark is not None:
        return run(spark, args)
    session = build_session("oncelog-bench-spark", master=args.master, config=START_CONFIG)
    try:
        return run(session, args)
    finally:
        session.stop()


if __name__ == "__main__":
    main()
