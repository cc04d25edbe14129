"""The admin side of the Kafka listener, asked by clients no one here wrote.

Goal: what Kafka's admin tools ask answers as Kafka's broker would:
librdkafka's AdminClient lists and describes consumer groups (their
protocol, members, assignments and committed offsets) and grows a topic
(CreatePartitions); a static member (group.instance.id) that restarts takes
its partitions back without a rebalance; and the transaction tools' APIs —
ListTransactions, DescribeTransactions, DescribeProducers, which
confluent-kafka's Python AdminClient does not expose — describe an open
transaction of a librdkafka producer (its state, partitions, and the first
offset it holds on each partition) and its end.

Method: one LocalCluster with a Kafka listener; librdkafka clients as their
users configure them; the transaction APIs as raw requests encoded and
decoded by kio (classes generated from Kafka's schemas, tests/support/
kafka_wire.py). No assertion depends on timing.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import confluent_kafka as ck
import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from oncelog.testing import LocalCluster
from tests.support.kafka_wire import KafkaSocket, request_class

DESCRIBE_PRODUCERS, DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 61, 65, 66
# Failure guards, not expectations.
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("kafka-admin") / "cluster", kafka_listener=True,
                      extra_args={"group_coordinator": ["--initial-rebalance-delay-ms",
                                                        "200"]}) as c:
        yield c


def admin(cluster: LocalCluster) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})


def create(cluster: LocalCluster, topic: str, partitions: int) -> None:
    # The client must outlive its futures (librdkafka ends them when it goes).
    client = admin(cluster)
    for future in client.create_topics([NewTopic(topic, num_partitions=partitions)]).values():
        future.result(timeout=DEADLINE_S)


def consume_until(consumer: ck.Consumer, count: int) -> int:
    """Polls until `count` records arrived; how many did."""
    got = 0
    deadline = time.monotonic() + DEADLINE_S
    while got < count and time.monotonic() < deadline:
        message = consumer.poll(0.3)
        if message is not None and message.error() is None:
            got += 1
            consumer.commit(message=message, asynchronous=False)
    return got


def test_groups_are_listed_and_described_with_their_offsets(cluster: LocalCluster) -> None:
    topic, group = "admin-groups", "admin-groups-g"
    create(cluster, topic, 2)
    producer = ck.Producer({"bootstrap.servers": cluster.kafka_bootstrap})
    for i in range(10):
        producer.produce(topic, value=b"%d" % i, partition=i % 2)
    assert producer.flush(DEADLINE_S) == 0
    consumer = ck.Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": group,
                            "auto.offset.reset": "earliest", "enable.auto.commit": False,
                            "client.id": "described-member"})
    consumer.subscribe([topic])
    try:
        assert consume_until(consumer, 10) == 10
        client = admin(cluster)
        listed = client.list_consumer_groups().result(timeout=DEADLINE_S)
        assert group in {g.group_id for g in listed.valid}
        [described] = client.describe_consumer_groups([group]).values()
        description = described.result(timeout=DEADLINE_S)
        assert description.state == ck.ConsumerGroupState.STABLE
        [member] = description.members
        assert member.client_id == "described-member"
        assert {tp.partition for tp in member.assignment.topic_partitions} == {0, 1}
        [offsets] = client.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group)]).values()
        committed = {tp.partition: tp.offset for tp in offsets.result(timeout=DEADLINE_S)
                     .topic_partitions}
        assert committed == {0: 5, 1: 5}
    finally:
        consumer.close()


def test_a_static_member_restarts_without_a_rebalance(cluster: LocalCluster) -> None:
    topic, group = "admin-static", "admin-static-g"
    create(cluster, topic, 2)

    def member(instance: str) -> ck.Consumer:
        consumer = ck.Consumer({"bootstrap.servers": cluster.kafka_bootstrap,
                                "group.id": group, "group.instance.id": instance,
                                "session.timeout.ms": 20000, "auto.offset.reset": "earliest"})
        consumer.subscribe([topic])
        return consumer

    def assignment(consumer: ck.Consumer) -> set[int]:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            consumer.poll(0.2)
            owned = {tp.partition for tp in consumer.assignment()}
            if owned:
                return owned
        return set()

    first, second = member("static-a"), member("static-b")
    try:
        a_owned, b_owned = assignment(first), assignment(second)
        generation = second.consumer_group_metadata()
        # Both own theirs once the group settled (the second join rebalanced).
        deadline = time.monotonic() + DEADLINE_S
        while (a_owned & b_owned or a_owned | b_owned != {0, 1}) and \
                time.monotonic() < deadline:
            first.poll(0.2)
            second.poll(0.2)
            a_owned = {tp.partition for tp in first.assignment()}
            b_owned = {tp.partition for tp in second.assignment()}
        assert a_owned | b_owned == {0, 1} and not a_owned & b_owned
        client = admin(cluster)
        [before] = client.describe_consumer_groups([group]).values()
        members_before = {m.group_instance_id: m.member_id
                          for m in before.result(timeout=DEADLINE_S).members}
        # A static member's close leaves the group's membership as it is
        # (KIP-345): its partitions wait for it within the session timeout.
        first.close()
        first = member("static-a")
        assert assignment(first) == a_owned
        # The other member was not rebalanced: it still owns what it owned.
        second.poll(0.5)
        assert {tp.partition for tp in second.assignment()} == b_owned
        [after] = client.describe_consumer_groups([group]).values()
        members_after = {m.group_instance_id: m.member_id
                         for m in after.result(timeout=DEADLINE_S).members}
        assert set(members_after) == {"static-a", "static-b"}
        assert members_after["static-b"] == members_before["static-b"]
        assert generation is not None
    finally:
        first.close()
        second.close()


def test_create_partitions_grows_a_topic(cluster: LocalCluster) -> None:
    topic = "admin-grow"
    create(cluster, topic, 2)
    client = admin(cluster)
    client.create_partitions([NewPartitions(topic, 5)])[topic].result(timeout=DEADLINE_S)
    assert len(client.list_topics(topic, timeout=DEADLINE_S).topics[topic].partitions) == 5
    shrink = client.create_partitions([NewPartitions(topic, 3)])[topic]
    with pytest.raises(ck.KafkaException) as refused:
        shrink.result(timeout=DEADLINE_S)
    assert refused.value.args[0].code() == ck.KafkaError.INVALID_PARTITIONS
    producer = ck.Producer({"bootstrap.servers": cluster.kafka_bootstrap})
    delivered: list[int | None] = []
    producer.produce(topic, value=b"new", partition=4,
                     on_delivery=lambda error, message: delivered.append(
                         None if error else message.offset()))
    assert producer.flush(DEADLINE_S) == 0
    assert delivered == [0]


def _request(api_key: int, version: int, **fields: Any) -> Any:
    return request_class(api_key, version)(**fields)


def _classes(api_key: int, version: int) -> Any:
    return sys.modules[request_class(api_key, version).__module__]


def test_the_transaction_tools_describe_an_open_transaction(cluster: LocalCluster) -> None:
    topic, transactional_id = "admin-txn", "admin-txn-id"
    create(cluster, topic, 2)
    producer = ck.Producer({"bootstrap.servers": cluster.kafka_bootstrap,
                            "transactional.id": transactional_id})
    producer.init_transactions(DEADLINE_S)
    producer.begin_transaction()
    producer.produce(topic, value=b"open", partition=1)
    assert producer.flush(DEADLINE_S) == 0
    sock = KafkaSocket(cluster.kafka_bootstrap.split(",")[0])
    try:
        listed = sock.request(_request(LIST_TRANSACTIONS, 1, state_filters=(),
                                       producer_id_filters=(), duration_filter=-1))
        states = {t.transactional_id: t.transaction_state for t in listed.transaction_states}
        assert states.get(transactional_id) == "Ongoing"
        described = sock.request(_request(DESCRIBE_TRANSACTIONS, 0,
                                          transactional_ids=(transactional_id,)))
        [state] = described.transaction_states
        assert int(state.error_code.value) == 0
        assert state.transaction_state == "Ongoing"
        assert {(t.topic, p) for t in state.topics for p in t.partitions} == {(topic, 1)}
        producer_id = int(state.producer_id)
        classes = _classes(DESCRIBE_PRODUCERS, 0)
        answer = sock.request(_request(DESCRIBE_PRODUCERS, 0, topics=(
            classes.TopicRequest(name=topic, partition_indexes=(1,)),)))
        [topic_answer] = answer.topics
        [partition] = topic_answer.partitions
        active = {int(p.producer_id): int(p.current_txn_start_offset)
                  for p in partition.active_producers}
        assert active == {producer_id: 0}
        producer.commit_transaction(DEADLINE_S)
        # Its end, from ListTransactions: DescribeTransactions of an ended
        # transaction answers a start time of -1 (none, as Kafka's broker),
        # which kio's decoder refuses to read as a time.
        state_now = ""
        deadline = time.monotonic() + DEADLINE_S
        while state_now != "CompleteCommit" and time.monotonic() < deadline:
            listed = sock.request(_request(LIST_TRANSACTIONS, 1, state_filters=(),
                                           producer_id_filters=(), duration_filter=-1))
            state_now = {t.transactional_id: t.transaction_state
                         for t in listed.transaction_states}[transactional_id]
            time.sleep(0.1)
        assert state_now == "CompleteCommit"
    finally:
        sock.close()
