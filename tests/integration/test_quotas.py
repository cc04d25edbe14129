"""Quota push-back: a store with a small producer byte rate throttles the
client that goes over it, through our SDK and through Kafka's protocol.

Goal: a producer offering several times its quota gets answers with a
throttle time (the SDK's `produce_throttle_time` shows them, and the store's
metrics count them), and every record it sent is read back exactly once; a
client under another client id is not throttled; a consumer over its
consumer quota is throttled and still reads everything exactly once;
librdkafka (confluent-kafka) is told the throttle (its `throttle_cb`) by
the Kafka listener, producing and fetching, and its consumer reads every
record once; on a secured cluster a principal's override throttles
that principal and not another with the same client id; a bad quota flag
stops the store at start with a message naming the flag.

Method: one LocalCluster (one store with a Kafka listener) whose store runs
with `--producer-byte-rate` 20,000 B/s over windows of 11 x 100 ms (so the
first burst that passes is 20 KB and the throttles are short), and a
consumer quota for the client id `slow-reader` only. Each client writes
80 records of 1 KB, four times what passes unthrottled. Assertions are on
what was throttled and what was read, never on how long anything took;
reads poll until they have everything or a generous deadline passes. The
principal case has a secured cluster of its own.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka as ck
import pytest

from oncelog import Admin, Consumer, Producer, TopicPartition
from oncelog.testing import LocalCluster
from tests.support.reading import read_all as read_all_records
from tests.support.secure_clients import allow, grant

PRODUCER_BYTE_RATE = 20_000
CONSUMER_BYTE_RATE = 20_000
RECORDS = 80
RECORD_BYTES = 1_000
# Failure guards, not expectations.
DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    store_args = [
        "--producer-byte-rate", str(PRODUCER_BYTE_RATE),
        "--quota-window-size-ms", "100",
        # The reader that checks the others' records is exempt; slow-reader
        # has a consumer quota.
        "--client-quotas",
        f"client-id=checker:producer_byte_rate=0,consumer_byte_rate=0;"
        f"client-id=slow-reader:consumer_byte_rate={CONSUMER_BYTE_RATE}",
    ]
    with LocalCluster(tmp_path_factory.mktemp("quotas") / "cluster", kafka_listener=True,
                      group_coordinators=0,
                      extra_args={"partition_store": store_args}) as c:
        yield c


def values(tag: str) -> list[bytes]:
    return [f"{tag}-{i:05d}-".encode().ljust(RECORD_BYTES, b"x") for i in range(RECORDS)]


def create_topic(cluster: LocalCluster, topic: str) -> None:
    with Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=1)


def read_all(cluster: LocalCluster, topic: str, count: int, *,
             client_id: str = "checker") -> tuple[list[bytes], Consumer]:
    consumer = Consumer(bootstrap=cluster.bootstrap, client_id=client_id,
                        max_partition_fetch_bytes=4_096)
    consumer.assign([TopicPartition(topic, 0)])
    got: list[bytes] = []
    stop_at = time.monotonic() + DEADLINE_S
    while len(got) < count and time.monotonic() < stop_at:
        got.extend(r.value for r in consumer.poll(timeout=0.5))
    # A last poll: anything beyond `count` would be a duplicate.
    got.extend(r.value for r in consumer.poll(timeout=0.5))
    return got, consumer


def store_metric(cluster: LocalCluster, line_prefix: str) -> float:
    port = cluster.processes["partition_store"][0].metrics_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        body = answer.read().decode()
    total = 0.0
    for line in body.splitlines():
        if line.startswith(line_prefix):
            total += float(line.rsplit(" ", 1)[1])
    return total


def produce(cluster: LocalCluster, topic: str, client_id: str,
            records: list[bytes]) -> Producer:
    producer = Producer(bootstrap=cluster.bootstrap, client_id=client_id)
    futures = [producer.send(topic, value=v) for v in records]
    producer.flush(timeout=DEADLINE_S)
    for future in futures:
        future.result(timeout=DEADLINE_S)
    return producer


def test_a_producer_over_its_quota_is_throttled_and_loses_nothing(
        cluster: LocalCluster, topic_name: str) -> None:
    create_topic(cluster, topic_name)
    flood = values("flood")
    calm = values("calm")[:5]
    with produce(cluster, topic_name, "flooder", flood) as flooder:
        throttled = flooder.produce_throttle_time
    with produce(cluster, topic_name, "calm", calm) as calm_producer:
        untouched = calm_producer.produce_throttle_time
    assert throttled.count > 0 and throttled.max_ms > 0, throttled
    assert untouched.count == 0, untouched
    got, reader = read_all(cluster, topic_name, len(flood) + len(calm))
    with reader:
        assert reader.fetch_throttle_time.count == 0
    assert sorted(got) == sorted(flood + calm)
    assert store_metric(
        cluster, 'oncelog_store_quota_throttled_requests_total{kind="produce"') >= throttled.count


def test_a_consumer_over_its_quota_is_throttled_and_reads_everything_once(
        cluster: LocalCluster, topic_name: str) -> None:
    create_topic(cluster, topic_name)
    records = values("read")
    # The checker is exempt from the producer quota.
    produce(cluster, topic_name, "checker", records).close()
    got, consumer = read_all(cluster, topic_name, len(records), client_id="slow-reader")
    with consumer:
        throttled = consumer.fetch_throttle_time
    assert throttled.count > 0, throttled
    assert sorted(got) == sorted(records)


def test_librdkafka_is_told_the_throttle_by_the_kafka_listener(
        cluster: LocalCluster, topic_name: str) -> None:
    create_topic(cluster, topic_name)
    events: list[int] = []

    def on_throttle(event: ck.ThrottleEvent) -> None:
        events.append(int(event.throttle_time * 1000))

    producer = ck.Producer({"bootstrap.servers": cluster.kafka_bootstrap,
                            "client.id": "kafka-flooder", "linger.ms": 5,
                            "throttle_cb": on_throttle})
    records = values("kafka")
    failures: list[str] = []

    def delivered(err: ck.KafkaError | None, _message: ck.Message) -> None:
        if err is not None:
            failures.append(str(err))

    # Two halves: the second goes after the first's answer (and its throttle).
    for half in (records[:RECORDS // 2], records[RECORDS // 2:]):
        for value in half:
            producer.produce(topic_name, value=value, on_delivery=delivered)
        assert producer.flush(DEADLINE_S) == 0
    stop_at = time.monotonic() + DEADLINE_S
    while not events and time.monotonic() < stop_at:
        producer.poll(0.2)
    assert failures == []
    assert events and max(events) > 0, events
    got, reader = read_all(cluster, topic_name, len(records))
    reader.close()
    assert sorted(got) == sorted(records)

    # librdkafka's consumer under the consumer quota of slow-reader: a
    # throttled fetch is answered with no partitions, as Kafka's broker
    # answers it; the consumer fetches again after the throttle.
    fetch_events: list[int] = []

    def on_fetch_throttle(event: ck.ThrottleEvent) -> None:
        fetch_events.append(int(event.throttle_time * 1000))

    consumer = ck.Consumer({"bootstrap.servers": cluster.kafka_bootstrap,
                            "client.id": "slow-reader", "group.id": f"{topic_name}-slow",
                            "enable.auto.commit": False, "max.partition.fetch.bytes": 4_096,
                            "throttle_cb": on_fetch_throttle})
    consumer.assign([ck.TopicPartition(topic_name, 0, ck.OFFSET_BEGINNING)])
    read: list[bytes] = []
    stop_at = time.monotonic() + DEADLINE_S
    try:
        while len(read) < len(records) and time.monotonic() < stop_at:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                read.append(message.value() or b"")
        # One more poll: anything beyond would be a duplicate.
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            read.append(message.value() or b"")
    finally:
        consumer.close()
    assert sorted(read) == sorted(records)
    assert fetch_events and max(fetch_events) > 0, fetch_events


@pytest.mark.parametrize(("flag", "value"), [
    ("--producer-byte-rate", "-1"),
    ("--client-quotas", "user=alice"),
    ("--quota-window-num", "1"),
])
def test_a_bad_quota_flag_stops_the_store_naming_it(tmp_path: Path,
                                                    flag: str, value: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "services.partition_store", "--data-dir", str(tmp_path),
         flag, value], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert flag in result.stderr


def test_a_principal_override_throttles_that_principal_only(tmp_path: Path,
                                                            topic_name: str) -> None:
    """The same through a secured cluster: the quota is alice's (her
    certificate's principal, whatever her client id), and bob, with the
    same client id, is not throttled."""
    store_args = ["--quota-window-size-ms", "100", "--client-quotas",
                  f"user=User:alice:producer_byte_rate={PRODUCER_BYTE_RATE}"]
    with LocalCluster(tmp_path / "cluster", security=True, group_coordinators=0,
                      extra_args={"partition_store": store_args}) as cluster:
        with Admin(bootstrap=cluster.bootstrap, **cluster.client_config("admin")) as admin:
            admin.create_topic(topic_name, partitions=1)
        grant(cluster, [binding for user in ("User:alice", "User:bob") for binding in (
            allow(user, "topic", topic_name, "write", "describe")
            + allow(user, "cluster", "oncelog-cluster", "idempotent_write"))])
        throttled = {}
        for user in ("alice", "bob"):
            with Producer(bootstrap=cluster.bootstrap, client_id="shared",
                          **cluster.client_config(user)) as producer:
                futures = [producer.send(topic_name, value=v) for v in values(user)]
                producer.flush(timeout=DEADLINE_S)
                for future in futures:
                    future.result(timeout=DEADLINE_S)
                throttled[user] = producer.produce_throttle_time
        assert throttled["alice"].count > 0, throttled
        assert throttled["bob"].count == 0, throttled
        got = read_all_records(cluster.bootstrap, topic_name, 1, deadline_s=DEADLINE_S,
                               **cluster.client_config("admin"))
        assert sorted(r.value for r in got) == sorted(values("alice") + values("bob"))
