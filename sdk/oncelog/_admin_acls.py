"""Admin's ACL calls: create, describe, delete."""

from __future__ import annotations

import time
from collections.abc import Iterable

from oncelog._admin_base import (
    AdminBase,
    _within_budget,
)
from oncelog._client import (
    error_from_proto,
    raise_for_error,
)
from oncelog.types import (
    AclBinding,
    AclFilter,
)
from oncelog.v1 import (
    partition_store_pb2,
)
from oncelog.wire import errors
from oncelog.wire.errors import ErrorCode
from oncelog.wire.proto_enums import (
    ACL_OPERATIONS,
    ACL_PATTERN_FILTER_TYPES,
    ACL_PATTERN_TYPES,
    ACL_PERMISSIONS,
    ACL_RESOURCE_TYPES,
)

# A filter's field that matches any value, as the string and the enum spell it.
_ANY = "any"


class AclsAdmin(AdminBase):
    """Creates, describes and deletes ACL bindings."""

    # ------------------------------------------------------------ ACLs

    @_within_budget
    def create_acls(self, bindings: Iterable[AclBinding]) -> None:
        """Creates ACL bindings (Kafka's createAcls); creating one that
        exists already changes nothing. Raises the first binding's error,
        naming the binding (SecurityDisabledError on a cluster without an
        authorizer; ClusterAuthorizationFailedError without Alter on the
        cluster). A change reaches every service within the cluster's
        --acl-refresh-interval-ms."""
        items = list(bindings)
        for binding in items:
            if not isinstance(binding, AclBinding):
                raise TypeError(f"create_acls() takes AclBinding values, got {binding!r}")
        if not items:
            return
        request = partition_store_pb2.CreateAclsRequest(
            creations=[_binding_proto(b) for b in items])
        resp = self._catalog_call("CreateAcls", lambda stub: stub.CreateAcls, request)
        if len(resp.results) != len(items):
            raise errors.error_for(
                ErrorCode.UNKNOWN_SERVER_ERROR,
                f"CreateAcls answered {len(resp.results)} results for {len(items)} bindings")
        for binding, result in zip(items, resp.results, strict=True):
            exc = error_from_proto(result)
            if exc is not None:
                raise errors.error_for(exc.code, f"{binding}: {exc.message or exc.code.name}")

    @_within_budget
    def describe_acls(self, filter: AclFilter | AclBinding | None = None
                      ) -> list[AclBinding]:
        """The ACL bindings `filter` selects (default: every one), sorted by
        resource, then principal (Kafka's describeAcls). An AclBinding as
        the filter selects exactly that binding."""
        request = partition_store_pb2.DescribeAclsRequest(filter=_filter_proto(filter))

        def attempt(timeout_s: float) -> partition_store_pb2.DescribeAclsResponse:
            deadline_s = time.monotonic() + timeout_s
            address, stub = self._controller(timeout_s)
            resp: partition_store_pb2.DescribeAclsResponse = self._rpc(
                address, stub.DescribeAcls, request, deadline_s)
            raise_for_error(resp.error)
            return resp

        resp = self._call("DescribeAcls", attempt)
        return sorted((_binding_from_proto(b) for b in resp.bindings), key=_acl_sort_key)

    @_within_budget
    def delete_acls(self, filters: Iterable[AclFilter | AclBinding]) -> list[AclBinding]:
        """Deletes every ACL binding each filter selects (Kafka's
        deleteAcls; an AclBinding selects exactly itself) and returns the
        deleted ones, sorted. Raises the first filter's error."""
        items = list(filters)
        for item in items:
            if not isinstance(item, (AclFilter, AclBinding)):
                raise TypeError(f"delete_acls() takes AclFilter or AclBinding values, "
                                f"got {item!r}")
        if not items:
            return []
        request = partition_store_pb2.DeleteAclsRequest(
            filters=[_filter_proto(item) for item in items])
        resp = self._catalog_call("DeleteAcls", lambda stub: stub.DeleteAcls, request)
        deleted: dict[AclBinding, None] = {}
        for item, result in zip(items, resp.results, strict=False):
            exc = error_from_proto(result.error)
            if exc is not None:
                raise errors.error_for(exc.code, f"filter {item}: {exc.message or exc.code.name}")
            deleted.update(dict.fromkeys(_binding_from_proto(b) for b in result.matching))
        return sorted(deleted, key=_acl_sort_key)


def _binding_proto(binding: AclBinding) -> partition_store_pb2.AclBinding:
    """The wire's binding: each enum as its string and, beside it, its number."""
    return partition_store_pb2.AclBinding(
        principal=binding.principal, host=binding.host, resource_type=binding.resource_type,
        resource_name=binding.resource_name, pattern_type=binding.pattern_type,
        operation=binding.operation, permission=binding.permission,
        resource_type_enum=ACL_RESOURCE_TYPES.number(binding.resource_type),
        pattern_type_enum=ACL_PATTERN_TYPES.number(binding.pattern_type),
        operation_enum=ACL_OPERATIONS.number(binding.operation),
        permission_enum=ACL_PERMISSIONS.number(binding.permission),
    )


def _filter_proto(selector: AclFilter | AclBinding | None) -> partition_store_pb2.AclBindingFilter:
    """The wire's filter: "any" (and the enum's ANY) for a field that matches
    anything; "" for a principal or host that does."""
    f = AclFilter() if selector is None else (
        AclFilter.of(selector) if isinstance(selector, AclBinding) else selector)
    if not isinstance(f, AclFilter):
        raise TypeError(f"an ACL filter is an AclFilter or an AclBinding, got {selector!r}")
    resource_type = f.resource_type or _ANY
    operation = f.operation or _ANY
    permission = f.permission or _ANY
    return partition_store_pb2.AclBindingFilter(
        principal=f.principal or "", host=f.host or "", resource_type=resource_type,
        resource_name=f.resource_name or "", pattern_type=f.pattern_type,
        operation=operation, permission=permission,
        resource_type_enum=ACL_RESOURCE_TYPES.number(resource_type),
        pattern_type_enum=ACL_PATTERN_FILTER_TYPES.number(f.pattern_type),
        operation_enum=ACL_OPERATIONS.number(operation),
        permission_enum=ACL_PERMISSIONS.number(permission),
    )


def _binding_from_proto(b: partition_store_pb2.AclBinding) -> AclBinding:
    # Each enum first, its string when the enum is unset or newer than this
    # client (then the string is what an older server would have sent).
    return AclBinding(
        principal=b.principal, host=b.host or "*",
        resource_type=ACL_RESOURCE_TYPES.response_text(b.resource_type_enum, b.resource_type),
        resource_name=b.resource_name,
        pattern_type=ACL_PATTERN_TYPES.response_text(b.pattern_type_enum, b.pattern_type)
        or "literal",
        operation=ACL_OPERATIONS.response_text(b.operation_enum, b.operation),
        permission=ACL_PERMISSIONS.response_text(b.permission_enum, b.permission) or "allow")


def _acl_sort_key(b: AclBinding) -> tuple[str, ...]:
    return (b.resource_type, b.resource_name, b.pattern_type, b.principal, b.host,
            b.operation, b.permission)
