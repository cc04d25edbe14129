"""The values a store node's calls take and answer (StoreRuntime's API:
the servicer and the Kafka handlers map their wire messages to these), and
the ControllerLink port through which a store reaches the catalog owner.
Plain values only: no behaviour lives here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..common.kernel.errors import ServiceError
from .core.producer_state import ProducerEntry
from .core.replicas import PartitionState
from .core.topics import TopicRecord
from .core.txn_index import AbortedTxn


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str] = field(default_factory=dict)
    # 0: the cluster's default (core/replicas.py); 1 without a metadata store.
    replication_factor: int = 0


@dataclass(frozen=True, slots=True)
class NewPartitions:
    """A CreatePartitions entry: topic `name` is to have `count` partitions
    in all (Kafka's NewPartitions.increaseTo)."""

    name: str
    count: int


@dataclass(frozen=True, slots=True)
class TopicOutcome:
    name: str
    error: ServiceError | None = None
    topic_id: int = 0


@dataclass(frozen=True, slots=True)
class TopicLookup:
    name: str
    record: TopicRecord | None = None
    error: ServiceError | None = None


@dataclass(frozen=True, slots=True)
class ProduceItem:
    topic: str
    partition: int
    batch: bytes
    expected_log_end_offset: int | None = None
    # The leader epoch the sender knows (None: not checked).
    leader_epoch: int | None = None


@dataclass(frozen=True, slots=True)
class ProduceOutcome:
    topic: str
    partition: int
    error: ServiceError | None = None
    base_offset: int = -1
    duplicate: bool = False
    log_start_offset: int = -1
    log_append_time_ms: int = -1


@dataclass(frozen=True, slots=True)
class FetchItem:
    topic: str
    partition: int
    fetch_offset: int
    max_bytes: int = 0
    # The leader epoch the sender knows (None: not checked).
    current_leader_epoch: int | None = None


@dataclass(frozen=True, slots=True)
class FetchOutcome:
    topic: str
    partition: int
    error: ServiceError | None = None
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    batches: tuple[bytes, ...] = ()
    next_fetch_offset: int = -1
    # Records and bytes in `batches` (for metrics).
    record_count: int = 0
    size_bytes: int = 0
    # With client_filters under read_committed: the aborted transactions
    # with a batch in the returned range.
    aborted: tuple[AbortedTxn, ...] = ()


@dataclass(frozen=True, slots=True)
class OffsetQuery:
    topic: str
    partition: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class OffsetOutcome:
    topic: str
    partition: int
    error: ServiceError | None = None
    offset: int = -1
    timestamp_ms: int = -1


@dataclass(frozen=True, slots=True)
class MarkerItem:
    """One marker of a WriteTxnMarkers request (control_type: records.MARKER_*)."""

    producer_id: int
    producer_epoch: int
    control_type: int
    coordinator_epoch: int
    partitions: tuple[tuple[str, int], ...]
    transactional_id: str = ""
    # The producer's transaction version (0 or 2: version 2) and, for version
    # 1, the decision's timestamp (TxnMarker in partition_store.proto).
    transaction_version: int = 2
    timestamp_ms: int = 0


@dataclass(frozen=True, slots=True)
class MarkerOutcome:
    producer_id: int
    topic: str
    partition: int
    error: ServiceError | None = None
    offset: int = -1


@dataclass(frozen=True, slots=True)
class ReplicaFetchItem:
    topic: str
    partition: int
    fetch_offset: int
    current_leader_epoch: int
    max_bytes: int = 0


@dataclass(frozen=True, slots=True)
class ReplicaFetchOutcome:
    topic: str
    partition: int
    error: ServiceError | None = None
    high_watermark: int = -1
    log_start_offset: int = -1
    log_end_offset: int = -1
    batches: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class EpochEndOutcome:
    topic: str
    partition: int
    error: ServiceError | None = None
    leader_epoch: int = -1
    end_offset: int = -1


@dataclass(frozen=True, slots=True)
class ProducersOutcome:
    topic: str
    partition: int
    error: ServiceError | None = None
    producers: tuple[ProducerEntry, ...] = ()


class ControllerLink(Protocol):
    """How a non-controller node reaches the catalog owner."""

    async def list_topics(self) -> list[TopicRecord]: ...

    async def create_topics(
        self, specs: Sequence[TopicSpec], *, validate_only: bool
    ) -> list[TopicOutcome]: ...

    async def delete_topics(self, names: Sequence[str]) -> list[TopicOutcome]: ...

    async def create_partitions(
        self, specs: Sequence[NewPartitions], *, validate_only: bool
    ) -> list[TopicOutcome]: ...

    async def notify_catalog_changed(self, node_id: int) -> None:
        """Tells another store node to refresh its catalog now (best effort)."""

    def partition_states(self) -> Mapping[tuple[str, int], PartitionState] | None:
        """Every partition's replication state as of the last list_topics
        (a replicated cluster), or None (single copies on layout.store_for)."""

    async def close(self) -> None: ...
