"""How cost grows with the work: partitions, transactional producers, group
members and log length, on LocalClusters on this machine.

Every case runs on a fresh cluster of three partition stores, one etcd
member, one transaction coordinator and one group coordinator, each its own
process, with topics at replication factor 3 (min.insync.replicas 2). Each
point is the median of `--runs` runs (a fresh cluster each), with the lowest
and highest run beside it.

Cases (`--cases`, comma-separated):

* `partitions` (sizes: `--partitions`, spread over the three stores; each
  store leads a third and follows the rest):
  - aggregate produce rate: 4 producer processes, 100 B values, keyed
    (the default partitioner spreads them over every partition), for
    `--seconds`; the records every producer got acknowledged over the time;
  - store RSS (each store's, growth per replica it holds over the same
    cluster before the topic existed);
  - idle CPU: each store's CPU time over `--idle-seconds` with nothing
    written, as a share of one core;
  - failover after kill -9 of the store leading the most partitions: until
    every partition has a leader on a live store (the survivors' Metadata,
    polled every 50 ms), and until a producer that had written to every
    partition before the kill has one record acknowledged on each partition
    the dead store led;
  - restart of that store: until it serves, and until every partition has
    it back in its ISR.
* `txn` (sizes: `--txn-producers`): that many transactional ids, each its
  own producer, each running one-record transactions (begin, send,
  commit) paced at `--txn-rate` per id, for `--seconds`; transactions/s
  and the commit's p50/p99 (`commit_transaction()` alone); then the
  coordinator's RSS. Then (`--txn-known-ids`) that many ids are registered
  with InitProducerId, the coordinator is killed (kill -9) and restarted:
  until it serves, and until it answers InitProducerId for a known id.
* `group` (sizes: `--group-members`): members join one group on a topic
  with as many partitions as the largest size, one at a time; for each
  size, the time from the new member's subscribe until every member holds
  a share of the partitions in the same assignment (each partition once).
* `log` (sizes: `--log-records`): one partition filled with that many
  100 B records; then the disk bytes per record (the store's data
  directory), and the restart time of a store holding it after kill -9 and
  after SIGTERM (until it serves again). Its topic has replication factor 3
  unless `--log-replication-factor` says otherwise (100M records are about
  11 GB a copy).

    .venv/bin/python -m bench.scale --json scale.json --svg-dir docs/img    # defaults
    .venv/bin/python -m bench.scale --runs 1 --partitions 3 --txn-producers 1 \\
        --group-members 1,2 --log-records 1000 --seconds 1 --idle-seconds 1 \\
        --txn-known-ids 20                                                # smoke
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import grpc  # noqa: E402

from oncelog import Admin, Consumer, Producer, RecordMetadata, TopicPartition  # noqa: E402
from oncelog.testing import LocalCluster  # noqa: E402
from oncelog.v1 import coordinator_pb2, coordinator_pb2_grpc  # noqa: E402

STORES = 3
STORE = "partition_store"
COORDINATOR = "coordinator"
VALUE_BYTES = 100
PRODUCERS = 4
LINGER_MS = 5
BATCH_SIZE_BYTES = 512 * 1024
# etcd takes at most 128 writes per transaction: a topic is created with
# this many partitions, then grown (CreatePartitions steps by itself).
CREATE_PARTITIONS_MAX = 100
POLL_S = 0.05
IN_SYNC_TIMEOUT_S = 600.0
FAILOVER_TIMEOUT_S = 120.0
CASES = ("partitions", "txn", "group", "log")


# ---------------------------------------------------------------- process


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def pid_of(cluster: LocalCluster, kind: str, index: int) -> int:
    pid = cluster.processes[kind][index].pid
    if pid is None:
        raise RuntimeError(f"{kind} {index} is not running")
    return pid


@contextlib.contextmanager
def replicated_cluster(env: dict[str, str] | None = None) -> Iterator[LocalCluster]:
    with tempfile.TemporaryDirectory(prefix="oncelog-scale-") as data_dir, LocalCluster(
            data_dir, partition_stores=STORES, etcd_members=1, env=env) as cluster:
        yield cluster


def create_topic(bootstrap: str, name: str, partitions: int,
                 replication_factor: int = STORES) -> None:
    with Admin(bootstrap=bootstrap) as admin:
        admin.create_topic(name, partitions=min(partitions, CREATE_PARTITIONS_MAX),
                           replication_factor=replication_factor)
        if partitions > CREATE_PARTITIONS_MAX:
            admin.create_partitions({name: partitions})


# ------------------------------------------------------------- partitions


def _produce_keyed(bootstrap: str, topic: str, seconds: float, seed: int,
                   linger_ms: int = LINGER_MS) -> int:
    """One producer process: keyed 100 B records for `seconds`; how many
    were acknowledged."""
    value = b"v" * VALUE_BYTES
    sent = 0
    with Producer(bootstrap=bootstrap, linger_ms=linger_ms,
                  batch_size=BATCH_SIZE_BYTES) as producer:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            for _ in range(1000):
                producer.send(topic, value=value, key=b"%d-%d" % (seed, sent))
                sent += 1
        producer.flush()
    return sent


def aggregate_rate(bootstrap: str, topic: str, seconds: float, linger_ms: int) -> float:
    """PRODUCERS processes at once; acknowledged records/s over the longest."""
    context = multiprocessing.get_context("spawn")
    started = time.perf_counter()
    with context.Pool(PRODUCERS) as pool:
        counts = pool.starmap(
            _produce_keyed, [(bootstrap, topic, seconds, i, linger_ms) for i in range(PRODUCERS)])
    return sum(counts) / (time.perf_counter() - started)


def idle_cpu_pct(pids: Sequence[int], seconds: float) -> list[float]:
    before = [cpu_seconds(p) for p in pids]
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    return [100 * (cpu_seconds(p) - b) / elapsed for p, b in zip(pids, before, strict=True)]


def failover(cluster: LocalCluster, topic: str, partitions: int) -> dict[str, float]:
    """Kill -9 of the store that leads the most partitions (a third, unless
    leadership moved): until every partition is led by a live store, and
    until one record per partition it led is acknowledged."""
    states = cluster.partition_states([topic])
    led = [sum(1 for s in states.values() if s.leader == i) for i in range(STORES)]
    victim = led.index(max(led))
    survivors = [i for i in range(STORES) if i != victim]
    victims = sorted(p for (_t, p), s in states.items() if s.leader == victim)
    with Producer(bootstrap=cluster.bootstrap_servers, linger_ms=0) as producer:
        # Warm: a producer id, metadata and connections to every leader.
        for warm in [producer.send(topic, value=b"w", partition=p) for p in range(partitions)]:
            warm.result(timeout=60)
        killed = time.monotonic()
        cluster.kill(STORE, victim)
        futures: list[Future[RecordMetadata]] = [
            producer.send(topic, value=b"f", partition=p) for p in victims]
        led_s = None
        while led_s is None:
            now = time.monotonic()
            if now - killed > FAILOVER_TIMEOUT_S:
                raise TimeoutError("partitions still without a live leader")
            seen = cluster.partition_states([topic], stores=survivors)
            if len(seen) == partitions and all(s.leader in survivors for s in seen.values()):
                led_s = now - killed
            else:
                time.sleep(POLL_S)
        for f in futures:
            f.result(timeout=FAILOVER_TIMEOUT_S)
        acked_s = time.monotonic() - killed
    started = time.monotonic()
    cluster.restart(STORE, victim)
    serving_s = time.monotonic() - started
    cluster.wait_in_sync([topic], timeout_s=IN_SYNC_TIMEOUT_S)
    return {"failover_partitions": float(len(victims)),
            "failover_led_s": led_s, "failover_acked_s": acked_s,
            "restart_serving_s": serving_s, "restart_in_sync_s": time.monotonic() - started}


def run_partitions(partitions: int, args: argparse.Namespace) -> dict[str, float]:
    topic = "scale"
    with replicated_cluster() as cluster:
        pids = [pid_of(cluster, STORE, i) for i in range(STORES)]
        # The stores as they are with only the internal topics.
        time.sleep(2)
        rss_before = [rss_bytes(p) for p in pids]
        create_topic(cluster.bootstrap_servers, topic, partitions)
        cluster.wait_in_sync([topic], timeout_s=IN_SYNC_TIMEOUT_S)
        # Let the start-up settle (the coordinators load, metrics warm up).
        time.sleep(2)
        rss_after = [rss_bytes(p) for p in pids]
        cpu = idle_cpu_pct(pids, args.idle_seconds)
        rate = aggregate_rate(cluster.bootstrap_servers, topic, args.seconds, args.linger_ms)
        recovery = failover(cluster, topic, partitions)
    # Each store holds one replica of every partition (RF 3 on 3 stores).
    rss_per_replica = statistics.median(
        (a - b) / partitions for a, b in zip(rss_after, rss_before, strict=True))
    return {
        "rate_records_per_s": rate,
        "store_rss_mib": statistics.median(rss_after) / 2**20,
        "rss_per_replica_kib": rss_per_replica / 1024,
        "idle_cpu_pct_max": max(cpu),
        "idle_cpu_pct_median": statistics.median(cpu),
        **recovery,
    }


# -------------------------------------------------------------------- txn


def register_ids(address: str, count: int) -> None:
    """InitProducerId for `count` transactional ids (they become known)."""
    with grpc.insecure_channel(address) as channel:
        stub = coordinator_pb2_grpc.TransactionCoordinatorStub(channel)

        def init(i: int) -> None:
            init_producer_id(stub, f"scale-known-{i}")

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(init, range(count)))


def init_producer_id(stub: coordinator_pb2_grpc.TransactionCoordinatorStub,
                     transactional_id: str) -> None:
    """InitProducerId, tried again while the coordinator answers that it is
    loading or not available yet (retriable)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            reply = stub.InitProducerId(coordinator_pb2.InitProducerIdRequest(
                transactional_id=transactional_id, transaction_timeout_ms=60_000), timeout=60)
        except grpc.RpcError as exc:
            if exc.code() is not grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
        else:
            if not reply.error.code:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"InitProducerId {transactional_id}: {reply.error}")
        time.sleep(POLL_S / 5)


def reload_time(cluster: LocalCluster) -> dict[str, float]:
    cluster.kill(COORDINATOR, 0)
    started = time.monotonic()
    cluster.restart(COORDINATOR, 0)
    serving_s = time.monotonic() - started
    address = cluster.address(COORDINATOR, 0)
    with grpc.insecure_channel(address) as channel:
        init_producer_id(coordinator_pb2_grpc.TransactionCoordinatorStub(channel),
                         "scale-known-0")
    return {"reload_serving_s": serving_s, "reload_answering_s": time.monotonic() - started}


def _txn_run(cluster: LocalCluster, topic: str, producers: int,
             args: argparse.Namespace) -> tuple[float, list[float]]:
    commits_ms: list[float] = []
    lock = threading.Lock()
    ready = threading.Barrier(producers + 1)
    deadline_box: list[float] = []

    def loop(i: int) -> int:
        with Producer(bootstrap=cluster.bootstrap_servers, transactional_id=f"scale-txn-{i}",
                      linger_ms=0) as producer:
            producer.init_transactions()
            ready.wait(timeout=600)
            deadline = deadline_box[0]
            pace_s = 1 / args.txn_rate
            # Spread the ids over the first pace interval.
            next_s = time.perf_counter() + pace_s * i / producers
            done = 0
            while True:
                now = time.perf_counter()
                if now >= deadline:
                    return done
                if now < next_s:
                    time.sleep(min(next_s - now, deadline - now))
                    continue
                next_s += pace_s
                producer.begin_transaction()
                producer.send(topic, value=b"t", key=b"%d" % i)
                started = time.perf_counter()
                producer.commit_transaction()
                with lock:
                    commits_ms.append((time.perf_counter() - started) * 1000)
                done += 1

    with ThreadPoolExecutor(producers) as pool:
        futures = [pool.submit(loop, i) for i in range(producers)]
        # Every id initialised first; then the clock runs.
        while ready.n_waiting < producers:
            for f in futures:
                if f.done():
                    f.result()
            time.sleep(POLL_S)
        started = time.perf_counter()
        deadline_box.append(started + args.seconds)
        ready.wait(timeout=60)
        total = sum(f.result() for f in futures)
    return total / (time.perf_counter() - started), commits_ms


# -------------------------------------------------------------------- group


def run_group(sizes: Sequence[int], args: argparse.Namespace) -> dict[int, float]:
    """Members join one at a time; the settle time of each join whose
    group size is in `sizes`."""
    topic = "scale-group"
    members_max = max(sizes)
    settle: dict[int, float] = {}
    with replicated_cluster() as cluster:
        create_topic(cluster.bootstrap_servers, topic, members_max)
        cluster.wait_in_sync(timeout_s=IN_SYNC_TIMEOUT_S)
        stop = threading.Event()
        assignments: dict[int, frozenset[TopicPartition]] = {}
        lock = threading.Lock()

        def member(index: int, subscribed: threading.Event) -> None:
            with Consumer(bootstrap=cluster.bootstrap_servers, group_id="scale-group",
                          auto_offset_reset="earliest") as consumer:
                consumer.subscribe([topic])
                subscribed.set()
                while not stop.is_set():
                    consumer.poll(timeout=0.1)
                    with lock:
                        assignments[index] = frozenset(consumer.assignment())

        threads = []
        try:
            for index in range(members_max):
                subscribed = threading.Event()
                thread = threading.Thread(target=member, args=(index, subscribed), daemon=True)
                started = time.monotonic()
                thread.start()
                threads.append(thread)
                subscribed.wait(timeout=60)
                size = index + 1
                while True:
                    with lock:
                        held = [assignments.get(i, frozenset()) for i in range(size)]
                    owned = [tp for h in held for tp in h]
                    if all(held) and len(owned) == len(set(owned)) == members_max:
                        break
                    if time.monotonic() - started > 120:
                        raise TimeoutError(f"the group of {size} did not settle")
                    time.sleep(POLL_S / 5)
                if size in sizes:
                    settle[size] = time.monotonic() - started
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=30)
    return settle


# ---------------------------------------------------------------------- log


def fill(bootstrap: str, topic: str, records: int) -> None:
    value = b"v" * VALUE_BYTES
    chunk = 1000
    with Producer(bootstrap=bootstrap, linger_ms=LINGER_MS,
                  batch_size=BATCH_SIZE_BYTES) as producer:
        sent = 0
        while sent < records:
            n = min(chunk, records - sent)
            producer.send_many(topic, [value] * n, partition=0)
            sent += n
        producer.flush()


def run_log(records: int, args: argparse.Namespace) -> dict[str, float]:
    topic = "scale-log"
    with replicated_cluster() as cluster:
        create_topic(cluster.bootstrap_servers, topic, 1,
                     replication_factor=args.log_replication_factor)
        cluster.wait_in_sync(timeout_s=IN_SYNC_TIMEOUT_S)
        started = time.monotonic()
        fill(cluster.bootstrap_servers, topic, records)
        fill_s = time.monotonic() - started
        cluster.wait_in_sync([topic], timeout_s=IN_SYNC_TIMEOUT_S)
        # The store that leads the partition; the others hold the same.
        leader = cluster.partition_states([topic])[(topic, 0)].leader
        data_dir = cluster.processes[STORE][leader].data_dir
        disk = dir_bytes(data_dir)
        out: dict[str, float] = {"fill_records_per_s": records / fill_s,
                                 "disk_bytes_per_record": disk / records}
        for how in ("kill", "term"):
            if how == "kill":
                cluster.kill(STORE, leader)
            else:
                cluster.terminate(STORE, leader)
            started = time.monotonic()
            cluster.restart(STORE, leader)
            out[f"restart_{how}_s"] = time.monotonic() - started
            cluster.wait_in_sync([topic], timeout_s=IN_SYNC_TIMEOUT_S)
    return out


# ------------------------------------------------------------------ tables


@dataclass
class Point:
    case: str
    size: int
    runs: list[dict[str, float]] = field(default_factory=list)
    # Runs that failed (what they raised): a point can miss a figure.
    errors: list[str] = field(default_factory=list)

    def figure(self, metric: str) -> tuple[float, float, float] | None:
        values = [r[metric] for r in self.runs if metric in r]
        if not values:
            return None
        return statistics.median(values), min(values), max(values)


def fmt(figure: tuple[float, float, float] | None, digits: int = 2) -> str:
    if figure is None:
        return "—"
    median, low, high = figure
    if low == high:
        return f"{median:,.{digits}f}"
    return f"{median:,.{digits}f} ({low:,.{digits}f}–{high:,.{digits}f})"


COLUMNS: dict[str, list[tuple[str, str, int]]] = {
    "partitions": [
        ("rate_records_per_s", "aggregate produce, records/s", 0),
        ("idle_cpu_pct_max", "idle CPU, busiest store, % of a core", 1),
        ("rss_per_replica_kib", "RSS per replica, KiB", 1),
        ("store_rss_mib", "store RSS, MiB", 1),
        ("failover_led_s", "failover: every partition led, s", 2),
        ("failover_acked_s", "failover: acks resume, s", 2),
        ("restart_serving_s", "restart: serving, s", 2),
        ("restart_in_sync_s", "restart: back in every ISR, s", 2),
    ],
    "txn": [
        ("txn_per_s", "transactions/s", 1),
        ("commit_p50_ms", "commit p50, ms", 2),
        ("commit_p99_ms", "commit p99, ms", 2),
        ("coordinator_rss_mib", "coordinator RSS, MiB", 1),
        ("reload_serving_s", "coordinator restart: serving, s", 2),
        ("reload_answering_s", "coordinator restart: answering, s", 2),
    ],
    "group": [("settle_s", "join settles, s", 2)],
    "log": [
        ("disk_bytes_per_record", "disk bytes per record", 1),
        ("restart_kill_s", "restart after kill -9, s", 2),
        ("restart_term_s", "restart after SIGTERM, s", 2),
        ("fill_records_per_s", "fill, records/s", 0),
    ],
}
SIZE_TITLES = {"partitions": "partitions", "txn": "transactional ids",
               "group": "members", "log": "records"}


def table(case: str, points: Sequence[Point]) -> str:
    columns = COLUMNS[case]
    lines = ["| " + " | ".join([SIZE_TITLES[case]] + [c[1] for c in columns]) + " |",
             "|" + "---|" * (len(columns) + 1)]
    for point in points:
        lines.append("| " + " | ".join(
            [f"{point.size:,}"] + [fmt(point.figure(m), d) for m, _t, d in columns]) + " |")
    return "\n".join(lines)


def svg_plot(title: str, x_label: str, series: dict[str, list[tuple[float, float]]],
             y_label: str) -> str:
    """A line chart, x on a log scale, as SVG text (no plotting package)."""
    width, height, left, bottom, top, right = 520, 300, 70, 45, 30, 20
    xs = [x for points in series.values() for x, _y in points]
    ys = [y for points in series.values() for _x, y in points]
    if not xs:
        return ""
    import math

    lx_min, lx_max = math.log10(min(xs)), math.log10(max(xs))
    if lx_max == lx_min:
        lx_max = lx_min + 1
    y_max = max(ys) * 1.1 or 1.0

    def px(x: float) -> float:
        return left + (math.log10(x) - lx_min) / (lx_max - lx_min) * (width - left - right)

    def py(y: float) -> float:
        return height - bottom - y / y_max * (height - bottom - top)

    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="16" text-anchor="middle" font-size="13">{title}</text>',
           f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" '
           f'y2="{height - bottom}" stroke="black"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="black"/>',
           f'<text x="{width / 2}" y="{height - 8}" text-anchor="middle">{x_label} '
           f'(log scale)</text>',
           f'<text x="14" y="{height / 2}" text-anchor="middle" '
           f'transform="rotate(-90 14 {height / 2})">{y_label}</text>']
    for x in sorted(set(xs)):
        out.append(f'<text x="{px(x):.1f}" y="{height - bottom + 14}" '
                   f'text-anchor="middle">{x:,.0f}</text>')
    for i in range(5):
        y = y_max * i / 4
        out.append(f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:,.3g}</text>')
        out.append(f'<line x1="{left}" y1="{py(y):.1f}" x2="{width - right}" y2="{py(y):.1f}" '
                   f'stroke="#ddd"/>')
    for n, (name, points) in enumerate(series.items()):
        color = colors[n % len(colors)]
        path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in sorted(points))
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y in points:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"/>')
        out.append(f'<text x="{width - right - 4}" y="{top + 14 * (n + 1)}" '
                   f'text-anchor="end" fill="{color}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# -------------------------------------------------------------------- main


def parse_sizes(text: str) -> list[int]:
    return [int(s.replace("_", "")) for s in text.split(",") if s]


def run(argv: Sequence[str] | None = None) -> dict[str, list[Point]]:
    """Parses the options, runs the cases, prints the tables; returns every
    point with its runs."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--runs", type=int, default=3, help="runs per point (median)")
    parser.add_argument("--partitions", type=parse_sizes, default=[3, 30, 300, 1000])
    parser.add_argument("--txn-producers", type=parse_sizes, default=[1, 10, 100, 1000])
    parser.add_argument("--txn-rate", type=float, default=1.0,
                        help="transactions/s each transactional id runs")
    parser.add_argument("--txn-known-ids", type=int, default=10_000)
    parser.add_argument("--group-members", type=parse_sizes, default=[1, 10, 25, 50])
    parser.add_argument("--log-records", type=parse_sizes, default=[1_000_000, 10_000_000])
    # 100M records of 100 B take about 14 GB per copy: RF 1 fits a disk
    # that three copies do not (the restart reads one store's copy either way).
    parser.add_argument("--log-replication-factor", type=int, default=STORES,
                        help="replication factor of the log case's topic")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long a rate runs")
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--linger-ms", type=int, default=LINGER_MS,
                        help="the producers' linger in the partitions case")
    parser.add_argument("--json", help="also write every run and the tables here")
    parser.add_argument("--svg-dir", help="write the plots (SVG) into this directory")
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}; pick from {', '.join(CASES)}")
    print(f"# {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}; runs {args.runs}; "
          f"cases {','.join(cases)}", flush=True)
    results: dict[str, list[Point]] = {}
    runners: dict[str, tuple[list[int], Callable[[int, argparse.Namespace],
                                                 dict[str, float]]]] = {
        "partitions": (args.partitions, run_partitions),
        "txn": (args.txn_producers, lambda n, a: txn_point(n, a)),
        "log": (args.log_records, run_log),
    }
    for case in cases:
        if case == "group":
            by_size = {n: Point(case, n) for n in args.group_members}
            for run in range(args.runs):
                load = os.getloadavg()[0]
                try:
                    settled = run_group(args.group_members, args)
                except Exception as exc:  # noqa: BLE001 - reported, the other runs go on
                    print(f"# {case} run {run + 1} failed: {exc!r}", flush=True)
                    continue
                for size, seconds in settled.items():
                    by_size[size].runs.append({"settle_s": seconds, "load": load})
                    print(f"# {case} run {run + 1} size {size}: settle {seconds:.2f} s",
                          flush=True)
            results[case] = list(by_size.values())
            continue
        sizes, runner = runners[case]
        results[case] = []
        for size in sizes:
            point = Point(case, size)
            for run in range(args.runs):
                load = os.getloadavg()[0]
                try:
                    values = runner(size, args)
                except Exception as exc:  # noqa: BLE001 - reported, the other points go on
                    print(f"# {case} size {size} run {run + 1} failed: {exc!r}", flush=True)
                    point.errors.append(repr(exc))
                    continue
                values["load"] = load
                point.runs.append(values)
                print(f"# {case} size {size} run {run + 1}: "
                      + json.dumps({k: round(v, 3) for k, v in values.items()}), flush=True)
            results[case].append(point)
    print(f"# load average at the end {os.getloadavg()[0]:.2f}")
    for case, points in results.items():
        print(f"\n{case}: medians of {args.runs} run(s) (min–max)\n")
        print(table(case, points))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {case: [asdict(p) for p in points] for case, points in results.items()}, indent=1))
    if args.svg_dir:
        write_plots(results, Path(args.svg_dir))
    return results


def main(argv: Sequence[str] | None = None) -> int:
    run(argv)
    return 0


def txn_point(producers: int, args: argparse.Namespace) -> dict[str, float]:
    topic = "scale-txn"
    with replicated_cluster() as cluster:
        create_topic(cluster.bootstrap_servers, topic, 12)
        cluster.wait_in_sync(timeout_s=IN_SYNC_TIMEOUT_S)
        rate, commits_ms = _txn_run(cluster, topic, producers, args)
        commits_ms.sort()
        out = {
            "txn_per_s": rate,
            "commit_p50_ms": commits_ms[len(commits_ms) // 2] if commits_ms else float("nan"),
            "commit_p99_ms": (commits_ms[min(len(commits_ms) - 1, int(0.99 * len(commits_ms)))]
                              if commits_ms else float("nan")),
            "coordinator_rss_mib": rss_bytes(pid_of(cluster, COORDINATOR, 0)) / 2**20,
        }
        if args.txn_known_ids:
            register_ids(cluster.address(COORDINATOR, 0), args.txn_known_ids)
            out.update(reload_time(cluster))
    return out


def write_plots(results: dict[str, list[Point]], directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for case, points in results.items():
        for metric, title, _digits in COLUMNS[case]:
            series = {"median": [(float(p.size), f[0]) for p in points
                                 if (f := p.figure(metric)) is not None]}
            text = svg_plot(title, SIZE_TITLES[case], series, title)
            if text:
                (directory / f"scale-{case}-{metric}.svg").write_text(text)


if __name__ == "__main__":
    sys.exit(main())

