"""A partition's offsets, and retention planning.

    log_start_offset <= high_watermark <= log_end_offset

* log_end_offset (LEO): the next offset to assign. It includes batches that
  are appended in memory but not yet durable (group commit in flight).
* durable_end_offset: everything below it is written to this replica's disk
  (group commit landed).
* high_watermark (HW): everything below it is durable here and copied by
  every in-sync replica (core/replicas.py); only that is readable and only
  that is acknowledged. With a single copy it is the durable end.
* last_stable_offset (LSO): min(first offset of every unstable transaction,
  HW), where unstable means open, or ended by a marker that is not durable
  yet (producer_state.py keeps that minimum and the partition copies it into
  `first_unstable_offset` after every change). Never below the log start:
  retention is not held back by open transactions (as in Kafka), and an LSO
  below the log start would name offsets nobody can read.
* log_start_offset: the first offset still stored; retention moves it up.
  Compaction does not: it removes records and batches below the LSO but
  keeps every offset that survives where it was, so the log start stays and
  offsets inside the log may have gaps.

The log's size in bytes is kept beside the offsets (it is persisted with every
write, not derived from replay: see docs/partition-store.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from oncelog.wire.records import BatchHeader

from ...common.kernel.invariants import invariant


@dataclass(slots=True)
class LogState:
    """Offsets of one partition. Changed only by the replay_*/mark_* methods."""

    topic_partition: str
    log_start_offset: int = 0
    log_end_offset: int = 0
    high_watermark: int = 0
    # Everything below is on this replica's disk (see the module docstring).
    durable_end_offset: int = 0
    size_bytes: int = 0
    # The highest batch max timestamp so far (None: no batch yet). The time
    # index gets an entry whenever a batch raises it.
    max_timestamp_ms: int | None = None
    # The first offset of the oldest unstable transaction (None: none).
    first_unstable_offset: int | None = None

    @property
    def last_stable_offset(self) -> int:
        return last_stable_offset(
            high_watermark=self.high_watermark,
            log_start_offset=self.log_start_offset,
            first_unstable_offset=self.first_unstable_offset,
        )

    def replay_append(self, header: BatchHeader, *, recovering: bool = False) -> bool:
        """Moves the LEO past a batch appended at header.base_offset. Returns
        True when the batch raised the running max timestamp (a time-index
        entry is due for it). Recovery may find a gap before a batch
        (compaction dropped the batches in between); a live append never."""
        invariant(
            header.base_offset == self.log_end_offset
            or (recovering and header.base_offset > self.log_end_offset),
            lambda: f"{self.topic_partition}: batch at offset {header.base_offset} "
            f"appended at log end offset {self.log_end_offset}",
        )
        self.log_end_offset = header.next_offset
        if self.max_timestamp_ms is None or header.max_timestamp_ms > self.max_timestamp_ms:
            self.max_timestamp_ms = header.max_timestamp_ms
            return True
        return False

    def add_size(self, size_bytes: int) -> None:
        self.size_bytes += size_bytes

    def mark_durable(self, offset: int) -> bool:
        """Everything below `offset` is durable here and, as far as this
        replica knows, everywhere it must be (recovery). Returns True when
        the HW moved."""
        self.mark_locally_durable(offset)
        return self.advance_high_watermark(offset)

    def mark_locally_durable(self, offset: int) -> None:
        """Everything below `offset` is on this replica's disk."""
        invariant(
            offset <= self.log_end_offset,
            lambda: f"{self.topic_partition}: durable offset {offset} beyond "
            f"log end offset {self.log_end_offset}",
        )
        if offset > self.durable_end_offset:
            self.durable_end_offset = offset

    def advance_high_watermark(self, offset: int) -> bool:
        """Moves the HW up to `offset` (never down, never past the durable
        end). Returns True when it moved."""
        invariant(
            offset <= self.durable_end_offset,
            lambda: f"{self.topic_partition}: high watermark {offset} beyond the durable "
            f"end {self.durable_end_offset}",
        )
        if offset > self.high_watermark:
            self.high_watermark = offset
            return True
        return False

    def replay_truncate_start(self, new_log_start_offset: int, deleted_bytes: int) -> None:
        """Retention removed every batch below new_log_start_offset."""
        invariant(
            self.log_start_offset <= new_log_start_offset <= self.high_watermark,
            lambda: f"{self.topic_partition}: new log start offset {new_log_start_offset} "
            f"outside [{self.log_start_offset}, {self.high_watermark}]",
        )
        invariant(deleted_bytes <= self.size_bytes, "retention deleted more bytes than stored")
        self.log_start_offset = new_log_start_offset
        self.size_bytes -= deleted_bytes

    def replay_compaction(self, removed_bytes: int) -> None:
        """Compaction shrank or dropped batches below the LSO; offsets stay."""
        invariant(
            0 <= removed_bytes <= self.size_bytes,
            lambda: f"{self.topic_partition}: compaction removed {removed_bytes} bytes "
            f"of {self.size_bytes}",
        )
        self.size_bytes -= removed_bytes


def last_stable_offset(
    *, high_watermark: int, log_start_offset: int, first_unstable_offset: int | None
) -> int:
    """min(first offset of every unstable transaction, HW), never below the
    log start."""
    bound = high_watermark
    if first_unstable_offset is not None and first_unstable_offset < bound:
        bound = first_unstable_offset
    return max(bound, log_start_offset)


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """What retention needs to know about a stored batch."""

    base_offset: int
    next_offset: int
    max_timestamp_ms: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class RetentionPlan:
    """Delete every batch below new_log_start_offset."""

    new_log_start_offset: int
    batch_count: int
    deleted_bytes: int
    # More batches are due but lie at or beyond the newest producer-state
    # snapshot: take a snapshot, then plan again.
    needs_snapshot: bool

    @property
    def deletes_anything(self) -> bool:
        return self.batch_count > 0


def plan_retention(
    batches: Iterable[BatchInfo],
    *,
    now_ms: int,
    retention_ms: int,
    retention_bytes: int,
    log_start_offset: int,
    log_end_offset: int,
    high_watermark: int,
    size_bytes: int,
    newest_snapshot_offset: int | None,
    max_batches: int,
) -> RetentionPlan:
    """Which of the oldest batches to delete (Kafka's rules, per batch rather
    than per segment).

    `batches` are the stored batches from the log start, oldest first; the plan
    reads only as many as it deletes, plus one. A batch is due when its max
    timestamp is more than retention_ms old, or when the log stays at least
    retention_bytes without it (-1 turns either rule off). Deletion stops at the
    first batch that is not due, and never deletes:
    * the newest batch (it fixes the log end offset; Kafka's active segment),
    * anything at or above the HW (not durable yet),
    * anything at or beyond the newest snapshot (producer state for dedup lives
      in snapshots; deleting past the newest one would leave recovery nothing
      to replay from).
    """
    new_start = log_start_offset
    count = 0
    deleted = 0
    needs_snapshot = False
    for batch in batches:
        if count >= max_batches:
            break
        remaining = size_bytes - deleted
        expired = retention_ms >= 0 and now_ms - batch.max_timestamp_ms > retention_ms
        over_size = retention_bytes >= 0 and remaining - batch.size_bytes >= retention_bytes
        if not (expired or over_size):
            break
        if batch.next_offset >= log_end_offset or batch.next_offset > high_watermark:
            break
        if newest_snapshot_offset is None or batch.next_offset > newest_snapshot_offset:
            needs_snapshot = True
            break
        invariant(batch.base_offset >= new_start, "retention saw batches out of order")
        new_start = batch.next_offset
        count += 1
        deleted += batch.size_bytes
    return RetentionPlan(
        new_log_start_offset=new_start, batch_count=count, deleted_bytes=deleted,
        needs_snapshot=needs_snapshot,
    )
