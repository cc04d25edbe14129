"""Retention and compaction of one partition's log: which stored batches
retention deletes and the writes that delete them, where compaction may
clean and when a pass is due, and what a compaction chunk changes. The
runtime's housekeeping (housekeeping.py) and the log cleaner (log/cleaner.py)
call these, under the lock that keeps the two from rewriting the log at
the same time.

Owns no state: it plans from the partition it is given (PartitionRuntime,
log/partition.py) and the batches stored for it, and changes the partition
through it. The decisions themselves are pure (core/log_state.py's
plan_retention, core/compaction.py); the memory of the partition that
appends and readers share (its offsets, the LSO's waiters, its gauges)
changes through the partition's own `move_log_start`."""

from __future__ import annotations

from collections.abc import Iterator

from oncelog.wire.records import read_header

from ...common.kernel.invariants import invariant
from .. import metrics
from ..core import compaction as core_compaction
from ..core import log_state as core_log_state
from ..core.codec import decode_offset
from ..core.compaction import CompactionState, encode_compaction_state
from ..core.log_state import BatchInfo, RetentionPlan
from ..storage import keys
from ..storage.port import WriteGroup
from .partition import PartitionRuntime

# ------------------------------------------------------------------ retention


def _stored_batches(part: PartitionRuntime) -> Iterator[BatchInfo]:
    tid, p = part.topic.topic_id, part.partition
    for _key, value in part.store.scan(
        keys.log_key(tid, p, part.log.log_start_offset), keys.log_key_end(tid, p)
    ):
        header = read_header(value)
        yield BatchInfo(
            base_offset=header.base_offset, next_offset=header.next_offset,
            max_timestamp_ms=header.max_timestamp_ms, size_bytes=len(value),
        )


def plan_retention(part: PartitionRuntime, *, now_ms: int, max_batches: int) -> RetentionPlan:
    topic = part.topic
    config = topic.config
    return core_log_state.plan_retention(
        _stored_batches(part),
        now_ms=now_ms,
        retention_ms=config.retention_ms if topic.deletes else -1,
        retention_bytes=config.retention_bytes if topic.deletes else -1,
        log_start_offset=part.log.log_start_offset,
        log_end_offset=part.log.log_end_offset,
        high_watermark=part.log.high_watermark,
        size_bytes=part.log.size_bytes,
        newest_snapshot_offset=part.newest_snapshot_offset,
        max_batches=max_batches,
    )


def apply_retention(part: PartitionRuntime, plan: RetentionPlan) -> WriteGroup:
    """Moves the log start offset (in memory now, like an append) and
    returns the deletions. Time-index entries of deleted batches go too,
    except the newest of them: a lookup that lands before the log start is
    clamped to it and scans forward, so no retained batch is skipped."""
    invariant(plan.deletes_anything, "apply_retention with nothing to delete")
    tid, p = part.topic.topic_id, part.partition
    old_start = part.log.log_start_offset
    new_start = plan.new_log_start_offset
    group = WriteGroup()
    group.delete_range(keys.log_key(tid, p, old_start), keys.log_key(tid, p, new_start))
    time_prefix = keys.partition_prefix(keys.TIME_INDEX, tid, p)
    keep_from: bytes | None = None
    for key, value in part.store.scan(time_prefix, keys.next_prefix(time_prefix)):
        if decode_offset(value, what=f"{part.topic_partition} time index") >= new_start:
            break
        keep_from = key
    if keep_from is not None:
        group.delete_range(time_prefix, keep_from)
    # Aborted transactions that ended below the new log start: all their
    # batches and their marker are gone with this deletion.
    group.delete_range(
        keys.partition_prefix(keys.ABORTED_TXN, tid, p), keys.aborted_txn_key(tid, p, new_start)
    )
    part.aborted.prune_below(new_start)
    if part.epochs.truncate_from_start(new_start):
        part.add_epoch_writes(group)
    part.compaction = part.compaction.after_retention(new_start, plan.deleted_bytes)
    if part.topic.compacted:
        group.put(keys.compaction_key(tid, p), encode_compaction_state(part.compaction))
    part.move_log_start(new_start, plan.deleted_bytes, group)
    metrics.RETENTION_DELETED_BATCHES.labels(part.topic.name).inc(plan.batch_count)
    return group


# ----------------------------------------------------------------- compaction


def first_uncleanable_offset(part: PartitionRuntime) -> int:
    """Compaction cleans only below min(LSO, HW, base offset of the newest
    batch): no open transaction, nothing not yet durable, and never the
    batch that fixes the log end offset (core/compaction.py)."""
    offsets = part.log
    return max(offsets.log_start_offset, min(
        offsets.last_stable_offset, offsets.high_watermark, part.last_batch_base_offset,
    ))


def compaction_due(part: PartitionRuntime, now_ms: int) -> bool:
    if part.closed or not part.topic.compacted:
        return False
    return core_compaction.compaction_due(
        part.compaction, size_bytes=part.log.size_bytes,
        first_uncleanable_offset=first_uncleanable_offset(part),
        min_cleanable_dirty_ratio=part.topic.config.min_cleanable_dirty_ratio, now_ms=now_ms,
    )


def apply_compaction_chunk(
    part: PartitionRuntime, group: WriteGroup, *, removed_bytes: int, state: CompactionState,
) -> None:
    """Applies one chunk of a compaction pass to memory when it is queued
    (the stored size and the cleaning state now, as appends do, so the
    partition meta written by later appends counts it) and adds the
    partition meta and `K` to its writes. What readers use (the aborted
    index) changes only when the chunk is durable: the partition's
    on_compaction_durable."""
    tid, p = part.topic.topic_id, part.partition
    part.log.replay_compaction(removed_bytes)
    part.compaction = state
    group.put(keys.meta_key(tid, p), part.meta_value())
    group.put(keys.compaction_key(tid, p), encode_compaction_state(state))
