"""The SDK's value types: what callers pass in and get back.

Immutable, so safe to share between threads: frozen, slotted dataclasses,
except ConsumerRecord, which the consumer makes once per record and is
therefore a named tuple (as in kafka-python): a frozen dataclass costs three
times as much to create.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

from oncelog.wire.vocabulary import (
    ACL_CLUSTER_NAME,
    ACL_OPERATIONS_OF,
    ACL_WILDCARD,
    AclOperation,
    AclPatternFilterType,
    AclPatternType,
    AclPermission,
    AclResourceType,
    GroupState,
    TransactionState,
    Vocabulary,
)

Header = tuple[str, bytes | None]


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    """One partition of a topic."""

    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a produced record landed.

    `offset` is -1 when the store reported the batch as an old duplicate
    without its original offset (DUPLICATE_SEQUENCE_NUMBER): written once, at
    an offset the store no longer remembers.
    """

    topic: str
    partition: int
    offset: int
    timestamp_ms: int


class ConsumerRecord(NamedTuple):
    """One record as a consumer reads it."""

    topic: str
    partition: int
    offset: int
    # bytes (or None) as stored; what key_deserializer / value_deserializer
    # return when the consumer has them, hence Any.
    key: Any
    value: Any
    headers: tuple[Header, ...]
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class PartitionRecords:
    """Records of one partition as Consumer.poll_columns() hands them out:
    one list per field, item i of each being record i, in offset order.
    Keys and values are bytes (or None) as stored."""

    topic: str
    partition: int
    offsets: list[int]
    timestamps_ms: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[tuple[Header, ...]]

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class PreparedTxnState:
    """A prepared two-phase-commit transaction (Kafka's PreparedTxnState): the
    producer id and epoch its records were written with. What
    Producer.prepare_transaction() returns and complete_transaction() takes;
    str() and PreparedTxnState.parse() carry it between processes as text
    ("producer_id:epoch")."""

    producer_id: int
    producer_epoch: int

    def __str__(self) -> str:
        return f"{self.producer_id}:{self.producer_epoch}"

    @staticmethod
    def parse(text: str) -> PreparedTxnState:
        """The inverse of str(); ValueError for anything else."""
        head, sep, tail = text.partition(":")
        try:
            if not sep:
                raise ValueError
            state = PreparedTxnState(int(head), int(tail))
        except ValueError:
            raise ValueError(
                f"a prepared transaction state is 'producer_id:epoch', got {text!r}"
            ) from None
        if state.producer_id < 0 or not 0 <= state.producer_epoch < 2**15:
            raise ValueError(f"{text!r} names no prepared transaction: the producer id must "
                             "be >= 0 and the epoch in 0..32767")
        return state


@dataclass(frozen=True, slots=True)
class GroupMetadata:
    """A consumer's group membership (Consumer.group_metadata()), as a
    transactional producer needs it to commit offsets: the group coordinator
    accepts them only from the member that owns the partitions now.
    `generation_id` is the member epoch (-1 outside the group protocol)."""

    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class OffsetAndTimestamp:
    """The answer of Consumer.offsets_for_times for one partition."""

    offset: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class NewTopic:
    """A topic to create with Admin.create_topics."""

    name: str
    partitions: int = 1
    config: Mapping[str, str] = field(default_factory=dict)
    # Copies of each partition; 0: the cluster's default (min(3, stores) on
    # a replicated cluster, 1 on a cluster without etcd).
    replication_factor: int = 0


@dataclass(frozen=True, slots=True)
class PartitionDescription:
    """One partition of Admin.describe_topic: its leader, replicas and
    in-sync replicas (ISR), and its offsets.

    `high_watermark` is the end of the log; `last_stable_offset` is where a
    read_committed consumer stops (the first offset of the oldest open
    transaction, or the high watermark when none is open).
    """

    partition: int
    leader_node_id: int
    leader_address: str
    earliest_offset: int
    high_watermark: int
    last_stable_offset: int
    # Bumped at every change of leader.
    leader_epoch: int = 0
    # Store node ids holding a copy, and those in sync with the leader.
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()
    # A move in progress (Admin.alter_partition_reassignments): the replica
    # list asked for; empty when none.
    target_replicas: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicDescription:
    """The answer of Admin.describe_topic."""

    name: str
    topic_id: int
    internal: bool
    partitions: tuple[PartitionDescription, ...]
    config: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class TransactionListing:
    """One transactional id as Admin.list_transactions lists it. `state` is
    the coordinator's state (a TransactionState, equal to its name: "Empty",
    "Ongoing", "PrepareCommit", ...; UNKNOWN for a state this client does
    not know)."""

    transactional_id: str
    producer_id: int
    state: TransactionState


@dataclass(frozen=True, slots=True)
class TransactionDescription:
    """The answer of Admin.describe_transaction (and abort_transaction).

    `transaction_start_time_ms` is when the open transaction added its first
    partition (-1: none open); `partitions` are the partitions it has added
    (the group's __consumer_offsets partition included)."""

    transactional_id: str
    state: TransactionState
    producer_id: int
    producer_epoch: int
    transaction_timeout_ms: int
    transaction_start_time_ms: int
    partitions: tuple[TopicPartition, ...]
    coordinator_epoch: int
    # Two-phase commit: the producer was initialized with it (its
    # transactions never time out); in state "Prepared", the prepared
    # transaction's state (its records' producer id and epoch, which may be
    # below producer_id/producer_epoch once a new instance kept it).
    two_phase_commit: bool = False
    prepared_transaction: PreparedTxnState | None = None


@dataclass(frozen=True, slots=True)
class ProducerState:
    """One producer active on a partition (Admin.describe_producers).

    `current_txn_start_offset` is the first offset of the producer's open
    transaction on the partition, None when it has none open;
    `last_timestamp_ms` is the timestamp of its last batch there."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp_ms: int
    coordinator_epoch: int
    current_txn_start_offset: int | None


@dataclass(frozen=True, slots=True)
class HangingTransaction:
    """An open transaction on a partition that no coordinator will end
    (Admin.find_hanging_transactions); `reason` says why it was judged hanging.
    End it with Admin.abort_hanging_transaction(topic_partition, producer_id)."""

    topic_partition: TopicPartition
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    current_txn_start_offset: int
    last_timestamp_ms: int
    reason: str


@dataclass(frozen=True, slots=True)
class GroupListing:
    """One consumer group as Admin.list_groups lists it. `state` is the
    coordinator's (a GroupState, equal to its name: "Empty", "Reconciling",
    "Stable", "PreparingRebalance", "CompletingRebalance", "Dead"; UNKNOWN
    for a state this client does not know)."""

    group_id: str
    state: GroupState


@dataclass(frozen=True, slots=True)
class MemberDescription:
    """One member of a group (Admin.describe_group): its epoch, its
    subscription, and the partitions it owns now."""

    member_id: str
    group_instance_id: str | None
    member_epoch: int
    subscribed_topics: tuple[str, ...]
    assignment: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """The answer of Admin.describe_group. `group_epoch` moves on every change
    of membership or subscriptions."""

    group_id: str
    state: GroupState
    group_epoch: int
    members: tuple[MemberDescription, ...]
    coordinator_epoch: int


@dataclass(frozen=True, slots=True)
class GroupOffset:
    """A group's committed offset of one partition (Admin.list_group_offsets),
    with the partition's end for a read_committed reader (its last stable
    offset) and the lag between them; `end_offset` and `lag` are None when
    the partition no longer exists."""

    offset: int
    end_offset: int | None
    lag: int | None


# ------------------------------------------------------------------ ACLs
#
# Kafka's ACL model (docs/security.md). The names are the wire's: lower
# case with underscores ("transactional_id", "cluster_action"); Kafka's
# spellings ("TransactionalId", "ClusterAction", "WRITE") are accepted and
# turned into them. The tables below only catch mistakes early, with a
# message; the cluster decides what a binding means.

# The vocabulary itself is oncelog.wire.vocabulary's (shared with the
# services): these tuples of its members are kept for callers that read them.
ACL_RESOURCE_TYPES = tuple(t.value for t in AclResourceType)
ACL_OPERATIONS: Mapping[str, tuple[str, ...]] = {
    resource_type.value: tuple(op.value for op in AclOperation
                               if op in ACL_OPERATIONS_OF[resource_type])
    for resource_type in AclResourceType
}
ACL_PATTERN_TYPES = tuple(t.value for t in AclPatternType)
# A filter's pattern type may also be "any" (literal or prefixed, that exact
# name) or "match" (every binding that applies to a resource of that name).
ACL_FILTER_PATTERN_TYPES = tuple(t.value for t in AclPatternFilterType)
ACL_PERMISSIONS = tuple(p.value for p in AclPermission)

V = TypeVar("V", bound=Vocabulary)


def _acl_name(what: str, value: object, vocabulary: type[V]) -> V:
    """`value` as a member of `vocabulary`, from any of Kafka's spellings."""
    try:
        return vocabulary.parse(value)
    except ValueError:
        raise ValueError(f"{what} must be one of {', '.join(vocabulary)}, got {value!r}"
                         ) from None


def _acl_principal(what: str, value: object) -> str:
    if not isinstance(value, str) or ":" not in value:
        raise ValueError(f"{what} must be 'Type:name', such as 'User:alice' (or 'User:*' for "
                         f"everyone), got {value!r}")
    kind, _, name = value.partition(":")
    if not kind or not name:
        raise ValueError(f"{what} {value!r} has an empty {'type' if not kind else 'name'}; "
                         f"expected 'Type:name', such as 'User:alice'")
    return value


def _acl_text(what: str, value: object, hint: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty str ({hint}), got {value!r}")
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class AclBinding:
    """One ACL (Kafka's AclBinding): `permission` ("allow" or "deny") of
    `operation` on the resources of `resource_type` that `resource_name`
    covers — that name (`pattern_type="literal"`; the literal `*` is every
    name) or every name starting with it (`"prefixed"`) — for `principal`
    ("User:alice", "User:*" for everyone) connecting from `host` (an IP
    address, or `*`). The cluster resource is `resource_type="cluster",
    resource_name="oncelog-cluster"`. A binding that cannot mean anything is
    a ValueError naming what is wrong."""

    principal: str
    resource_type: str
    resource_name: str
    pattern_type: str = "literal"
    operation: str
    permission: str = "allow"
    host: str = ACL_WILDCARD

    def __post_init__(self) -> None:
        _acl_principal("principal", self.principal)
        _acl_text("host", self.host, "an IP address, or '*' for every host")
        resource_type = _acl_name("resource_type", self.resource_type, AclResourceType)
        object.__setattr__(self, "resource_type", resource_type)
        _acl_text("resource_name", self.resource_name, "a name, or the literal '*' for every "
                                                       "name")
        pattern_type = _acl_name("pattern_type", self.pattern_type, AclPatternType)
        object.__setattr__(self, "pattern_type", pattern_type)
        valid = ACL_OPERATIONS[resource_type]
        operation = _acl_name("operation", self.operation, AclOperation)
        if operation not in valid:
            raise ValueError(
                f"operation {operation.kafka_name} does not apply to a "
                f"{resource_type}; a {resource_type} has "
                f"{', '.join(AclOperation(op).kafka_name for op in valid)}")
        object.__setattr__(self, "operation", operation)
        object.__setattr__(self, "permission",
                           _acl_name("permission", self.permission, AclPermission))
        if resource_type == "cluster" and (self.resource_name != ACL_CLUSTER_NAME
                                           or pattern_type != "literal"):
            raise ValueError(f"the cluster resource is the literal name {ACL_CLUSTER_NAME!r}, "
                             f"got {pattern_type} {self.resource_name!r}")

    def __str__(self) -> str:
        return (f"{self.permission.upper()} {self.principal} "
                f"{AclOperation.parse(self.operation).kafka_name} on {self.resource_type} "
                f"{self.pattern_type} {self.resource_name!r} from host {self.host}")


@dataclass(frozen=True, slots=True, kw_only=True)
class AclFilter:
    """Selects ACL bindings, for Admin.describe_acls and delete_acls
    (Kafka's AclBindingFilter). A field left None matches anything.
    `pattern_type` says how `resource_name` selects: "literal" or "prefixed"
    (bindings of that type with that exact name), "any" (the default:
    either type, that exact name), or "match" (every binding that applies to
    a resource of that name: the literal name, the literal `*`, and every
    prefix of it)."""

    principal: str | None = None
    resource_type: str | None = None
    resource_name: str | None = None
    pattern_type: str = "any"
    operation: str | None = None
    permission: str | None = None
    host: str | None = None

    def __post_init__(self) -> None:
        if self.principal is not None:
            _acl_principal("principal", self.principal)
        if self.host is not None:
            _acl_text("host", self.host, "an IP address or '*'; None: any host")
        if self.resource_type is not None:
            object.__setattr__(self, "resource_type", _acl_name(
                "resource_type", self.resource_type, AclResourceType))
        if self.resource_name is not None:
            _acl_text("resource_name", self.resource_name, "None: any name")
        object.__setattr__(self, "pattern_type", _acl_name(
            "pattern_type", self.pattern_type, AclPatternFilterType))
        if self.operation is not None:
            operation = _acl_name("operation", self.operation, AclOperation)
            if self.resource_type is not None and (
                    operation not in ACL_OPERATIONS[self.resource_type]):
                raise ValueError(
                    f"operation {operation.kafka_name} does not apply to a "
                    f"{self.resource_type}, so the filter would match nothing")
            object.__setattr__(self, "operation", operation)
        if self.permission is not None:
            object.__setattr__(self, "permission", _acl_name(
                "permission", self.permission, AclPermission))

    @classmethod
    def of(cls, binding: AclBinding) -> AclFilter:
        """The filter that selects exactly this binding."""
        return cls(principal=binding.principal, resource_type=binding.resource_type,
                   resource_name=binding.resource_name, pattern_type=binding.pattern_type,
                   operation=binding.operation, permission=binding.permission,
                   host=binding.host)


@dataclass(frozen=True, slots=True)
class ThrottleTime:
    """The throttle times the stores answered a client with, since it was
    made (Kafka's client metrics produce-throttle-time-avg/max and
    fetch-throttle-time-avg/max): a store asks a client over its byte-rate
    quota to wait (docs/partition-store.md, "Client quotas"), and the client
    sends that store nothing of the kind until then. `count` counts the
    answers with a throttle time > 0; `avg_ms` is over those."""

    count: int = 0
    total_ms: int = 0
    max_ms: int = 0

    @property
    def avg_ms(self) -> float:
        return self.total_ms / self.count if self.count else 0.0
