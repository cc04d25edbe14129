"""Housekeeping of one store node: a task that, every tick, snapshots the
partitions that are due, updates the open-transaction age gauges, runs the
hanging-transaction check (transactions/markers.py), retention and producer-id
expiry, compaction of compacted topics (log/cleaner.py), and the catalog
refresh of a non-controller node; and, after a write found the disk full,
waits for space and then reopens the database and rebuilds every partition
from disk.

Owns the times of the last retention and compaction passes and the lock
that keeps those two (and a reopen) from rewriting the log at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from oncelog.wire.errors import ErrorCode
from oncelog.wire.records import BatchFormatError

from ..common.kernel.crashpoints import crash_point
from ..common.kernel.errors import ServiceError
from ..common.kernel.invariants import InvariantViolation
from .catalog import Catalog
from .log import cleaning
from .log.cleaner import CompactionReport, compact_partition
from .log.partition import PartitionRuntime
from .shared import StoreShared
from .storage.port import CorruptionError, StorageError
from .transactions.markers import TxnMarkers

log = logging.getLogger("oncelog.partition_store")


class Housekeeping:
    """The store node's periodic work (see the module docstring)."""

    def __init__(self, shared: StoreShared, catalog: Catalog, markers: TxnMarkers) -> None:
        self._shared = shared
        self._hooks = shared.hooks
        self.config = shared.config
        self._store = shared.store
        self._writer = shared.writer
        self._clock_ms = shared.clock_ms
        self._catalog = catalog
        self._markers = markers
        self._task: asyncio.Task[None] | None = None
        self._last_retention_ms = 0
        self._last_compaction_ms = 0
        # Retention and compaction both rewrite stored batches: one at a time.
        self._log_rewrite_lock = asyncio.Lock()

    def start(self, now_ms: int) -> None:
        self._last_retention_ms = now_ms
        self._last_compaction_ms = now_ms
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name="store-housekeeping"
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

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
            self._catalog.reopen_all(refused, now_ms)
        log.warning("store node %d: space was freed; storage reopened, %d partitions rebuilt "
                    "from disk, writes resume", self.config.node_id, len(self._catalog.partitions))
        if self._hooks.on_states_applied is not None:
            self._hooks.on_states_applied()
        return True

    async def snapshot_all(self, *, force: bool = False) -> int:
        """Snapshots every partition with changes (all with force); waits
        until durable. Returns how many were written."""
        now_ms = self._clock_ms()
        futures = []
        for part in self._catalog.partitions.values():
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
        for part in list(self._catalog.partitions.values()):
            part.expire_producers(
                now_ms=now_ms, expiration_ms=self.config.producer_id_expiration_ms
            )
            plan = cleaning.plan_retention(
                part, now_ms=now_ms, max_batches=self.config.retention_max_batches_per_run
            )
            if plan.needs_snapshot:
                # Producer state must outlive the batches it came from: a
                # snapshot at the log end goes first (the writer keeps order),
                # then the plan can reach further.
                futures.append(self._snapshot_at_log_end(part, now_ms))
                plan = cleaning.plan_retention(
                    part, now_ms=now_ms, max_batches=self.config.retention_max_batches_per_run
                )
            if plan.deletes_anything:
                futures.append(self._writer.submit(cleaning.apply_retention(part, plan)))
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
            for part in list(self._catalog.partitions.values()):
                if self._shared.closing:
                    break
                now_ms = self._clock_ms()
                if part.closed or not part.topic.compacted:
                    continue
                if not (force or cleaning.compaction_due(part, now_ms)):
                    continue
                end_offset = cleaning.first_uncleanable_offset(part)
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

    async def _run(self) -> None:
        config = self.config
        tick_ms = min(
            1000, config.snapshot_interval_ms, config.retention_check_interval_ms,
            config.catalog_refresh_interval_ms, config.compaction_interval_ms,
        )
        while not self._shared.closing:
            try:
                await asyncio.wait_for(self._shared.closed_event.wait(), tick_ms / 1000)
                return
            except TimeoutError:
                pass
            try:
                # While writes are refused there is nothing to snapshot,
                # retain or compact: only a full disk is waited out.
                if self._writer.failure is not None and not await self._resume_after_disk_full():
                    continue
                now_ms = self._clock_ms()
                for part in list(self._catalog.partitions.values()):
                    self._shared.maybe_snapshot(part, now_ms)
                    part.update_txn_age(now_ms)
                self._markers.check_hanging_txns(now_ms)
                if now_ms - self._last_retention_ms >= config.retention_check_interval_ms:
                    await self.run_retention_once()
                if now_ms - self._last_compaction_ms >= config.compaction_interval_ms:
                    await self.run_compaction_once()
                if not config.is_controller and (
                    self._catalog.last_refresh_ms is None
                    or now_ms - self._catalog.last_refresh_ms >= config.catalog_refresh_interval_ms
                ):
                    await self._catalog.refresh_quietly()
            except ServiceError as exc:
                log.warning("housekeeping: %s", exc)
            except CorruptionError as exc:
                self._shared.report_damage(exc)
