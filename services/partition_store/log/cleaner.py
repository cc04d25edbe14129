"""The log cleaner: runs one compaction pass (core/compaction.py) over a
partition's stored batches and writes the result through the group-commit
writer.

Threading: like everything in the store, the pass runs on the event loop.
It reads RocksDB in offset order and gives the loop back after every
YIELD_EVERY_BYTES of batches read, so produce and fetch go on meanwhile. Nothing
else rewrites the batches it reads: appends land at or above the first
uncleanable offset, markers too, retention runs under the same lock as
compaction (runtime.py), and a deleted topic is noticed (`closed`) before
each write.

Writes: the rewritten and deleted batches go out in chunks of about
`chunk_bytes`, each one RocksDB WriteBatch with the partition meta and the
compaction state (whose clean offset moves only with the last chunk), so a
`kill -9` leaves
every batch either as it was or as rewritten, never torn. Chunks are
written in offset order (a dropped marker always after its transaction's
records), so a crash between two chunks leaves a log that a later pass
simply cleans again. Reads between chunks see a consistent log: each batch
is whole, and an aborted-index entry goes from memory only once the chunk
that removed its marker is durable.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from oncelog.wire.records import control_marker, iter_record_keys, retain_records

from ...common.kernel.crashpoints import crash_point
from ...common.kernel.invariants import InvariantViolation, invariant
from .. import metrics
from ..core.compaction import (
    BatchAction,
    BatchDecision,
    Cleaner,
    CompactionState,
    OffsetMapBuilder,
    aborted_by_producer,
)
from ..storage import keys
from ..storage.port import WriteGroup
from .cleaning import apply_compaction_chunk, first_uncleanable_offset
from .partition import PartitionRuntime

log = logging.getLogger("oncelog.partition_store.cleaner")

# Bytes of batches read (and their keys decoded) between two returns to the
# event loop, so a pass holds up produce and fetch only briefly at a time
# (decoding the keys of 1000 records of 100 B takes ~1.3 ms here); a larger
# batch still goes in one piece.
YIELD_EVERY_BYTES = 64 * 1024
# A key or deletion costs about this much in a WriteBatch besides its value.
_OP_OVERHEAD_BYTES = 64

Submit = Callable[[WriteGroup, Callable[[], None]], asyncio.Future[None]]


@dataclass(frozen=True, slots=True)
class CompactionReport:
    """What one pass did."""

    topic_partition: str
    # The pass cleaned [log start, end_offset); the dirty part began at dirty_start_offset.
    dirty_start_offset: int
    end_offset: int
    batches_rewritten: int
    batches_dropped: int
    records_removed: int
    tombstones_removed: int
    markers_removed: int
    aborted_records_removed: int
    removed_bytes: int
    chunks: int


class _Pacer:
    """Gives the event loop back after every YIELD_EVERY_BYTES read."""

    def __init__(self, part: PartitionRuntime) -> None:
        self._part = part
        self._unpaced_bytes = 0

    async def read(self, size_bytes: int) -> bool:
        """Counts a batch read; False when the partition went away while the
        loop ran other work (the pass then stops, writing nothing more)."""
        self._unpaced_bytes += size_bytes
        if self._unpaced_bytes < YIELD_EVERY_BYTES:
            return True
        self._unpaced_bytes = 0
        await asyncio.sleep(0)
        return not self._part.closed


class _ChunkWriter:
    """Collects a pass's writes and sends them in chunks of about chunk_bytes."""

    def __init__(self, part: PartitionRuntime, submit: Submit, chunk_bytes: int) -> None:
        self._part = part
        self._submit = submit
        self._chunk_bytes = chunk_bytes
        # The cleaning state when the pass began, and the bytes removed so far
        # below its clean offset: every chunk writes the state with its clean
        # bytes lowered by them, so after a crash between chunks the dirty
        # ratio is still exact and the next pass comes when it should.
        self._start_state = part.compaction
        self._removed_below_clean = 0
        self._group = WriteGroup()
        self._group_bytes = 0
        self._removed_bytes = 0
        self._removed_aborted: list[int] = []
        self.removed_bytes = 0
        self.clean_bytes = 0
        self.rewritten = 0
        self.dropped = 0
        self.chunks = 0

    def add(self, decision: BatchDecision, value: bytes | None) -> None:
        """Records one decision; `value` is the stored batch (needed for REWRITE)."""
        part = self._part
        header = decision.header
        key = keys.log_key(part.topic.topic_id, part.partition, header.base_offset)
        old_size = header.size_bytes
        if decision.action is BatchAction.KEEP:
            self.clean_bytes += old_size
            return
        below_clean = header.base_offset < self._start_state.clean_offset
        if decision.action is BatchAction.REWRITE:
            if value is None:
                raise InvariantViolation(f"{part.topic_partition}: the batch at "
                                         f"{header.base_offset} to rewrite is gone")
            # Same key and header (base offset, partition leader epoch,
            # producer fields): only records go.
            new = retain_records(value, decision.retained)
            self._group.put(key, new)
            self._group_bytes += len(new) + _OP_OVERHEAD_BYTES
            self._removed_bytes += old_size - len(new)
            if below_clean:
                self._removed_below_clean += old_size - len(new)
            self.clean_bytes += len(new)
            self.rewritten += 1
            return
        self._group.delete(key)
        self._group_bytes += _OP_OVERHEAD_BYTES
        self._removed_bytes += old_size
        if below_clean:
            self._removed_below_clean += old_size
        self.dropped += 1
        if decision.drops_aborted_txn:
            self._group.delete(keys.aborted_txn_key(
                part.topic.topic_id, part.partition, header.base_offset
            ))
            self._removed_aborted.append(header.base_offset)

    @property
    def full(self) -> bool:
        return self._group_bytes >= self._chunk_bytes

    async def flush(self, finished: CompactionState | None = None) -> bool:
        """Writes the collected chunk (with the pass's final state when
        `finished` is given) and waits until it is durable. Returns False,
        writing nothing, when the partition was closed meanwhile."""
        part = self._part
        if part.closed:
            return False
        group, self._group, self._group_bytes = self._group, WriteGroup(), 0
        removed, self._removed_bytes = self._removed_bytes, 0
        removed_aborted, self._removed_aborted = self._removed_aborted, []
        state = finished or replace(
            self._start_state,
            clean_bytes=max(0, self._start_state.clean_bytes - self._removed_below_clean),
        )
        apply_compaction_chunk(part, group, removed_bytes=removed, state=state)

        def on_durable() -> None:
            part.on_compaction_durable(removed_aborted)

        await self._submit(group, on_durable)
        self.removed_bytes += removed
        self.chunks += 1
        metrics.COMPACTION_REMOVED_BYTES.labels(part.topic.name).inc(removed)
        if self.chunks == 1 and finished is None:
            # Test hook: a crash with the pass half written.
            crash_point("store.compaction_after_first_chunk")
        return True


async def compact_partition(
    part: PartitionRuntime, *, submit: Submit, now_ms: int, end_offset: int, max_keys: int,
    chunk_bytes: int,
) -> CompactionReport | None:
    """One pass over [log start, end_offset) of a compacted partition.
    end_offset must be at most the first uncleanable offset and the newest
    snapshot (the caller sees to both). Returns None when the partition went
    away during the pass, or when there is nothing to do."""
    tp = part.topic_partition
    state = part.compaction
    log_start = part.log.log_start_offset
    invariant(
        end_offset <= first_uncleanable_offset(part) and (
            part.newest_snapshot_offset is not None and end_offset <= part.newest_snapshot_offset
        ),
        lambda: f"{tp}: compaction up to {end_offset} beyond the first uncleanable offset "
        f"{first_uncleanable_offset(part)} or the newest snapshot {part.newest_snapshot_offset}",
    )
    if end_offset < state.clean_offset or end_offset <= log_start:
        return None
    dirty_start = max(state.clean_offset, log_start)
    aborted = aborted_by_producer(part.aborted.collect(log_start, end_offset))

    # Phase 1: the newest offset per key in the dirty part.
    builder = OffsetMapBuilder(aborted=aborted, max_keys=max_keys)
    end = end_offset
    pacer = _Pacer(part)
    for header, value in part.read_stored(dirty_start, end_offset):
        records = () if header.is_control else tuple(iter_record_keys(value))
        if not builder.add(header, records):
            end = header.base_offset
            break
        if not await pacer.read(len(value)):
            return None

    # Phase 2: every batch below `end`, oldest first.
    config = part.topic.config
    cleaner = Cleaner(
        newest=builder.newest, state=state, now_ms=now_ms,
        delete_retention_ms=config.delete_retention_ms, aborted=aborted,
        active_producers=frozenset(e.producer_id for e in part.producers.entries()),
    )
    writer = _ChunkWriter(part, submit, chunk_bytes)

    def add_all(decisions: Iterable[BatchDecision], current: tuple[int, bytes] | None) -> None:
        """Hands decisions to the writer with the bytes a REWRITE needs: the
        batch just read, or (for a producer's deferred last batch) a point read."""
        for decision in decisions:
            offset = decision.header.base_offset
            value = None
            if decision.action is BatchAction.REWRITE:
                value = (current[1] if current and current[0] == offset
                         else part.stored_batch(offset))
            writer.add(decision, value)

    for header, value in part.read_stored(log_start, end):
        if header.next_offset > end:
            raise InvariantViolation(f"{tp}: batch {header.base_offset}..{header.last_offset} "
                                     f"straddles the compaction end {end}")
        if header.is_control:
            decisions = cleaner.clean(header, (), control_marker(value)[0])
        else:
            decisions = cleaner.clean(header, tuple(iter_record_keys(value)))
        add_all(decisions, (header.base_offset, value))
        if writer.full and not await writer.flush():
            return None
        if not await pacer.read(len(value)):
            return None
    add_all(cleaner.finish(), None)
    finished = state.after_pass(
        clean_offset=max(end, state.clean_offset), clean_bytes=writer.clean_bytes,
        now_ms=now_ms, delete_retention_ms=config.delete_retention_ms,
        next_removal_ms=cleaner.next_removal_ms,
    )
    if not await writer.flush(finished):
        return None
    stats = cleaner.stats
    report = CompactionReport(
        topic_partition=tp, dirty_start_offset=dirty_start, end_offset=end,
        batches_rewritten=writer.rewritten, batches_dropped=writer.dropped,
        records_removed=stats.records_removed, tombstones_removed=stats.tombstones_removed,
        markers_removed=stats.markers_removed,
        aborted_records_removed=stats.aborted_records_removed,
        removed_bytes=writer.removed_bytes, chunks=writer.chunks,
    )
    metrics.COMPACTIONS.labels(part.topic.name).inc()
    log.info(
        "%s: compacted [%d, %d) (dirty from %d): %d records removed (%d tombstones, "
        "%d markers, %d aborted), %d batches rewritten, %d dropped, %d bytes freed",
        tp, log_start, end, dirty_start, report.records_removed, report.tombstones_removed,
        report.markers_removed, report.aborted_records_removed, report.batches_rewritten,
        report.batches_dropped, report.removed_bytes,
    )
    return report
