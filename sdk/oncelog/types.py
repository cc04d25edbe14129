"""The SDK's value types: what callers pass in and get back.

Immutable, so safe to share between threads: frozen, slotted dataclasses,
except ConsumerRecord, which the consumer makes once per record and is
therefore a named tuple (as in kafka-python): a frozen dataclass costs three
times as much to create.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

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
    the coordinator's state name (Empty, Ongoing, PrepareCommit, PrepareAbort,
    CompleteCommit, CompleteAbort, PrepareEpochFence, Dead)."""

    transactional_id: str
    producer_id: int
    state: str


@dataclass(frozen=True, slots=True)
class TransactionDescription:
    """The answer of Admin.describe_transaction (and abort_transaction).

    `transaction_start_time_ms` is when the open transaction added its first
    partition (-1: none open); `partitions` are the partitions it has added
    (the group's __consumer_offsets partition included)."""

    transactional_id: str
    state: str
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
    coordinator's name: Empty, Assigning, Reconciling, Stable, Dead."""

    group_id: str
    state: str


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
    state: str
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
