"""The ACL RPCs of the partition store: CreateAcls, DescribeAcls, DeleteAcls.

Any store answers them. Bindings are kept in the internal topic `__acls`
(security.acl_records), which this store appends to through its own store
client, to whichever store leads the partition — a coordinator-style
internal write, with the store's own identity — and reads through the
process's ACL watcher, refreshed first so that an answer reflects every
change acknowledged before the call. The guard has already checked that
the caller may (Alter on the cluster to change ACLs, Describe to read them).

Each enum travels as a string (Kafka's names, any case) and as a proto enum
beside it (`resource_type_enum`): the enum is read when it is not
UNSPECIFIED, else the string (oncelog.wire.proto_enums), and answers carry
both. An empty host, pattern type or permission of a binding is `*`,
`literal` and `allow`. A binding or filter that cannot mean anything — or
whose string and enum name different values — refuses the whole call with
INVALID_REQUEST naming the field (`creations[1].operation: ...`), and
nothing is written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from oncelog.v1 import partition_store_pb2 as pb
from oncelog.wire.errors import ErrorCode
from oncelog.wire.proto_enums import (
    ACL_OPERATIONS,
    ACL_PATTERN_FILTER_TYPES,
    ACL_PATTERN_TYPES,
    ACL_PERMISSIONS,
    ACL_RESOURCE_TYPES,
    EnumPairError,
    ProtoEnum,
)

from ..common.kernel.errors import OK, ServiceError
from ..common.security.acl_records import ACLS_TOPIC, encode_binding, encode_deletion
from ..common.security.acl_watcher import ACLS_PARTITION, AclWatcher
from ..common.security.authorizer import (
    WILDCARD,
    AclBinding,
    AclFilter,
    Operation,
    PatternFilterType,
    PatternType,
    Permission,
    ResourcePattern,
    ResourceType,
    check_principal,
)

_ANY = ("", "any")
T = TypeVar("T")


class LogAppender(Protocol):
    """How the bindings are appended (store_client.StoreClient)."""

    async def append(self, topic: str, partition: int,
                     entries: Sequence[tuple[bytes | None, bytes | None]]) -> int: ...


def _bad(field: str, message: str) -> ServiceError:
    return ServiceError(ErrorCode.INVALID_REQUEST, f"{field}: {message}")


def _parse(field: str, parse: Callable[[str], T], value: str) -> T:
    try:
        return parse(value)
    except ValueError as exc:
        raise _bad(field, str(exc)) from exc


def _text(field: str, table: ProtoEnum[Any, Any], number: int, text: str) -> str:
    """The one string a (string, enum) pair means (the enum when it is set);
    ServiceError(INVALID_REQUEST) naming both when they disagree."""
    try:
        return table.request_text(field, number, text)
    except EnumPairError as exc:
        raise ServiceError(ErrorCode.INVALID_REQUEST, str(exc)) from exc


def binding_from_proto(message: pb.AclBinding, where: str) -> AclBinding:
    """A binding from its message; ServiceError(INVALID_REQUEST) naming the
    field (`where` + `.operation`) when it cannot mean anything."""
    try:
        check_principal(message.principal)
    except ValueError as exc:
        raise _bad(f"{where}.principal", str(exc)) from exc
    # Every pair is read before anything is parsed, so that a disagreement
    # is reported as one even when the string alone would not parse.
    resource_type_text = _text(f"{where}.resource_type", ACL_RESOURCE_TYPES,
                               message.resource_type_enum, message.resource_type)
    pattern_type_text = _text(f"{where}.pattern_type", ACL_PATTERN_TYPES,
                              message.pattern_type_enum, message.pattern_type)
    operation_text = _text(f"{where}.operation", ACL_OPERATIONS,
                           message.operation_enum, message.operation)
    permission_text = _text(f"{where}.permission", ACL_PERMISSIONS,
                            message.permission_enum, message.permission)
    resource_type = _parse(f"{where}.resource_type", ResourceType.parse, resource_type_text)
    pattern_type = _parse(f"{where}.pattern_type", PatternType.parse,
                          pattern_type_text or PatternType.LITERAL.value)
    operation = _parse(f"{where}.operation", Operation.parse, operation_text)
    permission = _parse(f"{where}.permission", Permission.parse,
                        permission_text or Permission.ALLOW.value)
    try:
        pattern = ResourcePattern(resource_type, message.resource_name, pattern_type)
    except ValueError as exc:
        raise _bad(f"{where}.resource_name", str(exc)) from exc
    try:
        return AclBinding(principal=message.principal, host=message.host or WILDCARD,
                          pattern=pattern, operation=operation, permission=permission)
    except ValueError as exc:
        raise _bad(f"{where}.operation", str(exc)) from exc


def binding_to_proto(binding: AclBinding) -> pb.AclBinding:
    """A binding as answers carry it: each enum as its string and its number."""
    return pb.AclBinding(
        principal=binding.principal, host=binding.host,
        resource_type=binding.resource_type.value, resource_name=binding.resource_name,
        pattern_type=binding.pattern_type.value, operation=binding.operation.value,
        permission=binding.permission.value,
        resource_type_enum=ACL_RESOURCE_TYPES.number(binding.resource_type),
        pattern_type_enum=ACL_PATTERN_TYPES.number(binding.pattern_type),
        operation_enum=ACL_OPERATIONS.number(binding.operation),
        permission_enum=ACL_PERMISSIONS.number(binding.permission))


def _optional(value: str) -> str | None:
    return None if value.lower() in _ANY else value


def filter_from_proto(message: pb.AclBindingFilter, where: str) -> AclFilter:
    """A filter from its message ("" or "any", or the enum's ANY: any
    value); ServiceError(INVALID_REQUEST) naming the field when it cannot
    mean anything."""
    resource_type = _optional(_text(f"{where}.resource_type", ACL_RESOURCE_TYPES,
                                    message.resource_type_enum, message.resource_type))
    pattern_type = _text(f"{where}.pattern_type", ACL_PATTERN_FILTER_TYPES,
                         message.pattern_type_enum, message.pattern_type)
    operation = _optional(_text(f"{where}.operation", ACL_OPERATIONS,
                                message.operation_enum, message.operation))
    permission = _optional(_text(f"{where}.permission", ACL_PERMISSIONS,
                                 message.permission_enum, message.permission))
    principal = _optional(message.principal)
    if principal is not None:
        try:
            check_principal(principal)
        except ValueError as exc:
            raise _bad(f"{where}.principal", str(exc)) from exc
    return AclFilter(
        resource_type=None if resource_type is None else _parse(
            f"{where}.resource_type", ResourceType.parse, resource_type),
        resource_name=message.resource_name or None,
        pattern_type=_parse(f"{where}.pattern_type", PatternFilterType.parse,
                            pattern_type or PatternFilterType.ANY.value),
        principal=principal,
        host=_optional(message.host),
        operation=None if operation is None else _parse(
            f"{where}.operation", Operation.parse, operation),
        permission=None if permission is None else _parse(
            f"{where}.permission", Permission.parse, permission),
    )


class AclService:
    """What the ACL RPCs do, over the process's ACL watcher and a store client."""

    def __init__(self, watcher: AclWatcher, log: LogAppender) -> None:
        self._watcher = watcher
        self._log = log

    async def _append(self, entries: Sequence[tuple[bytes | None, bytes | None]]) -> None:
        if entries:
            await self._log.append(ACLS_TOPIC, ACLS_PARTITION, entries)

    async def create(self, request: pb.CreateAclsRequest) -> pb.CreateAclsResponse:
        bindings = [binding_from_proto(b, f"creations[{i}]")
                    for i, b in enumerate(request.creations)]
        current = (await self._watcher.refresh()).bindings
        # A binding held already needs no record; one named twice, one.
        new = list(dict.fromkeys(b for b in bindings if b not in current))
        await self._append([encode_binding(b) for b in new])
        await self._watcher.refresh()
        return pb.CreateAclsResponse(results=[OK for _ in bindings])

    async def describe(self, request: pb.DescribeAclsRequest) -> pb.DescribeAclsResponse:
        acl_filter = filter_from_proto(request.filter, "filter")
        authorizer = await self._watcher.refresh()
        return pb.DescribeAclsResponse(
            bindings=[binding_to_proto(b) for b in authorizer.describe(acl_filter)])

    async def delete(self, request: pb.DeleteAclsRequest) -> pb.DeleteAclsResponse:
        filters = [filter_from_proto(f, f"filters[{i}]") for i, f in enumerate(request.filters)]
        authorizer = await self._watcher.refresh()
        matches = [authorizer.describe(f) for f in filters]
        doomed = list(dict.fromkeys(b for found in matches for b in found))
        await self._append([encode_deletion(b) for b in doomed])
        await self._watcher.refresh()
        return pb.DeleteAclsResponse(results=[
            pb.DeleteAclsFilterResult(matching=[binding_to_proto(b) for b in found])
            for found in matches
        ])
