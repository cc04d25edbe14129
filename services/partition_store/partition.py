"""One partition owned by this store node: its offsets, producer state, the
I/O around them (recovery, reads, snapshots, retention), and the futures that
wait on its high watermark.

Changes go through the core's replay methods. A live append is replayed into
memory when it is accepted (so the next batch of a pipelining producer is
checked against it, and the log end offset includes it), persisted by the
group-commit writer, and acknowledged only when `on_durable` has moved the
high watermark past it. Recovery runs the same replay over the stored batches
after the newest good snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from oncelog.errors import ErrorCode
from oncelog.records import BatchHeader, iter_records, read_header, with_base_offset
from services.common.errors import ServiceError, invariant
from services.partition_store import metrics
from services.partition_store.core.batches import check_produce_batch
from services.partition_store.core.codec import (
    CorruptValueError,
    decode_offset,
    decode_partition_meta,
    encode_offset,
    encode_partition_meta,
)
from services.partition_store.core.log_state import (
    BatchInfo,
    LogState,
    RetentionPlan,
    plan_retention,
)
from services.partition_store.core.outcomes import Rejection
from services.partition_store.core.producer_state import (
    Duplicate,
    ProducerStateManager,
)
from services.partition_store.core.snapshot import (
    SnapshotError,
    decode_snapshot,
    encode_snapshot,
)
from services.partition_store.core.topics import TopicRecord
from services.partition_store.storage import keys
from services.partition_store.storage.port import KeyValueStore, WriteGroup

log = logging.getLogger("oncelog.partition_store.partition")

# How many snapshots a partition keeps: the newest, and one to fall back to.
SNAPSHOTS_KEPT = 2
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
_MAX_KEY_TAIL = (1 << 64) - 1


class Isolation(enum.Enum):
    READ_UNCOMMITTED = 0
    READ_COMMITTED = 1


@dataclass(frozen=True, slots=True)
class Appended:
    """An accepted batch: persist `group`, then call on_durable."""

    base_offset: int
    next_offset: int
    record_count: int
    size_bytes: int
    group: WriteGroup


@dataclass(frozen=True, slots=True)
class FetchRead:
    batches: list[bytes]
    size_bytes: int
    next_fetch_offset: int


class PartitionRuntime:
    def __init__(
        self, topic: TopicRecord, partition: int, store: KeyValueStore, *,
        producers: ProducerStateManager, log_state: LogState,
        snapshot_offsets: list[int],
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.topic_partition = topic.topic_partition(partition)
        self._store = store
        self.producers = producers
        self.log = log_state
        self.snapshot_offsets = snapshot_offsets
        self.batches_since_snapshot = 0
        self.last_snapshot_ms = 0
        self._snapshot_dirty = False
        # Filled by recover(): what the last start did, for tests and metrics.
        self.recovery_replayed_batches = 0
        self.recovery_snapshot_offset: int | None = None
        self.recovery_corrupt_snapshots = 0
        # base_offset -> the future of its group commit, until durable.
        self._pending: dict[int, asyncio.Future[None]] = {}
        self._hw_waiters: set[asyncio.Future[None]] = set()
        self.closed = False
        self._log_prefix = keys.partition_prefix(keys.LOG, topic.topic_id, partition)
        self._log_end_key = keys.log_key_end(topic.topic_id, partition)
        labels = (topic.name, str(partition))
        self._hw_gauge = metrics.HIGH_WATERMARK.labels(*labels)
        self._start_gauge = metrics.LOG_START_OFFSET.labels(*labels)
        self._size_gauge = metrics.LOG_SIZE_BYTES.labels(*labels)
        self._records_counter = metrics.PRODUCE_RECORDS.labels(topic.name)
        self._bytes_counter = metrics.PRODUCE_BYTES.labels(topic.name)
        self._duplicates_counter = metrics.PRODUCE_DUPLICATES.labels(topic.name)
        self._update_gauges()

    # ------------------------------------------------------------- recovery

    @classmethod
    def recover(
        cls, topic: TopicRecord, partition: int, store: KeyValueStore, *, now_ms: int,
        producer_id_expiration_ms: int,
    ) -> PartitionRuntime:
        """Loads the newest good snapshot and replays the batches after it.
        A snapshot that does not decode falls back to the one before it; with
        none left, the replay starts at the log start offset."""
        tp = topic.topic_partition(partition)
        tid = topic.topic_id
        log_prefix = keys.partition_prefix(keys.LOG, tid, partition)
        log_end_key = keys.log_key_end(tid, partition)

        log_start, size_bytes = cls._recover_meta(store, topic, partition)
        last = store.seek_for_prev(keys.log_key(tid, partition, _MAX_KEY_TAIL), log_prefix)
        stored_end = read_header(last[1]).next_offset if last is not None else log_start
        log_end = max(log_start, stored_end)

        snapshot_prefix = keys.partition_prefix(keys.SNAPSHOT, tid, partition)
        stored_snapshots = list(store.scan(snapshot_prefix, keys.next_prefix(snapshot_prefix)))
        snapshot = None
        corrupt = 0
        for key, value in reversed(stored_snapshots):
            key_offset = keys.snapshot_key_offset(key)
            try:
                candidate = decode_snapshot(value)
                if candidate.offset != key_offset:
                    raise SnapshotError(
                        f"snapshot under offset {key_offset} says offset {candidate.offset}"
                    )
                if candidate.offset > log_end:
                    raise SnapshotError(
                        f"snapshot offset {candidate.offset} beyond the log end {log_end}"
                    )
            except SnapshotError as exc:
                corrupt += 1
                metrics.CORRUPT_SNAPSHOTS.inc()
                log.warning("%s: skipping snapshot at offset %d: %s", tp, key_offset, exc)
                continue
            snapshot = candidate
            break

        producers = ProducerStateManager(tp, snapshot.producers if snapshot else ())
        replay_from = max(snapshot.offset if snapshot else log_start, log_start)
        running_max_ts = None
        time_prefix = keys.partition_prefix(keys.TIME_INDEX, tid, partition)
        last_time = store.seek_for_prev(
            keys.time_index_key(tid, partition, (1 << 63) - 1), time_prefix
        )
        if last_time is not None:
            running_max_ts = keys.time_index_key_timestamp(last_time[0])
        log_state = LogState(
            tp, log_start_offset=log_start, log_end_offset=replay_from,
            high_watermark=replay_from, size_bytes=size_bytes, max_timestamp_ms=running_max_ts,
        )
        replayed = 0
        for key, value in store.scan(keys.log_key(tid, partition, replay_from), log_end_key):
            header = read_header(value)
            key_offset = keys.log_key_offset(key)
            if key_offset != header.base_offset:
                invariant(
                    False, f"{tp}: batch stored under offset {key_offset} "
                    f"says base offset {header.base_offset}",
                )
            log_state.replay_append(header)
            producers.replay(header, header.base_offset, now_ms)
            replayed += 1
        invariant(
            log_state.log_end_offset == log_end,
            lambda: f"{tp}: replay ended at {log_state.log_end_offset}, log ends at {log_end}",
        )
        # Everything stored counts as durable: it survived the restart.
        log_state.mark_durable(log_end)
        # Recovered producers count as active now (see producer_state.py).
        producers.remove_expired(now_ms, producer_id_expiration_ms)

        part = cls(
            topic, partition, store, producers=producers, log_state=log_state,
            snapshot_offsets=[keys.snapshot_key_offset(k) for k, _v in stored_snapshots],
        )
        part.recovery_replayed_batches = replayed
        part.recovery_snapshot_offset = snapshot.offset if snapshot else None
        part.recovery_corrupt_snapshots = corrupt
        part.batches_since_snapshot = replayed
        part.last_snapshot_ms = now_ms
        part._snapshot_dirty = replayed > 0
        if replayed or corrupt:
            log.info(
                "%s: recovered from %s, replayed %d batches (%d corrupt snapshots skipped), "
                "log [%d, %d)", tp,
                f"snapshot at {snapshot.offset}" if snapshot else "the log start",
                replayed, corrupt, log_start, log_end,
            )
        return part

    @staticmethod
    def _recover_meta(store: KeyValueStore, topic: TopicRecord, partition: int) -> tuple[int, int]:
        """(log start offset, stored size) from the partition meta; rebuilt by a
        scan of the log if it is missing or damaged (a rare, slow path)."""
        tp = topic.topic_partition(partition)
        raw = store.get(keys.meta_key(topic.topic_id, partition))
        if raw is not None:
            try:
                return decode_partition_meta(raw, what=f"{tp} partition meta")
            except CorruptValueError as exc:
                log.warning("%s: rebuilding partition meta by scanning the log: %s", tp, exc)
        prefix = keys.partition_prefix(keys.LOG, topic.topic_id, partition)
        start = None
        size = 0
        for _key, value in store.scan(prefix, keys.next_prefix(prefix)):
            if start is None:
                start = read_header(value).base_offset
            size += len(value)
        return (start or 0), size

    # --------------------------------------------------------------- append

    def append(
        self, batch: bytes, *, expected_log_end_offset: int | None, now_ms: int
    ) -> Appended | Duplicate:
        """Checks a produced batch and, when accepted, replays it into memory
        and returns the writes that persist it. Raises ServiceError otherwise;
        a refused batch changes nothing."""
        checked = check_produce_batch(
            batch, topic_partition=self.topic_partition,
            max_message_bytes=self.topic.config.max_message_bytes,
        )
        if isinstance(checked, Rejection):
            raise ServiceError(checked.code, checked.message)
        decision = self.producers.check_append(checked)
        if isinstance(decision, Rejection):
            raise ServiceError(decision.code, decision.message)
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
        stored = with_base_offset(batch, base_offset)
        header = dataclasses.replace(checked, base_offset=base_offset)
        raised_max_ts = self.log.replay_append(header)
        self.producers.replay(header, base_offset, now_ms)
        self.log.add_size(len(stored))
        self.batches_since_snapshot += 1
        self._snapshot_dirty = True

        tid, p = self.topic.topic_id, self.partition
        group = WriteGroup()
        group.put(keys.log_key(tid, p, base_offset), stored)
        if raised_max_ts:
            group.put(
                keys.time_index_key(tid, p, header.max_timestamp_ms), encode_offset(base_offset)
            )
        group.put(keys.meta_key(tid, p), self._meta_value())
        self._records_counter.inc(header.record_count)
        self._bytes_counter.inc(len(stored))
        return Appended(
            base_offset=base_offset, next_offset=header.next_offset,
            record_count=header.record_count, size_bytes=len(stored), group=group,
        )

    def track_pending(self, base_offset: int, future: asyncio.Future[None]) -> None:
        self._pending[base_offset] = future

    def pending_future(self, base_offset: int) -> asyncio.Future[None] | None:
        """The group commit a duplicate's original is still waiting for."""
        return self._pending.get(base_offset)

    def on_durable(self, base_offset: int, next_offset: int) -> None:
        """Called by the writer, in offset order, once a batch is durable."""
        self._pending.pop(base_offset, None)
        if self.closed:
            return
        if self.log.mark_durable(next_offset):
            self._hw_gauge.set(self.log.high_watermark)
            self._size_gauge.set(self.log.size_bytes)
            self.wake_waiters()

    def _meta_value(self) -> bytes:
        return encode_partition_meta(self.log.log_start_offset, self.log.size_bytes)

    # ---------------------------------------------------------------- reads

    def upper_bound(self, isolation: Isolation) -> int:
        if isolation is Isolation.READ_COMMITTED:
            return self.log.last_stable_offset
        return self.log.high_watermark

    def check_fetch_offset(self, offset: int) -> None:
        if offset < 0 or offset < self.log.log_start_offset or offset > self.log.high_watermark:
            raise ServiceError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"{self.topic_partition}: offset {offset} is out of range; readable offsets "
                f"are {self.log.log_start_offset}..{self.log.high_watermark} (log start "
                f"offset {self.log.log_start_offset}, high watermark {self.log.high_watermark})",
            )

    def _batches_from(self, offset: int, upper: int) -> Iterator[tuple[BatchHeader, bytes]]:
        """Stored batches from the one holding `offset` up to `upper` (exclusive)."""
        tid, p = self.topic.topic_id, self.partition
        start_key = keys.log_key(tid, p, offset)
        prev = self._store.seek_for_prev(start_key, self._log_prefix)
        if prev is not None and read_header(prev[1]).next_offset > offset:
            start_key = prev[0]
        for _key, value in self._store.scan(start_key, keys.log_key(tid, p, upper)):
            yield read_header(value), value

    def read(self, offset: int, *, max_bytes: int, isolation: Isolation) -> FetchRead:
        """Whole batches from the one holding `offset`, up to the HW (or LSO).
        The first batch is returned even when it is larger than max_bytes.
        Control batches are left out (none exist before transactions land)."""
        self.check_fetch_offset(offset)
        upper = self.upper_bound(isolation)
        batches: list[bytes] = []
        size = 0
        next_offset = offset
        if offset >= upper or max_bytes <= 0:
            return FetchRead(batches, 0, next_offset)
        for header, value in self._batches_from(offset, upper):
            if header.is_control:
                next_offset = header.next_offset
                continue
            if batches and size + len(value) > max_bytes:
                break
            batches.append(value)
            size += len(value)
            next_offset = header.next_offset
            if size >= max_bytes:
                break
        return FetchRead(batches, size, next_offset)

    def list_offset(self, timestamp_ms: int, isolation: Isolation) -> tuple[int, int]:
        """(offset, timestamp_ms) for ListOffsets: -2 earliest, -1 latest (HW,
        or LSO under read_committed), else the first record whose timestamp is
        >= timestamp_ms (-1, -1 when none is)."""
        if timestamp_ms == EARLIEST_TIMESTAMP:
            return self.log.log_start_offset, -1
        if timestamp_ms == LATEST_TIMESTAMP:
            return self.upper_bound(isolation), -1
        if timestamp_ms < 0:
            raise ServiceError(
                ErrorCode.INVALID_REQUEST,
                f"{self.topic_partition}: timestamp {timestamp_ms} is neither -1 (latest), "
                "-2 (earliest) nor a time >= 0",
            )
        tid, p = self.topic.topic_id, self.partition
        time_prefix = keys.partition_prefix(keys.TIME_INDEX, tid, p)
        first = next(
            self._store.scan(
                keys.time_index_key(tid, p, timestamp_ms), keys.next_prefix(time_prefix)
            ),
            None,
        )
        if first is None:
            return -1, -1
        indexed = decode_offset(first[1], what=f"{self.topic_partition} time index")
        start = max(indexed, self.log.log_start_offset)
        upper = self.upper_bound(isolation)
        if start >= upper:
            return -1, -1
        for header, value in self._batches_from(start, upper):
            if header.is_control or header.max_timestamp_ms < timestamp_ms:
                continue
            for record in iter_records(value, min_offset=start):
                if record.timestamp_ms >= timestamp_ms:
                    return record.offset, record.timestamp_ms
        return -1, -1

    # -------------------------------------------------------- long polling

    def add_waiter(self, waiter: asyncio.Future[None]) -> None:
        self._hw_waiters.add(waiter)

    def remove_waiter(self, waiter: asyncio.Future[None]) -> None:
        self._hw_waiters.discard(waiter)

    def wake_waiters(self) -> None:
        waiters, self._hw_waiters = self._hw_waiters, set()
        for waiter in waiters:
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
            keys.snapshot_key(tid, p, offset), encode_snapshot(offset, self.producers.entries())
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

    def expire_producers(self, *, now_ms: int, expiration_ms: int) -> list[int]:
        expired = self.producers.remove_expired(now_ms, expiration_ms)
        if expired:
            self._snapshot_dirty = True
        return expired

    # ------------------------------------------------------------ retention

    def _stored_batches(self) -> Iterator[BatchInfo]:
        tid, p = self.topic.topic_id, self.partition
        for _key, value in self._store.scan(
            keys.log_key(tid, p, self.log.log_start_offset), self._log_end_key
        ):
            header = read_header(value)
            yield BatchInfo(
                base_offset=header.base_offset, next_offset=header.next_offset,
                max_timestamp_ms=header.max_timestamp_ms, size_bytes=len(value),
            )

    def plan_retention(self, *, now_ms: int, max_batches: int) -> RetentionPlan:
        config = self.topic.config
        return plan_retention(
            self._stored_batches(),
            now_ms=now_ms,
            retention_ms=config.retention_ms if config.deletes else -1,
            retention_bytes=config.retention_bytes if config.deletes else -1,
            log_start_offset=self.log.log_start_offset,
            log_end_offset=self.log.log_end_offset,
            high_watermark=self.log.high_watermark,
            size_bytes=self.log.size_bytes,
            newest_snapshot_offset=self.newest_snapshot_offset,
            max_batches=max_batches,
        )

    def apply_retention(self, plan: RetentionPlan) -> WriteGroup:
        """Moves the log start offset (in memory now, like an append) and
        returns the deletions. Time-index entries of deleted batches go too,
        except the newest of them: a lookup that lands before the log start is
        clamped to it and scans forward, so no retained batch is skipped."""
        invariant(plan.deletes_anything, "apply_retention with nothing to delete")
        tid, p = self.topic.topic_id, self.partition
        old_start = self.log.log_start_offset
        new_start = plan.new_log_start_offset
        group = WriteGroup()
        group.delete_range(keys.log_key(tid, p, old_start), keys.log_key(tid, p, new_start))
        time_prefix = keys.partition_prefix(keys.TIME_INDEX, tid, p)
        keep_from: bytes | None = None
        for key, value in self._store.scan(time_prefix, keys.next_prefix(time_prefix)):
            if decode_offset(value, what=f"{self.topic_partition} time index") >= new_start:
                break
            keep_from = key
        if keep_from is not None:
            group.delete_range(time_prefix, keep_from)
        self.log.replay_truncate_start(new_start, plan.deleted_bytes)
        group.put(keys.meta_key(tid, p), self._meta_value())
        metrics.RETENTION_DELETED_BATCHES.labels(self.topic.name).inc(plan.batch_count)
        self._update_gauges()
        return group

    # ------------------------------------------------------------- lifecycle

    def close(self) -> None:
        """The partition is gone from this node (topic deleted or moved)."""
        self.closed = True
        self.wake_waiters()
        labels = (self.topic.name, str(self.partition))
        for gauge in (metrics.HIGH_WATERMARK, metrics.LOG_START_OFFSET, metrics.LOG_SIZE_BYTES):
            with contextlib.suppress(KeyError):
                gauge.remove(*labels)

    def _update_gauges(self) -> None:
        self._hw_gauge.set(self.log.high_watermark)
        self._start_gauge.set(self.log.log_start_offset)
        self._size_gauge.set(self.log.size_bytes)
