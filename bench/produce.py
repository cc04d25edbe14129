"""Produce throughput and acknowledgement latency of the idempotent producer.

Starts a LocalCluster (one partition store, one coordinator; each its own
process), creates a topic, and drives it for --duration-s seconds with:

* `sdk`: oncelog.Producer in this process (idempotent, the default), and
* `raw`: for reference, a second process on loopback that sends pre-encoded
  idempotent batches straight through gRPC with 5 in flight per partition,
  which shows what the store takes when the client costs next to nothing.

Prints records/s, MB/s and p50/p99 acknowledgement latency (send to future
done, sampled every 64th record) for each case of the matrix:
value size (100 B, 1 KiB) x partitions (1, 4) x fsync (off, per group commit).

    .venv/bin/python bench/produce.py                 # the full matrix, 30 s each
    .venv/bin/python bench/produce.py --quick         # 5 s each, 100 B only
    .venv/bin/python bench/produce.py --value-bytes 100 --partitions 1 --no-fsync-cases
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from typing import Any

import grpc

from oncelog import Admin, Producer, RecordMetadata
from oncelog import records as rec
from oncelog.errors import ErrorCode
from oncelog.testing import LocalCluster
from oncelog.v1 import coordinator_pb2 as co
from oncelog.v1 import coordinator_pb2_grpc as co_grpc
from oncelog.v1 import partition_store_pb2 as ps
from oncelog.v1 import partition_store_pb2_grpc as ps_grpc

LATENCY_SAMPLE_EVERY = 64


@dataclass
class Result:
    client: str
    value_bytes: int
    partitions: int
    fsync: bool
    duration_s: float
    records: int
    records_per_s: float
    mb_per_s: float
    ack_latency_ms_p50: float
    ack_latency_ms_p99: float


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_sdk(bootstrap: str, topic: str, *, value_bytes: int, partitions: int,
            duration_s: float, batch_size: int, linger_ms: int,
            producer_options: Mapping[str, Any] | None = None) -> tuple[int, list[float]]:
    """`producer_options`: more Producer keywords (a secured cluster's)."""
    value = b"v" * value_bytes
    latencies_ms: list[float] = []
    lock = threading.Lock()

    def sampled(started: float) -> object:
        def done(_f: Future[RecordMetadata]) -> None:
            with lock:
                latencies_ms.append((time.perf_counter() - started) * 1000)
        return done

    sent = 0
    with Producer(bootstrap=bootstrap, linger_ms=linger_ms, batch_size=batch_size,
                  **(producer_options or {})) as producer:
        deadline = time.perf_counter() + duration_s
        while time.perf_counter() < deadline:
            for _ in range(1000):
                fut = producer.send(topic, value=value, partition=sent % partitions)
                if sent % LATENCY_SAMPLE_EVERY == 0:
                    fut.add_done_callback(sampled(time.perf_counter()))  # type: ignore[arg-type]
                sent += 1
        producer.flush()
    return sent, latencies_ms


def init_producer_id(store: ps_grpc.PartitionStoreStub) -> int:
    """A producer id from the cluster's transaction coordinator, asked as
    the SDK asks it (InitProducerId without a transactional id)."""
    meta = store.Metadata(ps.MetadataRequest())
    coord = co_grpc.TransactionCoordinatorStub(grpc.insecure_channel(meta.coordinators[0].address))
    # The coordinator answers UNAVAILABLE while it cannot reach the store yet.
    for _ in range(100):
        try:
            producer_id: int = coord.InitProducerId(co.InitProducerIdRequest(),
                                                    timeout=10).producer_id
            return producer_id
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            time.sleep(0.1)
    raise RuntimeError("no producer id from the coordinator")


def run_raw(bootstrap: str, topic: str, *, value_bytes: int, partitions: int,
            duration_s: float, records_per_batch: int) -> tuple[int, list[float]]:
    """Pre-encoded idempotent batches, 5 in flight per partition, no SDK."""
    channel = grpc.insecure_channel(bootstrap, options=[
        ("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20)])
    store = ps_grpc.PartitionStoreStub(channel)
    producer_id = init_producer_id(store)
    value = b"v" * value_bytes
    now_ms = int(time.time() * 1000)
    rows = [(None, value, None, now_ms)] * records_per_batch
    sequences = [0] * partitions
    in_flight: list[tuple[float, ps.ProduceRequest, grpc.Future]] = []
    latencies_ms: list[float] = []
    sent = 0

    def settle(started: float, request: ps.ProduceRequest, fut: grpc.Future) -> None:
        # Concurrent RPCs may reach the store out of order; a batch that
        # overtook its predecessor gets OUT_OF_ORDER_SEQUENCE_NUMBER and is sent
        # again once the predecessor is in (popping in order guarantees that).
        resp = fut.result()
        while resp.results[0].error.code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER:
            resp = store.Produce(request)
        if resp.results[0].error.code != 0:
            raise RuntimeError(resp.results[0].error.message)
        latencies_ms.append((time.perf_counter() - started) * 1000)

    deadline = time.perf_counter() + duration_s
    while time.perf_counter() < deadline:
        for p in range(partitions):
            batch = rec.encode_batch(rows, producer_id=producer_id, producer_epoch=0,
                                     base_sequence=sequences[p])
            sequences[p] = rec.next_sequence(sequences[p], records_per_batch)
            request = ps.ProduceRequest(
                batches=[ps.PartitionBatch(topic=topic, partition=p, batch=batch)],
                timeout_ms=30000)
            in_flight.append((time.perf_counter(), request, store.Produce.future(request)))
        while len(in_flight) >= 5 * partitions:
            settle(*in_flight.pop(0))
            sent += records_per_batch
    for item in in_flight:
        settle(*item)
        sent += records_per_batch
    return sent, latencies_ms


def measure(args: argparse.Namespace, client: str, *, value_bytes: int, partitions: int,
            fsync: bool) -> Result:
    extra = {"partition_store": ["--fsync"]} if fsync else {}
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as data_dir, \
            LocalCluster(data_dir, group_coordinators=0, extra_args=extra) as cluster:
        topic = "bench"
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic(topic, partitions=partitions,
                               config={"max.message.bytes": str(8 << 20)})
        started = time.perf_counter()
        if client == "sdk":
            sent, lat = run_sdk(cluster.bootstrap, topic, value_bytes=value_bytes,
                                partitions=partitions, duration_s=args.duration_s,
                                batch_size=args.batch_size, linger_ms=args.linger_ms)
        else:
            out = subprocess.run(
                [sys.executable, __file__, "--raw-child", cluster.bootstrap, topic,
                 str(value_bytes), str(partitions), str(args.duration_s),
                 str(max(1, args.batch_size // (value_bytes + 24)))],
                capture_output=True, text=True)
            if out.returncode != 0:
                raise RuntimeError(f"the raw client failed:\n{out.stderr[-3000:]}")
            payload = json.loads(out.stdout)
            sent, lat = payload["sent"], payload["latencies_ms"]
        elapsed = time.perf_counter() - started
    return Result(
        client=client, value_bytes=value_bytes, partitions=partitions, fsync=fsync,
        duration_s=round(elapsed, 2), records=sent,
        records_per_s=round(sent / elapsed), mb_per_s=round(sent * value_bytes / elapsed / 1e6, 1),
        ack_latency_ms_p50=round(statistics.median(lat), 2) if lat else float("nan"),
        ack_latency_ms_p99=round(percentile(lat, 0.99), 2),
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--raw-child":
        bootstrap, topic, vb, parts, dur, per_batch = sys.argv[2:8]
        sent, lat = run_raw(bootstrap, topic, value_bytes=int(vb), partitions=int(parts),
                            duration_s=float(dur), records_per_batch=int(per_batch))
        print(json.dumps({"sent": sent, "latencies_ms": lat}))
        return
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--value-bytes", type=int, action="append")
    parser.add_argument("--partitions", type=int, action="append")
    parser.add_argument("--fsync", choices=("off", "on", "both"), default="both")
    parser.add_argument("--clients", default="sdk,raw")
    parser.add_argument("--batch-size", type=int, default=512 * 1024,
                        help="producer batch_size in bytes")
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="5 s per case, 100 B values")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    if args.quick:
        args.duration_s = 5.0
        args.value_bytes = args.value_bytes or [100]
    value_sizes = args.value_bytes or [100, 1024]
    partition_counts = args.partitions or [1, 4]
    fsyncs = {"off": [False], "on": [True], "both": [False, True]}[args.fsync]
    results = []
    print(f"# {os.cpu_count()} CPUs; each case {args.duration_s:.0f} s; "
          f"batch_size {args.batch_size} B, linger_ms {args.linger_ms}")
    header = (f"{'client':6} {'value':>6} {'parts':>5} {'fsync':>5} {'records/s':>10} "
              f"{'MB/s':>7} {'p50 ms':>7} {'p99 ms':>7}")
    print(header)
    for fsync in fsyncs:
        for value_bytes in value_sizes:
            for partitions in partition_counts:
                for client in args.clients.split(","):
                    r = measure(args, client, value_bytes=value_bytes,
                                partitions=partitions, fsync=fsync)
                    results.append(r)
                    print(f"{r.client:6} {r.value_bytes:>6} {r.partitions:>5} "
                          f"{'on' if r.fsync else 'off':>5} {r.records_per_s:>10,} "
                          f"{r.mb_per_s:>7} {r.ack_latency_ms_p50:>7} {r.ack_latency_ms_p99:>7}",
                          flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in results], f, indent=2)


if __name__ == "__main__":
    main()
