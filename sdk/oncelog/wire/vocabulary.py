"""The words the services and the clients share, as one typed vocabulary.

Each enum is a `StrEnum` whose values are the strings that were on the wire
and in the API before it existed, so no caller breaks: `IsolationLevel.
READ_COMMITTED == "read_committed"`, and a member can be passed wherever a
string was (and the other way round, through `parse`). `parse` also accepts
Kafka's spellings ("ClusterAction", "TransactionalId", "WRITE").

Here: the isolation levels, offset-reset policies, security protocols,
cleanup policies and service kinds of the clients' and servers' options;
the states a transaction and a group are described with; and Kafka's ACL
model (resource types, operations, pattern types, permissions, and which
operations each resource type has). The services, the SDK, the CLI and the
local cluster take these names from here.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Self, TypeVar

W = TypeVar("W", bound="Vocabulary")


class Vocabulary(enum.StrEnum):
    """A StrEnum with a lenient `parse` (the base of every enum here)."""

    @classmethod
    def parse(cls: type[W], value: object) -> W:
        """A member from itself or its text, in any of Kafka's spellings;
        ValueError naming the allowed values otherwise."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            wanted = value.strip().replace("_", "").replace("-", "").replace(".", "").lower()
            for member in cls:
                if member.value.replace("_", "").replace(".", "").lower() == wanted:
                    return member
        raise ValueError(f"unknown {cls.what()} {value!r}; expected one of "
                         f"{', '.join(repr(m.value) for m in cls)}")

    @classmethod
    def what(cls) -> str:
        """How messages name this kind of value: "resource type"."""
        words = "".join(f" {c.lower()}" if c.isupper() else c for c in cls.__name__).strip()
        return words.removeprefix("acl ")


# ----------------------------------------------------------- client options


class IsolationLevel(Vocabulary):
    READ_UNCOMMITTED = "read_uncommitted"
    READ_COMMITTED = "read_committed"


class OffsetReset(Vocabulary):
    """Where a consumer starts when it has no committed offset (Kafka's
    auto.offset.reset)."""

    EARLIEST = "earliest"
    LATEST = "latest"
    # No reset: a consumer with no committed offset fails (NoOffsetForPartition).
    NONE = "none"


class SecurityProtocol(Vocabulary):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_SSL = "SASL_SSL"


class CleanupPolicy(Vocabulary):
    """A topic's cleanup.policy values (a topic may name both, comma-separated)."""

    DELETE = "delete"
    COMPACT = "compact"


class ServiceKind(Vocabulary):
    """The three services, as process names, metric labels and the local
    cluster's kinds."""

    PARTITION_STORE = "partition_store"
    COORDINATOR = "coordinator"
    GROUP_COORDINATOR = "group_coordinator"


# ------------------------------------------------------- described states


class DescribedState(Vocabulary):
    """The base of the states a coordinator reports about a transaction or a
    group. A state this client does not know (a newer server's) reads as
    UNKNOWN, as Kafka's admin client reports it, instead of failing the
    whole describe or list call."""

    @classmethod
    def reported(cls, value: str) -> Self:
        try:
            return cls.parse(value)
        except ValueError:
            return cls.parse("Unknown")


class TransactionState(DescribedState):
    """A transactional id's state as DescribeTransactions and ListTransactions
    report it (Kafka's TransactionState names). The coordinator's state
    machine (services/coordinator/core/transactions.py) runs on these; it
    never takes UNKNOWN, which only a client reports."""

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    PREPARE_EPOCH_FENCE = "PrepareEpochFence"
    PREPARED = "Prepared"
    DEAD = "Dead"
    UNKNOWN = "Unknown"


class GroupState(DescribedState):
    """A group's state as DescribeGroups and ListGroups report it: the
    consumer protocol's (KIP-848) and the classic protocol's states, Kafka's
    names. Each protocol's own state machine uses its subset
    (services/group_coordinator/core/groups.py and classic.py); UNKNOWN is
    only a client's."""

    EMPTY = "Empty"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    DEAD = "Dead"
    UNKNOWN = "Unknown"


# --------------------------------------------------------------------- ACLs
# Kafka's ACL model (docs/security.md). The values are the wire's: lower case
# with underscores ("transactional_id", "cluster_action").


class AclResourceType(Vocabulary):
    TOPIC = "topic"
    GROUP = "group"
    TRANSACTIONAL_ID = "transactional_id"
    CLUSTER = "cluster"


class AclOperation(Vocabulary):
    ALL = "all"
    READ = "read"
    WRITE = "write"
    CREATE = "create"
    DELETE = "delete"
    ALTER = "alter"
    DESCRIBE = "describe"
    CLUSTER_ACTION = "cluster_action"
    DESCRIBE_CONFIGS = "describe_configs"
    ALTER_CONFIGS = "alter_configs"
    IDEMPOTENT_WRITE = "idempotent_write"
    TWO_PHASE_COMMIT = "two_phase_commit"

    @property
    def kafka_name(self) -> str:
        """Kafka's name for it, as logs and messages print it: "ClusterAction"."""
        return "".join(word.capitalize() for word in self.value.split("_"))


class AclPatternType(Vocabulary):
    LITERAL = "literal"
    PREFIXED = "prefixed"


class AclPermission(Vocabulary):
    ALLOW = "allow"
    DENY = "deny"


class AclPatternFilterType(Vocabulary):
    """How an ACL filter's resource name selects bindings (Kafka's PatternType
    in a filter): LITERAL/PREFIXED — bindings of that pattern type with that
    exact name; ANY — bindings of either type with that exact name; MATCH —
    the bindings that would apply to a resource of that name (the literal
    name, the literal `*`, every prefix of it)."""

    LITERAL = "literal"
    PREFIXED = "prefixed"
    ANY = "any"
    MATCH = "match"


# Which operations each resource type has: Kafka's table
# (AclEntry.supportedOperations) for the types oncelog has; ALL on every one.
ACL_OPERATIONS_OF: Mapping[AclResourceType, frozenset[AclOperation]] = {
    AclResourceType.TOPIC: frozenset({
        AclOperation.ALL, AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE,
        AclOperation.DELETE, AclOperation.ALTER, AclOperation.DESCRIBE,
        AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS,
    }),
    AclResourceType.GROUP: frozenset({
        AclOperation.ALL, AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE,
    }),
    AclResourceType.TRANSACTIONAL_ID: frozenset({
        AclOperation.ALL, AclOperation.WRITE, AclOperation.DESCRIBE,
        AclOperation.TWO_PHASE_COMMIT,
    }),
    AclResourceType.CLUSTER: frozenset({
        AclOperation.ALL, AclOperation.CREATE, AclOperation.CLUSTER_ACTION,
        AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS,
        AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER, AclOperation.DESCRIBE,
    }),
}
# The one cluster resource's name (Kafka's is "kafka-cluster").
ACL_CLUSTER_NAME = "oncelog-cluster"
# A binding's host or literal resource name that matches every host or name.
ACL_WILDCARD = "*"
