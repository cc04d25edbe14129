"""The per-RPC operation table of services/common/security/operations.py.

Goal: every RPC of the three services states what it needs — a method added
to a proto without an entry fails here — and each entry reads the right
fields of its request: a transactional Produce needs Write on the
transactional id and each topic, send_offsets_to_transaction Read on the
group, and the services' own calls (markers, replication, coordinator
writes, verification) ClusterAction, so that a client holding every topic,
group and transactional-id permission still cannot forge markers or write
internal topics, whatever flags it sets. Listing calls filter their answers.
The table in docs/security.md is this table.

Method: walk the service descriptors of the generated modules
(sdk/oncelog/v1/*_pb2.py) and of gRPC health and reflection; resolve every
field path of the table against the request and response descriptors; run
each entry on a sample request and compare the checks; decide sample calls
with a real Authorizer; filter sample responses; parse the doc's table.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from google.protobuf.descriptor import Descriptor, MethodDescriptor
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from oncelog.v1 import coordinator_pb2 as tc
from oncelog.v1 import errors_pb2, records_pb2
from oncelog.v1 import group_coordinator_pb2 as gc
from oncelog.v1 import partition_store_pb2 as ps
from oncelog.wire.errors import ErrorCode
from services.common.security.authorizer import (
    CLUSTER_NAME,
    AclBinding,
    Authorizer,
    Operation,
    ResourceType,
)
from services.common.security.operations import (
    CLUSTER_ACTION,
    OPEN_METHODS,
    PLANNED_METHODS,
    TABLE,
    Alternative,
    AnswerFilter,
    Check,
    Need,
    apply_filter,
    first_denial,
    render_table,
    rule_for,
)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "security.md"
T, G, X, C = (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID,
              ResourceType.CLUSTER)
O = Operation  # noqa: E741 - short, as in the table itself


def _generated_methods() -> dict[str, MethodDescriptor]:
    methods: dict[str, MethodDescriptor] = {}
    for path in sorted((ROOT / "sdk" / "oncelog" / "v1").glob("*_pb2.py")):
        module = importlib.import_module(f"oncelog.v1.{path.stem}")
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                methods[f"/{service.full_name}/{method.name}"] = method
    return methods


METHODS = _generated_methods()


def test_the_walk_finds_the_three_services() -> None:
    services = {name.split("/")[1] for name in METHODS}
    assert services == {"oncelog.v1.PartitionStore", "oncelog.v1.TransactionCoordinator",
                        "oncelog.v1.GroupCoordinator"}
    assert len(METHODS) >= 25


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_rpc_is_in_the_table(method: str) -> None:
    assert method in TABLE, f"{method} states no operation: add it to operations.TABLE"
    assert method not in PLANNED_METHODS, (
        f"{method} is in the protos now: remove it from operations.PLANNED_METHODS")


def test_the_table_names_only_rpcs_that_exist_or_are_planned() -> None:
    assert set(TABLE) - set(METHODS) == PLANNED_METHODS
    # The ACL RPCs were planned; they are served now.
    assert {"/oncelog.v1.PartitionStore/CreateAcls",
            "/oncelog.v1.PartitionStore/DescribeAcls",
            "/oncelog.v1.PartitionStore/DeleteAcls"} <= set(METHODS)
    assert not PLANNED_METHODS


def test_open_methods_are_health_and_reflection() -> None:
    served = {
        f"/{service.full_name}/{method.name}"
        for module in (health_pb2, reflection_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    assert served == OPEN_METHODS
    assert not OPEN_METHODS & set(TABLE)


def _resolve(descriptor: Descriptor, path: str) -> None:
    """Fails unless every segment of a field path names a field (repeated
    where marked `[]`) of the message type it is read from."""
    current: Descriptor | None = descriptor
    for part in path.split("."):
        assert current is not None, f"{path}: {part} is read from a scalar"
        name = part.removesuffix("[]")
        field = current.fields_by_name.get(name)
        assert field is not None, f"{descriptor.full_name} has no field {name!r} ({path})"
        is_repeated = field.is_repeated
        assert is_repeated == part.endswith("[]"), (
            f"{descriptor.full_name}.{name} is {'' if is_repeated else 'not '}repeated ({path})")
        current = field.message_type


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_field_the_table_reads_exists(method: str) -> None:
    rule = TABLE[method]
    request_type = METHODS[method].input_type
    response_type = METHODS[method].output_type
    for need in rule.needs:
        if need.names:
            _resolve(request_type, need.names)
        for condition in need.when:
            name, _, enum_value = condition.lstrip("!").partition("=")
            field = request_type.fields_by_name.get(name)
            assert field is not None, f"{method}: condition on unknown field {name!r}"
            if enum_value:
                assert field.enum_type is not None
                assert enum_value in field.enum_type.values_by_name
    for answer_filter in rule.filters:
        # The last segment is the repeated field whose entries are filtered.
        _resolve(response_type, answer_filter.entries + "[]")
        entries = answer_filter.entries.split(".")
        entry_type: Descriptor | None = response_type
        for part in entries:
            assert entry_type is not None
            entry_type = entry_type.fields_by_name[part.removesuffix("[]")].message_type
        assert entry_type is not None
        assert answer_filter.name_field in entry_type.fields_by_name
        if answer_filter.clear:
            assert answer_filter.clear in entry_type.fields_by_name
        if answer_filter.named_by:
            _resolve(request_type, answer_filter.named_by)
            assert "error" in entry_type.fields_by_name


def chk(operation: Operation, resource_type: ResourceType, name: str = CLUSTER_NAME,
        *alternatives: Alternative) -> Check:
    return Check(operation, resource_type, name, tuple(alternatives))


def _batch(topic: str, partition: int = 0) -> ps.PartitionBatch:
    return ps.PartitionBatch(topic=topic, partition=partition, batch=b"...")


def _tps(*topics: str) -> list[records_pb2.TopicPartition]:
    return [records_pb2.TopicPartition(topic=t, partition=i) for i, t in enumerate(topics)]


CREATE_ON_CLUSTER = Alternative(O.CREATE, C)
WRITE_ANY_TOPIC = Alternative(O.WRITE, T)

# (method, sample request, the checks it needs, in order)
SAMPLES: list[tuple[str, Message, list[Check]]] = [
    # ---------------------------------------------------------- partition store
    ("/oncelog.v1.PartitionStore/Metadata", ps.MetadataRequest(topics=["a"]), []),
    ("/oncelog.v1.PartitionStore/CreateTopics",
     ps.CreateTopicsRequest(topics=[ps.TopicSpec(name="a"), ps.TopicSpec(name="b")]),
     [chk(O.CREATE, T, "a", CREATE_ON_CLUSTER, CLUSTER_ACTION),
      chk(O.CREATE, T, "b", CREATE_ON_CLUSTER, CLUSTER_ACTION)]),
    ("/oncelog.v1.PartitionStore/DeleteTopics", ps.DeleteTopicsRequest(names=["a"]),
     [chk(O.DELETE, T, "a", CLUSTER_ACTION)]),
    # The controller's "catalog changed" nudge: no names.
    ("/oncelog.v1.PartitionStore/DeleteTopics", ps.DeleteTopicsRequest(),
     [chk(O.CLUSTER_ACTION, C)]),
    ("/oncelog.v1.PartitionStore/ListTopics", ps.ListTopicsRequest(include_internal=True), []),
    # Kafka: Alter on each topic; a store forwarding to the controller
    # holds ClusterAction instead.
    ("/oncelog.v1.PartitionStore/CreatePartitions",
     ps.CreatePartitionsRequest(topics=[ps.CreatePartitionsTopic(name="a", count=4),
                                        ps.CreatePartitionsTopic(name="b", count=2)]),
     [chk(O.ALTER, T, "a", CLUSTER_ACTION), chk(O.ALTER, T, "b", CLUSTER_ACTION)]),
    # Idempotent produce: Write on each topic, once each.
    ("/oncelog.v1.PartitionStore/Produce",
     ps.ProduceRequest(batches=[_batch("a", 0), _batch("a", 1), _batch("b")]),
     [chk(O.WRITE, T, "a"), chk(O.WRITE, T, "b")]),
    # Transactional produce: the transactional id first, then the topics.
    ("/oncelog.v1.PartitionStore/Produce",
     ps.ProduceRequest(transactional_id="t-1", add_partitions_to_txn=True,
                       batches=[_batch("a"), _batch("b")]),
     [chk(O.WRITE, X, "t-1"), chk(O.WRITE, T, "a"), chk(O.WRITE, T, "b")]),
    # Each request of a stream is checked as a unary Produce would be.
    ("/oncelog.v1.PartitionStore/ProduceStream",
     ps.ProduceRequest(transactional_id="t-1", add_partitions_to_txn=True, request_id=7,
                       batches=[_batch("a"), _batch("b")]),
     [chk(O.WRITE, X, "t-1"), chk(O.WRITE, T, "a"), chk(O.WRITE, T, "b")]),
    # A coordinator's write to an internal topic (transactional or not):
    # ClusterAction, and nothing a client could hold instead.
    ("/oncelog.v1.PartitionStore/Produce",
     ps.ProduceRequest(coordinator_write=True, transactional_id="t-1",
                       batches=[_batch("__consumer_offsets", 3)]),
     [chk(O.CLUSTER_ACTION, C)]),
    ("/oncelog.v1.PartitionStore/Fetch",
     ps.FetchRequest(partitions=[ps.FetchPartition(topic="a"), ps.FetchPartition(topic="b")]),
     [chk(O.READ, T, "a", CLUSTER_ACTION), chk(O.READ, T, "b", CLUSTER_ACTION)]),
    ("/oncelog.v1.PartitionStore/ListOffsets",
     ps.ListOffsetsRequest(partitions=[ps.ListOffsetsPartition(topic="a")]),
     [chk(O.DESCRIBE, T, "a", CLUSTER_ACTION)]),
    ("/oncelog.v1.PartitionStore/WriteTxnMarkers",
     ps.WriteTxnMarkersRequest(markers=[ps.TxnMarker(producer_id=7, partitions=_tps("a"))]),
     [chk(O.CLUSTER_ACTION, C)]),
    ("/oncelog.v1.PartitionStore/WriteTxnMarkersStream",
     ps.WriteTxnMarkersRequest(request_id=3,
                               markers=[ps.TxnMarker(producer_id=7, partitions=_tps("a"))]),
     [chk(O.CLUSTER_ACTION, C)]),
    ("/oncelog.v1.PartitionStore/DescribeProducers",
     ps.DescribeProducersRequest(partitions=_tps("a", "b")),
     [chk(O.READ, T, "a"), chk(O.READ, T, "b")]),
    ("/oncelog.v1.PartitionStore/ReplicaFetch",
     ps.ReplicaFetchRequest(replica_id=2, partitions=[ps.ReplicaFetchPartition(topic="a")]),
     [chk(O.CLUSTER_ACTION, C)]),
    ("/oncelog.v1.PartitionStore/ReplicaFetchStream",
     ps.ReplicaFetchRequest(request_id=3, replica_id=2,
                            partitions=[ps.ReplicaFetchPartition(topic="a")]),
     [chk(O.CLUSTER_ACTION, C)]),
    ("/oncelog.v1.PartitionStore/OffsetsForLeaderEpoch",
     ps.OffsetsForLeaderEpochRequest(partitions=[ps.EpochQuery(topic="a")]),
     [chk(O.DESCRIBE, T, "a", CLUSTER_ACTION)]),
    ("/oncelog.v1.PartitionStore/AlterPartitionReassignments",
     ps.AlterPartitionReassignmentsRequest(partitions=[ps.ReassignPartition(topic="a")]),
     [chk(O.ALTER, C)]),
    # The ACL RPCs: Alter on the cluster to change ACLs, Describe to read them
    # (Kafka's), whatever the bindings name.
    ("/oncelog.v1.PartitionStore/CreateAcls",
     ps.CreateAclsRequest(creations=[ps.AclBinding(principal="User:a", resource_type="topic",
                                                   resource_name="a", operation="write")]),
     [chk(O.ALTER, C)]),
    ("/oncelog.v1.PartitionStore/DescribeAcls",
     ps.DescribeAclsRequest(filter=ps.AclBindingFilter(resource_type="topic")),
     [chk(O.DESCRIBE, C)]),
    ("/oncelog.v1.PartitionStore/DeleteAcls",
     ps.DeleteAclsRequest(filters=[ps.AclBindingFilter(principal="User:a")]),
     [chk(O.ALTER, C)]),
    # ------------------------------------------------- transaction coordinator
    ("/oncelog.v1.TransactionCoordinator/FindCoordinator",
     tc.FindCoordinatorRequest(key="t-1", type=tc.TRANSACTION), [chk(O.DESCRIBE, X, "t-1")]),
    ("/oncelog.v1.TransactionCoordinator/FindCoordinator",
     tc.FindCoordinatorRequest(key="g", type=tc.GROUP), [chk(O.DESCRIBE, G, "g")]),
    ("/oncelog.v1.TransactionCoordinator/InitProducerId", tc.InitProducerIdRequest(),
     [chk(O.IDEMPOTENT_WRITE, C, CLUSTER_NAME, WRITE_ANY_TOPIC)]),
    ("/oncelog.v1.TransactionCoordinator/InitProducerId",
     tc.InitProducerIdRequest(transactional_id="t-1"), [chk(O.WRITE, X, "t-1")]),
    ("/oncelog.v1.TransactionCoordinator/InitProducerId",
     tc.InitProducerIdRequest(transactional_id="t-1", enable_two_phase_commit=True,
                              keep_prepared_txn=True),
     [chk(O.WRITE, X, "t-1"), chk(O.TWO_PHASE_COMMIT, X, "t-1")]),
    ("/oncelog.v1.TransactionCoordinator/AddPartitionsToTxn",
     tc.AddPartitionsToTxnRequest(transactional_id="t-1", partitions=_tps("a", "b")),
     [chk(O.WRITE, X, "t-1", CLUSTER_ACTION), chk(O.WRITE, T, "a", CLUSTER_ACTION),
      chk(O.WRITE, T, "b", CLUSTER_ACTION)]),
    # A store verifying a producer's first write: ClusterAction only.
    ("/oncelog.v1.TransactionCoordinator/AddPartitionsToTxn",
     tc.AddPartitionsToTxnRequest(transactional_id="t-1", partitions=_tps("a"),
                                  verify_only=True),
     [chk(O.CLUSTER_ACTION, C)]),
    # Each request of the stores' stream is checked as a unary one would be.
    ("/oncelog.v1.TransactionCoordinator/AddPartitionsToTxnStream",
     tc.AddPartitionsToTxnRequest(transactional_id="t-1", partitions=_tps("a"), request_id=4),
     [chk(O.WRITE, X, "t-1", CLUSTER_ACTION), chk(O.WRITE, T, "a", CLUSTER_ACTION)]),
    # send_offsets_to_transaction: Write on the id, Read on the group.
    ("/oncelog.v1.TransactionCoordinator/AddOffsetsToTxn",
     tc.AddOffsetsToTxnRequest(transactional_id="t-1", group_id="g"),
     [chk(O.WRITE, X, "t-1"), chk(O.READ, G, "g")]),
    ("/oncelog.v1.TransactionCoordinator/EndTxn",
     tc.EndTxnRequest(transactional_id="t-1", commit=True), [chk(O.WRITE, X, "t-1")]),
    ("/oncelog.v1.TransactionCoordinator/EndTxnStream",
     tc.EndTxnRequest(transactional_id="t-1", commit=True, request_id=5),
     [chk(O.WRITE, X, "t-1")]),
    ("/oncelog.v1.TransactionCoordinator/ListTransactions", tc.ListTransactionsRequest(), []),
    ("/oncelog.v1.TransactionCoordinator/DescribeTransactions",
     tc.DescribeTransactionsRequest(transactional_ids=["t-1", "t-2"]),
     [chk(O.DESCRIBE, X, "t-1"), chk(O.DESCRIBE, X, "t-2")]),
    ("/oncelog.v1.TransactionCoordinator/AbortTransaction",
     tc.AbortTransactionRequest(transactional_id="t-1"), [chk(O.ALTER, C)]),
    ("/oncelog.v1.TransactionCoordinator/ResolveTransaction",
     tc.ResolveTransactionRequest(producer_id=7, partition=_tps("payments")[0]),
     [chk(O.CLUSTER_ACTION, C)]),
    ("/oncelog.v1.TransactionCoordinator/PrepareTransaction",
     tc.PrepareTransactionRequest(transactional_id="t-1"),
     [chk(O.WRITE, X, "t-1"), chk(O.TWO_PHASE_COMMIT, X, "t-1")]),
    ("/oncelog.v1.TransactionCoordinator/CompleteTransaction",
     tc.CompleteTransactionRequest(transactional_id="t-1"),
     [chk(O.WRITE, X, "t-1"), chk(O.TWO_PHASE_COMMIT, X, "t-1")]),
    # ------------------------------------------------------- group coordinator
    ("/oncelog.v1.GroupCoordinator/ConsumerGroupHeartbeat",
     gc.ConsumerGroupHeartbeatRequest(group_id="g", subscribed_topics=["a", "b"]),
     [chk(O.READ, G, "g"), chk(O.DESCRIBE, T, "a"), chk(O.DESCRIBE, T, "b")]),
    ("/oncelog.v1.GroupCoordinator/OffsetCommit",
     gc.OffsetCommitRequest(group_id="g", partitions=[gc.OffsetCommitPartition(topic="a")]),
     [chk(O.READ, G, "g"), chk(O.READ, T, "a")]),
    ("/oncelog.v1.GroupCoordinator/OffsetFetch",
     gc.OffsetFetchRequest(group_id="g", partitions=_tps("a")), [chk(O.DESCRIBE, G, "g")]),
    ("/oncelog.v1.GroupCoordinator/TxnOffsetCommit",
     gc.TxnOffsetCommitRequest(transactional_id="t-1", group_id="g",
                               partitions=[gc.OffsetCommitPartition(topic="a")]),
     [chk(O.WRITE, X, "t-1"), chk(O.READ, G, "g"), chk(O.READ, T, "a")]),
    ("/oncelog.v1.GroupCoordinator/ListGroups", gc.ListGroupsRequest(), []),
    ("/oncelog.v1.GroupCoordinator/DescribeGroups",
     gc.DescribeGroupsRequest(group_ids=["g"]), [chk(O.DESCRIBE, G, "g")]),
    ("/oncelog.v1.GroupCoordinator/DeleteGroups",
     gc.DeleteGroupsRequest(group_ids=["g", "h"]),
     [chk(O.DELETE, G, "g"), chk(O.DELETE, G, "h")]),
    ("/oncelog.v1.GroupCoordinator/JoinGroup",
     gc.JoinGroupRequest(group_id="g", protocol_type="consumer",
                         protocols=[gc.JoinGroupProtocol(name="range")]),
     [chk(O.READ, G, "g")]),
    ("/oncelog.v1.GroupCoordinator/SyncGroup",
     gc.SyncGroupRequest(group_id="g", assignments=[gc.SyncGroupAssignment(member_id="m")]),
     [chk(O.READ, G, "g")]),
    ("/oncelog.v1.GroupCoordinator/ClassicHeartbeat",
     gc.ClassicHeartbeatRequest(group_id="g", member_id="m"), [chk(O.READ, G, "g")]),
    ("/oncelog.v1.GroupCoordinator/LeaveGroup",
     gc.LeaveGroupRequest(group_id="g", members=[gc.LeaveGroupMember(member_id="m")]),
     [chk(O.READ, G, "g")]),
]


def test_every_rpc_has_a_sample() -> None:
    assert {method for method, _, _ in SAMPLES} == set(METHODS)


@pytest.mark.parametrize(("method", "request_message", "expected"), SAMPLES,
                         ids=[f"{m.rsplit('/', 1)[1]}-{i}" for i, (m, _, _) in enumerate(SAMPLES)])
def test_each_entry_reads_its_request(method: str, request_message: Message,
                                      expected: list[Check]) -> None:
    assert request_message.DESCRIPTOR is METHODS[method].input_type
    assert rule_for(method).checks(request_message) == expected


def test_the_acl_rpcs_need_cluster_alter_and_describe() -> None:
    assert rule_for("/oncelog.v1.PartitionStore/CreateAcls").checks(
        ps.CreateAclsRequest()) == [chk(O.ALTER, C)]
    assert rule_for("/oncelog.v1.PartitionStore/DescribeAcls").checks(
        ps.DescribeAclsRequest()) == [chk(O.DESCRIBE, C)]
    assert rule_for("/oncelog.v1.PartitionStore/DeleteAcls").checks(
        ps.DeleteAclsRequest()) == [chk(O.ALTER, C)]
    with pytest.raises(KeyError):
        rule_for("/oncelog.v1.PartitionStore/NoSuchMethod")


def test_a_need_on_the_cluster_names_no_field() -> None:
    with pytest.raises(ValueError, match="on the cluster names no field"):
        Need(O.ALTER, C, "topics[]")
    with pytest.raises(ValueError, match="any other names one"):
        Need(O.READ, T)


ALICE = "User:alice"
HOST = "10.0.0.7"


def _allow(resource_type: str, name: str, operation: str, pattern: str = "literal",
           principal: str = ALICE) -> AclBinding:
    return AclBinding.of(principal=principal, resource_type=resource_type, resource_name=name,
                         pattern_type=pattern, operation=operation)


# Every permission a client could hold short of cluster-level ones.
EVERYTHING_BUT_THE_CLUSTER = Authorizer([
    _allow("topic", "*", "all"), _allow("group", "*", "all"),
    _allow("transactional_id", "*", "all"),
    _allow("cluster", CLUSTER_NAME, "create"), _allow("cluster", CLUSTER_NAME, "alter"),
    _allow("cluster", CLUSTER_NAME, "describe"),
    _allow("cluster", CLUSTER_NAME, "idempotent_write"),
])
SERVICE = "User:oncelog-service"
SERVICES_ONLY = Authorizer([_allow("cluster", CLUSTER_NAME, "cluster_action",
                                   principal=SERVICE)])

# Requests only the services may make: markers, replication, coordinator
# writes to internal topics (with and without a transactional id, even to a
# user topic), a store's verification, the controller's nudge.
SERVICE_CALLS: list[tuple[str, Message]] = [
    ("/oncelog.v1.PartitionStore/WriteTxnMarkers",
     ps.WriteTxnMarkersRequest(markers=[ps.TxnMarker(producer_id=7, type=ps.COMMIT,
                                                     partitions=_tps("payments"))])),
    ("/oncelog.v1.PartitionStore/ReplicaFetch",
     ps.ReplicaFetchRequest(partitions=[ps.ReplicaFetchPartition(topic="payments")])),
    ("/oncelog.v1.PartitionStore/Produce",
     ps.ProduceRequest(coordinator_write=True, batches=[_batch("__transaction_state")])),
    ("/oncelog.v1.PartitionStore/Produce",
     ps.ProduceRequest(coordinator_write=True, transactional_id="t-1",
                       batches=[_batch("__consumer_offsets")])),
    ("/oncelog.v1.PartitionStore/Produce",
     ps.ProduceRequest(coordinator_write=True, batches=[_batch("payments")])),
    ("/oncelog.v1.TransactionCoordinator/AddPartitionsToTxn",
     tc.AddPartitionsToTxnRequest(transactional_id="t-1", partitions=_tps("payments"),
                                  verify_only=True)),
    ("/oncelog.v1.PartitionStore/DeleteTopics", ps.DeleteTopicsRequest()),
    ("/oncelog.v1.TransactionCoordinator/ResolveTransaction",
     tc.ResolveTransactionRequest(producer_id=7, partition=_tps("payments")[0])),
]


@pytest.mark.parametrize(("method", "request_message"), SERVICE_CALLS,
                         ids=[m.rsplit("/", 1)[1] for m, _ in SERVICE_CALLS])
def test_no_client_can_make_the_services_calls(method: str, request_message: Message) -> None:
    checks = rule_for(method).checks(request_message)
    denial = first_denial(EVERYTHING_BUT_THE_CLUSTER, ALICE, HOST, checks)
    assert denial is not None
    assert denial.code is ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert denial.message == "User:alice is not allowed ClusterAction on the cluster"
    assert first_denial(SERVICES_ONLY, SERVICE, HOST, checks) is None


# Everything the services do on a client's behalf or for themselves passes
# with ClusterAction alone.
SERVICE_ON_BEHALF: list[tuple[str, Message]] = [
    ("/oncelog.v1.PartitionStore/Fetch", ps.FetchRequest(
        partitions=[ps.FetchPartition(topic="__consumer_offsets")],
        include_control_batches=True)),
    ("/oncelog.v1.PartitionStore/ListOffsets", ps.ListOffsetsRequest(
        partitions=[ps.ListOffsetsPartition(topic="__transaction_state")])),
    ("/oncelog.v1.PartitionStore/CreateTopics",
     ps.CreateTopicsRequest(topics=[ps.TopicSpec(name="payments")])),
    ("/oncelog.v1.PartitionStore/DeleteTopics", ps.DeleteTopicsRequest(names=["payments"])),
    ("/oncelog.v1.PartitionStore/CreatePartitions", ps.CreatePartitionsRequest(
        topics=[ps.CreatePartitionsTopic(name="payments", count=4)])),
    ("/oncelog.v1.PartitionStore/OffsetsForLeaderEpoch",
     ps.OffsetsForLeaderEpochRequest(partitions=[ps.EpochQuery(topic="payments")])),
    ("/oncelog.v1.TransactionCoordinator/AddPartitionsToTxn",
     tc.AddPartitionsToTxnRequest(transactional_id="t-1", partitions=_tps("payments"))),
]


@pytest.mark.parametrize(("method", "request_message"), SERVICE_ON_BEHALF,
                         ids=[m.rsplit("/", 1)[1] for m, _ in SERVICE_ON_BEHALF])
def test_cluster_action_covers_the_services_other_calls(method: str,
                                                        request_message: Message) -> None:
    checks = rule_for(method).checks(request_message)
    assert checks
    assert first_denial(SERVICES_ONLY, SERVICE, HOST, checks) is None
    assert first_denial(Authorizer(), ALICE, HOST, checks) is not None


@pytest.mark.parametrize(("bindings", "code", "message"), [
    # Nothing granted: the transactional id is asked first.
    ((), ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
     "User:alice is not allowed Write on transactional id 't-1'"),
    # The id granted, one topic of two: that topic is named.
    ((_allow("transactional_id", "t-", "write", "prefixed"), _allow("topic", "payments", "write")),
     ErrorCode.TOPIC_AUTHORIZATION_FAILED, "User:alice is not allowed Write on topic 'ledger'"),
    # Everything needed.
    ((_allow("transactional_id", "t-1", "write"), _allow("topic", "*", "write")), None, ""),
])
def test_a_transactional_produce_is_decided_in_order(bindings: tuple[AclBinding, ...],
                                                     code: ErrorCode | None,
                                                     message: str) -> None:
    request = ps.ProduceRequest(transactional_id="t-1",
                                batches=[_batch("payments"), _batch("ledger")])
    checks = rule_for("/oncelog.v1.PartitionStore/Produce").checks(request)
    denial = first_denial(Authorizer(bindings), ALICE, HOST, checks)
    if code is None:
        assert denial is None
        return
    assert denial is not None
    assert (denial.code, denial.message) == (code, message)
    assert denial.principal == ALICE and denial.decision.allowed is False


def test_an_idempotent_producer_needs_idempotent_write_or_write_on_some_topic() -> None:
    checks = rule_for("/oncelog.v1.TransactionCoordinator/InitProducerId").checks(
        tc.InitProducerIdRequest())
    nothing = first_denial(Authorizer(), ALICE, HOST, checks)
    assert nothing is not None and nothing.code is ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert nothing.message == ("User:alice is not allowed IdempotentWrite on the cluster "
                               "(nor Write on any topic)")
    for grant in (_allow("cluster", CLUSTER_NAME, "idempotent_write"),
                  _allow("topic", "payments", "write"),
                  _allow("topic", "pay", "write", "prefixed")):
        assert first_denial(Authorizer([grant]), ALICE, HOST, checks) is None, grant
    # Read on a topic is not Write.
    assert first_denial(Authorizer([_allow("topic", "payments", "read")]), ALICE, HOST,
                        checks) is not None


def test_long_names_are_cut_in_messages() -> None:
    long_topic = "t" * 300
    checks = rule_for("/oncelog.v1.PartitionStore/Fetch").checks(
        ps.FetchRequest(partitions=[ps.FetchPartition(topic=long_topic)]))
    denial = first_denial(Authorizer(), ALICE, HOST, checks)
    assert denial is not None
    assert f"'{'t' * 64}...'" in denial.message and len(denial.message) < 200


def _allowed_by(authorizer: Authorizer) -> Callable[[Check], bool]:
    def allowed(check: Check) -> bool:
        return first_denial(authorizer, ALICE, HOST, [check]) is None
    return allowed


def test_metadata_leaves_out_topics_the_caller_cannot_describe() -> None:
    authorizer = Authorizer([_allow("topic", "payments", "read"),
                             _allow("topic", "ledger", "alter_configs")])
    response = ps.MetadataResponse(topics=[
        ps.TopicMetadata(name="payments", topic_id=1, config={"retention.ms": "1"},
                         partitions=[ps.PartitionMetadata(partition=0)]),
        ps.TopicMetadata(name="ledger", topic_id=2, config={"retention.ms": "2"}),
        ps.TopicMetadata(name="secret", topic_id=3, config={"retention.ms": "3"}),
    ])
    rule = rule_for("/oncelog.v1.PartitionStore/Metadata")
    request = ps.MetadataRequest()
    for answer_filter in rule.filters:
        apply_filter(answer_filter, request, response, _allowed_by(authorizer))
    # ledger: AlterConfigs implies DescribeConfigs but not Describe.
    assert [t.name for t in response.topics] == ["payments"]
    # payments: Read implies Describe, not DescribeConfigs: its config is hidden.
    assert dict(response.topics[0].config) == {} and len(response.topics[0].partitions) == 1


def test_metadata_answers_a_named_topic_with_the_error() -> None:
    authorizer = Authorizer([_allow("topic", "payments", "describe_configs"),
                             _allow("topic", "payments", "describe")])
    request = ps.MetadataRequest(topics=["payments", "secret"])
    response = ps.MetadataResponse(topics=[
        ps.TopicMetadata(name="payments", topic_id=1, config={"a": "b"}),
        ps.TopicMetadata(name="secret", topic_id=3, internal=True,
                         partitions=[ps.PartitionMetadata(partition=0, leader_node_id=1)]),
    ])
    changed = sum(apply_filter(f, request, response, _allowed_by(authorizer),
                               principal="User:alice")
                  for f in rule_for("/oncelog.v1.PartitionStore/Metadata").filters)
    assert changed == 2  # secret: refused, then its (already empty) config
    payments, secret = response.topics
    assert payments.topic_id == 1 and dict(payments.config) == {"a": "b"}
    assert secret == ps.TopicMetadata(name="secret", error=errors_pb2.Error(
        code=errors_pb2.TOPIC_AUTHORIZATION_FAILED,
        message="User:alice is not allowed Describe on topic 'secret'"))


def test_nested_and_cluster_wide_filters() -> None:
    authorizer = Authorizer([_allow("topic", "payments", "write"),
                             _allow("transactional_id", "t-", "describe", "prefixed")])
    listing = tc.ListTransactionsResponse(transactions=[
        tc.TransactionListing(transactional_id="t-1"),
        tc.TransactionListing(transactional_id="other")])
    (listing_filter,) = rule_for("/oncelog.v1.TransactionCoordinator/ListTransactions").filters
    apply_filter(listing_filter, tc.ListTransactionsRequest(), listing,
                 _allowed_by(authorizer))
    assert [t.transactional_id for t in listing.transactions] == ["t-1"]
    described = tc.DescribeTransactionsResponse(transactions=[
        tc.TransactionDescription(transactional_id="t-1", partitions=_tps("payments", "secret")),
        tc.TransactionDescription(transactional_id="t-2", partitions=_tps("secret"))])
    (partitions_filter,) = rule_for(
        "/oncelog.v1.TransactionCoordinator/DescribeTransactions").filters
    assert apply_filter(partitions_filter, tc.DescribeTransactionsRequest(), described,
                        _allowed_by(authorizer)) == 2
    assert [[p.topic for p in t.partitions] for t in described.transactions] == [["payments"], []]
    # Describe on the cluster lists every group (Kafka's ListGroups).
    groups = gc.ListGroupsResponse(groups=[gc.GroupListing(group_id="g"),
                                           gc.GroupListing(group_id="h")])
    (groups_filter,) = rule_for("/oncelog.v1.GroupCoordinator/ListGroups").filters
    apply_filter(groups_filter, gc.ListGroupsRequest(), groups,
                 _allowed_by(Authorizer([_allow("group", "g", "read")])))
    assert [g.group_id for g in groups.groups] == ["g"]
    groups.groups.add(group_id="h")
    apply_filter(groups_filter, gc.ListGroupsRequest(), groups, _allowed_by(
        Authorizer([_allow("cluster", CLUSTER_NAME, "describe")])))
    assert [g.group_id for g in groups.groups] == ["g", "h"]


def test_an_answer_filter_describes_itself() -> None:
    answer_filter = AnswerFilter(O.DESCRIBE, T, "topics", "name")
    assert answer_filter.check("a") == chk(O.DESCRIBE, T, "a")
    assert answer_filter.describe() == "answer: `topics` filtered to Describe on each topic"


def _documented_table() -> list[tuple[str, str]]:
    text = DOC.read_text()
    section = text.split("## What each RPC needs", 1)[1]
    rows: list[tuple[str, str]] = []
    for line in section.splitlines():
        match = re.fullmatch(r"\| `([^`]+)` \| (.*) \|", line.strip())
        if match is None:
            if rows:
                break  # the table ended
            continue
        rows.append((match.group(1), match.group(2)))
    return rows


def test_the_documented_table_is_the_table() -> None:
    assert _documented_table() == render_table(), (
        "docs/security.md's table differs from operations.TABLE; print the rows with "
        "render_table() and paste them")
