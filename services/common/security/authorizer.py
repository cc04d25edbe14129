"""ACL bindings and the authorizer that decides by them (Kafka's model).

An ACL binding says: principal P, connecting from host H, is allowed (or
denied) operation O on the resources of one type whose names match a pattern
(a literal name, `*` for every name, or a prefix). The `Authorizer` answers
"may P from H do O to resource R?" over an immutable set of bindings, with
Kafka's rules (StandardAuthorizer / StandardAuthorizerData, Kafka 3.x and 4.x),
followed exactly:

1. **Super users** (`super_users`, full principal strings such as
   "User:admin") may do everything; no ACL is looked at.
2. The bindings that apply are those on the resource's type whose pattern
   matches its name — a literal equal to the name, the literal `*`, or a
   prefix of the name — whose principal is the caller's or the wildcard
   `User:*` (for a caller of any principal type), and whose host is the
   caller's address or `*`.
3. **Deny wins**: if any applying DENY binding names the operation itself or
   `All`, the answer is no, whatever allows it.
4. Otherwise an applying ALLOW binding decides yes when it names the
   operation, `All`, or an operation that implies it. Implication holds for
   ALLOW bindings only (a DENY of Read does not deny Describe):
   Read, Write, Delete and Alter imply Describe; AlterConfigs implies
   DescribeConfigs; All implies everything. Nothing else implies anything: in
   particular ClusterAction does not imply IdempotentWrite, and Write on a
   transactional id does not imply TwoPhaseCommit (Kafka's AclOperation and
   StandardAuthorizerData.findResult have no such rule).
5. With no allowing binding: if **no binding at all** matches the resource
   (any principal, host, operation or permission), the answer is
   `allow_everyone_if_no_acl_found` (default False, Kafka's
   `allow.everyone.if.no.acl.found`); if some binding matches the resource
   but none allows, the answer is no.

`authorize_by_resource_type` is Kafka's Authorizer.authorizeByResourceType:
"may P do O to *some* resource of this type?" (InitProducerId of an
idempotent producer asks it for Write on any topic). As in Kafka, it first
authorizes the operation on a made-up resource name ("hardcode"), which
super users and the no-ACL default answer yes to; then it looks only at the
caller's bindings naming the operation or All (no implication), and says yes
when an ALLOW binding is not shadowed by a DENY binding: a literal `*` DENY
shadows everything, a literal DENY the same literal, a prefixed DENY every
literal or prefix that starts with it.

Which operations a resource type has is Kafka's table (AclEntry
.supportedOperations) for the types oncelog has: Topic (Read, Write, Create,
Delete, Alter, Describe, DescribeConfigs, AlterConfigs), Group (Read,
Describe, Delete — Kafka 3.8+ adds group configs, which oncelog has not),
TransactionalId (Write, Describe, and TwoPhaseCommit for KIP-939 producers),
Cluster (Create, ClusterAction, DescribeConfigs, AlterConfigs,
IdempotentWrite, Alter, Describe); `All` is valid on every type. The cluster
is one resource, named `CLUSTER_NAME`, bound only literally.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from oncelog.wire.vocabulary import (
    ACL_CLUSTER_NAME,
    ACL_OPERATIONS_OF,
    ACL_WILDCARD,
    AclOperation,
    AclPatternFilterType,
    AclPatternType,
    AclPermission,
    AclResourceType,
)

# The one Cluster resource's name, and a binding's host or literal resource
# name that matches every host or name; the principal that matches every caller.
CLUSTER_NAME = ACL_CLUSTER_NAME
WILDCARD = ACL_WILDCARD
WILDCARD_PRINCIPAL = "User:*"
# The name Kafka's authorizeByResourceType first authorizes, so that super
# users and the no-ACL default answer it as they would any resource.
_PROBE_NAME = "hardcode"

# Kafka's ACL vocabulary is the wire's, shared with the SDK and the CLI
# (oncelog.wire.vocabulary: StrEnums whose values are the wire's strings,
# with a `parse` that takes Kafka's spellings too); here under the names the
# authorizer has always used.
ResourceType = AclResourceType
Operation = AclOperation
PatternType = AclPatternType
Permission = AclPermission
PatternFilterType = AclPatternFilterType
VALID_OPERATIONS = ACL_OPERATIONS_OF

# ALLOW bindings of these operations also allow the key (StandardAuthorizerData's
# IMPLIES_DESCRIBE and IMPLIES_DESCRIBE_CONFIGS); All is handled on its own.
IMPLIED_BY: Mapping[Operation, frozenset[Operation]] = {
    Operation.DESCRIBE: frozenset({
        Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER,
    }),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS}),
}


def check_principal(principal: str, *, what: str = "principal") -> str:
    """A principal string `Type:name` (both parts non-empty), or ValueError
    naming what is wrong."""
    if not isinstance(principal, str):
        raise ValueError(f"{what} must be a string of the form 'Type:name', got {principal!r}")
    kind, colon, name = principal.partition(":")
    if not colon:
        raise ValueError(f"{what} {principal!r} has no ':' between its type and its name; "
                         "expected 'Type:name', such as 'User:alice'")
    if not kind or not name:
        raise ValueError(f"{what} {principal!r} has an empty "
                         f"{'type' if not kind else 'name'}; expected 'Type:name'")
    return principal


@dataclass(frozen=True, slots=True)
class ResourcePattern:
    """Which resources a binding covers: one type, and a literal name (`*`:
    every name) or a name prefix."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType = PatternType.LITERAL

    def __post_init__(self) -> None:
        object.__setattr__(self, "resource_type", ResourceType.parse(self.resource_type))
        object.__setattr__(self, "pattern_type", PatternType.parse(self.pattern_type))
        if not isinstance(self.resource_name, str) or not self.resource_name:
            raise ValueError(
                f"the resource name of a {self.resource_type.value} pattern is empty; name a "
                f"resource, or use the literal {WILDCARD!r} for every name")
        if self.resource_type is ResourceType.CLUSTER and (
                self.resource_name != CLUSTER_NAME
                or self.pattern_type is not PatternType.LITERAL):
            raise ValueError(
                f"the cluster resource is the literal name {CLUSTER_NAME!r}; got "
                f"{self.pattern_type.value} {self.resource_name!r}")

    def matches(self, resource_name: str) -> bool:
        """Whether this pattern covers a resource of its type with this name."""
        if self.pattern_type is PatternType.PREFIXED:
            return resource_name.startswith(self.resource_name)
        return self.resource_name in (resource_name, WILDCARD)


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL: `permission` of `operation` on the resources `pattern` covers,
    for `principal` connecting from `host` (an IP address, or `*`).

    Fields take their enums or their names (`AclBinding.of(...)` with the
    SDK's keyword names); a binding that cannot mean anything raises
    ValueError naming what is wrong."""

    principal: str
    host: str
    pattern: ResourcePattern
    operation: Operation
    permission: Permission

    def __post_init__(self) -> None:
        check_principal(self.principal)
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"the host of an ACL for {self.principal} is empty; "
                             f"use {WILDCARD!r} for every host")
        object.__setattr__(self, "operation", Operation.parse(self.operation))
        object.__setattr__(self, "permission", Permission.parse(self.permission))
        valid = VALID_OPERATIONS[self.pattern.resource_type]
        if self.operation not in valid:
            names = ", ".join(sorted(op.kafka_name for op in valid))
            raise ValueError(
                f"operation {self.operation.kafka_name} does not apply to a "
                f"{self.pattern.resource_type.value}; a {self.pattern.resource_type.value} "
                f"has {names}")

    @classmethod
    def of(cls, *, principal: str, resource_type: ResourceType | str, resource_name: str,
           pattern_type: PatternType | str = PatternType.LITERAL,
           operation: Operation | str, permission: Permission | str = Permission.ALLOW,
           host: str = WILDCARD) -> AclBinding:
        """A binding from the SDK's field names (`oncelog.AclBinding`)."""
        return cls(principal=principal, host=host,
                   pattern=ResourcePattern(ResourceType.parse(resource_type), resource_name,
                                           PatternType.parse(pattern_type)),
                   operation=Operation.parse(operation), permission=Permission.parse(permission))

    @property
    def resource_type(self) -> ResourceType:
        return self.pattern.resource_type

    @property
    def resource_name(self) -> str:
        return self.pattern.resource_name

    @property
    def pattern_type(self) -> PatternType:
        return self.pattern.pattern_type

    def sort_key(self) -> tuple[str, str, str, str, str, str, str]:
        return (self.resource_type.value, self.pattern_type.value, self.resource_name,
                self.principal, self.host, self.operation.value, self.permission.value)

    def __str__(self) -> str:
        return (f"{self.permission.value.upper()} {self.principal} {self.operation.kafka_name} on "
                f"{self.resource_type.value} {self.pattern_type.value} {self.resource_name!r} "
                f"from host {self.host}")


@dataclass(frozen=True, slots=True, kw_only=True)
class AclFilter:
    """Selects bindings, for describing and deleting them (Kafka's
    AclBindingFilter). A field left None matches anything; `pattern_type`
    says how `resource_name` selects (PatternFilterType)."""

    resource_type: ResourceType | None = None
    resource_name: str | None = None
    pattern_type: PatternFilterType = PatternFilterType.ANY
    principal: str | None = None
    host: str | None = None
    operation: Operation | None = None
    permission: Permission | None = None

    def __post_init__(self) -> None:
        if self.resource_type is not None:
            object.__setattr__(self, "resource_type", ResourceType.parse(self.resource_type))
        object.__setattr__(self, "pattern_type", PatternFilterType.parse(self.pattern_type))
        if self.operation is not None:
            object.__setattr__(self, "operation", Operation.parse(self.operation))
        if self.permission is not None:
            object.__setattr__(self, "permission", Permission.parse(self.permission))
        if self.principal is not None:
            check_principal(self.principal, what="the filter's principal")

    def matches(self, binding: AclBinding) -> bool:
        if self.resource_type is not None and binding.resource_type is not self.resource_type:
            return False
        pattern_filter = self.pattern_type
        if pattern_filter in (PatternFilterType.LITERAL, PatternFilterType.PREFIXED) and (
                binding.pattern_type.value != pattern_filter.value):
            return False
        if self.resource_name is not None:
            if pattern_filter is PatternFilterType.MATCH:
                if not binding.pattern.matches(self.resource_name):
                    return False
            elif binding.resource_name != self.resource_name:
                return False
        if self.principal is not None and binding.principal != self.principal:
            return False
        if self.host is not None and binding.host != self.host:
            return False
        if self.operation is not None and binding.operation is not self.operation:
            return False
        return self.permission is None or binding.permission is self.permission


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthorizerConfig:
    """The authorizer's settings (Kafka's super.users and
    allow.everyone.if.no.acl.found)."""

    super_users: frozenset[str] = frozenset()
    allow_everyone_if_no_acl_found: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "super_users", frozenset(self.super_users))
        for principal in self.super_users:
            check_principal(principal, what="super user")


class Rule(enum.Enum):
    """What decided an authorization (Kafka's MatchingRule), for the log."""

    SUPER_USER = "super_user"
    DENY_ACL = "deny_acl"
    ALLOW_ACL = "allow_acl"
    # No binding matched the resource at all: allow_everyone_if_no_acl_found decided.
    NO_ACL_FOUND = "no_acl_found"
    # Bindings match the resource, none of them allows this.
    NOT_ALLOWED = "not_allowed"


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    rule: Rule
    # The binding that decided (DENY_ACL, ALLOW_ACL), else None.
    binding: AclBinding | None = None

    def __str__(self) -> str:
        verdict = "allowed" if self.allowed else "denied"
        if self.binding is not None:
            return f"{verdict} by {self.binding}"
        return f"{verdict} ({self.rule.value})"


@dataclass(frozen=True, slots=True)
class _TypeIndex:
    """The bindings of one resource type, by how their pattern finds names."""

    literal: dict[str, tuple[AclBinding, ...]] = field(default_factory=dict)
    prefixed: dict[str, tuple[AclBinding, ...]] = field(default_factory=dict)
    # The lengths of the prefixes present: a lookup tries only these.
    prefix_lengths: tuple[int, ...] = ()


def _index(bindings: Iterable[AclBinding]) -> dict[ResourceType, _TypeIndex]:
    literal: dict[ResourceType, dict[str, list[AclBinding]]] = {t: {} for t in ResourceType}
    prefixed: dict[ResourceType, dict[str, list[AclBinding]]] = {t: {} for t in ResourceType}
    for b in bindings:
        target = literal if b.pattern_type is PatternType.LITERAL else prefixed
        target[b.resource_type].setdefault(b.resource_name, []).append(b)
    return {
        t: _TypeIndex(
            literal={n: tuple(bs) for n, bs in literal[t].items()},
            prefixed={n: tuple(bs) for n, bs in prefixed[t].items()},
            prefix_lengths=tuple(sorted({len(n) for n in prefixed[t]})),
        )
        for t in ResourceType
    }


class Authorizer:
    """Decides by an immutable set of bindings and a config. A new ACL set is
    a new Authorizer (`with_bindings`), so a decision never sees half an
    update. Lookups cost O(bindings on the resource): the literal name, `*`,
    and each prefix length present are dictionary lookups."""

    def __init__(self, bindings: Iterable[AclBinding] = (), *,
                 config: AuthorizerConfig | None = None) -> None:
        self._bindings = frozenset(bindings)
        self._config = config if config is not None else AuthorizerConfig()
        self._index = _index(self._bindings)

    @property
    def bindings(self) -> frozenset[AclBinding]:
        return self._bindings

    @property
    def config(self) -> AuthorizerConfig:
        return self._config

    def with_bindings(self, bindings: Iterable[AclBinding]) -> Authorizer:
        return Authorizer(bindings, config=self._config)

    def describe(self, acl_filter: AclFilter | None = None) -> list[AclBinding]:
        """The bindings the filter selects (all without one), in a stable order."""
        chosen = (b for b in self._bindings if acl_filter is None or acl_filter.matches(b))
        return sorted(chosen, key=AclBinding.sort_key)

    def is_super_user(self, principal: str) -> bool:
        return principal in self._config.super_users

    def _applying(self, resource_type: ResourceType, resource_name: str) -> list[AclBinding]:
        """Every binding whose pattern covers the resource, any principal."""
        index = self._index[resource_type]
        found: list[AclBinding] = []
        found.extend(index.literal.get(resource_name, ()))
        if resource_name != WILDCARD:
            found.extend(index.literal.get(WILDCARD, ()))
        for length in index.prefix_lengths:
            if length > len(resource_name):
                break
            found.extend(index.prefixed.get(resource_name[:length], ()))
        return found

    def authorize(self, principal: str, host: str, operation: Operation,
                  resource_type: ResourceType, resource_name: str) -> Decision:
        """May `principal`, connecting from `host`, do `operation` to the named
        resource? Kafka's rules (module docstring)."""
        if operation is Operation.ALL:
            raise ValueError("authorize() takes a concrete operation, not All")
        if self.is_super_user(principal):
            return Decision(True, Rule.SUPER_USER)
        covering = self._applying(resource_type, resource_name)
        allow: AclBinding | None = None
        for binding in covering:
            if binding.principal not in (principal, WILDCARD_PRINCIPAL):
                continue
            if binding.host not in (WILDCARD, host):
                continue
            if binding.permission is Permission.DENY:
                if binding.operation in (Operation.ALL, operation):
                    return Decision(False, Rule.DENY_ACL, binding)
                continue
            if allow is None and (
                    binding.operation in (Operation.ALL, operation)
                    or binding.operation in IMPLIED_BY.get(operation, ())):
                allow = binding
        if allow is not None:
            return Decision(True, Rule.ALLOW_ACL, allow)
        if not covering:
            return Decision(self._config.allow_everyone_if_no_acl_found, Rule.NO_ACL_FOUND)
        return Decision(False, Rule.NOT_ALLOWED)

    def authorize_by_resource_type(self, principal: str, host: str, operation: Operation,
                                   resource_type: ResourceType) -> Decision:
        """May `principal` do `operation` to at least one resource of this
        type? Kafka's authorizeByResourceType (module docstring)."""
        if operation is Operation.ALL:
            raise ValueError("authorize_by_resource_type() takes a concrete operation, not All")
        probe = self.authorize(principal, host, operation, resource_type, _PROBE_NAME)
        if probe.allowed:
            return probe
        index = self._index[resource_type]
        all_of_type = [b for bs in index.literal.values() for b in bs] + [
            b for bs in index.prefixed.values() for b in bs]
        deny_literal: set[str] = set()
        deny_prefixed: set[str] = set()
        allows: list[AclBinding] = []
        for b in sorted(all_of_type, key=AclBinding.sort_key):
            if b.principal not in (principal, WILDCARD_PRINCIPAL):
                continue
            if b.host not in (WILDCARD, host):
                continue
            if b.operation not in (Operation.ALL, operation):
                continue
            if b.permission is Permission.DENY:
                if b.pattern_type is PatternType.LITERAL and b.resource_name == WILDCARD:
                    return Decision(False, Rule.DENY_ACL, b)
                (deny_literal if b.pattern_type is PatternType.LITERAL
                 else deny_prefixed).add(b.resource_name)
            else:
                allows.append(b)
        for b in allows:
            if b.pattern_type is PatternType.LITERAL and b.resource_name == WILDCARD:
                return Decision(True, Rule.ALLOW_ACL, b)
        for b in allows:
            if b.pattern_type is PatternType.LITERAL and b.resource_name in deny_literal:
                continue
            name = b.resource_name
            if any(name[:n] in deny_prefixed for n in range(1, len(name) + 1)):
                continue
            return Decision(True, Rule.ALLOW_ACL, b)
        return Decision(False, Rule.NOT_ALLOWED)
