"""Transactional produce and read_committed consume throughput.

Starts a LocalCluster (one partition store, one coordinator) and measures, for
100 B and 1 KiB values into a 4-partition topic:

* the idempotent producer (the baseline),
* a transactional producer committing every 10 ms, 100 ms and 1 s,

then reads the whole topic back with read_uncommitted and read_committed
consumers. Prints records/s and each case's ratio to its baseline. The issue's
targets: with 1 KiB records and a 100 ms commit interval, the transactional
producer keeps >= 97 % of the idempotent throughput; read_committed reads at
>= 95 % of read_uncommitted.

    .venv/bin/python bench/transactions.py               # 20 s per case
    .venv/bin/python bench/transactions.py --duration-s 5 --value-bytes 1024
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict, dataclass

from oncelog import Admin, Consumer, Producer, TopicPartition
from oncelog.testing import LocalCluster

PARTITIONS = 4


@dataclass
class Row:
    case: str
    value_bytes: int
    records: int
    seconds: float
    records_per_s: float
    ratio_to_baseline: float | None = None


def produce(bootstrap: str, topic: str, *, value_bytes: int, duration_s: float,
            commit_interval_ms: int | None, batch_size: int) -> tuple[int, float]:
    value = b"v" * value_bytes
    sent = 0
    tid = None if commit_interval_ms is None else f"bench-{topic}"
    with Producer(bootstrap=bootstrap, transactional_id=tid, linger_ms=5,
                  batch_size=batch_size) as producer:
        if tid:
            producer.init_transactions()
        started = time.perf_counter()
        deadline = started + duration_s
        while time.perf_counter() < deadline:
            if tid:
                producer.begin_transaction()
            window_end = time.perf_counter() + (commit_interval_ms or 1000) / 1000
            while time.perf_counter() < min(window_end, deadline):
                for _ in range(200):
                    producer.send(topic, value=value, partition=sent % PARTITIONS)
                    sent += 1
            if tid:
                producer.commit_transaction()
        producer.flush()
        elapsed = time.perf_counter() - started
    return sent, elapsed


def consume(bootstrap: str, topic: str, isolation_level: str) -> tuple[int, float]:
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    count = 0
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--value-bytes", type=int, action="append")
    parser.add_argument("--intervals-ms", default="10,100,1000")
    parser.add_argument("--batch-size", type=int, default=512 * 1024)
    parser.add_argument("--json")
    args = parser.parse_args()
    rows: list[Row] = []
    for value_bytes in args.value_bytes or [100, 1024]:
        intervals = [int(x) for x in args.intervals_ms.split(",")]
        # Each producer case gets a fresh cluster: a store that already holds
        # the previous case's gigabyte writes measurably slower, which would
        # favour whichever case runs first.
        base = 0.0
        for ms in [None, *intervals]:
            with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as data_dir, \
                    LocalCluster(data_dir, group_coordinators=0) as cluster:
                with Admin(bootstrap=cluster.bootstrap) as admin:
                    admin.create_topic("bench", partitions=PARTITIONS,
                                       config={"max.message.bytes": str(8 << 20)})
                sent, secs = produce(cluster.bootstrap, "bench", value_bytes=value_bytes,
                                     duration_s=args.duration_s, commit_interval_ms=ms,
                                     batch_size=args.batch_size)
                rate = sent / secs
                if ms is None:
                    base = rate
                    rows.append(Row("idempotent", value_bytes, sent, round(secs, 1), round(rate)))
                else:
                    rows.append(Row(f"transactional, commit every {ms} ms", value_bytes, sent,
                                    round(secs, 1), round(rate), round(rate / base, 3)))
                print(rows[-1], flush=True)
                # Read back the 100 ms case (the reference point), or the
                # first transactional one, with both isolation levels.
                if ms == (100 if 100 in intervals else intervals[0]):
                    n_u, s_u = consume(cluster.bootstrap, "bench", "read_uncommitted")
                    rows.append(Row(f"consume (commit every {ms} ms) read_uncommitted",
                                    value_bytes, n_u, round(s_u, 1), round(n_u / s_u)))
                    print(rows[-1], flush=True)
                    n_c, s_c = consume(cluster.bootstrap, "bench", "read_committed")
                    rows.append(Row(f"consume (commit every {ms} ms) read_committed",
                                    value_bytes, n_c, round(s_c, 1), round(n_c / s_c),
                                    round((n_c / s_c) / (n_u / s_u), 3)))
                    print(rows[-1], flush=True)
    print()
    print(f"{'case':48} {'value':>6} {'records/s':>11} {'ratio':>6}")
    for r in rows:
        ratio = f"{r.ratio_to_baseline:.3f}" if r.ratio_to_baseline is not None else ""
        print(f"{r.case:48} {r.value_bytes:>6} {r.records_per_s:>11,.0f} {ratio:>6}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=2)


if __name__ == "__main__":
    main()
