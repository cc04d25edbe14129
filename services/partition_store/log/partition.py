"""One partition owned by this store node: its offsets, producer state and
replication state, the I/O of appends, stored-batch reads and snapshots,
and the futures that wait on its high watermark. Jobs done over it live
beside it: recovery at open (log/loader.py), consumers' and
followers' reads (log/reads.py), retention and compaction planning
(log/cleaning.py).

Changes go through `_replay`, for data batches and markers alike. A live
append or marker is replayed into memory when it is accepted (so the next
batch of a pipelining producer is checked against it, and the log end offset
includes it), persisted by the group-commit writer, and acknowledged only when
`on_durable` has moved the high watermark past it. Recovery
(log/loader.py) runs the same `_replay` over the stored batches after
the newest good snapshot.

Transactions: the producer table tracks open transactions, the aborted index
(core/txn_index.py) the aborted ones, and the LSO follows from both (see
core/log_state.py). A producer's first transactional batch on the partition
waits for the coordinator's verification; while it waits, the producer's
later batches on this partition wait behind a per-producer gate (see
`append`), so they are checked against state that includes it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import enum
import logging
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass

from oncelog.wire.errors import ErrorCode
from oncelog.wire.records import (
    BatchHeader,
    control_marker,
    encode_control_batch,
    read_header,
    stamp_batch,
)

from ...common.kernel.errors import ServiceError
from ...common.kernel.invariants import invariant
from .. import metrics
from ..core.batches import check_produce_batch, stored_batch_damage
from ..core.codec import encode_offset, encode_partition_meta
from ..core.compaction import CompactionState, initial_state
from ..core.hanging_txns import OpenTxn, open_transactions
from ..core.leader_epochs import LeaderEpochCache, encode_epoch_entry
from ..core.log_state import LogState
from ..core.outcomes import Rejection
from ..core.producer_state import (
    MARKER_NAMES,
    Duplicate,
    DuplicateMarker,
    NeedsVerification,
    ProducerStateManager,
    TxnMarker,
)
from ..core.replicas import (
    FollowerFetch,
    PartitionState,
    caught_up_ms,
    effective_min_insync,
    high_watermark,
)
from ..core.snapshot import encode_snapshot
from ..core.topics import TopicRecord
from ..core.txn_index import AbortedIndex, AbortedTxn, encode_aborted_txn
from ..storage import keys
from ..storage.port import CorruptionError, KeyValueStore, WriteGroup

log = logging.getLogger("oncelog.partition_store.partition")

# How many snapshots a partition keeps: the newest, and one to fall back to.
SNAPSHOTS_KEPT = 2


class Isolation(enum.Enum):
    READ_UNCOMMITTED = 0
    READ_COMMITTED = 1


@dataclass(frozen=True, slots=True)
class Appended:
    """An accepted batch or marker: persist `group`, then call on_durable."""

    base_offset: int
    next_offset: int
    record_count: int
    size_bytes: int
    group: WriteGroup


@dataclass(frozen=True, slots=True)
class VerifyFirst:
    """The batch would open a transaction here: the coordinator must confirm
    the partition is in it; then `append` again with txn_verified=True."""

    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class WaitForGate:
    """An earlier batch of the same producer on this partition is waiting for
    verification: wait for `gate`, then `append` again."""

    gate: asyncio.Future[None]


class ReplicaNews(enum.Enum):
    """What a led partition tells the followers' fetch sessions (the
    runtime's `on_replica_news`): events, so that an idle partition costs its
    followers nothing (no polling)."""

    # New batches are durable here: a follower has something to copy.
    APPENDED = enum.auto()
    # The high watermark moved: followers learn it with their next answer.
    HIGH_WATERMARK = enum.auto()
    # Leadership or the leader epoch changed, or the partition closed: the
    # followers' fetches of it are answered (with the error) at once.
    STATE = enum.auto()


class PartitionRuntime:
    def __init__(
        self, topic: TopicRecord, partition: int, store: KeyValueStore, *,
        producers: ProducerStateManager, log_state: LogState,
        snapshot_offsets: list[int], aborted: AbortedIndex | None = None,
        compaction: CompactionState | None = None, last_batch_base_offset: int | None = None,
        epochs: LeaderEpochCache | None = None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.topic_partition = topic.topic_partition(partition)
        self._store = store
        self.producers = producers
        self.log = log_state
        self.aborted = aborted if aborted is not None else AbortedIndex(self.topic_partition)
        # epoch -> first offset of this replica's log (core/leader_epochs.py).
        self.epochs = epochs if epochs is not None else LeaderEpochCache(self.topic_partition)
        self.log.first_unstable_offset = producers.first_unstable_offset
        self.snapshot_offsets = snapshot_offsets
        # Cleaning progress (compacted topics; kept for every topic, so a
        # topic whose policy changes to compact starts from the log start).
        self.compaction = compaction or initial_state(log_state.log_start_offset)
        # The newest batch is never compacted: it fixes the log end offset.
        self.last_batch_base_offset = (
            log_state.log_start_offset if last_batch_base_offset is None
            else last_batch_base_offset
        )
        self.batches_since_snapshot = 0
        self.last_snapshot_ms = 0
        self._snapshot_dirty = False
        # Filled by recovery (log/loader.py): what the last start did,
        # for tests and metrics.
        self.recovery_replayed_batches = 0
        self.recovery_snapshot_offset: int | None = None
        self.recovery_corrupt_snapshots = 0
        # base_offset -> the future of its group commit, until durable.
        self._pending: dict[int, asyncio.Future[None]] = {}
        # Waiter sets are dicts (insertion-ordered): they are woken in the
        # order they came, not in an order of memory addresses, so a run of
        # the deterministic simulation replays the same.
        self._hw_waiters: dict[asyncio.Future[None], None] = {}
        # read_committed long-polls wait for the LSO, not the HW.
        self._lso_waiters: dict[asyncio.Future[None], None] = {}
        # producer id -> the verification its first transactional batch here
        # is waiting for; that producer's later appends wait for it.
        self._gates: dict[int, asyncio.Future[None]] = {}
        # producer id -> the timeout of its open transaction here, as its
        # coordinator told the verification (memory only: a restart or a
        # new leader falls back to the bound; core/hanging_txns.py).
        self.txn_timeouts_ms: dict[int, int] = {}
        self.closed = False
        # Replication (docs/replication.md). `state` is this replica's view of
        # who leads at which epoch and who is in sync; set by the runtime.
        # Until then the partition is its own single copy.
        self.node_id = -1
        self.state = PartitionState((-1,), -1, 0, (-1,))
        self.min_insync_replicas = 1
        # As leader: each follower's log end offset (from its last fetch) and
        # when it last reached the leader's log end.
        self.follower_end_offsets: dict[int, int] = {}
        self.last_caught_up_ms: dict[int, int] = {}
        # As leader: each follower's last fetch (where this log ended then).
        self.follower_fetches: dict[int, FollowerFetch] = {}
        # As leader: followers it has asked the metadata store to add to the
        # ISR while that change is not yet its state (replica -> when it
        # asked). The HW counts them from the moment it asks (Kafka's maximal
        # ISR, KIP-497): once the change commits, the controller may elect
        # one of them before this leader hears of it, and an elected replica
        # must hold every record acknowledged. Cleared by the next state.
        self.isr_additions_in_flight: dict[int, int] = {}
        # As follower: the leader's high watermark from its last answer.
        self.leader_high_watermark = 0
        # (next_offset, base_offset, future) of appends waiting for the HW,
        # in offset order.
        self._acks: collections.deque[tuple[int, int, asyncio.Future[None]]] = (
            collections.deque()
        )
        # Replica fetches waiting for more durable data.
        self._durable_waiters: dict[asyncio.Future[None], None] = {}
        # Replicated stores: told of appends, HW moves and state changes
        # (with the durable end offset before an append), for the followers'
        # fetch sessions and the ISR check (runtime.py).
        self.on_replica_news: Callable[[PartitionRuntime, ReplicaNews, int], None] | None = None
        self._log_prefix = keys.partition_prefix(keys.LOG, topic.topic_id, partition)
        labels = (topic.name, str(partition))
        self._hw_gauge = metrics.HIGH_WATERMARK.labels(*labels)
        self._start_gauge = metrics.LOG_START_OFFSET.labels(*labels)
        self._size_gauge = metrics.LOG_SIZE_BYTES.labels(*labels)
        self._records_counter = metrics.PRODUCE_RECORDS.labels(topic.name)
        self._bytes_counter = metrics.PRODUCE_BYTES.labels(topic.name)
        self._duplicates_counter = metrics.PRODUCE_DUPLICATES.labels(topic.name)
        # Per-topic counters exist from the topic's first partition on, so
        # rate() sees their first increment (a series born with its first
        # event would hide it).
        metrics.FETCH_RECORDS.labels(topic.name)
        metrics.FETCH_BYTES.labels(topic.name)
        metrics.RETENTION_DELETED_BATCHES.labels(topic.name)
        for marker_name in MARKER_NAMES.values():
            metrics.TXN_MARKERS_WRITTEN.labels(topic.name, marker_name.lower())
        for resolution in metrics.HANGING_RESOLUTIONS:
            metrics.AUTO_ABORTED_TRANSACTIONS.labels(topic.name, resolution)
        metrics.ISR_SHRINKS.labels(topic.name)
        metrics.ISR_EXPANDS.labels(topic.name)
        metrics.TRUNCATIONS.labels(topic.name)
        self._lso_gauge = metrics.LAST_STABLE_OFFSET.labels(*labels)
        self._unstable_gauge = metrics.UNSTABLE_OFFSETS.labels(*labels)
        self._open_txns_gauge = metrics.OPEN_TRANSACTIONS.labels(*labels)
        self._txn_age_gauge = metrics.OLDEST_OPEN_TXN_AGE_SECONDS.labels(*labels)
        self._update_gauges()

    # --------------------------------------------------------------- append

    def append(
        self, batch: bytes, *, expected_log_end_offset: int | None, now_ms: int,
        transactional_id: str = "", txn_verified: bool = False,
        own_gate: asyncio.Future[None] | None = None,
    ) -> Appended | Duplicate | VerifyFirst | WaitForGate:
        """Checks a produced batch and, when accepted, replays it into memory
        and returns the writes that persist it. Raises ServiceError otherwise;
        a refused batch changes nothing. Returns VerifyFirst / WaitForGate
        (having changed nothing) when the batch must wait: see the runtime.

        Nothing here awaits, so per-partition order is call order. The gate
        keeps that order across a verification: while a producer's first
        transactional batch here waits for the coordinator, its later batches
        (up to five in flight) wait for the gate instead of being checked
        against state that does not include the first one yet. `own_gate` is
        the gate the caller itself holds."""
        if self.closed:
            raise ServiceError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"{self.topic_partition} was deleted from this node",
            )
        checked = check_produce_batch(
            batch, topic_partition=self.topic_partition,
            max_message_bytes=self.topic.config.max_message_bytes,
            require_keys=self.topic.compacted,
        )
        if isinstance(checked, Rejection):
            raise ServiceError(checked.code, checked.message)
        if checked.is_transactional and not transactional_id:
            raise ServiceError(
                ErrorCode.INVALID_REQUEST,
                f"producer {checked.producer_id} (epoch {checked.producer_epoch}) on "
                f"{self.topic_partition}: a transactional batch needs the request's "
                "transactional_id",
            )
        if self._gates:
            gate = self._gates.get(checked.producer_id)
            if gate is not None and gate is not own_gate:
                return WaitForGate(gate)
        # A conditional append is a coordinator's own write, exactly-once by
        # its condition: no sequence rules (core/producer_state.py).
        decision = self.producers.check_append(
            checked, txn_verified=txn_verified, sequenced=expected_log_end_offset is None)
        if isinstance(decision, Rejection):
            raise ServiceError(decision.code, decision.message)
        if isinstance(decision, NeedsVerification):
            return VerifyFirst(checked.producer_id, checked.producer_epoch)
        if isinstance(decision, Duplicate):
            self._duplicates_counter.inc()
            return decision
        if (
            expected_log_end_offset is not None
            and expected_log_end_offset != self.log.log_end_offset
        ):
            raise ServiceError(
                ErrorCode.LOG_END_OFFSET_MISMATCH,
                f"{self.topic_partition}: expected log end offset {expected_log_end_offset}, "
                f"but it is {self.log.log_end_offset}",
            )
        base_offset = self.log.log_end_offset
        epoch = self.state.leader_epoch
        stored = stamp_batch(batch, base_offset=base_offset, leader_epoch=epoch)
        header = dataclasses.replace(checked, base_offset=base_offset,
                                     partition_leader_epoch=epoch)
        group = self._replay(header, None, now_ms)
        self._add_stored(header, stored, group)
        self._records_counter.inc(header.record_count)
        self._bytes_counter.inc(len(stored))
        return Appended(
            base_offset=base_offset, next_offset=header.next_offset,
            record_count=header.record_count, size_bytes=len(stored), group=group,
        )

    def append_marker(self, marker: TxnMarker, *, now_ms: int,
                      timestamp_ms: int | None = None) -> Appended | DuplicateMarker:
        """Checks a COMMIT/ABORT marker (core/producer_state.py) and, when
        accepted, appends its control batch: replayed into memory now (the
        producer's epoch and open transaction, the aborted index, the LSO's
        inputs), persisted with its aborted-index entry in one write group.
        Raises ServiceError when refused; a refused marker changes nothing.
        `timestamp_ms`: the control batch's timestamp (None: version 1's
        decision's, else the store's clock; the store's own abort of a
        hanging transaction gives its own, core/hanging_txns.py)."""
        if self.closed:
            raise ServiceError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"{self.topic_partition} was deleted from this node",
            )
        decision = self.producers.check_marker(marker)
        if isinstance(decision, Rejection):
            raise ServiceError(decision.code, decision.message)
        if isinstance(decision, DuplicateMarker):
            return decision
        base_offset = self.log.log_end_offset
        stored = encode_control_batch(
            marker=marker.control_type, coordinator_epoch=marker.coordinator_epoch,
            producer_id=marker.producer_id, producer_epoch=marker.producer_epoch,
            # A version-1 marker's timestamp is its decision's, which the marker
            # rules compare (core/producer_state.py); it travels in the batch.
            timestamp_ms=(timestamp_ms if timestamp_ms is not None
                          else marker.timestamp_ms if marker.is_version_1 else now_ms),
            base_offset=base_offset, leader_epoch=self.state.leader_epoch,
        )
        header = read_header(stored)
        group = self._replay(header, (marker.control_type, marker.coordinator_epoch), now_ms)
        self._add_stored(header, stored, group)
        metrics.TXN_MARKERS_WRITTEN.labels(
            self.topic.name, MARKER_NAMES[marker.control_type].lower()
        ).inc()
        return Appended(
            base_offset=base_offset, next_offset=header.next_offset,
            record_count=header.record_count, size_bytes=len(stored), group=group,
        )

    def _replay(
        self, header: BatchHeader, control: tuple[int, int] | None, now_ms: int, *,
        recovering: bool = False, allow_gap: bool = False,
    ) -> WriteGroup:
        """Applies one stored batch (data or control) to memory: the offsets,
        producer state, aborted index and LSO inputs. The same code for live
        appends and recovery. Returns the writes that go with it beyond the
        batch itself (an aborted-index entry; also the time-index entry when
        the batch raised the running max timestamp)."""
        group = WriteGroup()
        tid, p = self.topic.topic_id, self.partition
        self.last_batch_base_offset = header.base_offset
        # Recovery finds the cache on disk already (written with the batches).
        if not recovering and header.partition_leader_epoch >= 0 and self.epochs.assign(
                header.partition_leader_epoch, header.base_offset):
            self.add_epoch_writes(group)
        if self.log.replay_append(header, recovering=recovering or allow_gap):
            group.put(
                keys.time_index_key(tid, p, header.max_timestamp_ms),
                encode_offset(header.base_offset),
            )
        completed = self.producers.replay(header, header.base_offset, now_ms, control=control)
        if completed is not None:
            self.txn_timeouts_ms.pop(completed.producer_id, None)
        if completed is not None and completed.aborted:
            entry = AbortedTxn(
                completed.producer_id, completed.first_offset, completed.last_offset,
                completed.last_stable_offset,
            )
            stored = self.aborted.get(entry.last_offset) if recovering else None
            if stored is None:
                self.aborted.add(entry)
                group.put(keys.aborted_txn_key(tid, p, entry.last_offset),
                          encode_aborted_txn(entry))
            elif stored != entry:
                # The key was written with the marker, atomically: it is what
                # readers used before the restart, so it stays. A difference
                # means the replay started from a different point (a fallback
                # past retention); worth knowing, not worth refusing to start.
                log.warning("%s: aborted transaction at %d recomputed as %s, stored as %s; "
                            "keeping the stored one", self.topic_partition, entry.last_offset,
                            entry, stored)
        self.batches_since_snapshot += 1
        self._snapshot_dirty = True
        if header.is_transactional:
            # Only transactional batches (markers included) open or end
            # transactions; skipping the rest keeps the hot path lean.
            self.sync_unstable()
        return group

    def replay_stored(
        self, header: BatchHeader, control: tuple[int, int] | None, now_ms: int,
    ) -> None:
        """Recovery's replay (log/loader.py) of one batch found on disk:
        the same `_replay` as a live append. What `_replay` would write with
        the batch (its index entries) is stored already, so it is dropped."""
        self._replay(header, control, now_ms, recovering=True)

    def _add_stored(self, header: BatchHeader, stored: bytes, group: WriteGroup) -> None:
        """Adds the batch itself and the partition meta to a live write group."""
        tid, p = self.topic.topic_id, self.partition
        self.log.add_size(len(stored))
        group.put(keys.log_key(tid, p, header.base_offset), stored)
        group.put(keys.meta_key(tid, p), self.meta_value())

    def sync_unstable(self) -> None:
        """Copies the producer table's first unstable offset into the offsets
        (the LSO's input) and refreshes the transaction gauges (the age of the
        oldest open transaction needs a clock: the runtime's housekeeping
        refreshes it through update_txn_age)."""
        self.log.first_unstable_offset = self.producers.first_unstable_offset
        lso = self.log.last_stable_offset
        self._lso_gauge.set(lso)
        self._unstable_gauge.set(self.log.high_watermark - lso)
        self._open_txns_gauge.set(self.producers.open_txn_count)

    def update_txn_age(self, now_ms: int) -> None:
        """Sets the oldest-open-transaction age gauge (O(open transactions))."""
        oldest = self.producers.oldest_open_txn_start_ms()
        self._txn_age_gauge.set(0 if oldest is None else max(0, now_ms - oldest) / 1000)

    # ------------------------------------------------- verification gates

    def open_transactions(self) -> list[OpenTxn]:
        """The transactions open here, oldest first, with the timeouts their
        coordinators told this store (O(open transactions))."""
        return open_transactions(self.producers.open_entries(), self.txn_timeouts_ms)

    def open_verification_gate(self, producer_id: int) -> asyncio.Future[None]:
        """Makes the producer's later appends here wait (see `append`)."""
        invariant(
            producer_id not in self._gates,
            lambda: f"{self.topic_partition}: producer {producer_id} already has a "
            "verification gate",
        )
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._gates[producer_id] = gate
        return gate

    def close_verification_gate(self, producer_id: int, gate: asyncio.Future[None]) -> None:
        """Lets the waiting appends go, in the order they came."""
        if self._gates.get(producer_id) is gate:
            del self._gates[producer_id]
        if not gate.done():
            gate.set_result(None)

    @property
    def is_leader(self) -> bool:
        return self.state.leader == self.node_id

    def set_state(self, state: PartitionState, *, node_id: int, min_insync_replicas: int,
                  now_ms: int) -> WriteGroup | None:
        """Takes the partition's replication state (the runtime calls this on
        every change it learns of). Becoming leader starts the followers'
        lag clocks now; losing leadership fails the appends still waiting
        for the HW (the new leader has them, or the producer's retry will
        put them there, deduplicated)."""
        was_leader = self.node_id >= 0 and self.is_leader
        epoch_changed = state.leader_epoch != self.state.leader_epoch
        if state != self.state:
            # The change this leader asked for has committed (the followers
            # are in `state.isr` now), or another one came first: either way
            # the new state is the truth.
            self.isr_additions_in_flight = {}
        self.node_id = node_id
        self.state = state
        self.min_insync_replicas = effective_min_insync(min_insync_replicas, len(state.replicas))
        group = None
        if self.is_leader:
            if not was_leader or epoch_changed:
                self.follower_end_offsets = {}
                self.follower_fetches = {}
                self.last_caught_up_ms = {r: now_ms for r in state.isr}
                # The new epoch starts at the log end, before any batch of
                # it (Kafka's makeLeader), so followers asking about it get
                # an answer at once.
                if state.leader_epoch > self.epochs.latest_epoch:
                    self.epochs.assign(state.leader_epoch, self.log.log_end_offset)
                    group = WriteGroup()
                    self.add_epoch_writes(group)
            for replica in state.isr:
                self.last_caught_up_ms.setdefault(replica, now_ms)
            self.update_high_watermark()
        elif was_leader:
            self.fail_acks(ServiceError(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"{self.topic_partition}: store node {node_id} stopped leading (leader epoch "
                f"{state.leader_epoch}, leader {state.leader}) before the append was "
                "replicated; retry (the retry is deduplicated)",
            ))
            self.wake_waiters()
        if self.on_replica_news is not None and (
                epoch_changed or was_leader != self.is_leader):
            self.on_replica_news(self, ReplicaNews.STATE, -1)
        return group

    def add_epoch_writes(self, group: WriteGroup) -> None:
        """Rewrites the stored leader-epoch cache whole (one key per leader
        change, so it stays small) in `group`, beside the change that
        caused it."""
        tid, p = self.topic.topic_id, self.partition
        prefix = keys.partition_prefix(keys.LEADER_EPOCH, tid, p)
        group.delete_range(prefix, keys.next_prefix(prefix))
        for entry in self.epochs.entries:
            group.put(keys.leader_epoch_key(tid, p, entry.epoch), encode_epoch_entry(entry))

    def track_pending(self, base_offset: int, next_offset: int,
                      written: asyncio.Future[None]) -> asyncio.Future[None]:
        """The future of an accepted append: done when the HW passes it (the
        write failing fails it too)."""
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # The request may have stopped waiting (timed out) before a failure.
        ack.add_done_callback(_retrieve)
        self._acks.append((next_offset, base_offset, ack))
        self._pending[base_offset] = ack

        def on_written(done: asyncio.Future[None]) -> None:
            if not ack.done() and not done.cancelled() and done.exception() is not None:
                ack.set_exception(done.exception())  # type: ignore[arg-type]

        written.add_done_callback(on_written)
        return ack

    def pending_future(self, base_offset: int) -> asyncio.Future[None] | None:
        """The acknowledgement a duplicate's original is still waiting for."""
        return self._pending.get(base_offset)

    def on_durable(self, base_offset: int, next_offset: int) -> None:
        """Called by the writer, in offset order, once a batch is durable."""
        if self.closed:
            return
        durable_before = self.log.durable_end_offset
        self.log.mark_locally_durable(next_offset)
        self._wake(self._durable_waiters)
        self.update_high_watermark()
        if self.on_replica_news is not None:
            self.on_replica_news(self, ReplicaNews.APPENDED, durable_before)

    def update_high_watermark(self) -> bool:
        """Moves the HW to what replication allows (core/replicas.py): as
        leader the least log end offset over the ISR, as follower the
        leader's HW, never past what is durable here. Wakes readers and
        completes the appends it passed. Returns True when it moved."""
        durable = self.log.durable_end_offset
        if self.node_id < 0 or self.is_leader:
            target = high_watermark(
                current=self.log.high_watermark, leader=self.node_id,
                leader_end_offset=durable,
                isr=self.maximal_isr if self.node_id >= 0 else (),
                follower_end_offsets=self.follower_end_offsets,
            )
        else:
            target = min(durable, self.leader_high_watermark)
        lso_before = self.log.last_stable_offset
        if not self.log.advance_high_watermark(min(target, durable)):
            return False
        self.producers.on_high_watermark(self.log.high_watermark)
        self.sync_unstable()
        self._hw_gauge.set(self.log.high_watermark)
        self._size_gauge.set(self.log.size_bytes)
        self._wake(self._hw_waiters)
        if self.log.last_stable_offset != lso_before:
            self._wake(self._lso_waiters)
        self._complete_acks()
        if self.on_replica_news is not None:
            self.on_replica_news(self, ReplicaNews.HIGH_WATERMARK, -1)
        return True

    def _complete_acks(self) -> None:
        hw = self.log.high_watermark
        too_few = self.node_id >= 0 and len(self.state.isr) < self.min_insync_replicas
        while self._acks and self._acks[0][0] <= hw:
            _next, base_offset, ack = self._acks.popleft()
            self._pending.pop(base_offset, None)
            if ack.done():
                continue
            if too_few:
                # Kafka's NOT_ENOUGH_REPLICAS_AFTER_APPEND: the HW passed it
                # with fewer copies than min.insync.replicas promises.
                ack.set_exception(ServiceError(
                    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                    f"{self.topic_partition}: appended at offset {base_offset}, but only "
                    f"{len(self.state.isr)} replicas {list(self.state.isr)} are in sync "
                    f"(min.insync.replicas {self.min_insync_replicas}); retry (the retry is "
                    "deduplicated)",
                ))
            else:
                ack.set_result(None)

    def fail_acks(self, error: ServiceError) -> None:
        """Fails every append still waiting for the HW."""
        while self._acks:
            _next, base_offset, ack = self._acks.popleft()
            self._pending.pop(base_offset, None)
            if not ack.done():
                ack.set_exception(error)

    def record_follower_fetch(self, replica: int, fetch_offset: int, now_ms: int) -> None:
        """As leader: a follower asked for `fetch_offset`, so it holds
        everything below it. It counts as caught up when that reaches the
        log end, or where the log ended at its previous fetch (Kafka's
        lastCaughtUpTime; core/replicas.py's caught_up_ms)."""
        self.follower_end_offsets[replica] = fetch_offset
        leader_end = self.log.durable_end_offset
        caught_up = caught_up_ms(fetch_offset=fetch_offset, leader_end_offset=leader_end,
                                 now_ms=now_ms, previous=self.follower_fetches.get(replica))
        if caught_up is not None:
            self.last_caught_up_ms[replica] = max(
                self.last_caught_up_ms.get(replica, caught_up), caught_up)
        self.follower_fetches[replica] = FollowerFetch(leader_end, now_ms)
        self.update_high_watermark()

    def note_appended(self, durable_before: int, now_ms: int) -> None:
        """As leader, when the log end moved from `durable_before`: the
        followers that had reached it were caught up until now. Their lag
        clock starts here, not at their last fetch, which on a partition
        idle for long may lie far back (an idle follower does not fetch)."""
        for replica, end_offset in self.follower_end_offsets.items():
            if end_offset >= durable_before:
                self.last_caught_up_ms[replica] = now_ms

    @property
    def maximal_isr(self) -> tuple[int, ...]:
        """As leader: the ISR and the followers on their way into it, the
        replicas the HW waits for."""
        if not self.isr_additions_in_flight:
            return self.state.isr
        return (*self.state.isr,
                *(r for r in self.isr_additions_in_flight if r not in self.state.isr))

    def begin_isr_additions(self, replicas: Collection[int], now_ms: int) -> None:
        """As leader, before asking the metadata store to add `replicas`."""
        for replica in replicas:
            self.isr_additions_in_flight.setdefault(replica, now_ms)

    def end_isr_additions(self, replicas: Collection[int]) -> None:
        """The addition was refused (nothing was written): the HW no longer
        waits for them."""
        for replica in replicas:
            self.isr_additions_in_flight.pop(replica, None)
        self.update_high_watermark()

    def expire_isr_additions(self, now_ms: int, after_ms: int) -> None:
        """Additions whose outcome never arrived (the write's answer was
        lost and no new state came): after `after_ms` a committed change
        would have reached this leader's view long since, so they did not
        commit, and a follower that has died since must not hold the HW."""
        stale = [r for r, asked_ms in self.isr_additions_in_flight.items()
                 if now_ms - asked_ms > after_ms]
        if stale:
            self.end_isr_additions(stale)

    def followers_behind(self) -> bool:
        """As leader: whether an in-sync follower (or one on its way in)
        lacks part of the durable log (only such partitions need the ISR's
        lag check)."""
        end_offset = self.log.durable_end_offset
        return any(
            self.follower_end_offsets.get(replica, -1) < end_offset
            for replica in self.maximal_isr if replica != self.node_id)

    def add_durable_waiter(self, waiter: asyncio.Future[None]) -> None:
        self._durable_waiters[waiter] = None

    def remove_durable_waiter(self, waiter: asyncio.Future[None]) -> None:
        self._durable_waiters.pop(waiter, None)

    # ---------------------------------------------------------- replication

    def append_replicated(self, stored: bytes, *, now_ms: int) -> Appended:
        """A follower's append of a batch as its leader stored it: the same
        offsets, the same bytes, replayed into memory through the same
        `_replay` as a live append or recovery, so producer state, the
        aborted index and the LSO match the leader's. The leader has checked
        it; here only its place is checked (it starts at or after the log
        end: the leader's compaction may have left a gap)."""
        header = read_header(stored)
        if header.base_offset < self.log.log_end_offset:
            raise ServiceError(
                ErrorCode.CORRUPT_MESSAGE,
                f"{self.topic_partition}: the leader sent a batch at offset "
                f"{header.base_offset}, below this replica's log end offset "
                f"{self.log.log_end_offset}",
            )
        control = control_marker(stored) if header.is_control else None
        group = self._replay(header, control, now_ms, allow_gap=True)
        self._add_stored(header, stored, group)
        return Appended(
            base_offset=header.base_offset, next_offset=header.next_offset,
            record_count=header.record_count, size_bytes=len(stored), group=group,
        )

    def meta_value(self) -> bytes:
        """The partition meta's value (`M`: log start offset, stored size)."""
        return encode_partition_meta(self.log.log_start_offset, self.log.size_bytes)

    # ------------------------------------------------------ stored batches

    @property
    def store(self) -> KeyValueStore:
        """The node's database, which holds this partition's keys."""
        return self._store

    def _batches_from(self, offset: int, upper: int) -> Iterator[tuple[BatchHeader, bytes]]:
        """Stored batches from the one holding `offset` up to `upper`
        (exclusive), each checked against its CRC32C: a damaged one raises
        CorruptionError (RocksDB's own checksums raise it too) and is never
        returned."""
        tid, p = self.topic.topic_id, self.partition
        start_key = keys.log_key(tid, p, offset)
        prev = self._store.seek_for_prev(start_key, self._log_prefix)
        if prev is not None:
            self._check_stored(*prev)
            if read_header(prev[1]).next_offset > offset:
                start_key = prev[0]
        for key, value in self._store.scan(start_key, keys.log_key(tid, p, upper)):
            self._check_stored(key, value)
            yield read_header(value), value

    def _check_stored(self, key: bytes, value: bytes) -> None:
        damage = stored_batch_damage(value)
        if damage is not None:
            raise CorruptionError(
                f"{self.topic_partition}: the batch at offset {keys.log_key_offset(key)}: "
                f"{damage}", path=self._store.locate(key))

    def read_stored(
        self, start_offset: int, end_offset: int
    ) -> Iterator[tuple[BatchHeader, bytes]]:
        """Stored batches from the one holding start_offset, below end_offset,
        each checked (`_batches_from`): what reads (log/reads.py) and
        the cleaner read."""
        return self._batches_from(start_offset, end_offset)

    def stored_batch(self, base_offset: int) -> bytes | None:
        return self._store.get(keys.log_key(self.topic.topic_id, self.partition, base_offset))

    # -------------------------------------------------------- long polling

    def add_waiter(self, waiter: asyncio.Future[None], isolation: Isolation) -> None:
        """Wakes `waiter` when what `isolation` can read grows: the HW, or the
        LSO under read_committed."""
        if isolation is Isolation.READ_COMMITTED:
            self._lso_waiters[waiter] = None
        else:
            self._hw_waiters[waiter] = None

    def remove_waiter(self, waiter: asyncio.Future[None]) -> None:
        self._hw_waiters.pop(waiter, None)
        self._lso_waiters.pop(waiter, None)

    def wake_waiters(self) -> None:
        self._wake(self._hw_waiters)
        self._wake(self._lso_waiters)
        self._wake(self._durable_waiters)

    @staticmethod
    def _wake(waiters: dict[asyncio.Future[None], None]) -> None:
        pending = list(waiters)
        waiters.clear()
        for waiter in pending:
            if not waiter.done():
                waiter.set_result(None)

    # ------------------------------------------------------------ snapshots

    def snapshot_due(self, *, now_ms: int, every_batches: int, every_ms: int) -> bool:
        if not self._snapshot_dirty:
            return False
        return (
            self.batches_since_snapshot >= every_batches
            or now_ms - self.last_snapshot_ms >= every_ms
        )

    def build_snapshot(self, *, now_ms: int, force: bool = False) -> WriteGroup | None:
        """The writes of a producer-state snapshot as of the log end offset
        (pending batches included: the writer persists them first), plus the
        deletion of snapshots beyond the newest SNAPSHOTS_KEPT."""
        if not (self._snapshot_dirty or force):
            return None
        offset = self.log.log_end_offset
        tid, p = self.topic.topic_id, self.partition
        group = WriteGroup()
        group.put(
            keys.snapshot_key(tid, p, offset),
            encode_snapshot(offset, self.producers.entries(), self.producers.unreplicated()),
        )
        offsets = sorted({*self.snapshot_offsets, offset})
        for old in offsets[:-SNAPSHOTS_KEPT]:
            group.delete(keys.snapshot_key(tid, p, old))
        self.snapshot_offsets = offsets[-SNAPSHOTS_KEPT:]
        self.batches_since_snapshot = 0
        self.last_snapshot_ms = now_ms
        self._snapshot_dirty = False
        metrics.SNAPSHOTS_TAKEN.inc()
        return group

    @property
    def newest_snapshot_offset(self) -> int | None:
        return self.snapshot_offsets[-1] if self.snapshot_offsets else None

    def expire_producers(self, *, now_ms: int, expiration_ms: int,
                         verifying: Collection[int] = ()) -> list[int]:
        """Drops idle producers, except those whose first transactional write
        here waits for the coordinator's verification (this runtime's gates,
        and `verifying` for a caller that keeps its own): a marker that lands
        while the question is out records the epoch that fences the batch when
        its verdict comes back, and forgetting it would let a verdict that was
        true when given open a transaction after that transaction ended
        (docs/coordinator.md, "Verification")."""
        keep = set(self._gates).union(verifying) if self._gates or verifying else ()
        expired = self.producers.remove_expired(now_ms, expiration_ms, keep)
        if expired:
            self._snapshot_dirty = True
        return expired

    # --------------------------------------------------------- log rewrites

    def move_log_start(self, new_start: int, deleted_bytes: int, group: WriteGroup) -> None:
        """Retention's change to the offsets (log/cleaning.py, which
        deletes the batches below `new_start`): readers waiting for the LSO
        are woken if it moved, and the partition meta goes into `group`."""
        lso_before = self.log.last_stable_offset
        self.log.replay_truncate_start(new_start, deleted_bytes)
        self.sync_unstable()
        if self.log.last_stable_offset != lso_before:
            self._wake(self._lso_waiters)
        group.put(keys.meta_key(self.topic.topic_id, self.partition), self.meta_value())
        self._update_gauges()

    def on_compaction_durable(self, removed_aborted_txns: Sequence[int]) -> None:
        """A chunk is written: forget the aborted transactions whose ABORT
        marker it removed (their records went earlier or with it, so until
        now the entries only filtered batches that were still there)."""
        for last_offset in removed_aborted_txns:
            self.aborted.remove(last_offset)
        if not self.closed:
            self._size_gauge.set(self.log.size_bytes)

    # ------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """The partition is gone from this node (topic deleted or moved)."""
        self.closed = True
        self.wake_waiters()
        if self.on_replica_news is not None:
            self.on_replica_news(self, ReplicaNews.STATE, -1)
        labels = (self.topic.name, str(self.partition))
        for gauge in (
            metrics.HIGH_WATERMARK, metrics.LOG_START_OFFSET, metrics.LOG_SIZE_BYTES,
            metrics.LAST_STABLE_OFFSET, metrics.UNSTABLE_OFFSETS, metrics.OPEN_TRANSACTIONS,
            metrics.OLDEST_OPEN_TXN_AGE_SECONDS,
        ):
            with contextlib.suppress(KeyError):
                gauge.remove(*labels)

    def _update_gauges(self) -> None:
        self._hw_gauge.set(self.log.high_watermark)
        self._start_gauge.set(self.log.log_start_offset)
        self._size_gauge.set(self.log.size_bytes)
        self.sync_unstable()


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()
