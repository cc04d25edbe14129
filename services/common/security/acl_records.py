"""Records of the internal topic `__acls`, and the ACL set that replaying them yields.

`__acls` is compacted and has one partition (ACL changes are rare and every
service reads them all), holding one record per binding:

    key    b"A" + JSON [resource_type, pattern_type, resource_name,
                        principal, host, operation, permission]
           (the binding's canonical form: the same binding always has the
           same key, so creating it twice leaves one record after
           compaction, and deleting it is a tombstone under that key)
    value  the binding as versioned, CRC32C-sealed JSON (services.common.kernel.durable),
           or None: the binding was deleted

The value repeats what the key says so that the CRC covers it; a record whose
key and value disagree is refused like a torn one. Replay applies records in
offset order, so a restarted service, or one that joined later, rebuilds the
same set; applying a record twice changes nothing (compaction keeps only the
newest record per key, and the newest record alone decides).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..kernel import durable
from .authorizer import AclBinding, Operation, PatternType, Permission, ResourceType

ACLS_TOPIC = "__acls"
ACLS_TOPIC_PARTITIONS = 1
RECORD_VERSION = 1
BINDING_PREFIX = b"A"

Entry = tuple[bytes, bytes | None]


def _fields(binding: AclBinding) -> list[str]:
    return [binding.resource_type.value, binding.pattern_type.value, binding.resource_name,
            binding.principal, binding.host, binding.operation.value, binding.permission.value]


def binding_key(binding: AclBinding) -> bytes:
    """The binding's canonical key: equal bindings, equal bytes."""
    # ensure_ascii keeps the encoding independent of how names are spelt in
    # Unicode escapes vs. raw UTF-8; separators leave no optional whitespace.
    return BINDING_PREFIX + json.dumps(_fields(binding), separators=(",", ":")).encode()


def encode_binding(binding: AclBinding) -> Entry:
    """The record that creates (or re-creates) a binding."""
    payload = {
        "resource_type": binding.resource_type.value,
        "pattern_type": binding.pattern_type.value,
        "resource_name": binding.resource_name,
        "principal": binding.principal,
        "host": binding.host,
        "operation": binding.operation.value,
        "permission": binding.permission.value,
    }
    return binding_key(binding), durable.encode(RECORD_VERSION, payload)


def encode_deletion(binding: AclBinding) -> Entry:
    """The tombstone that deletes a binding."""
    return binding_key(binding), None


def decode_binding(key: bytes, value: bytes) -> AclBinding:
    """The binding a record holds; raises durable.CorruptValueError naming
    what is wrong (a torn or foreign value, a key that does not match it)."""
    what = f"__acls record {key[:80]!r}"
    payload = durable.decode(value, expected_version=RECORD_VERSION, what=what)
    try:
        binding = AclBinding.of(
            principal=payload["principal"], host=payload["host"],
            resource_type=ResourceType.parse(payload["resource_type"]),
            resource_name=payload["resource_name"],
            pattern_type=PatternType.parse(payload["pattern_type"]),
            operation=Operation.parse(payload["operation"]),
            permission=Permission.parse(payload["permission"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise durable.CorruptValueError(f"{what}: not an ACL binding: {exc}") from exc
    if binding_key(binding) != key:
        raise durable.CorruptValueError(
            f"{what}: the value holds {binding}, whose key is {binding_key(binding)!r}")
    return binding


@dataclass
class AclState:
    """The ACL set as replay has built it so far, by record key."""

    by_key: dict[bytes, AclBinding] = field(default_factory=dict)

    def bindings(self) -> frozenset[AclBinding]:
        return frozenset(self.by_key.values())


def replay(state: AclState, key: bytes | None, value: bytes | None) -> None:
    """Applies one `__acls` record: a value (re)creates its binding, a
    tombstone removes it (a tombstone for a binding not held is nothing to
    do). Raises durable.CorruptValueError for a record it cannot read — a bug
    or a foreign writer, never skipped silently."""
    if key is None or not key.startswith(BINDING_PREFIX):
        raise durable.CorruptValueError(f"__acls record with unknown key {key!r}")
    if value is None:
        state.by_key.pop(key, None)
        return
    state.by_key[key] = decode_binding(key, value)


def replay_all(records: Iterable[tuple[bytes | None, bytes | None]],
               state: AclState | None = None) -> AclState:
    """Replays records in order, onto `state` or a new one."""
    target = state if state is not None else AclState()
    for key, value in records:
        replay(target, key, value)
    return target
