"""Per-partition producer state and the append rules (DESIGN.md §3).

For every producer id that wrote to a partition the store keeps its epoch, the
sequence ranges and offsets of its last five batches (enough to recognize any
retry of a batch still in flight, since a producer has at most five in flight
per partition), timestamps, its coordinator epoch, and the first offset of its
open transaction.

Two steps, as Kafka's ProducerAppendInfo: `check_append` decides on a batch
without changing anything (an `Append`, a `Duplicate` carrying the original
offset, or a `Rejection`), and `replay` applies a batch that has been given an
offset. Live appends and recovery both go through `replay`, so the state after
a restart is the state before it. Entries are frozen values: a check can never
leave a trace, and a copy of the table is a copy of its dict.

Rules, in the order they are checked:

1. no producer id (-1): not idempotent, always appended, no state;
2. epoch below the current one: INVALID_PRODUCER_EPOCH (PRODUCER_FENCED for
   transactional batches, fatal for a zombie);
3. same epoch and the same first and last sequence as one of the last five
   batches: a duplicate; nothing is written, the original offset is returned;
4. transactional batches: rejected with INVALID_TXN_STATE in this version (they
   need the transaction coordinator's verification; markers, the LSO and the
   aborted index come with WriteTxnMarkers);
5. unknown producer id: the batch must start at sequence 0;
6. epoch above the current one: the batch must start at sequence 0, the epoch
   moves and the cached batches of the old epoch are dropped;
7. same epoch: the batch must start at last sequence + 1 (wrapping at 2^31),
   or at 0 when the entry has no batches yet;
8. anything else: OUT_OF_ORDER_SEQUENCE_NUMBER naming the expected sequence.

Unknown producers must start at 0. Kafka accepts an unknown producer at any
sequence after its state was lost to log truncation; we keep producer state in
snapshots rather than deriving it from old batches, so it is never lost to
retention. It is lost only when a producer stays idle longer than
`producer_id_expiration_ms`; such a producer gets OUT_OF_ORDER_SEQUENCE_NUMBER
(fatal) on its next batch and must be re-initialized. Expiry is judged by the
store's clock (the time of the producer's last append), not by the batches'
timestamps, so records carrying old event times do not expire their producer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from oncelog.errors import ErrorCode
from oncelog.records import NO_PRODUCER_ID, NO_SEQUENCE, BatchHeader, next_sequence
from services.common import limits
from services.common.invariants import invariant
from services.partition_store.core.outcomes import Rejection

# How many of a producer's batches are remembered per partition for dedup.
CACHED_BATCHES = limits.MAX_IN_FLIGHT_BATCHES
NO_OFFSET = -1
NO_COORDINATOR_EPOCH = -1
# Kafka's producer.id.expiration.ms default: one day.
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 24 * 60 * 60 * 1000


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """What dedup needs to know about one appended batch."""

    first_sequence: int
    last_sequence: int
    base_offset: int
    record_count: int
    max_timestamp_ms: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.record_count - 1


@dataclass(frozen=True, slots=True)
class ProducerEntry:
    """One producer id's state on one partition."""

    producer_id: int
    producer_epoch: int
    # Oldest first, at most CACHED_BATCHES, all of producer_epoch.
    batches: tuple[BatchMetadata, ...] = ()
    # The producer's clock: the highest batch max timestamp (shown to admins).
    last_timestamp_ms: int = -1
    # The store's clock at the producer's last append (drives expiry).
    last_append_time_ms: int = -1
    coordinator_epoch: int = NO_COORDINATOR_EPOCH
    current_txn_first_offset: int = NO_OFFSET

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else NO_SEQUENCE

    def find_duplicate(self, header: BatchHeader) -> BatchMetadata | None:
        """The cached batch this one repeats (same epoch, same sequence range)."""
        if header.producer_epoch != self.producer_epoch:
            return None
        last_sequence = header.last_sequence
        for cached in self.batches:
            if cached.first_sequence == header.base_sequence and (
                cached.last_sequence == last_sequence
            ):
                return cached
        return None


@dataclass(frozen=True, slots=True)
class Append:
    """The batch goes to the end of the log."""


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The batch is a retry of one already appended: write nothing, answer
    with the original offset."""

    base_offset: int
    record_count: int


APPEND = Append()
AppendDecision = Append | Duplicate | Rejection


def check_append(
    entry: ProducerEntry | None, header: BatchHeader, *, topic_partition: str
) -> AppendDecision:
    """Decides on a batch against a producer's current entry. Reads only."""
    producer_id = header.producer_id
    if producer_id == NO_PRODUCER_ID:
        return APPEND
    epoch = header.producer_epoch
    sequence = header.base_sequence
    who = f"producer {producer_id} (epoch {epoch}) on {topic_partition}"
    if header.is_control:
        return Rejection(
            ErrorCode.INVALID_RECORD,
            f"{who}: control batches are written only through WriteTxnMarkers",
        )
    if entry is not None:
        if epoch < entry.producer_epoch:
            code = (
                ErrorCode.PRODUCER_FENCED
                if header.is_transactional
                else ErrorCode.INVALID_PRODUCER_EPOCH
            )
            return Rejection(
                code,
                f"{who}: epoch {epoch} is below the current epoch {entry.producer_epoch}; "
                "a newer instance of this producer has taken over",
            )
        duplicate = entry.find_duplicate(header)
        if duplicate is not None:
            return Duplicate(duplicate.base_offset, duplicate.record_count)
    if header.is_transactional:
        return _check_transactional(header, who=who)
    if entry is None:
        if sequence != 0:
            return Rejection(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"{who}: no state for this producer (new, or expired after being idle), "
                f"so its first batch must have sequence 0; expected sequence 0, "
                f"received {sequence}",
            )
        return APPEND
    if epoch > entry.producer_epoch:
        if sequence != 0:
            return Rejection(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"{who}: a new epoch (current {entry.producer_epoch}) must start at "
                f"sequence 0; expected sequence 0, received {sequence}",
            )
        return APPEND
    last = entry.last_sequence
    expected = 0 if last == NO_SEQUENCE else next_sequence(last)
    if sequence != expected:
        cached = ", ".join(f"{b.first_sequence}..{b.last_sequence}" for b in entry.batches)
        return Rejection(
            ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
            f"{who}: expected sequence {expected}, received {sequence} "
            f"(batch {sequence}..{header.last_sequence}; last batches: {cached or 'none'})",
        )
    return APPEND


def _check_transactional(header: BatchHeader, *, who: str) -> Rejection:
    # The next version verifies with the transaction coordinator that the
    # partition is part of the producer's transaction (transaction version 2)
    # and tracks the open transaction's first offset for the LSO.
    return Rejection(
        ErrorCode.INVALID_TXN_STATE,
        f"{who}: transactional writes need the transaction coordinator "
        "(not available in this version)",
    )


def apply_append(
    entry: ProducerEntry | None, header: BatchHeader, base_offset: int, append_time_ms: int
) -> ProducerEntry:
    """The entry after appending `header` at `base_offset` (no checks: recovery
    replays what was accepted before)."""
    invariant(header.producer_id != NO_PRODUCER_ID, "apply_append without a producer id")
    meta = BatchMetadata(
        first_sequence=header.base_sequence,
        last_sequence=header.last_sequence,
        base_offset=base_offset,
        record_count=header.record_count,
        max_timestamp_ms=header.max_timestamp_ms,
    )
    if entry is None:
        entry = ProducerEntry(producer_id=header.producer_id, producer_epoch=header.producer_epoch)
    if header.producer_epoch != entry.producer_epoch:
        # Batches of an older epoch can never be duplicates of the new one.
        batches: tuple[BatchMetadata, ...] = (meta,)
    else:
        batches = (*entry.batches, meta)[-CACHED_BATCHES:]
    txn_first_offset = entry.current_txn_first_offset
    if header.is_transactional and txn_first_offset == NO_OFFSET:
        txn_first_offset = base_offset
    return replace(
        entry,
        producer_epoch=header.producer_epoch,
        batches=batches,
        last_timestamp_ms=max(entry.last_timestamp_ms, header.max_timestamp_ms),
        last_append_time_ms=max(entry.last_append_time_ms, append_time_ms),
        current_txn_first_offset=txn_first_offset,
    )


class ProducerStateManager:
    """The producer table of one partition."""

    __slots__ = ("_producers", "topic_partition")

    def __init__(
        self, topic_partition: str, producers: Iterable[ProducerEntry] | None = None
    ) -> None:
        self.topic_partition = topic_partition
        self._producers: dict[int, ProducerEntry] = {
            e.producer_id: e for e in producers or ()
        }

    def get(self, producer_id: int) -> ProducerEntry | None:
        return self._producers.get(producer_id)

    def entries(self) -> list[ProducerEntry]:
        """Every entry, by producer id."""
        return [self._producers[pid] for pid in sorted(self._producers)]

    def as_mapping(self) -> Mapping[int, ProducerEntry]:
        """A copy of the table (entries are immutable, so this is a full copy)."""
        return dict(self._producers)

    def __len__(self) -> int:
        return len(self._producers)

    def check_append(self, header: BatchHeader) -> AppendDecision:
        return check_append(
            self._producers.get(header.producer_id), header,
            topic_partition=self.topic_partition,
        )

    def replay(self, header: BatchHeader, base_offset: int, append_time_ms: int) -> None:
        """Applies an appended batch. The one way batches change this table."""
        if header.producer_id == NO_PRODUCER_ID:
            return
        invariant(
            not header.is_control,
            lambda: f"control batch of producer {header.producer_id} replayed before "
            "markers are supported",
        )
        self._producers[header.producer_id] = apply_append(
            self._producers.get(header.producer_id), header, base_offset, append_time_ms
        )

    def remove_expired(self, now_ms: int, expiration_ms: int) -> list[int]:
        """Drops producers idle for expiration_ms (by the store's clock) that
        have no open transaction; returns their ids."""
        expired = [
            pid
            for pid, e in self._producers.items()
            if e.current_txn_first_offset == NO_OFFSET
            and now_ms - e.last_append_time_ms >= expiration_ms
        ]
        for pid in expired:
            del self._producers[pid]
        return expired
