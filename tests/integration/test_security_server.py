"""ACLs on every RPC of a secured cluster, through raw gRPC over TLS.

Goal: for every RPC in the per-RPC table (services/common/security/
operations.py: the test walks `TABLE`, so an RPC added without a case here
fails), a principal without the ACL it needs is refused with
PERMISSION_DENIED and the code of the refused resource's type, the message
naming the principal — and nothing changes: the topics, every partition's
log end offset (internal topics included), the transactions and their
states, the groups and their committed offsets and the ACLs read back
identical, as the admin. With the ACLs the table names (created through
CreateAcls), the same call works. A listing (Metadata, ListTopics,
ListTransactions, ListGroups) is not refused: its answer leaves out what the
principal may not see. Then Kafka's rules end to end: deny beats allow,
prefixed ACLs, super users, `User:*`; bad bindings refused naming the field
with nothing written; a cluster without an authorizer answers the ACL RPCs
with SECURITY_DISABLED; a refusal is counted in
`oncelog_authorization_denials_total` and logged once a minute per
principal, operation and resource.

Method: one LocalCluster(security=True) for the module (one partition of each
internal topic), raw stubs over TLS channels with each principal's client
certificate (tests/support/tls.py); every case has its own principal and
its own resources, set up by `User:admin` (a super user). After creating
ACLs, a case waits until every service has read `__acls` to its end (each
service's `oncelog_acl_applied_offset`). No assertion depends on timing.
"""

from __future__ import annotations

import functools
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message
from prometheus_client.parser import text_string_to_metric_families

from oncelog.errors import ErrorCode
from oncelog.records import encode_batch
from oncelog.testing import LocalCluster
from oncelog.v1 import coordinator_pb2 as tc
from oncelog.v1 import group_coordinator_pb2 as gc
from oncelog.v1 import partition_store_pb2 as ps
from oncelog.v1 import partition_store_pb2_grpc as ps_grpc
from oncelog.v1 import records_pb2
from oncelog.wire import proto_enums as pe
from oncelog.wire.status import error_from_rpc
from services.common.security.operations import TABLE
from tests.support.polling import retrying, wait_until
from tests.support.tls import Principal, wait_acls_applied

# Transactions set up here must not time out while the module runs.
TXN_TIMEOUT_MS = 900_000
TP = records_pb2.TopicPartition
CLUSTER = "oncelog-cluster"


@dataclass
class Env:
    cluster: LocalCluster
    admin: Principal
    # Groups whose offsets the snapshot reads.
    groups: set[str] = field(default_factory=set)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with LocalCluster(tmp_path_factory.mktemp("secure") / "cluster", security=True,
                      transaction_state_partitions=1, consumer_offsets_partitions=1,
                      # Classic groups' first rebalance: short, as in every test.
                      extra_args={"group_coordinator": ["--initial-rebalance-delay-ms", "100"]},
                      ) as cluster, \
            Principal(cluster, "admin") as admin:
        env = Env(cluster, admin)
        _wait_coordinators_loaded(env)
        yield env


def _wait_coordinators_loaded(env: Env) -> None:
    """Until each coordinator has claimed its internal partition (its epoch
    record written): the matrix compares everything stored before and after
    a refused call, and a coordinator that finishes loading in between
    writes that record (a run once failed so, on __transaction_state-0)."""
    def loaded() -> bool:
        results = env.admin.store.ListOffsets(ps.ListOffsetsRequest(
            partitions=[ps.ListOffsetsPartition(topic=topic, partition=0, timestamp_ms=-1)
                        for topic in ("__transaction_state", "__consumer_offsets")],
            isolation_level=records_pb2.READ_UNCOMMITTED)).results
        return len(results) == 2 and all(r.error.code == 0 and r.offset >= 1 for r in results)

    wait_until("both coordinators' epoch records", loaded)


# ------------------------------------------------------------------ helpers


def _ok(error: object) -> None:
    assert getattr(error, "code", 0) == 0, error


def acl(principal: str, resource_type: str, resource_name: str, operation: str, *,
        pattern_type: str = "literal", permission: str = "allow") -> ps.AclBinding:
    # Each enum as its string and its number, as writers send them and as
    # answers carry them (so that a binding read back compares equal).
    return ps.AclBinding(principal=principal, host="*", resource_type=resource_type,
                         resource_name=resource_name, pattern_type=pattern_type,
                         operation=operation, permission=permission,
                         resource_type_enum=pe.ACL_RESOURCE_TYPES.number(resource_type),
                         pattern_type_enum=pe.ACL_PATTERN_TYPES.number(pattern_type),
                         operation_enum=pe.ACL_OPERATIONS.number(operation),
                         permission_enum=pe.ACL_PERMISSIONS.number(permission))


def grant(env: Env, *bindings: ps.AclBinding) -> None:
    """Creates ACLs as the admin and waits until every service has them."""
    reply = env.admin.store.CreateAcls(ps.CreateAclsRequest(creations=list(bindings)))
    for result in reply.results:
        _ok(result)
    wait_acls_applied(env.admin)


def create_topic(env: Env, name: str, *, config: dict[str, str] | None = None) -> None:
    reply = retrying(lambda: env.admin.store.CreateTopics(ps.CreateTopicsRequest(
        topics=[ps.TopicSpec(name=name, partitions=1, config=config or {})])))
    _ok(reply.results[0].error)


def _batch(value: bytes = b"v", *, producer_id: int = -1, producer_epoch: int = -1,
           base_sequence: int = -1, transactional: bool = False) -> bytes:
    return encode_batch([(b"k", value, None, int(time.time() * 1000))],
                        producer_id=producer_id, producer_epoch=producer_epoch,
                        base_sequence=base_sequence, transactional=transactional)


def produce(env: Env, topic: str) -> None:
    reply = retrying(lambda: env.admin.store.Produce(ps.ProduceRequest(
        batches=[ps.PartitionBatch(topic=topic, partition=0, batch=_batch())],
        timeout_ms=10_000)))
    _ok(reply.results[0].error)


def init_producer(env: Env, txn_id: str, *, two_phase: bool = False) -> tuple[int, int]:
    reply = retrying(lambda: env.admin.txn.InitProducerId(tc.InitProducerIdRequest(
        transactional_id=txn_id, transaction_timeout_ms=TXN_TIMEOUT_MS,
        enable_two_phase_commit=two_phase)))
    _ok(reply.error)
    return reply.producer_id, reply.producer_epoch


def open_txn(env: Env, txn_id: str, topic: str, *, two_phase: bool = False) -> tuple[int, int]:
    """A transaction of the admin's with one record in `topic`, left open."""
    producer_id, epoch = init_producer(env, txn_id, two_phase=two_phase)
    batch = _batch(b"txn", producer_id=producer_id, producer_epoch=epoch, base_sequence=0,
                   transactional=True)
    reply = retrying(lambda: env.admin.store.Produce(ps.ProduceRequest(
        batches=[ps.PartitionBatch(topic=topic, partition=0, batch=batch)], timeout_ms=10_000,
        transactional_id=txn_id, add_partitions_to_txn=True)))
    _ok(reply.results[0].error)
    return producer_id, epoch


def describe_txn(env: Env, txn_id: str) -> tc.TransactionDescription:
    [described] = env.admin.txn.DescribeTransactions(
        tc.DescribeTransactionsRequest(transactional_ids=[txn_id])).transactions
    _ok(described.error)
    return described


def wait_txn_state(env: Env, txn_id: str, state: str) -> None:
    wait_until(f"{txn_id} reaches {state}", lambda: describe_txn(env, txn_id).state == state)


def commit_offset(env: Env, group: str, topic: str, offset: int = 1) -> None:
    env.groups.add(group)
    reply = retrying(lambda: env.admin.groups.OffsetCommit(gc.OffsetCommitRequest(
        group_id=group, generation_id=-1,
        partitions=[gc.OffsetCommitPartition(topic=topic, partition=0, offset=offset)])))
    _ok(reply.error)
    for result in reply.results:
        _ok(result.error)


def snapshot(env: Env) -> dict[str, object]:
    """Everything stored, read back as the admin."""
    admin = env.admin
    state: dict[str, object] = {}
    topics = admin.store.ListTopics(ps.ListTopicsRequest(include_internal=True)).topics
    state["topics"] = sorted((t.name, len(t.partitions)) for t in topics)
    offsets = admin.store.ListOffsets(ps.ListOffsetsRequest(
        partitions=[ps.ListOffsetsPartition(topic=t.name, partition=p.partition, timestamp_ms=-1)
                    for t in topics for p in t.partitions],
        isolation_level=records_pb2.READ_UNCOMMITTED)).results
    for result in offsets:
        _ok(result.error)
    state["log end offsets"] = sorted((r.topic, r.partition, r.offset) for r in offsets)
    listed = admin.txn.ListTransactions(tc.ListTransactionsRequest()).transactions
    ids = sorted(t.transactional_id for t in listed)
    described = admin.txn.DescribeTransactions(
        tc.DescribeTransactionsRequest(transactional_ids=ids)).transactions if ids else []
    state["transactions"] = sorted(
        (d.transactional_id, d.state, d.producer_id, d.producer_epoch,
         tuple((p.topic, p.partition) for p in d.partitions)) for d in described)
    groups = admin.groups.ListGroups(gc.ListGroupsRequest()).groups
    state["groups"] = sorted((g.group_id, g.state) for g in groups)
    for group in sorted(env.groups | {g.group_id for g in groups}):
        fetched = admin.groups.OffsetFetch(gc.OffsetFetchRequest(group_id=group))
        state[f"offsets of {group}"] = sorted(
            (p.topic, p.partition, p.offset, p.error.code) for p in fetched.partitions)
    state["acls"] = sorted(
        (b.principal, b.host, b.resource_type, b.resource_name, b.pattern_type, b.operation,
         b.permission)
        for b in admin.store.DescribeAcls(ps.DescribeAclsRequest()).bindings)
    return state


# -------------------------------------------------------------- the cases


@dataclass
class Case:
    """One RPC as a principal: the call, the ACLs that let it through, what
    the refusal answers, and what "it works" means."""

    call: Callable[[Principal], Message]
    acls: list[ps.AclBinding]
    # The error code of the refusal; None for a listing, which is answered
    # and `hidden` checks that the answer left out what it must.
    denied: ErrorCode | None
    works: Callable[[Message], None]
    hidden: Callable[[Message], None] | None = None
    # A request stream's refusal is an answer in the stream (its `error`),
    # not the end of the call.
    in_band: bool = False


T_, G_, X_, C_ = "topic", "group", "transactional_id", "cluster"
TOPIC_DENIED = ErrorCode.TOPIC_AUTHORIZATION_FAILED
GROUP_DENIED = ErrorCode.GROUP_AUTHORIZATION_FAILED
TXN_DENIED = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
CLUSTER_DENIED = ErrorCode.CLUSTER_AUTHORIZATION_FAILED


def case_metadata(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)

    def hidden(reply: Message) -> None:
        assert isinstance(reply, ps.MetadataResponse)
        [topic] = reply.topics
        assert (topic.name, topic.error.code, len(topic.partitions)) == (
            name, TOPIC_DENIED, 0), topic

    def works(reply: Message) -> None:
        assert isinstance(reply, ps.MetadataResponse)
        [topic] = reply.topics
        _ok(topic.error)
        assert len(topic.partitions) == 1

    return Case(lambda p: p.store.Metadata(ps.MetadataRequest(topics=[name])),
                [acl(who, T_, name, "describe")], None, works, hidden)


def case_create_topics(env: Env, who: str, name: str) -> Case:
    def works(reply: Message) -> None:
        assert isinstance(reply, ps.CreateTopicsResponse)
        _ok(reply.results[0].error)
        assert name in {t.name for t in env.admin.store.ListTopics(
            ps.ListTopicsRequest()).topics}

    return Case(lambda p: p.store.CreateTopics(ps.CreateTopicsRequest(
        topics=[ps.TopicSpec(name=name, partitions=1)])),
        [acl(who, T_, name, "create")], TOPIC_DENIED, works)


def case_create_partitions(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)

    def works(reply: Message) -> None:
        assert isinstance(reply, ps.CreatePartitionsResponse)
        _ok(reply.results[0].error)
        counts = {t.name: len(t.partitions) for t in env.admin.store.ListTopics(
            ps.ListTopicsRequest()).topics}
        assert counts[name] == 3

    # Kafka's: Alter on the topic.
    return Case(lambda p: p.store.CreatePartitions(ps.CreatePartitionsRequest(
        topics=[ps.CreatePartitionsTopic(name=name, count=3)])),
        [acl(who, T_, name, "alter")], TOPIC_DENIED, works)


def case_delete_topics(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)

    def works(reply: Message) -> None:
        assert isinstance(reply, ps.DeleteTopicsResponse)
        _ok(reply.results[0].error)
        assert name not in {t.name for t in env.admin.store.ListTopics(
            ps.ListTopicsRequest()).topics}

    return Case(lambda p: p.store.DeleteTopics(ps.DeleteTopicsRequest(names=[name])),
                [acl(who, T_, name, "delete")], TOPIC_DENIED, works)


def case_list_topics(env: Env, who: str, name: str) -> Case:
    create_topic(env, name, config={"retention.ms": "86400000"})

    def hidden(reply: Message) -> None:
        assert isinstance(reply, ps.ListTopicsResponse)
        assert [t.name for t in reply.topics] == []

    def works(reply: Message) -> None:
        assert isinstance(reply, ps.ListTopicsResponse)
        [topic] = reply.topics
        # Describe shows the topic; its config needs DescribeConfigs.
        assert (topic.name, dict(topic.config)) == (name, {})

    return Case(lambda p: p.store.ListTopics(ps.ListTopicsRequest(include_internal=True)),
                [acl(who, T_, name, "describe")], None, works, hidden)


def case_produce(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)

    def works(reply: Message) -> None:
        assert isinstance(reply, ps.ProduceResponse)
        _ok(reply.results[0].error)
        assert reply.results[0].base_offset == 0

    return Case(lambda p: p.store.Produce(ps.ProduceRequest(
        batches=[ps.PartitionBatch(topic=name, partition=0, batch=_batch())],
        timeout_ms=10_000)), [acl(who, T_, name, "write")], TOPIC_DENIED, works)


def case_produce_stream(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)

    def call(p: Principal) -> Message:
        request = ps.ProduceRequest(
            batches=[ps.PartitionBatch(topic=name, partition=0, batch=_batch())],
            timeout_ms=10_000, request_id=41)
        [reply] = p.store.ProduceStream(iter([request]), timeout=30)
        assert reply.request_id == 41
        return reply

    def works(reply: Message) -> None:
        assert isinstance(reply, ps.ProduceResponse)
        _ok(reply.error)
        _ok(reply.results[0].error)
        assert reply.results[0].base_offset == 0

    return Case(call, [acl(who, T_, name, "write")], TOPIC_DENIED, works, in_band=True)


def case_fetch(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)
    produce(env, name)

    def works(reply: Message) -> None:
        assert isinstance(reply, ps.FetchResponse)
        _ok(reply.results[0].error)
        assert reply.results[0].batches

    return Case(lambda p: p.store.Fetch(ps.FetchRequest(
        partitions=[ps.FetchPartition(topic=name, partition=0, fetch_offset=0,
                                      max_bytes=1 << 20)], max_bytes=1 << 20)),
        [acl(who, T_, name, "read")], TOPIC_DENIED, works)


def case_list_offsets(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)
    produce(env, name)

    def works(reply: Message) -> None:
        assert isinstance(reply, ps.ListOffsetsResponse)
        _ok(reply.results[0].error)
        assert reply.results[0].offset == 1

    return Case(lambda p: p.store.ListOffsets(ps.ListOffsetsRequest(
        partitions=[ps.ListOffsetsPartition(topic=name, partition=0, timestamp_ms=-1)])),
        [acl(who, T_, name, "describe")], TOPIC_DENIED, works)


def _abort_marker(env: Env, name: str) -> ps.WriteTxnMarkersRequest:
    """An ABORT marker for the open transaction of a new topic `name`."""
    create_topic(env, name)
    producer_id, epoch = open_txn(env, name, name)
    coordinator_epoch = describe_txn(env, name).coordinator_epoch
    return ps.WriteTxnMarkersRequest(markers=[ps.TxnMarker(
        producer_id=producer_id, producer_epoch=epoch + 1, type=ps.ABORT,
        coordinator_epoch=coordinator_epoch, partitions=[TP(topic=name, partition=0)],
        transactional_id=name)])


def _marker_written(reply: Message) -> None:
    assert isinstance(reply, ps.WriteTxnMarkersResponse)
    _ok(reply.error)
    [result] = reply.results
    _ok(result.error)
    assert result.offset == 1


def case_write_txn_markers(env: Env, who: str, name: str) -> Case:
    request = _abort_marker(env, name)
    return Case(lambda p: p.store.WriteTxnMarkers(request),
                [acl(who, C_, CLUSTER, "cluster_action")], CLUSTER_DENIED, _marker_written)


def case_write_txn_markers_stream(env: Env, who: str, name: str) -> Case:
    request = _abort_marker(env, name)
    request.request_id = 42

    def call(p: Principal) -> Message:
        [reply] = p.store.WriteTxnMarkersStream(iter([request]), timeout=30)
        assert reply.request_id == 42
        return reply

    return Case(call, [acl(who, C_, CLUSTER, "cluster_action")], CLUSTER_DENIED,
                _marker_written, in_band=True)


def case_describe_producers(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)

    def works(reply: Message) -> None:
        assert isinstance(reply, ps.DescribeProducersResponse)
        _ok(reply.results[0].error)

    return Case(lambda p: p.store.DescribeProducers(ps.DescribeProducersRequest(
        partitions=[TP(topic=name, partition=0)])),
        [acl(who, T_, name, "read")], TOPIC_DENIED, works)


def case_replica_fetch(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)
    produce(env, name)

    def works(reply: Message) -> None:
        assert isinstance(reply, ps.ReplicaFetchResponse)
        _ok(reply.results[0].error)
        assert reply.results[0].batches

    return Case(lambda p: p.store.ReplicaFetch(ps.ReplicaFetchRequest(
        replica_id=0, max_wait_ms=0, partitions=[ps.ReplicaFetchPartition(
            topic=name, partition=0, fetch_offset=0, max_bytes=1 << 20)])),
        [acl(who, C_, CLUSTER, "cluster_action")], CLUSTER_DENIED, works)


def case_replica_fetch_stream(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)
    produce(env, name)
    request = ps.ReplicaFetchRequest(
        request_id=42, replica_id=0, max_wait_ms=0, partitions=[ps.ReplicaFetchPartition(
            topic=name, partition=0, fetch_offset=0, max_bytes=1 << 20)])

    def call(p: Principal) -> Message:
        [reply] = p.store.ReplicaFetchStream(iter([request]), timeout=30)
        assert reply.request_id == 42
        return reply

    def works(reply: Message) -> None:
        assert isinstance(reply, ps.ReplicaFetchResponse)
        _ok(reply.error)
        _ok(reply.results[0].error)
        assert reply.results[0].batches

    return Case(call, [acl(who, C_, CLUSTER, "cluster_action")], CLUSTER_DENIED, works,
                in_band=True)


def case_offsets_for_leader_epoch(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)

    def works(reply: Message) -> None:
        assert isinstance(reply, ps.OffsetsForLeaderEpochResponse)
        _ok(reply.results[0].error)

    return Case(lambda p: p.store.OffsetsForLeaderEpoch(ps.OffsetsForLeaderEpochRequest(
        partitions=[ps.EpochQuery(topic=name, partition=0, leader_epoch=0,
                                  current_leader_epoch=-1)])),
        [acl(who, T_, name, "describe")], TOPIC_DENIED, works)


def case_alter_partition_reassignments(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)

    def works(reply: Message) -> None:
        # Past the authorizer, the store's own answer: this cluster keeps
        # single copies, so replicas cannot move.
        assert isinstance(reply, ps.AlterPartitionReassignmentsResponse)
        [result] = reply.results
        assert result.error.code == ErrorCode.INVALID_REQUEST, result.error
        assert "replicated cluster" in result.error.message

    return Case(lambda p: p.store.AlterPartitionReassignments(
        ps.AlterPartitionReassignmentsRequest(partitions=[ps.ReassignPartition(
            topic=name, partition=0, replica_node_ids=[0])])),
        [acl(who, C_, CLUSTER, "alter")], CLUSTER_DENIED, works)


def case_create_acls(env: Env, who: str, name: str) -> Case:
    binding = acl(f"User:{name}-reader", T_, name, "read")

    def works(reply: Message) -> None:
        assert isinstance(reply, ps.CreateAclsResponse)
        [result] = reply.results
        _ok(result)
        assert binding in env.admin.store.DescribeAcls(ps.DescribeAclsRequest()).bindings

    return Case(lambda p: p.store.CreateAcls(ps.CreateAclsRequest(creations=[binding])),
                [acl(who, C_, CLUSTER, "alter")], CLUSTER_DENIED, works)


def case_describe_acls(env: Env, who: str, name: str) -> Case:
    own = acl(who, C_, CLUSTER, "describe")

    def works(reply: Message) -> None:
        assert isinstance(reply, ps.DescribeAclsResponse)
        _ok(reply.error)
        assert own in reply.bindings

    return Case(lambda p: p.store.DescribeAcls(ps.DescribeAclsRequest(
        filter=ps.AclBindingFilter(resource_type="cluster"))), [own], CLUSTER_DENIED, works)


def case_delete_acls(env: Env, who: str, name: str) -> Case:
    victim = acl(f"User:{name}-victim", T_, name, "read")
    grant(env, victim)

    def works(reply: Message) -> None:
        assert isinstance(reply, ps.DeleteAclsResponse)
        [result] = reply.results
        _ok(result.error)
        assert list(result.matching) == [victim]
        assert victim not in env.admin.store.DescribeAcls(ps.DescribeAclsRequest()).bindings

    return Case(lambda p: p.store.DeleteAcls(ps.DeleteAclsRequest(
        filters=[ps.AclBindingFilter(principal=victim.principal)])),
        [acl(who, C_, CLUSTER, "alter")], CLUSTER_DENIED, works)


def case_find_coordinator(env: Env, who: str, name: str) -> Case:
    def works(reply: Message) -> None:
        assert isinstance(reply, tc.FindCoordinatorResponse)
        _ok(reply.error)
        assert reply.address == env.cluster.address("coordinator")

    return Case(lambda p: p.txn.FindCoordinator(tc.FindCoordinatorRequest(
        key=name, type=tc.TRANSACTION)), [acl(who, X_, name, "describe")], TXN_DENIED, works)


def case_init_producer_id(env: Env, who: str, name: str) -> Case:
    def works(reply: Message) -> None:
        assert isinstance(reply, tc.InitProducerIdResponse)
        _ok(reply.error)
        assert reply.producer_id >= 0

    return Case(lambda p: p.txn.InitProducerId(tc.InitProducerIdRequest(
        transactional_id=name, transaction_timeout_ms=TXN_TIMEOUT_MS)),
        [acl(who, X_, name, "write")], TXN_DENIED, works)


def _add_request(env: Env, name: str) -> tc.AddPartitionsToTxnRequest:
    """Adds partition 0 of a new topic `name` to the transaction of a new
    producer with transactional id `name`."""
    create_topic(env, name)
    producer_id, epoch = init_producer(env, name)
    return tc.AddPartitionsToTxnRequest(
        transactional_id=name, producer_id=producer_id, producer_epoch=epoch,
        partitions=[TP(topic=name, partition=0)])


def _added(env: Env, name: str) -> Callable[[Message], None]:
    def works(reply: Message) -> None:
        assert isinstance(reply, tc.AddPartitionsToTxnResponse)
        _ok(reply.error)
        assert reply.results
        for result in reply.results:
            _ok(result.error)
        assert describe_txn(env, name).state == "Ongoing"
    return works


def case_add_partitions_to_txn(env: Env, who: str, name: str) -> Case:
    request = _add_request(env, name)
    return Case(lambda p: p.txn.AddPartitionsToTxn(request),
                [acl(who, X_, name, "write"), acl(who, T_, name, "write")], TXN_DENIED,
                _added(env, name))


def case_add_partitions_to_txn_stream(env: Env, who: str, name: str) -> Case:
    request = _add_request(env, name)
    request.request_id = 43

    def call(p: Principal) -> Message:
        [reply] = p.txn.AddPartitionsToTxnStream(iter([request]), timeout=30)
        assert reply.request_id == 43
        return reply

    return Case(call, [acl(who, X_, name, "write"), acl(who, T_, name, "write")], TXN_DENIED,
                _added(env, name), in_band=True)


def case_add_offsets_to_txn(env: Env, who: str, name: str) -> Case:
    producer_id, epoch = init_producer(env, name)

    def works(reply: Message) -> None:
        assert isinstance(reply, tc.AddOffsetsToTxnResponse)
        _ok(reply.error)

    return Case(lambda p: p.txn.AddOffsetsToTxn(tc.AddOffsetsToTxnRequest(
        transactional_id=name, producer_id=producer_id, producer_epoch=epoch, group_id=name)),
        [acl(who, X_, name, "write"), acl(who, G_, name, "read")], TXN_DENIED, works)


def _commit_request(env: Env, name: str) -> tc.EndTxnRequest:
    """Commits the open transaction of a new producer writing to a new topic
    `name` (its transactional id `name` too)."""
    create_topic(env, name)
    producer_id, epoch = open_txn(env, name, name)
    return tc.EndTxnRequest(transactional_id=name, producer_id=producer_id,
                            producer_epoch=epoch, commit=True)


def _committed(env: Env, name: str) -> Callable[[Message], None]:
    def works(reply: Message) -> None:
        assert isinstance(reply, tc.EndTxnResponse)
        _ok(reply.error)
        wait_txn_state(env, name, "CompleteCommit")
    return works


def case_end_txn(env: Env, who: str, name: str) -> Case:
    request = _commit_request(env, name)
    return Case(lambda p: p.txn.EndTxn(request), [acl(who, X_, name, "write")], TXN_DENIED,
                _committed(env, name))


def case_end_txn_stream(env: Env, who: str, name: str) -> Case:
    request = _commit_request(env, name)
    request.request_id = 44

    def call(p: Principal) -> Message:
        [reply] = p.txn.EndTxnStream(iter([request]), timeout=30)
        assert reply.request_id == 44
        return reply

    return Case(call, [acl(who, X_, name, "write")], TXN_DENIED, _committed(env, name),
                in_band=True)


def case_list_transactions(env: Env, who: str, name: str) -> Case:
    init_producer(env, name)

    def hidden(reply: Message) -> None:
        assert isinstance(reply, tc.ListTransactionsResponse)
        assert list(reply.transactions) == []

    def works(reply: Message) -> None:
        assert isinstance(reply, tc.ListTransactionsResponse)
        assert [t.transactional_id for t in reply.transactions] == [name]

    return Case(lambda p: p.txn.ListTransactions(tc.ListTransactionsRequest()),
                [acl(who, X_, name, "describe")], None, works, hidden)


def case_describe_transactions(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)
    open_txn(env, name, name)

    def works(reply: Message) -> None:
        assert isinstance(reply, tc.DescribeTransactionsResponse)
        [described] = reply.transactions
        _ok(described.error)
        assert described.state == "Ongoing"
        # The partitions of the answer need Describe on their topics.
        assert list(described.partitions) == []

    return Case(lambda p: p.txn.DescribeTransactions(tc.DescribeTransactionsRequest(
        transactional_ids=[name])), [acl(who, X_, name, "describe")], TXN_DENIED, works)


def case_abort_transaction(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)
    open_txn(env, name, name)

    def works(reply: Message) -> None:
        assert isinstance(reply, tc.AbortTransactionResponse)
        _ok(reply.error)
        wait_txn_state(env, name, "CompleteAbort")

    return Case(lambda p: p.txn.AbortTransaction(tc.AbortTransactionRequest(
        transactional_id=name)), [acl(who, C_, CLUSTER, "alter")], CLUSTER_DENIED, works)


def case_resolve_transaction(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)
    producer_id, epoch = open_txn(env, name, name)

    def works(reply: Message) -> None:
        assert isinstance(reply, tc.ResolveTransactionResponse)
        found = [r for r in reply.results if r.transactional_id == name]
        assert [r.fate for r in found] == [tc.FATE_ONGOING], reply

    return Case(lambda p: p.txn.ResolveTransaction(tc.ResolveTransactionRequest(
        producer_id=producer_id, producer_epoch=epoch,
        partition=records_pb2.TopicPartition(topic=name, partition=0),
        last_marker_timestamp_ms=-1)),
        [acl(who, C_, CLUSTER, "cluster_action")], CLUSTER_DENIED, works)


def case_prepare_transaction(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)
    producer_id, epoch = open_txn(env, name, name, two_phase=True)

    def works(reply: Message) -> None:
        assert isinstance(reply, tc.PrepareTransactionResponse)
        _ok(reply.error)
        assert describe_txn(env, name).state == "Prepared"

    return Case(lambda p: p.txn.PrepareTransaction(tc.PrepareTransactionRequest(
        transactional_id=name, producer_id=producer_id, producer_epoch=epoch)),
        [acl(who, X_, name, "write"), acl(who, X_, name, "two_phase_commit")], TXN_DENIED,
        works)


def case_complete_transaction(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)
    producer_id, epoch = open_txn(env, name, name, two_phase=True)
    prepared = env.admin.txn.PrepareTransaction(tc.PrepareTransactionRequest(
        transactional_id=name, producer_id=producer_id, producer_epoch=epoch))
    _ok(prepared.error)

    def works(reply: Message) -> None:
        assert isinstance(reply, tc.CompleteTransactionResponse)
        _ok(reply.error)
        assert reply.committed
        wait_txn_state(env, name, "CompleteCommit")

    return Case(lambda p: p.txn.CompleteTransaction(tc.CompleteTransactionRequest(
        transactional_id=name, producer_id=producer_id, producer_epoch=epoch,
        prepared_transaction=prepared.prepared_transaction)),
        [acl(who, X_, name, "write"), acl(who, X_, name, "two_phase_commit")], TXN_DENIED,
        works)


def case_consumer_group_heartbeat(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)
    env.groups.add(name)
    member_id = uuid.uuid4().hex

    def works(reply: Message) -> None:
        assert isinstance(reply, gc.ConsumerGroupHeartbeatResponse)
        _ok(reply.error)
        assert reply.member_id == member_id and reply.member_epoch > 0
        # Leave now: a session that expired later would change the group's
        # state under another case's snapshot.
        left = env.admin.groups.ConsumerGroupHeartbeat(gc.ConsumerGroupHeartbeatRequest(
            group_id=name, member_id=member_id, member_epoch=-1))
        _ok(left.error)

    return Case(lambda p: p.groups.ConsumerGroupHeartbeat(gc.ConsumerGroupHeartbeatRequest(
        group_id=name, member_id=member_id, member_epoch=0, session_timeout_ms=45_000,
        subscribed_topics=[name])),
        [acl(who, G_, name, "read"), acl(who, T_, name, "describe")], GROUP_DENIED, works)


def case_offset_commit(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)
    env.groups.add(name)

    def works(reply: Message) -> None:
        assert isinstance(reply, gc.OffsetCommitResponse)
        _ok(reply.error)
        for result in reply.results:
            _ok(result.error)

    return Case(lambda p: p.groups.OffsetCommit(gc.OffsetCommitRequest(
        group_id=name, generation_id=-1,
        partitions=[gc.OffsetCommitPartition(topic=name, partition=0, offset=1)])),
        [acl(who, G_, name, "read"), acl(who, T_, name, "read")], GROUP_DENIED, works)


def case_offset_fetch(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)
    commit_offset(env, name, name, 1)

    def works(reply: Message) -> None:
        assert isinstance(reply, gc.OffsetFetchResponse)
        _ok(reply.error)
        assert [(p.topic, p.offset, p.error.code) for p in reply.partitions] == [(name, 1, 0)]

    return Case(lambda p: p.groups.OffsetFetch(gc.OffsetFetchRequest(
        group_id=name, partitions=[TP(topic=name, partition=0)])),
        [acl(who, G_, name, "describe"), acl(who, T_, name, "describe")], GROUP_DENIED, works)


def case_txn_offset_commit(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)
    env.groups.add(name)
    producer_id, epoch = init_producer(env, name)
    added = env.admin.txn.AddOffsetsToTxn(tc.AddOffsetsToTxnRequest(
        transactional_id=name, producer_id=producer_id, producer_epoch=epoch, group_id=name))
    _ok(added.error)

    def works(reply: Message) -> None:
        assert isinstance(reply, gc.TxnOffsetCommitResponse)
        _ok(reply.error)
        for result in reply.results:
            _ok(result.error)

    return Case(lambda p: p.groups.TxnOffsetCommit(gc.TxnOffsetCommitRequest(
        transactional_id=name, group_id=name, producer_id=producer_id, producer_epoch=epoch,
        generation_id=-1, partitions=[gc.OffsetCommitPartition(topic=name, partition=0,
                                                               offset=1)])),
        [acl(who, X_, name, "write"), acl(who, G_, name, "read"), acl(who, T_, name, "read")],
        TXN_DENIED, works)


def case_list_groups(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)
    commit_offset(env, name, name)

    def hidden(reply: Message) -> None:
        assert isinstance(reply, gc.ListGroupsResponse)
        assert list(reply.groups) == []

    def works(reply: Message) -> None:
        assert isinstance(reply, gc.ListGroupsResponse)
        assert [g.group_id for g in reply.groups] == [name]

    return Case(lambda p: p.groups.ListGroups(gc.ListGroupsRequest()),
                [acl(who, G_, name, "describe")], None, works, hidden)


def case_describe_groups(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)
    commit_offset(env, name, name)

    def works(reply: Message) -> None:
        assert isinstance(reply, gc.DescribeGroupsResponse)
        [group] = reply.groups
        _ok(group.error)

    return Case(lambda p: p.groups.DescribeGroups(gc.DescribeGroupsRequest(group_ids=[name])),
                [acl(who, G_, name, "describe")], GROUP_DENIED, works)


def case_delete_groups(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)
    commit_offset(env, name, name)

    def works(reply: Message) -> None:
        assert isinstance(reply, gc.DeleteGroupsResponse)
        [result] = reply.results
        _ok(result.error)
        assert name not in {g.group_id for g in env.admin.groups.ListGroups(
            gc.ListGroupsRequest()).groups}

    return Case(lambda p: p.groups.DeleteGroups(gc.DeleteGroupsRequest(group_ids=[name])),
                [acl(who, G_, name, "delete")], GROUP_DENIED, works)


def _classic_join(name: str, *, require_known: bool = False) -> gc.JoinGroupRequest:
    return gc.JoinGroupRequest(
        group_id=name, session_timeout_ms=30_000, rebalance_timeout_ms=30_000,
        protocol_type="consumer", protocols=[gc.JoinGroupProtocol(name="range", metadata=b"m")],
        require_known_member_id=require_known)


def classic_member(env: Env, name: str) -> gc.JoinGroupResponse:
    """A classic group `name` with one member (joined as the admin, through
    the initial rebalance delay) and committed offsets, so retention keeps
    the group once the member is gone."""
    create_topic(env, name)
    commit_offset(env, name, name)
    joined: gc.JoinGroupResponse = env.admin.groups.JoinGroup(_classic_join(name), timeout=60)
    _ok(joined.error)
    return joined


def _leave_as_admin(env: Env, name: str, member_id: str) -> None:
    """Ends the case's member, so that no session expiry writes to
    __consumer_offsets while a later case compares the stored state."""
    left = env.admin.groups.LeaveGroup(gc.LeaveGroupRequest(
        group_id=name, members=[gc.LeaveGroupMember(member_id=member_id)]))
    for member in left.members:
        _ok(member.error)


def case_join_group(env: Env, who: str, name: str) -> Case:
    create_topic(env, name)
    commit_offset(env, name, name)

    def works(reply: Message) -> None:
        # Answered by the group protocol (KIP-394's first step): a member id
        # to join with, and nothing written.
        assert isinstance(reply, gc.JoinGroupResponse)
        assert ErrorCode.from_wire(reply.error.code) is ErrorCode.MEMBER_ID_REQUIRED, reply.error
        assert reply.member_id

    return Case(lambda p: p.groups.JoinGroup(_classic_join(name, require_known=True)),
                [acl(who, G_, name, "read")], GROUP_DENIED, works)


def case_sync_group(env: Env, who: str, name: str) -> Case:
    joined = classic_member(env, name)

    def works(reply: Message) -> None:
        assert isinstance(reply, gc.SyncGroupResponse)
        _ok(reply.error)
        assert reply.assignment == b"a"
        _leave_as_admin(env, name, joined.member_id)

    return Case(lambda p: p.groups.SyncGroup(gc.SyncGroupRequest(
        group_id=name, member_id=joined.member_id, generation_id=joined.generation_id,
        assignments=[gc.SyncGroupAssignment(member_id=joined.member_id, assignment=b"a")])),
        [acl(who, G_, name, "read")], GROUP_DENIED, works)


def case_classic_heartbeat(env: Env, who: str, name: str) -> Case:
    joined = classic_member(env, name)

    def works(reply: Message) -> None:
        assert isinstance(reply, gc.ClassicHeartbeatResponse)
        _ok(reply.error)
        _leave_as_admin(env, name, joined.member_id)

    return Case(lambda p: p.groups.ClassicHeartbeat(gc.ClassicHeartbeatRequest(
        group_id=name, member_id=joined.member_id, generation_id=joined.generation_id)),
        [acl(who, G_, name, "read")], GROUP_DENIED, works)


def case_leave_group(env: Env, who: str, name: str) -> Case:
    joined = classic_member(env, name)

    def works(reply: Message) -> None:
        assert isinstance(reply, gc.LeaveGroupResponse)
        assert [(m.member_id, m.error.code) for m in reply.members] == [(joined.member_id, 0)]

    return Case(lambda p: p.groups.LeaveGroup(gc.LeaveGroupRequest(
        group_id=name, members=[gc.LeaveGroupMember(member_id=joined.member_id)])),
        [acl(who, G_, name, "read")], GROUP_DENIED, works)


def _ps(method: str) -> str:
    return f"/oncelog.v1.PartitionStore/{method}"


def _tc(method: str) -> str:
    return f"/oncelog.v1.TransactionCoordinator/{method}"


def _gc(method: str) -> str:
    return f"/oncelog.v1.GroupCoordinator/{method}"


CASES: dict[str, Callable[[Env, str, str], Case]] = {
    _ps("Metadata"): case_metadata,
    _ps("CreateTopics"): case_create_topics,
    _ps("DeleteTopics"): case_delete_topics,
    _ps("CreatePartitions"): case_create_partitions,
    _ps("ListTopics"): case_list_topics,
    _ps("Produce"): case_produce,
    _ps("ProduceStream"): case_produce_stream,
    _ps("WriteTxnMarkersStream"): case_write_txn_markers_stream,
    _ps("Fetch"): case_fetch,
    _ps("ListOffsets"): case_list_offsets,
    _ps("WriteTxnMarkers"): case_write_txn_markers,
    _ps("DescribeProducers"): case_describe_producers,
    _ps("ReplicaFetch"): case_replica_fetch,
    _ps("ReplicaFetchStream"): case_replica_fetch_stream,
    _ps("OffsetsForLeaderEpoch"): case_offsets_for_leader_epoch,
    _ps("AlterPartitionReassignments"): case_alter_partition_reassignments,
    _ps("CreateAcls"): case_create_acls,
    _ps("DescribeAcls"): case_describe_acls,
    _ps("DeleteAcls"): case_delete_acls,
    _tc("FindCoordinator"): case_find_coordinator,
    _tc("InitProducerId"): case_init_producer_id,
    _tc("AddPartitionsToTxn"): case_add_partitions_to_txn,
    _tc("AddPartitionsToTxnStream"): case_add_partitions_to_txn_stream,
    _tc("AddOffsetsToTxn"): case_add_offsets_to_txn,
    _tc("EndTxn"): case_end_txn,
    _tc("EndTxnStream"): case_end_txn_stream,
    _tc("ListTransactions"): case_list_transactions,
    _tc("DescribeTransactions"): case_describe_transactions,
    _tc("AbortTransaction"): case_abort_transaction,
    _tc("ResolveTransaction"): case_resolve_transaction,
    _tc("PrepareTransaction"): case_prepare_transaction,
    _tc("CompleteTransaction"): case_complete_transaction,
    _gc("ConsumerGroupHeartbeat"): case_consumer_group_heartbeat,
    _gc("OffsetCommit"): case_offset_commit,
    _gc("OffsetFetch"): case_offset_fetch,
    _gc("TxnOffsetCommit"): case_txn_offset_commit,
    _gc("ListGroups"): case_list_groups,
    _gc("DescribeGroups"): case_describe_groups,
    _gc("DeleteGroups"): case_delete_groups,
    _gc("JoinGroup"): case_join_group,
    _gc("SyncGroup"): case_sync_group,
    _gc("ClassicHeartbeat"): case_classic_heartbeat,
    _gc("LeaveGroup"): case_leave_group,
}


def refusal(call: Callable[[], object]) -> tuple[grpc.StatusCode, ErrorCode, str]:
    """The gRPC status code, our error code and message of a call that must fail."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    error = error_from_rpc(info.value)
    return info.value.code(), ErrorCode.from_wire(error.code), error.message


@pytest.mark.parametrize("method", sorted(TABLE))
def test_acl_matrix(env: Env, method: str) -> None:
    factory = CASES.get(method)
    assert factory is not None, f"{method} has no case here: add one to CASES"
    rpc = method.rsplit("/", 1)[1]
    name = "mx-" + rpc.lower()
    who = f"User:{name}"
    with Principal(env.cluster, name) as principal:
        case = factory(env, who, name)
        before = snapshot(env)
        if case.denied is not None and case.in_band:
            error = case.call(principal).error  # type: ignore[attr-defined]
            code, message = ErrorCode.from_wire(error.code), error.message
            assert code == case.denied, message
            assert message.startswith(f"{who} is not allowed "), message
        elif case.denied is not None:
            status, code, message = refusal(lambda: case.call(principal))
            assert (status, code) == (grpc.StatusCode.PERMISSION_DENIED, case.denied), message
            assert message.startswith(f"{who} is not allowed "), message
        else:
            assert case.hidden is not None
            case.hidden(case.call(principal))
        assert snapshot(env) == before
        grant(env, *case.acls)
        case.works(case.call(principal))


# ------------------------------------------------------------ Kafka's rules


def _produce_as(principal: Principal, topic: str) -> ps.ProduceResponse:
    reply: ps.ProduceResponse = principal.store.Produce(ps.ProduceRequest(
        batches=[ps.PartitionBatch(topic=topic, partition=0, batch=_batch())], timeout_ms=10_000))
    return reply


def _end_offset(env: Env, topic: str) -> int:
    [result] = env.admin.store.ListOffsets(ps.ListOffsetsRequest(
        partitions=[ps.ListOffsetsPartition(topic=topic, partition=0, timestamp_ms=-1)])).results
    _ok(result.error)
    return int(result.offset)


def test_deny_beats_allow(env: Env) -> None:
    create_topic(env, "rules-deny")
    with Principal(env.cluster, "rules-denied") as principal:
        who = "User:rules-denied"
        grant(env, acl(who, T_, "rules-deny", "write"), acl(who, T_, "*", "all"),
              acl(who, T_, "rules-", "write", pattern_type="prefixed", permission="deny"))
        status, code, message = refusal(lambda: _produce_as(principal, "rules-deny"))
        assert (status, code) == (grpc.StatusCode.PERMISSION_DENIED, TOPIC_DENIED)
        assert message == f"{who} is not allowed Write on topic 'rules-deny'"
        assert _end_offset(env, "rules-deny") == 0
        # A deny of Write does not deny what Write implies when allowed otherwise.
        [listed] = principal.store.ListOffsets(ps.ListOffsetsRequest(partitions=[
            ps.ListOffsetsPartition(topic="rules-deny", partition=0, timestamp_ms=-1)])).results
        _ok(listed.error)


def test_prefixed_acls(env: Env) -> None:
    for topic in ("pfx-a", "pfx-b", "other-a"):
        create_topic(env, topic)
        produce(env, topic)
    with Principal(env.cluster, "rules-prefixed") as principal:
        grant(env, acl("User:rules-prefixed", T_, "pfx-", "read", pattern_type="prefixed"))

        def fetch(topic: str) -> ps.FetchResponse:
            reply: ps.FetchResponse = principal.store.Fetch(ps.FetchRequest(partitions=[
                ps.FetchPartition(topic=topic, partition=0, fetch_offset=0, max_bytes=1 << 20)],
                max_bytes=1 << 20))
            return reply

        for topic in ("pfx-a", "pfx-b"):
            [result] = fetch(topic).results
            _ok(result.error)
            assert result.batches
        status, code, _ = refusal(lambda: fetch("other-a"))
        assert (status, code) == (grpc.StatusCode.PERMISSION_DENIED, TOPIC_DENIED)
        # Listings: Read implies Describe, so exactly the prefixed topics show.
        names = [t.name for t in principal.store.ListTopics(ps.ListTopicsRequest()).topics]
        assert names == ["pfx-a", "pfx-b"]


def test_super_users_and_the_wildcard_principal(env: Env) -> None:
    create_topic(env, "rules-open")
    # A super user needs no ACL.
    assert _produce_as(env.admin, "rules-open").results[0].error.code == 0
    with Principal(env.cluster, "rules-anyone") as principal:
        status, _code, _ = refusal(lambda: _produce_as(principal, "rules-open"))
        assert status == grpc.StatusCode.PERMISSION_DENIED
        grant(env, acl("User:*", T_, "rules-open", "write"))
        assert _produce_as(principal, "rules-open").results[0].error.code == 0
    assert _end_offset(env, "rules-open") == 2


def test_bad_bindings_are_refused_naming_the_field_and_nothing_is_written(env: Env) -> None:
    before = snapshot(env)
    good = acl("User:rules-bad", T_, "rules-bad", "read")
    for bad, field_name in (
        (acl("alice", T_, "x", "read"), "creations[1].principal"),
        (acl("User:a", "topics", "x", "read"), "creations[1].resource_type"),
        (acl("User:a", T_, "x", "wrte"), "creations[1].operation"),
        (acl("User:a", G_, "x", "write"), "creations[1].operation"),
        (acl("User:a", T_, "", "read"), "creations[1].resource_name"),
        (acl("User:a", C_, "other", "alter"), "creations[1].resource_name"),
        (acl("User:a", T_, "x", "read", pattern_type="suffixed"), "creations[1].pattern_type"),
        (acl("User:a", T_, "x", "read", permission="maybe"), "creations[1].permission"),
    ):
        status, code, message = refusal(functools.partial(
            env.admin.store.CreateAcls, ps.CreateAclsRequest(creations=[good, bad])))
        assert (status, code) == (grpc.StatusCode.INVALID_ARGUMENT, ErrorCode.INVALID_REQUEST)
        assert message.startswith(f"{field_name}: "), message
    status, code, message = refusal(lambda: env.admin.store.DeleteAcls(ps.DeleteAclsRequest(
        filters=[ps.AclBindingFilter(), ps.AclBindingFilter(operation="nope")])))
    assert (status, code) == (grpc.StatusCode.INVALID_ARGUMENT, ErrorCode.INVALID_REQUEST)
    assert message.startswith("filters[1].operation: "), message
    assert snapshot(env) == before


def _denials(env: Env, principal_name: str) -> tuple[float, int]:
    """The store's denial counter for Write on topics, and how many log
    lines name this principal's denials."""
    url = env.cluster.metrics_url("partition_store")
    with urllib.request.urlopen(url, timeout=30) as resp:
        families = text_string_to_metric_families(resp.read().decode())
    count = 0.0
    for family in families:
        for sample in family.samples:
            if (sample.name == "oncelog_authorization_denials_total"
                    and sample.labels == {"service": "PartitionStore", "operation": "write",
                                          "resource_type": "topic"}):
                count = sample.value
    log_text = Path(env.cluster.processes["partition_store"][0].log_path).read_text()
    lines = [line for line in log_text.splitlines()
             if f"authorization denied: User:{principal_name} is not allowed" in line]
    return count, len(lines)


def test_denials_are_counted_and_logged_at_most_once_a_minute(env: Env) -> None:
    create_topic(env, "rules-counted")
    with Principal(env.cluster, "rules-counted") as principal:
        before, lines_before = _denials(env, "rules-counted")
        assert lines_before == 0
        for _ in range(3):
            status, _code, _ = refusal(lambda: _produce_as(principal, "rules-counted"))
            assert status == grpc.StatusCode.PERMISSION_DENIED
        after, lines = _denials(env, "rules-counted")
        assert after == before + 3
        # The same principal, operation and resource within a minute: one line.
        assert lines == 1


def test_a_cluster_without_an_authorizer_answers_security_disabled(
        tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "plain") as cluster, \
            grpc.insecure_channel(cluster.bootstrap) as channel:
        store = ps_grpc.PartitionStoreStub(channel)
        for call in (
            lambda: store.CreateAcls(ps.CreateAclsRequest(
                creations=[acl("User:a", T_, "x", "read")])),
            lambda: store.DescribeAcls(ps.DescribeAclsRequest()),
            lambda: store.DeleteAcls(ps.DeleteAclsRequest(filters=[ps.AclBindingFilter()])),
        ):
            status, code, message = refusal(call)
            assert (status, code) == (grpc.StatusCode.FAILED_PRECONDITION,
                                      ErrorCode.SECURITY_DISABLED)
            assert "--authorizer acl" in message
