"""The quick-start demo: a local oncelog cluster and an idempotent pipeline on it.

1. Starts a LocalCluster (partition store and coordinator, each its own process).
2. Creates the topic `payments` and produces payment events with the
   idempotent producer, while a chaos step SIGKILLs the partition store in the
   middle of the stream and restarts it.
3. Reads `payments` back and checks that every acknowledged payment is there
   exactly once, in order per account, and prints a summary.

Exits non-zero if any payment is missing or duplicated.

    bash scripts/demo.sh [--payments N] [--no-chaos] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import Future
from pathlib import Path

from oncelog import Admin, Consumer, Producer, RecordMetadata, TopicPartition
from oncelog.testing import LocalCluster

TOPIC = "payments"
PARTITIONS = 3
ACCOUNTS = 50


def payment(i: int) -> tuple[bytes, bytes]:
    account = f"acct-{i % ACCOUNTS}"
    body = {"id": i, "from": account, "to": f"acct-{(i * 7 + 3) % ACCOUNTS}",
            "amount_cents": 100 + (i * 37) % 9900}
    return account.encode(), json.dumps(body).encode()


def run(args: argparse.Namespace, data_dir: Path) -> int:
    print(f"starting a local cluster in {data_dir} ...", flush=True)
    with LocalCluster(data_dir, group_coordinators=0) as cluster:
        print(f"  bootstrap {cluster.bootstrap}", flush=True)
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=PARTITIONS)

        faults = 0
        kill_at = args.payments // 2

        def chaos() -> None:
            nonlocal faults
            print("  chaos: kill -9 of the partition store", flush=True)
            cluster.kill("partition_store", 0)
            time.sleep(0.5)
            cluster.restart("partition_store", 0)
            faults += 1
            print("  chaos: partition store restarted", flush=True)

        started = time.monotonic()
        futures: list[Future[RecordMetadata]] = []
        chaos_thread: threading.Thread | None = None
        with Producer(bootstrap=cluster.bootstrap, linger_ms=5, batch_size=64 * 1024) as producer:
            for i in range(args.payments):
                key, value = payment(i)
                futures.append(producer.send(TOPIC, key=key, value=value))
                if i == kill_at and not args.no_chaos:
                    chaos_thread = threading.Thread(target=chaos)
                    chaos_thread.start()
                if i and i % max(1, args.payments // 10) == 0:
                    print(f"  sent {i:,} payments", flush=True)
            producer.flush()
            acked = [f.result() for f in futures]
        if chaos_thread is not None:
            chaos_thread.join()
        produce_s = time.monotonic() - started

        print("reading payments back ...", flush=True)
        tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        seen: Counter[int] = Counter()
        last_id_per_account: dict[str, int] = {}
        out_of_order = 0
        with Consumer(bootstrap=cluster.bootstrap) as consumer:
            consumer.assign(tps)
            consumer.seek_to_beginning(tps)
            ends = consumer.end_offsets(tps)
            while any(consumer.position(tp) < ends[tp] for tp in tps):
                for record in consumer.poll(timeout=1.0):
                    assert record.value is not None
                    body = json.loads(record.value)
                    seen[body["id"]] += 1
                    if last_id_per_account.get(body["from"], -1) > body["id"]:
                        out_of_order += 1
                    last_id_per_account[body["from"]] = body["id"]
        elapsed_s = time.monotonic() - started

    duplicates = sum(n - 1 for n in seen.values() if n > 1)
    missing = sum(1 for i in range(args.payments) if seen[i] == 0)
    rows = [
        ("payments sent and acknowledged", f"{len(acked):,}"),
        ("payments read back", f"{sum(seen.values()):,}"),
        ("duplicates", f"{duplicates}"),
        ("missing", f"{missing}"),
        ("out of order within an account", f"{out_of_order}"),
        ("faults injected (kill -9)", f"{faults}"),
        ("produce throughput", f"{args.payments / produce_s:,.0f} records/s"),
        ("elapsed", f"{elapsed_s:.1f} s"),
    ]
    width = max(len(r[0]) for r in rows)
    print()
    for label, shown in rows:
        print(f"  {label:<{width}}  {shown}")
    ok = duplicates == 0 and missing == 0 and out_of_order == 0
    print("\nexactly once: " + ("OK" if ok else "VIOLATED"))
    return 0 if ok else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--payments", type=int, default=50_000)
    parser.add_argument("--no-chaos", action="store_true")
    parser.add_argument("--data-dir", type=Path)
    args = parser.parse_args()
    if args.data_dir:
        sys.exit(run(args, args.data_dir))
    with tempfile.TemporaryDirectory(prefix="oncelog-demo-") as tmp:
        sys.exit(run(args, Path(tmp)))


if __name__ == "__main__":
    main()
