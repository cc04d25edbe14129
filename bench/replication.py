"""What replication costs and how fast it recovers: RF 3 against RF 1 in the
same run.

Partitions are replicated when the stores run with etcd (docs/replication.md).
This measures, on LocalClusters on this machine (each service its own
process), three set-ups side by side:

* `RF 3`: three partition stores and one etcd member; the topic has
  replication_factor 3 (an append is acknowledged once every in-sync
  replica has it; min.insync.replicas 2).
* `RF 1`: the same three stores and etcd, the topic with replication_factor
  1: the same cluster, only the copies differ. (The internal topics keep
  the cluster's default of three copies in both.)
* `one store`: a single store without etcd, the set-up of bench/produce.py
  and bench/pipeline.py, for reference.

Cases (`--cases`, comma-separated):

* `produce-1p`, `produce-4p`: the idempotent producer, 100 B records, one
  or four partitions, for `--seconds` (bench/produce.py's run_sdk);
  records/s, and RF 3 / RF 1 per round.
* `latency`: back-to-back acknowledged sends of one record (linger 0) and
  one-record transactions (begin, send, wait for the acknowledgement,
  commit), `--latency-samples` each (bench/pipeline.py's measure_latency);
  p50 and p99.
* `failover`: an idempotent producer streams about 1,000 records/s
  round-robin into a 3-partition RF 3 topic (each store leads one
  partition); the leader of one partition is killed (SIGKILL), and the
  failover time is measured on the client, from the kill to the first
  acknowledgement of a record sent to that partition after the kill. The
  killed store is restarted and the next kill waits until every partition
  (internal ones too) has every replica in its ISR and its preferred
  leader back, and the stream is acknowledged on every partition again.
  While it waits, it polls the surviving stores' Metadata, which tells
  when the new leader became visible to clients. `--kills` kills for each
  lease TTL of `--lease-ttls` (the stores' lease TTL, ONCELOG_LEASE_TTL_S),
  spread over the rounds; p50, p99 and max against the target of 2 x the
  TTL.
* `catch-up`: a 4-partition RF 3 topic is filled with `--catch-up-mb` MB
  (10^6 bytes) of 1 KiB records; then one store is stopped (SIGTERM), its
  disk wiped, and it is started again. The clock runs from the restart
  until every partition of the topic has that store back in its ISR; the
  rate is the topic's log bytes (each partition's stored batch bytes, from
  the stores' oncelog_store_log_size_bytes) over that time.

Each round runs the produce and latency cases on every set-up, each on a
fresh cluster, the set-ups' order rotating from round to round, then one
catch-up and its share of the kills for every TTL (the TTLs' order
alternating). The tables give medians over the rounds with the lowest and
highest round in brackets (the failover table: percentiles over all kills).

    .venv/bin/python -m bench.replication                       # 3 rounds (~12 min)
    .venv/bin/python -m bench.replication --rounds 1 --seconds 1 --latency-samples 20 \\
        --kills 2 --lease-ttls 2 --catch-up-mb 5                # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Run as a script (`python bench/replication.py`), the repository root is not
# on sys.path; the sibling benchmarks are imported as the package `bench`.
REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench import peers, pipeline, produce  # noqa: E402
from bench.peers import cell  # noqa: E402
from oncelog import Admin, Producer, RecordMetadata  # noqa: E402
from oncelog.testing import LocalCluster, PartitionPlacement  # noqa: E402

STORES = 3
# The workload shape of bench/peers.py's producing cases.
SMALL_BYTES = 100
LINGER_MS = 5
BATCH_SIZE_BYTES = 512 * 1024
TOPIC_CONFIG = {"max.message.bytes": str(8 << 20)}
PRODUCE_TOPIC = "bench"

# Failover: records/s the stream sends (round-robin over one partition per
# store), so a record goes to the killed leader's partition every 3 ms.
STREAM_RECORDS_PER_S = 1000
FAILOVER_TOPIC = "failover"
# A failover that takes this many lease TTLs (or 60 s) has failed.
FAILOVER_GIVE_UP_TTLS = 20
# Until the cluster is whole again after a restart (in sync, preferred
# leaders back): generous, a loaded machine is slow to catch up.
STEADY_TIMEOUT_S = 180.0
DEFAULT_LEASE_TTLS_S = (3, 2)

# Catch-up: bench/pipeline.py's input topic (4 partitions), filled by its
# fill_input with 1 KiB records.
CATCH_UP_TOPIC = pipeline.INPUT
CATCH_UP_PARTITIONS = pipeline.PARTITIONS
CATCH_UP_VALUE_BYTES = 1024
CATCH_UP_TIMEOUT_S = 1800.0
MB = 1_000_000

POLL_S = 0.05

CASES = ("produce-1p", "produce-4p", "latency", "failover", "catch-up")
# The cases that run on every set-up.
COMPARED_CASES = ("produce-1p", "produce-4p", "latency")


@dataclass(frozen=True, slots=True)
class Setup:
    """One cluster layout and the replication factor of the measured topic."""

    key: str
    title: str
    etcd: bool
    replication_factor: int


RF3 = Setup("rf3", "RF 3 (3 stores, etcd)", etcd=True, replication_factor=3)
RF1 = Setup("rf1", "RF 1 (3 stores, etcd)", etcd=True, replication_factor=1)
SINGLE = Setup("single", "one store, no etcd", etcd=False, replication_factor=1)
SETUPS = (RF3, RF1, SINGLE)


# The rows both benchmarks report, defined once (bench/peers.py): the
# produce and latency cases, which this benchmark runs per set-up.
Metric = peers.Metric
METRICS = tuple(m for m in peers.METRICS if m.case in ("produce-1p", "produce-4p", "latency"))


@dataclass
class Measurement:
    """One case on one set-up in one round."""

    case: str
    setup: str
    round: int
    values: dict[str, float]
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Kill:
    """One leader killed in the failover case."""

    lease_ttl_s: int
    round: int
    partition: int
    store: int
    # Whether the killed store was also the controller (which must then be
    # elected again before it can move the leadership).
    controller: bool
    # From the kill to the first acknowledgement of a record sent after it.
    failover_s: float
    # From the kill until a surviving store's Metadata named the new leader
    # (polled every POLL_S while waiting for the acknowledgement; None when
    # the acknowledgement came before a poll saw it).
    elected_s: float | None
    # From the restart until the cluster was whole again (see wait_steady).
    rejoin_s: float


@dataclass
class CatchUp:
    round: int
    store: int
    log_bytes: int
    # From the restart call until the store served, and until every
    # partition of the topic had it back in its ISR.
    serving_s: float
    in_sync_s: float
    mb_per_s: float


@dataclass
class TableRow:
    label: str
    unit: str
    higher_is_better: bool
    # setup key -> (median, min, max) over the rounds.
    figures: dict[str, tuple[float, float, float]]
    # RF 3 / RF 1, taken per round: (median, min, max); None without both.
    ratio: tuple[float, float, float] | None


@dataclass
class FailoverRow:
    lease_ttl_s: int
    kills: int
    p50_s: float
    p99_s: float
    max_s: float
    target_s: float
    within_target: int
    controller_kills: int
    # The median failover of the kills that hit the controller too, and of
    # the others (None when there were none).
    controller_p50_s: float | None
    others_p50_s: float | None
    # The median time until Metadata named the new leader (over the kills
    # where a poll saw it before the acknowledgement).
    elected_p50_s: float | None
    rejoin_p50_s: float


@dataclass
class Report:
    rows: list[TableRow]
    failover: list[FailoverRow]
    catch_up: dict[str, tuple[float, float, float]]
    # Records sent and never acknowledged, over every produce run and the
    # failover streams: 0 unless something is wrong.
    undelivered_records: int


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


# --- clusters and their state ----------------------------------------------------


# Set from --coordinators-in-stores by main(): every cluster of the run runs
# its coordinators in the stores' processes (one of each kind per store).
COORDINATORS_IN_STORES = False


@contextlib.contextmanager
def started_cluster(setup: Setup, env: dict[str, str] | None = None) -> Iterator[LocalCluster]:
    """A fresh cluster of the set-up's layout (one transaction coordinator and
    no group coordinator, or one of each in each store with
    --coordinators-in-stores) in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as data_dir:
        if setup.etcd:
            cluster = LocalCluster(data_dir, partition_stores=STORES, group_coordinators=0,
                                   etcd_members=1, env=env,
                                   coordinators_in_stores=COORDINATORS_IN_STORES)
        else:
            cluster = LocalCluster(data_dir, group_coordinators=0, env=env,
                                   coordinators_in_stores=COORDINATORS_IN_STORES)
        with cluster:
            yield cluster


def placements(cluster: LocalCluster, topics: Sequence[str] = (),
               ask: Sequence[int] | None = None) -> dict[tuple[str, int], PartitionPlacement]:
    """Leader, epoch, replicas and ISR of every partition of `topics` (empty:
    every topic, internal ones too), from the first store of `ask` (default:
    all) that answers Metadata within a second. (Admin.describe_topic gives
    the same fields from the client's cached metadata, and asks every leader
    for offsets too; a poll wants neither.)"""
    states = cluster.partition_states(topics, stores=ask)
    if not states:
        raise RuntimeError("no store answered Metadata")
    return states


def wait_until(what: str, check: Callable[[], bool], timeout_s: float) -> float:
    """Polls `check` every POLL_S until it holds; returns the seconds taken."""
    started = time.perf_counter()
    while True:
        with contextlib.suppress(RuntimeError):
            if check():
                return time.perf_counter() - started
        if time.perf_counter() - started > timeout_s:
            raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(POLL_S)


def whole(states: dict[tuple[str, int], PartitionPlacement]) -> bool:
    """Every partition led, every replica in sync."""
    return bool(states) and all(s.in_sync for s in states.values())


def preferred(states: dict[tuple[str, int], PartitionPlacement]) -> bool:
    return all(s.preferred for s in states.values())


def create_topic(cluster: LocalCluster, setup: Setup, topic: str, partitions: int) -> str:
    """Creates the topic with the set-up's replication factor, waits until
    every replica is in sync, and returns the bootstrap to give clients."""
    bootstrap = cluster.bootstrap_servers
    with Admin(bootstrap=bootstrap) as admin:
        admin.create_topic(topic, partitions=partitions, config=TOPIC_CONFIG,
                           replication_factor=setup.replication_factor if setup.etcd else 0)
    if setup.etcd:
        wait_until(f"{topic} led and in sync", lambda: whole(placements(cluster, [topic])), 60)
    return bootstrap


def controller(cluster: LocalCluster) -> int | None:
    """The store that holds the controller key in etcd, if any (under the
    stores' default --metadata-root; docs/replication.md, "What is in etcd")."""
    from services.common.metadata.etcd import EtcdMetadataStore
    from services.partition_store.replication.metadata_link import DEFAULT_ROOT

    async def read() -> int | None:
        store = EtcdMetadataStore(cluster.etcd_endpoints, timeout_ms=5_000)
        try:
            item = await store.get(f"{DEFAULT_ROOT}/controller")
        finally:
            await store.close()
        return None if item is None else int(json.loads(item.value)["node_id"])

    return asyncio.run(read())


LOG_SIZE = re.compile(r'^oncelog_store_log_size_bytes\{([^}]*)\}\s+(\S+)$', re.MULTILINE)


def log_bytes(cluster: LocalCluster, index: int, topic: str) -> dict[int, int]:
    """Stored batch bytes per partition of `topic` on one store, from its
    metrics (oncelog_store_log_size_bytes)."""
    with urllib.request.urlopen(cluster.metrics_url("partition_store", index), timeout=10) as r:
        text = r.read().decode()
    sizes: dict[int, int] = {}
    for labels, value in LOG_SIZE.findall(text):
        found = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if found.get("topic") == topic:
            sizes[int(found["partition"])] = int(float(value))
    return sizes


# --- the compared cases ----------------------------------------------------------


def run_produce(args: argparse.Namespace, setup: Setup, partitions: int) -> Measurement:
    """bench/produce.py's SDK client on a fresh cluster; the clock covers
    creating the producer and the final flush, as in bench/peers.py."""
    with started_cluster(setup) as cluster:
        bootstrap = create_topic(cluster, setup, PRODUCE_TOPIC, partitions)
        started = time.perf_counter()
        sent, _ = produce.run_sdk(bootstrap, PRODUCE_TOPIC, value_bytes=SMALL_BYTES,
                                  partitions=partitions, duration_s=args.seconds,
                                  batch_size=BATCH_SIZE_BYTES, linger_ms=LINGER_MS)
        elapsed = time.perf_counter() - started
        # run_sdk counts what it sent; the high watermarks say what was
        # acknowledged (the idempotent producer writes nothing twice).
        with Admin(bootstrap=bootstrap) as admin:
            written = sum(p.high_watermark for p in admin.describe_topic(PRODUCE_TOPIC).partitions)
    if written != sent:
        print(f"# WARNING: {setup.key}, {partitions} partition(s): {sent} records sent, "
              f"{written} in the log", flush=True)
    return Measurement("", setup.key, 0, {"records_per_s": round(sent / elapsed)},
                       {"records": sent, "seconds": round(elapsed, 2),
                        "undelivered": sent - written})


def run_latency(args: argparse.Namespace, setup: Setup) -> Measurement:
    """bench/pipeline.py's latency case on a fresh cluster."""
    with started_cluster(setup) as cluster:
        bootstrap = create_topic(cluster, setup, pipeline.OUTPUT, pipeline.PARTITIONS)
        run = pipeline.measure_latency(bootstrap, latency_samples=args.latency_samples,
                                       value_bytes=SMALL_BYTES)
    return Measurement("", setup.key, 0, {
        "send_p50_ms": run.send_p50_ms, "send_p99_ms": run.send_p99_ms,
        "transaction_p50_ms": run.transaction_p50_ms,
        "transaction_p99_ms": run.transaction_p99_ms,
    }, {"first_send_p50_ms": run.first_send_p50_ms, "commit_p50_ms": run.commit_p50_ms})


COMPARED: dict[str, Callable[[argparse.Namespace, Setup], Measurement]] = {
    "produce-1p": lambda a, s: run_produce(a, s, 1),
    "produce-4p": lambda a, s: run_produce(a, s, 4),
    "latency": run_latency,
}


# --- failover ----------------------------------------------------------------------


@dataclass
class _Watch:
    """The first acknowledgement of a record sent to `partition` from
    `first_index` on."""

    partition: int
    first_index: int
    acked_at: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)


class Stream:
    """An idempotent producer (default options, so its retries and metadata
    refreshes are what an application gets) sending numbered records
    round-robin over `partitions` at STREAM_RECORDS_PER_S from a thread, and
    the time at which chosen acknowledgements arrive."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.producer = Producer(bootstrap=bootstrap)
        self.topic = topic
        self.partitions = partitions
        self.sent = 0
        self.failed = 0
        self.first_error: BaseException | None = None
        self._watches: dict[int, _Watch] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="failover-stream", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        interval_s = 1 / STREAM_RECORDS_PER_S
        next_at = time.perf_counter()
        index = 0
        while not self._stop.is_set():
            future = self.producer.send(self.topic, value=b"%d" % index,
                                        partition=index % self.partitions)
            future.add_done_callback(self._answered(index))
            index += 1
            self.sent = index
            next_at += interval_s
            delay = next_at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            elif delay < -1.0:
                # send() blocked (a full buffer): go on at the rate from
                # here rather than in a burst.
                next_at = time.perf_counter()

    def _answered(self, index: int) -> Callable[[Future[RecordMetadata]], None]:
        def done(future: Future[RecordMetadata]) -> None:
            now = time.perf_counter()
            error = future.exception()
            if error is not None:
                with self._lock:
                    self.failed += 1
                    self.first_error = self.first_error or error
                return
            watch = self._watches.get(index % self.partitions)
            if watch is not None and index >= watch.first_index and not watch.done.is_set():
                watch.acked_at = now
                watch.done.set()
        return done

    def watch(self, partition: int) -> _Watch:
        """Watches for the first acknowledgement of a record sent to
        `partition` from now on."""
        with self._lock:
            watch = _Watch(partition, self.sent)
            self._watches[partition] = watch
        return watch

    def wait_flowing(self, timeout_s: float) -> None:
        """Until a record sent from now on is acknowledged on every partition."""
        watches = [self.watch(p) for p in range(self.partitions)]
        deadline = time.perf_counter() + timeout_s
        for w in watches:
            if not w.done.wait(max(0.0, deadline - time.perf_counter())):
                raise RuntimeError(f"no acknowledgement on partition {w.partition} of "
                                   f"{self.topic} within {timeout_s:.0f} s")

    def finish(self) -> None:
        self._stop.set()
        self._thread.join()
        self.producer.flush(timeout=120)
        self.producer.close()


def wait_steady(cluster: LocalCluster, stream: Stream) -> None:
    """Until every partition (internal ones too) is led by its preferred
    replica with every replica in sync, and the stream is acknowledged on
    every partition again: the state in which a kill is measured."""
    wait_until("every replica in sync and every preferred leader back",
               lambda: (lambda s: whole(s) and preferred(s))(placements(cluster)),
               STEADY_TIMEOUT_S)
    stream.wait_flowing(STEADY_TIMEOUT_S)


def wait_failover(cluster: LocalCluster, watch: _Watch, before: PartitionPlacement,
                  lease_ttl_s: int, killed_at: float) -> float | None:
    """Until the watched acknowledgement arrives, polling the surviving
    stores' Metadata for the new leader meanwhile; returns when that was
    seen (seconds after the kill), None when the acknowledgement came first."""
    give_up_s = max(60.0, FAILOVER_GIVE_UP_TTLS * lease_ttl_s)
    survivors = [i for i in range(STORES) if i != before.leader]
    elected_s: float | None = None
    while not watch.done.wait(POLL_S):
        if time.perf_counter() - killed_at > give_up_s:
            raise RuntimeError(f"no acknowledgement on partition {watch.partition} "
                               f"{give_up_s:.0f} s after killing its leader {before.leader}")
        if elected_s is not None:
            continue
        with contextlib.suppress(RuntimeError):
            now = placements(cluster, [FAILOVER_TOPIC], ask=survivors)[
                (FAILOVER_TOPIC, watch.partition)]
            # Seen after the acknowledgement came (during this poll): not
            # counted, as when no poll saw it in time.
            if (now.leader >= 0 and now.leader_epoch > before.leader_epoch
                    and not watch.done.is_set()):
                elected_s = time.perf_counter() - killed_at
    if elected_s is not None and elected_s > watch.acked_at - killed_at:
        return None  # the acknowledgement's callback ran during the check
    return elected_s


def run_failover(lease_ttl_s: int, kills: int, round_no: int) -> tuple[list[Kill], int]:
    """`kills` leaders killed in turn on a fresh RF 3 cluster with this lease
    TTL; returns them and the records the stream failed to deliver."""
    measured: list[Kill] = []
    # Leadership back to the preferred replicas within a second of being in
    # sync (the default waits 5 min), so each kill starts from the same layout.
    env = {"ONCELOG_LEASE_TTL_S": str(lease_ttl_s),
           "ONCELOG_LEADER_IMBALANCE_CHECK_INTERVAL_MS": "1000"}
    with started_cluster(RF3, env=env) as cluster:
        bootstrap = create_topic(cluster, RF3, FAILOVER_TOPIC, STORES)
        stream = Stream(bootstrap, FAILOVER_TOPIC, STORES)
        try:
            wait_steady(cluster, stream)
            for k in range(kills):
                partition = (round_no + k) % STORES
                before = placements(cluster, [FAILOVER_TOPIC])[(FAILOVER_TOPIC, partition)]
                leader = before.leader
                was_controller = controller(cluster) == leader
                cluster.kill("partition_store", leader)
                killed_at = time.perf_counter()
                watch = stream.watch(partition)
                elected_s = wait_failover(cluster, watch, before, lease_ttl_s, killed_at)
                failover_s = watch.acked_at - killed_at
                restarted_at = time.perf_counter()
                cluster.restart("partition_store", leader)
                wait_steady(cluster, stream)
                kill = Kill(lease_ttl_s, round_no, partition, leader, was_controller,
                            round(failover_s, 3),
                            None if elected_s is None else round(elected_s, 3),
                            round(time.perf_counter() - restarted_at, 2))
                measured.append(kill)
                print(f"#   {kill}", flush=True)
        finally:
            stream.finish()
    if stream.failed:
        print(f"# WARNING: {stream.failed} records were not delivered: {stream.first_error!r}",
              flush=True)
    return measured, stream.failed


# --- catch-up ----------------------------------------------------------------------


def run_catch_up(args: argparse.Namespace, round_no: int) -> CatchUp:
    """Fills a 4-partition RF 3 topic, stops one store, wipes it, starts it
    again and times its way back into every partition's ISR."""
    with started_cluster(RF3) as cluster:
        bootstrap = create_topic(cluster, RF3, CATCH_UP_TOPIC, CATCH_UP_PARTITIONS)
        records = math.ceil(args.catch_up_mb * MB / CATCH_UP_VALUE_BYTES)
        pipeline.fill_input(bootstrap, records, CATCH_UP_VALUE_BYTES)
        # Every replica has every batch once the fill is acknowledged
        # (acks=all); the largest figure per partition is the leader's.
        sizes: dict[int, int] = {}
        for index in range(STORES):
            for p, size in log_bytes(cluster, index, CATCH_UP_TOPIC).items():
                sizes[p] = max(sizes.get(p, 0), size)
        total_bytes = sum(sizes.values())
        wiped = (round_no - 1) % STORES
        others = [i for i in range(STORES) if i != wiped]

        def back(in_isr: bool) -> Callable[[], bool]:
            return lambda: all((wiped in s.isr) == in_isr for s in placements(
                cluster, [CATCH_UP_TOPIC], ask=others).values())

        cluster.terminate("partition_store", wiped)
        # Out of every ISR first, so that the clock stops on its return and
        # not on a membership left over from before the stop.
        wait_until(f"store {wiped} out of the ISRs", back(False), 120)
        cluster.wipe("partition_store", wiped)
        restarted_at = time.perf_counter()
        cluster.restart("partition_store", wiped)
        serving_s = time.perf_counter() - restarted_at
        wait_until(f"store {wiped} back in every ISR of {CATCH_UP_TOPIC}", back(True),
                   CATCH_UP_TIMEOUT_S)
        in_sync_s = time.perf_counter() - restarted_at
        copied = sum(log_bytes(cluster, wiped, CATCH_UP_TOPIC).values())
        if copied < total_bytes:
            raise RuntimeError(f"store {wiped} is back in the ISRs with {copied} of the "
                               f"{total_bytes} bytes of {CATCH_UP_TOPIC}")
    return CatchUp(round_no, wiped, total_bytes, round(serving_s, 2), round(in_sync_s, 2),
                   round(total_bytes / MB / in_sync_s, 1))


# --- rounds and tables ---------------------------------------------------------------


def kills_in_round(kills: int, rounds: int, round_no: int) -> int:
    """The kills spread over the rounds, the first rounds taking the rest."""
    return kills // rounds + (1 if round_no <= kills % rounds else 0)


@dataclass
class Results:
    measurements: list[Measurement] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    catch_ups: list[CatchUp] = field(default_factory=list)
    undelivered_records: int = 0


def run_rounds(args: argparse.Namespace) -> Results:
    results = Results()
    for round_no in range(1, args.rounds + 1):
        # Each set-up goes first in one round of three.
        shift = (round_no - 1) % len(SETUPS)
        order = SETUPS[shift:] + SETUPS[:shift]
        for case in COMPARED_CASES:
            if case not in args.case_list:
                continue
            for setup in order:
                m = COMPARED[case](args, setup)
                m.case, m.round = case, round_no
                results.measurements.append(m)
                results.undelivered_records += m.details.get("undelivered", 0)
                print(f"# round {round_no} {case:10} {setup.key:6} {m.values} {m.details}",
                      flush=True)
        if "catch-up" in args.case_list:
            c = run_catch_up(args, round_no)
            results.catch_ups.append(c)
            print(f"# round {round_no} catch-up   {c}", flush=True)
        if "failover" in args.case_list:
            count = kills_in_round(args.kills, args.rounds, round_no)
            ttls = args.ttl_list if round_no % 2 else list(reversed(args.ttl_list))
            for ttl in ttls if count else []:
                print(f"# round {round_no} failover   lease TTL {ttl} s, {count} kills",
                      flush=True)
                kills, failed = run_failover(ttl, count, round_no)
                results.kills += kills
                results.undelivered_records += failed
    return results


def case_figures(measurements: Sequence[Measurement], metric: peers.Metric,
                 setup_keys: Sequence[str]) -> tuple[list[Measurement],
                                                     dict[str, tuple[float, float, float]]]:
    """The measurements of `metric`'s case, and (median, min, max) of the
    metric per setup that has any (also bench/security.py's table)."""
    mine = [m for m in measurements if m.case == metric.case]
    figures = {key: spread([m.values[metric.key] for m in mine if m.setup == key])
               for key in setup_keys if any(m.setup == key for m in mine)}
    return mine, figures


def setup_table(measurements: Sequence[Measurement], cases: Sequence[str]) -> list[TableRow]:
    rows: list[TableRow] = []
    for metric in METRICS:
        if metric.case not in cases:
            continue
        mine, figures = case_figures(measurements, metric, [s.key for s in SETUPS])
        ratios = [a.values[metric.key] / b.values[metric.key]
                  for a in mine if a.setup == RF3.key
                  for b in mine if b.setup == RF1.key and b.round == a.round
                  and b.values[metric.key]]
        rows.append(TableRow(metric.label, metric.unit, metric.higher_is_better, figures,
                             spread(ratios) if ratios else None))
    return rows


def failover_table(kills: Sequence[Kill], ttls: Sequence[int]) -> list[FailoverRow]:
    rows = []
    for ttl in ttls:
        mine = [k for k in kills if k.lease_ttl_s == ttl]
        if not mine:
            continue
        times = [k.failover_s for k in mine]
        hit = [k.failover_s for k in mine if k.controller]
        missed = [k.failover_s for k in mine if not k.controller]
        elected = [k.elected_s for k in mine if k.elected_s is not None]
        rows.append(FailoverRow(
            ttl, len(mine), statistics.median(times), pipeline.percentile(times, 0.99),
            max(times), 2.0 * ttl, sum(1 for t in times if t <= 2 * ttl), len(hit),
            statistics.median(hit) if hit else None,
            statistics.median(missed) if missed else None,
            statistics.median(elected) if elected else None,
            statistics.median(k.rejoin_s for k in mine)))
    return rows


def catch_up_table(catch_ups: Sequence[CatchUp]) -> dict[str, tuple[float, float, float]]:
    if not catch_ups:
        return {}
    return {
        "log_mb": spread([c.log_bytes / MB for c in catch_ups]),
        "serving_s": spread([c.serving_s for c in catch_ups]),
        "in_sync_s": spread([c.in_sync_s for c in catch_ups]),
        "mb_per_s": spread([c.mb_per_s for c in catch_ups]),
    }


def render(rows: Sequence[TableRow], failover: Sequence[FailoverRow],
           catch_up: dict[str, tuple[float, float, float]]) -> str:
    lines: list[str] = []
    if rows:
        lines += ["| measure | " + " | ".join(s.title for s in SETUPS) + " | RF 3 / RF 1 |",
                  "|---" * (len(SETUPS) + 2) + "|"]
        for r in rows:
            better = "higher is better" if r.higher_is_better else "lower is better"
            ratio = "—" if r.ratio is None else cell(r.ratio, "ratio")
            lines.append(f"| {r.label} ({better}) | "
                         + " | ".join(cell(r.figures.get(s.key), r.unit) for s in SETUPS)
                         + f" | {ratio} |")
    if failover:
        if lines:
            lines.append("")
        lines += ["| lease TTL | kills | failover p50 | p99 | max | target (2 x TTL) | "
                  "kills within it | p50, controller killed too / not | "
                  "new leader in Metadata, p50 | restart until whole again, p50 |",
                  "|---" * 10 + "|"]

        def seconds(x: float | None) -> str:
            return "—" if x is None else f"{x:.2f} s"

        for f in failover:
            lines.append(f"| {f.lease_ttl_s} s | {f.kills} | {f.p50_s:.2f} s | {f.p99_s:.2f} s "
                         f"| {f.max_s:.2f} s | {f.target_s:.0f} s | "
                         f"{f.within_target} of {f.kills} | {seconds(f.controller_p50_s)} "
                         f"({f.controller_kills} kills) / {seconds(f.others_p50_s)} | "
                         f"{seconds(f.elected_p50_s)} | {f.rejoin_p50_s:.1f} s |")
    if catch_up:
        if lines:
            lines.append("")
        lines += ["| catch-up of a wiped store (RF 3, 4 partitions) | median (min–max) |",
                  "|---|---|",
                  f"| the topic's log | {cell(catch_up['log_mb'], 'MB')} |",
                  f"| restart until serving | {cell(catch_up['serving_s'], 's')} |",
                  f"| restart until back in every ISR | {cell(catch_up['in_sync_s'], 's')} |",
                  f"| catch-up rate | {cell(catch_up['mb_per_s'], 'MB/s')} |"]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="how long each produce case sends")
    parser.add_argument("--latency-samples", type=int, default=500)
    parser.add_argument("--kills", type=int, default=20,
                        help="leaders killed for each lease TTL, over all rounds")
    parser.add_argument("--lease-ttls", default=",".join(map(str, DEFAULT_LEASE_TTLS_S)),
                        help="comma-separated lease TTLs in seconds, one failover row each")
    parser.add_argument("--catch-up-mb", type=float, default=200.0,
                        help="MB (10^6 bytes) of 1 KiB records to fill before the wipe")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--coordinators-in-stores", action="store_true",
                        help="run the transaction and group coordinators in the stores' "
                             "processes (docs/coordinator.md, 'The coordinator in a store')")
    parser.add_argument("--json", help="also write every round and the tables to this file")
    args = parser.parse_args(argv)
    args.case_list = [c for c in args.cases.split(",") if c]
    unknown = [c for c in args.case_list if c not in CASES]
    if unknown or not args.case_list:
        parser.error(f"--cases: {', '.join(unknown) or 'none given'}; known: {', '.join(CASES)}")
    try:
        args.ttl_list = [int(t) for t in args.lease_ttls.split(",") if t]
    except ValueError:
        parser.error(f"--lease-ttls is {args.lease_ttls!r}; expected whole seconds, e.g. 3,2")
    if not args.ttl_list or min(args.ttl_list) < 1:
        parser.error(f"--lease-ttls is {args.lease_ttls!r}; each must be >= 1")
    if args.rounds < 1:
        parser.error(f"--rounds is {args.rounds}; it must be >= 1")
    if args.seconds <= 0 or args.latency_samples < 1 or args.catch_up_mb <= 0:
        parser.error("--seconds, --latency-samples and --catch-up-mb must be positive")
    if args.kills < 1:
        parser.error(f"--kills is {args.kills}; it must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> Report:
    global COORDINATORS_IN_STORES
    args = parse_args(argv)
    COORDINATORS_IN_STORES = args.coordinators_in_stores
    cases = [c for c in CASES if c in args.case_list]
    print(f"# {os.cpu_count()} CPUs; {args.rounds} round(s); {args.seconds:g} s per produce "
          f"case; {args.latency_samples} latency samples; {args.kills} kills per lease TTL "
          f"({', '.join(f'{t} s' for t in args.ttl_list)}); catch-up {args.catch_up_mb:g} MB; "
          f"cases {', '.join(cases)}; coordinators "
          f"{'in the stores' if COORDINATORS_IN_STORES else 'in processes of their own'}; "
          f"Python {sys.version.split()[0]}", flush=True)
    results = run_rounds(args)
    report = Report(setup_table(results.measurements, cases),
                    failover_table(results.kills, args.ttl_list),
                    catch_up_table(results.catch_ups), results.undelivered_records)
    print()
    print(f"medians of {args.rounds} round(s) (min–max over the rounds); RF 3 / RF 1 is taken "
          f"per round; failover: percentiles over all kills")
    print(render(report.rows, report.failover, report.catch_up), flush=True)
    if report.undelivered_records:
        print(f"\nWARNING: {report.undelivered_records} records sent were never acknowledged "
              f"(see the rounds above)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": {k: v for k, v in vars(args).items()},
                       "measurements": [asdict(m) for m in results.measurements],
                       "kills": [asdict(k) for k in results.kills],
                       "catch_ups": [asdict(c) for c in results.catch_ups],
                       "report": asdict(report)}, f, indent=2)
    return report


if __name__ == "__main__":
    main()
