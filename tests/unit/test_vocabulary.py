"""One typed vocabulary, shared by the services and the clients.

Goal: the StrEnums of oncelog.wire.vocabulary are drop-in for the strings
that were on the wire and in the API before (no caller breaks: a member
equals its old string, and a string is accepted wherever a member is), they
take Kafka's spellings, and the services' state machines and ACL model speak
exactly this vocabulary rather than copies of it.

Method: the enums and the services' own enums and tables, imported and
compared; no servers.
"""

from __future__ import annotations

import pytest

from oncelog import types
from oncelog._transactions import ProducerTxnState
from oncelog.wire import vocabulary as v
from services.common.security import authorizer
from services.coordinator.core.transactions import TxnState
from services.group_coordinator.core.classic import ClassicGroupState
from services.group_coordinator.core.groups import GroupState


def test_members_are_the_strings_they_replace() -> None:
    assert v.IsolationLevel.READ_COMMITTED == "read_committed"
    assert v.OffsetReset.EARLIEST == "earliest"
    assert v.SecurityProtocol.SASL_SSL == "SASL_SSL"
    assert v.ServiceKind.GROUP_COORDINATOR == "group_coordinator"
    assert v.AclResourceType.TRANSACTIONAL_ID == "transactional_id"
    assert f"{v.AclOperation.CLUSTER_ACTION}" == "cluster_action"
    by_policy: dict[str, int] = {v.CleanupPolicy.COMPACT: 1}
    assert by_policy["compact"] == 1
    assert ProducerTxnState.IN_TRANSACTION == "in_transaction"


@pytest.mark.parametrize(("enum", "spelling", "member"), [
    (v.AclOperation, "ClusterAction", v.AclOperation.CLUSTER_ACTION),
    (v.AclOperation, "WRITE", v.AclOperation.WRITE),
    (v.AclResourceType, "TransactionalId", v.AclResourceType.TRANSACTIONAL_ID),
    (v.IsolationLevel, "READ_COMMITTED", v.IsolationLevel.READ_COMMITTED),
    (v.TransactionState, "prepare_commit", v.TransactionState.PREPARE_COMMIT),
])
def test_parse_takes_kafkas_spellings(enum: type[v.Vocabulary], spelling: str,
                                      member: v.Vocabulary) -> None:
    assert enum.parse(spelling) is member
    assert enum.parse(member) is member


def test_parse_names_what_is_allowed() -> None:
    with pytest.raises(ValueError, match="unknown pattern type 'fuzzy'; expected one of "
                                         "'literal', 'prefixed'"):
        v.AclPatternType.parse("fuzzy")


def test_the_coordinators_states_are_the_wire_states() -> None:
    # UNKNOWN is only a client's: what it reads a newer server's state as.
    assert {s.value for s in TxnState} == {
        s.value for s in v.TransactionState} - {v.TransactionState.UNKNOWN}
    group_states = {s.value for s in v.GroupState} - {v.GroupState.UNKNOWN}
    assert {s.value for s in GroupState} <= group_states
    assert {s.value for s in ClassicGroupState} <= group_states
    assert {s.value for s in GroupState} | {s.value for s in ClassicGroupState} == group_states


@pytest.mark.parametrize("enum", [v.TransactionState, v.GroupState])
def test_a_state_this_client_does_not_know_reads_as_unknown(
        enum: type[v.TransactionState] | type[v.GroupState]) -> None:
    assert enum.reported("Empty") is enum.EMPTY
    assert enum.reported("CompletelyNewState") is enum.UNKNOWN
    with pytest.raises(ValueError, match="CompletelyNewState"):
        enum.parse("CompletelyNewState")


def test_the_acl_model_is_one_table() -> None:
    assert authorizer.ResourceType is v.AclResourceType
    assert authorizer.Operation is v.AclOperation
    assert authorizer.VALID_OPERATIONS is v.ACL_OPERATIONS_OF
    assert types.ACL_RESOURCE_TYPES == ("topic", "group", "transactional_id", "cluster")
    assert {t: set(ops) for t, ops in types.ACL_OPERATIONS.items()} == {
        t: {op.value for op in ops} for t, ops in v.ACL_OPERATIONS_OF.items()}
