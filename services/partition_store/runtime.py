"""The partition manager of one store node.

* Start: load the topic catalog, recover every local partition (newest good
  snapshot + replay), create the internal topics (controller only), start the
  group-commit writer and the housekeeping task.
* Produce: resolve partitions, then check and append every batch
  synchronously on the event loop (per-partition order is the call order),
  queue the writes, and answer once the group commit is durable. A batch that
  would open a transaction on a partition first waits for the transaction
  coordinator's verification (TxnVerifier; one question per request for all
  such partitions); meanwhile that producer's later batches on the partition
  wait behind its gate (partition.py), other producers and partitions go on.
* WriteTxnMarkers: check each marker per partition (core/producer_state.py),
  append its control batch through the same group commit, answer when durable.
* Fetch: read whole batches below the HW (LSO under read_committed, with
  aborted transactions and markers filtered out); long-poll on the
  partitions' HW (LSO) waiters up to max_wait_ms.
* Catalog: node `layout.controller_node_id` owns it. Other nodes forward
  CreateTopics/DeleteTopics/CreatePartitions there, learn topics by asking it
  (ListTopics) on a miss and periodically, keep a copy on disk, open the new
  partitions of grown topics, and delete the data of topics that
  disappeared. Placement is `layout.store_for(topic, partition)`.
* Housekeeping: snapshots every N batches / T ms, retention, compaction of
  compacted topics (cleaner.py), producer-id expiry, catalog refresh, the
  open-transaction age gauges, and hanging transactions: one held open past
  its timeout plus a margin is asked about (TxnResolver) and ended by its
  coordinator, or by this store when no coordinator knows it
  (core/hanging_txns.py).
* Shutdown: refuse new writes, snapshot every partition, drain the writer.

Nothing here speaks gRPC: the servicer maps protos to these calls, and the
controller is reached through the ControllerLink port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from oncelog.wire.errors import ErrorCode
from oncelog.wire.records import BatchFormatError, read_header

from ..common import limits
from ..common.cluster import ClusterLayout
from ..common.crashpoints import crash_point
from ..common.errors import InvariantViolation, ServiceError, invariant
from . import metrics
from .cleaner import CompactionReport, compact_partition
from .core import hanging_txns
from .core.codec import (
    CorruptValueError,
    decode_offset,
    encode_offset,
    encode_partition_meta,
)
from .core.outcomes import Rejection
from .core.producer_state import (
    DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    Duplicate,
    DuplicateMarker,
    ProducerEntry,
    TxnMarker,
)
from .core.replicas import (
    DEFAULT_REPLICA_LAG_TIME_MAX_MS,
    PartitionState,
    check_leader_epoch,
    initial_state,
)
from .core.topics import (
    INTERNAL_TOPIC_CONFIG,
    TopicRecord,
    decode_topic_record,
    encode_topic_record,
    grow_topic,
    validate_new_topic,
    validate_topic_name,
)
from .core.txn_index import AbortedTxn
from .format_upgrade import upgrade_log_format
from .partition import (
    Appended,
    Isolation,
    PartitionRuntime,
    ReplicaNews,
    VerifyFirst,
    WaitForGate,
)
from .replica_sessions import FetchSession, FetchSessions, PartitionKey, SessionEntry
from .storage import keys
from .storage.port import CorruptionError, KeyValueStore, StorageError, WriteGroup
from .txn_resolver import HangingQuestion, TxnResolver
from .txn_verifier import TopicPartitionKey, TxnVerifier, VerifyAnswer
from .writer import GroupCommitWriter

log = logging.getLogger("oncelog.partition_store")

DEFAULT_PRODUCE_TIMEOUT_MS = 30_000
# Per-partition fetch limit when the request leaves it at 0 (Kafka's
# max.partition.fetch.bytes default).
DEFAULT_PARTITION_FETCH_MAX_BYTES = 1024 * 1024
# A non-controller node asks the controller for the whole catalog at most this
# often when answering "every topic" (Metadata/ListTopics with no names).
CATALOG_CACHE_MS = 1_000
DEFAULT_COMPACTION_INTERVAL_MS = 15_000
DEFAULT_COMPACTION_MAX_KEYS_PER_PASS = 200_000
DEFAULT_COMPACTION_CHUNK_BYTES = 4 * 1024 * 1024
# How long DeleteTopics waits for other store nodes to drop the topic.
PEER_NOTIFY_WAIT_MS = 2_000
# Kafka's transaction.max.timeout.ms default, and the coordinators'
# --max-transaction-timeout-ms: the bound on a transaction whose timeout this
# store did not learn (core/hanging_txns.py).
DEFAULT_MAX_TRANSACTION_TIMEOUT_MS = 900_000
# How long past its timeout a transaction may hold a partition open before
# the store asks its coordinators: covers the coordinator's timer period, its
# markers' way and the clocks' disagreement (a question is harmless, so the
# margin only saves questions).
DEFAULT_HANGING_TXN_MARGIN_MS = 60_000


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreConfig:
    node_id: int
    layout: ClusterLayout
    fsync: bool = False
    snapshot_interval_batches: int = 1000
    snapshot_interval_ms: int = 60_000
    retention_check_interval_ms: int = 300_000
    producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS
    catalog_refresh_interval_ms: int = 10_000
    retention_max_batches_per_run: int = 10_000
    # How often compacted partitions are checked (Kafka's log.cleaner.backoff.ms).
    compaction_interval_ms: int = DEFAULT_COMPACTION_INTERVAL_MS
    # Keys one compaction pass may hold in its offset map (memory bound; a
    # pass that fills it stops there and the next one goes on).
    compaction_max_keys_per_pass: int = DEFAULT_COMPACTION_MAX_KEYS_PER_PASS
    # Rewritten bytes per RocksDB write of a compaction pass (memory bound).
    compaction_chunk_bytes: int = DEFAULT_COMPACTION_CHUNK_BYTES
    # TEST ONLY: accept a producer's first transactional write to a partition
    # without asking the transaction coordinator. Lets tests make hanging
    # transactions on purpose; never set it in production.
    unsafe_skip_txn_verification: bool = False
    # Partitions are replicated, their metadata in the metadata store (etcd;
    # docs/replication.md); no store keeps the catalog locally. Off: every
    # partition is one copy on `layout.store_for`, node 0 keeps the catalog.
    replicated: bool = False
    # A follower that has not reached the leader's log end for this long
    # leaves the ISR (Kafka's replica.lag.time.max.ms).
    replica_lag_time_max_ms: int = DEFAULT_REPLICA_LAG_TIME_MAX_MS
    # Hanging transactions (core/hanging_txns.py): whether this store ends
    # them; the bound on a transaction whose timeout it did not learn (at
    # least the coordinators' --max-transaction-timeout-ms); how long past
    # its timeout a transaction may hold a partition open before it asks.
    resolve_hanging_txns: bool = True
    max_transaction_timeout_ms: int = DEFAULT_MAX_TRANSACTION_TIMEOUT_MS
    hanging_txn_margin_ms: int = DEFAULT_HANGING_TXN_MARGIN_MS

    def __post_init__(self) -> None:
        if not 0 <= self.node_id < len(self.layout.stores):
            raise ValueError(
                f"node id {self.node_id} is not in the layout's {len(self.layout.stores)} stores"
            )
        for name in (
            "snapshot_interval_batches", "snapshot_interval_ms", "retention_check_interval_ms",
            "producer_id_expiration_ms", "catalog_refresh_interval_ms",
            "retention_max_batches_per_run", "compaction_interval_ms",
            "compaction_max_keys_per_pass", "compaction_chunk_bytes", "replica_lag_time_max_ms",
            "max_transaction_timeout_ms",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.hanging_txn_margin_ms < 0:
            raise ValueError(
                f"hanging_txn_margin_ms must be >= 0, got {self.hanging_txn_margin_ms}")

    @property
    def is_controller(self) -> bool:
        """Whether this node keeps the topic catalog itself (single-copy
        clusters only: a replicated cluster keeps it in the metadata store)."""
        return not self.replicated and self.node_id == self.layout.controller_node_id


# ---------------------------------------------------------------- requests


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


# ------------------------------------------------------------------ runtime


class StoreRuntime:
    def __init__(
        self,
        store: KeyValueStore,
        config: StoreConfig,
        *,
        controller: ControllerLink | None = None,
        txn_verifier: TxnVerifier | None = None,
        txn_resolver: TxnResolver | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        if not config.is_controller and controller is None:
            raise ValueError("a non-controller store node needs a ControllerLink")
        # None: transactional writes that need verification fail with
        # COORDINATOR_NOT_AVAILABLE (unless the test-only skip flag is set).
        self._txn_verifier = txn_verifier
        # None: hanging transactions stay until an operator aborts them.
        self._txn_resolver = txn_resolver
        self._hanging_policy = hanging_txns.HangingPolicy(
            max_transaction_timeout_ms=config.max_transaction_timeout_ms,
            margin_ms=config.hanging_txn_margin_ms)
        # Per overdue transaction (topic, partition, producer id, first
        # offset): when to ask about it next, and whether it was counted.
        self._hanging_next_ms: dict[tuple[str, int, int, int], int] = {}
        self._hanging_in_flight: set[tuple[str, int, int, int]] = set()
        self._hanging_counted: set[tuple[str, int, int, int]] = set()
        self.config = config
        self.layout = config.layout
        self._store = store
        self._controller = controller
        self._clock_ms = clock_ms
        self._writer = GroupCommitWriter(store, fsync=config.fsync)
        self._catalog: dict[str, TopicRecord] = {}
        self._partitions: dict[tuple[str, int], PartitionRuntime] = {}
        # Replicated clusters: every partition's state from the metadata
        # store (None: single copies, see partition_state).
        self._states: Mapping[tuple[str, int], PartitionState] | None = (
            {} if config.replicated else None)
        # Called after each catalog/state refresh (the replica manager
        # starts and stops followers there).
        self.on_states_applied: Callable[[], None] | None = None
        # Partitions taken out of service while their stored log is rewritten
        # (truncate_replica, reset_replica): not reopened from disk meanwhile.
        self._rewriting: set[tuple[str, int]] = set()
        # Called with damage found in stored data (the server records it and
        # stops the process: damage.py); None: only answered as an error.
        self.on_damage: Callable[[CorruptionError], None] | None = None
        # Called when a follower outside the ISR has caught up (the replica
        # manager adds it back through the metadata store).
        self.on_isr_expand: Callable[[PartitionRuntime, int], None] | None = None
        # As leader: each follower store's fetch session (replica_sessions.py).
        self._sessions = FetchSessions()
        # Led partitions where an in-sync follower may lack part of the log:
        # the only ones the ISR's lag check looks at (an idle partition whose
        # followers have everything is never looked at).
        self._followers_behind: dict[PartitionKey, None] = {}
        # Every store's address by node id: the layout's, or (replicated)
        # also those that joined later (the metadata link's).
        self.store_addresses: Callable[[], Mapping[int, str]] = (
            lambda: dict(enumerate(config.layout.stores)))
        # The same for the stores' token listeners (--token-listen); a store
        # missing here has none.
        self.token_store_addresses: Callable[[], Mapping[int, str]] = (
            lambda: dict(enumerate(config.layout.token_stores)))
        # The same for the stores' Kafka listeners (--kafka-listen).
        self.kafka_store_addresses: Callable[[], Mapping[int, str]] = (
            lambda: dict(enumerate(config.layout.kafka_stores)))
        # Replicated clusters: starts replica moves (the metadata link's).
        self.reassigner: Callable[
            [Mapping[tuple[str, int], Sequence[int]]],
            Awaitable[dict[tuple[str, int], ServiceError | None]]] | None = None
        self._next_topic_id = 1
        self._refresh: asyncio.Future[None] | None = None
        self._last_refresh_ms: int | None = None
        self._housekeeping: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = False
        self._closed_event = asyncio.Event()
        self._background: set[asyncio.Task[None]] = set()
        self._last_retention_ms = 0
        self._last_compaction_ms = 0
        # Retention and compaction both rewrite stored batches: one at a time.
        self._log_rewrite_lock = asyncio.Lock()
        self.recovery_replayed_batches = 0
        self.started = False

    # ------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Loads the catalog and recovers every local partition, then starts
        the writer and the housekeeping task. A database written in the
        first record format is rewritten first (format_upgrade.py)."""
        upgrade_log_format(self._store)
        now_ms = self._clock_ms()
        started_s = time.perf_counter()
        for key, value in self._store.scan(keys.CATALOG_START, keys.CATALOG_END):
            try:
                record = decode_topic_record(value)
            except CorruptValueError as exc:
                # Not guessing: a topic we cannot read stays unavailable here
                # until the controller's catalog (or an operator) replaces it.
                log.error("catalog entry %r unreadable: %s", keys.catalog_key_name(key), exc)
                continue
            self._catalog[record.name] = record
            self._next_topic_id = max(self._next_topic_id, record.topic_id + 1)
        counter = self._store.get(keys.TOPIC_ID_COUNTER)
        if counter is not None:
            self._next_topic_id = max(
                self._next_topic_id, decode_offset(counter, what="topic id counter")
            )
        for record in self._catalog.values():
            self._open_local_partitions(record, now_ms)
        self.recovery_replayed_batches = sum(
            p.recovery_replayed_batches for p in self._partitions.values()
        )
        metrics.RECOVERY_REPLAYED_BATCHES.set(self.recovery_replayed_batches)
        metrics.RECOVERY_DURATION_SECONDS.set(time.perf_counter() - started_s)
        self._writer.start()
        self._last_retention_ms = now_ms
        self._last_compaction_ms = now_ms
        if self.config.is_controller:
            await self._create_internal_topics()
        else:
            self._spawn(self._refresh_quietly())
        self._housekeeping = asyncio.get_running_loop().create_task(
            self._run_housekeeping(), name="store-housekeeping"
        )
        self.started = True
        log.info(
            "store node %d recovered %d partitions of %d topics, replayed %d batches",
            self.config.node_id, len(self._partitions), len(self._catalog),
            self.recovery_replayed_batches,
        )

    def begin_shutdown(self) -> None:
        """The first step of a graceful shutdown: refuse new writes and wake
        long-polls (they answer with what they have), while the writes already
        accepted still become durable and get their answers."""
        if self._closing:
            return
        self._closing = True
        self._closed_event.set()
        for part in self._partitions.values():
            part.wake_waiters()
        self._sessions.close_all()

    async def close(self, *, take_snapshots: bool = True) -> None:
        """Graceful shutdown: begin_shutdown, then snapshot every partition,
        drain the writer, close storage. Without take_snapshots the next
        start recovers as after a crash (tests)."""
        if self._closed:
            return
        self._closed = True
        self.begin_shutdown()
        if self._housekeeping is not None:
            self._housekeeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._housekeeping
        for task in list(self._background):
            task.cancel()
        if self.started and self._writer.failure is None:
            now_ms = self._clock_ms()
            for part in self._partitions.values() if take_snapshots else ():
                group = part.build_snapshot(now_ms=now_ms)
                if group is not None:
                    self._writer.submit(group)
            await self._writer.close()
        if self._controller is not None:
            await self._controller.close()
        if self._txn_verifier is not None:
            await self._txn_verifier.close()
        if self._txn_resolver is not None:
            await self._txn_resolver.close()
        self._store.close()

    def partition(self, topic: str, partition: int) -> PartitionRuntime:
        """The local runtime of a partition (tests and admin tools)."""
        return self._resolve(topic, partition)

    @property
    def partitions(self) -> list[PartitionRuntime]:
        return list(self._partitions.values())

    @property
    def group_commits(self) -> int:
        """Group commits written since start (each one RocksDB write)."""
        return self._writer.group_commits

    def _check_accepting(self) -> None:
        if self._closing:
            raise ServiceError(
                ErrorCode.SHUTTING_DOWN,
                f"store node {self.config.node_id} is shutting down; retry later",
            )
        if self._writer.failure is not None:
            metrics.STORAGE_REFUSED_APPENDS.labels(
                "disk_full" if self._writer.disk_full else "storage_failed").inc()
        self._writer.check_healthy()

    def report_damage(self, error: CorruptionError) -> ServiceError:
        """Stored bytes failed a checksum: counted, logged, handed to
        `on_damage` (the server stops the process: damage.py), and answered
        as STORAGE_ERROR; the bytes themselves are never served."""
        metrics.CORRUPT_READS.inc()
        log.critical("store node %d: stored data is damaged: %s (file %s)", self.config.node_id,
                     error, error.path or "unknown")
        if self.on_damage is not None:
            self.on_damage(error)
        return ServiceError(
            ErrorCode.STORAGE_ERROR,
            f"store node {self.config.node_id}: stored data is damaged ({error}); it is not "
            f"served: retry (another replica, or this one rebuilt)")

    @property
    def storage_writable(self) -> bool:
        """False while writes are refused (a full disk, a failed write): a
        follower must not fetch then, since its next fetch would tell the
        leader it holds what it could not write."""
        return self._writer.failure is None

    async def _resume_after_disk_full(self) -> bool:
        """Once space is freed after a write found the disk full: reopens
        the database, rebuilds every partition's memory from what is on disk
        (the appends that failed were replayed into memory first: producer
        state, log end) and takes writes again. Returns whether it did."""
        if not self._writer.disk_full or not self._store.room_to_reopen():
            return False
        # No scan may be open while the database is replaced: retention and
        # compaction, which read across awaits, hold this lock.
        async with self._log_rewrite_lock:
            try:
                self._store.reopen()
            except StorageError as exc:
                log.warning("store node %d: reopening storage after a full disk failed, "
                            "trying again: %s", self.config.node_id, exc)
                return False
            self._writer.resume()
            now_ms = self._clock_ms()
            refused = ServiceError(ErrorCode.STORAGE_ERROR,
                                   "the write failed for lack of space; retry")
            for (name, p), part in list(self._partitions.items()):
                del self._partitions[(name, p)]
                part.close()
                part.fail_acks(refused)
                record = self._catalog.get(name)
                if record is not None:
                    self._open_partition(record, p, now_ms)
        log.warning("store node %d: space was freed; storage reopened, %d partitions rebuilt "
                    "from disk, writes resume", self.config.node_id, len(self._partitions))
        if self.on_states_applied is not None:
            self.on_states_applied()
        return True

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _link(self) -> ControllerLink:
        controller = self._controller
        invariant(controller is not None, "a non-controller node without a ControllerLink")
        return controller  # type: ignore[return-value]  # checked just above

    # --------------------------------------------------------------- catalog

    def _open_local_partitions(self, record: TopicRecord, now_ms: int) -> None:
        for p in range(record.partitions):
            if self.config.node_id in self.partition_state(record.name, p).replicas:
                self._open_partition(record, p, now_ms)

    def _open_partition(self, record: TopicRecord, p: int, now_ms: int) -> PartitionRuntime:
        part = PartitionRuntime.recover(
            record, p, self._store, now_ms=now_ms,
            producer_id_expiration_ms=self.config.producer_id_expiration_ms,
            replicated=self.config.replicated,
        )
        self._partitions[(record.name, p)] = part
        if self.config.replicated:
            part.on_replica_news = self._on_replica_news
        self._set_state(part, self.partition_state(record.name, p), record, now_ms)
        return part

    def _on_replica_news(self, part: PartitionRuntime, news: ReplicaNews,
                         durable_before: int) -> None:
        """A local partition appended, moved its HW or changed state: wake
        the fetch sessions that copy it, and keep the set of led partitions
        the ISR check has to look at."""
        key = (part.topic.name, part.partition)
        leads = not part.closed and part.is_leader
        if news is ReplicaNews.APPENDED and leads:
            part.note_appended(durable_before, self._clock_ms())
        if leads and news is not ReplicaNews.HIGH_WATERMARK and len(part.state.isr) > 1:
            self._followers_behind[key] = None
        self._sessions.notify(key, urgent=news is not ReplicaNews.HIGH_WATERMARK)

    def take_followers_behind(self) -> list[PartitionRuntime]:
        """The led partitions where an in-sync follower may be behind
        (the ISR check's work); a partition whose followers have caught up
        leaves the set until its next append or change of leadership."""
        found = []
        for key in list(self._followers_behind):
            part = self._partitions.get(key)
            if part is None or part.closed or not part.is_leader or not part.followers_behind():
                del self._followers_behind[key]
                continue
            found.append(part)
        return found

    def _set_state(self, part: PartitionRuntime, state: PartitionState, record: TopicRecord,
                   now_ms: int) -> None:
        group = part.set_state(state, node_id=self.config.node_id,
                               min_insync_replicas=record.config.min_insync_replicas,
                               now_ms=now_ms)
        if group is not None and group.ops:
            self._writer.submit(group)
        if self.config.replicated:
            self._recheck_rejoin(part)

    def _recheck_rejoin(self, part: PartitionRuntime) -> None:
        """As leader, on a new state (or a metadata change that may have
        left this state and come back, _apply_states): a follower outside
        the ISR whose fetch session holds the partition is checked for
        rejoining at its next request. It may have caught up while this replica still counted
        it in sync (a restarted store leaves the ISRs in the metadata store
        before its leaders learn it), and, idle, it lists the partition no
        more. Only a request proves the follower is still there: a dead
        store's session must never bring it back."""
        if self.on_isr_expand is None or part.closed or not part.is_leader:
            return
        key = (part.topic.name, part.partition)
        for replica in part.state.replicas:
            if replica not in part.state.isr:
                self._sessions.check_rejoin(replica, key)

    def _drop_replica(self, part: PartitionRuntime) -> None:
        """This store no longer holds the partition (its replicas moved):
        forgets it and deletes its data."""
        del self._partitions[(part.topic.name, part.partition)]
        part.close()
        part.fail_acks(ServiceError(
            ErrorCode.NOT_LEADER_OR_FOLLOWER,
            f"{part.topic_partition} moved away from store node {self.config.node_id}"))
        tid, p = part.topic.topic_id, part.partition
        group = WriteGroup()
        for kind in keys.PARTITION_KINDS:
            prefix = keys.partition_prefix(kind, tid, p)
            group.delete_range(prefix, keys.next_prefix(prefix))
        self._writer.submit(group)
        log.info("%s: no longer a replica here (moved); its data is deleted",
                 part.topic_partition)

    async def alter_reassignments(
        self, moves: Mapping[tuple[str, int], Sequence[int]],
    ) -> dict[tuple[str, int], ServiceError | None]:
        if self.reassigner is None:
            error = ServiceError(
                ErrorCode.INVALID_REQUEST,
                "moving replicas needs a replicated cluster (stores started with "
                "--etcd-endpoints); this one keeps one copy of each partition where the "
                "layout puts it")
            return {key: error for key in moves}
        outcomes = await self.reassigner(moves)
        await self.refresh_catalog()
        return outcomes

    def apply_learned_states(self) -> None:
        """Applies the partition states the link holds now, without reading
        the catalog (states learned from other stores while the metadata
        store is out of reach: replication.py)."""
        states = self._link().partition_states()
        if states is not None:
            self._states = states
        self._apply_states(self._clock_ms())
        if self.on_states_applied is not None:
            self.on_states_applied()

    def partition_states(self) -> dict[tuple[str, int], PartitionState]:
        """Every partition state this store holds (a copy; empty without a
        metadata store)."""
        return dict(self._states or {})

    def partition_state(self, topic: str, partition: int) -> PartitionState:
        """Replicas, leader, leader epoch and ISR of a partition: from the
        metadata store, or the single copy on layout.store_for. A partition
        the metadata store does not list (yet) has no replica here."""
        if self._states is None:
            return initial_state((self.layout.store_for(topic, partition),))
        state = self._states.get((topic, partition))
        return state if state is not None else PartitionState((-1,), -1, 0, (-1,))

    def _apply_states(self, now_ms: int) -> None:
        """Hands each local partition its current state (leader changes,
        ISR changes); opens partitions newly placed here."""
        if self._states is None:
            return
        for (name, p), state in self._states.items():
            record = self._catalog.get(name)
            if record is None or p >= record.partitions:
                continue
            part = self._partitions.get((name, p))
            if part is None:
                if self.config.node_id in state.replicas and (name, p) not in self._rewriting:
                    self._open_partition(record, p, now_ms)
                continue
            if self.config.node_id not in state.replicas:
                self._drop_replica(part)
                continue
            if part.state != state:
                self._set_state(part, state, record, now_ms)
            elif self.config.replicated:
                # The metadata moved, not this partition's state as last
                # applied, yet it may have left it and come back between
                # two reads: an ISR grown by this leader and shrunk again by
                # another writer (a restarted follower fencing itself), or a
                # rejoin refused while the follower's lease had ended. The
                # follower, caught up and idle, lists the partition no more
                # and would never ask again: check it at its next request.
                self._recheck_rejoin(part)

    def _drop_topic(self, record: TopicRecord, group: WriteGroup) -> None:
        """Forgets a topic here and queues the deletion of its data."""
        self._catalog.pop(record.name, None)
        for p in range(record.partitions):
            part = self._partitions.pop((record.name, p), None)
            if part is not None:
                part.close()
        group.delete(keys.catalog_key(record.name))
        for start, end in keys.topic_ranges(record.topic_id):
            group.delete_range(start, end)

    async def _create_internal_topics(self) -> None:
        now_ms = self._clock_ms()
        group = WriteGroup()
        for name, partitions in self.layout.internal_topics().items():
            existing = self._catalog.get(name)
            if existing is not None:
                if existing.partitions != partitions:
                    log.warning(
                        "internal topic %s has %d partitions; the layout asks for %d "
                        "(keeping %d: changing it would move keys between partitions)",
                        name, existing.partitions, partitions, existing.partitions,
                    )
                continue
            record = self._new_topic_record(name, partitions, dict(INTERNAL_TOPIC_CONFIG), True)
            self._add_topic(record, group, now_ms)
            log.info("created internal topic %s (%d partitions)", name, partitions)
        if group.ops:
            await self._writer.submit(group)

    def _new_topic_record(
        self, name: str, partitions: int, overrides: dict[str, str], internal: bool
    ) -> TopicRecord:
        record = TopicRecord.build(
            name=name, topic_id=self._next_topic_id, partitions=partitions,
            overrides=overrides, internal=internal,
        )
        self._next_topic_id += 1
        return record

    def _add_topic(self, record: TopicRecord, group: WriteGroup, now_ms: int) -> None:
        invariant(record.name not in self._catalog, lambda: f"topic {record.name} added twice")
        self._catalog[record.name] = record
        group.put(keys.catalog_key(record.name), encode_topic_record(record))
        if self.config.is_controller:
            group.put(keys.TOPIC_ID_COUNTER, encode_offset(self._next_topic_id))
        self._open_local_partitions(record, now_ms)

    async def create_topics(
        self, specs: Sequence[TopicSpec], *, validate_only: bool
    ) -> list[TopicOutcome]:
        if not self.config.is_controller:
            return await self._forward_create(specs, validate_only=validate_only)
        self._check_accepting()
        counts: dict[str, int] = {}
        for spec in specs:
            counts[spec.name] = counts.get(spec.name, 0) + 1
        now_ms = self._clock_ms()
        group = WriteGroup()
        outcomes = []
        for spec in specs:
            if counts[spec.name] > 1:
                outcomes.append(TopicOutcome(spec.name, ServiceError(
                    ErrorCode.INVALID_REQUEST,
                    f"topic {spec.name!r} appears {counts[spec.name]} times in one request",
                )))
                continue
            checked = validate_new_topic(spec.name, spec.partitions, spec.config)
            if isinstance(checked, Rejection):
                outcomes.append(
                    TopicOutcome(spec.name, ServiceError(checked.code, checked.message))
                )
                continue
            if spec.replication_factor > 1:
                outcomes.append(TopicOutcome(spec.name, ServiceError(
                    ErrorCode.INVALID_REPLICATION_FACTOR,
                    f"topic {spec.name!r}: replication factor {spec.replication_factor} needs "
                    "a replicated cluster (partition stores started with --etcd-endpoints; "
                    "on one machine `oncelog cluster up --replicated` or "
                    "LocalCluster(etcd_members=1)); this one keeps one copy of each partition",
                )))
                continue
            existing = self._catalog.get(spec.name)
            if existing is not None:
                outcomes.append(TopicOutcome(spec.name, ServiceError(
                    ErrorCode.TOPIC_ALREADY_EXISTS,
                    f"topic {spec.name!r} already exists (topic id {existing.topic_id}, "
                    f"{existing.partitions} partitions)",
                ), existing.topic_id))
                continue
            if validate_only:
                outcomes.append(TopicOutcome(spec.name))
                continue
            # Applied to memory now, like an append: a concurrent request for
            # the same name sees it; the reply waits for durability below.
            record = self._new_topic_record(spec.name, spec.partitions, dict(spec.config), False)
            self._add_topic(record, group, now_ms)
            outcomes.append(TopicOutcome(spec.name, None, record.topic_id))
            log.info(
                "created topic %s (id %d, %d partitions, config %s)",
                record.name, record.topic_id, record.partitions, dict(record.config_overrides),
            )
        if group.ops:
            await self._writer.submit(group)
        return outcomes

    async def delete_topics(self, names: Sequence[str]) -> list[TopicOutcome]:
        if not self.config.is_controller:
            return await self._forward_delete(names)
        self._check_accepting()
        counts: dict[str, int] = {}
        for name in names:
            counts[name] = counts.get(name, 0) + 1
        group = WriteGroup()
        outcomes = []
        for name in names:
            record = self._catalog.get(name)
            if counts[name] > 1:
                error = ServiceError(
                    ErrorCode.INVALID_REQUEST,
                    f"topic {name!r} appears {counts[name]} times in one request",
                )
            elif record is None:
                error = ServiceError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
                )
            elif record.internal:
                error = ServiceError(
                    ErrorCode.INVALID_TOPIC_EXCEPTION,
                    f"topic {name!r} is internal and cannot be deleted",
                )
            else:
                self._drop_topic(record, group)
                outcomes.append(TopicOutcome(name, None, record.topic_id))
                log.info("deleted topic %s (id %d)", name, record.topic_id)
                continue
            outcomes.append(TopicOutcome(name, error))
        if group.ops:
            await self._writer.submit(group)
            await self._notify_peers()
        return outcomes

    async def create_partitions(
        self, specs: Sequence[NewPartitions], *, validate_only: bool
    ) -> list[TopicOutcome]:
        """Grows topics (Kafka's CreatePartitions), each on its own: a topic
        that is refused does not stop the others. The new partitions open
        on their stores at once and existing ones keep their records."""
        if not self.config.is_controller:
            return await self._forward_create_partitions(specs, validate_only=validate_only)
        self._check_accepting()
        counts: dict[str, int] = {}
        for spec in specs:
            counts[spec.name] = counts.get(spec.name, 0) + 1
        now_ms = self._clock_ms()
        group = WriteGroup()
        outcomes = []
        for spec in specs:
            record = self._catalog.get(spec.name)
            topic_id, before = (record.topic_id, record.partitions) if record else (0, 0)
            if counts[spec.name] > 1:
                outcomes.append(TopicOutcome(spec.name, ServiceError(
                    ErrorCode.INVALID_REQUEST,
                    f"topic {spec.name!r} appears {counts[spec.name]} times in one request",
                ), topic_id))
                continue
            after = grow_topic(spec.name, record, spec.count)
            if isinstance(after, Rejection):
                outcomes.append(TopicOutcome(
                    spec.name, ServiceError(after.code, after.message), topic_id))
                continue
            if not validate_only:
                # Applied to memory now, as create_topics does: a concurrent
                # request sees the new count; the reply waits for durability.
                self._update_topic(after, group, now_ms)
                log.info("topic %s (id %d) grew from %d to %d partitions", spec.name,
                         topic_id, before, after.partitions)
            outcomes.append(TopicOutcome(spec.name, None, topic_id))
        if group.ops:
            await self._writer.submit(group)
            # The new partitions live on other stores too: they open them
            # when they learn the count, before this answer when reachable.
            await self._notify_peers()
        return outcomes

    def _update_topic(self, record: TopicRecord, group: WriteGroup, now_ms: int) -> None:
        """Takes a newer catalog record of a known topic (the same topic id:
        more partitions, or another configuration): the open partitions get
        it, and new partitions placed here open (empty)."""
        self._catalog[record.name] = record
        group.put(keys.catalog_key(record.name), encode_topic_record(record))
        for p in range(record.partitions):
            part = self._partitions.get((record.name, p))
            if part is not None:
                part.topic = record
            elif (self.config.node_id in self.partition_state(record.name, p).replicas
                  and (record.name, p) not in self._rewriting):
                self._open_partition(record, p, now_ms)

    async def _forward_create_partitions(
        self, specs: Sequence[NewPartitions], *, validate_only: bool
    ) -> list[TopicOutcome]:
        try:
            outcomes = await self._link().create_partitions(specs, validate_only=validate_only)
        except ServiceError as exc:
            return [TopicOutcome(s.name, exc) for s in specs]
        if not validate_only:
            # So that this store's Metadata answers the new count at once.
            # Quietly: the topics grew, and a refresh that fails now must
            # not turn that answer into an error (the next one catches up).
            await self._refresh_quietly()
        return outcomes

    async def _notify_peers(self) -> None:
        """Tells the other store nodes to refresh their catalog, waiting up to
        PEER_NOTIFY_WAIT_MS so that reachable peers have dropped a deleted
        topic when DeleteTopics answers (opened a grown topic's new
        partitions when CreatePartitions answers); slow ones finish in the
        background (and every node also refreshes on a miss and periodically)."""
        if self._controller is None:
            return
        tasks = []
        for node_id in range(len(self.layout.stores)):
            if node_id != self.config.node_id:
                task = asyncio.get_running_loop().create_task(
                    self._controller.notify_catalog_changed(node_id)
                )
                self._background.add(task)
                task.add_done_callback(self._background.discard)
                tasks.append(task)
        if tasks:
            await asyncio.wait(tasks, timeout=PEER_NOTIFY_WAIT_MS / 1000)

    async def _forward_create(
        self, specs: Sequence[TopicSpec], *, validate_only: bool
    ) -> list[TopicOutcome]:
        try:
            outcomes = await self._link().create_topics(specs, validate_only=validate_only)
        except ServiceError as exc:
            return [TopicOutcome(s.name, exc) for s in specs]
        if not validate_only:
            await self.refresh_catalog()
        return outcomes

    async def _forward_delete(self, names: Sequence[str]) -> list[TopicOutcome]:
        try:
            outcomes = await self._link().delete_topics(names)
        except ServiceError as exc:
            return [TopicOutcome(n, exc) for n in names]
        await self.refresh_catalog()
        return outcomes

    async def refresh_catalog(self) -> None:
        """Non-controller nodes: replace the cached catalog by the
        controller's, deleting local data of topics that are gone or were
        re-created under a new id. One refresh at a time; concurrent callers
        share it. Raises ServiceError when the controller is unreachable."""
        if self.config.is_controller:
            return
        if self._refresh is not None:
            await asyncio.shield(self._refresh)
            return
        self._refresh = asyncio.get_running_loop().create_future()
        try:
            records = await self._link().list_topics()
            await self._apply_catalog(records)
            self._last_refresh_ms = self._clock_ms()
            self._refresh.set_result(None)
        except BaseException as exc:
            self._refresh.set_exception(exc)
            self._refresh.exception()  # retrieved: callers re-raise it themselves
            raise
        finally:
            self._refresh = None

    async def _refresh_quietly(self) -> None:
        try:
            await self.refresh_catalog()
        except ServiceError as exc:
            log.warning("catalog refresh from the controller failed: %s", exc.message)

    async def _apply_catalog(self, records: Iterable[TopicRecord]) -> None:
        if self._closing:
            return
        states = self._link().partition_states()
        if states is not None:
            self._states = states
        fresh = {r.name: r for r in records}
        now_ms = self._clock_ms()
        group = WriteGroup()
        for name, record in list(self._catalog.items()):
            if name not in fresh or fresh[name].topic_id != record.topic_id:
                log.info("topic %s (id %d) is gone; deleting its local data", name, record.topic_id)
                self._drop_topic(record, group)
        for name, record in fresh.items():
            current = self._catalog.get(name)
            if current is None:
                self._add_topic(record, group, now_ms)
            elif current != record:
                # Same topic id, new configuration or partition count
                # (CreatePartitions): the same steps as on the catalog's owner.
                self._update_topic(record, group, now_ms)
        self._apply_states(now_ms)
        if group.ops:
            await self._writer.submit(group)
        if self.on_states_applied is not None:
            self.on_states_applied()

    async def ensure_known(self, names: Iterable[str]) -> None:
        await self._ensure_known(names)

    @property
    def catalog_node_id(self) -> int:
        """The store that takes CreateTopics/DeleteTopics/CreatePartitions:
        node 0 with single copies; on a replicated cluster any store (this
        one) does."""
        return self.config.node_id if self.config.replicated else self.layout.controller_node_id

    def clock_ms(self) -> int:
        return self._clock_ms()

    async def _ensure_known(self, names: Iterable[str],
                            partitions: Iterable[tuple[str, int]] = ()) -> None:
        """On a non-controller node, asks the controller once when a topic is
        not in the cached catalog, or (`partitions`) has fewer partitions
        than a request names: the topic may have grown since (a node that
        missed the controller's nudge would otherwise refuse a new partition
        until its next periodic refresh). Returns without awaiting anything
        when all are known, so callers keep their synchronous ordering."""
        if self.config.is_controller:
            return
        catalog = self._catalog
        if all(name in catalog for name in names) and all(
                t not in catalog or p < catalog[t].partitions for t, p in partitions):
            return
        await self._refresh_quietly()

    async def _ensure_fresh_listing(self) -> None:
        # Replicated: the replica manager reads the metadata store every
        # 100 ms, and a listing must not wait on it (it may be unreachable).
        if self.config.is_controller or self.config.replicated:
            return
        now_ms = self._clock_ms()
        if self._last_refresh_ms is None or now_ms - self._last_refresh_ms >= CATALOG_CACHE_MS:
            await self._refresh_quietly()

    def topics(self, *, include_internal: bool) -> list[TopicRecord]:
        return [
            r for name, r in sorted(self._catalog.items()) if include_internal or not r.internal
        ]

    async def list_topics(self, *, include_internal: bool) -> list[TopicRecord]:
        await self._ensure_fresh_listing()
        return self.topics(include_internal=include_internal)

    async def metadata(self, names: Sequence[str], *, include_internal: bool) -> list[TopicLookup]:
        if not names:
            await self._ensure_fresh_listing()
            return [TopicLookup(r.name, r) for r in self.topics(include_internal=include_internal)]
        await self._ensure_known(names)
        lookups = []
        for name in names:
            record = self._catalog.get(name)
            if record is not None:
                lookups.append(TopicLookup(name, record))
                continue
            bad = validate_topic_name(name, allow_internal=True)
            error = (
                ServiceError(bad.code, bad.message) if bad is not None
                else ServiceError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist"
                )
            )
            lookups.append(TopicLookup(name, None, error))
        return lookups

    def _check_not_internal(self, topic: str) -> None:
        """Only the coordinators append to internal topics: they replay every
        record there, and one they cannot read (say, a user's record sent to
        __consumer_offsets by mistake) would stop them loading the partition."""
        record = self._catalog.get(topic)
        if record is not None and record.internal:
            raise ServiceError(
                ErrorCode.INVALID_TOPIC_EXCEPTION,
                f"topic {topic!r} is internal: only the coordinators write to it",
            )

    def _resolve(self, topic: str, partition: int) -> PartitionRuntime:
        record = self._catalog.get(topic)
        if record is None:
            raise ServiceError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic!r} does not exist"
            )
        if not 0 <= partition < record.partitions:
            raise ServiceError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"topic {topic!r} has partitions 0..{record.partitions - 1}; "
                f"partition {partition} does not exist",
            )
        part = self._partitions.get((topic, partition))
        if part is None:
            raise self._not_leader(topic, partition)
        return part

    def _not_leader(self, topic: str, partition: int) -> ServiceError:
        state = self.partition_state(topic, partition)
        address = self.store_addresses().get(state.leader)
        where = (
            f"led by store node {state.leader} ({address}) at leader epoch "
            f"{state.leader_epoch}" if address is not None else "without a leader right now"
        )
        return ServiceError(
            ErrorCode.NOT_LEADER_OR_FOLLOWER,
            f"partition {topic}-{partition} is {where}, not by store node "
            f"{self.config.node_id}; refresh metadata and retry",
        )

    def _resolve_leader(self, topic: str, partition: int,
                        leader_epoch: int | None = None) -> PartitionRuntime:
        """The partition, when this node leads it at the epoch the sender
        knows (None: any)."""
        part = self._resolve(topic, partition)
        if not part.is_leader:
            raise self._not_leader(topic, partition)
        stale = check_leader_epoch(known=leader_epoch, current=part.state.leader_epoch)
        if stale == "fenced":
            raise ServiceError(
                ErrorCode.FENCED_LEADER_EPOCH,
                f"{topic}-{partition}: the request names leader epoch {leader_epoch}, but the "
                f"partition is at epoch {part.state.leader_epoch}; refresh metadata and retry",
            )
        if stale == "unknown":
            raise ServiceError(
                ErrorCode.UNKNOWN_LEADER_EPOCH,
                f"{topic}-{partition}: the request names leader epoch {leader_epoch}, newer "
                f"than this replica's {part.state.leader_epoch}; retry",
            )
        return part

    def _check_enough_replicas(self, part: PartitionRuntime) -> None:
        if len(part.state.isr) < part.min_insync_replicas:
            raise ServiceError(
                ErrorCode.NOT_ENOUGH_REPLICAS,
                f"{part.topic_partition}: only {len(part.state.isr)} replicas "
                f"{list(part.state.isr)} are in sync, min.insync.replicas is "
                f"{part.min_insync_replicas}; nothing was written, retry",
            )

    # --------------------------------------------------------------- produce

    async def produce(
        self, items: Sequence[ProduceItem], *, timeout_ms: int = 0, transactional_id: str = "",
        add_partitions_to_txn: bool = False, coordinator_write: bool = False,
    ) -> list[ProduceOutcome]:
        """Appends one batch per item. Checks and offsets happen synchronously,
        in item order, except for batches that must wait for a transaction
        verification (or behind another batch's); the answer waits until every
        append is durable or timeout_ms (0: the default) passes.
        `add_partitions_to_txn`: the verification adds the partition to the
        producer's transaction (the client sent no AddPartitionsToTxn).
        `coordinator_write`: the coordinators' own writes, the only ones
        internal topics take."""
        await self._ensure_known({item.topic for item in items},
                                 [(item.topic, item.partition) for item in items])
        now_ms = self._clock_ms()
        skip_verification = self._skips_verification(add_partitions_to_txn)
        outcomes: list[ProduceOutcome | None] = []
        waits: dict[int, asyncio.Future[None]] = {}
        deferred: list[_Deferred] = []
        # (producer id, epoch) -> the partitions to ask the coordinator about:
        # one question per request, however many partitions it opens.
        questions: dict[tuple[int, int], list[TopicPartitionKey]] = {}
        for index, item in enumerate(items):
            try:
                self._check_accepting()
                part = self._resolve_leader(item.topic, item.partition, item.leader_epoch)
                if not coordinator_write:
                    self._check_not_internal(item.topic)
                self._check_enough_replicas(part)
                result = part.append(
                    item.batch, expected_log_end_offset=item.expected_log_end_offset,
                    now_ms=now_ms, transactional_id=transactional_id,
                    txn_verified=skip_verification,
                )
            except ServiceError as exc:
                outcomes.append(ProduceOutcome(item.topic, item.partition, exc))
                continue
            if isinstance(result, VerifyFirst):
                gate = part.open_verification_gate(result.producer_id)
                questions.setdefault((result.producer_id, result.producer_epoch), []).append(
                    (item.topic, item.partition)
                )
                deferred.append(_Deferred(index, item, part, result, gate))
                outcomes.append(None)
            elif isinstance(result, WaitForGate):
                deferred.append(_Deferred(index, item, part, result, None))
                outcomes.append(None)
            else:
                outcomes.append(self._accepted(index, item, part, result, now_ms, waits))
        if deferred:
            asked = {
                key: asyncio.ensure_future(self._verify(
                    transactional_id, key[0], key[1], tps, add=add_partitions_to_txn))
                for key, tps in questions.items()
            }
            finished = await asyncio.gather(*(
                self._append_deferred(d, asked, transactional_id, waits,
                                      add=add_partitions_to_txn)
                for d in deferred
            ))
            for d, outcome in zip(deferred, finished, strict=True):
                outcomes[d.index] = outcome
        final = [o for o in outcomes if o is not None]
        invariant(len(final) == len(items), "a produce item without an outcome")
        for index, error in (await self._await_durable(waits, timeout_ms)).items():
            item = items[index]
            if error.code is ErrorCode.REQUEST_TIMED_OUT:
                error = ServiceError(
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"{item.topic}-{item.partition}: the append at offset "
                    f"{final[index].base_offset} {error.message}; retry (the retry is "
                    "deduplicated)",
                )
            final[index] = ProduceOutcome(item.topic, item.partition, error)
        return final

    def _accepted(
        self, index: int, item: ProduceItem, part: PartitionRuntime,
        result: Appended | Duplicate, now_ms: int, waits: dict[int, asyncio.Future[None]],
    ) -> ProduceOutcome:
        """Queues an accepted append's writes (or finds a duplicate's pending
        original) and builds its outcome."""
        if isinstance(result, Appended):
            future = self._writer.submit(
                result.group,
                on_durable=_durable_callback(part, result.base_offset, result.next_offset),
            )
            waits[index] = part.track_pending(result.base_offset, result.next_offset, future)
            self._maybe_snapshot(part, now_ms)
            return ProduceOutcome(
                item.topic, item.partition, None, result.base_offset, False,
                part.log.log_start_offset, now_ms,
            )
        pending = part.pending_future(result.base_offset)
        if pending is not None:
            waits[index] = pending
        return ProduceOutcome(
            item.topic, item.partition, None, result.base_offset, True,
            part.log.log_start_offset, -1,
        )

    async def _append_deferred(
        self, deferred: _Deferred, asked: Mapping[tuple[int, int], asyncio.Future[VerifyAnswer]],
        transactional_id: str, waits: dict[int, asyncio.Future[None]], *, add: bool,
    ) -> ProduceOutcome:
        """Finishes an append that had to wait: for its verification (then
        appends with txn_verified), or for another batch's gate (then checks
        again, which may in turn need a verification or another gate)."""
        item, part = deferred.item, deferred.part
        tp = (item.topic, item.partition)
        pending: VerifyFirst | WaitForGate = deferred.result
        gate = deferred.gate
        # The producer whose gate this item holds (when gate is not None).
        gate_producer_id = pending.producer_id if isinstance(pending, VerifyFirst) else -1
        question: asyncio.Future[VerifyAnswer] | None = (
            asked[(pending.producer_id, pending.producer_epoch)]
            if isinstance(pending, VerifyFirst) else None
        )
        try:
            while True:
                if isinstance(pending, WaitForGate):
                    await pending.gate
                    self._check_accepting()
                    self._check_still_leading(part, item)
                    result = part.append(
                        item.batch, expected_log_end_offset=item.expected_log_end_offset,
                        now_ms=self._clock_ms(), transactional_id=transactional_id,
                        txn_verified=self._skips_verification(add),
                    )
                    if isinstance(result, WaitForGate):
                        pending = result
                        continue
                    if isinstance(result, VerifyFirst):
                        pending = result
                        gate = part.open_verification_gate(result.producer_id)
                        gate_producer_id = result.producer_id
                        question = asyncio.ensure_future(self._verify(
                            transactional_id, result.producer_id, result.producer_epoch, [tp],
                            add=add,
                        ))
                        continue
                    return self._accepted(
                        deferred.index, item, part, result, self._clock_ms(), waits
                    )
                if question is None:
                    raise InvariantViolation("a verification without its question")
                answer = await question
                verdict = answer.verdicts[tp]
                if verdict is not None:
                    raise ServiceError(
                        verdict.code,
                        f"producer {pending.producer_id} (epoch {pending.producer_epoch}) on "
                        f"{item.topic}-{item.partition}: the transaction coordinator of "
                        f"transactional id {transactional_id!r} did not confirm that this "
                        f"partition is in the producer's transaction: {verdict.code.name}: "
                        f"{verdict.message}",
                    )
                self._check_accepting()
                self._check_still_leading(part, item)
                result = part.append(
                    item.batch, expected_log_end_offset=item.expected_log_end_offset,
                    now_ms=self._clock_ms(), transactional_id=transactional_id,
                    txn_verified=True, own_gate=gate,
                )
                if not isinstance(result, (Appended, Duplicate)):
                    raise InvariantViolation(
                        f"{item.topic}-{item.partition}: a verified append answered {result!r}"
                    )
                if answer.transaction_timeout_ms > 0:
                    # How long the transaction may hold the LSO here (the
                    # hanging check, below).
                    part.txn_timeouts_ms[pending.producer_id] = answer.transaction_timeout_ms
                return self._accepted(deferred.index, item, part, result, self._clock_ms(), waits)
        except ServiceError as exc:
            return ProduceOutcome(item.topic, item.partition, exc)
        finally:
            if gate is not None:
                part.close_verification_gate(gate_producer_id, gate)

    def _check_still_leading(self, part: PartitionRuntime, item: ProduceItem) -> None:
        """After an await, before an append: the partition is still this
        node's to append to (led here, at an epoch the sender may write to,
        by the same runtime: a truncation reopens it) with enough replicas in
        sync. A batch that waited for its verification, or behind another's
        gate, while leadership moved away would otherwise go into a
        follower's log: at offsets the leader fills with other batches, and
        acknowledged once the leader's HW passes them."""
        if self._resolve_leader(item.topic, item.partition, item.leader_epoch) is not part:
            raise self._not_leader(item.topic, item.partition)
        self._check_enough_replicas(part)

    def _skips_verification(self, add_partitions_to_txn: bool) -> bool:
        """The unsafe test switch skips the check only: a request that asks the
        store to add its partitions to the transaction still does."""
        return self.config.unsafe_skip_txn_verification and not add_partitions_to_txn

    async def _verify(
        self, transactional_id: str, producer_id: int, producer_epoch: int,
        partitions: Sequence[TopicPartitionKey], *, add: bool = False,
    ) -> VerifyAnswer:
        """The coordinator's verdict per partition (`add`: after adding the
        partitions to the transaction); a failure to ask becomes the same
        (retriable) verdict for every partition. Never raises."""
        try:
            if self._txn_verifier is None:
                raise ServiceError(
                    ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    f"store node {self.config.node_id} has no transaction coordinator to "
                    "verify transactional writes with",
                )
            answer = await self._txn_verifier.verify(
                transactional_id=transactional_id, producer_id=producer_id,
                producer_epoch=producer_epoch, partitions=partitions, add=add,
            )
        except ServiceError as exc:
            log.info("verification of producer %d (epoch %d, transactional id %r) failed: %s",
                     producer_id, producer_epoch, transactional_id, exc)
            answer = VerifyAnswer({tp: Rejection(exc.code, exc.message) for tp in partitions})
        for tp in partitions:
            verdict = answer.verdicts.get(tp)
            metrics.TXN_VERIFICATIONS.labels(
                "NONE" if verdict is None else verdict.code.name
            ).inc()
        return answer

    async def _await_durable(
        self, waits: dict[int, asyncio.Future[None]], timeout_ms: int
    ) -> dict[int, ServiceError]:
        """Waits for the group commits of `waits` (index -> future) up to
        timeout_ms (0: the default); returns the failed ones' errors."""
        if not waits:
            return {}
        timeout_s = (timeout_ms or DEFAULT_PRODUCE_TIMEOUT_MS) / 1000
        shields = [asyncio.shield(f) for f in waits.values()]
        await asyncio.wait(shields, timeout=timeout_s)
        for shield in shields:
            # The outcomes are read below from the futures themselves; a
            # shield that failed (leadership moved while the append waited
            # for its acks) is read here so that asyncio does not log it as
            # an exception nobody retrieved. Read in place rather than by a
            # done callback, which would add a step to the event loop's
            # schedule (and move every simulation seed).
            if shield.done() and not shield.cancelled():
                shield.exception()
        errors: dict[int, ServiceError] = {}
        for index, future in waits.items():
            if not future.done():
                errors[index] = ServiceError(
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"was not durable within {timeout_s * 1000:.0f} ms",
                )
            elif future.exception() is not None:
                failure = future.exception()
                errors[index] = failure if isinstance(failure, ServiceError) else ServiceError(
                    ErrorCode.STORAGE_ERROR, repr(failure)
                )
        return errors

    # ---------------------------------------------------------- transactions

    async def write_txn_markers(
        self, markers: Sequence[MarkerItem], *, timeout_ms: int = 0
    ) -> list[MarkerOutcome]:
        """Writes each marker to each partition it names (in request order),
        by the rules of core/producer_state.py; answers once every written
        marker is durable. An identical retry of a producer's last marker
        answers with its offset and writes nothing."""
        crash_point("store.before_marker_write")
        await self._ensure_known({t for m in markers for t, _p in m.partitions})
        now_ms = self._clock_ms()
        outcomes: list[MarkerOutcome] = []
        waits: dict[int, asyncio.Future[None]] = {}
        for item in markers:
            marker = TxnMarker(
                item.producer_id, item.producer_epoch, item.control_type, item.coordinator_epoch,
                transaction_version=item.transaction_version, timestamp_ms=item.timestamp_ms,
            )
            for topic, partition in item.partitions:
                try:
                    self._check_accepting()
                    part = self._resolve_leader(topic, partition)
                    self._check_enough_replicas(part)
                    result = part.append_marker(marker, now_ms=now_ms)
                except ServiceError as exc:
                    outcomes.append(MarkerOutcome(item.producer_id, topic, partition, exc))
                    continue
                if isinstance(result, DuplicateMarker):
                    offset = result.offset
                    pending = part.pending_future(offset)
                    if pending is not None:
                        waits[len(outcomes)] = pending
                else:
                    offset = result.base_offset
                    future = self._writer.submit(
                        result.group,
                        on_durable=_durable_callback(part, result.base_offset, result.next_offset),
                    )
                    waits[len(outcomes)] = part.track_pending(
                        result.base_offset, result.next_offset, future
                    )
                    self._maybe_snapshot(part, now_ms)
                    log.info(
                        "%s: %s marker of producer %d (epoch %d, coordinator epoch %d) at "
                        "offset %d", part.topic_partition, marker.name, marker.producer_id,
                        marker.producer_epoch, marker.coordinator_epoch, offset,
                    )
                outcomes.append(MarkerOutcome(item.producer_id, topic, partition, None, offset))
        for index, error in (await self._await_durable(waits, timeout_ms)).items():
            failed = outcomes[index]
            if error.code is ErrorCode.REQUEST_TIMED_OUT:
                error = ServiceError(
                    ErrorCode.REQUEST_TIMED_OUT,
                    f"{failed.topic}-{failed.partition}: the marker at offset {failed.offset} "
                    f"{error.message}; retry (an identical retry is not written again)",
                )
            outcomes[index] = MarkerOutcome(failed.producer_id, failed.topic, failed.partition,
                                            error)
        # The markers are durable but the coordinator has not heard so.
        crash_point("store.after_marker_durable")
        return outcomes

    def _maybe_snapshot(self, part: PartitionRuntime, now_ms: int) -> None:
        if part.snapshot_due(
            now_ms=now_ms, every_batches=self.config.snapshot_interval_batches,
            every_ms=self.config.snapshot_interval_ms,
        ):
            group = part.build_snapshot(now_ms=now_ms)
            if group is not None:
                self._writer.submit(group)

    # ----------------------------------------------------------------- reads

    async def fetch(
        self,
        items: Sequence[FetchItem],
        *,
        max_wait_ms: int = 0,
        min_bytes: int = 0,
        max_bytes: int = 0,
        isolation: Isolation = Isolation.READ_UNCOMMITTED,
        include_control: bool = False,
        client_filters: bool = False,
    ) -> list[FetchOutcome]:
        """Reads every item; when fewer than min_bytes are available, waits up
        to max_wait_ms for any of the partitions' HW (LSO under
        read_committed) to move and reads again. Bytes filtered out (markers,
        aborted transactions) count toward min_bytes and max_bytes: they are
        work done, and a fetch that skipped them answers at once with a
        next_fetch_offset past them rather than waiting with nothing new.
        `client_filters`: for readers that filter by themselves (Kafka's
        clients; PartitionRuntime.read says what changes)."""
        await self._ensure_known({item.topic for item in items},
                                 [(item.topic, item.partition) for item in items])
        loop = asyncio.get_running_loop()
        wait_s = min(max(max_wait_ms, 0), limits.MAX_FETCH_WAIT_MS) / 1000
        deadline = loop.time() + wait_s
        # Capped, as Kafka's broker caps a fetch at its fetch.max.bytes: a
        # larger response would not fit in a gRPC message (every retry of the
        # client would fail the same way).
        budget = min(max_bytes or limits.DEFAULT_FETCH_MAX_BYTES, limits.DEFAULT_FETCH_MAX_BYTES)
        while True:
            outcomes, size, parts, failed = self._fetch_once(
                items, budget, isolation, include_control, client_filters
            )
            remaining_s = deadline - loop.time()
            if size >= min_bytes or failed or remaining_s <= 0 or self._closing:
                _count_fetched(outcomes)
                return outcomes
            waiter: asyncio.Future[None] = loop.create_future()
            for part in parts:
                part.add_waiter(waiter, isolation)
            try:
                await asyncio.wait_for(waiter, remaining_s)
            except TimeoutError:
                pass
            finally:
                for part in parts:
                    part.remove_waiter(waiter)

    def _fetch_once(
        self, items: Sequence[FetchItem], budget_bytes: int, isolation: Isolation,
        include_control: bool = False, client_filters: bool = False,
    ) -> tuple[list[FetchOutcome], int, list[PartitionRuntime], bool]:
        outcomes = []
        parts = []
        total = 0
        failed = False
        for item in items:
            try:
                part = self._resolve_leader(item.topic, item.partition,
                                            item.current_leader_epoch)
                parts.append(part)
                limit = min(item.max_bytes or DEFAULT_PARTITION_FETCH_MAX_BYTES,
                            budget_bytes - total)
                # Only the first partition with data may go over the budget
                # (by one batch, so a fetch always makes progress); the
                # response holds at most max(budget, one batch).
                try:
                    read = part.read(item.fetch_offset, max_bytes=limit, isolation=isolation,
                                     include_control=include_control,
                                     take_first_whole=total == 0, client_filters=client_filters)
                except CorruptionError as damage:
                    raise self.report_damage(damage) from damage
            except ServiceError as exc:
                failed = True
                outcomes.append(FetchOutcome(
                    item.topic, item.partition, exc, next_fetch_offset=item.fetch_offset
                ))
                continue
            total += read.scanned_bytes
            outcomes.append(FetchOutcome(
                item.topic, item.partition, None,
                high_watermark=part.log.high_watermark,
                last_stable_offset=part.log.last_stable_offset,
                log_start_offset=part.log.log_start_offset,
                batches=tuple(read.batches),
                next_fetch_offset=read.next_fetch_offset,
                record_count=read.record_count,
                size_bytes=read.size_bytes,
                aborted=read.aborted,
            ))
        return outcomes, total, parts, failed

    async def list_offsets(
        self, queries: Sequence[OffsetQuery], *, isolation: Isolation
    ) -> list[OffsetOutcome]:
        await self._ensure_known({q.topic for q in queries},
                                 [(q.topic, q.partition) for q in queries])
        outcomes = []
        for q in queries:
            try:
                offset, ts = self._resolve_leader(q.topic, q.partition).list_offset(
                    q.timestamp_ms, isolation
                )
            except CorruptionError as damage:
                outcomes.append(OffsetOutcome(q.topic, q.partition, self.report_damage(damage)))
                continue
            except ServiceError as exc:
                outcomes.append(OffsetOutcome(q.topic, q.partition, exc))
                continue
            outcomes.append(OffsetOutcome(q.topic, q.partition, None, offset, ts))
        return outcomes

    async def describe_producers(
        self, partitions: Sequence[tuple[str, int]]
    ) -> list[ProducersOutcome]:
        await self._ensure_known({t for t, _p in partitions})
        outcomes = []
        for topic, p in partitions:
            try:
                part = self._resolve_leader(topic, p)
            except ServiceError as exc:
                outcomes.append(ProducersOutcome(topic, p, exc))
                continue
            outcomes.append(ProducersOutcome(topic, p, None, tuple(part.producers.entries())))
        return outcomes

    # ----------------------------------------------------------- replication

    async def replica_fetch(
        self, replica_id: int, items: Sequence[ReplicaFetchItem], *, max_wait_ms: int,
    ) -> list[ReplicaFetchOutcome]:
        """As leader: what a follower copies next. The fetch offset tells
        how far the follower has copied (which moves the HW and may bring it
        back into the ISR); the answer holds stored batches from there, as
        they are, up to this replica's durable end. Long-polls up to
        max_wait_ms while there is nothing new."""
        await self._ensure_known({item.topic for item in items})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(max_wait_ms, 0), limits.MAX_FETCH_WAIT_MS) / 1000
        first = True
        while True:
            now_ms = self._clock_ms()
            outcomes: list[ReplicaFetchOutcome] = []
            parts: list[PartitionRuntime] = []
            ready = False
            for item in items:
                resolved: PartitionRuntime | None = None
                try:
                    part = resolved = self._resolve_leader(item.topic, item.partition,
                                                           item.current_leader_epoch)
                    if replica_id not in part.state.replicas:
                        raise ServiceError(
                            ErrorCode.NOT_LEADER_OR_FOLLOWER,
                            f"{part.topic_partition}: store node {replica_id} is not one of "
                            f"its replicas {list(part.state.replicas)}",
                        )
                    log_state = part.log
                    if not log_state.log_start_offset <= item.fetch_offset <= (
                            log_state.log_end_offset):
                        raise ServiceError(
                            ErrorCode.OFFSET_OUT_OF_RANGE,
                            f"{part.topic_partition}: replica fetch offset {item.fetch_offset} "
                            f"is outside the leader's log [{log_state.log_start_offset}, "
                            f"{log_state.log_end_offset})",
                        )
                    if first:
                        part.record_follower_fetch(replica_id, item.fetch_offset, now_ms)
                        self._maybe_expand_isr(part, replica_id, item.fetch_offset)
                    try:
                        batches, _next = part.read_replica(
                            item.fetch_offset,
                            max_bytes=item.max_bytes or DEFAULT_PARTITION_FETCH_MAX_BYTES,
                        )
                    except CorruptionError as damage:
                        raise self.report_damage(damage) from damage
                except ServiceError as exc:
                    # The leader's bounds tell a follower out of range whether
                    # to truncate (it is ahead) or start over (it is behind
                    # the log start).
                    outcomes.append(ReplicaFetchOutcome(
                        item.topic, item.partition, exc,
                        log_start_offset=resolved.log.log_start_offset if resolved else -1,
                        log_end_offset=resolved.log.log_end_offset if resolved else -1,
                    ))
                    ready = True
                    continue
                parts.append(part)
                ready = ready or bool(batches)
                outcomes.append(ReplicaFetchOutcome(
                    item.topic, item.partition, None,
                    high_watermark=part.log.high_watermark,
                    log_start_offset=part.log.log_start_offset,
                    log_end_offset=part.log.log_end_offset,
                    batches=tuple(batches),
                ))
            first = False
            remaining_s = deadline - loop.time()
            if ready or remaining_s <= 0 or self._closing:
                return outcomes
            waiter: asyncio.Future[None] = loop.create_future()
            for part in parts:
                part.add_durable_waiter(waiter)
            try:
                await asyncio.wait_for(waiter, remaining_s)
            except TimeoutError:
                pass
            finally:
                for part in parts:
                    part.remove_durable_waiter(waiter)

    async def replica_fetch_session(
        self, replica_id: int, items: Sequence[ReplicaFetchItem], *, session_id: int,
        session_epoch: int, forgotten: Sequence[PartitionKey] = (), max_wait_ms: int,
    ) -> tuple[int, list[ReplicaFetchOutcome]]:
        """As leader, a follower store's fetch of every partition it
        follows here, in its fetch session (replica_sessions.py): epoch 1
        opens the session and lists them all; later epochs list only the
        partitions whose fetch offset or leader epoch changed (`forgotten`:
        those it stopped following). The answer holds only partitions with
        news: batches, an error (the partition leaves the session), or a HW
        the follower has not been sent (HW moves alone do not end the
        long-poll: they ride with the next answer). Long-polls up to
        max_wait_ms, woken by the partitions' appends, not by polling them.
        Returns (session id, outcomes); session id 0: no session (epoch 0,
        answered as `replica_fetch`), or the session is unknown and the
        follower must open a new one."""
        if session_epoch <= 0:
            return 0, await self.replica_fetch(replica_id, items, max_wait_ms=max_wait_ms)
        await self._ensure_known({item.topic for item in items})
        if session_epoch == 1:
            session = self._sessions.open(replica_id)
        else:
            found = self._sessions.take(replica_id, session_id, session_epoch)
            if found is None:
                return 0, []
            session = found
        for key in forgotten:
            self._sessions.forget(session, key)
        now_ms = self._clock_ms()
        outcomes: dict[PartitionKey, ReplicaFetchOutcome] = {}
        # What the follower did not confirm copying is sent again; what
        # appended since the last answer is new.
        check = dict.fromkeys(session.answered)
        session.answered.clear()
        for key in session.take_ready():
            check[key] = None
        for item in items:
            key = (item.topic, item.partition)
            entry = SessionEntry(item.fetch_offset, item.current_leader_epoch,
                                 item.max_bytes or DEFAULT_PARTITION_FETCH_MAX_BYTES)
            self._sessions.put(session, key, entry)
            try:
                part = self._session_partition(replica_id, key, entry)
            except ServiceError as exc:
                outcomes[key] = self._session_error(session, key, exc)
                continue
            part.record_follower_fetch(replica_id, item.fetch_offset, now_ms)
            self._maybe_expand_isr(part, replica_id, item.fetch_offset)
            # Its HW is news to the follower until sent once.
            session.hw_moved[key] = None
            check[key] = None
        for key in session.take_rejoin_checks():
            stored = session.entries.get(key)
            led = self.led_partition(*key)
            # Unlisted: the follower's log end is still what the session holds.
            if stored is not None and led is not None and (
                    stored.leader_epoch == led.state.leader_epoch) and (
                    led.follower_end_offsets.get(replica_id) == stored.fetch_offset):
                self._maybe_expand_isr(led, replica_id, stored.fetch_offset)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(max_wait_ms, 0), limits.MAX_FETCH_WAIT_MS) / 1000
        while True:
            for key in check:
                stored = session.entries.get(key)
                if key in outcomes or stored is None:
                    continue
                outcome = self._session_read(session, key, stored)
                if outcome is not None:
                    outcomes[key] = outcome
            remaining_s = deadline - loop.time()
            if outcomes or remaining_s <= 0 or self._closing or not self._sessions.is_open(
                    session):
                break
            waiter: asyncio.Future[None] = loop.create_future()
            session.waiter = waiter
            try:
                await asyncio.wait_for(waiter, remaining_s)
            except TimeoutError:
                pass
            finally:
                session.waiter = None
            check = dict.fromkeys(session.take_ready())
        for key in list(session.hw_moved):
            stored = session.entries.get(key)
            led = self._partitions.get(key)
            if key in outcomes or stored is None or led is None:
                continue
            if not led.closed and led.is_leader and (
                    led.log.high_watermark > stored.sent_high_watermark):
                outcomes[key] = ReplicaFetchOutcome(
                    key[0], key[1], None, high_watermark=led.log.high_watermark,
                    log_start_offset=led.log.log_start_offset,
                    log_end_offset=led.log.log_end_offset)
        session.hw_moved.clear()
        for key, outcome in outcomes.items():
            stored = session.entries.get(key)
            if stored is not None and outcome.error is None:
                stored.sent_high_watermark = outcome.high_watermark
                if outcome.batches:
                    session.answered[key] = None
        return session.session_id, list(outcomes.values())

    def _session_partition(self, replica_id: int, key: PartitionKey,
                           entry: SessionEntry) -> PartitionRuntime:
        """The led partition a session entry fetches, checked as a fetch
        is (leader epoch, replica, offset within the log)."""
        part = self._resolve_leader(key[0], key[1], entry.leader_epoch)
        if replica_id not in part.state.replicas:
            raise ServiceError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"{part.topic_partition}: store node {replica_id} is not one of "
                f"its replicas {list(part.state.replicas)}",
            )
        log_state = part.log
        if not log_state.log_start_offset <= entry.fetch_offset <= log_state.log_end_offset:
            raise ServiceError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"{part.topic_partition}: replica fetch offset {entry.fetch_offset} "
                f"is outside the leader's log [{log_state.log_start_offset}, "
                f"{log_state.log_end_offset})",
            )
        return part

    def _session_read(self, session: FetchSession, key: PartitionKey,
                      entry: SessionEntry) -> ReplicaFetchOutcome | None:
        """A session entry's batches from its fetch offset (None: nothing
        new), or its error."""
        try:
            part = self._session_partition(session.replica_id, key, entry)
        except ServiceError as exc:
            return self._session_error(session, key, exc)
        if entry.fetch_offset >= part.log.durable_end_offset:
            return None
        try:
            batches, _next = part.read_replica(entry.fetch_offset, max_bytes=entry.max_bytes)
        except CorruptionError as damage:
            # Never sent: the follower is told STORAGE_ERROR, as an
            # unsessioned fetch is (replica_fetch).
            return self._session_error(session, key, self.report_damage(damage))
        if not batches:
            return None
        return ReplicaFetchOutcome(
            key[0], key[1], None, high_watermark=part.log.high_watermark,
            log_start_offset=part.log.log_start_offset,
            log_end_offset=part.log.log_end_offset, batches=tuple(batches))

    def _session_error(self, session: FetchSession, key: PartitionKey,
                       error: ServiceError) -> ReplicaFetchOutcome:
        """A refused partition leaves the session (the follower lists it
        again once it has dealt with the error), with the leader's bounds: a
        follower out of range learns from them whether to truncate or to
        start over."""
        self._sessions.forget(session, key)
        part = self._partitions.get(key)
        return ReplicaFetchOutcome(
            key[0], key[1], error,
            log_start_offset=part.log.log_start_offset if part is not None else -1,
            log_end_offset=part.log.log_end_offset if part is not None else -1,
        )

    def _maybe_expand_isr(self, part: PartitionRuntime, replica_id: int,
                          fetch_offset: int) -> None:
        """A follower outside the ISR rejoins once it has everything the
        ISR has (the HW) and everything of the current leader epoch (Kafka's
        rule); the change goes through the metadata store."""
        if replica_id in part.state.isr or self.on_isr_expand is None:
            return
        if self.may_rejoin_isr(part, replica_id):
            self.on_isr_expand(part, replica_id)

    @staticmethod
    def may_rejoin_isr(part: PartitionRuntime, replica_id: int) -> bool:
        """As leader: whether a follower holds all the ISR holds (the HW)
        and all of the current leader epoch, as it last said. Checked when
        it asks and again when the change is made: the HW may have passed
        it meanwhile, and an ISR member must never lack a committed record."""
        fetch_offset = part.follower_end_offsets.get(replica_id, -1)
        epoch_start = part.epochs.start_offset_of(part.state.leader_epoch)
        return fetch_offset >= part.log.high_watermark and (
            epoch_start is None or fetch_offset >= epoch_start)

    def offsets_for_leader_epoch(
        self, queries: Sequence[tuple[str, int, int, int]],
    ) -> list[EpochEndOutcome]:
        """(topic, partition, epoch, current leader epoch or -1) -> where
        that epoch ends in this leader's log (Kafka's OffsetsForLeaderEpoch)."""
        outcomes = []
        for topic, partition, epoch, current in queries:
            try:
                part = self._resolve_leader(topic, partition, current if current >= 0 else None)
            except ServiceError as exc:
                outcomes.append(EpochEndOutcome(topic, partition, exc))
                continue
            found_epoch, end_offset = part.epochs.end_offset_for(epoch, part.log.log_end_offset)
            outcomes.append(EpochEndOutcome(topic, partition, None, found_epoch, end_offset))
        return outcomes

    def led_partition(self, topic: str, partition: int) -> PartitionRuntime | None:
        """The local replica when this node leads it (None otherwise)."""
        part = self._partitions.get((topic, partition))
        if part is None or part.closed or not part.is_leader:
            return None
        return part

    def follower_partition(self, topic: str, partition: int) -> PartitionRuntime | None:
        """The local replica when this node follows it (None otherwise)."""
        part = self._partitions.get((topic, partition))
        if part is None or part.closed or part.is_leader or not part.state.online:
            return None
        return part

    def append_replicated(
        self, part: PartitionRuntime, batches: Sequence[bytes], *, leader_high_watermark: int,
    ) -> asyncio.Future[None] | None:
        """As follower: appends the leader's batches at their offsets and
        queues their writes; returns the future of the last one's durability
        (None when there were none). Takes the leader's HW.

        Goes on while the store drains (begin_shutdown): the store is still
        in the ISR of the partitions it follows until its lease ends, so the
        leaders count it for their high watermarks, and a follower that
        stopped copying would hold their acknowledgements — and every
        request here that waits on one of them, a transaction's
        verification say — until the drain's grace ran out."""
        if self._closed:
            raise ServiceError(
                ErrorCode.SHUTTING_DOWN,
                f"store node {self.config.node_id} is shutting down; retry later",
            )
        self._writer.check_healthy()
        now_ms = self._clock_ms()
        last: asyncio.Future[None] | None = None
        for stored in batches:
            result = part.append_replicated(stored, now_ms=now_ms)
            last = self._writer.submit(
                result.group,
                on_durable=_durable_callback(part, result.base_offset, result.next_offset),
            )
            self._maybe_snapshot(part, now_ms)
        part.leader_high_watermark = max(part.leader_high_watermark, leader_high_watermark)
        part.update_high_watermark()
        return last

    async def truncate_replica(self, part: PartitionRuntime, offset: int) -> PartitionRuntime:
        """As follower: removes every batch at or after `offset` (a tail the
        new leader does not have; a batch that `offset` falls inside goes
        whole, as in Kafka, since two divergent logs need not share batch
        boundaries) and rebuilds the partition's memory from what stays, by
        the same recovery as a restart. Returns the new runtime of the
        partition. Raises NOT_LEADER_OR_FOLLOWER when the partition is no
        longer this replica's to truncate (it leads now, or was reopened)."""
        self._check_follower(part)
        tid, p = part.topic.topic_id, part.partition
        if offset >= part.log.log_end_offset:
            # Nothing to cut from the log; epochs this replica began at its
            # log end and never wrote go (Kafka truncates the cache so too).
            if part.epochs.truncate_from_end(offset):
                group = WriteGroup()
                part.add_epoch_writes(group)
                await self._writer.submit(group)
            return part
        containing = self._store.seek_for_prev(keys.log_key(tid, p, offset),
                                               keys.partition_prefix(keys.LOG, tid, p))
        if containing is not None:
            header = read_header(containing[1])
            if header.base_offset < offset < header.next_offset:
                offset = header.base_offset

        def deletes() -> WriteGroup:
            end_key = keys.log_key_end(tid, p)
            removed_bytes = sum(
                len(v) for _k, v in self._store.scan(keys.log_key(tid, p, offset), end_key))
            group = WriteGroup()
            group.delete_range(keys.log_key(tid, p, offset), end_key)
            group.delete_range(keys.aborted_txn_key(tid, p, offset),
                               keys.next_prefix(keys.partition_prefix(keys.ABORTED_TXN, tid, p)))
            group.delete_range(keys.snapshot_key(tid, p, offset + 1),
                               keys.next_prefix(keys.partition_prefix(keys.SNAPSHOT, tid, p)))
            time_prefix = keys.partition_prefix(keys.TIME_INDEX, tid, p)
            for key, value in self._store.scan(time_prefix, keys.next_prefix(time_prefix)):
                if decode_offset(value, what=f"{part.topic_partition} time index") >= offset:
                    group.delete(key)
            if part.epochs.truncate_from_end(offset):
                part.add_epoch_writes(group)
            group.put(keys.meta_key(tid, p), encode_partition_meta(
                part.log.log_start_offset, part.log.size_bytes - removed_bytes))
            return group

        log.warning("%s: truncating the log from %d to %d (a tail the leader at epoch %d does "
                    "not have)", part.topic_partition, part.log.log_end_offset, offset,
                    part.state.leader_epoch)
        metrics.TRUNCATIONS.labels(part.topic.name).inc()
        return await self._rewrite_replica(part, deletes)

    async def reset_replica(
        self, part: PartitionRuntime, log_start_offset: int
    ) -> PartitionRuntime:
        """As follower: drops everything this replica holds of the partition
        and starts it empty at `log_start_offset` (the leader's log start:
        what came before is gone everywhere)."""
        self._check_follower(part)
        tid, p = part.topic.topic_id, part.partition

        def deletes() -> WriteGroup:
            group = WriteGroup()
            for kind in keys.PARTITION_KINDS:
                prefix = keys.partition_prefix(kind, tid, p)
                group.delete_range(prefix, keys.next_prefix(prefix))
            group.put(keys.meta_key(tid, p), encode_partition_meta(log_start_offset, 0))
            return group

        log.warning("%s: starting this replica over at the leader's log start offset %d",
                    part.topic_partition, log_start_offset)
        return await self._rewrite_replica(part, deletes)

    def _check_follower(self, part: PartitionRuntime) -> None:
        key = (part.topic.name, part.partition)
        if self._partitions.get(key) is not part or part.closed or part.is_leader:
            raise ServiceError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"{part.topic_partition} is no longer followed by this replica as it was "
                "(it leads now, or was reopened)")

    async def _rewrite_replica(
        self, part: PartitionRuntime, deletes: Callable[[], WriteGroup],
    ) -> PartitionRuntime:
        """Takes the partition out of service at once (before any await:
        nothing may be appended to it meanwhile, not even if it is made
        leader), waits for its pending writes, applies `deletes()` (built
        then, from what is on disk) and reopens it from disk with its
        current state: as leader too, if it was elected meanwhile."""
        key = (part.topic.name, part.partition)
        self._check_follower(part)
        del self._partitions[key]
        self._rewriting.add(key)
        part.close()
        part.fail_acks(ServiceError(
            ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{part.topic_partition} was truncated here"))

        async def rewrite() -> PartitionRuntime:
            try:
                await self._writer.drain()
                await self._writer.submit(deletes())
            finally:
                self._rewriting.discard(key)
            record = self._catalog.get(part.topic.name)
            if record is None or record.topic_id != part.topic.topic_id:
                raise ServiceError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                   f"{part.topic_partition} was deleted meanwhile")
            return self._open_partition(record, part.partition, self._clock_ms())

        # Shielded: a follower stopped halfway (a leader change cancels it)
        # must not leave the partition out of service, or reopened from disk
        # before the deletion has landed.
        return await asyncio.shield(asyncio.ensure_future(rewrite()))

    # ---------------------------------------------------------- housekeeping

    async def snapshot_all(self, *, force: bool = False) -> int:
        """Snapshots every partition with changes (all with force); waits
        until durable. Returns how many were written."""
        now_ms = self._clock_ms()
        futures = []
        for part in self._partitions.values():
            group = part.build_snapshot(now_ms=now_ms, force=force)
            if group is not None:
                futures.append(self._writer.submit(group))
        for future in futures:
            await future
        return len(futures)

    def _snapshot_at_log_end(self, part: PartitionRuntime, now_ms: int) -> asyncio.Future[None]:
        """Queues a snapshot of the partition's producer state at its log end
        offset; the writer persists it before anything queued later."""
        snapshot = part.build_snapshot(now_ms=now_ms, force=True)
        if snapshot is None:
            raise InvariantViolation(f"{part.topic_partition}: a forced snapshot was not built")
        return self._writer.submit(snapshot)

    async def run_retention_once(self) -> int:
        """Expires idle producers and deletes batches due for retention in
        every partition; waits until durable. Returns the batches deleted."""
        async with self._log_rewrite_lock:
            return await self._run_retention()

    async def _run_retention(self) -> int:
        now_ms = self._clock_ms()
        self._last_retention_ms = now_ms
        futures = []
        deleted = 0
        for part in list(self._partitions.values()):
            part.expire_producers(
                now_ms=now_ms, expiration_ms=self.config.producer_id_expiration_ms
            )
            plan = part.plan_retention(
                now_ms=now_ms, max_batches=self.config.retention_max_batches_per_run
            )
            if plan.needs_snapshot:
                # Producer state must outlive the batches it came from: a
                # snapshot at the log end goes first (the writer keeps order),
                # then the plan can reach further.
                futures.append(self._snapshot_at_log_end(part, now_ms))
                plan = part.plan_retention(
                    now_ms=now_ms, max_batches=self.config.retention_max_batches_per_run
                )
            if plan.deletes_anything:
                futures.append(self._writer.submit(part.apply_retention(plan)))
                deleted += plan.batch_count
                log.info(
                    "%s: retention deleted %d batches (%d bytes); log start offset now %d",
                    part.topic_partition, plan.batch_count, plan.deleted_bytes,
                    plan.new_log_start_offset,
                )
        for future in futures:
            await future
        return deleted

    async def run_compaction_once(self, *, force: bool = False) -> list[CompactionReport]:
        """One compaction pass over every compacted partition that is due
        (core/compaction.py compaction_due; with force, every one with
        anything below its first uncleanable offset); waits until durable.
        Returns what each pass did."""
        async with self._log_rewrite_lock:
            self._last_compaction_ms = self._clock_ms()
            reports = []
            for part in list(self._partitions.values()):
                if self._closing:
                    break
                now_ms = self._clock_ms()
                if part.closed or not part.topic.compacted:
                    continue
                if not (force or part.compaction_due(now_ms)):
                    continue
                end_offset = part.first_uncleanable_offset
                if end_offset <= part.log.log_start_offset:
                    continue
                newest_snapshot = part.newest_snapshot_offset
                if newest_snapshot is None or newest_snapshot < end_offset:
                    # Recovery replays the batches after the newest snapshot
                    # as they are stored; a rewritten one must never be among
                    # them. A snapshot at the log end goes first.
                    self._snapshot_at_log_end(part, now_ms)
                    newest_snapshot = part.log.log_end_offset
                try:
                    report = await compact_partition(
                        part, submit=self._writer.submit, now_ms=now_ms,
                        end_offset=min(end_offset, newest_snapshot),
                        max_keys=self.config.compaction_max_keys_per_pass,
                        chunk_bytes=self.config.compaction_chunk_bytes,
                    )
                except BatchFormatError as exc:
                    # A stored batch whose records do not decode (its CRC
                    # held, so written so by a broken client or an old
                    # version): this partition is not compacted until an
                    # operator looks; the others, snapshots and retention
                    # go on. Chunks already written are consistent.
                    log.error("%s: compaction stopped at a damaged batch: %s",
                              part.topic_partition, exc)
                    continue
                if report is not None:
                    reports.append(report)
                    crash_point("store.compaction_after_pass")
            return reports

    async def _run_housekeeping(self) -> None:
        config = self.config
        tick_ms = min(
            1000, config.snapshot_interval_ms, config.retention_check_interval_ms,
            config.catalog_refresh_interval_ms, config.compaction_interval_ms,
        )
        while not self._closing:
            try:
                await asyncio.wait_for(self._closed_event.wait(), tick_ms / 1000)
                return
            except TimeoutError:
                pass
            try:
                # While writes are refused there is nothing to snapshot,
                # retain or compact: only a full disk is waited out.
                if self._writer.failure is not None and not await self._resume_after_disk_full():
                    continue
                now_ms = self._clock_ms()
                for part in list(self._partitions.values()):
                    self._maybe_snapshot(part, now_ms)
                    part.update_txn_age(now_ms)
                self.check_hanging_txns(now_ms)
                if now_ms - self._last_retention_ms >= config.retention_check_interval_ms:
                    await self.run_retention_once()
                if now_ms - self._last_compaction_ms >= config.compaction_interval_ms:
                    await self.run_compaction_once()
                if not config.is_controller and (
                    self._last_refresh_ms is None
                    or now_ms - self._last_refresh_ms >= config.catalog_refresh_interval_ms
                ):
                    await self._refresh_quietly()
            except ServiceError as exc:
                log.warning("housekeeping: %s", exc)
            except CorruptionError as exc:
                self.report_damage(exc)

    # --------------------------------------------------- hanging transactions

    def check_hanging_txns(self, now_ms: int) -> list[asyncio.Task[None]]:
        """Asks the coordinators about every transaction that has held a
        partition led here open past its timeout plus the margin
        (core/hanging_txns.py), each in a task of its own: one question in
        flight per transaction, at most limits.MAX_HANGING_TXN_QUESTIONS at
        once, the next one `retry_ms` after an answer that leaves it open.
        Returns the tasks it started (tests await them). Synchronous and
        O(open transactions): housekeeping runs it every tick."""
        if not self.config.resolve_hanging_txns or self._txn_resolver is None:
            return []
        policy = self._hanging_policy
        still_open: set[tuple[str, int, int, int]] = set()
        started: list[asyncio.Task[None]] = []
        for part in list(self._partitions.values()):
            if part.closed or not part.is_leader or part.producers.open_txn_count == 0:
                continue
            for txn in part.open_transactions():
                key = (part.topic.name, part.partition, txn.producer_id, txn.first_offset)
                still_open.add(key)
                if key in self._hanging_in_flight or now_ms < self._hanging_next_ms.get(
                        key, policy.overdue_at_ms(txn)):
                    continue
                if len(self._hanging_in_flight) >= limits.MAX_HANGING_TXN_QUESTIONS:
                    continue  # the next tick asks
                self._hanging_in_flight.add(key)
                started.append(self._spawn(self._resolve_hanging(part, txn, key)))
        # Transactions that ended (or whose partition is no longer led here)
        # are forgotten; one in flight is forgotten when its question ends.
        gone = (self._hanging_next_ms.keys() | self._hanging_counted) - still_open \
            - self._hanging_in_flight
        for key in gone:
            self._hanging_next_ms.pop(key, None)
            self._hanging_counted.discard(key)
        return started

    async def _resolve_hanging(self, part: PartitionRuntime, txn: hanging_txns.OpenTxn,
                               key: tuple[str, int, int, int]) -> None:
        policy = self._hanging_policy
        resolver = self._txn_resolver
        try:
            if resolver is None:
                return
            question = HangingQuestion(
                producer_id=txn.producer_id, producer_epoch=txn.producer_epoch,
                topic=part.topic.name, partition=part.partition,
                last_marker_timestamp_ms=txn.last_marker_timestamp_ms)
            answers = await resolver.resolve(question)
            resolution = hanging_txns.decide(
                {p: a.fate for p, a in answers.items()},
                partitions=self.layout.transaction_state_partitions)
            knows = next((a for a in answers.values() if a.transactional_id), None)
            now_ms = self._clock_ms()
            age_ms = now_ms - txn.start_time_ms
            entry = part.producers.get(txn.producer_id)
            if knows is not None and knows.transaction_timeout_ms > 0 and entry is not None \
                    and entry.current_txn_first_offset == txn.first_offset:
                part.txn_timeouts_ms[txn.producer_id] = knows.transaction_timeout_ms
            who = (f"{part.topic_partition}: the transaction of producer {txn.producer_id} "
                   f"(epoch {txn.producer_epoch}) open since offset {txn.first_offset} for "
                   f"{age_ms} ms")
            coordinator = (f"its coordinator (transactional id {knows.transactional_id!r})"
                           if knows is not None else "its coordinator")
            if resolution is hanging_txns.Resolution.STORE_ABORTS:
                await self._abort_hanging(part, txn, age_ms=age_ms, who=who)
            elif resolution is hanging_txns.Resolution.COORDINATOR_ABORTS:
                if key not in self._hanging_counted:
                    self._hanging_counted.add(key)
                    metrics.AUTO_ABORTED_TRANSACTIONS.labels(part.topic.name, "coordinator").inc()
                    log.warning("%s, past its timeout of %d ms: %s is aborting it", who,
                                policy.timeout_of(txn), coordinator)
            elif resolution is hanging_txns.Resolution.COORDINATOR_COMMITS:
                log.warning("%s, past its timeout of %d ms: %s decided to commit it; its "
                            "COMMIT marker is on its way", who, policy.timeout_of(txn),
                            coordinator)
            elif resolution is hanging_txns.Resolution.WAIT_OPEN:
                log.info("%s: %s holds it open (%s); asking again in %d ms", who, coordinator,
                         ", ".join(sorted({a.fate.name for a in answers.values()
                                           if a.transactional_id})), policy.retry_ms)
            else:
                missing = sorted(set(range(self.layout.transaction_state_partitions))
                                 - set(answers))
                log.info("%s: no coordinator knows it, but __transaction_state partitions %s "
                         "did not answer; asking again in %d ms", who, missing, policy.retry_ms)
        except ServiceError as exc:
            log.warning("%s: ending the hanging transaction of producer %d failed: %s",
                        part.topic_partition, txn.producer_id, exc)
        finally:
            self._hanging_in_flight.discard(key)
            self._hanging_next_ms[key] = self._clock_ms() + policy.retry_ms

    async def _abort_hanging(self, part: PartitionRuntime, txn: hanging_txns.OpenTxn, *,
                             age_ms: int, who: str) -> None:
        """No coordinator knows the transaction: writes its ABORT marker
        (core/hanging_txns.py, store_abort_marker) through the marker path,
        if it is still open as it was and the partition still led here by
        the same runtime; waits until the marker is durable."""
        self._check_accepting()
        if self._resolve_leader(part.topic.name, part.partition) is not part:
            return
        entry = part.producers.get(txn.producer_id)
        if entry is None or not entry.has_open_txn:
            return  # ended meanwhile
        marker = hanging_txns.store_abort_marker(entry, txn)
        if isinstance(marker, Rejection):
            if marker.code is not ErrorCode.INVALID_TXN_STATE:
                log.error("%s: no coordinator knows it, and %s", who, marker.message)
            return
        self._check_enough_replicas(part)
        now_ms = self._clock_ms()
        result = part.append_marker(marker, now_ms=now_ms,
                                    timestamp_ms=hanging_txns.STORE_ABORT_TIMESTAMP_MS)
        if not isinstance(result, Appended):
            raise InvariantViolation(f"{part.topic_partition}: a store's abort answered {result!r}")
        future = self._writer.submit(
            result.group,
            on_durable=_durable_callback(part, result.base_offset, result.next_offset))
        wait = part.track_pending(result.base_offset, result.next_offset, future)
        self._maybe_snapshot(part, now_ms)
        failed = (await self._await_durable({0: wait}, 0)).get(0)
        if failed is not None:
            raise failed
        metrics.AUTO_ABORTED_TRANSACTIONS.labels(part.topic.name, "store").inc()
        log.warning(
            "%s, past its timeout of %d ms plus the margin of %d ms: no transaction "
            "coordinator knows it (its record lost, or the producer moved on without its "
            "marker); aborted it here with an ABORT marker at offset %d (epoch %d, "
            "coordinator epoch %d)", who, self._hanging_policy.timeout_of(txn),
            self._hanging_policy.margin_ms, result.base_offset, marker.producer_epoch,
            marker.coordinator_epoch)


@dataclass(slots=True)
class _Deferred:
    """A produce item whose append waits (for verification or a gate)."""

    index: int
    item: ProduceItem
    part: PartitionRuntime
    result: VerifyFirst | WaitForGate
    # The gate this item holds (it opened it for its own verification).
    gate: asyncio.Future[None] | None


def _count_fetched(outcomes: Sequence[FetchOutcome]) -> None:
    for o in outcomes:
        if o.batches:
            metrics.FETCH_RECORDS.labels(o.topic).inc(o.record_count)
            metrics.FETCH_BYTES.labels(o.topic).inc(o.size_bytes)


def _durable_callback(
    part: PartitionRuntime, base_offset: int, next_offset: int
) -> Callable[[], None]:
    def on_durable() -> None:
        part.on_durable(base_offset, next_offset)

    return on_durable


__all__ = [
    "Duplicate", "FetchItem", "FetchOutcome", "Isolation", "MarkerItem", "MarkerOutcome",
    "OffsetOutcome", "OffsetQuery",
    "ProduceItem", "ProduceOutcome", "ProducersOutcome", "StoreConfig", "StoreRuntime",
    "TopicLookup", "TopicOutcome", "TopicSpec",
]
