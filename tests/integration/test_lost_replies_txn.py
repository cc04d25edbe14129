"""Transactions survive retries after lost replies, end to end.

Goal: when the reply of a transactional RPC is lost after the server acted on
it — EndTxn(commit), EndTxn(abort), InitProducerId, TxnOffsetCommit (whose
write adds the group's offsets partition: the SDK sends no AddOffsetsToTxn),
a Produce inside a transaction, and two-phase commit's
PrepareTransaction and CompleteTransaction — the SDK retries
transparently, as Kafka's producer does: the call the user made succeeds,
the retry is answered as the same decision (no second epoch bump, no second
transaction), read_committed readers see each committed record exactly once
at its offset and nothing of an aborted transaction, a group's committed
offsets are exactly those sent, the next transaction works, and a second
instance of the transactional id still fences the first with
ProducerFencedError. And a group consumer whose first join's answer is lost
joins once: its retried join names the member the first one created (the
member chooses its id), so no second member holds partitions until its
session times out.

Method: one LocalCluster (one partition store, one transaction coordinator,
one group coordinator) for the module; per test a ProxyMesh
(tests/support/grpc_proxy.py) puts a proxy in front of every process,
rewrites the addresses in Metadata and FindCoordinator replies so the SDK
only ever talks through the proxies, and drops the reply of the n-th
successful call of one method (the client sees UNAVAILABLE). The real
Producer and Consumer run through the mesh; results are read back directly
from the store and compared as exact (offset, value) lists. Each test checks
that the proxy really dropped the reply and that the SDK really retried.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import pytest

from oncelog import Admin, Consumer, Producer, TopicPartition, errors
from oncelog.testing import LocalCluster
from tests.support.grpc_proxy import (
    ADD_OFFSETS_TO_TXN,
    COMPLETE_TRANSACTION,
    CONSUMER_GROUP_HEARTBEAT,
    END_TXN,
    INIT_PRODUCER_ID,
    PREPARE_TRANSACTION,
    PRODUCE,
    TXN_OFFSET_COMMIT,
    DropPolicy,
    ProxyMesh,
)
from tests.support.reading import read_all

PARTITIONS = 2
WAIT_S = 30.0
_ids = itertools.count()

Log = dict[int, list[tuple[int, bytes]]]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("lost-replies") / "cluster",
                      consumer_offsets_partitions=2, transaction_state_partitions=2) as c:
        yield c


@pytest.fixture
def topic(cluster: LocalCluster, topic_name: str) -> str:
    with Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(topic_name, partitions=PARTITIONS)
    return topic_name


def tid() -> str:
    return f"lost-reply-{next(_ids)}"


def log_of(cluster: LocalCluster, topic: str, isolation_level: str) -> Log:
    """Each partition's records as (offset, value), read straight from the store."""
    out: Log = {p: [] for p in range(PARTITIONS)}
    for r in read_all(cluster.bootstrap, topic, PARTITIONS, isolation_level=isolation_level):
        out[r.partition].append((r.offset, r.value or b""))
    return out


def send_txn(producer: Producer, topic: str, tag: str, per_partition: int) -> None:
    """Sends `per_partition` records to each partition, in order."""
    for i in range(per_partition):
        for p in range(PARTITIONS):
            producer.send(topic, value=f"{tag}-{p}-{i}".encode(), partition=p)


def values(tag: str, p: int, per_partition: int) -> list[bytes]:
    return [f"{tag}-{p}-{i}".encode() for i in range(per_partition)]


def at(first_offset: int, vals: list[bytes]) -> list[tuple[int, bytes]]:
    return [(first_offset + i, v) for i, v in enumerate(vals)]


def test_lost_commit_reply_is_retried_as_the_same_commit(cluster: LocalCluster,
                                                         topic: str) -> None:
    n = 5
    with ProxyMesh.in_front_of(cluster, DropPolicy(drop={END_TXN: {1}})) as mesh, \
            Producer(bootstrap=mesh.bootstrap, transactional_id=tid()) as producer:
        producer.init_transactions()
        epoch = producer.producer_epoch
        producer.begin_transaction()
        send_txn(producer, topic, "t1", n)
        producer.commit_transaction()  # its first reply is lost
        assert mesh.policy.dropped_calls == [(END_TXN, 1)]
        assert mesh.policy.calls[END_TXN] == 2, "the SDK retried EndTxn once"
        # The retry was answered as the same commit: one bump, not two.
        assert producer.producer_epoch == epoch + 1
        assert producer.transaction_state == "ready"
        producer.begin_transaction()
        send_txn(producer, topic, "t2", n)
        producer.commit_transaction()
        assert producer.producer_epoch == epoch + 2
    # Per partition: t1 at 0..n-1, its marker at n, t2 at n+1..2n, marker 2n+1.
    expected = {p: at(0, values("t1", p, n)) + at(n + 1, values("t2", p, n))
                for p in range(PARTITIONS)}
    assert log_of(cluster, topic, "read_committed") == expected
    assert log_of(cluster, topic, "read_uncommitted") == expected


def test_lost_abort_reply_is_retried_as_the_same_abort(cluster: LocalCluster,
                                                       topic: str) -> None:
    n = 4
    with ProxyMesh.in_front_of(cluster, DropPolicy(drop={END_TXN: {1}})) as mesh, \
            Producer(bootstrap=mesh.bootstrap, transactional_id=tid()) as producer:
        producer.init_transactions()
        epoch = producer.producer_epoch
        producer.begin_transaction()
        send_txn(producer, topic, "aborted", n)
        producer.flush()  # in the log, so the abort has something to undo
        producer.abort_transaction()  # its first reply is lost
        assert mesh.policy.dropped_calls == [(END_TXN, 1)]
        assert mesh.policy.calls[END_TXN] == 2, "the SDK retried EndTxn once"
        assert producer.producer_epoch == epoch + 1
        assert producer.transaction_state == "ready"
        producer.begin_transaction()
        send_txn(producer, topic, "kept", n)
        producer.commit_transaction()
        assert producer.producer_epoch == epoch + 2
    # Per partition: the aborted records at 0..n-1, the abort marker at n,
    # the kept ones at n+1..2n.
    assert log_of(cluster, topic, "read_committed") == {
        p: at(n + 1, values("kept", p, n)) for p in range(PARTITIONS)}
    assert log_of(cluster, topic, "read_uncommitted") == {
        p: at(0, values("aborted", p, n)) + at(n + 1, values("kept", p, n))
        for p in range(PARTITIONS)}


def test_lost_init_producer_id_reply_then_fencing_works(cluster: LocalCluster,
                                                        topic: str) -> None:
    transactional_id = tid()
    policy = DropPolicy(drop={INIT_PRODUCER_ID: {1}})
    with ProxyMesh.in_front_of(cluster, policy) as mesh, \
            Admin(bootstrap=mesh.bootstrap) as admin:
        first = Producer(bootstrap=mesh.bootstrap, transactional_id=transactional_id)
        try:
            first.init_transactions()  # its first reply is lost
            assert policy.dropped_calls == [(INIT_PRODUCER_ID, 1)]
            assert policy.calls[INIT_PRODUCER_ID] == 2, "the SDK retried InitProducerId once"
            # The producer holds the id and epoch the coordinator has now
            # (the retry bumped the epoch the lost reply carried).
            # The lost reply carried epoch 0; the retry was a new
            # InitProducerId and bumped it, and the producer holds what the
            # coordinator has now.
            described = admin.describe_transaction(transactional_id)
            assert (described.state, described.producer_epoch) == ("Empty", 1)
            assert (first.producer_id, first.producer_epoch) == (described.producer_id, 1)
            first.begin_transaction()
            send_txn(first, topic, "first", 3)
            first.commit_transaction()
            first.begin_transaction()
            send_txn(first, topic, "zombie", 2)
            first.flush()
            with Producer(bootstrap=mesh.bootstrap,
                          transactional_id=transactional_id) as second:
                second.init_transactions()  # fences `first`, aborts its open transaction
                assert second.producer_id == first.producer_id
                assert second.producer_epoch > first.producer_epoch
                with pytest.raises(errors.ProducerFencedError):
                    first.commit_transaction()
                second.begin_transaction()
                send_txn(second, topic, "second", 2)
                second.commit_transaction()
        finally:
            first.close()
    # Per partition: first's 3 at 0..2, commit marker 3, the zombie's 2 at
    # 4..5, abort marker 6, second's 2 at 7..8.
    assert log_of(cluster, topic, "read_committed") == {
        p: at(0, values("first", p, 3)) + at(7, values("second", p, 2))
        for p in range(PARTITIONS)}


def test_lost_offset_replies_commit_the_offsets_exactly_as_sent(
        cluster: LocalCluster, topic: str, topic_name: str) -> None:
    """A read-process-write copier through the proxies: the first and the
    third TxnOffsetCommit replies are lost (the store added the offsets
    partition to the transaction before each lost reply)."""
    sink = f"{topic_name}-out"
    with Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(sink, partitions=PARTITIONS)
    inputs = {p: values("in", p, 6) for p in range(PARTITIONS)}
    with Producer(bootstrap=cluster.bootstrap) as plain:
        for p, vals in inputs.items():
            for v in vals:
                plain.send(topic, value=v, partition=p)
    group = f"copier-{topic}"
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    policy = DropPolicy(drop={TXN_OFFSET_COMMIT: {1, 3}})
    with ProxyMesh.in_front_of(cluster, policy) as mesh, \
            Consumer(bootstrap=mesh.bootstrap, group_id=group, isolation_level="read_committed",
                     max_poll_records=3) as consumer, \
            Producer(bootstrap=mesh.bootstrap, transactional_id=tid()) as producer:
        consumer.subscribe([topic])
        producer.init_transactions()
        copied: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
        committed: dict[TopicPartition, int | None] = {tp: None for tp in tps}
        transactions = 0
        deadline = time.monotonic() + WAIT_S
        while any(len(copied[p]) < len(inputs[p]) for p in range(PARTITIONS)):
            assert time.monotonic() < deadline, copied
            records = consumer.poll(timeout=0.2)
            if not records:
                continue
            producer.begin_transaction()
            for r in records:
                producer.send(sink, value=(r.value or b"").upper(), partition=r.partition)
                copied[r.partition].append(r.value or b"")
            offsets = {tp: consumer.position(tp) for tp in consumer.assignment()}
            producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
            producer.commit_transaction()
            transactions += 1
            # After every commit, the group's offsets are exactly those sent.
            committed.update(offsets)
            assert consumer.committed(tps) == committed
        assert policy.dropped_calls == [(TXN_OFFSET_COMMIT, 1), (TXN_OFFSET_COMMIT, 3)]
        # One retry for each lost reply; no AddOffsetsToTxn.
        assert policy.calls[TXN_OFFSET_COMMIT] == transactions + 2
        assert policy.calls[ADD_OFFSETS_TO_TXN] == 0
        assert consumer.committed(tps) == {tp: 6 for tp in tps}
        assert copied == inputs
    with Admin(bootstrap=cluster.bootstrap) as admin:
        assert {tp: o.offset for tp, o in admin.list_group_offsets(group).items()} == {
            tp: 6 for tp in tps}
    out = log_of(cluster, sink, "read_committed")
    assert {p: [v for _, v in out[p]] for p in out} == {
        p: [v.upper() for v in inputs[p]] for p in range(PARTITIONS)}


def test_lost_produce_reply_inside_a_transaction(cluster: LocalCluster, topic: str) -> None:
    n = 60
    # Small batches: many Produce calls per transaction, several in flight.
    policy = DropPolicy(drop={PRODUCE: {1, 4, 7}})
    with ProxyMesh.in_front_of(cluster, policy) as mesh, \
            Producer(bootstrap=mesh.bootstrap, transactional_id=tid(), linger_ms=1,
                     batch_size=256, max_in_flight=5) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        futures = [producer.send(topic, value=f"t1-{p}-{i}".encode(), partition=p)
                   for i in range(n) for p in range(PARTITIONS)]
        producer.commit_transaction()
        assert policy.dropped == 3, "the proxy must really have dropped replies"
        # Each future got the offset its record really has.
        assert [f.result(timeout=0).offset for f in futures] == [
            i for i in range(n) for _ in range(PARTITIONS)]
        producer.begin_transaction()
        send_txn(producer, topic, "t2", 3)
        producer.commit_transaction()
    expected = {p: at(0, values("t1", p, n)) + at(n + 1, values("t2", p, 3))
                for p in range(PARTITIONS)}
    assert log_of(cluster, topic, "read_committed") == expected
    assert log_of(cluster, topic, "read_uncommitted") == expected


def test_lost_prepare_and_complete_replies_two_phase_commit(cluster: LocalCluster,
                                                            topic: str) -> None:
    n = 3
    policy = DropPolicy(drop={PREPARE_TRANSACTION: {1}, COMPLETE_TRANSACTION: {1}})
    with ProxyMesh.in_front_of(cluster, policy) as mesh, \
            Producer(bootstrap=mesh.bootstrap, transactional_id=tid(),
                     transaction_two_phase_commit_enable=True) as producer:
        producer.init_transactions()
        epoch = producer.producer_epoch
        producer.begin_transaction()
        send_txn(producer, topic, "2pc", n)
        prepared = producer.prepare_transaction()  # its first reply is lost
        assert (prepared.producer_id, prepared.producer_epoch) == (
            producer.producer_id, epoch)
        assert producer.complete_transaction(prepared) is True  # first reply lost
        assert policy.dropped_calls == [(PREPARE_TRANSACTION, 1), (COMPLETE_TRANSACTION, 1)]
        assert policy.calls[PREPARE_TRANSACTION] == 2
        assert policy.calls[COMPLETE_TRANSACTION] == 2
        assert producer.producer_epoch == epoch + 1
        producer.begin_transaction()
        send_txn(producer, topic, "next", n)
        producer.commit_transaction()
    expected = {p: at(0, values("2pc", p, n)) + at(n + 1, values("next", p, n))
                for p in range(PARTITIONS)}
    assert log_of(cluster, topic, "read_committed") == expected
    assert log_of(cluster, topic, "read_uncommitted") == expected


def test_a_lost_join_answer_leaves_one_member_with_every_partition(
    cluster: LocalCluster, topic: str
) -> None:
    group = f"lost-join-{next(_ids)}"
    policy = DropPolicy(drop={CONSUMER_GROUP_HEARTBEAT: {1}})
    every = {TopicPartition(topic, p) for p in range(PARTITIONS)}
    # A session far longer than the wait: a second member made by the
    # retried join would keep its partitions for the whole test.
    with ProxyMesh.in_front_of(cluster, policy) as mesh, \
            Consumer(bootstrap=mesh.bootstrap, group_id=group,
                     session_timeout_ms=120_000) as consumer:
        consumer.subscribe([topic])
        deadline = time.monotonic() + WAIT_S
        while consumer.assignment() != every:
            assert time.monotonic() < deadline, (
                f"the member has {sorted(consumer.assignment())}, not every partition")
            consumer.poll(timeout=0.1)
        assert policy.dropped_calls == [(CONSUMER_GROUP_HEARTBEAT, 1)]
        with Admin(bootstrap=cluster.bootstrap) as admin:
            members = admin.describe_group(group).members
        assert len(members) == 1, members
