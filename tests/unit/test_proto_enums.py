"""The vocabulary's enums and their proto enums: one mapping, one read rule.

Goal: every member of each vocabulary enum that travels (ACL resource type,
operation, pattern type, permission; transaction and group states) has a
proto enum value named prefix + member name, and every proto value but
UNSPECIFIED and a filter's ANY/MATCH has a member, so the two cannot drift;
every `*_enum` field sits beside the string field it mirrors. The read rule
holds: the enum when set, else the string; both set and disagreeing is an
error naming both; an unknown newer number reads as the string (a described
state then as UNKNOWN). The store reads an ACL binding or filter sent with
only the enums exactly as the same one sent with only the strings, refuses
conflicting ones with INVALID_REQUEST, and answers with both fields equal;
the SDK writes both fields, naming one value, and reads answers enum first.

Method: the generated descriptors walked and compared with the vocabulary
and with oncelog.wire.proto_enums' tables; the rule's functions and the
store's conversions (services/partition_store/acls.py) called on messages
built here, and the SDK's request builders and answer readers likewise; no
servers.
"""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from oncelog import AclBinding as SdkAclBinding
from oncelog import AclFilter as SdkAclFilter
from oncelog._admin_acls import _binding_from_proto, _binding_proto, _filter_proto
from oncelog._admin_groups import _group_description
from oncelog._admin_transactions import _transaction_description
from oncelog.v1 import coordinator_pb2 as tc
from oncelog.v1 import group_coordinator_pb2 as gc
from oncelog.v1 import partition_store_pb2 as ps
from oncelog.wire import proto_enums as pe
from oncelog.wire import vocabulary as v
from oncelog.wire.errors import ErrorCode
from services.common.kernel.errors import ServiceError
from services.common.security.authorizer import AclFilter
from services.partition_store.acls import binding_from_proto, binding_to_proto, filter_from_proto

# Each table, and the proto values it leaves without a member: a filter's
# ANY (and MATCH for the pattern type), which no binding takes.
TABLES: dict[str, tuple[pe.ProtoEnum[Any, Any], frozenset[str]]] = {
    "ACL_RESOURCE_TYPES": (pe.ACL_RESOURCE_TYPES, frozenset({"ANY"})),
    "ACL_OPERATIONS": (pe.ACL_OPERATIONS, frozenset({"ANY"})),
    "ACL_PATTERN_TYPES": (pe.ACL_PATTERN_TYPES, frozenset({"ANY", "MATCH"})),
    "ACL_PATTERN_FILTER_TYPES": (pe.ACL_PATTERN_FILTER_TYPES, frozenset()),
    "ACL_PERMISSIONS": (pe.ACL_PERMISSIONS, frozenset({"ANY"})),
    "TRANSACTION_STATES": (pe.TRANSACTION_STATES, frozenset()),
    "GROUP_STATES": (pe.GROUP_STATES, frozenset()),
}
# The proto enums that existed before the vocabulary and mirror none of it.
UNPAIRED_PROTO_ENUMS = {"CoordinatorType", "TransactionFate", "MarkerType", "ErrorCode",
                        "IsolationLevel"}
FILES = (ps.DESCRIPTOR, tc.DESCRIPTOR, gc.DESCRIPTOR)


# ------------------------------------------------------------ the mapping


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_member_has_a_proto_value_and_back(name: str) -> None:
    table, without_member = TABLES[name]
    descriptor = next(f.enum_types_by_name[table.proto_name] for f in FILES
                      if table.proto_name in f.enum_types_by_name)
    missing = [m.name for m in table.vocabulary if m not in table.numbers]
    assert missing == [], f"{table.vocabulary.__name__} members with no {table.prefix}* value"
    unpaired = {value.name.removeprefix(table.prefix) for value in descriptor.values
                if value.number != 0 and table.member(value.number) is None}
    assert unpaired == without_member
    members: dict[v.Vocabulary, int] = dict(table.numbers)
    for member, number in members.items():
        assert descriptor.values_by_number[number].name == table.prefix + member.name
        assert table.member(number) is member
        assert table.word(number) == member.value
    assert descriptor.values_by_number[0].name == table.prefix + "UNSPECIFIED"


def test_every_paired_proto_enum_has_a_table() -> None:
    proto_enums = {name for f in FILES for name in f.enum_types_by_name}
    paired = {table.proto_name for table, _ in TABLES.values()}
    assert proto_enums - UNPAIRED_PROTO_ENUMS == paired
    module_tables = {name for name, value in vars(pe).items() if isinstance(value, pe.ProtoEnum)}
    assert module_tables == set(TABLES)


def _messages(descriptors: Any) -> list[Descriptor]:
    found: list[Descriptor] = []
    for d in descriptors:
        found.append(d)
        found.extend(_messages(d.nested_types))
    return found


def test_every_enum_field_sits_beside_its_string() -> None:
    paired = {table.proto_name for table, _ in TABLES.values()}
    seen = 0
    for file in FILES:
        for message in _messages(file.message_types_by_name.values()):
            for field in message.fields:
                if field.enum_type is None or field.enum_type.name not in paired:
                    continue
                seen += 1
                assert field.name.endswith("_enum"), f"{message.name}.{field.name}"
                twin = message.fields_by_name.get(field.name.removesuffix("_enum"))
                assert twin is not None, f"{message.name}.{field.name} has no string twin"
                assert twin.type == FieldDescriptor.TYPE_STRING
                assert twin.is_repeated == field.is_repeated
                # Added after the string: never a renumbered old field.
                assert field.number > twin.number
    # AclBinding and AclBindingFilter: four each; the listings, descriptions
    # and list filters of transactions and groups: three each.
    assert seen == 14


def test_numbers_are_kafkas_where_kafka_has_them() -> None:
    # org.apache.kafka.common.resource.ResourceType, acl.AclOperation,
    # resource.PatternType and acl.AclPermissionType codes.
    assert pe.ACL_RESOURCE_TYPES.numbers[v.AclResourceType.TOPIC] == 2
    assert pe.ACL_RESOURCE_TYPES.numbers[v.AclResourceType.CLUSTER] == 4
    assert pe.ACL_RESOURCE_TYPES.numbers[v.AclResourceType.TRANSACTIONAL_ID] == 5
    assert pe.ACL_OPERATIONS.numbers[v.AclOperation.IDEMPOTENT_WRITE] == 12
    assert pe.ACL_OPERATIONS.numbers[v.AclOperation.TWO_PHASE_COMMIT] == 15
    assert pe.ACL_PATTERN_FILTER_TYPES.numbers[v.AclPatternFilterType.MATCH] == 2
    assert pe.ACL_PATTERN_TYPES.numbers[v.AclPatternType.PREFIXED] == 4
    assert pe.ACL_PERMISSIONS.numbers[v.AclPermission.ALLOW] == 3


# ------------------------------------------------------------ the read rule


def test_number_of_a_written_value() -> None:
    t = pe.ACL_RESOURCE_TYPES
    assert t.number(v.AclResourceType.TRANSACTIONAL_ID) == ps.ACL_RESOURCE_TYPE_TRANSACTIONAL_ID
    assert t.number("TransactionalId") == ps.ACL_RESOURCE_TYPE_TRANSACTIONAL_ID
    assert t.number("any") == ps.ACL_RESOURCE_TYPE_ANY
    assert t.number("") == t.number(None) == t.number("no-such-type") == 0
    assert pe.TRANSACTION_STATES.numbers_of(["ongoing", "Nope"]) == [
        tc.TRANSACTION_STATE_ONGOING, 0]
    assert pe.GROUP_STATES.texts_of(["completing_rebalance", "Nope"]) == [
        "CompletingRebalance", "Nope"]


@pytest.mark.parametrize(("number", "text", "read"), [
    (0, "", ""),
    (0, "topic", "topic"),
    (ps.ACL_RESOURCE_TYPE_GROUP, "", "group"),
    (ps.ACL_RESOURCE_TYPE_GROUP, "GROUP", "group"),
    (ps.ACL_RESOURCE_TYPE_ANY, "", "any"),
    (ps.ACL_RESOURCE_TYPE_ANY, "ANY", "any"),
])
def test_request_pair_reads_the_enum_first(number: int, text: str, read: str) -> None:
    assert pe.ACL_RESOURCE_TYPES.request_text("f.resource_type", number, text) == read


def test_request_pair_that_disagrees_names_both() -> None:
    with pytest.raises(pe.EnumPairError) as caught:
        pe.ACL_RESOURCE_TYPES.request_text("creations[0].resource_type",
                                           ps.ACL_RESOURCE_TYPE_TOPIC, "group")
    message = str(caught.value)
    assert "creations[0].resource_type 'group'" in message
    assert "creations[0].resource_type_enum ACL_RESOURCE_TYPE_TOPIC" in message
    with pytest.raises(pe.EnumPairError, match="'nonsense'.*ACL_OPERATION_READ"):
        pe.ACL_OPERATIONS.request_text("f.operation", ps.ACL_OPERATION_READ, "nonsense")
    with pytest.raises(pe.EnumPairError,
                       match="f.operation_enum: 99 is not a value of AclOperation"):
        pe.ACL_OPERATIONS.request_text("f.operation", 99, "")


def test_state_filter_pairs() -> None:
    t = pe.TRANSACTION_STATES
    S = v.TransactionState
    assert t.request_filter("states", [], []) is None
    # Strings alone, in Kafka's spelling or any other; unknown ones name nothing.
    assert t.request_filter("states", [], ["Ongoing", "prepare_commit", "Nope"]) == {
        S.ONGOING, S.PREPARE_COMMIT}
    assert t.request_filter("states", [], ["Nope"]) == frozenset()
    # Enums alone; an unknown (newer) number names nothing.
    assert t.request_filter("states", [tc.TRANSACTION_STATE_ONGOING, 99], []) == {S.ONGOING}
    # Both, element by element; UNSPECIFIED defers to its string.
    assert t.request_filter("states", [tc.TRANSACTION_STATE_ONGOING, 0],
                            ["ongoing", "Dead"]) == {S.ONGOING, S.DEAD}
    # A number and a name neither side knows cannot be told apart: nothing.
    assert t.request_filter("states", [99], ["Newer"]) == frozenset()
    with pytest.raises(pe.EnumPairError, match=r"states\[1\] 'Empty' and states_enum\[1\] "
                                               r"TRANSACTION_STATE_ONGOING"):
        t.request_filter("states", [tc.TRANSACTION_STATE_DEAD, tc.TRANSACTION_STATE_ONGOING],
                         ["Dead", "Empty"])
    with pytest.raises(pe.EnumPairError, match="states_enum\\[0\\] 99"):
        t.request_filter("states", [99], ["Ongoing"])
    with pytest.raises(pe.EnumPairError, match="states has 1 values and states_enum 2"):
        t.request_filter("states", [1, 2], ["Empty"])


def test_response_pair_reads_the_enum_first_and_unknown_as_its_string() -> None:
    t = pe.GROUP_STATES
    assert t.response_text(gc.GROUP_STATE_STABLE, "") == "Stable"
    assert t.response_text(gc.GROUP_STATE_STABLE, "Empty") == "Stable"
    assert t.response_text(0, "Empty") == "Empty"
    # A newer server's state: its string when this client knows it, else
    # UNKNOWN through the vocabulary's reported().
    assert v.GroupState.reported(t.response_text(99, "Assigning")) is v.GroupState.UNKNOWN
    assert v.GroupState.reported(t.response_text(99, "")) is v.GroupState.UNKNOWN
    assert v.GroupState.reported(t.response_text(99, "Dead")) is v.GroupState.DEAD


# ------------------------------------------------------ the store's ACL side


def _strings_only() -> ps.AclBinding:
    return ps.AclBinding(principal="User:alice", host="10.0.0.1",
                         resource_type="transactional_id", resource_name="app-",
                         pattern_type="prefixed", operation="two_phase_commit",
                         permission="deny")


def _enums_only() -> ps.AclBinding:
    return ps.AclBinding(principal="User:alice", host="10.0.0.1",
                         resource_type_enum=ps.ACL_RESOURCE_TYPE_TRANSACTIONAL_ID,
                         resource_name="app-", pattern_type_enum=ps.ACL_PATTERN_TYPE_PREFIXED,
                         operation_enum=ps.ACL_OPERATION_TWO_PHASE_COMMIT,
                         permission_enum=ps.ACL_PERMISSION_DENY)


def test_a_binding_with_enums_only_reads_as_with_strings_only() -> None:
    by_strings = binding_from_proto(_strings_only(), "creations[0]")
    assert binding_from_proto(_enums_only(), "creations[0]") == by_strings
    both = _strings_only()
    both.MergeFrom(_enums_only())
    assert binding_from_proto(both, "creations[0]") == by_strings
    # Defaults hold for the enums too: UNSPECIFIED pattern type and
    # permission are literal and allow.
    bare = ps.AclBinding(principal="User:a", resource_type_enum=ps.ACL_RESOURCE_TYPE_TOPIC,
                         resource_name="t", operation_enum=ps.ACL_OPERATION_READ)
    read = binding_from_proto(bare, "b")
    assert (read.pattern_type, read.permission, read.host) == (
        v.AclPatternType.LITERAL, v.AclPermission.ALLOW, "*")


def test_an_answer_carries_both_fields_equal() -> None:
    answer = binding_to_proto(binding_from_proto(_enums_only(), "b"))
    assert (answer.resource_type, answer.pattern_type, answer.operation, answer.permission) == (
        "transactional_id", "prefixed", "two_phase_commit", "deny")
    expected = _enums_only()
    assert (answer.resource_type_enum, answer.pattern_type_enum, answer.operation_enum,
            answer.permission_enum) == (expected.resource_type_enum, expected.pattern_type_enum,
                                        expected.operation_enum, expected.permission_enum)


@pytest.mark.parametrize(("field", "text", "number"), [
    ("resource_type", "group", ps.ACL_RESOURCE_TYPE_TOPIC),
    ("pattern_type", "literal", ps.ACL_PATTERN_TYPE_PREFIXED),
    ("operation", "write", ps.ACL_OPERATION_READ),
    ("permission", "allow", ps.ACL_PERMISSION_DENY),
])
def test_a_binding_whose_pair_disagrees_is_invalid(field: str, text: str, number: int) -> None:
    message = ps.AclBinding(principal="User:a", resource_type="topic", resource_name="t",
                            operation="read")
    setattr(message, field, text)
    setattr(message, f"{field}_enum", number)
    with pytest.raises(ServiceError) as caught:
        binding_from_proto(message, "creations[2]")
    assert caught.value.code is ErrorCode.INVALID_REQUEST
    assert f"creations[2].{field} {text!r}" in caught.value.message
    enum_type = ps.AclBinding.DESCRIPTOR.fields_by_name[f"{field}_enum"].enum_type
    assert enum_type is not None
    number_name = enum_type.values_by_number[number].name
    assert f"creations[2].{field}_enum {number_name}" in caught.value.message


def test_a_binding_takes_no_filter_value() -> None:
    message = ps.AclBinding(principal="User:a", resource_type_enum=ps.ACL_RESOURCE_TYPE_ANY,
                            resource_name="t", operation="read")
    with pytest.raises(ServiceError) as caught:
        binding_from_proto(message, "creations[0]")
    assert caught.value.code is ErrorCode.INVALID_REQUEST
    assert "creations[0].resource_type" in caught.value.message


def test_filters_by_enum_or_string_or_any() -> None:
    by_strings = filter_from_proto(ps.AclBindingFilter(
        resource_type="topic", pattern_type="match", resource_name="payments",
        operation="any", permission=""), "filter")
    by_enums = filter_from_proto(ps.AclBindingFilter(
        resource_type_enum=ps.ACL_RESOURCE_TYPE_TOPIC, pattern_type_enum=ps.ACL_PATTERN_TYPE_MATCH,
        resource_name="payments", operation_enum=ps.ACL_OPERATION_ANY), "filter")
    assert by_enums == by_strings == AclFilter(
        resource_type=v.AclResourceType.TOPIC, resource_name="payments",
        pattern_type=v.AclPatternFilterType.MATCH)
    # Nothing set: every binding, as before.
    assert filter_from_proto(ps.AclBindingFilter(), "filter") == AclFilter()
    with pytest.raises(ServiceError) as caught:
        filter_from_proto(ps.AclBindingFilter(
            operation="any", operation_enum=ps.ACL_OPERATION_WRITE), "filters[1]")
    assert caught.value.code is ErrorCode.INVALID_REQUEST
    assert "filters[1].operation 'any' and filters[1].operation_enum ACL_OPERATION_WRITE" in (
        caught.value.message)


# ------------------------------------------------------------ the SDK's side


def test_the_sdk_writes_both_fields_naming_one_value() -> None:
    binding = SdkAclBinding(principal="User:alice", host="10.0.0.1",
                            resource_type="TransactionalId", resource_name="app-",
                            pattern_type="prefixed", operation="TwoPhaseCommit",
                            permission="deny")
    sent = _binding_proto(binding)
    assert binding_from_proto(sent, "b") == binding_from_proto(_enums_only(), "b")
    for name, table in (("resource_type", pe.ACL_RESOURCE_TYPES),
                        ("pattern_type", pe.ACL_PATTERN_TYPES),
                        ("operation", pe.ACL_OPERATIONS), ("permission", pe.ACL_PERMISSIONS)):
        number = getattr(sent, f"{name}_enum")
        assert number != 0 and table.word(number) == getattr(sent, name)
    # A filter's open fields: "any" and ANY; a filter read back as the store
    # reads it selects the same as the SDK's filter says.
    sent_filter = _filter_proto(SdkAclFilter(resource_type="topic", pattern_type="match",
                                             resource_name="payments"))
    assert (sent_filter.operation, sent_filter.operation_enum) == ("any", ps.ACL_OPERATION_ANY)
    assert (sent_filter.pattern_type_enum, sent_filter.resource_type_enum) == (
        ps.ACL_PATTERN_TYPE_MATCH, ps.ACL_RESOURCE_TYPE_TOPIC)
    assert filter_from_proto(sent_filter, "filter") == AclFilter(
        resource_type=v.AclResourceType.TOPIC, resource_name="payments",
        pattern_type=v.AclPatternFilterType.MATCH)
    assert filter_from_proto(_filter_proto(None), "filter") == AclFilter()


def test_the_sdk_reads_answers_enum_first() -> None:
    # A binding sent with enums only (as a server in another language might).
    read = _binding_from_proto(_enums_only())
    assert (read.resource_type, read.pattern_type, read.operation, read.permission) == (
        "transactional_id", "prefixed", "two_phase_commit", "deny")
    # Strings only, as servers from before answer.
    assert _binding_from_proto(_strings_only()) == read
    assert _group_description(gc.GroupDescription(
        group_id="g", state_enum=gc.GROUP_STATE_COMPLETING_REBALANCE)).state is (
        v.GroupState.COMPLETING_REBALANCE)
    assert _group_description(gc.GroupDescription(group_id="g", state="Stable")).state is (
        v.GroupState.STABLE)
    # A newer server's state this client knows by neither number nor name.
    newer_group = gc.GroupDescription(group_id="g", state="Assigning",
                                      state_enum=gc.GroupState.ValueType(42))
    assert _group_description(newer_group).state is v.GroupState.UNKNOWN
    assert _transaction_description(tc.TransactionDescription(
        transactional_id="t", state_enum=tc.TRANSACTION_STATE_PREPARE_EPOCH_FENCE)).state is (
        v.TransactionState.PREPARE_EPOCH_FENCE)
    newer_txn = tc.TransactionDescription(transactional_id="t",
                                          state_enum=tc.TransactionState.ValueType(42))
    assert _transaction_description(newer_txn).state is v.TransactionState.UNKNOWN
