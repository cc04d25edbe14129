"""Growing a topic (CreatePartitions) on real clusters, single-copy and replicated.

Goal: a topic grown from 2 to 5 partitions takes produce and fetch on its
new partitions at once, on whichever store holds each; its existing
partitions keep their records; the store that made the change answers
Metadata with the new count at once and every other store soon after; the
count survives a crash and restart of the stores (single copy: the
controller's catalog record in RocksDB; replicated: etcd); shrinking, the
same count, an unknown or an internal topic are refused with typed errors
and change nothing, and so does validate_only; a group consumer subscribed
to the topic is assigned the new partitions by the group coordinator and
reads their records. The single-copy cluster also grows a topic through a
store that does not keep the catalog (forwarded to the one that does), and
through a proxy that loses the store's answer: Admin's retry, refused with
"already has N partitions", counts as done when N is the count it asked
for.

Method: one LocalCluster per kind (two stores without etcd; three stores
with one etcd member), the SDK's Admin, Producer and Consumer as an
application uses them, raw gRPC to each store's Metadata and to a
non-controller's CreatePartitions, a ProxyMesh (tests/support/grpc_proxy.py)
dropping chosen CreatePartitions answers after the store acted. Waits are
bounded polls on observable state (metadata, assignment, records read); no
assertion depends on timing.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc
import pytest

from oncelog import Admin, Consumer, Producer, TopicPartition, errors
from oncelog.testing import LocalCluster
from oncelog.v1 import partition_store_pb2 as ps
from oncelog.v1 import partition_store_pb2_grpc as ps_grpc
from tests.support.grpc_proxy import DropPolicy, ProxyMesh

CREATE_PARTITIONS = "/oncelog.v1.PartitionStore/CreatePartitions"

_ids = itertools.count()
WAIT_S = 60.0
BEFORE, AFTER = 2, 5
T = TypeVar("T")


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("grow-single") / "cluster", partition_stores=2,
                      transaction_state_partitions=1, consumer_offsets_partitions=1) as c:
        yield c


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("grow-replicated") / "cluster",
                      partition_stores=3, etcd_members=1, transaction_state_partitions=1,
                      consumer_offsets_partitions=1) as c:
        yield c


def _stub(cluster: LocalCluster, index: int) -> tuple[grpc.Channel, ps_grpc.PartitionStoreStub]:
    channel = grpc.insecure_channel(cluster.address("partition_store", index))
    return channel, ps_grpc.PartitionStoreStub(channel)


def partition_counts(cluster: LocalCluster, topic: str) -> list[int | None]:
    """The topic's partition count as each running store's Metadata answers
    it (None: the store did not answer, or did not know the topic)."""
    counts: list[int | None] = []
    for index in range(len(cluster.processes["partition_store"])):
        channel, stub = _stub(cluster, index)
        with channel:
            try:
                [meta] = stub.Metadata(ps.MetadataRequest(topics=[topic]), timeout=5).topics
            except grpc.RpcError:
                counts.append(None)
                continue
        counts.append(None if meta.error.code else len(meta.partitions))
    return counts


def eventually(value: Callable[[], T], done: Callable[[T], bool], what: str) -> T:
    deadline = time.monotonic() + WAIT_S
    while True:
        got = value()
        if done(got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last: {got!r}")
        time.sleep(0.05)


def produce(cluster: LocalCluster, topic: str, partitions: range, tag: str) -> None:
    """One record per partition: value b"<tag>-<partition>"."""
    with Producer(bootstrap=cluster.bootstrap_servers) as producer:
        futures = [producer.send(topic, value=f"{tag}-{p}".encode(), partition=p)
                   for p in partitions]
        for future in futures:
            future.result(timeout=WAIT_S)


def read_back(cluster: LocalCluster, topic: str, partitions: range) -> dict[int, list[bytes]]:
    """Every record of each partition, read from its start up to its end."""
    tps = [TopicPartition(topic, p) for p in partitions]
    with Consumer(bootstrap=cluster.bootstrap_servers) as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning(tps)
        ends = consumer.end_offsets(tps)
        got: dict[int, list[bytes]] = {p: [] for p in partitions}
        deadline = time.monotonic() + WAIT_S
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"read stopped short of {ends}"
            for record in consumer.poll(timeout=0.5):
                got[record.partition].append(record.value or b"")
    return got


def refusals(admin: Admin, topic: str) -> None:
    """What must be refused, and must leave the topic as it is."""
    with pytest.raises(errors.InvalidPartitionsError,
                       match=rf"'{topic}' has {BEFORE} partitions; 1 would not be an increase"):
        admin.create_partitions({topic: 1})
    with pytest.raises(errors.InvalidPartitionsError, match=f"already has {BEFORE} partitions"):
        admin.create_partitions({topic: BEFORE})
    with pytest.raises(errors.InvalidPartitionsError, match="got 10001"):
        admin.create_partitions({topic: 10_001})
    with pytest.raises(errors.UnknownTopicOrPartitionError, match="'no-such-topic'"):
        admin.create_partitions({"no-such-topic": 3})
    with pytest.raises(errors.InvalidRequestError, match="'__consumer_offsets' is internal"):
        admin.create_partitions({"__consumer_offsets": 4})
    # validate_only: the request is fine and nothing changes.
    admin.create_partitions({topic: AFTER}, validate_only=True)
    with pytest.raises(errors.InvalidPartitionsError):
        admin.create_partitions({topic: 1}, validate_only=True)
    with pytest.raises(TypeError, match="must be an int"):
        admin.create_partitions({topic: "5"})  # type: ignore[dict-item]


def grow_and_use(cluster: LocalCluster, *, catalog_store: int) -> str:
    """The whole scenario on one cluster; returns the grown topic's name.
    `catalog_store`: the store Admin's request goes to (the controller)."""
    topic = f"grow-{next(_ids)}"
    bootstrap = cluster.bootstrap_servers
    with Admin(bootstrap=bootstrap) as admin:
        admin.create_topic(topic, partitions=BEFORE)
    produce(cluster, topic, range(BEFORE), "before")
    group = f"{topic}-readers"
    with Consumer(bootstrap=bootstrap, group_id=group, auto_offset_reset="earliest",
                  session_timeout_ms=10_000) as member:
        member.subscribe([topic])
        seen: list[tuple[int, bytes]] = []

        def assigned() -> set[int]:
            seen.extend((r.partition, r.value or b"") for r in member.poll(timeout=0.2))
            return {tp.partition for tp in member.assignment()}

        eventually(assigned, lambda got: got == set(range(BEFORE)), "the first assignment")

        with Admin(bootstrap=bootstrap) as admin:
            refusals(admin, topic)
            assert admin.list_topics()[topic] == BEFORE
            assert partition_counts(cluster, topic) == [BEFORE] * len(
                cluster.processes["partition_store"])
            admin.create_partitions({topic: AFTER})
            # The store that made the change answers at once; the others
            # within their catalog refresh.
            assert partition_counts(cluster, topic)[catalog_store] == AFTER
            eventually(lambda: partition_counts(cluster, topic),
                       lambda got: got == [AFTER] * len(got), "every store's new count")
            assert len(admin.describe_topic(topic).partitions) == AFTER
            # Asking again for the same count is refused now (Kafka's rule).
            with pytest.raises(errors.InvalidPartitionsError,
                               match=f"already has {AFTER} partitions"):
                admin.create_partitions({topic: AFTER})

        produce(cluster, topic, range(AFTER), "after")
        expected = {p: ([b"before-%d" % p] if p < BEFORE else []) + [b"after-%d" % p]
                    for p in range(AFTER)}
        assert read_back(cluster, topic, range(AFTER)) == expected

        # The group coordinator notices the new count and assigns the new
        # partitions to the subscribed member, which reads them.
        eventually(assigned, lambda got: got == set(range(AFTER)), "the new partitions assigned")

        def read() -> list[tuple[int, bytes]]:
            seen.extend((r.partition, r.value or b"") for r in member.poll(timeout=0.2))
            return sorted(seen)

        eventually(read, lambda got: got == sorted((p, v) for p, vs in expected.items()
                                                   for v in vs),
                   "every record read by the group member")
    return topic


def test_single_copy_grows_through_the_controller_and_keeps_it_after_restarts(
        single: LocalCluster) -> None:
    topic = grow_and_use(single, catalog_store=0)
    # A crash of each store: the controller's catalog record (and the
    # other store's copy of it) keep the count; the records stay.
    for index in (0, 1):
        single.kill("partition_store", index)
        single.restart("partition_store", index)
    eventually(lambda: partition_counts(single, topic), lambda got: got == [AFTER, AFTER],
               "the count after the restarts")
    assert read_back(single, topic, range(AFTER)) == {
        p: ([b"before-%d" % p] if p < BEFORE else []) + [b"after-%d" % p] for p in range(AFTER)}


def test_single_copy_grows_through_a_store_that_forwards(single: LocalCluster) -> None:
    topic = f"grow-{next(_ids)}"
    with Admin(bootstrap=single.bootstrap_servers) as admin:
        admin.create_topic(topic, partitions=1)
    channel, stub = _stub(single, 1)
    with channel:
        request = ps.CreatePartitionsRequest(
            topics=[ps.CreatePartitionsTopic(name=topic, count=3)])
        [checked] = stub.CreatePartitions(ps.CreatePartitionsRequest(
            topics=request.topics, validate_only=True)).results
        assert checked.error.code == 0 and checked.topic_id > 0
        assert partition_counts(single, topic) == [1, 1]
        [result] = stub.CreatePartitions(request).results
        assert result.error.code == 0 and result.topic_id == checked.topic_id
        # The forwarding store answers the new count at once, as the
        # controller does (it told the forwarding store before answering).
        assert partition_counts(single, topic) == [3, 3]
        with pytest.raises(grpc.RpcError) as info:
            stub.CreatePartitions(ps.CreatePartitionsRequest())
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    produce(single, topic, range(3), "x")
    assert read_back(single, topic, range(3)) == {p: [b"x-%d" % p] for p in range(3)}


def test_replicated_grows_with_replicas_placed_as_a_new_topic(replicated: LocalCluster) -> None:
    topic = grow_and_use(replicated, catalog_store=0)
    replicated.wait_in_sync([topic])
    states = replicated.partition_states([topic])
    factors = {len(states[(topic, p)].replicas) for p in range(AFTER)}
    assert factors == {3}, states
    # A crash of a store that holds replicas of the new partitions: etcd
    # keeps the count; the restarted store copies its replicas again.
    replicated.kill("partition_store", 1)
    replicated.restart("partition_store", 1)
    eventually(lambda: partition_counts(replicated, topic),
               lambda got: got == [AFTER] * 3, "the count after the restart")
    replicated.wait_in_sync([topic])
    assert read_back(replicated, topic, range(AFTER)) == {
        p: ([b"before-%d" % p] if p < BEFORE else []) + [b"after-%d" % p] for p in range(AFTER)}


def test_a_lost_answer_retried_is_not_an_error(single: LocalCluster) -> None:
    """The store grows the topic and the answer is lost on the way back: the
    Admin's retry is refused ("already has 4 partitions"), and Admin sees
    that the topic has the count it asked for, so the call succeeds."""
    topic = f"grow-{next(_ids)}"
    with Admin(bootstrap=single.bootstrap_servers) as admin:
        admin.create_topic(topic, partitions=2)
    policy = DropPolicy(drop={CREATE_PARTITIONS: {1}})
    with ProxyMesh.in_front_of(single, policy) as mesh, \
            Admin(bootstrap=mesh.bootstrap) as admin:
        admin.create_partitions({topic: 4})
        assert policy.dropped == 1
        assert admin.list_topics()[topic] == 4
        # Again (the 3rd call's answer lost, the 4th a retry); a refusal
        # that no lost answer explains stays an error.
        policy.drop[CREATE_PARTITIONS] = {3}
        admin.create_partitions({topic: 6})
        assert policy.dropped == 2
        assert admin.list_topics()[topic] == 6
        with pytest.raises(errors.InvalidPartitionsError, match="has 6 partitions; 5"):
            admin.create_partitions({topic: 5})
