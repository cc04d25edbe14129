"""Read-process-write pipeline throughput, exactly once against at least once,
and what one small transaction costs in latency.

What users run on oncelog is a pipeline that reads a topic, transforms each
record and writes the result to another topic. This measures that loop with
the SDK, one pipeline process against one LocalCluster (one partition store,
one transaction coordinator, one group coordinator; each its own process,
or both in the store's with --coordinators-in-stores):

* `copy, exactly once`: a consumer in a group (read_committed) and a
  transactional producer; every `--commit-interval-ms` the loop sends the
  consumer's positions with `send_offsets_to_transaction` and commits, as
  examples/copier.py does.
* `copy, at least once`: the same loop with the idempotent producer, which
  at the interval calls `flush()` and then `Consumer.commit()`: the pipeline
  built without transactions (a crash between the two duplicates output).

The input (`--records` records of `--value-bytes` into a 4-partition topic)
is written before the clock starts. The clock runs from the first record the
consumer returns until the last transaction (or offset commit) that covers
the whole input has returned. Then the output is read back under
read_committed and checked: every input record exactly once, on the
partition it came from, or the run fails.

* `latency`: back-to-back one-record transactions (begin, send, commit)
  against acknowledged sends of the idempotent producer (`send().result()`),
  `--latency-samples` each: median and p99, and the ratio of the medians;
  and the medians of a transaction's two halves, its send until
  acknowledged and its commit_transaction().

Each case runs on a fresh cluster, `--rounds` times in alternating order;
the summary gives medians.

    .venv/bin/python bench/pipeline.py                      # 3 rounds, 100 B, commit every 100 ms
    .venv/bin/python bench/pipeline.py --rounds 1 --records 200000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from oncelog import Admin, Consumer, Producer, TopicPartition
from oncelog.testing import LocalCluster, wait_for_markers

PARTITIONS = 4
INPUT, OUTPUT = "pipeline-in", "pipeline-out"
# The number at the start of each input value, so the check can tell every
# record apart whatever --value-bytes is.
ID_BYTES = 8
EXACTLY_ONCE, AT_LEAST_ONCE = "copy, exactly once", "copy, at least once"


@dataclass
class CopyRun:
    case: str
    records: int
    seconds: float
    records_per_s: float
    commits: int
    # The median time one commit at the interval blocked the loop (for the
    # exactly-once case: send_offsets_to_transaction + commit_transaction;
    # else flush + Consumer.commit), and the share of the run spent so.
    commit_ms: float
    commit_share: float
    round: int = 0


@dataclass
class LatencyRun:
    transaction_p50_ms: float
    transaction_p99_ms: float
    send_p50_ms: float
    send_p99_ms: float
    ratio: float
    # A transaction's two halves: its send until acknowledged (the store
    # asks the coordinator to add the partition first), then
    # commit_transaction() (EndTxn, which answers once Prepare* is durable).
    first_send_p50_ms: float = 0.0
    commit_p50_ms: float = 0.0
    round: int = 0


@dataclass
class Summary:
    copy: dict[str, float] = field(default_factory=dict)
    exactly_once_over_at_least_once: float = 0.0
    latency: dict[str, float] = field(default_factory=dict)


def value_of(record_id: int, value_bytes: int) -> bytes:
    return record_id.to_bytes(ID_BYTES, "big").ljust(value_bytes, b"v")


def fill_input(bootstrap: str, records: int, value_bytes: int) -> None:
    """Writes the input: record i on partition i mod 4, so the check knows
    where each belongs."""
    with Producer(bootstrap=bootstrap, linger_ms=5, batch_size=512 * 1024) as producer:
        for i in range(records):
            producer.send(INPUT, value=value_of(i, value_bytes), partition=i % PARTITIONS)
        producer.flush()


def copy(bootstrap: str, *, exactly_once: bool, records: int, commit_interval_ms: int,
         max_poll_records: int, by_column: bool = False) -> CopyRun:
    """The pipeline loop until the whole input is copied and committed.
    `by_column`: the records are read with poll_columns() and written with
    one send_many() per partition, instead of poll() and send() each."""
    interval_s = commit_interval_ms / 1000
    tid = "bench-pipeline" if exactly_once else None
    with Consumer(bootstrap=bootstrap, group_id="bench-pipeline",
                  isolation_level="read_committed", auto_offset_reset="earliest",
                  max_poll_records=max_poll_records) as consumer, \
            Producer(bootstrap=bootstrap, transactional_id=tid, linger_ms=5,
                     batch_size=512 * 1024) as producer:
        if exactly_once:
            producer.init_transactions()
        consumer.subscribe([INPUT])
        copied = commits = 0
        commit_s: list[float] = []
        started = 0.0
        in_txn = False
        window_start = time.perf_counter()
        while True:
            if by_column:
                parts = consumer.poll_columns(timeout=0.5)
                read = sum(len(part) for part in parts)
            else:
                batch = consumer.poll(timeout=0.5)
                read = len(batch)
            if read and not started:
                started = window_start = time.perf_counter()
            if read and exactly_once and not in_txn:
                producer.begin_transaction()
                in_txn = True
            # The transform is the identity: what is measured is the
            # pipeline, not the application's work.
            if by_column:
                for part in parts:
                    producer.send_many(OUTPUT, part.values, keys=part.keys,
                                       partition=part.partition)
            else:
                for r in batch:
                    producer.send(OUTPUT, value=r.value, key=r.key, partition=r.partition)
            copied += read
            done = copied >= records
            if not done and time.perf_counter() - window_start < interval_s:
                continue
            if not started or (exactly_once and not in_txn):
                continue  # nothing read since the last commit (or still joining)
            call_started = time.perf_counter()
            offsets = {tp: consumer.position(tp) for tp in consumer.assignment()}
            if exactly_once:
                producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
                producer.commit_transaction()
                in_txn = False
            else:
                producer.flush()
                consumer.commit(offsets)
            commit_s.append(time.perf_counter() - call_started)
            commits += 1
            window_start = time.perf_counter()
            if done:
                break
        elapsed = time.perf_counter() - started
    case = EXACTLY_ONCE if exactly_once else AT_LEAST_ONCE
    return CopyRun(case, copied, round(elapsed, 2), round(copied / elapsed), commits,
                   round(statistics.median(commit_s) * 1000, 1),
                   round(sum(commit_s) / elapsed, 3))


def check_output(bootstrap: str, records: int) -> None:
    """Every input record exactly once in the output, on its partition."""
    seen = bytearray(records)
    tps = [TopicPartition(OUTPUT, p) for p in range(PARTITIONS)]
    # The last commit_transaction() returned when the commit was decided; its
    # markers may still be on their way, and until they land the last stable
    # offset (read_committed's end) stops short of the last transaction.
    wait_for_markers(bootstrap)
    with Consumer(bootstrap=bootstrap, isolation_level="read_committed",
                  max_poll_records=10_000) as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning(tps)
        ends = consumer.end_offsets(tps)
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for r in consumer.poll(timeout=1.0):
                record_id = int.from_bytes((r.value or b"")[:ID_BYTES], "big")
                if record_id >= records or r.partition != record_id % PARTITIONS:
                    raise SystemExit(f"output record {record_id} on partition "
                                     f"{r.partition} is not an input record of that partition")
                if seen[record_id]:
                    raise SystemExit(f"input record {record_id} is in the output twice")
                seen[record_id] = 1
    missing = records - sum(seen)
    if missing:
        raise SystemExit(f"{missing} input records are not in the output")


def run_copy(args: argparse.Namespace, exactly_once: bool) -> CopyRun:
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as data_dir, \
            LocalCluster(data_dir, coordinators_in_stores=args.coordinators_in_stores) as cluster:
        with Admin(bootstrap=cluster.bootstrap) as admin:
            for topic in (INPUT, OUTPUT):
                admin.create_topic(topic, partitions=PARTITIONS,
                                   config={"max.message.bytes": str(8 << 20)})
        fill_input(cluster.bootstrap, args.records, args.value_bytes)
        run = copy(cluster.bootstrap, exactly_once=exactly_once, records=args.records,
                   commit_interval_ms=args.commit_interval_ms,
                   max_poll_records=args.max_poll_records,
                   by_column=getattr(args, "by_column", False))
        check_output(cluster.bootstrap, args.records)
    return run


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def run_latency(args: argparse.Namespace) -> LatencyRun:
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as data_dir, \
            LocalCluster(data_dir, group_coordinators=0,
                         coordinators_in_stores=args.coordinators_in_stores) as cluster:
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic(OUTPUT, partitions=PARTITIONS)
        return measure_latency(cluster.bootstrap, latency_samples=args.latency_samples,
                               value_bytes=args.value_bytes)


# The one-record transactions' id (a secured run grants Write on it).
LATENCY_TRANSACTIONAL_ID = "bench-latency"


def measure_latency(bootstrap: str, *, latency_samples: int, value_bytes: int,
                    producer_options: Mapping[str, Any] | None = None) -> LatencyRun:
    """The latency case against a running cluster whose OUTPUT topic (4
    partitions) exists: `latency_samples` one-record transactions, then as
    many acknowledged sends, after 20 of each to warm up."""
    warm_up = 20
    value = value_of(0, value_bytes)
    txn_s: list[float] = []
    first_send_s: list[float] = []
    commit_s: list[float] = []
    with Producer(bootstrap=bootstrap, transactional_id=LATENCY_TRANSACTIONAL_ID,
                  linger_ms=0, **(producer_options or {})) as producer:
        producer.init_transactions()
        for i in range(warm_up + latency_samples):
            t0 = time.perf_counter()
            producer.begin_transaction()
            # Waiting for the send's answer here costs the transaction
            # nothing: commit_transaction() would wait for it anyway.
            producer.send(OUTPUT, value=value, partition=i % PARTITIONS).result()
            t1 = time.perf_counter()
            producer.commit_transaction()
            t2 = time.perf_counter()
            if i >= warm_up:
                txn_s.append(t2 - t0)
                first_send_s.append(t1 - t0)
                commit_s.append(t2 - t1)
    send_s: list[float] = []
    with Producer(bootstrap=bootstrap, linger_ms=0, **(producer_options or {})) as producer:
        for i in range(warm_up + latency_samples):
            t0 = time.perf_counter()
            producer.send(OUTPUT, value=value, partition=i % PARTITIONS).result()
            if i >= warm_up:
                send_s.append(time.perf_counter() - t0)
    txn_p50, send_p50 = statistics.median(txn_s), statistics.median(send_s)
    return LatencyRun(round(txn_p50 * 1000, 2), round(percentile(txn_s, 0.99) * 1000, 2),
                      round(send_p50 * 1000, 2), round(percentile(send_s, 0.99) * 1000, 2),
                      round(txn_p50 / send_p50, 2),
                      first_send_p50_ms=round(statistics.median(first_send_s) * 1000, 2),
                      commit_p50_ms=round(statistics.median(commit_s) * 1000, 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--commit-interval-ms", type=int, default=100)
    parser.add_argument("--max-poll-records", type=int, default=500)
    parser.add_argument("--latency-samples", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--coordinators-in-stores", action="store_true",
                        help="run the transaction and group coordinators in the store's "
                             "process")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.value_bytes < ID_BYTES:
        parser.error(f"--value-bytes is {args.value_bytes}; it must be >= {ID_BYTES}")
    copies: list[CopyRun] = []
    latencies: list[LatencyRun] = []
    for round_no in range(1, args.rounds + 1):
        # Alternate which copy case runs first, so neither always gets the
        # machine in the state the other left it.
        for exactly_once in ((True, False) if round_no % 2 else (False, True)):
            run = run_copy(args, exactly_once)
            run.round = round_no
            copies.append(run)
            print(run, flush=True)
        latency = run_latency(args)
        latency.round = round_no
        latencies.append(latency)
        print(latency, flush=True)
    summary = Summary()
    for case in (EXACTLY_ONCE, AT_LEAST_ONCE):
        summary.copy[case] = statistics.median(r.records_per_s for r in copies if r.case == case)
    ratios = [e.records_per_s / a.records_per_s
              for e in copies if e.case == EXACTLY_ONCE
              for a in copies if a.case == AT_LEAST_ONCE and a.round == e.round]
    summary.exactly_once_over_at_least_once = round(statistics.median(ratios), 3)
    for name in ("transaction_p50_ms", "transaction_p99_ms", "send_p50_ms", "send_p99_ms",
                 "ratio", "first_send_p50_ms", "commit_p50_ms"):
        summary.latency[name] = statistics.median(getattr(r, name) for r in latencies)
    print()
    print(f"median of {args.rounds} round(s): {args.records:,} records of "
          f"{args.value_bytes} B, a commit every {args.commit_interval_ms} ms, "
          f"every output checked exactly once")
    for case in (EXACTLY_ONCE, AT_LEAST_ONCE):
        mine = [r for r in copies if r.case == case]
        print(f"{case:22} {summary.copy[case]:>10,.0f} records/s   commit "
              f"{statistics.median(r.commit_ms for r in mine):.1f} ms, "
              f"{statistics.median(r.commit_share for r in mine):.0%} of the run")
    print(f"exactly once / at least once: {summary.exactly_once_over_at_least_once:.3f} "
          f"(rounds {min(ratios):.2f}-{max(ratios):.2f})")
    lat = summary.latency
    print(f"one-record transaction: p50 {lat['transaction_p50_ms']:.2f} ms, "
          f"p99 {lat['transaction_p99_ms']:.2f} ms; acknowledged send: p50 "
          f"{lat['send_p50_ms']:.2f} ms, p99 {lat['send_p99_ms']:.2f} ms; "
          f"ratio of medians {lat['ratio']:.2f}")
    print(f"  of which the transaction's send until acknowledged: p50 "
          f"{lat['first_send_p50_ms']:.2f} ms; commit_transaction(): p50 "
          f"{lat['commit_p50_ms']:.2f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"copies": [asdict(r) for r in copies],
                       "latencies": [asdict(r) for r in latencies],
                       "summary": asdict(summary)}, f, indent=2)


if __name__ == "__main__":
    main()
