"""Kafka clients no one here wrote, unchanged, against the stores' Kafka listener.

Goal: what a team gets by pointing its Kafka clients at oncelog — librdkafka
(confluent-kafka), kafka-python, aiokafka and kcat (Debian's, on Debian's
librdkafka) produce, consume, administer topics (create, grow, describe,
delete) and read their offsets with oncelog as the broker; records they
write are read back exactly as written (keys, values, headers, partitions,
offsets in order) by another client.

Method: one LocalCluster with a Kafka listener for the module (one store;
the replicated cluster is test_kafka_exactly_once.py's), a topic per test,
each client as its users call it, with its defaults except the bootstrap
address (and idempotence where the test says so). What one client writes,
a different client reads. No assertion depends on timing: reads poll until
they have what they expect or a generous deadline passes.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka as ck
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import admin as ck_admin
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTopicPartition
from kafka.admin import NewPartitions as KpNewPartitions
from kafka.errors import InvalidPartitionsError as KpInvalidPartitionsError

from oncelog.testing import LocalCluster

# Failure guards, not expectations.
DEADLINE_S = 60.0
KCAT_TIMEOUT_S = 60.0

Record = tuple[int, int, bytes | None, bytes | None]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # A short initial rebalance delay: each group here is joined by its
    # members at once, and the default (3 s, Kafka's) only slows the tests.
    with LocalCluster(tmp_path_factory.mktemp("kafka") / "cluster", kafka_listener=True,
                      extra_args={"group_coordinator": ["--initial-rebalance-delay-ms",
                                                        "200"]}) as c:
        yield c


def create_topic(cluster: LocalCluster, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    for future in admin.create_topics([NewTopic(name, num_partitions=partitions,
                                                replication_factor=-1)]).values():
        future.result(timeout=DEADLINE_S)


def _record(message: ck.Message) -> Record:
    partition, offset = message.partition(), message.offset()
    assert partition is not None and offset is not None
    return partition, offset, message.key(), message.value()


def read_with_librdkafka(cluster: LocalCluster, topic: str, partitions: int,
                         count: int) -> list[Record]:
    consumer = ck.Consumer({"bootstrap.servers": cluster.kafka_bootstrap,
                            "group.id": f"reader-{topic}", "enable.auto.commit": False})
    consumer.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING)
                     for p in range(partitions)])
    got: list[Record] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while len(got) < count and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append(_record(message))
    finally:
        consumer.close()
    return got


def test_librdkafka_idempotent_produce_read_by_kafka_python(cluster: LocalCluster) -> None:
    topic = "rd-idempotent"
    create_topic(cluster, topic, 3)
    producer = ck.Producer({"bootstrap.servers": cluster.kafka_bootstrap,
                            "enable.idempotence": True, "linger.ms": 5})
    delivered: list[Record] = []

    def on_delivery(error: ck.KafkaError | None, message: ck.Message) -> None:
        assert error is None, error
        delivered.append(_record(message))

    for i in range(300):
        producer.produce(topic, key=b"k%d" % (i % 7), value=b"v%d" % i,
                         headers=[("n", str(i).encode())], on_delivery=on_delivery)
    assert producer.flush(DEADLINE_S) == 0
    assert len(delivered) == 300
    # Each partition's offsets run 0..n-1, in the order produced.
    for p in range(3):
        offsets = [o for part, o, _k, _v in delivered if part == p]
        assert offsets == list(range(len(offsets)))

    consumer = KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap,
                             auto_offset_reset="earliest", enable_auto_commit=False)
    consumer.assign([KpTopicPartition(topic, p) for p in range(3)])
    consumer.seek_to_beginning()
    got: list[Record] = []
    headers: dict[bytes | None, list[tuple[str, bytes]]] = {}
    deadline = time.monotonic() + DEADLINE_S
    while len(got) < 300 and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=500).values():
            for r in records:
                got.append((r.partition, r.offset, r.key, r.value))
                headers[r.value] = list(r.headers)
    consumer.close()
    assert sorted(got) == sorted(delivered)
    assert headers[b"v42"] == [("n", b"42")]


def test_kafka_python_produce_read_by_librdkafka(cluster: LocalCluster) -> None:
    topic = "kp-produce"
    create_topic(cluster, topic, 2)
    producer = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap, enable_idempotence=True,
                             acks="all")
    metas = [producer.send(topic, key=b"key-%d" % (i % 3), value=b"value-%d" % i).get(
        timeout=DEADLINE_S) for i in range(50)]
    producer.close()
    sent = sorted((m.partition, m.offset) for m in metas)
    got = read_with_librdkafka(cluster, topic, 2, 50)
    assert sorted((p, o) for p, o, _k, _v in got) == sent
    assert sorted(v for _p, _o, _k, v in got if v is not None) == sorted(
        b"value-%d" % i for i in range(50))


def test_aiokafka_produce_and_consume(cluster: LocalCluster) -> None:
    topic = "aio-produce"
    create_topic(cluster, topic, 2)

    async def run() -> list[Record]:
        producer = AIOKafkaProducer(bootstrap_servers=cluster.kafka_bootstrap,
                                    enable_idempotence=True)
        await producer.start()
        try:
            for i in range(40):
                await producer.send_and_wait(topic, key=b"a%d" % (i % 4), value=b"%d" % i)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap,
                                    auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        got: list[Record] = []
        try:
            consumer.assign([AioTopicPartition(topic, p) for p in range(2)])
            await consumer.seek_to_beginning()
            deadline = time.monotonic() + DEADLINE_S
            while len(got) < 40 and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=500)
                for records in batches.values():
                    got += [(r.partition, r.offset, r.key, r.value) for r in records]
        finally:
            await consumer.stop()
        return got

    got = asyncio.run(run())
    assert sorted(v for _p, _o, _k, v in got if v is not None) == sorted(
        b"%d" % i for i in range(40))
    for p in range(2):
        offsets = [o for part, o, _k, _v in got if part == p]
        assert offsets == list(range(len(offsets)))


def test_librdkafka_admin_creates_describes_and_lists(cluster: LocalCluster) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    created = admin.create_topics([NewTopic("admin-made", num_partitions=4,
                                            replication_factor=-1,
                                            config={"retention.ms": "3600000"})])
    created["admin-made"].result(timeout=DEADLINE_S)
    again = admin.create_topics([NewTopic("admin-made", num_partitions=4)])
    with pytest.raises(ck.KafkaException) as exists:
        again["admin-made"].result(timeout=DEADLINE_S)
    assert exists.value.args[0].code() == ck.KafkaError.TOPIC_ALREADY_EXISTS
    listed = admin.list_topics(timeout=DEADLINE_S)
    assert len(listed.topics["admin-made"].partitions) == 4
    # Internal topics hold our own records: they are not listed.
    assert not any(name.startswith("__") for name in listed.topics)
    [described] = admin.describe_configs([ConfigResource("topic", "admin-made")]).values()
    configs = described.result(timeout=DEADLINE_S)
    assert configs["retention.ms"].value == "3600000"
    assert not configs["retention.ms"].is_default
    assert configs["cleanup.policy"].value == "delete"
    cluster_info = admin.describe_cluster().result(timeout=DEADLINE_S)
    assert [n.id for n in cluster_info.nodes] == [0]
    deleted = admin.delete_topics(["admin-made"])
    deleted["admin-made"].result(timeout=DEADLINE_S)
    assert "admin-made" not in admin.list_topics(timeout=DEADLINE_S).topics


def test_librdkafka_and_kafka_python_grow_a_topic(cluster: LocalCluster) -> None:
    """CreatePartitions from two clients' admin APIs: validate_only changes
    nothing, a grown topic takes records on its new partitions at once, and
    a count that does not grow is refused with INVALID_PARTITIONS."""
    topic = "admin-grown"
    create_topic(cluster, topic, 2)
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    checked = admin.create_partitions([ck_admin.NewPartitions(topic, 4)], validate_only=True)
    checked[topic].result(timeout=DEADLINE_S)
    assert len(admin.list_topics(timeout=DEADLINE_S).topics[topic].partitions) == 2
    grown = admin.create_partitions([ck_admin.NewPartitions(topic, 4)])
    grown[topic].result(timeout=DEADLINE_S)
    assert len(admin.list_topics(timeout=DEADLINE_S).topics[topic].partitions) == 4
    shrink = admin.create_partitions([ck_admin.NewPartitions(topic, 3)])
    with pytest.raises(ck.KafkaException) as refused:
        shrink[topic].result(timeout=DEADLINE_S)
    assert refused.value.args[0].code() == ck.KafkaError.INVALID_PARTITIONS
    assert "has 4 partitions; 3 would not be an increase" in refused.value.args[0].str()

    kp_admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap)
    try:
        kp_admin.create_partitions({topic: KpNewPartitions(6)})
        with pytest.raises(KpInvalidPartitionsError):
            kp_admin.create_partitions({topic: KpNewPartitions(6)})
    finally:
        kp_admin.close()
    assert len(admin.list_topics(timeout=DEADLINE_S).topics[topic].partitions) == 6
    producer = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap)
    try:
        for p in range(6):
            producer.send(topic, value=b"on-%d" % p, partition=p).get(timeout=DEADLINE_S)
    finally:
        producer.close()
    got = read_with_librdkafka(cluster, topic, 6, 6)
    assert sorted((p, o, v) for p, o, _k, v in got) == [(p, 0, b"on-%d" % p) for p in range(6)]


def test_kcat_lists_produces_and_consumes(cluster: LocalCluster, tmp_path: Path) -> None:
    topic = "kcat-topic"
    create_topic(cluster, topic, 2)
    bootstrap = cluster.kafka_bootstrap
    listing = subprocess.run(["kcat", "-b", bootstrap, "-L", "-t", topic], capture_output=True,
                             text=True, timeout=KCAT_TIMEOUT_S, check=True).stdout
    assert f'topic "{topic}" with 2 partitions' in listing
    lines = [f"key{i}:value{i}" for i in range(20)]
    subprocess.run(["kcat", "-b", bootstrap, "-P", "-t", topic, "-K:"],
                   input="\n".join(lines) + "\n", capture_output=True, text=True,
                   timeout=KCAT_TIMEOUT_S, check=True)
    consumed = subprocess.run(
        ["kcat", "-b", bootstrap, "-C", "-t", topic, "-o", "beginning", "-e", "-q",
         "-f", "%k:%s\n"], capture_output=True, text=True, timeout=KCAT_TIMEOUT_S,
        check=True).stdout
    assert sorted(consumed.split()) == sorted(lines)


# --------------------------------------------------------------------- groups


def test_a_librdkafka_group_of_two_shares_the_partitions_and_commits(
        cluster: LocalCluster) -> None:
    """Two members of one group (the classic protocol, the client-side
    range assignor): each partition is read by one member at a time, every
    record is read, and the committed offsets are where each member stopped;
    a member of the same group that comes later starts from them."""
    topic, group = "rd-group", "rd-group-g"
    create_topic(cluster, topic, 4)
    producer = ck.Producer({"bootstrap.servers": cluster.kafka_bootstrap})
    for i in range(200):
        producer.produce(topic, key=b"%d" % i, value=b"%d" % i)
    assert producer.flush(DEADLINE_S) == 0

    def member() -> ck.Consumer:
        consumer = ck.Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": group,
                                "auto.offset.reset": "earliest", "enable.auto.commit": False,
                                "isolation.level": "read_committed"})
        consumer.subscribe([topic])
        return consumer

    members = [member(), member()]
    read: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
    deadline = time.monotonic() + DEADLINE_S
    try:
        while sum(len(r) for r in read.values()) < 200 and time.monotonic() < deadline:
            for i, consumer in enumerate(members):
                message = consumer.poll(0.2)
                if message is None or message.error() is not None:
                    continue
                partition, offset = message.partition(), message.offset()
                assert partition is not None and offset is not None
                read[i].append((partition, offset))
                consumer.commit(message=message, asynchronous=False)
        assignments = [{tp.partition for tp in c.assignment()} for c in members]
    finally:
        for consumer in members:
            consumer.close()
    everything = read[0] + read[1]
    assert len(everything) == len(set(everything)) == 200
    # After the last rebalance, each member owned its own partitions.
    assert assignments[0] & assignments[1] == set()
    assert assignments[0] | assignments[1] == {0, 1, 2, 3}
    later = member()
    try:
        committed = later.committed([ck.TopicPartition(topic, p) for p in range(4)],
                                    timeout=DEADLINE_S)
    finally:
        later.close()
    ends = {p: max(o for part, o in everything if part == p) + 1 for p in range(4)}
    assert {tp.partition: tp.offset for tp in committed} == ends


def test_a_kafka_python_group_reads_and_commits(cluster: LocalCluster) -> None:
    topic, group = "kp-group", "kp-group-g"
    create_topic(cluster, topic, 2)
    producer = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap)
    for i in range(30):
        producer.send(topic, value=b"%d" % i)
    producer.flush()
    producer.close()
    consumer = KafkaConsumer(topic, bootstrap_servers=cluster.kafka_bootstrap, group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             consumer_timeout_ms=5000)
    values = sorted(int(r.value) for r in consumer)
    consumer.commit()
    consumer.close()
    assert values == list(range(30))
    again = KafkaConsumer(topic, bootstrap_servers=cluster.kafka_bootstrap, group_id=group,
                          auto_offset_reset="earliest", consumer_timeout_ms=3000)
    assert list(again) == []
    again.close()


def test_an_aiokafka_group_reads_and_commits(cluster: LocalCluster) -> None:
    topic, group = "aio-group", "aio-group-g"
    create_topic(cluster, topic, 2)

    async def run() -> tuple[list[bytes], dict[int, int]]:
        producer = AIOKafkaProducer(bootstrap_servers=cluster.kafka_bootstrap)
        await producer.start()
        try:
            for i in range(30):
                await producer.send(topic, value=b"%d" % i, partition=i % 2)
            await producer.flush()
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=cluster.kafka_bootstrap,
                                    group_id=group, auto_offset_reset="earliest",
                                    enable_auto_commit=False)
        await consumer.start()
        values: list[bytes] = []
        try:
            deadline = time.monotonic() + DEADLINE_S
            while len(values) < 30 and time.monotonic() < deadline:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    values += [r.value for r in records if r.value is not None]
            await consumer.commit()
            committed = {p: await consumer.committed(AioTopicPartition(topic, p))
                         for p in range(2)}
        finally:
            await consumer.stop()
        return values, {p: int(o) for p, o in committed.items() if o is not None}

    values, committed = asyncio.run(run())
    assert sorted(int(v) for v in values) == list(range(30))
    assert committed == {0: 15, 1: 15}


# --------------------------------------------------------------- transactions


def committed_values(cluster: LocalCluster, topic: str, partitions: int,
                     expected: int) -> list[bytes]:
    """What librdkafka reads under read_committed, once `expected` records
    arrived and nothing more comes for a while."""
    consumer = ck.Consumer({"bootstrap.servers": cluster.kafka_bootstrap,
                            "group.id": f"committed-{topic}", "enable.auto.commit": False,
                            "isolation.level": "read_committed"})
    consumer.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING)
                     for p in range(partitions)])
    values: list[bytes] = []
    quiet_since = time.monotonic()
    deadline = time.monotonic() + DEADLINE_S
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.3)
            if message is None or message.error() is not None:
                if len(values) >= expected and time.monotonic() - quiet_since > 2:
                    break
                continue
            quiet_since = time.monotonic()
            value = message.value()
            assert value is not None
            values.append(value)
    finally:
        consumer.close()
    return values


def test_a_kafka_python_transaction_commits_and_aborts(cluster: LocalCluster) -> None:
    topic = "kp-txn"
    create_topic(cluster, topic, 2)
    producer = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap,
                             transactional_id="kp-txn-id")
    producer.init_transactions()
    for outcome in ("commit", "abort", "commit2"):
        producer.begin_transaction()
        for i in range(5):
            producer.send(topic, value=b"%s-%d" % (outcome.encode(), i))
        if outcome == "abort":
            producer.abort_transaction()
        else:
            producer.commit_transaction()
    producer.close()
    values = committed_values(cluster, topic, 2, 10)
    assert sorted(values) == sorted(b"%s-%d" % (o, i) for o in (b"commit", b"commit2")
                                    for i in range(5))


def test_an_aiokafka_transaction_commits_and_aborts(cluster: LocalCluster) -> None:
    topic = "aio-txn"
    create_topic(cluster, topic, 2)

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=cluster.kafka_bootstrap,
                                    transactional_id="aio-txn-id")
        await producer.start()
        try:
            for outcome in ("commit", "abort", "commit2"):
                await producer.begin_transaction()
                for i in range(5):
                    await producer.send(topic, value=b"%s-%d" % (outcome.encode(), i))
                if outcome == "abort":
                    await producer.abort_transaction()
                else:
                    await producer.commit_transaction()
        finally:
            await producer.stop()

    asyncio.run(run())
    values = committed_values(cluster, topic, 2, 10)
    assert sorted(values) == sorted(b"%s-%d" % (o, i) for o in (b"commit", b"commit2")
                                    for i in range(5))


def test_a_stale_generation_cannot_commit_transactional_offsets(cluster: LocalCluster) -> None:
    """KIP-447: offsets sent in a transaction with the group metadata of a
    generation that a rebalance has ended are refused, so a zombie that lost
    its partitions cannot commit their offsets."""
    topic, group = "kip447", "kip447-g"
    create_topic(cluster, topic, 2)

    def member() -> ck.Consumer:
        consumer = ck.Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": group,
                                "auto.offset.reset": "earliest", "enable.auto.commit": False})
        consumer.subscribe([topic])
        return consumer

    def wait_assigned(consumer: ck.Consumer, *others: ck.Consumer) -> None:
        """Polls `others` too: a member that is not polled does not rejoin,
        and the rebalance then waits for its session to end."""
        deadline = time.monotonic() + DEADLINE_S
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.2)
            for other in others:
                other.poll(0.2)

    first = member()
    second: ck.Consumer | None = None
    producer = ck.Producer({"bootstrap.servers": cluster.kafka_bootstrap,
                            "transactional.id": "kip447-tx"})
    try:
        wait_assigned(first)
        stale = first.consumer_group_metadata()
        # A second member joins: the group rebalances into a new generation.
        second = member()
        wait_assigned(second, first)
        deadline = time.monotonic() + DEADLINE_S
        while len(first.assignment()) != 1 and time.monotonic() < deadline:
            first.poll(0.2)
            second.poll(0.2)
        producer.init_transactions(DEADLINE_S)
        producer.begin_transaction()
        with pytest.raises(ck.KafkaException) as refused:
            producer.send_offsets_to_transaction([ck.TopicPartition(topic, 0, 1)], stale,
                                                 DEADLINE_S)
        assert refused.value.args[0].code() in (ck.KafkaError.ILLEGAL_GENERATION,
                                                ck.KafkaError.UNKNOWN_MEMBER_ID,
                                                ck.KafkaError.FENCED_INSTANCE_ID)
        producer.abort_transaction(DEADLINE_S)
    finally:
        first.close()
        if second is not None:
            second.close()
