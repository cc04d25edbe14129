"""The group coordinator against real processes, through its gRPC API.

Goal: the contract of docs/groups.md holds for any client — members join and
get balanced, disjoint assignments; a partition moves only after its previous
owner has acknowledged the revocation (or been removed by its session
timeout); offsets are committed and fetched; bad input is refused with a
clear error and stores nothing; transactional offsets stay pending
(`require_stable` answers UNSTABLE_OFFSET_COMMIT) until their transaction's
marker, then appear (commit) or vanish (abort); a zombie member's
TxnOffsetCommit is fenced; and all of it survives a kill -9 of the group
coordinator (state is replayed from __consumer_offsets).

Method: LocalCluster with one store, one transaction coordinator and one
group coordinator; raw gRPC calls (a stand-in for a client in any language);
the SDK's transactional Producer for the transactional part. Waits are
bounded loops on observable state.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from oncelog import Admin, GroupMetadata, Producer, TopicPartition, errors
from oncelog.errors import ErrorCode
from oncelog.testing import LocalCluster
from oncelog.v1 import group_coordinator_pb2 as gpb
from oncelog.v1 import group_coordinator_pb2_grpc as gpb_grpc
from oncelog.v1 import partition_store_pb2 as ps
from oncelog.v1 import partition_store_pb2_grpc as ps_grpc
from oncelog.v1 import records_pb2
from oncelog.wire.status import error_from_rpc
from tests.support.polling import retrying, wait_until

PARTITIONS = 4
SESSION_MS = 2000
_ids = itertools.count()
T = TypeVar("T")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("groups") / "cluster",
                      consumer_offsets_partitions=2) as c:
        yield c


@pytest.fixture
def topic(cluster: LocalCluster) -> str:
    name = f"in-{next(_ids)}"
    with Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(name, partitions=PARTITIONS)
    return name


@pytest.fixture
def stub(cluster: LocalCluster) -> Iterator[gpb_grpc.GroupCoordinatorStub]:
    with grpc.insecure_channel(cluster.address("group_coordinator")) as channel:
        yield gpb_grpc.GroupCoordinatorStub(channel)


def group() -> str:
    return f"g-{next(_ids)}"


def code_of(call: Callable[[], object]) -> ErrorCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return ErrorCode.from_wire(error_from_rpc(info.value).code)


def tps(assignment: object) -> set[tuple[str, int]]:
    return {(p.topic, p.partition) for p in assignment}  # type: ignore[attr-defined]


def tp_list(items: set[tuple[str, int]]) -> list[records_pb2.TopicPartition]:
    return [records_pb2.TopicPartition(topic=t, partition=p) for t, p in sorted(items)]


class Member:
    """A minimal client of the heartbeat protocol: it acknowledges every
    revocation at once and takes every partition offered."""

    def __init__(self, stub: gpb_grpc.GroupCoordinatorStub, group_id: str, topic: str,
                 instance_id: str = "") -> None:
        self.stub = stub
        self.group_id = group_id
        self.topic = topic
        self.instance_id = instance_id
        self.member_id = ""
        self.epoch = 0
        self.owned: set[tuple[str, int]] = set()

    def beat(self) -> gpb.ConsumerGroupHeartbeatResponse:
        resp = retrying(lambda: self.stub.ConsumerGroupHeartbeat(
            gpb.ConsumerGroupHeartbeatRequest(
                group_id=self.group_id, member_id=self.member_id, member_epoch=self.epoch,
                group_instance_id=self.instance_id, session_timeout_ms=SESSION_MS,
                subscribed_topics=[self.topic], owned_partitions=tp_list(self.owned),
            )))
        self.member_id = resp.member_id
        self.epoch = resp.member_epoch
        self.owned = tps(resp.assignment)
        return resp

    def leave(self, epoch: int = -1) -> None:
        self.stub.ConsumerGroupHeartbeat(gpb.ConsumerGroupHeartbeatRequest(
            group_id=self.group_id, member_id=self.member_id, member_epoch=epoch,
            group_instance_id=self.instance_id,
        ))


def settle(members: list[Member], *, rounds: int = 20) -> None:
    """Heartbeats every member until all own their targets and agree on the
    epoch; checks at every step that no partition has two owners."""
    for _ in range(rounds):
        for m in members:
            m.beat()
            owners: dict[tuple[str, int], str] = {}
            for other in members:
                for tp in other.owned:
                    assert tp not in owners, f"{tp} owned by {owners[tp]} and {other.member_id}"
                    owners[tp] = other.member_id
        if (len({m.epoch for m in members}) == 1
                and sum(len(m.owned) for m in members) == PARTITIONS):
            return
    raise AssertionError(f"group did not settle: {[(m.epoch, m.owned) for m in members]}")


def test_members_get_balanced_disjoint_assignments_and_revoke_before_reassignment(
    stub: gpb_grpc.GroupCoordinatorStub, topic: str
) -> None:
    g = group()
    a = Member(stub, g, topic)
    a.beat()
    assert len(a.owned) == PARTITIONS
    b = Member(stub, g, topic)
    b.beat()
    # a still owns everything until it acknowledges: b gets nothing yet.
    assert b.owned == set()
    settle([a, b])
    assert len(a.owned) == len(b.owned) == 2
    kept = set(a.owned)
    c = Member(stub, g, topic)
    c.beat()
    settle([a, b, c])
    assert sorted(len(m.owned) for m in (a, b, c)) == [1, 1, 2]
    assert a.owned <= kept, "sticky: a keeps partitions it had"
    c.leave()
    settle([a, b])
    assert len(a.owned) == len(b.owned) == 2


def test_a_silent_member_is_removed_after_its_session_timeout(
    stub: gpb_grpc.GroupCoordinatorStub, topic: str
) -> None:
    g = group()
    a, b = Member(stub, g, topic), Member(stub, g, topic)
    a.beat()
    b.beat()
    settle([a, b])
    silent_since = time.monotonic()
    # Only a heartbeats; b's session ends and a gets everything.
    while len(a.owned) < PARTITIONS:
        assert time.monotonic() - silent_since < 30, "b was never removed"
        a.beat()
        time.sleep(0.2)
    assert time.monotonic() - silent_since >= SESSION_MS / 1000 * 0.9
    assert code_of(b.beat) is ErrorCode.UNKNOWN_MEMBER_ID


def test_a_static_member_rejoins_with_its_partitions_without_a_rebalance(
    stub: gpb_grpc.GroupCoordinatorStub, topic: str
) -> None:
    g = group()
    a, b = Member(stub, g, topic, instance_id="a"), Member(stub, g, topic, instance_id="b")
    a.beat()
    b.beat()
    settle([a, b])
    had, epoch = set(a.owned), a.epoch
    a.leave(epoch=-2)
    again = Member(stub, g, topic, instance_id="a")
    again.beat()
    assert again.owned == had and again.epoch == epoch
    b.beat()
    assert b.epoch == epoch, "no rebalance"
    # The replaced member id is fenced.
    assert code_of(a.beat) is ErrorCode.FENCED_INSTANCE_ID


def commit(stub: gpb_grpc.GroupCoordinatorStub, group_id: str, offsets: dict[tuple[str, int], int],
           member: Member | None = None) -> None:
    stub.OffsetCommit(gpb.OffsetCommitRequest(
        group_id=group_id,
        generation_id=member.epoch if member else -1,
        member_id=member.member_id if member else "",
        partitions=[gpb.OffsetCommitPartition(topic=t, partition=p, offset=o)
                    for (t, p), o in sorted(offsets.items())],
    ))


def fetch(stub: gpb_grpc.GroupCoordinatorStub, group_id: str,
          require_stable: bool = False) -> dict[tuple[str, int], int | ErrorCode]:
    resp = retrying(lambda: stub.OffsetFetch(
        gpb.OffsetFetchRequest(group_id=group_id, require_stable=require_stable)))
    return {
        (p.topic, p.partition): (ErrorCode.from_wire(p.error.code) if p.error.code else p.offset)
        for p in resp.partitions
    }


def test_offsets_commit_and_fetch_and_bad_input_stores_nothing(
    stub: gpb_grpc.GroupCoordinatorStub, topic: str
) -> None:
    g = group()
    commit(stub, g, {(topic, 0): 5, (topic, 1): 7})
    assert fetch(stub, g) == {(topic, 0): 5, (topic, 1): 7}
    bad: list[tuple[str, Callable[[], object], ErrorCode]] = [
        ("negative offset", lambda: commit(stub, g, {(topic, 0): -1}), ErrorCode.INVALID_REQUEST),
        ("unknown partition", lambda: commit(stub, g, {(topic, 0): 9, (topic, 99): 1}),
         ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        ("unknown topic", lambda: commit(stub, g, {("nope", 0): 1}),
         ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        ("empty group id", lambda: commit(stub, "", {(topic, 0): 1}), ErrorCode.INVALID_GROUP_ID),
    ]
    for what, call, expected in bad:
        assert code_of(call) is expected, what
    m = Member(stub, g, topic)
    m.beat()
    settle([m])
    stale = Member(stub, g, topic)
    stale.member_id, stale.epoch = "no-such-member", 1
    member_bad: list[tuple[str, Callable[[], object], ErrorCode]] = [
        ("outside the group while it has members", lambda: commit(stub, g, {(topic, 0): 9}),
         ErrorCode.UNKNOWN_MEMBER_ID),
        ("unknown member", lambda: commit(stub, g, {(topic, 0): 9}, stale),
         ErrorCode.UNKNOWN_MEMBER_ID),
    ]
    for what, call, expected in member_bad:
        assert code_of(call) is expected, what
    future = Member(stub, g, topic)
    future.member_id, future.epoch = m.member_id, m.epoch + 5
    assert code_of(lambda: commit(stub, g, {(topic, 0): 9}, future)) is \
        ErrorCode.FENCED_MEMBER_EPOCH
    assert fetch(stub, g) == {(topic, 0): 5, (topic, 1): 7}, "nothing stored"
    commit(stub, g, {(topic, 0): 11}, m)
    assert fetch(stub, g)[(topic, 0)] == 11
    # Another member that does not own the partition is refused.
    n = Member(stub, g, topic)
    n.beat()
    settle([m, n])
    not_owned = next(iter(m.owned))
    assert code_of(lambda: commit(stub, g, {not_owned: 1}, n)) is ErrorCode.STALE_MEMBER_EPOCH
    deleted = stub.DeleteGroups(gpb.DeleteGroupsRequest(group_ids=[g])).results[0]
    assert ErrorCode.from_wire(deleted.error.code) is ErrorCode.NON_EMPTY_GROUP
    assert fetch(stub, g)[(topic, 0)] == 11


def test_transactional_offsets_are_pending_until_the_marker(
    cluster: LocalCluster, stub: gpb_grpc.GroupCoordinatorStub, topic: str
) -> None:
    g = group()
    meta = GroupMetadata(group_id=g, generation_id=-1, member_id="")
    tp = TopicPartition(topic, 0)
    with Producer(bootstrap=cluster.bootstrap, transactional_id=f"t-{g}") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, value=b"x", partition=0)
        producer.send_offsets_to_transaction({tp: 42}, meta)
        assert fetch(stub, g, require_stable=True) == {(topic, 0): ErrorCode.UNSTABLE_OFFSET_COMMIT}
        assert fetch(stub, g) == {}, "pending offsets are invisible"
        producer.commit_transaction()
        deadline = time.monotonic() + 20
        while fetch(stub, g, require_stable=True) != {(topic, 0): 42}:
            assert time.monotonic() < deadline, fetch(stub, g, require_stable=True)
            time.sleep(0.05)
        producer.begin_transaction()
        producer.send_offsets_to_transaction({tp: 50}, meta)
        producer.abort_transaction()
        deadline = time.monotonic() + 20
        while fetch(stub, g, require_stable=True) != {(topic, 0): 42}:
            assert time.monotonic() < deadline, fetch(stub, g, require_stable=True)
            time.sleep(0.05)


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_pending_offsets_end_as_decided_when_the_group_coordinator_was_killed(
    cluster: LocalCluster, stub: gpb_grpc.GroupCoordinatorStub, topic: str, commit: bool
) -> None:
    """kill -9 of the group coordinator while a transaction's offsets are
    pending; the transaction ends while it is down (the marker goes to the
    store, not to it); after the restart it rebuilds the group from the log,
    marker included: the new offset if committed, the old one if aborted,
    never both, never pending."""
    g = group()
    meta = GroupMetadata(group_id=g, generation_id=-1, member_id="")
    tp = TopicPartition(topic, 1)
    with Producer(bootstrap=cluster.bootstrap, transactional_id=f"t-{g}") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send_offsets_to_transaction({tp: 10}, meta)
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send(topic, value=b"y", partition=1)
        producer.send_offsets_to_transaction({tp: 20}, meta)
        assert fetch(stub, g, require_stable=True) == {(topic, 1): ErrorCode.UNSTABLE_OFFSET_COMMIT}
        cluster.kill("group_coordinator", 0)
        if commit:
            producer.commit_transaction()
        else:
            producer.abort_transaction()
    cluster.restart("group_coordinator", 0)
    expected = {(topic, 1): 20 if commit else 10}
    wait_until("the offsets to settle after the restart",
               lambda: fetch(stub, g, require_stable=True) == expected)
    assert fetch(stub, g) == expected


def test_a_fenced_producer_cannot_commit_offsets(
    cluster: LocalCluster, stub: gpb_grpc.GroupCoordinatorStub, topic: str
) -> None:
    g = group()
    meta = GroupMetadata(group_id=g, generation_id=-1, member_id="")
    tp = TopicPartition(topic, 1)
    with Producer(bootstrap=cluster.bootstrap, transactional_id=f"t-{g}") as zombie, \
            Producer(bootstrap=cluster.bootstrap, transactional_id=f"t-{g}") as fresh:
        zombie.init_transactions()
        zombie.begin_transaction()
        zombie.send(topic, value=b"z", partition=1).result()
        fresh.init_transactions()
        with pytest.raises(errors.ProducerFencedError):
            zombie.send_offsets_to_transaction({tp: 99}, meta)
        fresh.begin_transaction()
        fresh.send_offsets_to_transaction({tp: 3}, meta)
        fresh.commit_transaction()
    deadline = time.monotonic() + 20
    while fetch(stub, g, require_stable=True) != {(topic, 1): 3}:
        assert time.monotonic() < deadline, fetch(stub, g, require_stable=True)
        time.sleep(0.05)


def test_state_survives_a_kill_of_the_group_coordinator(
    cluster: LocalCluster, stub: gpb_grpc.GroupCoordinatorStub, topic: str, tmp_path: Path
) -> None:
    g = group()
    a, b = Member(stub, g, topic), Member(stub, g, topic)
    a.beat()
    b.beat()
    settle([a, b])
    commit(stub, g, {next(iter(a.owned)): 17}, a)
    before = {(m.member_id, m.epoch, frozenset(m.owned)) for m in (a, b)}
    cluster.kill("group_coordinator", 0)
    cluster.restart("group_coordinator", 0)
    for m in (a, b):
        m.beat()
    assert {(m.member_id, m.epoch, frozenset(m.owned)) for m in (a, b)} == before
    assert fetch(stub, g) == {next(iter(a.owned)): 17}
    described = retrying(lambda: stub.DescribeGroups(gpb.DescribeGroupsRequest(group_ids=[g])))
    assert described.groups[0].state == "Stable"
    assert len(described.groups[0].members) == 2


def test_markers_are_only_for_read_uncommitted_readers(cluster: LocalCluster) -> None:
    """The store's include_control_batches (how this service follows
    transaction outcomes) is refused under read_committed."""
    with grpc.insecure_channel(cluster.bootstrap) as channel:
        store = ps_grpc.PartitionStoreStub(channel)
        assert code_of(lambda: store.Fetch(ps.FetchRequest(
            partitions=[ps.FetchPartition(topic="__consumer_offsets", partition=0)],
            isolation_level=records_pb2.READ_COMMITTED, include_control_batches=True,
        ))) is ErrorCode.INVALID_REQUEST


def test_offsets_of_deleted_topics_and_expired_empty_groups_are_removed(
    tmp_path: Path,
) -> None:
    with LocalCluster(tmp_path / "cluster", consumer_offsets_partitions=1, extra_args={
        "group_coordinator": ["--retention-check-interval-ms", "200",
                              # Long enough that, on a loaded machine, the
                              # deleted topic's offsets go well before the
                              # empty group's own expiry removes all of them.
                              "--offsets-retention-ms", "8000"],
    }) as cluster, grpc.insecure_channel(cluster.address("group_coordinator")) as channel:
        stub = gpb_grpc.GroupCoordinatorStub(channel)
        with Admin(bootstrap=cluster.bootstrap) as admin:
            admin.create_topic("kept", partitions=1)
            admin.create_topic("doomed", partitions=1)
            retrying(lambda: commit(stub, "g", {("kept", 0): 1, ("doomed", 0): 2}))
            admin.delete_topic("doomed")
        deadline = time.monotonic() + 20
        while fetch(stub, "g") != {("kept", 0): 1}:
            assert time.monotonic() < deadline, fetch(stub, "g")
            time.sleep(0.1)
        # No member and no commit for --offsets-retention-ms: the group goes.
        while ("g", "Empty") in _listed(stub):
            assert time.monotonic() < deadline + 20, _listed(stub)
            time.sleep(0.2)
        assert fetch(stub, "g") == {}


def _listed(stub: gpb_grpc.GroupCoordinatorStub) -> set[tuple[str, str]]:
    return {(g.group_id, g.state) for g in stub.ListGroups(gpb.ListGroupsRequest()).groups}
