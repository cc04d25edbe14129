"""The authorizer of services/common/security/authorizer.py decides as Kafka's.

Goal: every rule of Kafka's StandardAuthorizer that oncelog relies on holds
case by case — super users, deny wins over allow, the `User:*` principal and
`*` host, literal `*` and prefixed names, implied operations (for ALLOW only),
the no-ACL default — and so does authorize_by_resource_type ("may the
principal write to some topic?"); a binding that cannot mean anything is
refused with a message naming what is wrong; filters select bindings as
Kafka's AclBindingFilter does.

Method: tables of (ACL set, question, expected decision) run through the pure
Authorizer; no service is involved. The resource table of docs/security.md
is parsed and compared with VALID_OPERATIONS.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from services.common.security.authorizer import (
    CLUSTER_NAME,
    VALID_OPERATIONS,
    AclBinding,
    AclFilter,
    Authorizer,
    AuthorizerConfig,
    Operation,
    PatternFilterType,
    PatternType,
    Permission,
    ResourcePattern,
    ResourceType,
    Rule,
)

ALICE = "User:alice"
BOB = "User:bob"
HOST = "10.0.0.7"
OTHER_HOST = "10.0.0.8"
T = ResourceType.TOPIC
G = ResourceType.GROUP
X = ResourceType.TRANSACTIONAL_ID
C = ResourceType.CLUSTER


def acl(principal: str, resource_type: str, name: str, operation: str,
        permission: str = "allow", pattern: str = "literal", host: str = "*") -> AclBinding:
    return AclBinding.of(principal=principal, resource_type=resource_type, resource_name=name,
                         pattern_type=pattern, operation=operation, permission=permission,
                         host=host)


# (bindings, principal, host, operation, resource type, name) -> allowed, rule
CASES = [
    # No binding on the resource at all: the default (deny).
    ((), ALICE, HOST, Operation.READ, T, "payments", False, Rule.NO_ACL_FOUND),
    # A literal allow for this principal and operation.
    ((acl(ALICE, "topic", "payments", "read"),), ALICE, HOST, Operation.READ, T, "payments",
     True, Rule.ALLOW_ACL),
    # ... is not an allow for another principal: the resource has ACLs, so no.
    ((acl(ALICE, "topic", "payments", "read"),), BOB, HOST, Operation.READ, T, "payments",
     False, Rule.NOT_ALLOWED),
    # ... nor for another operation, nor another topic (which has no ACL).
    ((acl(ALICE, "topic", "payments", "read"),), ALICE, HOST, Operation.WRITE, T, "payments",
     False, Rule.NOT_ALLOWED),
    ((acl(ALICE, "topic", "payments", "read"),), ALICE, HOST, Operation.READ, T, "ledger",
     False, Rule.NO_ACL_FOUND),
    # ... nor for a group of the same name (types are separate).
    ((acl(ALICE, "topic", "payments", "read"),), ALICE, HOST, Operation.READ, G, "payments",
     False, Rule.NO_ACL_FOUND),
    # Deny wins over allow, in either order, and over All.
    ((acl(ALICE, "topic", "payments", "write"),
      acl(ALICE, "topic", "payments", "write", "deny")),
     ALICE, HOST, Operation.WRITE, T, "payments", False, Rule.DENY_ACL),
    ((acl(ALICE, "topic", "payments", "write", "deny"),
      acl(ALICE, "topic", "payments", "all")),
     ALICE, HOST, Operation.WRITE, T, "payments", False, Rule.DENY_ACL),
    # A wildcard deny beats a literal allow; a prefixed deny beats a literal allow.
    ((acl(ALICE, "topic", "payments", "read"), acl(ALICE, "topic", "*", "read", "deny")),
     ALICE, HOST, Operation.READ, T, "payments", False, Rule.DENY_ACL),
    ((acl(ALICE, "topic", "payments", "read"),
      acl(ALICE, "topic", "pay", "read", "deny", "prefixed")),
     ALICE, HOST, Operation.READ, T, "payments", False, Rule.DENY_ACL),
    # A deny for everyone (User:*) denies alice too.
    ((acl(ALICE, "topic", "payments", "read"), acl("User:*", "topic", "payments", "read", "deny")),
     ALICE, HOST, Operation.READ, T, "payments", False, Rule.DENY_ACL),
    # Deny All denies every operation.
    ((acl(ALICE, "topic", "payments", "read"), acl(ALICE, "topic", "payments", "all", "deny")),
     ALICE, HOST, Operation.DESCRIBE, T, "payments", False, Rule.DENY_ACL),
    # A deny of Read does not deny Describe (implication is for ALLOW only),
    # and a Read allow implies Describe.
    ((acl(ALICE, "topic", "payments", "read"), acl(ALICE, "topic", "payments", "read", "deny")),
     ALICE, HOST, Operation.DESCRIBE, T, "payments", True, Rule.ALLOW_ACL),
    # A deny for another host does not apply; one for this host does.
    ((acl(ALICE, "topic", "payments", "read"),
      acl(ALICE, "topic", "payments", "read", "deny", host=OTHER_HOST)),
     ALICE, HOST, Operation.READ, T, "payments", True, Rule.ALLOW_ACL),
    ((acl(ALICE, "topic", "payments", "read"),
      acl(ALICE, "topic", "payments", "read", "deny", host=HOST)),
     ALICE, HOST, Operation.READ, T, "payments", False, Rule.DENY_ACL),
    # An allow bound to another host does not apply.
    ((acl(ALICE, "topic", "payments", "read", host=OTHER_HOST),), ALICE, HOST,
     Operation.READ, T, "payments", False, Rule.NOT_ALLOWED),
    # User:* allows everyone, of any principal type.
    ((acl("User:*", "topic", "payments", "read"),), "Service:etl", HOST, Operation.READ, T,
     "payments", True, Rule.ALLOW_ACL),
    # Literal * covers every name; a prefix covers the names that start with it.
    ((acl(ALICE, "topic", "*", "write"),), ALICE, HOST, Operation.WRITE, T, "anything",
     True, Rule.ALLOW_ACL),
    ((acl(ALICE, "topic", "pay", "write", pattern="prefixed"),), ALICE, HOST, Operation.WRITE,
     T, "payments", True, Rule.ALLOW_ACL),
    ((acl(ALICE, "topic", "pay", "write", pattern="prefixed"),), ALICE, HOST, Operation.WRITE,
     T, "pa", False, Rule.NO_ACL_FOUND),
    # The whole name is a prefix of itself.
    ((acl(ALICE, "topic", "payments", "write", pattern="prefixed"),), ALICE, HOST,
     Operation.WRITE, T, "payments", True, Rule.ALLOW_ACL),
    # A literal "pay" is not a prefix: it covers only "pay".
    ((acl(ALICE, "topic", "pay", "write"),), ALICE, HOST, Operation.WRITE, T, "payments",
     False, Rule.NO_ACL_FOUND),
    # A prefixed "*" is the character, not a wildcard.
    ((acl(ALICE, "topic", "*", "write", pattern="prefixed"),), ALICE, HOST, Operation.WRITE,
     T, "payments", False, Rule.NO_ACL_FOUND),
    # Implied operations: Read, Write, Delete, Alter imply Describe;
    # AlterConfigs implies DescribeConfigs; All implies everything.
    ((acl(ALICE, "topic", "t", "write"),), ALICE, HOST, Operation.DESCRIBE, T, "t",
     True, Rule.ALLOW_ACL),
    ((acl(ALICE, "topic", "t", "delete"),), ALICE, HOST, Operation.DESCRIBE, T, "t",
     True, Rule.ALLOW_ACL),
    ((acl(ALICE, "topic", "t", "alter"),), ALICE, HOST, Operation.DESCRIBE, T, "t",
     True, Rule.ALLOW_ACL),
    ((acl(ALICE, "topic", "t", "alter_configs"),), ALICE, HOST, Operation.DESCRIBE_CONFIGS, T,
     "t", True, Rule.ALLOW_ACL),
    ((acl(ALICE, "topic", "t", "all"),), ALICE, HOST, Operation.ALTER_CONFIGS, T, "t",
     True, Rule.ALLOW_ACL),
    # ... and nothing else: Describe does not imply Read, Write does not imply
    # Read, AlterConfigs does not imply Describe, Create does not imply Describe.
    ((acl(ALICE, "topic", "t", "describe"),), ALICE, HOST, Operation.READ, T, "t",
     False, Rule.NOT_ALLOWED),
    ((acl(ALICE, "topic", "t", "write"),), ALICE, HOST, Operation.READ, T, "t",
     False, Rule.NOT_ALLOWED),
    ((acl(ALICE, "topic", "t", "alter_configs"),), ALICE, HOST, Operation.DESCRIBE, T, "t",
     False, Rule.NOT_ALLOWED),
    ((acl(ALICE, "topic", "t", "create"),), ALICE, HOST, Operation.DESCRIBE, T, "t",
     False, Rule.NOT_ALLOWED),
    # On the cluster, ClusterAction does not imply IdempotentWrite (Kafka has
    # no such rule); Alter implies Describe there too.
    ((acl(ALICE, "cluster", CLUSTER_NAME, "cluster_action"),), ALICE, HOST,
     Operation.IDEMPOTENT_WRITE, C, CLUSTER_NAME, False, Rule.NOT_ALLOWED),
    ((acl(ALICE, "cluster", CLUSTER_NAME, "alter"),), ALICE, HOST, Operation.DESCRIBE, C,
     CLUSTER_NAME, True, Rule.ALLOW_ACL),
    # Write on a transactional id does not imply TwoPhaseCommit.
    ((acl(ALICE, "transactional_id", "copier-0", "write"),), ALICE, HOST,
     Operation.TWO_PHASE_COMMIT, X, "copier-0", False, Rule.NOT_ALLOWED),
    ((acl(ALICE, "transactional_id", "copier-", "two_phase_commit", pattern="prefixed"),),
     ALICE, HOST, Operation.TWO_PHASE_COMMIT, X, "copier-0", True, Rule.ALLOW_ACL),
    # Any binding on the resource, even for someone else, turns the default
    # off: "no ACL found" is about the resource, not the principal.
    ((acl(BOB, "group", "g", "read"),), ALICE, HOST, Operation.READ, G, "g",
     False, Rule.NOT_ALLOWED),
]


@pytest.mark.parametrize(
    ("bindings", "principal", "host", "operation", "resource_type", "name", "allowed", "rule"),
    CASES,
)
def test_authorize(bindings: tuple[AclBinding, ...], principal: str, host: str,
                   operation: Operation, resource_type: ResourceType, name: str,
                   allowed: bool, rule: Rule) -> None:
    decision = Authorizer(bindings).authorize(principal, host, operation, resource_type, name)
    assert (decision.allowed, decision.rule) == (allowed, rule), decision
    if rule in (Rule.ALLOW_ACL, Rule.DENY_ACL):
        # The binding that decided is named, for the denial log.
        assert decision.binding in bindings
        assert decision.binding is not None
        assert decision.binding.permission is (
            Permission.ALLOW if allowed else Permission.DENY)
    else:
        assert decision.binding is None


def test_super_users_bypass_every_acl_and_the_default() -> None:
    bindings = [acl(ALICE, "topic", "*", "all", "deny"), acl("User:*", "cluster", CLUSTER_NAME,
                                                                 "all", "deny")]
    authorizer = Authorizer(bindings, config=AuthorizerConfig(super_users=frozenset({ALICE})))
    for operation, resource_type, name in [
        (Operation.WRITE, T, "payments"), (Operation.CLUSTER_ACTION, C, CLUSTER_NAME),
        (Operation.DELETE, G, "nobody-granted-this"),
    ]:
        decision = authorizer.authorize(ALICE, HOST, operation, resource_type, name)
        assert decision.allowed and decision.rule is Rule.SUPER_USER
    assert not authorizer.authorize(BOB, HOST, Operation.WRITE, T, "payments").allowed
    # Super users are exact principals: "alice" of another type is not one.
    assert not authorizer.authorize("Service:alice", HOST, Operation.WRITE, T, "payments").allowed


@pytest.mark.parametrize(("bindings", "name", "allowed"), [
    # No ACL on the resource: allowed.
    ((), "payments", True),
    ((acl(BOB, "topic", "ledger", "read"),), "payments", True),
    # An ACL on the resource for someone else: the default no longer applies.
    ((acl(BOB, "topic", "payments", "read"),), "payments", False),
    ((acl(BOB, "topic", "pay", "read", pattern="prefixed"),), "payments", False),
    ((acl(BOB, "topic", "*", "read"),), "payments", False),
])
def test_allow_everyone_if_no_acl_found(bindings: tuple[AclBinding, ...], name: str,
                                        allowed: bool) -> None:
    authorizer = Authorizer(bindings,
                            config=AuthorizerConfig(allow_everyone_if_no_acl_found=True))
    assert authorizer.authorize(ALICE, HOST, Operation.READ, T, name).allowed is allowed


# (bindings, allowed): may alice Write to *some* topic (authorizeByResourceType)?
BY_TYPE_CASES = [
    ((), False),
    ((acl(ALICE, "topic", "payments", "write"),), True),
    ((acl("User:*", "topic", "payments", "write"),), True),
    ((acl(ALICE, "topic", "pay", "write", pattern="prefixed"),), True),
    ((acl(ALICE, "topic", "payments", "all"),), True),
    # Implication plays no part: Read does not count, nor does a Write elsewhere.
    ((acl(ALICE, "topic", "payments", "read"),), False),
    ((acl(ALICE, "group", "payments", "read"),), False),
    ((acl(BOB, "topic", "payments", "write"),), False),
    ((acl(ALICE, "topic", "payments", "write", host=OTHER_HOST),), False),
    # A deny of the same literal, of a covering prefix, or of `*` shadows the allow.
    ((acl(ALICE, "topic", "payments", "write"), acl(ALICE, "topic", "payments", "write", "deny")),
     False),
    ((acl(ALICE, "topic", "payments", "write"),
      acl(ALICE, "topic", "pay", "write", "deny", "prefixed")), False),
    ((acl(ALICE, "topic", "payments", "write", pattern="prefixed"),
      acl(ALICE, "topic", "pay", "write", "deny", "prefixed")), False),
    ((acl(ALICE, "topic", "*", "write"), acl(ALICE, "topic", "*", "all", "deny")), False),
    # ... but a deny of a longer prefix leaves the shorter one's other names.
    ((acl(ALICE, "topic", "pay", "write", pattern="prefixed"),
      acl(ALICE, "topic", "payments", "write", "deny", "prefixed")), True),
    # A literal deny shadows only that literal, not a prefix allow.
    ((acl(ALICE, "topic", "pay", "write", pattern="prefixed"),
      acl(ALICE, "topic", "pay", "write", "deny")), True),
    # A wildcard allow wins over literal and prefixed denies.
    ((acl(ALICE, "topic", "*", "write"), acl(ALICE, "topic", "payments", "write", "deny")),
     True),
]


@pytest.mark.parametrize(("bindings", "allowed"), BY_TYPE_CASES)
def test_authorize_by_resource_type(bindings: tuple[AclBinding, ...], allowed: bool) -> None:
    decision = Authorizer(bindings).authorize_by_resource_type(ALICE, HOST, Operation.WRITE, T)
    assert decision.allowed is allowed, decision


def test_by_resource_type_for_super_users_and_the_default() -> None:
    denied_all = [acl("User:*", "topic", "*", "all", "deny")]
    config = AuthorizerConfig(super_users=frozenset({ALICE}))
    assert Authorizer(denied_all, config=config).authorize_by_resource_type(
        ALICE, HOST, Operation.WRITE, T).rule is Rule.SUPER_USER
    open_config = AuthorizerConfig(allow_everyone_if_no_acl_found=True)
    assert Authorizer((), config=open_config).authorize_by_resource_type(
        ALICE, HOST, Operation.WRITE, T).allowed


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"principal": "alice"}, "no ':' between its type and its name"),
    ({"principal": ":alice"}, "empty type"),
    ({"principal": "User:"}, "empty name"),
    ({"resource_name": ""}, "resource name of a topic pattern is empty"),
    ({"host": ""}, "host of an ACL for User:alice is empty"),
    ({"operation": "cluster_action"}, "ClusterAction does not apply to a topic"),
    ({"operation": "fly"}, "unknown operation 'fly'"),
    ({"permission": "maybe"}, "unknown permission 'maybe'"),
    ({"pattern_type": "regex"}, "unknown pattern type 'regex'"),
    ({"resource_type": "queue"}, "unknown resource type 'queue'"),
    ({"resource_type": "group", "operation": "write"}, "Write does not apply to a group"),
    ({"resource_type": "transactional_id", "operation": "read"},
     "Read does not apply to a transactional_id"),
    ({"resource_type": "cluster", "operation": "read"}, "literal name 'oncelog-cluster'"),
    ({"resource_type": "cluster", "resource_name": CLUSTER_NAME, "pattern_type": "prefixed",
      "operation": "alter"}, "cluster resource is the literal name"),
])
def test_a_binding_that_cannot_mean_anything_is_refused(kwargs: dict[str, str],
                                                        message: str) -> None:
    fields = {"principal": ALICE, "resource_type": "topic", "resource_name": "payments",
              "pattern_type": "literal", "operation": "write", "permission": "allow",
              "host": "*", **kwargs}
    with pytest.raises(ValueError, match=message):
        AclBinding.of(**fields)


@pytest.mark.parametrize("resource_type", list(ResourceType))
def test_valid_operations_follow_kafkas_table(resource_type: ResourceType) -> None:
    name = CLUSTER_NAME if resource_type is C else "r"
    for operation in Operation:
        valid = operation in VALID_OPERATIONS[resource_type]
        try:
            AclBinding(ALICE, "*", ResourcePattern(resource_type, name), operation,
                       Permission.ALLOW)
        except ValueError:
            assert not valid, (resource_type, operation)
        else:
            assert valid, (resource_type, operation)
    assert Operation.ALL in VALID_OPERATIONS[resource_type]
    expected = {
        T: {"read", "write", "create", "delete", "alter", "describe", "describe_configs",
            "alter_configs"},
        G: {"read", "describe", "delete"},
        X: {"write", "describe", "two_phase_commit"},
        C: {"create", "cluster_action", "describe_configs", "alter_configs",
            "idempotent_write", "alter", "describe"},
    }[resource_type]
    assert {o.value for o in VALID_OPERATIONS[resource_type]} == expected | {"all"}


def test_names_are_read_in_kafkas_spellings_too() -> None:
    a = AclBinding.of(principal=ALICE, resource_type="TransactionalId", resource_name="t",
                      operation="TwoPhaseCommit", permission="ALLOW", pattern_type="LITERAL")
    b = AclBinding.of(principal=ALICE, resource_type=X, resource_name="t",
                      operation=Operation.TWO_PHASE_COMMIT)
    assert a == b and hash(a) == hash(b)
    assert Operation.CLUSTER_ACTION.kafka_name == "ClusterAction"


LIT = acl(ALICE, "topic", "payments", "read")
PRE = acl(ALICE, "topic", "pay", "read", pattern="prefixed")
STAR = acl(BOB, "topic", "*", "write", "deny")
GRP = acl(BOB, "group", "payments", "read")
ALL_BINDINGS = (LIT, PRE, STAR, GRP)


@pytest.mark.parametrize(("acl_filter", "expected"), [
    (AclFilter(), {LIT, PRE, STAR, GRP}),
    (AclFilter(resource_type=T), {LIT, PRE, STAR}),
    # An exact name: any pattern type with that name, or one pattern type.
    (AclFilter(resource_name="payments"), {LIT, GRP}),
    (AclFilter(resource_type=T, resource_name="pay", pattern_type=PatternFilterType.PREFIXED),
     {PRE}),
    (AclFilter(resource_type=T, resource_name="pay", pattern_type=PatternFilterType.LITERAL),
     set()),
    (AclFilter(pattern_type=PatternFilterType.PREFIXED), {PRE}),
    # MATCH: every binding that applies to a topic of that name.
    (AclFilter(resource_type=T, resource_name="payments", pattern_type=PatternFilterType.MATCH),
     {LIT, PRE, STAR}),
    (AclFilter(resource_type=T, resource_name="ledger", pattern_type=PatternFilterType.MATCH),
     {STAR}),
    (AclFilter(principal=BOB), {STAR, GRP}),
    (AclFilter(operation=Operation.READ), {LIT, PRE, GRP}),
    (AclFilter(permission=Permission.DENY), {STAR}),
    (AclFilter(host="10.1.1.1"), set()),
])
def test_filters_select_as_kafkas(acl_filter: AclFilter, expected: set[AclBinding]) -> None:
    authorizer = Authorizer(ALL_BINDINGS)
    assert set(authorizer.describe(acl_filter)) == expected
    assert {b for b in ALL_BINDINGS if acl_filter.matches(b)} == expected


def test_an_authorizer_is_immutable_and_with_bindings_keeps_the_config() -> None:
    config = AuthorizerConfig(super_users=frozenset({"User:admin"}))
    before = Authorizer([LIT], config=config)
    after = before.with_bindings([LIT, acl(ALICE, "topic", "payments", "read", "deny")])
    assert before.authorize(ALICE, HOST, Operation.READ, T, "payments").allowed
    assert not after.authorize(ALICE, HOST, Operation.READ, T, "payments").allowed
    assert after.config is config and before.bindings == frozenset({LIT})
    with pytest.raises(ValueError, match="concrete operation"):
        before.authorize(ALICE, HOST, Operation.ALL, T, "payments")
    with pytest.raises(ValueError, match="super user 'admin'"):
        AuthorizerConfig(super_users=frozenset({"admin"}))
    assert PatternType.parse("Prefixed") is PatternType.PREFIXED


def test_the_documented_operations_are_the_valid_ones() -> None:
    doc = Path(__file__).resolve().parents[2] / "docs" / "security.md"
    section = doc.read_text().split("## Resources and operations", 1)[1]
    documented: dict[ResourceType, set[str]] = {}
    for line in section.splitlines():
        match = re.fullmatch(r"\| `(\w+)` \| (.*) \|", line.strip())
        if match is None:
            if documented:
                break
            continue
        documented[ResourceType.parse(match.group(1))] = {
            op.strip() for op in match.group(2).split(",")}
    assert documented == {
        t: {op.kafka_name for op in ops if op is not Operation.ALL}
        for t, ops in VALID_OPERATIONS.items()
    }
