"""The `__acls` records of services/common/security/acl_records.py.

Goal: a binding survives its record (every field, every resource type and
pattern); the same binding always has the same key, so creating it twice is
one binding and deleting it is a tombstone under that key; replaying the
records in order yields the ACL set, and replaying them again (or a record
twice) changes nothing; a torn, foreign or mismatched record is refused with
an error saying what is wrong, never skipped.

Method: encode bindings, replay record sequences into AclState, and flip
bytes in sealed values.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from services.common.kernel.durable import CorruptValueError, encode
from services.common.security.acl_records import (
    ACLS_TOPIC,
    ACLS_TOPIC_PARTITIONS,
    RECORD_VERSION,
    AclState,
    binding_key,
    decode_binding,
    encode_binding,
    encode_deletion,
    replay,
    replay_all,
)
from services.common.security.authorizer import CLUSTER_NAME, AclBinding

BINDINGS = [
    AclBinding.of(principal="User:alice", resource_type="topic", resource_name="payments",
                  operation="write"),
    AclBinding.of(principal="User:alice", resource_type="topic", resource_name="pay",
                  pattern_type="prefixed", operation="read", permission="deny",
                  host="10.0.0.7"),
    AclBinding.of(principal="User:*", resource_type="group", resource_name="*",
                  operation="describe"),
    AclBinding.of(principal="User:svc", resource_type="cluster", resource_name=CLUSTER_NAME,
                  operation="cluster_action"),
    AclBinding.of(principal="User:etl", resource_type="transactional_id",
                  resource_name="copier-\u00e9\u4e2d,\"quoted\"", operation="two_phase_commit"),
]


def test_the_topic_is_one_compactable_partition() -> None:
    assert ACLS_TOPIC == "__acls" and ACLS_TOPIC_PARTITIONS == 1


@pytest.mark.parametrize("binding", BINDINGS, ids=str)
def test_round_trip(binding: AclBinding) -> None:
    key, value = encode_binding(binding)
    assert value is not None
    assert decode_binding(key, value) == binding
    state = replay_all([(key, value)])
    assert state.bindings() == frozenset({binding})


def test_keys_are_canonical_and_distinct() -> None:
    keys = {binding_key(b) for b in BINDINGS}
    assert len(keys) == len(BINDINGS)
    # The same binding built again, with other spellings, has the same key
    # and the same bytes in its value.
    again = AclBinding.of(principal="User:alice", resource_type="Topic",
                          resource_name="payments", pattern_type="LITERAL", operation="WRITE",
                          permission="Allow", host="*")
    assert encode_binding(again) == encode_binding(BINDINGS[0])
    # Allow and deny of the same thing are two bindings.
    deny = AclBinding.of(principal="User:alice", resource_type="topic",
                         resource_name="payments", operation="write", permission="deny")
    assert binding_key(deny) != binding_key(BINDINGS[0])


def test_replay_creates_deletes_and_is_idempotent() -> None:
    a, b, c = BINDINGS[:3]
    records = [encode_binding(a), encode_binding(b), encode_binding(a),  # a created twice
               encode_deletion(b), encode_binding(c),
               encode_deletion(BINDINGS[3])]  # a tombstone for a binding never held
    state = replay_all(records)
    assert state.bindings() == frozenset({a, c})
    # Replaying everything again onto the same state, or each record twice,
    # gives the same set.
    assert replay_all(records, state).bindings() == frozenset({a, c})
    doubled = AclState()
    for key, value in records:
        replay(doubled, key, value)
        replay(doubled, key, value)
    assert doubled.bindings() == frozenset({a, c})
    # What compaction leaves (the newest record per key) replays the same.
    newest: dict[bytes, bytes | None] = {}
    for key, value in records:
        newest.pop(key, None)
        newest[key] = value
    assert replay_all(newest.items()).bindings() == frozenset({a, c})


def test_a_deleted_binding_can_come_back() -> None:
    a = BINDINGS[0]
    state = replay_all([encode_binding(a), encode_deletion(a), encode_binding(a)])
    assert state.bindings() == frozenset({a})


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


@pytest.mark.parametrize(("damage", "message"), [
    (lambda key, value: (key, _flip(value, len(value) - 2)), "CRC32C"),
    (lambda key, value: (key, _flip(value, 0)), "version 0, expected 1"),
    (lambda key, value: (key, value[:3]), "shorter than the 5-byte envelope"),
    # A sealed value that is not a binding.
    (lambda key, value: (key, encode(RECORD_VERSION, {"principal": "User:alice"})),
     "not an ACL binding"),
    (lambda key, value: (key, encode(RECORD_VERSION, {**json.loads(value[5:]),
                                                      "operation": "fly"})),
     "unknown operation 'fly'"),
    # A good value under another binding's key.
    (lambda key, value: (binding_key(BINDINGS[1]), value), "whose key is"),
    # Keys that are not __acls keys.
    (lambda key, value: (b"X" + key[1:], value), "unknown key"),
    (lambda key, value: (None, value), "unknown key"),
])
def test_a_bad_record_is_refused_with_a_clear_error(
        damage: Callable[[bytes, bytes], tuple[bytes | None, bytes]], message: str) -> None:
    key, value = encode_binding(BINDINGS[0])
    assert value is not None
    bad_key, bad_value = damage(key, value)
    state = replay_all([encode_binding(BINDINGS[2])])
    with pytest.raises(CorruptValueError, match=message):
        replay(state, bad_key, bad_value)
    # The refused record changed nothing.
    assert state.bindings() == frozenset({BINDINGS[2]})
