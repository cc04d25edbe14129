"""Overload against one store, with and without client quotas.

What the store must survive (docs/performance.md, "Overload"): many client
connections at once, producers offering several times what it can write,
and a consumer reading a large backlog, all at the same time. Each mode
runs on a fresh one-store cluster:

* `--connections` gRPC connections (1,000 by default; each its own TCP
  connection) from a child process, each sending Produce requests of
  `--batch-bytes` back to back, all under the client id `flood`. They are
  badly behaved on purpose: they ignore throttle times, so with quotas on
  the store's own push-back (it holds their requests) is what is measured.
* a consumer (client id `backlog-reader`, another child process) reading
  a backlog of `--backlog-mb` MiB from its start;
* a well-behaved producer (our SDK, client id `good`, in this process)
  sending one 100-byte record at a time and waiting for its
  acknowledgement: the latency of each acknowledged send is recorded.

Modes: `none` (no quotas, the default configuration) and `quotas`
(`--producer-byte-rate` and `--consumer-byte-rate` as given; the filler
that writes the backlog is exempt). Reported per mode: the store's peak
RSS (VmHWM of its process), the well-behaved producer's p50/p99/max
acknowledged-send latency, the flood's acknowledged MiB/s, its answers with
a throttle time, its errors, the reader's MiB/s and throttle count, and
whether the store was still alive at the end. Load average before and
after, since the machine is shared.

    .venv/bin/python bench/overload.py                       # both modes, 30 s each
    .venv/bin/python bench/overload.py --seconds 5 --connections 100 --backlog-mb 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from oncelog import Admin, Consumer, Producer, TopicPartition  # noqa: E402
from oncelog.testing import LocalCluster  # noqa: E402

FLOOD_TOPIC = "flood"
FLOOD_PARTITIONS = 8
BACKLOG_TOPIC = "backlog"
GOOD_TOPIC = "good"
RECORD_BYTES = 1_000
BACKLOG_RECORD_BYTES = 10_000
MODES = ("none", "quotas")


# ------------------------------------------------------------------ children


async def _flood(address: str, seconds: float, connections: int, batch_bytes: int) -> dict[
        str, Any]:
    import grpc

    from oncelog.v1 import partition_store_pb2 as pb
    from oncelog.v1 import partition_store_pb2_grpc
    from oncelog.wire.limits import MAX_GRPC_MESSAGE_BYTES
    from oncelog.wire.records import encode_batch

    now_ms = int(time.time() * 1000)
    batch = encode_batch([(None, b"f" * RECORD_BYTES, None, now_ms)]
                         * max(batch_bytes // RECORD_BYTES, 1))
    options = [("grpc.use_local_subchannel_pool", 1),
               ("grpc.max_send_message_length", MAX_GRPC_MESSAGE_BYTES),
               ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE_BYTES)]
    channels = [grpc.aio.insecure_channel(address, options=options) for _ in range(connections)]
    stats: Counter[str] = Counter()
    stop_at = time.monotonic() + seconds

    async def one(index: int, channel: grpc.aio.Channel) -> None:
        stub = partition_store_pb2_grpc.PartitionStoreStub(channel)
        request = pb.ProduceRequest(
            batches=[pb.PartitionBatch(topic=FLOOD_TOPIC, partition=index % FLOOD_PARTITIONS,
                                       batch=batch)],
            timeout_ms=30_000, client_id="flood")
        while time.monotonic() < stop_at:
            try:
                answer = await stub.Produce(request, timeout=120)
            except grpc.aio.AioRpcError as exc:
                stats[f"error {exc.code().name}"] += 1
                await asyncio.sleep(0.1)
                continue
            stats["answers"] += 1
            if answer.throttle_time_ms > 0:
                stats["throttled"] += 1
            if all(r.error.code == 0 for r in answer.results):
                stats["acked_bytes"] += len(batch)
            else:
                stats["refused"] += 1
        stats["done"] += 1

    started = time.monotonic()
    await asyncio.gather(*(one(i, c) for i, c in enumerate(channels)))
    elapsed_s = time.monotonic() - started
    for channel in channels:
        await channel.close(None)
    return {**stats, "elapsed_s": elapsed_s}


def _read(bootstrap: str, seconds: float) -> dict[str, Any]:
    consumer = Consumer(bootstrap=bootstrap, client_id="backlog-reader",
                        isolation_level="read_uncommitted")
    consumer.assign([TopicPartition(BACKLOG_TOPIC, 0)])
    consumer.seek_to_beginning()
    read_bytes = 0
    records = 0
    started = time.monotonic()
    stop_at = started + seconds
    while time.monotonic() < stop_at:
        for record in consumer.poll(timeout=0.5):
            read_bytes += len(record.value or b"")
            records += 1
    elapsed_s = time.monotonic() - started
    throttle = consumer.fetch_throttle_time
    consumer.close()
    return {"read_bytes": read_bytes, "records": records, "elapsed_s": elapsed_s,
            "throttled": throttle.count, "throttle_max_ms": throttle.max_ms}


def child_main(argv: list[str]) -> None:
    role, target, seconds = argv[0], argv[1], float(argv[2])
    if role == "flood":
        result = asyncio.run(_flood(target, seconds, int(argv[3]), int(argv[4])))
    else:
        result = _read(target, seconds)
    print(json.dumps(result), flush=True)


# ------------------------------------------------------------------ the run


def _rss_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _fill_backlog(bootstrap: str, backlog_mb: int) -> None:
    value = b"b" * BACKLOG_RECORD_BYTES
    with Producer(bootstrap=bootstrap, client_id="filler", batch_size=512 * 1024,
                  linger_ms=20) as producer:
        for _ in range(backlog_mb * 1024 * 1024 // BACKLOG_RECORD_BYTES):
            producer.send(BACKLOG_TOPIC, value=value, partition=0)
        producer.flush()


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def run_mode(mode: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    store_args: list[str] = []
    if mode == "quotas":
        store_args = ["--producer-byte-rate", str(args.producer_byte_rate),
                      "--consumer-byte-rate", str(args.consumer_byte_rate),
                      "--client-quotas", "client-id=filler:producer_byte_rate=0"]
    with LocalCluster(work / mode, group_coordinators=0,
                      extra_args={"partition_store": store_args}) as cluster:
        store = cluster.processes["partition_store"][0]
        pid = store.pid
        if pid is None:
            raise RuntimeError("the store is not running")
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic(FLOOD_TOPIC, partitions=FLOOD_PARTITIONS)
            admin.create_topic(BACKLOG_TOPIC, partitions=1)
            admin.create_topic(GOOD_TOPIC, partitions=1)
        _fill_backlog(cluster.bootstrap, args.backlog_mb)
        rss_before_kib = _rss_kib(pid, "VmRSS")
        peak = {"rss_kib": rss_before_kib}
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(0.2):
                try:
                    peak["rss_kib"] = max(peak["rss_kib"], _rss_kib(pid, "VmRSS"))
                except OSError:
                    return

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        me = [sys.executable, str(Path(__file__).resolve()), "--child"]
        flood = subprocess.Popen(
            [*me, "flood", cluster.bootstrap, str(args.seconds), str(args.connections),
             str(args.batch_bytes)], stdout=subprocess.PIPE, text=True)
        reader = subprocess.Popen([*me, "read", cluster.bootstrap, str(args.seconds)],
                                  stdout=subprocess.PIPE, text=True)
        latencies_ms: list[float] = []
        good_errors: Counter[str] = Counter()
        with Producer(bootstrap=cluster.bootstrap, client_id="good", linger_ms=0) as good:
            # Let the flood's connections open before measuring.
            time.sleep(min(2.0, args.seconds / 4))
            stop_at = time.monotonic() + args.seconds * 0.75
            while time.monotonic() < stop_at:
                started = time.perf_counter()
                try:
                    good.send(GOOD_TOPIC, value=b"g" * 100).result(timeout=60)
                except Exception as exc:  # counted, not fatal: the bench reports it
                    good_errors[type(exc).__name__] += 1
                    continue
                latencies_ms.append((time.perf_counter() - started) * 1000)
            good_throttle = good.produce_throttle_time
        flood_out, _ = flood.communicate(timeout=args.seconds + 300)
        reader_out, _ = reader.communicate(timeout=args.seconds + 300)
        sampling.set()
        sampler.join()
        alive = store.alive()
        peak_kib = max(peak["rss_kib"], _rss_kib(pid, "VmHWM") if alive else 0)
        flood_stats = json.loads(flood_out.strip().splitlines()[-1]) if flood_out.strip() else {}
        reader_stats = (json.loads(reader_out.strip().splitlines()[-1])
                        if reader_out.strip() else {})
    mib = 1024 * 1024
    return {
        "mode": mode,
        "store_alive_at_end": alive,
        "store_rss_before_mib": round(rss_before_kib / 1024, 1),
        "store_peak_rss_mib": round(peak_kib / 1024, 1),
        "good_sends": len(latencies_ms),
        "good_errors": dict(good_errors),
        "good_p50_ms": round(statistics.median(latencies_ms), 2) if latencies_ms else None,
        "good_p99_ms": round(_percentile(latencies_ms, 0.99), 2) if latencies_ms else None,
        "good_max_ms": round(max(latencies_ms), 2) if latencies_ms else None,
        "good_throttled": good_throttle.count,
        "flood_acked_mib_s": round(flood_stats.get("acked_bytes", 0) / mib
                                   / max(flood_stats.get("elapsed_s", 1), 1e-9), 2),
        "flood_answers": flood_stats.get("answers", 0),
        "flood_throttled": flood_stats.get("throttled", 0),
        "flood_errors": {k: v for k, v in flood_stats.items() if k.startswith("error")},
        "reader_mib_s": round(reader_stats.get("read_bytes", 0) / mib
                              / max(reader_stats.get("elapsed_s", 1), 1e-9), 2),
        "reader_throttled": reader_stats.get("throttled", 0),
    }


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        child_main(argv[1:])
        return None
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--connections", type=int, default=1_000)
    parser.add_argument("--batch-bytes", type=int, default=16 * 1024)
    parser.add_argument("--backlog-mb", type=int, default=200)
    parser.add_argument("--producer-byte-rate", type=int, default=2 * 1024 * 1024,
                        help="the quotas mode's default producer quota (the flood shares one)")
    parser.add_argument("--consumer-byte-rate", type=int, default=10 * 1024 * 1024)
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    work = Path(args.work_dir) if args.work_dir else Path(
        os.environ.get("TMPDIR", "/tmp")) / f"oncelog-overload-{os.getpid()}"
    load_before = os.getloadavg()
    results = []
    for mode in args.modes.split(","):
        result = run_mode(mode, args, work)
        results.append(result)
        print(json.dumps(result), flush=True)
    load_after = os.getloadavg()
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    summary = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "load_before": [round(x, 2) for x in load_before],
               "load_after": [round(x, 2) for x in load_after],
               "cpus": os.cpu_count(), "settings": vars(args), "results": results}
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
