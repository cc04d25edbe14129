"""Enum fields beside the strings, on a real cluster, through raw gRPC stubs.

Goal: a client that sends only the proto enums (as a generated client in
another language may) is served exactly as one that sends only the strings:
ACLs created, described and deleted with enum fields only and with strings
only; ListTransactions and ListGroups filtered by enum states. A request
whose string and enum name different values fails with INVALID_REQUEST in
the status details (never UNKNOWN) and changes nothing. Every answer carries
both fields, naming the same value.

Method: one LocalCluster(security=True) for the module (the ACL RPCs need the
authorizer; one partition of each internal topic), raw stubs over TLS as
`User:admin`, a super user (tests/support/tls.py). An open transaction, an
initialized one with none open, and a group with committed offsets only
(Kafka's "simple" group, Empty) are the states listed. The ACL RPCs read the
store's ACL view refreshed first, so an answer reflects every change
acknowledged before it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from oncelog.errors import ErrorCode
from oncelog.records import encode_batch
from oncelog.testing import LocalCluster
from oncelog.v1 import coordinator_pb2 as tc
from oncelog.v1 import group_coordinator_pb2 as gc
from oncelog.v1 import partition_store_pb2 as ps
from oncelog.wire import proto_enums as pe
from oncelog.wire.status import error_from_rpc
from tests.support.polling import retrying
from tests.support.tls import Principal

# The open transaction must not time out while the module runs.
TXN_TIMEOUT_MS = 900_000
TOPIC = "pe-topic"
ONGOING_ID = "pe-ongoing"
EMPTY_ID = "pe-empty"
GROUP = "pe-simple"


@pytest.fixture(scope="module")
def admin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Principal]:
    with LocalCluster(tmp_path_factory.mktemp("protoenums") / "cluster", security=True,
                      transaction_state_partitions=1, consumer_offsets_partitions=1,
                      ) as cluster, Principal(cluster, "admin") as admin:
        yield admin


def refusal(call: Callable[[], object]) -> tuple[grpc.StatusCode, ErrorCode, str]:
    """The gRPC status code, our error code and message of a call that must fail."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    error = error_from_rpc(info.value)
    return info.value.code(), ErrorCode.from_wire(error.code), error.message


def _ok(error: Any) -> None:
    assert error.code == 0, error


def _pairs_agree(message: Any, *tables: tuple[str, pe.ProtoEnum[Any, Any]]) -> None:
    """Each (string, enum) pair of an answer is set and names one value."""
    for name, table in tables:
        number = getattr(message, f"{name}_enum")
        assert number != 0, f"{name}_enum unset in {message}"
        assert getattr(message, name) == table.word(number), message


ACL_TABLES = (("resource_type", pe.ACL_RESOURCE_TYPES), ("pattern_type", pe.ACL_PATTERN_TYPES),
              ("operation", pe.ACL_OPERATIONS), ("permission", pe.ACL_PERMISSIONS))


def _describe(admin: Principal, acl_filter: ps.AclBindingFilter) -> list[ps.AclBinding]:
    reply = admin.store.DescribeAcls(ps.DescribeAclsRequest(filter=acl_filter))
    _ok(reply.error)
    for binding in reply.bindings:
        _pairs_agree(binding, *ACL_TABLES)
    return list(reply.bindings)


def _everything(admin: Principal) -> list[ps.AclBinding]:
    return _describe(admin, ps.AclBindingFilter())


# ------------------------------------------------------------------- ACLs

ENUMS_ONLY = ps.AclBinding(
    principal="User:pe-enums", host="*",
    resource_type_enum=ps.ACL_RESOURCE_TYPE_TRANSACTIONAL_ID, resource_name="app-",
    pattern_type_enum=ps.ACL_PATTERN_TYPE_PREFIXED,
    operation_enum=ps.ACL_OPERATION_TWO_PHASE_COMMIT, permission_enum=ps.ACL_PERMISSION_DENY)
STRINGS_ONLY = ps.AclBinding(
    principal="User:pe-strings", host="*", resource_type="topic", resource_name=TOPIC,
    pattern_type="literal", operation="read", permission="allow")


def test_acls_by_enums_only_by_strings_only_and_conflicting(admin: Principal) -> None:
    before = _everything(admin)
    reply = retrying(lambda: admin.store.CreateAcls(ps.CreateAclsRequest(
        creations=[ENUMS_ONLY, STRINGS_ONLY])))
    for result in reply.results:
        _ok(result)

    # The enum-only binding reads back as the strings name it, and the
    # strings-only one with its enums: a filter of either kind finds each.
    [by_enum] = _describe(admin, ps.AclBindingFilter(
        principal="User:pe-enums", resource_type_enum=ps.ACL_RESOURCE_TYPE_TRANSACTIONAL_ID,
        pattern_type_enum=ps.ACL_PATTERN_TYPE_PREFIXED))
    [by_string] = _describe(admin, ps.AclBindingFilter(
        principal="User:pe-enums", resource_type="transactional_id", pattern_type="prefixed"))
    assert by_enum == by_string
    assert (by_enum.resource_type, by_enum.pattern_type, by_enum.operation,
            by_enum.permission) == ("transactional_id", "prefixed", "two_phase_commit", "deny")
    [strings_read] = _describe(admin, ps.AclBindingFilter(
        resource_type_enum=ps.ACL_RESOURCE_TYPE_TOPIC, resource_name=TOPIC,
        pattern_type_enum=ps.ACL_PATTERN_TYPE_MATCH, operation_enum=ps.ACL_OPERATION_ANY))
    assert (strings_read.resource_type_enum, strings_read.operation_enum,
            strings_read.permission_enum) == (ps.ACL_RESOURCE_TYPE_TOPIC, ps.ACL_OPERATION_READ,
                                              ps.ACL_PERMISSION_ALLOW)

    # Conflicting pairs: INVALID_REQUEST naming both, and nothing changes.
    after_create = _everything(admin)
    assert len(after_create) == len(before) + 2
    innocent = ps.AclBinding(principal="User:pe-innocent", resource_type="group",
                             resource_name="g", operation="read")
    conflicting = ps.AclBinding(principal="User:pe-conflict", resource_type="topic",
                                resource_type_enum=ps.ACL_RESOURCE_TYPE_GROUP,
                                resource_name="t", operation="read")
    status, code, message = refusal(lambda: admin.store.CreateAcls(ps.CreateAclsRequest(
        creations=[innocent, conflicting])))
    assert (status, code) == (grpc.StatusCode.INVALID_ARGUMENT, ErrorCode.INVALID_REQUEST)
    assert "creations[1].resource_type 'topic'" in message, message
    assert "creations[1].resource_type_enum ACL_RESOURCE_TYPE_GROUP" in message, message
    status, code, message = refusal(lambda: admin.store.DeleteAcls(ps.DeleteAclsRequest(
        filters=[ps.AclBindingFilter(principal="User:pe-strings"),
                 ps.AclBindingFilter(permission="allow",
                                     permission_enum=ps.ACL_PERMISSION_DENY)])))
    assert (status, code) == (grpc.StatusCode.INVALID_ARGUMENT, ErrorCode.INVALID_REQUEST)
    assert "filters[1].permission 'allow'" in message, message
    status, code, _ = refusal(lambda: admin.store.DescribeAcls(ps.DescribeAclsRequest(
        filter=ps.AclBindingFilter(pattern_type="literal",
                                   pattern_type_enum=ps.ACL_PATTERN_TYPE_MATCH))))
    assert (status, code) == (grpc.StatusCode.INVALID_ARGUMENT, ErrorCode.INVALID_REQUEST)
    assert _everything(admin) == after_create

    # Deleted by an enum-only filter and by a strings-only one.
    deleted = admin.store.DeleteAcls(ps.DeleteAclsRequest(filters=[
        ps.AclBindingFilter(principal="User:pe-enums",
                            operation_enum=ps.ACL_OPERATION_TWO_PHASE_COMMIT,
                            permission_enum=ps.ACL_PERMISSION_DENY),
        ps.AclBindingFilter(principal="User:pe-strings", operation="read", permission="allow"),
    ]))
    assert [list(r.matching) for r in deleted.results] == [[by_enum], [strings_read]]
    for filter_result in deleted.results:
        for binding in filter_result.matching:
            _pairs_agree(binding, *ACL_TABLES)
    assert _everything(admin) == before


# ------------------------------------------------------- states as filters


@pytest.fixture(scope="module")
def states(admin: Principal) -> None:
    """An Ongoing transaction, an Empty one, and an Empty (simple) group."""
    reply = retrying(lambda: admin.store.CreateTopics(ps.CreateTopicsRequest(
        topics=[ps.TopicSpec(name=TOPIC, partitions=1)])))
    _ok(reply.results[0].error)
    ids: dict[str, tuple[int, int]] = {}
    for txn_id in (ONGOING_ID, EMPTY_ID):
        init = retrying(functools.partial(admin.txn.InitProducerId, tc.InitProducerIdRequest(
            transactional_id=txn_id, transaction_timeout_ms=TXN_TIMEOUT_MS)))
        _ok(init.error)
        ids[txn_id] = (init.producer_id, init.producer_epoch)
    producer_id, epoch = ids[ONGOING_ID]
    batch = encode_batch([(b"k", b"v", None, int(time.time() * 1000))], producer_id=producer_id,
                         producer_epoch=epoch, base_sequence=0, transactional=True)
    produced = retrying(lambda: admin.store.Produce(ps.ProduceRequest(
        batches=[ps.PartitionBatch(topic=TOPIC, partition=0, batch=batch)], timeout_ms=10_000,
        transactional_id=ONGOING_ID, add_partitions_to_txn=True)))
    _ok(produced.results[0].error)
    committed = retrying(lambda: admin.groups.OffsetCommit(gc.OffsetCommitRequest(
        group_id=GROUP, generation_id=-1,
        partitions=[gc.OffsetCommitPartition(topic=TOPIC, partition=0, offset=1)])))
    _ok(committed.error)


def _transactions(admin: Principal, request: tc.ListTransactionsRequest) -> list[str]:
    reply = admin.txn.ListTransactions(request)
    _ok(reply.error)
    for listing in reply.transactions:
        _pairs_agree(listing, ("state", pe.TRANSACTION_STATES))
    return sorted(t.transactional_id for t in reply.transactions
                  if t.transactional_id in (ONGOING_ID, EMPTY_ID))


def test_list_transactions_by_enum_states(admin: Principal, states: None) -> None:
    by_enum = _transactions(admin, tc.ListTransactionsRequest(
        states_enum=[tc.TRANSACTION_STATE_ONGOING]))
    assert by_enum == [ONGOING_ID]
    assert _transactions(admin, tc.ListTransactionsRequest(states=["Ongoing"])) == by_enum
    assert _transactions(admin, tc.ListTransactionsRequest(
        states=["Empty", "Ongoing"],
        states_enum=[tc.TRANSACTION_STATE_EMPTY, tc.TRANSACTION_STATE_ONGOING])) == [
        EMPTY_ID, ONGOING_ID]
    assert _transactions(admin, tc.ListTransactionsRequest(
        states_enum=[tc.TRANSACTION_STATE_EMPTY])) == [EMPTY_ID]
    status, code, message = refusal(lambda: admin.txn.ListTransactions(
        tc.ListTransactionsRequest(states=["Empty"],
                                   states_enum=[tc.TRANSACTION_STATE_ONGOING])))
    assert (status, code) == (grpc.StatusCode.INVALID_ARGUMENT, ErrorCode.INVALID_REQUEST)
    assert "states[0] 'Empty' and states_enum[0] TRANSACTION_STATE_ONGOING" in message, message
    described = admin.txn.DescribeTransactions(tc.DescribeTransactionsRequest(
        transactional_ids=[ONGOING_ID, EMPTY_ID])).transactions
    assert [(d.state, d.state_enum) for d in described] == [
        ("Ongoing", tc.TRANSACTION_STATE_ONGOING), ("Empty", tc.TRANSACTION_STATE_EMPTY)]


def _groups(admin: Principal, request: gc.ListGroupsRequest) -> list[str]:
    reply = admin.groups.ListGroups(request)
    _ok(reply.error)
    for listing in reply.groups:
        _pairs_agree(listing, ("state", pe.GROUP_STATES))
    return [g.group_id for g in reply.groups if g.group_id == GROUP]


def test_list_groups_by_enum_states(admin: Principal, states: None) -> None:
    assert _groups(admin, gc.ListGroupsRequest(states_enum=[gc.GROUP_STATE_EMPTY])) == [GROUP]
    assert _groups(admin, gc.ListGroupsRequest(states=["Empty"])) == [GROUP]
    assert _groups(admin, gc.ListGroupsRequest(states_enum=[gc.GROUP_STATE_STABLE])) == []
    assert _groups(admin, gc.ListGroupsRequest(states=["Stable"])) == []
    status, code, message = refusal(lambda: admin.groups.ListGroups(gc.ListGroupsRequest(
        states=["Stable"], states_enum=[gc.GROUP_STATE_EMPTY])))
    assert (status, code) == (grpc.StatusCode.INVALID_ARGUMENT, ErrorCode.INVALID_REQUEST)
    assert "states[0] 'Stable' and states_enum[0] GROUP_STATE_EMPTY" in message, message
    [described] = admin.groups.DescribeGroups(gc.DescribeGroupsRequest(
        group_ids=[GROUP])).groups
    _ok(described.error)
    assert (described.state, described.state_enum) == ("Empty", gc.GROUP_STATE_EMPTY)
