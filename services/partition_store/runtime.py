"""The partition manager of one store node: a façade over its jobs.

StoreRuntime owns the lifecycle (start, begin_shutdown, close) and builds
the collaborators that do the work, each in its own module:

* shared.py: what every job shares (configuration, database, group-commit
  writer, clock, lifecycle flags, background tasks) and the hooks the
  server and the replica fetcher manager plug in (StoreHooks).
* catalog.py: topics, local partitions and their replication states;
  CreateTopics/DeleteTopics/CreatePartitions, the controller's catalog,
  resolving a request's partition.
* produce.py: appends, idempotence and transaction verification.
* transactions/markers.py: WriteTxnMarkers and hanging transactions.
* reads.py: Fetch (long polls), ListOffsets, DescribeProducers.
* replication/serving.py: what replication asks of the local logs (followers'
  fetches and fetch sessions as leader; replicated appends, truncation and
  reset as follower).
* housekeeping.py: snapshots, retention, compaction, catalog refresh, the
  hanging-transaction check's tick, resuming after a full disk.

* Start: load the topic catalog, recover every local partition (newest good
  snapshot + replay), create the internal topics (controller only), start
  the group-commit writer and the housekeeping task.
* Shutdown: refuse new writes, snapshot every partition, drain the writer.

Nothing here speaks gRPC: the servicer maps protos to these calls (api.py
holds their values), and the controller is reached through the
ControllerLink port.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..common.metadata.cluster import ClusterLayout
from . import metrics
from .api import ControllerLink
from .catalog import Catalog
from .core.producer_state import DEFAULT_PRODUCER_ID_EXPIRATION_MS
from .core.replicas import DEFAULT_REPLICA_LAG_TIME_MAX_MS
from .format_upgrade import upgrade_log_format
from .housekeeping import Housekeeping
from .log.partition import PartitionRuntime
from .produce import Producing
from .reads import Reads
from .replication.serving import ReplicaServing
from .replication.sessions import FetchSessions
from .shared import StoreHooks, StoreShared
from .storage.port import KeyValueStore
from .transactions.markers import TxnMarkers
from .transactions.resolver import TxnResolver
from .transactions.verifier import TxnVerifier

log = logging.getLogger("oncelog.partition_store")

DEFAULT_COMPACTION_INTERVAL_MS = 15_000
DEFAULT_COMPACTION_MAX_KEYS_PER_PASS = 200_000
DEFAULT_COMPACTION_CHUNK_BYTES = 4 * 1024 * 1024
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


class StoreRuntime:
    """One store node: builds its jobs (see the module docstring), runs
    their lifecycle, and answers every call by handing it to the job that
    owns it."""

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
        self.config = config
        self.layout = config.layout
        self.hooks = StoreHooks(config)
        shared = self._shared = StoreShared(store, config, clock_ms=clock_ms, hooks=self.hooks)
        self._controller = controller
        self._txn_verifier = txn_verifier
        self._txn_resolver = txn_resolver
        # As leader: each follower store's fetch session (replication/sessions.py).
        self._sessions = FetchSessions()
        self.catalog = Catalog(shared, controller=controller, sessions=self._sessions)
        self.producing = Producing(shared, self.catalog, txn_verifier=txn_verifier)
        self.markers = TxnMarkers(shared, self.catalog, txn_resolver=txn_resolver)
        self.reads = Reads(shared, self.catalog)
        self.replicas = ReplicaServing(shared, self.catalog, sessions=self._sessions)
        self.housekeeping = Housekeeping(shared, self.catalog, self.markers)
        self.recovery_replayed_batches = 0
        self.started = False
        # The calls, each answered by the job that owns it.
        catalog = self.catalog
        self.create_topics = catalog.create_topics
        self.delete_topics = catalog.delete_topics
        self.create_partitions = catalog.create_partitions
        self.refresh_catalog = catalog.refresh_catalog
        self.ensure_known = catalog.ensure_known
        self.topics = catalog.topics
        self.list_topics = catalog.list_topics
        self.metadata = catalog.metadata
        self.partition_state = catalog.partition_state
        self.partition_states = catalog.partition_states
        self.apply_learned_states = catalog.apply_learned_states
        self.alter_reassignments = catalog.alter_reassignments
        self.take_followers_behind = catalog.take_followers_behind
        self.produce = self.producing.produce
        self.write_txn_markers = self.markers.write_txn_markers
        self.check_hanging_txns = self.markers.check_hanging_txns
        self.fetch = self.reads.fetch
        self.list_offsets = self.reads.list_offsets
        self.describe_producers = self.reads.describe_producers
        replicas = self.replicas
        self.replica_fetch = replicas.replica_fetch
        self.replica_fetch_session = replicas.replica_fetch_session
        self.may_rejoin_isr = ReplicaServing.may_rejoin_isr
        self.offsets_for_leader_epoch = replicas.offsets_for_leader_epoch
        self.led_partition = replicas.led_partition
        self.follower_partition = replicas.follower_partition
        self.append_replicated = replicas.append_replicated
        self.truncate_replica = replicas.truncate_replica
        self.reset_replica = replicas.reset_replica
        self.snapshot_all = self.housekeeping.snapshot_all
        self.run_retention_once = self.housekeeping.run_retention_once
        self.run_compaction_once = self.housekeeping.run_compaction_once
        self.report_damage = shared.report_damage
        self.clock_ms = shared.clock_ms

    async def leader_of(self, topic: str, partition: int) -> int:
        """The store node that leads a partition in this store's view (-1:
        none now): where coordinators that follow leadership are
        (ClusterLayout.coordinator_now)."""
        return self.partition_state(topic, partition).leader

    async def start(self) -> None:
        """Loads the catalog and recovers every local partition, then starts
        the writer and the housekeeping task. A database written in the
        first record format is rewritten first (format_upgrade.py)."""
        shared = self._shared
        upgrade_log_format(shared.store)
        now_ms = shared.clock_ms()
        started_s = time.perf_counter()
        self.catalog.load(now_ms)
        self.recovery_replayed_batches = sum(
            p.recovery_replayed_batches for p in self.catalog.partitions.values()
        )
        metrics.RECOVERY_REPLAYED_BATCHES.set(self.recovery_replayed_batches)
        metrics.RECOVERY_DURATION_SECONDS.set(time.perf_counter() - started_s)
        shared.writer.start()
        if self.config.is_controller:
            await self.catalog.create_internal_topics()
        else:
            shared.spawn(self.catalog.refresh_quietly())
        self.housekeeping.start(now_ms)
        self.started = True
        log.info(
            "store node %d recovered %d partitions of %d topics, replayed %d batches",
            self.config.node_id, len(self.catalog.partitions), len(self.catalog.records),
            self.recovery_replayed_batches,
        )

    def begin_shutdown(self) -> None:
        """The first step of a graceful shutdown: refuse new writes and wake
        long-polls (they answer with what they have), while the writes already
        accepted still become durable and get their answers."""
        shared = self._shared
        if shared.closing:
            return
        shared.closing = True
        shared.closed_event.set()
        for part in self.catalog.partitions.values():
            part.wake_waiters()
        self._sessions.close_all()

    async def close(self, *, take_snapshots: bool = True) -> None:
        """Graceful shutdown: begin_shutdown, then snapshot every partition,
        drain the writer, close storage. Without take_snapshots the next
        start recovers as after a crash (tests)."""
        shared = self._shared
        if shared.closed:
            return
        shared.closed = True
        self.begin_shutdown()
        await self.housekeeping.stop()
        for task in list(shared.background):
            task.cancel()
        if self.started and shared.writer.failure is None:
            now_ms = shared.clock_ms()
            for part in self.catalog.partitions.values() if take_snapshots else ():
                group = part.build_snapshot(now_ms=now_ms)
                if group is not None:
                    shared.writer.submit(group)
            await shared.writer.close()
        if self._controller is not None:
            await self._controller.close()
        if self._txn_verifier is not None:
            await self._txn_verifier.close()
        if self._txn_resolver is not None:
            await self._txn_resolver.close()
        shared.store.close()

    def partition(self, topic: str, partition: int) -> PartitionRuntime:
        """The local runtime of a partition (tests and admin tools)."""
        return self.catalog.resolve(topic, partition)

    @property
    def partitions(self) -> list[PartitionRuntime]:
        return list(self.catalog.partitions.values())

    @property
    def group_commits(self) -> int:
        """Group commits written since start (each one RocksDB write)."""
        return self._shared.writer.group_commits

    @property
    def storage_writable(self) -> bool:
        """False while writes are refused (a full disk, a failed write): a
        follower must not fetch then, since its next fetch would tell the
        leader it holds what it could not write."""
        return self._shared.writer.failure is None

    @property
    def catalog_node_id(self) -> int:
        return self.catalog.catalog_node_id
