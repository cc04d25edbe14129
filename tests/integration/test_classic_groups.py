"""Kafka's classic group protocol against real processes, through the group
coordinator's gRPC API (what the Kafka listener translates Kafka's
JoinGroup, SyncGroup, Heartbeat and LeaveGroup into).

Goal: for a client in any language, as Kafka's clients use it:
* two members join (one with KIP-394's MEMBER_ID_REQUIRED round trip), the
  elected leader gets both members' metadata and syncs an assignment, and
  each member gets its own; DescribeGroups, ListGroups and the SDK's Admin
  show the group; one member leaves, the other is told to rejoin, rejoins
  alone in the next generation and its commits are checked against it;
* a static member that restarts (joins again without its member id) takes
  its place without a rebalance: same generation, same assignment, and the
  process it replaced is fenced;
* the group survives a kill -9 of the group coordinator: the restarted
  process has the Stable group back from `__consumer_offsets` and its
  members go on with the same generation;
* a group id is of one type: a server-assigned member cannot join a classic
  group in use.

Method: LocalCluster (one store, one transaction coordinator, one group
coordinator with a short initial rebalance delay); raw gRPC calls, the long
polls as gRPC futures; metadata and assignments encoded as Kafka's consumer
protocol, so the coordinator's decoding for descriptions is exercised.
Waits are the calls' own long polls and bounded loops (failure guards).
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterator

import grpc
import pytest

from oncelog import Admin
from oncelog.errors import ErrorCode
from oncelog.testing import LocalCluster
from oncelog.v1 import group_coordinator_pb2 as gpb
from oncelog.v1 import group_coordinator_pb2_grpc as gpb_grpc
from oncelog.wire.status import error_from_rpc
from tests.support.polling import wait_until

TOPIC = "classic-in"
SESSION_MS = 6_000
REBALANCE_MS = 10_000
CALL_TIMEOUT_S = REBALANCE_MS / 1000 + 10
_ids = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        tmp_path_factory.mktemp("classic") / "cluster", consumer_offsets_partitions=2,
        extra_args={"group_coordinator": ["--initial-rebalance-delay-ms", "200"]},
    ) as c:
        with Admin(bootstrap=c.bootstrap) as admin:
            admin.create_topic(TOPIC, partitions=4)
        yield c


def stub_for(cluster: LocalCluster) -> tuple[grpc.Channel, gpb_grpc.GroupCoordinatorStub]:
    channel = grpc.insecure_channel(cluster.address("group_coordinator"))
    return channel, gpb_grpc.GroupCoordinatorStub(channel)


# Group ids that hash to every __consumer_offsets partition (many more than
# the cluster's partitions): asking about them all shows whether each is loaded.
PROBE_GROUPS = [f"probe-{i}" for i in range(32)]


def wait_loaded(stub: gpb_grpc.GroupCoordinatorStub) -> None:
    """Waits until the coordinator has loaded every __consumer_offsets
    partition: raw calls get COORDINATOR_LOAD_IN_PROGRESS (retriable, and the
    SDK retries it) for a moment after a start or a restart."""
    def loaded() -> bool:
        try:
            groups = stub.DescribeGroups(gpb.DescribeGroupsRequest(group_ids=PROBE_GROUPS),
                                         timeout=CALL_TIMEOUT_S).groups
        except grpc.RpcError as exc:
            if ErrorCode.from_wire(error_from_rpc(exc).code).retriable:
                return False
            raise
        return not any(ErrorCode.from_wire(g.error.code).retriable for g in groups)

    wait_until("the group coordinator to load its partitions", loaded)


@pytest.fixture
def stub(cluster: LocalCluster) -> Iterator[gpb_grpc.GroupCoordinatorStub]:
    channel, stub = stub_for(cluster)
    with channel:
        wait_loaded(stub)
        yield stub


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def subscription(*topics: str) -> bytes:
    """Kafka's ConsumerProtocolSubscription v0."""
    return (struct.pack(">hi", 0, len(topics)) + b"".join(_string(t) for t in topics)
            + struct.pack(">i", -1))


def assignment(topic: str, *partitions: int) -> bytes:
    """Kafka's ConsumerProtocolAssignment v0 (one topic)."""
    return (struct.pack(">hi", 0, 1) + _string(topic) + struct.pack(">i", len(partitions))
            + b"".join(struct.pack(">i", p) for p in partitions) + struct.pack(">i", -1))


def join_request(group_id: str, *, member_id: str = "", instance_id: str = "",
                 client_id: str = "client", require_known: bool = False
                 ) -> gpb.JoinGroupRequest:
    return gpb.JoinGroupRequest(
        group_id=group_id, member_id=member_id, group_instance_id=instance_id,
        session_timeout_ms=SESSION_MS, rebalance_timeout_ms=REBALANCE_MS,
        protocol_type="consumer", client_id=client_id, client_host="/127.0.0.1",
        protocols=[gpb.JoinGroupProtocol(name="range", metadata=subscription(TOPIC))],
        require_known_member_id=require_known, reason="test",
    )


def sync_request(group_id: str, reply: gpb.JoinGroupResponse, *, instance_id: str = "",
                 assignments: dict[str, bytes] | None = None) -> gpb.SyncGroupRequest:
    return gpb.SyncGroupRequest(
        group_id=group_id, member_id=reply.member_id, group_instance_id=instance_id,
        generation_id=reply.generation_id, protocol_type="consumer", protocol_name="range",
        assignments=[gpb.SyncGroupAssignment(member_id=m, assignment=a)
                     for m, a in (assignments or {}).items()])


def heartbeat(stub: gpb_grpc.GroupCoordinatorStub, group_id: str, reply: gpb.JoinGroupResponse,
              *, instance_id: str = "", generation_id: int | None = None) -> ErrorCode:
    answer = stub.ClassicHeartbeat(gpb.ClassicHeartbeatRequest(
        group_id=group_id, member_id=reply.member_id, group_instance_id=instance_id,
        generation_id=reply.generation_id if generation_id is None else generation_id))
    return ErrorCode.from_wire(answer.error.code)


def ok(code: int) -> None:
    assert ErrorCode.from_wire(code) is ErrorCode.NONE, ErrorCode.from_wire(code)


def join_two(stub: gpb_grpc.GroupCoordinatorStub, group_id: str, *,
             instances: tuple[str, str] = ("", "")
             ) -> tuple[gpb.JoinGroupResponse, gpb.JoinGroupResponse]:
    """Two members join together (parked for the initial rebalance);
    (leader's answer, follower's)."""
    first = stub.JoinGroup.future(join_request(group_id, instance_id=instances[0],
                                               client_id="one"), timeout=CALL_TIMEOUT_S)
    second = stub.JoinGroup.future(join_request(group_id, instance_id=instances[1],
                                                client_id="two"), timeout=CALL_TIMEOUT_S)
    a, b = first.result(), second.result()
    ok(a.error.code)
    ok(b.error.code)
    assert a.generation_id == b.generation_id and a.leader == b.leader
    return (a, b) if a.leader == a.member_id else (b, a)


def test_two_members_join_sync_leave_and_rejoin(cluster: LocalCluster,
                                                stub: gpb_grpc.GroupCoordinatorStub) -> None:
    group_id = f"classic-{next(_ids)}"
    # One member as librdkafka and Kafka's JoinGroup v4+ do it: first without
    # a member id, answered MEMBER_ID_REQUIRED with the id to use.
    first = stub.JoinGroup(join_request(group_id, client_id="rdkafka", require_known=True))
    assert ErrorCode.from_wire(first.error.code) is ErrorCode.MEMBER_ID_REQUIRED
    assert first.member_id.startswith("rdkafka-")
    one = stub.JoinGroup.future(join_request(group_id, member_id=first.member_id,
                                             client_id="rdkafka"), timeout=CALL_TIMEOUT_S)
    two = stub.JoinGroup.future(join_request(group_id, client_id="python"),
                                timeout=CALL_TIMEOUT_S)
    replies = [one.result(), two.result()]
    for reply in replies:
        ok(reply.error.code)
    leader, follower = replies if replies[0].leader == replies[0].member_id else replies[::-1]
    assert {m.member_id for m in leader.members} == {leader.member_id, follower.member_id}
    assert {m.metadata for m in leader.members} == {subscription(TOPIC)}
    assert list(follower.members) == []
    assert (leader.protocol_type, leader.protocol_name) == ("consumer", "range")

    # The follower's SyncGroup waits for the leader's assignment.
    waiting = stub.SyncGroup.future(sync_request(group_id, follower), timeout=CALL_TIMEOUT_S)
    mine = stub.SyncGroup(sync_request(group_id, leader, assignments={
        leader.member_id: assignment(TOPIC, 0, 1),
        follower.member_id: assignment(TOPIC, 2, 3)}))
    ok(mine.error.code)
    theirs = waiting.result()
    ok(theirs.error.code)
    assert (mine.assignment, theirs.assignment) == (assignment(TOPIC, 0, 1),
                                                    assignment(TOPIC, 2, 3))
    assert heartbeat(stub, group_id, leader) is ErrorCode.NONE
    assert heartbeat(stub, group_id, follower) is ErrorCode.NONE

    [described] = stub.DescribeGroups(gpb.DescribeGroupsRequest(group_ids=[group_id])).groups
    assert (described.state, described.group_type, described.protocol_type,
            described.protocol_name, described.group_epoch) == (
        "Stable", "classic", "consumer", "range", leader.generation_id)
    by_id = {m.member_id: m for m in described.members}
    assert by_id[follower.member_id].member_assignment == assignment(TOPIC, 2, 3)
    assert by_id[follower.member_id].member_metadata == subscription(TOPIC)
    assert list(by_id[follower.member_id].subscribed_topics) == [TOPIC]
    assert [(p.topic, p.partition) for p in by_id[follower.member_id].assignment] == [
        (TOPIC, 2), (TOPIC, 3)]
    assert by_id[first.member_id].client_id == "rdkafka"
    listed = {g.group_id: g for g in stub.ListGroups(gpb.ListGroupsRequest(
        types=["classic"])).groups}
    assert (listed[group_id].state, listed[group_id].protocol_type) == ("Stable", "consumer")
    with Admin(bootstrap=cluster.bootstrap) as admin:
        shown = admin.describe_group(group_id)
        assert shown.state == "Stable" and shown.group_epoch == leader.generation_id
        assert {m.member_id: m.subscribed_topics for m in shown.members} == {
            leader.member_id: (TOPIC,), follower.member_id: (TOPIC,)}
        assert {(tp.topic, tp.partition) for m in shown.members for tp in m.assignment} == {
            (TOPIC, p) for p in range(4)}
        assert {g.group_id: g.state for g in admin.list_groups()}[group_id] == "Stable"

    # Commits of the generation are accepted; of another, refused.
    def commit(reply: gpb.JoinGroupResponse, generation_id: int) -> ErrorCode:
        try:
            stub.OffsetCommit(gpb.OffsetCommitRequest(
                group_id=group_id, generation_id=generation_id, member_id=reply.member_id,
                partitions=[gpb.OffsetCommitPartition(topic=TOPIC, partition=2, offset=7)]))
        except grpc.RpcError as exc:
            return ErrorCode.from_wire(error_from_rpc(exc).code)
        return ErrorCode.NONE

    assert commit(follower, follower.generation_id) is ErrorCode.NONE
    assert commit(follower, follower.generation_id - 1) is ErrorCode.ILLEGAL_GENERATION

    # The follower leaves; the leader is told to rejoin and rejoins alone.
    left = stub.LeaveGroup(gpb.LeaveGroupRequest(group_id=group_id, members=[
        gpb.LeaveGroupMember(member_id=follower.member_id, reason="closing")]))
    assert [ErrorCode.from_wire(m.error.code) for m in left.members] == [ErrorCode.NONE]
    assert heartbeat(stub, group_id, leader) is ErrorCode.REBALANCE_IN_PROGRESS
    again = stub.JoinGroup(join_request(group_id, member_id=leader.member_id),
                           timeout=CALL_TIMEOUT_S)
    ok(again.error.code)
    assert again.generation_id == leader.generation_id + 1
    assert [m.member_id for m in again.members] == [leader.member_id]
    ok(stub.SyncGroup(sync_request(group_id, again, assignments={
        again.member_id: assignment(TOPIC, 0, 1, 2, 3)})).error.code)
    assert commit(follower, follower.generation_id) is ErrorCode.UNKNOWN_MEMBER_ID
    assert commit(again, again.generation_id) is ErrorCode.NONE
    assert heartbeat(stub, group_id, again) is ErrorCode.NONE


def test_a_static_member_restarts_without_a_rebalance(
        stub: gpb_grpc.GroupCoordinatorStub) -> None:
    group_id = f"static-{next(_ids)}"
    leader, follower = join_two(stub, group_id, instances=("host-1", "host-2"))
    instance = {m.member_id: m.group_instance_id for m in leader.members}
    waiting = stub.SyncGroup.future(sync_request(
        group_id, follower, instance_id=instance[follower.member_id]), timeout=CALL_TIMEOUT_S)
    ok(stub.SyncGroup(sync_request(group_id, leader, instance_id=instance[leader.member_id],
                                   assignments={leader.member_id: assignment(TOPIC, 0, 1),
                                                follower.member_id: assignment(TOPIC, 2, 3)}
                                   )).error.code)
    ok(waiting.result().error.code)

    # The follower's process restarts: it joins with its instance id alone.
    restarted_instance = instance[follower.member_id]
    restarted = stub.JoinGroup(join_request(group_id, instance_id=restarted_instance),
                               timeout=CALL_TIMEOUT_S)
    ok(restarted.error.code)
    assert restarted.member_id != follower.member_id
    assert restarted.generation_id == follower.generation_id, "no rebalance"
    synced = stub.SyncGroup(sync_request(group_id, restarted, instance_id=restarted_instance))
    ok(synced.error.code)
    assert synced.assignment == assignment(TOPIC, 2, 3)
    # The leader was not disturbed; the replaced process is fenced.
    assert heartbeat(stub, group_id, leader,
                     instance_id=instance[leader.member_id]) is ErrorCode.NONE
    assert heartbeat(stub, group_id, follower,
                     instance_id=restarted_instance) is ErrorCode.FENCED_INSTANCE_ID
    [described] = stub.DescribeGroups(gpb.DescribeGroupsRequest(group_ids=[group_id])).groups
    assert described.state == "Stable" and described.group_epoch == leader.generation_id
    assert {m.member_id for m in described.members} == {leader.member_id, restarted.member_id}


def test_the_group_survives_a_kill_of_the_group_coordinator(cluster: LocalCluster) -> None:
    group_id = f"durable-{next(_ids)}"
    channel, stub = stub_for(cluster)
    with channel:
        wait_loaded(stub)
        leader, follower = join_two(stub, group_id)
        ok(stub.SyncGroup(sync_request(group_id, leader, assignments={
            leader.member_id: assignment(TOPIC, 0), follower.member_id: assignment(TOPIC, 1)}
        )).error.code)
    cluster.kill("group_coordinator", 0)
    cluster.restart("group_coordinator", 0)
    channel, stub = stub_for(cluster)
    with channel:
        def described() -> gpb.GroupDescription | None:
            try:
                [d] = stub.DescribeGroups(gpb.DescribeGroupsRequest(group_ids=[group_id])).groups
            except grpc.RpcError:
                return None
            return d if not d.error.code else None

        wait_until("the restarted coordinator to serve the group",
                   lambda: described() is not None)
        group = described()
        assert group is not None
        assert (group.state, group.group_epoch) == ("Stable", leader.generation_id)
        assert {m.member_id: m.member_assignment for m in group.members} == {
            leader.member_id: assignment(TOPIC, 0), follower.member_id: assignment(TOPIC, 1)}
        assert heartbeat(stub, group_id, follower) is ErrorCode.NONE
        synced = stub.SyncGroup(sync_request(group_id, follower))
        ok(synced.error.code)
        assert synced.assignment == assignment(TOPIC, 1)


def test_a_server_assigned_member_cannot_join_a_classic_group_in_use(
        stub: gpb_grpc.GroupCoordinatorStub) -> None:
    group_id = f"typed-{next(_ids)}"
    join_two(stub, group_id)
    with pytest.raises(grpc.RpcError) as info:
        stub.ConsumerGroupHeartbeat(gpb.ConsumerGroupHeartbeatRequest(
            group_id=group_id, member_epoch=0, session_timeout_ms=SESSION_MS,
            subscribed_topics=[TOPIC]))
    error = error_from_rpc(info.value)
    assert ErrorCode.from_wire(error.code) is ErrorCode.GROUP_ID_NOT_FOUND
    assert "classic" in error.message

