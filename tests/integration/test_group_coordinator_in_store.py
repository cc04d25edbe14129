"""A group coordinator that runs in a partition store's process.

Goal: with `--group-coordinator` (LocalCluster(coordinators_in_stores=True),
which also places the transaction coordinators there) the group calls the
store's Kafka listener forwards, and the group coordinator's reads and
appends of `__consumer_offsets` at that store, take no gRPC, while what
they do is unchanged: a Kafka client's transactional copier (consume ->
produce -> send_offsets_to_transaction -> commit) copies every record once
and commits the group's offsets; an SDK consumer group's transactional
offsets stay pending until the transaction ends, are fenced by the
group's generation and member (KIP-447), and survive kill -9 of the store
that runs the group's coordinator, and a transaction left open by the
kill commits none of its offsets. Secured, the ACLs decide what the
hosted coordinators answer a principal. The flag's misuses and the placement
rule are checked beside the transaction coordinator's
(test_coordinator_in_store.py).

Method: LocalCluster with real processes (one store for the gRPC counts,
where every call between the services would otherwise cross into it; two
for the kill, which takes the store that runs the group's coordinator).
Which calls crossed gRPC is read from the services' RPC interceptor
counters on the store's metrics port; the SDK's own OffsetFetch, which
does cross, shows the counters count group calls at all.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from oncelog import Admin, Consumer, ConsumerRecord, GroupMetadata, Producer, TopicPartition, errors
from oncelog.testing import LocalCluster
from tests.support.reading import poll_records
from tests.support.secure_clients import admin_of, allow, grant
from tests.support.store_metrics import rpc_requests, store_metric

PARTITIONS = 2
RECORDS = 60
RECORDS_PER_TXN = 10
GROUP = "copier"
# Failure guard, not an expectation.
DEADLINE_S = 90.0
# Every group call a Kafka client's consumer and transactional producer make.
GROUP_METHODS = ("JoinGroup", "SyncGroup", "ClassicHeartbeat", "LeaveGroup", "OffsetCommit",
                 "TxnOffsetCommit", "OffsetFetch", "ConsumerGroupHeartbeat")
# A new classic group's first rebalance waits this long for more members.
STORE_ARGS = ["--initial-rebalance-delay-ms", "100"]


@pytest.fixture
def kafka_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path / "cluster", kafka_listener=True, coordinators_in_stores=True,
                      extra_args={"partition_store": STORE_ARGS}) as c:
        yield c


def copy_with_librdkafka(cluster: LocalCluster, source: str, sink: str) -> None:
    """Kafka's exactly-once copier: RECORDS_PER_TXN records a transaction,
    each committing the group's offsets with the records it wrote."""
    consumer = ck.Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": GROUP,
                            "enable.auto.commit": False, "auto.offset.reset": "earliest",
                            "isolation.level": "read_committed"})
    producer = ck.Producer({"bootstrap.servers": cluster.kafka_bootstrap,
                            "transactional.id": "copier-txn"})
    try:
        producer.init_transactions(30)
        consumer.subscribe([source])
        copied = 0
        deadline = time.monotonic() + DEADLINE_S
        while copied < RECORDS:
            assert time.monotonic() < deadline, f"copied {copied} of {RECORDS} records"
            messages = [m for m in consumer.consume(RECORDS_PER_TXN, 1.0) if m.error() is None]
            if not messages:
                continue
            producer.begin_transaction()
            for message in messages:
                producer.produce(sink, value=message.value())
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30)
            producer.commit_transaction(30)
            copied += len(messages)
    finally:
        consumer.close()


def test_a_kafka_clients_group_calls_and_the_group_coordinators_log_stay_in_the_process(
        kafka_cluster: LocalCluster, topic_name: str) -> None:
    cluster = kafka_cluster
    assert cluster.processes["group_coordinator"] == []
    with pytest.raises(ValueError, match="group coordinator 0 is no process of its own: it "
                                         "runs in partition store 0"):
        cluster.kill("group_coordinator", 0)
    source, sink = f"{topic_name}-in", f"{topic_name}-out"
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    for future in admin.create_topics([NewTopic(name, num_partitions=PARTITIONS)
                                       for name in (source, sink)]).values():
        future.result(timeout=60)
    producer = ck.Producer({"bootstrap.servers": cluster.kafka_bootstrap,
                            "enable.idempotence": True})
    for i in range(RECORDS):
        producer.produce(source, value=b"%d" % i, partition=i % PARTITIONS)
    assert producer.flush(60) == 0

    copy_with_librdkafka(cluster, source, sink)

    checker = ck.Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": GROUP})
    try:
        committed = {tp.partition: tp.offset for tp in checker.committed(
            [ck.TopicPartition(source, p) for p in range(PARTITIONS)], timeout=30)}
    finally:
        checker.close()
    assert committed == {p: RECORDS // PARTITIONS for p in range(PARTITIONS)}
    # The group calls of the consumer and of the transactional producer
    # (TxnOffsetCommit, one per transaction) went through the Kafka
    # listener to the coordinator in its process; the coordinator's
    # appends of `__consumer_offsets` (and the transaction coordinator's of
    # `__transaction_state`) and its reads of them did not cross gRPC either:
    # a Kafka client makes no gRPC call of its own.
    for method in GROUP_METHODS:
        assert rpc_requests(cluster, "GroupCoordinator", method) == 0, method
    for method in ("ProduceStream", "Produce", "Fetch"):
        assert rpc_requests(cluster, "PartitionStore", method) == 0, method
    # The store's verification of each transactional offsets batch with the
    # transaction coordinator, which the same process runs (one InProcess
    # answers for both kinds), did not cross either.
    for method in ("AddPartitionsToTxnStream", "AddPartitionsToTxn"):
        assert rpc_requests(cluster, "TransactionCoordinator", method) == 0, method

    # The output holds every input record once (read back with the SDK,
    # whose calls do cross gRPC: the counters count at this process).
    with Consumer(bootstrap=cluster.bootstrap, group_id=GROUP) as consumer:
        tps = [TopicPartition(source, p) for p in range(PARTITIONS)]
        assert consumer.committed(tps) == {tp: RECORDS // PARTITIONS for tp in tps}
    assert rpc_requests(cluster, "GroupCoordinator", "OffsetFetch") >= 1
    values = read_back(cluster, sink)
    assert sorted(values) == sorted(b"%d" % i for i in range(RECORDS))


def read_back(cluster: LocalCluster, topic: str) -> list[bytes]:
    consumer = ck.Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": "checker",
                            "isolation.level": "read_committed"})
    consumer.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING)
                     for p in range(PARTITIONS)])
    values: list[bytes] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while len(values) < RECORDS and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value() or b"")
    finally:
        consumer.close()
    return values


def test_kill_9_of_the_store_that_runs_the_group_coordinator_loses_no_committed_offset(
        tmp_path: Path, topic_name: str) -> None:
    stores, group = 2, "sdk-group"
    with LocalCluster(tmp_path / "cluster", partition_stores=stores,
                      coordinators_in_stores=True, consumer_offsets_partitions=4,
                      extra_args={"partition_store": STORE_ARGS}) as cluster:
        host = cluster.store_running("group_coordinator", group)
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic(topic_name, partitions=PARTITIONS)
        with Producer(bootstrap=cluster.bootstrap) as producer:
            for i in range(RECORDS):
                producer.send(topic_name, value=b"%d" % i, partition=i % PARTITIONS)
        tps = [TopicPartition(topic_name, p) for p in range(PARTITIONS)]
        first = Producer(bootstrap=cluster.bootstrap, transactional_id="offsets")
        consumer = Consumer(bootstrap=cluster.bootstrap, group_id=group,
                            auto_offset_reset="earliest")
        try:
            consumer.subscribe([topic_name])
            poll_records(consumer, RECORDS, deadline_s=DEADLINE_S)
            # The group lives in that store's process.
            assert store_metric(cluster, "oncelog_group_members", host, group=group) == 1
            first.init_transactions()
            # KIP-447 holds there: offsets of a generation the group is not
            # at, or of a member it does not have, are refused.
            meta = consumer.group_metadata()
            for zombie, error in (
                    (GroupMetadata(group, meta.generation_id + 5, meta.member_id),
                     errors.FencedMemberEpochError),
                    (GroupMetadata(group, meta.generation_id, "no-such-member"),
                     errors.UnknownMemberIdError)):
                first.begin_transaction()
                with pytest.raises(errors.TransactionAbortableError) as raised:
                    first.send_offsets_to_transaction({tp: 1 for tp in tps}, zombie)
                assert isinstance(raised.value.__cause__, error), raised.value
                first.abort_transaction()
            first.begin_transaction()
            done = {tp: consumer.position(tp) for tp in tps}
            first.send_offsets_to_transaction(done, consumer.group_metadata())
            first.commit_transaction()
            # A second transaction holds offsets past those, pending, when
            # the store that runs the group's coordinator dies.
            first.begin_transaction()
            first.send_offsets_to_transaction({tp: RECORDS for tp in tps},
                                              consumer.group_metadata())
            cluster.kill("partition_store", host)
        finally:
            consumer.close(timeout=1)
            first.close(timeout=1)
        cluster.restart("partition_store", host)

        # The successor's init ends the open transaction (aborted: it was
        # never decided), and its offsets with it.
        with Producer(bootstrap=cluster.bootstrap, transactional_id="offsets") as successor:
            successor.init_transactions()
        with Consumer(bootstrap=cluster.bootstrap, group_id=group) as checker:
            assert checker.committed(tps, timeout=60) == done
        assert done == {tp: RECORDS // PARTITIONS for tp in tps}


def test_the_acls_decide_the_calls_a_hosted_coordinator_answers(tmp_path: Path) -> None:
    """Secured, the coordinators in the stores answer a principal only what
    its ACLs allow, as the ones alone do: the store's gRPC server checks
    their methods by the same rules (services/common/security/operations.py)."""
    with LocalCluster(tmp_path / "cluster", security=True, coordinators_in_stores=True,
                      extra_args={"partition_store": STORE_ARGS}) as cluster:
        with admin_of(cluster) as admin:
            admin.create_topic("in", partitions=1)
            admin.create_topic("out", partitions=1)
        with Producer(bootstrap=cluster.bootstrap, **cluster.client_config("admin")) as producer:
            producer.send("in", value=b"one", partition=0).result(timeout=60)
        alice = cluster.client_config("alice")
        grant(cluster, allow("User:alice", "topic", "in", "read"))
        tp = TopicPartition("in", 0)
        # No Read on the group: its coordinator refuses the join.
        with Consumer(bootstrap=cluster.bootstrap, group_id="billing",
                      auto_offset_reset="earliest", **alice) as consumer:
            consumer.subscribe(["in"])
            with pytest.raises(errors.GroupAuthorizationFailedError, match="billing"):
                deadline = time.monotonic() + DEADLINE_S
                while time.monotonic() < deadline:
                    consumer.poll(timeout=0.5)
        # No Write on the transactional id: the transaction coordinator
        # refuses its producer id.
        with Producer(bootstrap=cluster.bootstrap, transactional_id="billing-0",
                      **alice) as producer, \
                pytest.raises(errors.TransactionalIdAuthorizationFailedError):
            producer.init_transactions()
        grant(cluster, [*allow("User:alice", "group", "billing", "read"),
                        *allow("User:alice", "topic", "out", "write"),
                        *allow("User:alice", "transactional_id", "billing-0", "write")])
        with Consumer(bootstrap=cluster.bootstrap, group_id="billing",
                      auto_offset_reset="earliest", **alice) as consumer, \
                Producer(bootstrap=cluster.bootstrap, transactional_id="billing-0",
                         **alice) as producer:
            consumer.subscribe(["in"])
            records: list[ConsumerRecord] = []
            deadline = time.monotonic() + DEADLINE_S
            while not records and time.monotonic() < deadline:
                records = consumer.poll(timeout=0.5)
            assert [r.value for r in records] == [b"one"]
            producer.init_transactions()
            producer.begin_transaction()
            producer.send("out", value=b"ONE", partition=0)
            producer.send_offsets_to_transaction({tp: 1}, consumer.group_metadata())
            producer.commit_transaction()
        with Consumer(bootstrap=cluster.bootstrap, group_id="billing", **alice) as checker:
            assert checker.committed([tp], timeout=60) == {tp: 1}
