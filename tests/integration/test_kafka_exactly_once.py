"""Exactly-once over Kafka's protocol, with clients no one here wrote.

Goal: a Kafka client's transactional read-process-write pipeline keeps the
same promise as our SDK's: every input record appears in the output
exactly once and the group's offsets are committed exactly once, while a
partition store, the transaction coordinator and the group coordinator
are killed with kill -9 on a replicated cluster (3 stores, RF 3, etcd).
And a Kafka client and our SDK share transactions: what one commits the
other reads under read_committed, what one aborts the other never sees.
Both hold with the coordinators as processes of their own, and with
either kind alone in the stores' processes (a mixed placement, which the
Helm chart allows; the kill -9 run in a mixed placement is a slow test).

Method: a LocalCluster with 3 stores and etcd, every store with a Kafka
listener, once per placement. The pipeline is
tests/support/kafka_copier.py (confluent-kafka only) run as its own
process; the test kills a store and each coordinator under it (its
process, or the store that runs it) and restarts them, starting the
copier again when it ends with a fatal error (a new instance fences the
old one, as a supervisor would).
The output is read back under read_committed by a separate librdkafka
consumer and compared with the input, value by value; the group's
committed offsets with the input's end offsets. No assertion depends on
timing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from oncelog import Consumer, Producer, TopicPartition
from oncelog.testing import LocalCluster

REPO = Path(__file__).resolve().parents[2]
RECORDS = 6000
PARTITIONS = 3
# Small transactions, so that the faults land while many are in flight.
RECORDS_PER_TXN = 40
# Failure guards, not expectations.
DEADLINE_S = 240.0
READ_DEADLINE_S = 90.0


# Where the coordinators run: each kind as processes of its own, or one
# kind in the stores and the other alone (Helm's coordinator.inStores and
# groupCoordinator.inStores set apart); both in the stores is
# test_group_coordinator_in_store.py's.
PLACEMENTS = {"alone": (), "transaction-coordinator-in-stores": ("coordinator",),
              "group-coordinator-in-stores": ("group_coordinator",)}


@pytest.fixture(scope="module", params=list(PLACEMENTS))
def cluster(request: pytest.FixtureRequest,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    in_stores = PLACEMENTS[request.param]
    group_args = ["--initial-rebalance-delay-ms", "300"]
    with LocalCluster(tmp_path_factory.mktemp("kafka-eos") / "cluster", partition_stores=3,
                      etcd_members=1, kafka_listener=True, coordinators_in_stores=in_stores,
                      extra_args={"partition_store" if "group_coordinator" in in_stores
                                  else "group_coordinator": group_args}) as c:
        yield c


def host_store(cluster: LocalCluster, kind: str, key: str) -> int | None:
    """The store whose process runs the coordinator of `key`; None when
    that kind runs as processes of its own."""
    try:
        return cluster.store_running(kind, key)
    except ValueError:
        return None


def kill_coordinator(cluster: LocalCluster, kind: str, key: str) -> None:
    """kill -9 of the coordinator of `key` (its process, or the store whose
    process runs it), and a restart a second later: a coordinator in a
    store is that store's, and serves again only once it is back."""
    store = host_store(cluster, kind, key)
    kind, index = (kind, 0) if store is None else ("partition_store", store)
    cluster.kill(kind, index)
    time.sleep(1)
    cluster.restart(kind, index)


def create_topics(cluster: LocalCluster, *names: str) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    for future in admin.create_topics([NewTopic(n, num_partitions=PARTITIONS,
                                                replication_factor=3) for n in names]).values():
        future.result(timeout=60)


def fill(cluster: LocalCluster, topic: str, count: int) -> None:
    producer = ck.Producer({"bootstrap.servers": cluster.kafka_bootstrap,
                            "enable.idempotence": True})
    for i in range(count):
        producer.produce(topic, key=b"k%d" % (i % 50), value=b"%d" % i)
        producer.poll(0)
    assert producer.flush(60) == 0


def read_committed(cluster: LocalCluster, topic: str, expected: int) -> list[bytes]:
    consumer = ck.Consumer({"bootstrap.servers": cluster.kafka_bootstrap,
                            "group.id": f"checker-{topic}-{time.monotonic_ns()}",
                            "isolation.level": "read_committed",
                            "enable.auto.commit": False})
    consumer.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING)
                     for p in range(PARTITIONS)])
    values: list[bytes] = []
    idle_since = time.monotonic()
    deadline = time.monotonic() + READ_DEADLINE_S
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                # Past the expected count, a few idle seconds prove no more comes.
                if len(values) >= expected and time.monotonic() - idle_since > 3:
                    break
                continue
            idle_since = time.monotonic()
            value = message.value()
            assert value is not None
            values.append(value)
    finally:
        consumer.close()
    return values


def end_offsets(cluster: LocalCluster, topic: str) -> dict[int, int]:
    consumer = ck.Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "ends"})
    try:
        return {p: consumer.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=30)[1]
                for p in range(PARTITIONS)}
    finally:
        consumer.close()


def committed(cluster: LocalCluster, group: str, topic: str) -> dict[int, int]:
    consumer = ck.Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": group})
    try:
        return {tp.partition: tp.offset for tp in consumer.committed(
            [ck.TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30)}
    finally:
        consumer.close()


class Progress:
    """How far the copier is: the group's committed offsets, summed."""

    def __init__(self, cluster: LocalCluster, group: str, topic: str) -> None:
        self._consumer = ck.Consumer({"bootstrap.servers": cluster.kafka_bootstrap,
                                      "group.id": group})
        self._topic = topic

    def close(self) -> None:
        self._consumer.close()

    def wait_for(self, records: int) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            try:
                offsets = self._consumer.committed(
                    [ck.TopicPartition(self._topic, p) for p in range(PARTITIONS)], timeout=5)
            except ck.KafkaException:
                offsets = []
            if sum(max(tp.offset, 0) for tp in offsets) >= records:
                return
            time.sleep(0.2)
        raise AssertionError(f"the copier did not reach {records} records")


class Copier:
    """kafka_copier.py as a process, started again after a fatal error."""

    def __init__(self, cluster: LocalCluster, source: str, target: str, group: str) -> None:
        self.argv = [sys.executable, "-m", "tests.support.kafka_copier",
                     cluster.kafka_bootstrap, source, target, group, f"{group}-txn",
                     str(RECORDS), str(RECORDS_PER_TXN)]
        self.reports: list[str] = []
        self.restarts = 0

    def run(self) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            result = subprocess.run(self.argv, cwd=REPO, capture_output=True, text=True,
                                    timeout=DEADLINE_S, check=False)
            self.reports.append(result.stdout.strip() or result.stderr[-2000:])
            if result.returncode == 0:
                return
            self.restarts += 1
        raise AssertionError(f"the copier did not finish: {self.reports}")


# The kill -9 run takes about half a minute per placement: the default run
# has the default placement (each kind alone), the slow tests
# (scripts/test-slow.sh) the two mixed ones too, to keep the default run
# within its time budget on two cores.
@pytest.mark.parametrize("cluster", [
    pytest.param(name, marks=[] if name == "alone" else [pytest.mark.slow])
    for name in PLACEMENTS], indirect=True)
def test_librdkafka_read_process_write_under_kill_9_is_exactly_once(
        cluster: LocalCluster) -> None:
    source, target, group = "eos-in", "eos-out", "eos-copier"
    create_topics(cluster, source, target)
    fill(cluster, source, RECORDS)
    copier = Copier(cluster, source, target, group)
    worker = threading.Thread(target=copier.run)
    worker.start()
    # Faults while it copies, each once the copier has made some progress: a
    # store (a replica, and the leader of some partitions), then the
    # transaction coordinator.
    progress = Progress(cluster, group, source)
    progress.wait_for(RECORDS // 5)
    # A store that runs neither coordinator of the copier: the copier goes
    # on while it is down (its partitions fail over).
    hosts = {host_store(cluster, "coordinator", f"{group}-txn"),
             host_store(cluster, "group_coordinator", group)}
    down = next(store for store in (1, 2, 0) if store not in hosts)
    cluster.kill("partition_store", down)
    progress.wait_for(RECORDS * 2 // 5)
    cluster.restart("partition_store", down)
    kill_coordinator(cluster, "coordinator", f"{group}-txn")
    progress.wait_for(RECORDS * 3 // 5)
    kill_coordinator(cluster, "group_coordinator", group)
    progress.close()
    worker.join(DEADLINE_S + 30)
    assert not worker.is_alive(), "the copier did not finish"
    output = read_committed(cluster, target, RECORDS)
    counts = Counter(output)
    duplicated = {v: n for v, n in counts.items() if n > 1}
    missing = {b"%d" % i for i in range(RECORDS)} - set(counts)
    assert duplicated == {} and missing == set(), (duplicated, sorted(missing)[:20],
                                                  copier.reports)
    assert committed(cluster, group, source) == end_offsets(cluster, source)
    assert json.loads(copier.reports[-1])["committed"] >= 1


def test_sdk_transactions_read_by_librdkafka_and_the_reverse(cluster: LocalCluster) -> None:
    """Our SDK commits one transaction and aborts one; librdkafka reading
    read_committed sees exactly the committed one. librdkafka commits one
    and aborts one; our SDK sees exactly its committed one. Both share one
    topic, partition by partition, in one log."""
    topic = "mixed"
    create_topics(cluster, topic)
    with Producer(bootstrap=cluster.bootstrap_servers, transactional_id="sdk-tx") as ours:
        ours.init_transactions()
        for outcome in ("commit", "abort"):
            ours.begin_transaction()
            for i in range(10):
                ours.send(topic, value=b"sdk-%s-%d" % (outcome.encode(), i), partition=i % 3)
            if outcome == "commit":
                ours.commit_transaction()
            else:
                ours.abort_transaction()
    theirs = ck.Producer({"bootstrap.servers": cluster.kafka_bootstrap,
                          "transactional.id": "rd-tx"})
    theirs.init_transactions(60)
    for outcome in ("commit", "abort"):
        theirs.begin_transaction()
        for i in range(10):
            theirs.produce(topic, value=b"rd-%s-%d" % (outcome.encode(), i), partition=i % 3)
        if outcome == "commit":
            theirs.commit_transaction(60)
        else:
            theirs.abort_transaction(60)
    committed_values = {b"%s-commit-%d" % (who, i) for who in (b"sdk", b"rd") for i in range(10)}

    seen_by_librdkafka = read_committed(cluster, topic, len(committed_values))
    assert sorted(seen_by_librdkafka) == sorted(committed_values)

    seen_by_sdk: list[bytes] = []
    with Consumer(bootstrap=cluster.bootstrap_servers, isolation_level="read_committed") as sdk:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        sdk.assign(partitions)
        for tp in partitions:
            sdk.seek(tp, 0)
        deadline = time.monotonic() + READ_DEADLINE_S
        while len(seen_by_sdk) < len(committed_values) and time.monotonic() < deadline:
            seen_by_sdk += [r.value for r in sdk.poll(timeout=0.5) if r.value is not None]
        # Nothing more comes: the aborted records are never delivered.
        seen_by_sdk += [r.value for r in sdk.poll(timeout=2.0) if r.value is not None]
    assert sorted(seen_by_sdk) == sorted(committed_values)
