"""Transactional produce and read_committed consume throughput.

Starts a LocalCluster (one partition store, or --stores, and one coordinator)
and measures, for
100 B and 1 KiB values into a 4-partition topic:

* the idempotent producer (the baseline),
* a transactional producer committing every 10 ms, 100 ms and 1 s,
* with --flush-control, the idempotent producer calling flush() at the
  reference interval: what draining the pipeline costs without any
  transactional request, to tell the two apart,

and after the reference interval's transactional case, in every round, reads
the whole topic back with read_uncommitted and read_committed consumers (in
alternating order: the first read warms the caches for the second). Prints
records/s and each case's ratio to its baseline. The targets:
with 1 KiB records and a 100 ms commit interval, the transactional producer
keeps >= 97 % of the idempotent throughput; read_committed reads at >= 95 % of
read_uncommitted.

With --pin the services run on the last CPU and the client on the others, as
if on separate machines (Kafka's published figures come from such a setup);
by default all share every CPU.

With --producers N each case runs N producer processes at once (each its
own transactional id, all writing every partition), as a store serves many
producers in production: one producer's commit is then the others' time to
write, so the ratio shows what transactions cost the store rather than what
one producer waits. The read-back reads what all of them wrote.

Client and servers share the machine, so one run of a case swings by several
per cent with whatever else runs. The cases therefore run in `--rounds`
rounds (baseline, then each interval, each on a fresh cluster), and the
summary gives each case's median rate and the median of its per-round ratio
to the baseline measured next to it.

    .venv/bin/python bench/transactions.py               # 3 rounds of 10 s per case
    .venv/bin/python bench/transactions.py --duration-s 5 --value-bytes 1024 --intervals-ms 100
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

from oncelog import Admin, Consumer, Producer, TopicPartition
from oncelog.testing import LocalCluster, wait_for_markers

PARTITIONS = 4
# With several producer processes: how long before the common start time
# they are started (a process takes about a second to import and connect).
CHILD_START_S = 3.0


@dataclass
class Row:
    case: str
    value_bytes: int
    records: int
    seconds: float
    records_per_s: float
    ratio_to_baseline: float | None = None
    round: int = 0
    # Producer cases that commit or flush: the median time one such call
    # blocked the application thread, and the share of the run spent in them.
    blocked_ms: float | None = None
    blocked_share: float | None = None
    # Summary rows: the lowest and highest per-round ratio (how far one
    # round can be trusted on this machine).
    ratio_range: tuple[float, float] | None = None


@dataclass(frozen=True)
class Case:
    """What a producer case does every `interval_ms` of sending: nothing
    (the baseline, interval None), commit ("transactional") or flush()."""

    kind: str
    interval_ms: int | None = None

    @property
    def name(self) -> str:
        if self.interval_ms is None:
            return "idempotent"
        if self.kind == "flush":
            return f"idempotent, flush every {self.interval_ms} ms"
        return f"transactional, commit every {self.interval_ms} ms"


BASELINE = Case("idempotent")


@dataclass
class Produced:
    records: int
    seconds: float
    # How long each commit_transaction() / flush() at the interval took.
    blocked_s: list[float]


def produce(bootstrap: str, topic: str, *, value_bytes: int, duration_s: float,
            case: Case, batch_size: int, producer_index: int = 0) -> Produced:
    value = b"v" * value_bytes
    sent = 0
    blocked_s: list[float] = []
    tid = f"bench-{topic}-{producer_index}" if case.kind == "transactional" else None
    with Producer(bootstrap=bootstrap, transactional_id=tid, linger_ms=5,
                  batch_size=batch_size) as producer:
        if tid:
            producer.init_transactions()
        started = time.perf_counter()
        deadline = started + duration_s
        while time.perf_counter() < deadline:
            if tid:
                producer.begin_transaction()
            window_end = time.perf_counter() + (case.interval_ms or 1000) / 1000
            while time.perf_counter() < min(window_end, deadline):
                for _ in range(200):
                    producer.send(topic, value=value, partition=sent % PARTITIONS)
                    sent += 1
            if tid or case.kind == "flush":
                call_started = time.perf_counter()
                if tid:
                    producer.commit_transaction()
                else:
                    producer.flush()
                blocked_s.append(time.perf_counter() - call_started)
        producer.flush()
        elapsed = time.perf_counter() - started
    return Produced(sent, elapsed, blocked_s)


def _produce_in_child(start_at_s: float, kwargs: dict[str, Any]) -> Produced:
    """One of several producer processes: waits for the common start time
    (each process needs a moment to import and connect) and produces."""
    time.sleep(max(0.0, start_at_s - time.time()))
    return produce(**kwargs)


def produce_together(producers: int, bootstrap: str, topic: str, *, value_bytes: int,
                     duration_s: float, case: Case, batch_size: int) -> Produced:
    """produce() in this process (one producer), or in `producers` processes
    started together; their records add up, and the slowest one's time
    counts. Processes, not threads: each producer needs a GIL of its own."""
    if producers == 1:
        return produce(bootstrap, topic, value_bytes=value_bytes, duration_s=duration_s,
                       case=case, batch_size=batch_size)
    # spawn, not fork: the parent has gRPC threads, which fork would copy broken.
    context = multiprocessing.get_context("spawn")
    start_at_s = time.time() + CHILD_START_S
    with context.Pool(producers) as pool:
        results = pool.starmap(_produce_in_child, [
            (start_at_s, {"bootstrap": bootstrap, "topic": topic, "value_bytes": value_bytes,
                          "duration_s": duration_s, "case": case, "batch_size": batch_size,
                          "producer_index": index})
            for index in range(producers)
        ])
    return Produced(sum(r.records for r in results), max(r.seconds for r in results),
                    [b for r in results for b in r.blocked_s])


def consume(bootstrap: str, topic: str, isolation_level: str) -> tuple[int, float]:
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    count = 0
    if isolation_level == "read_committed":
        # Otherwise the last stable offset may stop short of the last
        # transactions, whose markers follow their commit.
        wait_for_markers(bootstrap)
    with Consumer(bootstrap=bootstrap, isolation_level=isolation_level,
                  max_poll_records=10_000) as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning(tps)
        ends = consumer.end_offsets(tps)
        started = time.perf_counter()
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            count += len(consumer.poll(timeout=1.0))
        elapsed = time.perf_counter() - started
    return count, elapsed


def run_case(value_bytes: int, case: Case, args: argparse.Namespace,
             read_back: bool, read_order: tuple[str, str] = ("read_uncommitted",
                                                             "read_committed"),
             ) -> tuple[float, list[Row]]:
    """One producer case on a fresh cluster (a store that already holds the
    previous case's gigabyte writes measurably slower, which would favour
    whichever case runs first); returns its rate and the rows of the
    read-back (both isolation levels, in `read_order`), when asked."""
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as data_dir, \
            LocalCluster(data_dir, partition_stores=args.stores,
                         group_coordinators=0) as cluster:
        if args.pin:
            pin_services(cluster)
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic("bench", partitions=PARTITIONS,
                               config={"max.message.bytes": str(8 << 20)})
        produced = produce_together(args.producers, cluster.bootstrap, "bench",
                                    value_bytes=value_bytes, duration_s=args.duration_s,
                                    case=case, batch_size=args.batch_size)
        sent, secs = produced.records, produced.seconds
        row = Row(case.name, value_bytes, sent, round(secs, 1), round(sent / secs))
        if produced.blocked_s:
            row.blocked_ms = round(statistics.median(produced.blocked_s) * 1000, 1)
            # Each producer's own share of the run, averaged over the producers.
            row.blocked_share = round(sum(produced.blocked_s) / secs / args.producers, 3)
        rows.append(row)
        interval_ms = case.interval_ms
        if read_back:
            # The first read of the topic warms the caches for the second:
            # the order alternates between rounds (read_committed first in
            # odd rounds), and the summary takes medians.
            measured: dict[str, tuple[int, float]] = {}
            for level in read_order:
                measured[level] = consume(cluster.bootstrap, "bench", level)
            n_u, s_u = measured["read_uncommitted"]
            n_c, s_c = measured["read_committed"]
            rows.append(Row(consume_case(interval_ms, "read_uncommitted"),
                            value_bytes, n_u, round(s_u, 1), round(n_u / s_u)))
            rows.append(Row(consume_case(interval_ms, "read_committed"),
                            value_bytes, n_c, round(s_c, 1), round(n_c / s_c),
                            round((n_c / s_c) / (n_u / s_u), 3)))
    return sent / secs, rows


def pin_services(cluster: LocalCluster) -> None:
    """Every thread of every service process onto the last CPU (the client
    runs on the others): client and servers as on separate machines."""
    cpus = sorted(os.sched_getaffinity(0))
    for procs in cluster.processes.values():
        for proc in procs:
            pid = proc.pid
            if pid is None:
                continue
            for tid in os.listdir(f"/proc/{pid}/task"):
                os.sched_setaffinity(int(tid), {cpus[-1]})


def spread(ratios: list[float]) -> tuple[float, float] | None:
    return (round(min(ratios), 3), round(max(ratios), 3)) if ratios else None


def consume_case(interval_ms: int | None, level: str) -> str:
    return f"consume (commit every {interval_ms} ms) {level}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--value-bytes", type=int, action="append")
    parser.add_argument("--intervals-ms", default="10,100,1000")
    parser.add_argument("--batch-size", type=int, default=512 * 1024)
    parser.add_argument("--stores", type=int, default=1,
                        help="partition store processes (the topic's partitions spread over them)")
    parser.add_argument("--flush-control", action="store_true",
                        help="also run the idempotent producer flushing at the reference interval")
    parser.add_argument("--producers", type=int, default=1,
                        help="producer processes per case, writing at the same time")
    parser.add_argument("--pin", action="store_true",
                        help="run the services on the last CPU and the client on the others")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.producers < 1:
        parser.error(f"--producers is {args.producers}; it must be >= 1")
    if args.pin:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, set(cpus[:-1]))
    intervals = [int(x) for x in args.intervals_ms.split(",")]
    # Read back the 100 ms case (the reference point), or the first one.
    read_back_ms = 100 if 100 in intervals else intervals[0]
    cases = [BASELINE, *(Case("transactional", ms) for ms in intervals)]
    if args.flush_control:
        cases.append(Case("flush", read_back_ms))
    rows: list[Row] = []
    summary: list[Row] = []
    for value_bytes in args.value_bytes or [100, 1024]:
        rates: dict[Case, list[float]] = {}
        ratios: dict[Case, list[float]] = {}
        for round_no in range(1, args.rounds + 1):
            base = 0.0
            for case in cases:
                read_back = case == Case("transactional", read_back_ms)
                order = ("read_committed", "read_uncommitted") if round_no % 2 else (
                    "read_uncommitted", "read_committed")
                rate, case_rows = run_case(value_bytes, case, args, read_back=read_back,
                                           read_order=order)
                rates.setdefault(case, []).append(rate)
                if case == BASELINE:
                    base = rate
                else:
                    ratios.setdefault(case, []).append(rate / base)
                    case_rows[0].ratio_to_baseline = round(rate / base, 3)
                for row in case_rows:
                    row.round = round_no
                    print(row, flush=True)
                rows.extend(case_rows)
        for case in cases:
            mine = [r for r in rows if r.case == case.name and r.value_bytes == value_bytes]
            blocked_ms = [r.blocked_ms for r in mine if r.blocked_ms is not None]
            shares = [r.blocked_share for r in mine if r.blocked_share is not None]
            summary.append(Row(case.name, value_bytes, 0, args.duration_s,
                               round(statistics.median(rates[case])),
                               round(statistics.median(ratios[case]), 3)
                               if case != BASELINE else None,
                               blocked_ms=statistics.median(blocked_ms) if blocked_ms else None,
                               blocked_share=statistics.median(shares) if shares else None,
                               ratio_range=spread(ratios.get(case, []))))
        for level in ("read_uncommitted", "read_committed"):
            name = consume_case(read_back_ms, level)
            mine = [r for r in rows if r.case == name and r.value_bytes == value_bytes]
            read_ratios = [r.ratio_to_baseline for r in mine if r.ratio_to_baseline is not None]
            summary.append(Row(name, value_bytes, 0, 0.0,
                               round(statistics.median(r.records_per_s for r in mine)),
                               round(statistics.median(read_ratios), 3) if read_ratios else None,
                               ratio_range=spread(read_ratios)))
    print()
    print(f"median of {args.rounds} round(s), {args.duration_s:g} s per case, "
          f"{args.producers} producer process(es) at once")
    print("blocked: the median commit_transaction() (or flush()) call, and the share of")
    print("the run the application thread spent in those calls")
    print("rounds: the lowest and highest per-round ratio")
    print(f"{'case':48} {'value':>6} {'records/s':>11} {'ratio':>6} {'rounds':>12} "
          f"{'blocked':>10} {'share':>6}")
    for r in summary:
        ratio = f"{r.ratio_to_baseline:.3f}" if r.ratio_to_baseline is not None else ""
        lo_hi = f"{r.ratio_range[0]:.2f}-{r.ratio_range[1]:.2f}" if r.ratio_range else ""
        blocked = f"{r.blocked_ms:.1f} ms" if r.blocked_ms is not None else ""
        share = f"{r.blocked_share:.1%}" if r.blocked_share is not None else ""
        print(f"{r.case:48} {r.value_bytes:>6} {r.records_per_s:>11,.0f} {ratio:>6} "
              f"{lo_hi:>12} {blocked:>10} {share:>6}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rounds": [asdict(r) for r in rows],
                       "summary": [asdict(r) for r in summary]}, f, indent=2)


if __name__ == "__main__":
    main()
